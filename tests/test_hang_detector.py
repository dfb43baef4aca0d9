"""The detector against plain Python processes that publish records: thresholds, bad input,
py-spy missing, a rank exiting mid-dump, py-spy killed at its timeout."""
from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import require_tool
from test_hang_merge import lockstep

from nodehealth.hang import merge, record
from nodehealth.hang.detector import Detector, JobState
from nodehealth.hang.flight_recorder import poke_pipe
from nodehealth.hang.rules import DEFAULTS, Rank, judge, limit_for
from nodehealth.hang.stacks import StackCollector, process_state
from nodehealth.host import HostPaths

SLEEPER = "import time\ndef wait_in_collective():\n    time.sleep(600)\nwait_in_collective()\n"
FAST = {"floor_seconds": 1.0, "native_stacks": False, "heartbeat_timeout_seconds": 30.0}
NO_SPY = {**FAST, "py_spy": "/nonexistent/py-spy"}


def start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def make_record(rank: int, pid: int, start: int | None, enqueued: int, completed: int, age: float = 10.0,
                world: int = 2, job: str = "j") -> dict:
    now = time.time()
    pending = [{"seq": s, "op": "all_reduce", "sizes": [[4]], "dtype": "float32", "enqueued_at": now - age}
               for s in range(completed + 1, enqueued + 1)]
    return {"version": 1, "job": job, "rank": rank, "world_size": world, "pid": pid, "start_time": start,
            "heartbeat": now, "step": 7, "regions": [], "exited": False,
            "groups": {"0": {"ranks": list(range(world)), "enqueued": enqueued, "completed": completed,
                             "pending": pending, "recent": [], "p99": {}}}}


@pytest.fixture
def sleepers():
    procs = []

    def start(n: int) -> list[subprocess.Popen]:
        new = [subprocess.Popen([sys.executable, "-c", SLEEPER]) for _ in range(n)]
        procs.extend(new)
        time.sleep(0.3)  # let the interpreters reach the sleep
        return new
    yield start
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait()


def publish(directory, recs) -> None:
    for rec in recs:
        record.write_json(record.record_path(str(directory), rec["job"], rec["rank"]), rec)


@pytest.mark.parametrize("age,p99,samples,hung", [
    (0.5, None, 0, False),    # young pending op
    (1.5, None, 0, True),     # older than the floor
    (1.5, 0.2, 50, False),    # the op is slow by nature: 10 x p99 = 2 s
    (2.5, 0.2, 50, True),
    (1.5, 0.2, 5, True),      # too few samples for the p99 to count
])
def test_judge_floor_and_p99(age, p99, samples, hung):
    rec = make_record(0, 1, 1, enqueued=3, completed=2, age=age)
    if p99 is not None:
        rec["groups"]["0"]["p99"] = {"all_reduce": {"seconds": p99, "samples": samples}}
    rank = Rank("x", rec, 1)
    judge(rank, time.time(), {**DEFAULTS, **FAST})
    assert bool(rank.hung) is hung
    assert limit_for(rec["groups"]["0"], "all_reduce", {**DEFAULTS, **FAST}) >= 1.0


def test_a_pending_op_is_aged_at_the_ranks_last_word():
    """Between two publishes the op may have finished: a record 0.4 s old whose op was 0.8 s
    pending when written is not over a 1 s floor, though the op began 1.2 s ago (a false alarm
    seen in CI right after a hang cleared). A rank that stays silent is the heartbeat rule's."""
    now = time.time()
    rec = make_record(0, 1, 1, enqueued=3, completed=2, age=1.2)
    rec["heartbeat"] = now - 0.4
    rank = Rank("x", rec, 1)
    judge(rank, now, {**DEFAULTS, **FAST})
    assert not rank.hung and rank.pending_age == pytest.approx(0.8, abs=0.05)
    judge(rank, now + 0.5, {**DEFAULTS, **FAST})
    assert not rank.hung
    judge(rank, now + 31, {**DEFAULTS, **FAST})
    assert rank.hung and "no heartbeat" in rank.hung


