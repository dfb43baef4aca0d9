"""Desync verdicts (table-driven), the merged stack tree on real py-spy dumps, renderings, the
report command, and fuzzing of the record reader and the py-spy text parser."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.hang import merge, record, rules, timer
from nodehealth.hang.stacks import parse_text_dump

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hang")


def fixture(name: str) -> str:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return f.read()


def rec(rank: int, enqueued: int, completed: int, ops: dict | None = None, world: int = 4) -> dict:
    """A record whose ops at each seq are all_reduce of [4] float32 unless `ops` says otherwise."""
    ops = ops or {}
    mk = [{"seq": s, "op": ops.get(s, "all_reduce"), "sizes": [[4]], "dtype": "float32", "enqueued_at": 0.0}
          for s in range(max(1, completed - 2), enqueued + 1)]
    return {"version": 1, "job": "j", "rank": rank, "world_size": world, "pid": 100 + rank, "heartbeat": 0.0,
            "step": 3, "groups": {"0": {"enqueued": enqueued, "completed": completed,
                                        "pending": [o for o in mk if o["seq"] > completed],
                                        "recent": [o for o in mk if o["seq"] <= completed]}}}


@pytest.mark.parametrize("seqs,kind,culprits,say", [
    ([(5, 4), (5, 4), (5, 4), (4, 4)], "never_joined", [3], "rank 3 never entered all_reduce #5 of group 0"),
    ([(5, 4), (4, 4), (5, 4), (4, 4)], "never_joined", [1, 3], "ranks 1,3 never entered"),
    ([(5, 4), (5, 4), (5, 4), (5, 4)], "communication_hang", [], "none finished: a communication hang"),
    ([(5, 5), (6, 5), (5, 4), (5, 4)], "not_finished", [2, 3], "ranks 0-1 finished all_reduce #5 of group 0 but"),
])
def test_desync_verdicts(seqs, kind, culprits, say):
    bundle = {"records": {str(r): rec(r, e, c) for r, (e, c) in enumerate(seqs)}}
    (v,) = merge.verdicts(bundle)
    assert (v["kind"], v["culprits"]) == (kind, culprits)
    assert say in v["summary"]


def test_no_pending_op_no_verdict():
    assert merge.verdicts({"records": {str(r): rec(r, 4, 4) for r in range(4)}}) == []


def test_diverged_ops_at_the_same_sequence():
    records = {str(r): rec(r, 5, 4) for r in range(4)}
    records["2"] = rec(2, 5, 4, ops={5: "broadcast"})
    (v,) = merge.verdicts({"records": records})
    assert v["kind"] == "diverged" and v["culprits"] == [2] and "ranks 2 in broadcast" in v["summary"]


def test_missing_record_filled_from_flight_recorder():
    records = {str(r): rec(r, 5, 4) for r in range(3)}
    fr = {"3": {"dump": {"pg_status": {"0": {"last_enqueued_collective": "4", "last_completed_collective": "4"}}}}}
    (v,) = merge.verdicts({"records": records, "flight_recorder": fr})
    assert v["culprits"] == [3] and v["no_record"] == ""
    (v,) = merge.verdicts({"records": records})
    assert v["kind"] == "incomplete" and v["no_record"] == "3" and "ranks 3 have no record here" in v["summary"]


def local(ranks: range, world: int, seqs: dict | None = None) -> dict:
    """The records of one node: `ranks` of a `world`, each at (5, 4) unless `seqs` says otherwise."""
    seqs = seqs or {}
    return {"records": {str(r): rec(r, *seqs.get(r, (5, 4)), world=world) for r in ranks}}


@pytest.mark.parametrize("bundle,kind,culprits,say", [
    # one node of two: all local ranks wait in the op; ranks 8-15 may never have entered it
    (local(range(8), 16), "incomplete", [], "ranks 8-15 have no record here (they run on other nodes): run"),
    (local(range(8), 16, {0: (6, 5)}), "incomplete", [], "ranks 0 finished it; ranks 8-15 have no record"),
    # a local rank that never entered is a culprit whatever the other nodes say
    (local(range(8), 16, {3: (4, 4)}), "never_joined", [3], "rank 3 never entered all_reduce #5"),
    # every rank of the world present: the node view is the whole view
    (local(range(16), 16), "communication_hang", [], "a communication hang"),
    ({"records": {**local(range(8), 16)["records"], **local(range(8, 16), 16)["records"]}},
     "communication_hang", [], "none finished"),
])
def test_one_nodes_bundle_gives_no_cluster_verdict(bundle, kind, culprits, say):
    (v,) = merge.verdicts(bundle)
    assert (v["kind"], v["culprits"]) == (kind, culprits)
    assert say in v["summary"]
    assert ("communication hang" in v["summary"]) == (kind == "communication_hang")


def test_p2p_pending_is_reported_per_rank():
    r = rec(0, 2, 2)
    r["groups"]["0/p2p"] = {"enqueued": 1, "completed": 0, "recent": [],
                            "pending": [{"seq": 1, "op": "recv", "peer": 1, "enqueued_at": 0.0}]}
    (v,) = merge.verdicts({"records": {"0": r}})
    assert v["kind"] == "p2p_pending" and v["summary"] == "rank 0 waits in recv #1 of group 0/p2p with peer 1"


@pytest.mark.parametrize("ranks,folded", [([0, 1, 2, 3, 5], "0-3,5"), ([4], "4"), ([], ""), ([7, 0, 2, 1], "0-2,7")])
def test_fold(ranks, folded):
    assert merge.fold(ranks) == folded


def real_stacks() -> dict:
    """Three ranks stuck in broadcast and one idle in its DataLoader (BLOOM-176B chronicles)."""
    broadcast = parse_text_dump(fixture("ml-engineering.dump.deepspeed-broadcast-hang.txt"))
    loader = parse_text_dump(fixture("bigscience-tr11.dataloader-idle.txt"))
    return {"0": {"threads": broadcast}, "1": {"threads": broadcast}, "2": {"threads": broadcast},
            "3": {"threads": loader}}


def test_parse_text_dumps():
    threads = parse_text_dump(fixture("ml-engineering.dump.two-threads-idle.txt"))
    assert [(t["thread_id"], t["name"], t["active"]) for t in threads] == [
        ("0x7F6D3C29D740", "MainThread", False), ("0x7F6CF5FFB700", "Thread-CallbackRequestDispatcher", False)]
    assert threads[0]["frames"][0] == {"name": "wait", "file": "threading.py", "line": 312}
    assert parse_text_dump(fixture("m4-logs.dump.error-EPERM-with-header.txt")) == []
    wrapped = parse_text_dump(fixture("returnn-1484.header-terminal-wrapped.partial.txt"))
    assert [(t["thread_id"], t["frames"]) for t in wrapped] == [("2816", [])]
    grouped = parse_text_dump(fixture("bigscience-tr11.grouped-4-threads-broadcast.txt"))
    assert [len(t["frames"]) for t in grouped] == [0, 0, 0, 10]  # the author grouped 4 headers over one stack


def test_tree_puts_the_minority_first():
    tree = merge.stack_tree(real_stacks())
    text = "\n".join(merge._tree_lines(tree, 0))
    assert text.index("[3] main (pretrain_gpt.py:245)") < text.index("[0-2] <module> (pretrain_gpt.py:239)")
    assert "[3] get (queue.py:179)" in text and "[0-2] broadcast (torch/distributed/distributed_c10d.py:1191)" in text


def test_native_frames_left_as_bare_addresses_still_merge():
    """A bundle written before frames were named by module and offset, or a pasted `py-spy dump
    --native` text: the same frame is a different address in every process."""
    text = "Thread 7 (idle): \"MainThread\"\n    {} (libc.so.6)\n    main (train.py:3)\n    {} (libc.so.6)\n"
    stacks = {"0": {"threads": parse_text_dump(text.format("0x7f0a01a3e96", "0x7f0a0145d90"))},
              "1": {"threads": parse_text_dump(text.format("0x7f5b9ca3e96", "0x7f5b9c45d90"))}}
    lines = merge._tree_lines(merge.stack_tree(stacks), 0)
    assert lines == ["[0-1] thread MainThread", "  [0-1] ? (libc.so.6)", "    [0-1] main (train.py:3)",
                     "      [0-1] ? (libc.so.6)"]


def test_folded_lines_and_svg():
    tree = merge.stack_tree(real_stacks())
    folded = merge.to_folded(tree).splitlines()
    assert len(folded) == 2
    assert folded[0].startswith("thread MainThread [0-3];<module> (pretrain_gpt.py:249) [3];")
    assert folded[0].endswith(" 1")
    assert folded[1].endswith("broadcast (torch/distributed/distributed_c10d.py:1191) [0-2] 3")
    svg = merge.to_svg({"job": "j"}, tree, [{"summary": "rank 3 never entered broadcast #9 of group 0"}])
    root = ET.fromstring(svg)
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert "get (queue.py:179) [3]" in titles and len(titles) == tree_size(tree) - 1
    assert "rank 3 never entered broadcast" in svg


def tree_size(node: merge.Node) -> int:
    return 1 + sum(tree_size(c) for c in node.children.values())


def write_bundle(path, records, stacks) -> None:
    record.write_json(str(path), {"version": 1, "kind": "nodehealth-hang-bundle", "node": "n1", "job": "j",
                                  "detected_at": 1.0, "records": records, "stacks": stacks, "errors": []})


def run_report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nodehealth.hang.cli", "hang", "report", *args],
                          capture_output=True, text=True, timeout=30)


def test_report_command_formats(tmp_path):
    records = {str(r): rec(r, 5, 4) for r in range(3)} | {"3": rec(3, 4, 4)}
    write_bundle(tmp_path / "hang-j-n1-1.json", records, real_stacks())
    out = run_report(str(tmp_path))
    assert out.returncode == 1 and "rank 3 never entered all_reduce #5 of group 0; ranks 0-2 wait in it" in out.stdout
    assert "rank 3: step 3, no pending op, state ?, at wait (threading.py:306)" in out.stdout
    doc = json.loads(run_report(str(tmp_path), "--format", "json").stdout)
    assert doc["jobs"][0]["verdicts"][0]["culprits"] == [3] and doc["jobs"][0]["tree"]["count"] == 4
    svg_path = tmp_path / "out.svg"
    assert run_report(str(tmp_path), "--format", "svg", "-o", str(svg_path)).returncode == 1
    ET.parse(svg_path)
    assert "[0-2] 3" in run_report(str(tmp_path), "--format", "folded").stdout


def test_report_on_a_record_directory_and_bad_input(tmp_path):
    for r in range(4):
        record.write_json(record.record_path(str(tmp_path), "j", r), rec(r, 5 if r else 4, 4))
    (tmp_path / "j.9.rank.json").write_text("{torn")
    out = run_report(str(tmp_path))
    assert "rank 0 never entered all_reduce #5" in out.stdout and "corrupt state record" in out.stdout
    bad = run_report(str(tmp_path / "nope.json"))
    assert bad.returncode == 2 and "cannot read" in bad.stderr
    (tmp_path / "x.json").write_text("[]")
    assert "not a nodehealth hang bundle" in run_report(str(tmp_path / "x.json")).stderr


def test_torn_records_are_never_seen(tmp_path):
    path = record.record_path(str(tmp_path), "j", 0)
    big = rec(0, 5, 4)
    big["regions"] = [{"name": "x" * 1000, "seconds": 1.0}] * 50
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, json\nfrom nodehealth.hang import record\nrec = json.loads(sys.argv[2])\n"
        "for i in range(400):\n    rec['step'] = i\n    record.write_json(sys.argv[1], rec)\n"), path, json.dumps(big)])
    seen = 0
    try:
        while writer.poll() is None:
            if os.path.exists(path):
                assert record.read_record(path)["rank"] == 0
                seen += 1
    finally:
        writer.wait()
    assert writer.returncode == 0 and seen > 0
    assert [n for n in os.listdir(tmp_path) if n.startswith(".tmp")] == []


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=600))
def test_fuzz_text_parser(text):
    threads = parse_text_dump(text)
    assert all(isinstance(f["line"], int) for t in threads for f in t["frames"])


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["version", "rank", "job", "world_size", "pid", "heartbeat", "groups"]),
                       json_values, max_size=7))
def test_fuzz_record_validation(obj):
    try:
        valid = record.validate({"version": 1, **obj} if obj.get("version") is None else obj, "x")
    except record.RecordError as e:
        assert str(e).startswith("x:")
        return
    merge.verdicts({"records": {str(valid["rank"]): valid}})  # a valid record never crashes the verdict


@pytest.mark.parametrize("process,exited,status,say", [
    ("gone", False, None, "rank 2's process is gone: killed or crashed without exiting normally (exit code not known)"),
    ("gone", False, "killed by SIGKILL", "rank 2's process is gone (killed by SIGKILL) without exiting normally"),
    ("gone", True, None, "rank 2's process is gone (exit code not known): it exited while"),
    ("gone", True, "exit code 3", "rank 2's process is gone (exit code 3): it exited while"),
    ("stopped", False, None, "rank 2 is stopped (SIGSTOP"),
])
def test_gone_or_stopped_rank_is_said_plainly_and_its_old_record_reconciled(process, exited, status, say):
    """Rank 2's last record is a publish interval old (#109); the others finished #120, which needs
    rank 2: it finished #120 too and never entered #121. Its exit status is said when known."""
    records = {str(r): rec(r, 121, 120) for r in (0, 1, 3)} | {"2": rec(2, 109, 108) | {"exited": exited}}
    vs = merge.verdicts({"records": records, "processes": {"0": "running", "1": "running", "2": process,
                                                          "3": "running"},
                         "exit_statuses": {"2": status} if status else {}})
    assert vs[0]["summary"].startswith(say) and vs[0]["culprits"] == [2]
    assert vs[1]["summary"] == "rank 2 never entered all_reduce #121 of group 0; ranks 0-1,3 wait in it"
    assert "#109" not in json.dumps(vs)


