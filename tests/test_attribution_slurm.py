"""Slurm jobs behind GPUs: scontrol's job details, listpids and /proc/<pid>/cgroup parsed, and the reader
against a real slurmctld and slurmd (Debian's, on loopback) whose node has two GRES GPUs."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from conftest import DaemonProcess, machine
from hypothesis import given, settings
from hypothesis import strategies as st
from slurm_cluster import NODE, SlurmCluster, running

from nodehealth.attribution.attributor import Attributor
from nodehealth.attribution.gpus import GpuRef
from nodehealth.attribution.notices import drain_detail
from nodehealth.attribution.slurm_jobs import (
    SlurmJob,
    SlurmJobs,
    SlurmLookupError,
    assign_jobs,
    in_hostlist,
    job_of_cgroup,
    parse_jobs,
    parse_listpids,
    slurm_numbers,
)
from nodehealth.collectors.gpu_facts import Gpu, NvmlFacts
from nodehealth.host import HostPaths
from nodehealth.model import Finding, Report, Severity, Status
from nodehealth.slurm.drainer import Drainer, act, drain_reason
from nodehealth.slurm.scontrol import NodeState

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "slurm")


def fixture(name: str) -> str:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return f.read()


# -- parsing ------------------------------------------------------------------------------------------

def test_the_job_details_of_a_real_slurmctld():
    assert parse_jobs(fixture("scontrol-show-job-d.gres.txt"), "nh1") == (SlurmJob("2", "root", (1,)),)
    assert parse_jobs(fixture("scontrol-show-job-d.gres.txt"), "nh2") == (SlurmJob("2", "root", ()),)


def record(*detail: str, head: str = "JobId=42 JobName=train\n   UserId=alice(1000) GroupId=alice(1000)") -> str:
    return head + "\n   JobState=RUNNING Reason=None\n" + "".join(f"     {d}\n" for d in detail)


# Detail lines in the layouts scontrol prints (22.05 above; the older GRES_IDX form and typed GRES per
# its man page); constructed, not captured.
@pytest.mark.parametrize("case, text, want", [
    ("typed GRES, two GPUs", record("Nodes=nh1 CPU_IDs=0-3 Mem=0 GRES=gpu:a100:2(IDX:0,2)"), (0, 2)),
    ("a range", record("Nodes=nh1 CPU_IDs=0-7 Mem=0 GRES=gpu:4(IDX:4-7)"), (4, 5, 6, 7)),
    ("this node in a hostlist", record("Nodes=nh[1-2] CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:3)"), (3,)),
    ("per-node lines", record("Nodes=nh0 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)",
                              "Nodes=nh1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:5)"), (5,)),
    ("another node only", record("Nodes=nh[2-9] CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:3)"), ()),
    ("before 21.08: GRES_IDX", record("Nodes=nh1 CPU_IDs=0-1 Mem=0 GRES_IDX=gpu(IDX:0-1)"), (0, 1)),
    ("GPUs and another GRES", record("Nodes=nh1 CPU_IDs=0 Mem=0 GRES=nic:1(IDX:0),gpu:h100:1(IDX:6)"), (6,)),
    ("no GRES at all", record("Nodes=nh1 CPU_IDs=0 Mem=0"), ()),
    ("an allocation without indices", record("Nodes=nh1 CPU_IDs=0 Mem=0 GRES=gpu:0(IDX:)"), ()),
])
def test_parse_jobs(case, text, want):
    [job] = parse_jobs(text, "nh1")
    assert job == SlurmJob("42", "alice", want), case


def test_parse_jobs_of_several_records_and_of_garbage():
    text = record("Nodes=nh1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)") + "\n" + record(
        "Nodes=nh1 CPU_IDs=1 Mem=0 GRES=gpu:1(IDX:1)", head="JobId=43 ArrayJobId=40 ArrayTaskId=3\n   UserId=bob(1001)")
    assert parse_jobs(text, "nh1") == (SlurmJob("42", "alice", (0,)), SlurmJob("43", "bob", (1,)))
    assert parse_jobs("slurm_load_jobs error: Invalid job id specified\n", "nh1") == ()
    assert parse_jobs(record("Nodes=nh1 GRES=gpu:1(IDX:0-99999999)"), "nh1") == (SlurmJob("42", "alice", ()),)


@pytest.mark.parametrize("name, expr, want", [
    ("nh1", "nh1", True), ("nh1", "nh[1-2]", True), ("nh3", "nh[1-2]", False), ("nh1", "nh10", False),
    ("gpu-007", "gpu-[001-010]", True), ("gpu-7", "gpu-[001-010]", False), ("b", "a,b", True),
    ("gpu12", "gpu[1,3,10-12]", True), ("gpu2", "gpu[1,3,10-12]", False), ("x", "nh[", False),
    ("nh1", "nh[1-99999999]", True),
])
def test_in_hostlist(name, expr, want):
    assert in_hostlist(name, expr) is want


def test_parse_listpids_of_a_real_slurmd():
    assert parse_listpids(fixture("scontrol-listpids.txt")) == {11695: "2", 11696: "2", 11690: "1", 11691: "1"}
    assert parse_listpids("PID      JOBID    STEPID   LOCALID GLOBALID\n") == {}
    assert parse_listpids("garbage\n12 x\n") == {}


@pytest.mark.parametrize("case, text, want", [
    ("a real proctrack/cgroup v1 process", fixture("proc-pid-cgroup.proctrack-cgroup-v1.txt"), "1"),
    ("cgroup v2 (Slurm's documented layout)",
     "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", "4242"),
    ("cgroup v1, one slurmd", "6:freezer:/slurm/uid_1000/job_77/step_batch\n", "77"),
    ("a process outside any job", "0::/user.slice/user-1000.slice/session-3.scope\n", None),
    ("a directory that only looks like a job", "0::/system.slice/job_runner.service\n", None),
    ("the memory line of the capture alone", "4:memory:/process_api/b1b077f7166c7f3f4c6d860959e0238a\n", None),
])
def test_job_of_cgroup(case, text, want):
    assert job_of_cgroup(text) == want, case


def gpu(index: int, bus: str | None) -> GpuRef:
    return GpuRef(index, f"GPU-{index:08x}-0000-0000-0000-000000000000", bus)


def test_slurm_numbers_gpus_by_pci_bus_id():
    """gres.conf(5): Slurm numbers GPUs by sorting them by PCI bus id, whatever NVML's index order."""
    gpus = [gpu(0, "0000:cb:00.0"), gpu(1, "0000:18:00.0"), gpu(2, "0000:5d:00.0")]
    assert slurm_numbers(gpus) == {0: 1, 1: 2, 2: 0}
    assert slurm_numbers([gpu(0, "0000:18:00.0"), gpu(1, None)]) == {}  # an unnamed GPU: no order to trust