@pytest.mark.parametrize("where", ["heartbeat", "enqueued_at"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_time_that_is_no_time_is_a_corrupt_record(where, bad):
    """JSON reads NaN and Infinity: such a heartbeat would never go silent, such an op never age."""
    rec = make_record(0, 1, 1, enqueued=3, completed=2)
    if where == "heartbeat":
        rec["heartbeat"] = bad
    else:
        rec["groups"]["0"]["pending"][0]["enqueued_at"] = bad
    with pytest.raises(record.RecordError, match="heartbeat is not a finite time" if where == "heartbeat"
                       else "has a bad time"):
        record.validate(json.loads(json.dumps(rec)), "r")


def test_heartbeat_stopped_is_a_hang():
    rec = make_record(0, 1, 1, enqueued=3, completed=3)
    rec["heartbeat"] -= 40
    rank = Rank("x", rec, 1)
    judge(rank, time.time(), {**DEFAULTS, **FAST})
    assert rank.hung and "no heartbeat" in rank.hung and rank.pending_age == 0.0


def test_hang_bundle_names_culprit_with_real_stacks(tmp_path, sleepers):
    require_tool("py-spy")
    a, b = sleepers(2)
    publish(tmp_path, [make_record(0, a.pid, start_ticks(a.pid), 5, 4),
                       make_record(1, b.pid, start_ticks(b.pid), 4, 4)])
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), FAST)
    t0 = time.monotonic()
    paths = detector.poll()
    assert len(paths) == 1 and time.monotonic() - t0 < 5
    assert detector.poll() == [], "one bundle per hang, not one per scan"
    bundle = json.loads(open(paths[0]).read())
    assert bundle["verdicts"][0]["culprits"] == [1]
    frames = [f["name"] for f in bundle["stacks"]["0"]["threads"][0]["frames"]]
    assert "wait_in_collective" in frames


LOCKER = ("import threading\ndef wait_for_lock():\n    lock = threading.Lock()\n    lock.acquire()\n"
          "    lock.acquire()\nwait_for_lock()\n")


def test_native_frames_of_many_processes_merge_into_one_tree(tmp_path):
    """Frames py-spy cannot name (libc's, stripped) are addresses that differ in every process:
    named by module and offset, the ranks' stacks merge, and the odd rank out comes first."""
    py_spy = require_tool("py-spy")
    procs = [subprocess.Popen([sys.executable, "-c", LOCKER if r < 3 else SLEEPER]) for r in range(4)]
    try:
        collector = StackCollector(py_spy, native_timeout=60)
        stacks: dict[str, dict] = {}
        deadline = time.monotonic() + 60
        while len(stacks) < 4 and time.monotonic() < deadline:  # until each waits where it should
            for r, p in enumerate(procs):
                dump = stacks.get(str(r)) or collector.dump(p.pid, native=True)
                names = [f["name"] for t in dump.get("threads") or [] for f in t["frames"]]
                if {"wait_for_lock", "wait_in_collective"} & set(names):
                    stacks[str(r)] = dump
        assert len(stacks) == 4, "the processes never reached their wait"
        tree = merge.stack_tree(stacks, stacks)
        (thread,) = tree.children.values()  # MainThread, named or not
        node, path = thread, []
        while len(node.children) == 1:
            (node,) = node.children.values()
            path.append(node.frame)
        assert path and node.ranks == {0, 1, 2, 3}, f"the ranks split at the first frame: {list(node.children)}"
        assert [c.ranks for c in node.ordered()] == [{3}, {0, 1, 2}], "the minority branch first"
        text = merge.to_text({"job": "j", "nodes": ["n"], "records": {}, "stacks": stacks}, tree, [])
        assert re.search(r"\] libc\.so\.6\+0x[0-9a-f]+ \(libc\.so\.6\)", text), text
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_old_job_with_no_live_process_is_ignored(tmp_path):
    publish(tmp_path, [make_record(0, 2 ** 22 + 5, 1, 5, 4)])
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), FAST)
    assert detector.poll() == [] and detector.jobs == {}