def test_a_hang_seen_only_through_heartbeats_is_said_so():
    """Rank 1's timer stopped publishing while no collective is in flight anywhere: no sequence
    number can speak, its silence does."""
    records = {str(r): rec(r, 4, 4) for r in range(3)}
    bundle = {"records": records, "silent": {"1": 75.2}, "stacks": {"1": {"state": "D", "wchan": "nfs_wait"}}}
    (v,) = merge.verdicts(bundle)
    assert (v["kind"], v["culprits"]) == ("heartbeat_lost", [1])
    assert v["summary"] == ("rank 1 has published no heartbeat for 75 s and has no collective in flight: its process "
                            "runs no Python (a C call holding the GIL, a deadlock, a wait in the kernel) or cannot "
                            "write its record (a full or hung file system); its process is in state D (wchan "
                            "nfs_wait)")
    records["1"]["groups"]["0"]["pending"] = [{"seq": 5, "op": "all_reduce", "enqueued_at": 0.0}]
    records["1"]["groups"]["0"]["enqueued"] = 5
    assert [v["kind"] for v in merge.verdicts(bundle)] == ["never_joined"], "in a collective: its group speaks"


def test_live_report_of_ranks_whose_heartbeat_stopped(tmp_path):
    import time

    for r in range(2):
        quiet = rec(r, 4, 4, world=2)
        quiet["heartbeat"] = time.time() - (300 if r == 1 else 0)
        record.write_json(record.record_path(str(tmp_path), "j", r), quiet)
    out = run_report(str(tmp_path))
    assert out.returncode == 1 and "rank 1 has published no heartbeat for 300 s" in out.stdout, out.stdout