def test_assign_jobs():
    gpus = [gpu(0, "0000:cb:00.0"), gpu(1, "0000:18:00.0")]
    jobs = (SlurmJob("42", "alice", (0,)), SlurmJob("43", "bob", (1, 2)))
    got = assign_jobs(jobs, gpus)
    assert got.by_gpu == {1: (SlurmJob("42", "alice", (0,)),), 0: (SlurmJob("43", "bob", (1, 2)),)}
    assert got.unresolved == ("43: GPU 2",)
    assert assign_jobs(jobs, [gpu(0, None)]).unresolved == ("42: GPU 0", "43: GPU 1", "43: GPU 2")


# -- the reader through HostPaths (a replayed /proc) ---------------------------------------------------

def replayed_proc(tmp_path, pid: int, cgroup: str, started_ticks: int, btime: int = 1_700_000_000) -> HostPaths:
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(cgroup)
    fields = [str(pid), "(python)", "S"] + ["0"] * 18 + [str(started_ticks)] + ["0"] * 30
    (proc / str(pid) / "stat").write_text(" ".join(fields) + "\n")
    (proc / "stat").write_text(f"cpu  1 2 3 4\nbtime {btime}\n")
    (proc / "uptime").write_text("100000.00 1.00\n")
    return HostPaths(str(tmp_path))


def test_the_xid_pid_names_its_job_through_its_cgroup(tmp_path):
    host = replayed_proc(tmp_path, 4321, fixture("proc-pid-cgroup.proctrack-cgroup-v1.txt"), started_ticks=500)
    calls = []
    jobs = SlurmJobs(host, lambda *args: calls.append(args) or "")
    assert jobs.job_of_pid(4321, at=1_700_000_010.0) == "1"  # started at btime + 5 s, the Xid 5 s later
    assert calls == []  # the cgroup said it: no scontrol


def test_a_pid_that_started_after_the_xid_is_someone_else(tmp_path):
    host = replayed_proc(tmp_path, 4321, "0::/system.slice/slurmstepd.scope/job_9/step_0/user/task_0\n",
                         started_ticks=100_000)  # started 1000 s after boot
    jobs = SlurmJobs(host, lambda *args: fixture("scontrol-listpids.txt"))
    assert jobs.job_of_pid(4321, at=1_700_000_010.0) is None
    assert jobs.job_of_pid(4321, at=None) == "9"  # no time to compare: the cgroup is all there is