def test_corrupt_records_and_missing_py_spy_still_give_a_bundle(tmp_path, sleepers, caplog):
    (a,) = sleepers(1)
    publish(tmp_path, [make_record(0, a.pid, start_ticks(a.pid), 5, 4)])
    (tmp_path / "j.1.rank.json").write_text('{"version": 1, "rank": 1, "job": "j", "gro')  # torn
    (tmp_path / "j.2.rank.json").write_text(json.dumps({"version": 1, "rank": "two"}))
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), {**FAST, "py_spy": "/nonexistent/py-spy"})
    paths = detector.poll()
    bundle = json.loads(open(paths[0]).read())
    assert "py-spy not found" in bundle["stacks"]["0"]["error"]
    assert any("j.1.rank.json: corrupt state record (not JSON" in e for e in bundle["errors"])
    assert any("j.2.rank.json: corrupt state record" in e for e in bundle["errors"])
    assert bundle["verdicts"], "the records that could be read still give a verdict"
    assert "py-spy not found" in caplog.text and "corrupt state record" in caplog.text
    assert {m.name: m for m in detector.metrics()}["nodehealth_hang_record_errors"].samples == [((), 2.0)]


def test_the_same_refusals_are_logged_once_per_cause_and_counted(tmp_path, sleepers, caplog):
    """Bad records stay bad scan after scan, and a refused bundle directory refuses every hang: said
    once per cause (the next time an hour later, with the count), counted every time."""
    a, b = sleepers(2)
    publish(tmp_path, [make_record(0, a.pid, start_ticks(a.pid), 5, 4, world=1, job="j1"),
                       make_record(0, b.pid, start_ticks(b.pid), 5, 4, world=1, job="j2")])
    (tmp_path / "j.1.rank.json").write_text('{"version": 1, "rank": 1, "job": "j", "gro')  # torn
    (tmp_path / "j.2.rank.json").write_text(json.dumps({"version": 1, "rank": "two"}))
    (tmp_path / "j.3.rank.json").write_bytes(b"[" * 100)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "bundles")
    now = [time.time()]
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), {**NO_SPY, "job_dump_interval_seconds": 0},
                        clock=lambda: now[0])
    for _ in range(5):
        detector.poll()
        now[0] += 1
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([m for m in lines if "corrupt state record" in m]) == 1, lines
    assert len([m for m in lines if "over the cap" in m]) == 1, lines
    assert len([m for m in lines if "cannot write hang bundle" in m]) == 1, lines
    assert len(detector.record_errors) == 3, "every scan still sees them all"
    counted = {labels[0]: v for labels, v in
               {m.name: m for m in detector.metrics()}["nodehealth_hang_warnings_not_logged_total"].samples}
    assert counted == {"bad_record": 9, "over_cap": 4, "foreign_process": 0, "bundle_dir": 1, "no_dumpable_process": 0}
    now[0] += 3600
    caplog.clear()
    detector.poll()
    assert "(9 more like it since, not logged)" in caplog.text


def test_py_spy_absent_from_path(tmp_path, sleepers, monkeypatch):
    (a,) = sleepers(1)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "bin" / "nodehealth")])
    out = StackCollector().dump(a.pid)
    assert "py-spy not found" in out["error"] and out["state"] in "SR"


