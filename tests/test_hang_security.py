"""The hang directory is written by every user of the node and the detector runs as root: a record
speaks only for its owner, the work done for records is bounded, and output never follows a link.
Records are written by a real other uid (setpriv), its processes run as that uid."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import require_tool
from test_hang_detector import NO_SPY, SLEEPER, fake_py_spy, make_record, publish, start_ticks

from nodehealth.hang import record
from nodehealth.hang.detector import Detector
from nodehealth.hang.stacks import process_state
from nodehealth.host import HostPaths

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def as_nobody() -> list[str]:
    setpriv = require_tool("setpriv")
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@pytest.fixture
def shared_dir():
    """A records directory as on a node: world-writable and sticky."""
    path = tempfile.mkdtemp(prefix="nodehealth-hang-")
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []

    def start(user: str = "root") -> subprocess.Popen:
        prefix = as_nobody() if user == "nobody" else []
        p = subprocess.Popen(prefix + ["/usr/bin/python3", "-c", SLEEPER], cwd="/")
        started.append(p)
        time.sleep(0.3)
        return p
    yield start
    for p in started:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait()


def write_as_nobody(directory: str, recs: list[dict]) -> None:
    """Write records as uid 65534, as an unprivileged user of the node would."""
    script = ("import json, os, sys\n"
              "for rec in json.load(sys.stdin):\n"
              "    p = os.path.join(sys.argv[1], f\"{rec['job']}.{rec['rank']}.rank.json\")\n"
              "    open(p + '.tmp', 'w').write(json.dumps(rec)); os.rename(p + '.tmp', p)\n")
    subprocess.run(as_nobody() + ["/usr/bin/python3", "-c", script, directory], input=json.dumps(recs).encode(),
                   check=True, cwd="/")


def rec_for(p: subprocess.Popen | int, rank: int, job: str = "j", world: int = 1, enqueued: int = 5,
            completed: int = 4) -> dict:
    pid = p if isinstance(p, int) else p.pid
    return make_record(rank, pid, start_ticks(pid), enqueued, completed, world=world, job=job)


def counter(detector: Detector, name: str) -> dict:
    return {labels[0]: value for labels, value in {m.name: m for m in detector.metrics()}[name].samples}




def test_a_record_names_only_processes_of_its_owner(shared_dir, procs, tmp_path):
    root_proc, own = procs("root"), procs("nobody")
    write_as_nobody(shared_dir, [rec_for(root_proc, 0, job="steal"), rec_for(1, 0, job="init"),
                                 rec_for(os.getpid(), 0, job="daemon"), rec_for(own, 0, job="mine")])
    detector = Detector(shared_dir, str(tmp_path / "bundles"), NO_SPY)
    paths = detector.poll()
    assert list(detector.jobs) == ["mine"], "only the record naming nobody's own process makes a job"
    assert [json.load(open(p))["pids"] for p in paths] == [{"0": own.pid}]
    refused = [e for e in detector.record_errors if "refused" in e]
    assert len(refused) == 3 and any(f"owned by uid {NOBODY} but names pid {root_proc.pid} of uid 0" in e
                                     for e in refused)
    assert counter(detector, "nodehealth_hang_skipped_total")["foreign_process"] == 3


def test_root_records_may_name_anyone_but_never_the_daemon_or_pid_1(tmp_path, procs):
    other = procs("nobody")
    publish(tmp_path, [rec_for(other, 0, job="a"), rec_for(1, 0, job="init"), rec_for(os.getpid(), 0, job="me")])
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), NO_SPY)
    detector.poll()
    assert list(detector.jobs) == ["a"]


def test_a_rank_added_by_another_user_joins_no_job_of_the_victim(shared_dir, procs, tmp_path):
    victims = [procs("root")]  # rank 0 runs here, rank 1 on another node
    publish(shared_dir, [rec_for(victims[0], 0, world=2, enqueued=4, completed=4)])
    intruder = procs("nobody")
    write_as_nobody(shared_dir, [rec_for(intruder, 1, world=2)])
    detector = Detector(shared_dir, str(tmp_path / "bundles"), NO_SPY)
    paths = detector.poll()
    by_owner = {state.owner: (job, state) for job, state in detector.jobs.items()}
    job, victim = by_owner[0]
    assert not victim.hung and {r.host_pid for r in victim.ranks.values()} <= {v.pid for v in victims}
    for p in paths:
        assert set(json.load(open(p))["pids"].values()) <= {intruder.pid}, "no victim process was dumped"


def test_same_job_name_from_two_owners_is_two_jobs(shared_dir, procs, tmp_path):
    mine = procs("root")
    publish(shared_dir, [rec_for(mine, 0, job="j2", enqueued=4, completed=4)])
    theirs = procs("nobody")
    write_as_nobody(shared_dir, [rec_for(theirs, 1, job="j2", world=2)])
    detector = Detector(shared_dir, str(tmp_path / "bundles"), NO_SPY)
    detector.poll()
    assert sorted(detector.jobs) == ["j2@uid0", f"j2@uid{NOBODY}"]
    assert not detector.jobs["j2@uid0"].hung and detector.jobs[f"j2@uid{NOBODY}"].hung


def test_a_moving_stall_point_is_dumped_once_per_interval(tmp_path, procs):
    target = procs("root")
    now = [time.time()]
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), NO_SPY, clock=lambda: now[0])
    bundles = []
    for second in range(30):
        rec = rec_for(target, 0, enqueued=5 + second, completed=4 + second)
        rec["heartbeat"] = now[0]
        for op in rec["groups"]["0"]["pending"]:
            op["enqueued_at"] = now[0] - 10
        publish(tmp_path, [rec])
        bundles += detector.poll()
        now[0] += 1
    assert len(bundles) == 1
    assert counter(detector, "nodehealth_hang_dumps_refused_total")["job_rate"] == 29


def test_one_process_under_many_job_names_is_dumped_once(tmp_path, procs):
    target = procs("root")
    publish(tmp_path, [rec_for(target, 0, job=f"alias{i}") for i in range(5)])
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), NO_SPY)
    assert len(detector.poll()) == 1
    assert counter(detector, "nodehealth_hang_dumps_refused_total")["process_rate"] == 4


def test_a_flood_of_fake_jobs_cannot_starve_a_real_hang(shared_dir, procs, tmp_path):
    real = procs("root")
    flooders = [procs("nobody") for _ in range(3)]
    write_as_nobody(shared_dir, [rec_for(flooders[i % 3], 0, job=f"fake{i:05d}") for i in range(3000)])
    publish(shared_dir, [rec_for(real, 0, job="zz-real")])
    detector = Detector(shared_dir, str(tmp_path / "bundles"), NO_SPY)
    t0 = time.monotonic()
    paths = detector.poll()
    assert time.monotonic() - t0 < 20
    assert len(detector.jobs) == detector.cfg["max_jobs_per_scan"] and "zz-real" in detector.jobs
    jobs = [json.load(open(p))["job"] for p in paths]
    assert "zz-real" in jobs and len(paths) <= detector.cfg["dumps_per_minute"]
    assert len(paths) <= 1 + len(flooders), "each flooder process is dumped once"
    skipped = counter(detector, "nodehealth_hang_skipped_total")
    assert skipped["record_limit"] == 3001 - detector.cfg["max_records_per_scan"] and skipped["job_limit"] > 0
    series = sum(len(m.samples) for m in detector.metrics() if m.labels and m.labels[0] == "job")
    assert series <= detector.cfg["max_metric_series"]


def test_bytes_read_per_scan_are_bounded(shared_dir, procs, tmp_path):
    """Big records (under the per-record cap) from one user: the scan reads a bounded amount, and
    another user's job is read first."""
    flooder, real = procs("nobody"), procs("root")
    big = rec_for(flooder, 0)
    big["pad"] = "x" * 200_000
    write_as_nobody(shared_dir, [{**big, "job": f"big{i}"} for i in range(20)])
    publish(shared_dir, [rec_for(real, 0, job="real")])
    detector = Detector(shared_dir, str(tmp_path / "bundles"), {**NO_SPY, "max_scan_bytes": 1 << 20})
    detector.poll()
    assert "real" in detector.jobs and len(detector.jobs) == 6, "1 MiB: the real record and five of 200 KB"
    assert counter(detector, "nodehealth_hang_skipped_total")["record_limit"] == 21 - len(detector.jobs)