def test_without_a_job_cgroup_listpids_names_the_job(tmp_path):
    host = replayed_proc(tmp_path, 11695, "0::/\n", started_ticks=0)
    jobs = SlurmJobs(host, lambda *args: fixture("scontrol-listpids.txt"))
    assert jobs.job_of_pid(11695, at=1_700_000_010.0) == "2"
    assert jobs.job_of_pid(99999, at=1_700_000_010.0) is None  # gone, and not Slurm's


def test_a_failing_scontrol_is_one_lookup_error(tmp_path):
    def broken(*args: str) -> str:
        raise RuntimeError("slurmctld did not answer `scontrol show job` in 3 attempt(s)")

    jobs = SlurmJobs(HostPaths(str(tmp_path)), broken)
    with pytest.raises(SlurmLookupError, match="scontrol listpids: slurmctld did not answer"):
        jobs.jobs("nh1")


def test_jobs_asks_for_at_most_max_jobs(tmp_path):
    listing = "PID JOBID STEPID LOCALID GLOBALID\n" + "".join(f"{100 + i} {i} batch 0 0\n" for i in range(10))
    asked = []

    def run(*args: str) -> str:
        if args[0] == "listpids":
            return listing
        asked.append(args[-1])
        return record(f"Nodes=nh1 GRES=gpu:1(IDX:{args[-1]})", head=f"JobId={args[-1]}\n   UserId=u(1)")

    jobs = SlurmJobs(HostPaths(str(tmp_path)), run, max_jobs=3).jobs("nh1")
    assert asked == ["0", "1", "2"] and [j.job_id for j in jobs] == ["0", "1", "2"]


# -- the drain reason ------------------------------------------------------------------------------------

def hit(*jobs: str, device: str = "0000:5d:00.0") -> Finding:
    return Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "GPU logged Xid 79.", device=device,
                   evidence={"slurm_jobs": [{"job_id": j, "user": "alice", "via": ["gres"]} for j in jobs]})


def test_the_drain_reason_names_the_jobs_within_its_limit():
    assert drain_reason(hit("42"), 120) == "nodehealth: Xid79FallenOffBus 0000:5d:00.0 job 42"
    assert drain_reason(hit("41", "42"), 120) == "nodehealth: Xid79FallenOffBus 0000:5d:00.0 jobs 41,42"
    assert drain_reason(hit(), 120) == "nodehealth: Xid79FallenOffBus 0000:5d:00.0"
    # Too long for the jobs: the finding is kept whole, never a job id cut in two.
    assert drain_reason(hit("42"), 45) == "nodehealth: Xid79FallenOffBus 0000:5d:00.0"
    assert drain_reason(hit("123456789"), 50) == "nodehealth: Xid79FallenOffBus 0000:5d:00.0"


class Ctl:
    """scontrol's three calls as the drainer makes them, on a node whose reason it keeps."""

    def __init__(self) -> None:
        self.state, self.calls = NodeState("IDLE", ""), []

    def node(self, name: str) -> NodeState:
        self.calls.append("show")
        return self.state

    def drain(self, name: str, reason: str) -> None:
        self.calls.append(f"drain {reason}")
        self.state = NodeState("IDLE+DRAIN", reason)

    def resume(self, name: str) -> None:
        self.calls.append("resume")
        self.state = NodeState("IDLE", "")


def unhealthy(f: Finding) -> Report:
    return Report("nh1", Status.UNHEALTHY, [f], [])


def test_a_drain_gains_its_job_once_and_keeps_it_when_the_job_ends():
    ctl = Ctl()
    act(unhealthy(hit()), "nh1", ctl, 120)  # drained from the kernel stream, before the pass named the job
    act(unhealthy(hit("42")), "nh1", ctl, 120)
    act(unhealthy(hit()), "nh1", ctl, 120)  # the job ended
    act(unhealthy(hit("43")), "nh1", ctl, 120)  # someone else holds the GPU now: the hit job stays named
    assert [c for c in ctl.calls if c != "show"] == ["drain nodehealth: Xid79FallenOffBus 0000:5d:00.0",
                                                     "drain nodehealth: Xid79FallenOffBus 0000:5d:00.0 job 42"]
    act(unhealthy(hit("42", device="0000:18:00.0")), "nh1", ctl, 120)  # another finding: drained anew
    assert ctl.calls[-1] == "drain nodehealth: Xid79FallenOffBus 0000:18:00.0 job 42"