def test_py_spy_beside_the_running_nodehealth_is_found(tmp_path, monkeypatch):
    """`/opt/venv/bin/nodehealth hang watch` with the venv not activated: py-spy is in /opt/venv/bin."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    spy = venv / "py-spy"
    spy.write_text("#!/bin/sh\n")
    spy.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")
    monkeypatch.setattr(sys, "argv", [str(venv / "nodehealth"), "hang", "watch"])
    assert StackCollector().binary() == str(spy)
    monkeypatch.setattr(sys, "argv", ["x"])
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    assert StackCollector().binary() == str(spy)
    assert StackCollector(str(tmp_path / "nope" / "py-spy")).binary() is None


def fake_py_spy(tmp_path, body: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_rank_exiting_during_collection(tmp_path, sleepers):
    real = require_tool("py-spy")
    (a,) = sleepers(1)
    # kill the target, then run the real py-spy on it: what a rank dying mid-dump looks like
    spy = fake_py_spy(tmp_path, f'kill -9 "$4"; sleep 0.2; exec {real} "$@"\n')
    out = StackCollector(spy).dump(a.pid)
    assert out["error"] == "process exited during stack collection"


def test_timeout_kill_never_leaves_target_stopped(tmp_path, sleepers):
    (a,) = sleepers(1)
    spy = fake_py_spy(tmp_path, 'kill -STOP "$4"; sleep 30\n')  # a py-spy that pauses and hangs
    out = StackCollector(spy, timeout=0.5).dump(a.pid)
    assert "did not answer within 0.5 s" in out["error"]
    assert "sent SIGCONT" in out["resumed"]
    assert process_state(HostPaths(), a.pid).state != "T"


def test_d_state_target_is_read_without_attaching(tmp_path):
    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    (proc / "status").write_text("Name:\tpython\nState:\tD (disk sleep)\nNSpid:\t4242\n")
    (proc / "wchan").write_text("nfs_wait_bit_killable")
    spy = fake_py_spy(tmp_path, 'echo "Error: args $*" >&2; exit 1\n')
    collector = StackCollector(spy, host=HostPaths(procfs=str(tmp_path / "proc")))
    out = collector.dump(4242)
    assert out["mode"] == "nonblocking" and "--nonblocking" in out["error"]
    native = collector.dump(4242, native=True)
    assert "native stack skipped: process is in state D (wchan nfs_wait_bit_killable)" in native["error"]


def test_native_pass_rewrites_the_bundle(tmp_path, sleepers):
    require_tool("py-spy")
    (a,) = sleepers(1)
    publish(tmp_path, [make_record(0, a.pid, start_ticks(a.pid), 5, 4, world=1)])
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), {**FAST, "native_stacks": True})
    bundle = json.loads(open(detector.poll()[0]).read())
    native = bundle["native_stacks"]["0"]
    assert native.get("threads") or native.get("error"), native
    assert "native" in dict(((stage), v) for (_, stage), v in detector.durations.items())


def test_forged_flight_recorder_paths_touch_nothing_outside_the_directory(tmp_path, sleepers):
    """A record is written by a training pod: the paths in it must not steer what we delete,
    write or read as root. Links planted at our own names are replaced, never followed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("precious")
    records = tmp_path / "records"
    records.mkdir()
    me = sleepers(1)[0].pid
    rec = make_record(0, me, start_ticks(me), 5, 4, world=1)
    rec["flight_recorder"] = {"buffer_size": 10, "dump": str(victim), "request": str(outside / "made"),
                              "nccl_pipe": str(victim)}
    publish(records, [rec])
    request, dump = record.flight_recorder_paths(record.record_path(str(records), "j", 0))
    os.symlink(victim, request)
    os.symlink(victim, dump)
    detector = Detector(str(records), str(tmp_path / "bundles"),
                        {**FAST, "py_spy": "/nonexistent/py-spy", "flight_recorder_timeout_seconds": 0.2})
    bundle = json.loads(open(detector.poll()[0]).read())
    assert victim.read_text() == "precious" and os.listdir(outside) == ["victim"]
    assert not os.path.islink(request) and open(request).read() == "1\n"
    fr = bundle["flight_recorder"]["0"]
    assert fr["nccl_pipe"] is None and "no Flight Recorder dump from rank 0" in fr["error"]