def test_live_report_of_a_healthy_job_says_no_hang(tmp_path):
    import time

    now = time.time()
    for r in range(4):
        fresh = rec(r, 8 if r % 2 else 7, 7)  # written moments apart: half the ranks one op ahead
        fresh["heartbeat"] = now
        for op in fresh["groups"]["0"]["pending"]:
            op["enqueued_at"] = now - 0.2
        record.write_json(record.record_path(str(tmp_path), "j", r), fresh)
    out = run_report(str(tmp_path))
    assert out.returncode == 0 and "no hang: every pending op is younger than its limit" in out.stdout
    assert "never entered" not in out.stdout


def lockstep(per_step: int, compute, steps: int = 60, ranks: int = 4, transfer: float = 0.002,
             late: dict | None = None, seed: int = 0) -> dict[str, dict]:
    """Records of a job in lockstep, as its timers publish them: each step every rank computes
    compute(step, rank) seconds, then issues `per_step` all_reduces; only the first absorbs the
    wait for the last rank to arrive. Rank r's record is published `late[r]` steps before the end."""
    rng = random.Random(seed)
    clock = timer.Timer(os.devnull, 1.0)  # its complete() is the timer's own bookkeeping of an op
    streams = [timer._Stream(list(range(ranks))) for _ in range(ranks)]
    records = {}
    for step in range(steps):
        arrive = [compute(step, r) + rng.uniform(0, 0.001) for r in range(ranks)]
        for i in range(per_step):
            for r, stream in enumerate(streams):
                op = {"op": "all_reduce", "seq": next(stream.counter), "sizes": [[4]], "dtype": "float32",
                      "enqueued_at": time.time() - (max(arrive) - arrive[r] if i == 0 else 0.0) - transfer}
                stream.enqueued = op["seq"]
                stream.pending[op["seq"]] = op
                clock.complete(op, stream)
        for r, stream in enumerate(streams):
            if step == steps - 1 - (late or {}).get(r, 0):
                records[str(r)] = {**rec(r, 0, 0, world=ranks), "host": "n1", "groups": {"0": stream.snapshot()}}
    return records