def test_the_daemon_s_drainer_runs_no_scontrol_when_only_the_jobs_change():
    ctl = Ctl()
    drainer = Drainer("nh1", {"reason_max_chars": 120, "resync_seconds": 300.0, "retry_delay_seconds": 1.0,
                              "attempts": 1}, ctl=ctl)
    drainer.publish(unhealthy(hit("42")))
    drainer.sync_once(drainer._report)
    calls = len(ctl.calls)
    for jobs in ((), ("43",), ("42",)):
        drainer.publish(unhealthy(hit(*jobs)))
        assert drainer._due > time.monotonic(), jobs  # the thread sleeps until the resync
    drainer.publish(unhealthy(hit("42", device="0000:18:00.0")))
    assert drainer._due == 0.0
    assert len(ctl.calls) == calls


# -- a real slurmctld and slurmd with two GRES GPUs ----------------------------------------------------

@pytest.fixture(scope="module")
def gres_cluster(tmp_path_factory):
    """The tests' one-node cluster, its node with eight GPUs as GRES, as many as nvml-h100-xid79-lost has."""
    yield from running(lambda: SlurmCluster(str(tmp_path_factory.mktemp("slurm-gres")), gres_gpus=8))


def test_jobs_and_their_gpus_from_a_real_slurmctld(gres_cluster, tmp_path):
    c = gres_cluster

    def submit() -> str:
        done = subprocess.run(["sbatch", "--parsable", "--gres=gpu:1", "--wrap", "sleep 300", "-o", "/dev/null"],
                              env=c.env, capture_output=True, text=True, cwd=str(tmp_path), timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def run(*args: str) -> str:
        done = c.scontrol(*args)
        if done.returncode:
            raise RuntimeError(done.stderr.strip())
        return done.stdout

    ids = [submit(), submit()]
    try:
        c.wait_for(lambda: all("JobState=RUNNING" in c.scontrol("show", "job", i).stdout for i in ids),
                   "both jobs to run", 60)
        c.wait_for(lambda: set(SlurmJobs(HostPaths("/"), run).local_pids().values()) == set(ids),
                   "slurmd to list both jobs' pids", 30)  # a reader asks listpids once: a new one each time
        reader = SlurmJobs(HostPaths("/"), run)
        jobs = reader.jobs(NODE)
        assert sorted(j.job_id for j in jobs) == sorted(ids)
        assert sorted(g for j in jobs for g in j.gpus) == [0, 1] and all(len(j.gpus) == 1 for j in jobs)
        assert {j.user for j in jobs} == {"root"}
        gpus = [GpuRef(0, "GPU-a", "0000:cb:00.0"), GpuRef(1, "GPU-b", "0000:18:00.0")]
        on_slurm_gpu_0 = next(j.job_id for j in jobs if j.gpus == (0,))
        assert [j.job_id for j in assign_jobs(jobs, gpus).by_gpu[1]] == [on_slurm_gpu_0]

        # The whole round as the daemon will run it: an Xid on NVML's GPU 1 (Slurm's GPU 0) with the pid of
        # one job's batch script, then of the other's. No job cgroup under proctrack/linuxproc: listpids
        # names the pid's job.
        facts = NvmlFacts("fake:slurm", "565.57.01", "12.7", 2, (
            Gpu(0, uuid="GPU-a", pci_bus_id="0000:cb:00.0"), Gpu(1, uuid="GPU-b", pci_bus_id="0000:18:00.0")))
        pids = {job: pid for pid, job in sorted(reader.local_pids().items())}
        assert sorted(pids) == sorted(ids)
        for job, pid in pids.items():
            assert reader.job_of_pid(pid, at=time.time()) == job
            now = time.time()
            xid = Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "GPU 0000:18:00.0 logged Xid 79.",
                          device="0000:18:00.0", evidence={"code": 79, "pids": [pid]}, first_seen=now, last_seen=now)
            a = Attributor({"enabled": True, "sources": ["slurm"]}, HostPaths("/"), NODE, scontrol=run)
            [out] = a.annotate([xid], facts, now)
            named = {j["job_id"]: j for j in out.evidence["slurm_jobs"]}
            if job == on_slurm_gpu_0:  # the Xid's process is in the job that holds the GPU
                assert named == {job: {"job_id": job, "user": "root", "via": ["gres", "pid"]}}
                assert drain_detail(out) == f"job {job}"
            else:  # the process is the other job's: both are named, each with how it was found
                assert named == {on_slurm_gpu_0: {"job_id": on_slurm_gpu_0, "user": "root", "via": ["gres"]},
                                 job: {"job_id": job, "user": None, "via": ["pid"]}}
                assert drain_detail(out) == f"jobs {','.join(sorted(named, key=int))}"
    finally:
        subprocess.run(["scancel", *ids], env=c.env, timeout=30)