def test_flight_recorder_dump_is_read_only_from_a_plain_file(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text('{"pg_status": {}}')
    os.symlink(secret, tmp_path / "link.fr.json")
    os.link(secret, tmp_path / "hard.fr.json")
    os.mkfifo(tmp_path / "fifo.fr.json")
    for name in ("link.fr.json", "hard.fr.json", "fifo.fr.json"):
        with pytest.raises(OSError, match="refused"):
            record.read_regular(str(tmp_path / name), 1000)
    os.unlink(tmp_path / "hard.fr.json")
    assert record.read_regular(str(secret), 1000) == b'{"pg_status": {}}'


def test_nccl_pipe_only_by_name_in_the_directory(tmp_path):
    os.mkfifo(tmp_path / "nccl0.pipe")
    reader = os.open(tmp_path / "nccl0.pipe", os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert poke_pipe(str(tmp_path), "nccl0.pipe").startswith("wrote to")
        assert os.read(reader, 10) == b"1\n"
    finally:
        os.close(reader)
    (tmp_path / "plain.pipe").write_text("")
    os.symlink(tmp_path / "nccl0.pipe", tmp_path / "link.pipe")
    assert "refused" in poke_pipe(str(tmp_path), "plain.pipe") and "refused" in poke_pipe(str(tmp_path), "link.pipe")
    assert (tmp_path / "plain.pipe").read_text() == ""
    assert poke_pipe(str(tmp_path), "../nccl0.pipe") is None and poke_pipe(str(tmp_path), "/tmp/x.pipe") is None


def test_any_thread_in_d_state_means_hands_off(tmp_path):
    """The main thread sleeps, a CUDA or NFS thread is in D: ptrace would wait for it."""
    proc = tmp_path / "proc" / "4242"
    for tid, state in (("4242", "S"), ("4243", "D")):
        (proc / "task" / tid).mkdir(parents=True)
        (proc / "task" / tid / "stat").write_text(f"{tid} (py) thon) {state} 1 4242 4242 0 -1 4194560\n")
    (proc / "status").write_text("Name:\tpython\nState:\tS (sleeping)\nNSpid:\t4242\n")
    spy = fake_py_spy(tmp_path, 'echo "Error: args $*" >&2; exit 1\n')
    collector = StackCollector(spy, host=HostPaths(procfs=str(tmp_path / "proc")))
    out = collector.dump(4242)
    assert out["mode"] == "nonblocking" and "--nonblocking" in out["error"] and out["blocked_thread"] == 4243
    native = collector.dump(4242, native=True)
    assert "native stack skipped: its thread 4243 is in state D" in native["error"]


CONT_WATCHER = ("import signal, sys, time\n"
                "signal.signal(signal.SIGCONT, lambda *a: open(sys.argv[1], 'w').close())\n"
                "time.sleep(600)\n")


def test_killed_py_spy_always_sends_sigcont(tmp_path):
    """The target was never stopped, but a py-spy killed mid-attach might have stopped it: resume anyway."""
    flag = tmp_path / "got-sigcont"
    target = subprocess.Popen([sys.executable, "-c", CONT_WATCHER, str(flag)])
    try:
        time.sleep(0.3)
        out = StackCollector(fake_py_spy(tmp_path, "sleep 30\n"), timeout=0.3).dump(target.pid)
        assert "did not answer" in out["error"] and "killed at its timeout; sent SIGCONT" in out["resumed"]
        assert flag.exists()
    finally:
        target.kill()
        target.wait()


def test_target_stopped_late_after_a_killed_py_spy_is_resumed(tmp_path, sleepers):
    (a,) = sleepers(1)
    # a stop that lands after py-spy was killed (its own session, so the kill does not reach it)
    spy = fake_py_spy(tmp_path, 'setsid sh -c \'sleep 0.45; kill -STOP "$1"\' x "$4" >/dev/null 2>&1 &\nsleep 30\n')
    out = StackCollector(spy, timeout=0.3).dump(a.pid)
    assert out["resumed"] == "the target was left stopped after py-spy; sent SIGCONT"
    assert process_state(HostPaths(), a.pid).state != "T"


def test_finding_of_one_nodes_view_sends_to_the_cluster_report(tmp_path):
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), FAST)
    recs = {str(r): make_record(r, 100 + r, 1, 5, 4, world=16) for r in range(8)}
    detector.jobs["j"] = JobState(hung=True, verdicts=merge.verdicts({"records": recs}), bundle="/b.json")
    (finding,) = detector.findings()
    assert finding.reason == "TrainingHang" and "communication hang" not in finding.message
    assert "ranks 8-15 have no record here (they run on other nodes): run `nodehealth hang report`" in finding.message