def even(step: int, r: int) -> float:
    return 0.1


def rank_2_three_times_slower(step: int, r: int) -> float:
    return 0.3 if r == 2 else 0.1


STRAGGLER_CFG = {**rules.DEFAULTS, "straggler_ratio": 3.0, "straggler_min_wait_seconds": 0.05}


@pytest.mark.parametrize("per_step,compute,steps,late,expected", [
    (1, rank_2_three_times_slower, 60, None, [2]),
    (4, rank_2_three_times_slower, 60, None, [2]),  # the first of 4 collectives absorbs the wait
    (8, rank_2_three_times_slower, 60, None, [2]),
    (8, rank_2_three_times_slower, 60, {1: 6, 3: 2}, [2]),  # records published steps apart
    (4, rank_2_three_times_slower, 4, None, []),  # 16 ops: too few to judge
    (8, even, 60, None, []),
    (4, lambda step, r: 0.12 if r == 2 else 0.1, 60, None, []),  # a 20 ms wait per step is noise
    (8, lambda step, r: 10.0 if (step, r) == (30, 0) else 0.1, 60, None, []),  # one checkpoint on rank 0
    (8, lambda step, r: 0.4 if step % 4 == r else 0.1, 60, None, []),  # slow in turns: nobody's pace
    (4, lambda step, r: 0.3 if r == 0 else 0.1, 60, None, [0]),
])
def test_stragglers_are_judged_per_stretch_of_steps(per_step, compute, steps, late, expected):
    found = rules.stragglers(lockstep(per_step, compute, steps, late=late), STRAGGLER_CFG)
    assert [s["rank"] for s in found] == expected, [s["summary"] for s in found]
    if expected:
        assert f"rank {expected[0]} on n1 is a straggler" in found[0]["summary"]