def test_the_daemon_drains_with_the_job_that_held_the_lost_gpu(gres_cluster, tmp_path):
    """`daemon --slurm` with Slurm attribution on nvml-h100-xid79-lost, whose GPU 3 (0000:5d:00.0, the fourth
    by bus id: Slurm's GPU 3) fell off the bus, while a job holds Slurm's GPUs 0-3."""
    c = gres_cluster
    done = subprocess.run(["sbatch", "--parsable", "--gres=gpu:4", "--wrap", "sleep 300", "-o", "/dev/null"],
                          env=c.env, capture_output=True, text=True, cwd=str(tmp_path), timeout=30)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    cfg = tmp_path / "nodehealth.json"
    cfg.write_text(json.dumps({"attribution": {"enabled": True, "sources": ["slurm"]},
                               "slurm": {"attempts": 2, "retry_delay_seconds": 0.3}}))
    d = None
    try:
        c.wait_for(lambda: "JobState=RUNNING" in c.scontrol("show", "job", job).stdout, "the job to run", 60)
        c.wait_for(lambda: job in c.scontrol("listpids").stdout, "slurmd to list the job's pids", 30)
        d = DaemonProcess(machine("nvml-h100-xid79-lost"), str(tmp_path / "state"), "--slurm", "--node-name", NODE,
                          "--config", str(cfg), interval=0.5, env=c.env)
        d.wait_ready(30)
        want = f"nodehealth: GpuLost 0000:5d:00.0 job {job}"
        c.wait_for(lambda: c.node().get("Reason") == want, f"the drain reason {want!r}", 30)
        report = json.loads(d.get("/v1/report")[1])
        lost = [f for f in report["findings"] if f["device"] == "0000:5d:00.0"]
        assert lost and all(f["evidence"]["slurm_jobs"] == [{"job_id": job, "user": "root", "via": ["gres"]}]
                            for f in lost)
    finally:
        if d is not None:
            d.stop()
        subprocess.run(["scancel", job], env=c.env, timeout=30)
        c.scontrol("update", f"NodeName={NODE}", "State=RESUME")


# -- any text in, facts out: never an exception -------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("JobId=UserId()Nodes=GRES_IDX:gpu:a100,-[]0123456789 nh\n/job_"),
               max_size=300))
def test_the_parsers_take_any_text(text):
    for job in parse_jobs(text, "nh1"):
        assert job.job_id.isdigit() and all(0 <= g <= 1023 for g in job.gpus)
    assert all(isinstance(p, int) and j.isdigit() for p, j in parse_listpids(text).items())
    job = job_of_cgroup(text)
    assert job is None or job.isdigit()
    assert in_hostlist("nh1", text) in (True, False)


def test_attribution_asks_an_unreachable_slurmctld_once_per_lookup_not_with_the_drains_retries(tmp_path):
    """The drain retries an unreachable slurmctld (slurm.attempts, 3, with 2 s between); attribution is
    decoration inside a pass and must not hold it that long: one try, then AttributionUnavailable."""
    from nodehealth import config, node_pass

    calls = tmp_path / "calls"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                        "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2\n"
                        "exit 1\n")
    scontrol.chmod(0o755)
    cfg = config.defaults()
    cfg["attribution"].update(enabled=True, sources=["slurm"])
    cfg["slurm"].update(scontrol=str(scontrol), node_name="gpu-1")
    a = node_pass.attributor(cfg, HostPaths("/"))
    xid = Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "m", device="0000:1b:00.0",
                  evidence={"pids": [os.getpid()]}, last_seen=time.time())
    facts = NvmlFacts("fake:slurm", "565.57.01", "12.7", 1, (Gpu(0, uuid="GPU-a", pci_bus_id="0000:1b:00.0"),))
    started = time.monotonic()
    out = a.annotate([xid], facts, time.time())
    assert time.monotonic() - started < cfg["slurm"]["retry_delay_seconds"]  # no retry's wait
    assert calls.read_text().splitlines() == ["listpids"]
    assert [f.reason for f in out if f.check != "xid"] == ["AttributionUnavailable"]