def fake_process(proc, pid: int, nspid: str, start: int) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "status").write_text(f"Name:\tpython\nState:\tS (sleeping)\nNSpid:\t{nspid}\n")
    (proc / str(pid) / "stat").write_text(f"{pid} (python) S " + "0 " * 18 + f"{start} 0 0\n")


def test_host_pids_are_remembered_and_proc_is_walked_once(tmp_path, monkeypatch):
    """Many records of dead processes plus one rank in a container: /proc is walked on the first
    scan only, misses included; later scans only check the found process is still alive."""
    from nodehealth.hang import detector as detector_module

    proc = tmp_path / "proc"
    fake_process(proc, 900, "900\t27", 555)  # the rank: pid 27 in its container
    fake_process(proc, 901, "901", 556)
    fake_process(proc, 902, "902\t27", 777)  # pid 27 of another container, started at another time
    records = tmp_path / "records"
    records.mkdir()
    publish(records, [make_record(0, 5000 + i, 1, 4, 4, world=1, job=f"old{i}") for i in range(30)])
    live = make_record(0, 27, 555, 4, 4, world=1, job="live")
    live["pid_namespace"] = "pid:[4026532999]"
    publish(records, [live])
    reads: list[str] = []

    def counting(path: str, *args):
        reads.append(path)
        return real(path, *args)
    real = detector_module.read_text
    monkeypatch.setattr(detector_module, "read_text", counting)
    detector = Detector(str(records), str(tmp_path / "bundles"), FAST, host=HostPaths(procfs=str(proc)))
    detector.poll()
    first = [p for p in reads if p.endswith("status")]
    assert sorted(first) == [str(proc / p / "status") for p in ("900", "901", "902")]
    assert detector.jobs["live"].ranks[0].host_pid == 900 and list(detector.jobs) == ["live"]
    reads.clear()
    detector.poll()
    detector.poll()
    assert reads == [str(proc / "900" / "stat")] * 2, "later scans: one liveness check of the found process"
    (proc / "900" / "stat").write_text("900 (python) S " + "0 " * 18 + "999 0 0\n")  # pid reused
    detector.poll()
    assert detector.jobs == {} and detector.host_pids[("pid:[4026532999]", 27, 555)] is None


def test_stale_records_are_ignored(tmp_path, sleepers):
    me = sleepers(1)[0].pid
    rec = make_record(0, me, start_ticks(me), 5, 4, world=1)
    rec["heartbeat"] -= 4000
    publish(tmp_path, [rec])
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), {**FAST, "py_spy": "/nonexistent/py-spy"})
    assert detector.poll() == [] and detector.jobs == {}
    detector.cfg["stale_record_seconds"] = 5000.0
    assert len(detector.poll()) == 1 and detector.jobs["j"].hung


def test_durations_are_forgotten_when_the_hang_is_over(tmp_path, sleepers):
    me = sleepers(1)[0].pid
    publish(tmp_path, [make_record(0, me, start_ticks(me), 4, 4, world=1)])
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), FAST)
    detector.durations = {("j", "python"): 0.5, ("gone", "native"): 3.0}
    detector.poll()
    assert "j" in detector.jobs and not detector.jobs["j"].hung and detector.durations == {}


def test_a_clean_finish_is_no_hang(tmp_path, sleepers):
    """destroy_process_group() then a minute of post-training work: the record says finished."""
    a, b = sleepers(2)
    done = make_record(0, a.pid, start_ticks(a.pid), 5, 4)
    done["finished"] = True
    done["heartbeat"] -= 90
    publish(tmp_path, [done, make_record(1, b.pid, start_ticks(b.pid), 4, 4)])
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), {**FAST, "py_spy": "/nonexistent/py-spy"})
    assert detector.poll() == [] and not detector.jobs["j"].hung
    assert detector.jobs["j"].ranks[0].process == "finished"