def test_a_straggler_of_two_ranks():
    found = rules.stragglers(lockstep(4, lambda step, r: 0.3 if r == 1 else 0.1, ranks=2), STRAGGLER_CFG)
    assert [s["rank"] for s in found] == [1]


def test_native_frames_and_child_processes_in_every_output():
    python = {"threads": [{"name": "MainThread", "frames": [{"name": "wait", "file": "dist.py", "line": 3},
                                                             {"name": "main", "file": "train.py", "line": 9}]}]}
    native = {"threads": [{"name": "MainThread", "frames": [
        {"name": "pthread_cond_wait", "file": "libc.so.6", "line": 0},
        {"name": "gloo::AllreduceOp::run", "file": "libtorch_cpu.so", "line": 0},
        {"name": "wait", "file": "dist.py", "line": 3}, {"name": "main", "file": "train.py", "line": 9}]}]}
    child = {"threads": [{"name": "MainThread", "frames": [{"name": "__iter__", "file": "data.py", "line": 7}]}]}
    job = {"job": "j", "nodes": ["n"], "records": {},
           "stacks": {"0": python, "1": {**python, "children": {"77": child}}}, "native_stacks": {"0": native},
           "errors": []}
    tree = merge.stack_tree(job["stacks"], job["native_stacks"])
    text = merge.to_text(job, tree, [])
    assert "[0] gloo::AllreduceOp::run (libtorch_cpu.so)" in text and "pthread_cond_wait (libc.so.6)" in text
    assert "[1] child process, thread MainThread" in text and "__iter__ (data.py:7)" in text
    assert "gloo::AllreduceOp::run" in json.dumps(merge.to_json(job, tree, []))
    assert "gloo::AllreduceOp::run" in merge.to_folded(tree) and "gloo::AllreduceOp::run" in merge.to_svg(job, tree, [])


