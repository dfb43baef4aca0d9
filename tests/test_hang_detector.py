"""The detector against plain Python processes that publish records: thresholds, bad input,
py-spy missing, a rank exiting mid-dump, py-spy killed at its timeout."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import require_tool

from nodehealth.hang import record
from nodehealth.hang.detector import DEFAULTS, Detector, Rank, judge, limit_for
from nodehealth.hang.stacks import StackCollector, process_state
from nodehealth.host import HostPaths

SLEEPER = "import time\ndef wait_in_collective():\n    time.sleep(600)\nwait_in_collective()\n"
FAST = {"floor_seconds": 1.0, "native_stacks": False, "heartbeat_timeout_seconds": 30.0}


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


def test_py_spy_absent_from_path(tmp_path, sleepers, monkeypatch):
    (a,) = sleepers(1)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out = StackCollector().dump(a.pid)
    assert "py-spy not found" in out["error"] and out["state"] in "SR"


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