def test_a_hang_seen_only_through_heartbeats_has_its_own_words(tmp_path, sleepers):
    (a, b) = sleepers(2)
    silent = make_record(1, b.pid, start_ticks(b.pid), 4, 4)
    silent["heartbeat"] -= 45
    publish(tmp_path, [make_record(0, a.pid, start_ticks(a.pid), 4, 4), silent])
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), NO_SPY)
    bundle = json.loads(open(detector.poll()[0]).read())
    assert bundle["silent"] == {"1": 45.0} and bundle["verdicts"][0]["kind"] == "heartbeat_lost"
    (finding,) = detector.findings()
    assert "rank 1 has published no heartbeat for 45 s and has no collective in flight" in finding.message


@pytest.mark.parametrize("mode", ["--once", "--exit-on-hang"])
def test_watch_says_a_hang_whose_bundle_was_refused(tmp_path, sleepers, mode):
    (a,) = sleepers(1)
    publish(tmp_path, [make_record(0, a.pid, start_ticks(a.pid), 5, 4, world=1)])
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "bundles")  # refused: bundles never go through a link
    out = subprocess.run([sys.executable, "-m", "nodehealth.hang.cli", "hang", "watch", str(tmp_path), mode,
                          "--floor", "1", "--interval", "0.1", "--py-spy", "/nonexistent/py-spy", "--no-native"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "hang in job j: no bundle written" in out.stderr and "a link or not a directory; refused" in out.stderr


def test_a_dead_rank_is_named_in_the_bundle(tmp_path, sleepers):
    a, b = sleepers(2)
    b.kill()
    b.wait()
    publish(tmp_path, [make_record(0, a.pid, start_ticks(a.pid), 5, 4), make_record(1, b.pid, 12345, 4, 3)])
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), {**FAST, "py_spy": "/nonexistent/py-spy"})
    bundle = json.loads(open(detector.poll()[0]).read())
    assert bundle["processes"] == {"0": "running", "1": "gone"}
    assert bundle["verdicts"][0]["summary"].startswith("rank 1's process is gone")
    assert "rank 1 never entered all_reduce #5" in bundle["verdicts"][1]["summary"]


def test_a_rank_that_died_but_is_not_yet_reaped_is_gone_with_its_exit_code(tmp_path, sleepers):
    """A zombie keeps its pid and start time until its parent waits for it: it is gone all the same,
    and the exit code the kernel announced is in the bundle."""
    (a,) = sleepers(1)
    b = subprocess.Popen(["sh", "-c", "read x; exit 3"], stdin=subprocess.PIPE)
    try:
        publish(tmp_path, [make_record(0, a.pid, start_ticks(a.pid), 5, 4),
                           make_record(1, b.pid, start_ticks(b.pid), 4, 4, age=0.0)])
        detector = Detector(str(tmp_path), str(tmp_path / "bundles"), {**FAST, "py_spy": "/nonexistent/py-spy",
                                                                       "floor_seconds": 30.0})
        watching = detector.watch_exits()
        assert detector.poll() == [] and detector.jobs["j"].ranks[1].process == "running"
        b.stdin.close()
        while not os.path.exists(f"/proc/{b.pid}/stat") or open(f"/proc/{b.pid}/stat").read().split(") ")[1][0] != "Z":
            time.sleep(0.01)
        while watching and b.pid not in detector.exits.statuses:  # the watcher's thread may lag the exit
            time.sleep(0.01)
        detector.cfg["floor_seconds"] = 1.0
        bundle = json.loads(open(detector.poll()[0]).read())
        assert bundle["processes"] == {"0": "running", "1": "gone"}
        if watching:  # root: the kernel told us how it ended
            assert bundle["exit_statuses"] == {"1": "exit code 3"}
            assert bundle["verdicts"][0]["summary"] == ("rank 1's process is gone (exit code 3) without exiting "
                                                        "normally")
    finally:
        detector.exits.close()
        b.wait()