@pytest.mark.parametrize("body,why", [
    (b"[" * (1 << 20), "larger than"),
    (b"[" * 200_000, "nested deeper"),
    (json.dumps({**make_record(0, 5, 1, 5, 4), "world_size": 1 << 20}).encode(), "world size 1048576"),
    (json.dumps({**make_record(0, 5, 1, 5, 4), "groups": {
        str(i): {"enqueued": 1, "completed": 0, "pending": [], "recent": []} for i in range(100)}}).encode(),
     "100 process groups"),
])
def test_records_over_a_cap_are_skipped_before_parsing(tmp_path, body, why):
    (tmp_path / "j.0.rank.json").write_bytes(body)
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), NO_SPY)
    t0 = time.monotonic()
    detector.poll()
    assert time.monotonic() - t0 < 2
    assert len(detector.record_errors) == 1 and "over the cap" in detector.record_errors[0]
    assert why in detector.record_errors[0]
    assert counter(detector, "nodehealth_hang_skipped_total")["over_cap"] == 1


def test_bundles_are_capped_and_rotated(tmp_path, procs):
    bundles = tmp_path / "bundles"
    bundles.mkdir(mode=0o750)
    for i in range(5):
        old = bundles / f"hang-old{i}-n-2020.json"
        old.write_bytes(b"x" * 15000)
        os.utime(old, (1000 + i, 1000 + i))
    target = procs("root")
    rec = rec_for(target, 0)
    rec["groups"]["0"]["recent"] = [{"seq": i, "op": "all_reduce", "pad": "y" * 3000} for i in range(60)]
    publish(tmp_path, [rec])
    detector = Detector(str(tmp_path), str(bundles), {**NO_SPY, "max_bundle_bytes": 50_000,
                                                      "max_bundle_dir_bytes": 60_000})
    (path,) = detector.poll()
    assert os.path.getsize(path) <= 50_000
    assert any("over its cap of 50000 bytes" in e for e in json.load(open(path))["errors"])
    left = sorted(os.listdir(bundles))
    assert os.path.basename(path) in left and "hang-old0-n-2020.json" not in left
    assert sum(os.path.getsize(bundles / n) for n in left) <= 60_000