def test_flight_recorder_views_read_at_one_moment_decide_over_the_records_polls():
    """Each timer reads the Flight Recorder every few seconds: rank 1 was read inside all_reduce #9,
    rank 0 after both finished it and entered #10, where rank 1 never came (its data loader hangs).
    The records alone make rank 1 look stuck in #9; the dumps asked for the bundle, read at one
    moment, say what happened. With a dump missing, the records still decide."""
    def record(r, enqueued, completed):
        x = rec(r, 0, 0, world=2)
        x["groups"] = {"fr/0": {"enqueued": enqueued, "completed": completed, "recent": [],
                                "pending": [{"seq": s, "op": "all_reduce", "sizes": [[4]], "dtype": "float32",
                                             "enqueued_at": 0.0} for s in range(completed + 1, enqueued + 1)]}}
        return x

    def dump(enqueued, completed):
        return {"dump": {"pg_status": {"0": {"last_enqueued_collective": enqueued,
                                             "last_completed_collective": completed}}}}

    records = {"0": record(0, 10, 9), "1": record(1, 9, 8)}
    (v,) = merge.verdicts({"records": records})
    assert (v["kind"], v["culprits"], v["seq"]) == ("not_finished", [1], 9)
    (v,) = merge.verdicts({"records": records, "flight_recorder": {"0": dump(10, 9), "1": dump(9, 9)}})
    assert (v["kind"], v["culprits"], v["seq"], v["op"]) == ("never_joined", [1], 10, "all_reduce")
    assert v["summary"] == "rank 1 never entered all_reduce #10 of group fr/0; ranks 0 wait in it"
    (v,) = merge.verdicts({"records": records, "flight_recorder": {"0": dump(10, 9), "1": {"error": "no dump"}}})
    assert (v["kind"], v["seq"]) == ("not_finished", 9)


def test_flight_recorder_groups_speak_only_when_ours_are_silent():
    ours = {str(r): rec(r, 5, 4) for r in range(3)} | {"3": rec(3, 4, 4)}
    for r, x in ours.items():
        x["groups"]["fr/0"] = {"enqueued": 9 if r == "0" else 8, "completed": 8, "pending": [], "recent": []}
    assert [v["group"] for v in merge.verdicts({"records": ours})] == ["0"]
    for x in ours.values():
        x["groups"]["0"]["enqueued"] = x["groups"]["0"]["completed"] = 4
        x["groups"]["0"]["pending"] = []
    (v,) = merge.verdicts({"records": ours})
    assert v["group"] == "fr/0" and v["summary"].startswith("ranks 1-3 never entered op #9 of group fr/0")