def test_straggler_is_published_after_a_window_of_scans(tmp_path, sleepers):
    procs = sleepers(3)
    recs = [make_record(r, p.pid, start_ticks(p.pid), 60, 60, world=3) for r, p in enumerate(procs)]
    slow = lockstep(4, lambda step, r: 0.3 if r == 1 else 0.1, ranks=3)
    for r, rec in enumerate(recs):
        rec["host"] = "node-a"
        rec["groups"]["0"] = slow[str(r)]["groups"]["0"]
    publish(tmp_path, recs)
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), {**FAST, "straggler_scans": 3})
    for _ in range(2):
        detector.poll()
        assert not detector.findings(), "one scan is not a window"
    detector.poll()
    (finding,) = detector.findings()
    assert finding.reason == "TrainingStraggler" and "rank 1 on node-a is a straggler" in finding.message
    samples = {m.name: m for m in detector.metrics()}["nodehealth_hang_straggler"].samples
    assert samples == [(("j", "1", "node-a"), 1.0)]
    even = lockstep(4, lambda step, r: 0.1, ranks=3)
    for r, rec in enumerate(recs):  # the job evens out: the finding goes at once
        rec["groups"]["0"] = even[str(r)]["groups"]["0"]
    publish(tmp_path, recs)
    detector.poll()
    assert not detector.findings()


def test_the_bundle_names_each_ranks_pod(tmp_path, sleepers):
    """A rank's pod, from the downward API (NODEHEALTH_HANG_POD_NAME, _NAMESPACE), is in its record and the
    bundle; a record whose pod is not a pod's name is refused like any corrupt record."""
    (a, b) = sleepers(2)
    recs = [make_record(0, a.pid, start_ticks(a.pid), 5, 4), make_record(1, b.pid, start_ticks(b.pid), 4, 4)]
    recs[0]["pod"] = {"namespace": "team-a", "name": "llama-7b-worker-0"}
    recs[1]["pod"] = {"namespace": "team-a", "name": "llama-7b-worker-1"}
    publish(tmp_path, recs)
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), NO_SPY)
    bundle = json.loads(open(detector.poll()[0]).read())
    assert bundle["pods"] == {"0": "team-a/llama-7b-worker-0", "1": "team-a/llama-7b-worker-1"}
    for bad in ({"namespace": "team-a"}, {"name": "x" * 254}, {"name": "w", "namespace": 7}, "team-a/w"):
        with pytest.raises(record.RecordError, match="pod"):
            record.validate(dict(recs[0], pod=bad), "r")


def test_a_ranks_children_are_those_of_every_thread_and_not_their_own(tmp_path):
    """DataLoader workers are children of the rank (psutil finds them by their parent): one started from
    the main thread, one from another thread; a worker's own child is not the rank's."""
    from nodehealth.hang import detector as detector_module

    script = ("import subprocess, sys, threading, time\n"
              "kids = [subprocess.Popen(['sh', '-c', 'sleep 60 & wait'])]\n"
              "t = threading.Thread(target=lambda: kids.append(subprocess.Popen(['sleep', '60'])))\n"
              "t.start(); t.join()\n"
              "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
              "time.sleep(60)\n")
    rank = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    kids: list[int] = []
    try:
        kids = sorted(int(p) for p in rank.stdout.readline().split())
        assert len(kids) == 2
        assert detector_module._children(rank.pid) == kids
        assert detector_module._children(kids[0]) != []  # the shell's own sleep: its child, not the rank's
    finally:
        for pid in [p for k in kids for p in detector_module._children(k)] + kids + [rank.pid]:
            os.kill(pid, signal.SIGKILL)
        rank.wait()
    assert detector_module._children(rank.pid) == []  # gone: no children, no error