def test_bundle_output_never_follows_a_link(tmp_path, procs, caplog):
    target = procs("root")
    publish(tmp_path, [rec_for(target, 0)])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "bundles")
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), NO_SPY)
    assert detector.poll() == [] and os.listdir(elsewhere) == []
    assert "a link or not a directory; refused" in caplog.text


def test_bundle_directory_of_another_user_is_refused(tmp_path, procs, caplog):
    target = procs("root")
    publish(tmp_path, [rec_for(target, 0)])
    planted = tmp_path / "bundles"
    planted.mkdir()
    os.chown(planted, NOBODY, NOBODY)
    detector = Detector(str(tmp_path), str(planted), NO_SPY)
    assert detector.poll() == [] and os.listdir(planted) == []
    assert f"owned by uid {NOBODY}" in caplog.text


def test_sigterm_interrupts_a_native_dump(tmp_path, procs):
    """The DaemonSet grants 10 s: a py-spy stuck in a native dump must not hold shutdown for 25 s."""
    target = procs("root")
    publish(tmp_path, [rec_for(target, 0)])
    spy = fake_py_spy(tmp_path, 'case "$*" in *--native*) kill -STOP "$4"; sleep 60;; esac\necho "[]"\n')
    watch = subprocess.Popen([sys.executable, "-m", "nodehealth.hang.cli", "hang", "watch", str(tmp_path),
                              "--floor", "1", "--py-spy", spy],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while process_state(HostPaths(), target.pid).state != "T" and time.monotonic() < deadline:
            time.sleep(0.05)  # the native pass has stopped the target
        assert process_state(HostPaths(), target.pid).state == "T"
        t0 = time.monotonic()
        watch.send_signal(signal.SIGTERM)
        watch.wait(10)
        assert time.monotonic() - t0 < 3 and watch.returncode == 0
        assert process_state(HostPaths(), target.pid).state != "T", "the target is resumed on the way out"
    finally:
        watch.kill()
        watch.wait()


def test_records_of_the_flight_recorder_of_a_stopped_rank_are_not_awaited(tmp_path, procs):
    target = procs("root")
    rec = rec_for(target, 0)
    rec["flight_recorder"] = {"buffer_size": 100, "nccl_pipe": None}
    publish(tmp_path, [rec])
    os.kill(target.pid, signal.SIGSTOP)
    time.sleep(0.1)
    detector = Detector(str(tmp_path), str(tmp_path / "bundles"), {**NO_SPY, "flight_recorder_timeout_seconds": 15})
    t0 = time.monotonic()
    (path,) = detector.poll()
    assert time.monotonic() - t0 < 5
    bundle = json.load(open(path))
    assert bundle["processes"] == {"0": "stopped"}
    assert "rank 0 (Flight Recorder): no dump asked: its process is stopped (SIGSTOP)" in bundle["errors"]
    assert not os.path.exists(record.flight_recorder_paths(record.record_path(str(tmp_path), "j", 0))[0])
