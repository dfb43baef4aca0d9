"""A real 4-rank gloo job under the timer, watched by the real detector with real py-spy.

One job goes through three phases, so torch is imported once per rank: healthy steps with uneven
compute (no alarm), rank 3 stuck in its 'data loader' before an all_reduce (culprit), then rank 3
stopped by SIGSTOP inside an all_reduce after entering it (communication hang).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import IN_CI, free_port, require_tool

from nodehealth.hang import record
from nodehealth.hang.detector import Detector

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "fixtures", "hang", "worker.py")
WORLD = 4
FLOOR = 2.0
CFG = {"floor_seconds": FLOOR, "p99_factor": 2.0, "heartbeat_timeout_seconds": 3.0, "native_stacks": False,
       "scan_interval_seconds": 0.1, "flight_recorder_timeout_seconds": 2.0,
       "job_dump_interval_seconds": 0.0, "process_dump_interval_seconds": 0.0}  # two hangs in a row


def require_torch() -> None:
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail("torch is not installed; .ci/run must install the CPU wheel")
        pytest.skip("torch is not installed")


def start_ranks(worker: str, world: int, job: str, records: str, control: str, **env: str) -> list[subprocess.Popen]:
    """One process per rank of a gloo job on this node."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
           "NODEHEALTH_HANG_JOB": job, **env}
    return [subprocess.Popen([sys.executable, worker, records, control],
                             env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for r in range(world)]


def wait_until(what, timeout: float, procs: list[subprocess.Popen]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise AssertionError(f"a rank exited {dead[0].returncode}: {dead[0].stderr.read()[-2000:]}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s")


def poll_until_bundle(detector: Detector, timeout: float, procs: list[subprocess.Popen]) -> tuple[str, float]:
    started = time.monotonic()
    paths = wait_until(detector.poll, timeout, procs)
    return paths[0], time.monotonic() - started


def test_real_gloo_job_healthy_then_culprit_then_communication_hang(tmp_path):
    require_torch()
    require_tool("py-spy")
    records, control, bundles = (str(tmp_path / d) for d in ("records", "control", "bundles"))
    os.makedirs(control)
    procs = start_ranks(WORKER, WORLD, "gloo-test", records, control, TORCH_FR_BUFFER_SIZE="200")
    try:
        detector = Detector(records, bundles, CFG, node="test-node")

        def steps() -> bool:
            detector.poll()
            ranks = detector.jobs.get("gloo-test")
            return bool(ranks) and len(ranks.ranks) == WORLD and min(r.rec["step"] for r in ranks.ranks.values()) >= 3
        wait_until(steps, 60, procs)

        # Healthy, with one rank 0.6 s slower every few steps: peers wait up to 0.6 s in all_reduce.
        healthy_until = time.monotonic() + 3.0
        while time.monotonic() < healthy_until:
            assert detector.poll() == [], "false alarm on a healthy job with uneven step times"
            time.sleep(0.1)
        # no hang; rank 3 computes 60 ms more per step, which may or may not make it a straggler
        assert not [f for f in detector.findings() if f.reason == "TrainingHang"]
        p2p = detector.jobs["gloo-test"].ranks[1].rec["groups"]["0/p2p"]
        assert p2p["completed"] >= 1 and p2p["recent"][-1]["op"] == "irecv" and p2p["recent"][-1]["peer"] == 0

        # Culprit: rank 3 blocks in its data loader; ranks 0-2 enter the all_reduce.
        open(os.path.join(control, "stall"), "w").close()
        stalled_at = time.monotonic()
        path, _ = poll_until_bundle(detector, FLOOR + 15, procs)
        assert time.monotonic() - stalled_at < FLOOR + 2 + 1.2, "hang not detected within the floor + 2 s"
        with open(path) as f:
            bundle = json.load(f)
        assert sorted(bundle["stacks"]) == ["0", "1", "2", "3"]
        assert all(s.get("threads") and not s.get("error") for s in bundle["stacks"].values()), bundle["errors"]
        culprit = bundle["verdicts"][0]
        assert (culprit["kind"], culprit["culprits"], culprit["op"]) == ("never_joined", [3], "all_reduce")
        text = run_report(path)
        assert "rank 3 never entered all_reduce" in text
        assert "load_next_batch (worker.py" in text  # where the culprit stands
        assert "rank 0: step" in text and "all_reduce #" in text
        fr = bundle["flight_recorder"]  # gloo: through the timer's own request file, not the NCCL pipe
        assert all("pg_status" in fr[r]["dump"] for r in "0123"), fr
        assert detector.findings()[0].reason == "TrainingHang"
        metrics = {m.name: m for m in detector.metrics()}
        assert metrics["nodehealth_hang_detected"].samples == [(("gloo-test",), 1.0)]
        assert any(v > FLOOR for (job, rank), v in metrics["nodehealth_hang_last_progress_age_seconds"].samples)

        # Release the culprit: progress resumes and the hang clears.
        open(os.path.join(control, "release"), "w").close()
        wait_until(lambda: detector.poll() == [] and not detector.jobs["gloo-test"].hung, 20, procs)

        # Communication hang: rank 3 enters the all_reduce and is stopped before exchanging anything.
        open(os.path.join(control, "stop"), "w").close()
        path, _ = poll_until_bundle(detector, FLOOR + 15, procs)
        with open(path) as f:
            bundle = json.load(f)
        stopped = bundle["verdicts"][0]
        assert (stopped["kind"], stopped["culprits"]) == ("rank_stopped", [3]), bundle["verdicts"]
        assert stopped["summary"].startswith("rank 3 is stopped (SIGSTOP")
        assert bundle["verdicts"][1]["kind"] == "communication_hang", bundle["verdicts"]
        assert bundle["stacks"]["3"]["state"] == "T" and bundle["stacks"]["3"]["mode"] == "nonblocking"
        assert all(s.get("threads") for s in bundle["stacks"].values()), bundle["errors"]
        assert "rank 3 is stopped" in run_report(path)
        # a stopped rank can never dump its Flight Recorder: not awaited, and said in the errors
        assert "3" not in bundle["flight_recorder"] and bundle["durations"]["flight_recorder"] < 1.5
        assert "rank 3 (Flight Recorder): no dump asked: its process is stopped (SIGSTOP)" in bundle["errors"]
        assert _state(procs[3].pid) == "T", "the detector must leave a process stopped by someone else as it was"
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.wait()


DDP_WORKER = os.path.join(HERE, "fixtures", "hang", "ddp_worker.py")


def ddp_ranks(records: str, control: str, env: dict) -> list[subprocess.Popen]:
    """Two DDP ranks, each in a session of its own with its DataLoader worker."""
    return [subprocess.Popen([sys.executable, DDP_WORKER, records, control],
                             env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in range(2)]


def stop_ranks(procs: list[subprocess.Popen]) -> None:
    """Kill each rank's whole session: a DataLoader worker left behind would wait for `release` forever."""
    for p in procs:
        if p.poll() is None:  # while the rank lives its pid names its group (no stranger's)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_real_ddp_job_hangs_in_backward_allreduce_then_finishes_cleanly(tmp_path):
    """DDP issues its gradient all-reduce from C++: seen all the same. Rank 1's DataLoader worker
    hangs, so rank 0 waits in backward; the worker's stack is shown under rank 1. Then both ranks
    destroy the process group and work on for longer than the heartbeat timeout: no alarm. Rank 0
    is 0.15 s slower every step before all that: a straggler."""
    require_torch()
    require_tool("py-spy")
    records, control, bundles = (str(tmp_path / d) for d in ("records", "control", "bundles"))
    os.makedirs(control)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
           "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}
    procs = ddp_ranks(records, control, env)
    try:
        detector = Detector(records, bundles, CFG, node="test-node")

        def stepping() -> str | None:
            detector.poll()
            for job, state in detector.jobs.items():
                if len(state.ranks) == 2 and min(r.rec["step"] for r in state.ranks.values()) >= 3:
                    return job
            return None
        job = wait_until(stepping, 60, procs)
        assert job != "none" and job.startswith("127.0.0.1:"), "a unique identity without a job id"
        ddp = detector.jobs[job].ranks[0].rec["groups"]["0"]
        assert ddp["completed"] >= 3 and ddp["recent"][-1]["op"] == "all_reduce", "DDP's all-reduce is timed"
        straggler = wait_until(lambda: detector.poll() == [] and [f for f in detector.findings()
                                                                  if f.reason == "TrainingStraggler"], 30, procs)
        assert straggler[0].evidence["rank"] == 0, straggler[0].message

        open(os.path.join(control, "stall"), "w").close()
        path, _ = poll_until_bundle(detector, FLOOR + 20, procs)
        with open(path) as f:
            bundle = json.load(f)
        v = bundle["verdicts"][0]
        assert (v["kind"], v["culprits"], v["op"]) == ("never_joined", [1], "all_reduce"), bundle["verdicts"]
        children = bundle["stacks"]["1"].get("children") or {}
        assert children and any(t.get("frames") for c in children.values() for t in c.get("threads") or [])
        text = run_report(path)
        assert "rank 1 never entered all_reduce" in text and "child process, thread" in text
        assert "__iter__ (ddp_worker.py" in text, "the hung DataLoader worker's frame is shown"

        open(os.path.join(control, "release"), "w").close()
        files = [os.path.join(records, n) for n in os.listdir(records) if n.endswith(".rank.json")]
        wait_until(lambda: all(record.read_record(f).get("finished") for f in files), 30, procs)
        quiet_until = time.monotonic() + CFG["heartbeat_timeout_seconds"] + 1.5
        while time.monotonic() < quiet_until:  # every rank finished: the job is over, not hung
            assert detector.poll() == [], "false alarm after destroy_process_group()"
            assert job not in detector.jobs or not detector.jobs[job].hung
            time.sleep(0.2)
        assert all(record.read_record(f)["heartbeat"] > time.time() - 1 for f in files), "still publishing"
        open(os.path.join(control, "finish"), "w").close()
        for p in procs:
            assert p.wait(30) == 0, p.stderr.read()[-2000:]
    finally:
        stop_ranks(procs)


def test_real_ddp_job_with_a_builtin_cpp_hook_is_seen_through_the_flight_recorder(tmp_path):
    """A built-in DDP hook issues the all-reduce from C++, past every Python wrapper: the hang is
    still found, from the Flight Recorder's sequence numbers published by the timer."""
    require_torch()
    records, control, bundles = (str(tmp_path / d) for d in ("records", "control", "bundles"))
    os.makedirs(control)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
           "LOCAL_WORLD_SIZE": "2", "NODEHEALTH_HANG_JOB": "cpp-hook", "DDP_BUILTIN_HOOK": "1",
           "TORCH_FR_BUFFER_SIZE": "2000"}
    procs = ddp_ranks(records, control, env)
    try:
        # the timer reads Flight Recorder every 20 records (4 s here): the floor leaves room for two reads
        detector = Detector(records, bundles, {**CFG, "py_spy": "/nonexistent/py-spy", "floor_seconds": 10.0},
                            node="test-node")

        def fr_group() -> bool:
            detector.poll()
            state = detector.jobs.get("cpp-hook")
            return bool(state) and len(state.ranks) == 2 and all("fr/0" in r.rec["groups"]
                                                                  for r in state.ranks.values())
        wait_until(fr_group, 60, procs)
        rec = detector.jobs["cpp-hook"].ranks[0].rec
        assert "DDP all-reduce not timed" in rec["last_error"], "the built-in hook is said, not hidden"
        open(os.path.join(control, "stall"), "w").close()
        path, _ = poll_until_bundle(detector, 40, procs)
        with open(path) as f:
            bundle = json.load(f)
        v = next(v for v in bundle["verdicts"] if v["group"] == "fr/0")
        assert (v["kind"], v["culprits"], v["op"]) == ("never_joined", [1], "all_reduce"), bundle["verdicts"]
    finally:
        stop_ranks(procs)


STRAGGLER_WORKER = os.path.join(HERE, "fixtures", "hang", "straggler_worker.py")


def test_real_gloo_straggler_is_named_with_1_4_and_8_collectives_a_step(tmp_path):
    """Rank 2 computes longer every step (tests/fixtures/hang/straggler_worker.py); only the first
    collective of a step absorbs the others' wait for it. It is named in each of the three phases'
    groups, live and in the report."""
    require_torch()
    records, control, bundles = (str(tmp_path / d) for d in ("records", "control", "bundles"))
    os.makedirs(control)
    procs = start_ranks(STRAGGLER_WORKER, 3, "uneven", records, control)
    try:
        def phases_done() -> list[str] | None:
            names = [n for n in os.listdir(records) if n.endswith(record.SUFFIX)] if os.path.isdir(records) else []
            recs = [record.read_record(os.path.join(records, n)) for n in names]
            done = [sorted(g for g, x in r["groups"].items() if x["completed"] == 48) for r in recs]
            return done[0] if len(recs) == 3 and len(done[0]) == 3 and done.count(done[0]) == 3 else None
        groups = wait_until(phases_done, 90, procs)
        detector = Detector(records, bundles, CFG, node="test-node")
        findings = wait_until(lambda: detector.poll() == [] and detector.findings(), 10, procs)
        assert [(f.reason, f.evidence["rank"]) for f in findings] == [("TrainingStraggler", 2)], findings
        assert findings[0].evidence["groups"] == groups, "named in the groups of 1, 4 and 8 collectives a step"
        out = subprocess.run([sys.executable, "-m", "nodehealth.hang.cli", "hang", "report", records],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "no hang" in out.stdout, out.stdout + out.stderr
        assert "rank 2" in out.stdout and "is a straggler" in out.stdout
        open(os.path.join(control, "finish"), "w").close()
        for p in procs:
            assert p.wait(30) == 0, p.stderr.read()[-2000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def run_report(path: str) -> str:
    out = subprocess.run([sys.executable, "-m", "nodehealth.hang.cli", "hang", "report", path],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1, out.stderr  # 1: a hang verdict
    return out.stdout


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        return next(line.split()[1] for line in f if line.startswith("State:"))



EXIT_WORKER = os.path.join(HERE, "fixtures", "hang", "exit_worker.py")


def test_real_gloo_job_whose_ranks_exit_with_code_3_and_by_sigkill_says_how(tmp_path):
    """Rank 2 exits with code 3 (its last record says it exited, not how) and rank 3 is killed by
    SIGKILL (no last record at all) while ranks 0-1 wait for them: the detector heard both ends from
    the kernel and the report says them."""
    require_torch()
    require_tool("py-spy")
    if os.geteuid() != 0 and not IN_CI:
        pytest.skip("needs root (CAP_NET_ADMIN) for the kernel's process events")
    records, control, bundles = (str(tmp_path / d) for d in ("records", "control", "bundles"))
    os.makedirs(control)
    procs = start_ranks(EXIT_WORKER, 4, "dying", records, control)
    detector = Detector(records, bundles, CFG, node="test-node")
    assert detector.watch_exits(), detector.exits.error
    try:
        def stepping() -> bool:
            detector.poll()
            state = detector.jobs.get("dying")
            return bool(state) and len(state.ranks) == 4 and min(r.rec["step"] for r in state.ranks.values()) >= 2
        wait_until(stepping, 60, procs)
        open(os.path.join(control, "die"), "w").close()
        path, _ = poll_until_bundle(detector, FLOOR + 20, procs[:2])
        assert procs[2].wait(10) == 3 and procs[3].wait(10) == -signal.SIGKILL
        with open(path) as f:
            bundle = json.load(f)
        assert bundle["processes"] == {"0": "running", "1": "running", "2": "gone", "3": "gone"}
        assert bundle["exit_statuses"] == {"2": "exit code 3", "3": "killed by SIGKILL"}
        summaries = [v["summary"] for v in bundle["verdicts"]]
        assert summaries[0] == "rank 2's process is gone (exit code 3): it exited while its peers wait", summaries
        assert summaries[1] == "rank 3's process is gone (killed by SIGKILL) without exiting normally", summaries
        assert "ranks 2-3 never entered all_reduce" in summaries[2], summaries
        text = run_report(path)
        assert "rank 2's process is gone (exit code 3)" in text and "(killed by SIGKILL)" in text
    finally:
        open(os.path.join(control, "end"), "w").close()
        detector.exits.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


TINY = os.path.join(HERE, "fixtures", "hang", "tiny_train.py")


def test_concurrent_torchrun_jobs_without_a_job_id_and_a_pod_owned_one_keep_apart(tmp_path):
    """Two `torchrun --nproc-per-node 2` jobs on one node with no job id (torchrun's run id is
    "none") and a third whose pod owner comes through the downward API: three jobs, six records."""
    require_torch()
    records, control = str(tmp_path / "records"), str(tmp_path / "control")
    os.makedirs(control)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NODEHEALTH_HANG_", "TORCHELASTIC_", "MASTER_"))}
    env.update({"NODEHEALTH_HANG_DIR": records, "NODEHEALTH_HANG_INTERVAL": "0.2", "OMP_NUM_THREADS": "1"})
    pod = {"NODEHEALTH_HANG_POD_OWNER": "llama-7b", "NODEHEALTH_HANG_POD_NAMESPACE": "team-a",
           "NODEHEALTH_HANG_POD_OWNER_UID": "1f2e3d4c-aaaa-bbbb-cccc-0123456789ab",
           "NODEHEALTH_HANG_POD_NAME": "llama-7b-worker-0"}
    ports = [free_port() for _ in range(3)]
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                "--master-port", str(port), "-m", "nodehealth.hang.run", TINY, control],
                               env={**env, **(pod if i == 2 else {})}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
              for i, port in enumerate(ports)]
    try:
        def all_stepped() -> dict[str, list[int]] | None:
            names = [n for n in os.listdir(records) if n.endswith(record.SUFFIX)] if os.path.isdir(records) else []
            recs = [record.read_record(os.path.join(records, n)) for n in names]
            if len(recs) < 6 or any(r["step"] < 3 for r in recs):
                return None
            jobs: dict[str, list[int]] = {}
            for r in recs:
                jobs.setdefault(r["job"], []).append(r["rank"])
                pods.setdefault(r["job"], set()).add(json.dumps(r["pod"], sort_keys=True))
            return jobs
        pods: dict[str, set[str]] = {}
        jobs = wait_until(all_stepped, 120, agents)
        assert pods["k8s/team-a/llama-7b/1f2e3d4c"] == {'{"name": "llama-7b-worker-0", "namespace": "team-a"}'}
        assert {p for job, ps in pods.items() if job != "k8s/team-a/llama-7b/1f2e3d4c" for p in ps} == {"null"}
        assert sorted(map(sorted, jobs.values())) == [[0, 1]] * 3, jobs
        assert "k8s/team-a/llama-7b/1f2e3d4c" in jobs, jobs
        for port, agent in zip(ports[:2], agents):
            (job,) = [j for j in jobs if j.startswith(f"127.0.0.1:{port}-")]
            assert job == f"127.0.0.1:{port}-{agent.pid}-{_start_ticks(agent.pid)}", "the agent's pid and start"
        open(os.path.join(control, "end"), "w").close()
        for agent in agents:
            assert agent.wait(60) == 0, agent.stderr.read()[-2000:]
    finally:
        open(os.path.join(control, "end"), "w").close()
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
            agent.wait()


def _start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])
