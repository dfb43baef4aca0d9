"""`nodehealth slurm` against a real slurmctld, slurmd and munged from Debian, started here on loopback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import DaemonProcess, machine, require_tool
from slurm_cluster import NODE, SlurmCluster, running

from nodehealth.model import Finding, Severity
from nodehealth.slurm.drainer import drain_reason
from nodehealth.slurm.scontrol import PREFIX, NodeState, SlurmError, parse_node

UNHEALTHY = machine("nvml-h100-xid79-lost")  # GPU 3 lost: GpuLost is its worst finding
HEALTHY = machine("plain-host")
WRAPPER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy", "slurm",
                       "nodehealth-slurm")


def test_drain_reason_is_one_bounded_printable_line():
    f = Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "msg", device="0000:cb:00.0")
    assert drain_reason(f, 120) == "nodehealth: Xid79FallenOffBus 0000:cb:00.0"
    hostile = Finding("mounts", Severity.FATAL, "MountHung", "msg",
                      device='/mnt/$(rm -rf /)\n"x";\tState=IDLE' + "é" * 300)
    reason = drain_reason(hostile, 60)
    assert reason.startswith(PREFIX) and len(reason) <= 60
    assert not set(reason) & set('$\n\t";=é'), reason


def test_parse_node_reads_state_and_strips_the_user_and_time():
    text = ("NodeName=nh1 Arch=x86_64 CoresPerSocket=1\n   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0\n"
            "   Reason=nodehealth: GpuLost 0000:5d:00.0 [root@2026-11-23T21:35:47]\n")
    node = parse_node(text)
    assert node == NodeState("IDLE+DRAIN", "nodehealth: GpuLost 0000:5d:00.0")
    assert node.drained and node.ours
    assert not parse_node("   State=MIXED ThreadsPerCore=1\n").drained
    assert not NodeState("DOWN+DRAIN", "admin: fan").ours
    with pytest.raises(SlurmError, match="no State"):
        parse_node("slurm_load_node error: something else")


def test_a_missing_slurm_conf_is_one_line_without_retries(tmp_path):
    require_tool("scontrol")
    cfg = tmp_path / "nodehealth.json"
    cfg.write_text(json.dumps({"slurm": {"timeout_seconds": 2, "attempts": 3, "retry_delay_seconds": 1}}))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "nodehealth.cli", "slurm", "--root", HEALTHY, "--node-name", NODE,
                           "--config", str(cfg), "--state-dir", str(tmp_path / "state")],
                          env=dict(os.environ, SLURM_CONF=str(tmp_path / "missing.conf")),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "missing.conf" in done.stderr, done.stderr
    assert time.monotonic() - started < 5  # scontrol itself would wait a minute; three tries would take 8 s


def test_an_scontrol_that_cannot_run_or_prints_garbage_never_ends_the_drainer(tmp_path):
    """Not executable is a clear SlurmError; bytes that are not UTF-8 are read, replaced; anything else
    that goes wrong is counted and retried: the drainer's thread lives on."""
    from nodehealth import config
    from nodehealth.model import Report, Status
    from nodehealth.slurm.drainer import Drainer
    from nodehealth.slurm.scontrol import Scontrol

    cfg = dict(config.defaults()["slurm"], attempts=1, retry_delay_seconds=0.0)
    unrunnable = tmp_path / "scontrol"
    unrunnable.write_text("#!/bin/sh\n")
    with pytest.raises(SlurmError, match="cannot run .*scontrol: Permission denied"):
        Scontrol(dict(cfg, scontrol=str(unrunnable))).run("show", "node", NODE)
    garbled = tmp_path / "garbled"
    garbled.write_bytes(b"#!/bin/sh\nprintf 'NodeName=x Reason=\\377\\376\\n'\n")
    garbled.chmod(0o755)
    assert "Reason=\ufffd\ufffd" in Scontrol(dict(cfg, scontrol=str(garbled))).run("show", "node", NODE)

    drainer = Drainer(NODE, dict(cfg, scontrol=str(garbled)))
    drainer.ctl.node = lambda name: 1 / 0  # a bug anywhere below the thread
    report = Report("h", Status.UNHEALTHY, [Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "msg")], [])
    drainer.sync_once(report)
    assert drainer.errors == 1 and drainer.outcome is None


def wrapper_settings(path, root: str, state: str, log: str, dry_run: bool = False) -> str:
    """A settings file for the shipped wrapper (its /etc/default/nodehealth-slurm); `root` may be shell."""
    nodehealth = os.path.join(os.path.dirname(sys.executable), "nodehealth")  # this venv's command
    assert os.access(nodehealth, os.X_OK), nodehealth
    path.write_text(f"NODEHEALTH={nodehealth}\n"
                    f"NODEHEALTH_ARGS=\"--root {root} --node-name {NODE} --state-dir {state}\"\n"
                    f"NODEHEALTH_LOG={log}\nNODEHEALTH_DRY_RUN={int(dry_run)}\n")
    return str(path)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    top = tmp_path_factory.mktemp("slurm")
    # The Prolog: the shipped wrapper, running `nodehealth slurm` on the machine named in prolog-root
    # (healthy unless a test says otherwise).
    (top / "prolog-root").write_text(HEALTHY)
    settings = wrapper_settings(top / "defaults", f"$(cat {top / 'prolog-root'})", str(top / "prolog-state"),
                                str(top / "prolog.log"))
    prolog = top / "prolog"
    prolog.write_text(f"#!/bin/sh\nexport NODEHEALTH_SLURM_DEFAULTS={settings}\nexec {WRAPPER}\n")
    prolog.chmod(0o755)
    yield from running(lambda: SlurmCluster(str(top), prolog=str(prolog)))


@pytest.fixture
def node(cluster, tmp_path):
    """The cluster with its node idle and undrained at the start of each test."""
    if "slurmctld" not in cluster.procs:
        cluster.start_controller()
    # A restarted slurmctld knows the node again only when slurmd answers its next ping.
    cluster.wait_for(lambda: not {"UNKNOWN", "NOT_RESPONDING"} & set(cluster.state().split("+")), "slurmd to answer")
    if "DRAIN" in cluster.state():
        done = cluster.scontrol("update", f"NodeName={NODE}", "State=RESUME")
        assert done.returncode == 0, (done.stderr, cluster.scontrol("show", "node", NODE).stdout)
    cluster.wait_state("IDLE")  # a resumed node is NOT_RESPONDING until slurmctld's next ping
    return cluster


def run_slurm(cluster, root, tmp_path, config=None, wait=True, extra=()):
    cmd = [sys.executable, "-m", "nodehealth.cli", "slurm", "--root", root, "--node-name", NODE,
           "--state-dir", str(tmp_path / "state"), *extra]
    if config is not None:
        path = tmp_path / "nodehealth.json"
        path.write_text(json.dumps({"slurm": config}))
        cmd += ["--config", str(path)]
    p = subprocess.Popen(cmd, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return p
    out, err = p.communicate(timeout=120)
    return p.returncode, out, err


def test_unhealthy_node_is_drained_with_the_finding_then_resumed_once_healthy(node, tmp_path):
    code, out, err = run_slurm(node, UNHEALTHY, tmp_path)
    assert code == 1, out + err
    state = node.node()
    assert "DRAIN" in state["State"].split("+")
    assert state["Reason"] == "nodehealth: GpuLost 0000:5d:00.0"
    assert "drained: nodehealth: GpuLost" in out

    code, out, err = run_slurm(node, UNHEALTHY, tmp_path)  # a second pass leaves its own drain as it is
    assert code == 1 and "already drained" in out, out + err

    # Another fault on a node nodehealth drained: the reason follows the worst finding now.
    code, out, err = run_slurm(node, machine("fragmented"), tmp_path)
    assert code == 1, out + err
    assert node.node()["Reason"] == "nodehealth: HugeBlocksExhausted Normal zone of node 0"
    code, out, err = run_slurm(node, UNHEALTHY, tmp_path)
    assert code == 1 and node.node()["Reason"] == "nodehealth: GpuLost 0000:5d:00.0", out + err

    # A pass that cannot judge (plain-host has no InfiniBand) leaves the drain as it is.
    code, out, err = run_slurm(node, HEALTHY, tmp_path, extra=("--only", "infiniband"))
    assert code == 2, out + err
    assert node.node()["Reason"] == "nodehealth: GpuLost 0000:5d:00.0"

    code, out, err = run_slurm(node, HEALTHY, tmp_path)
    assert code == 0, out + err
    assert "DRAIN" not in node.state().split("+"), node.node()
    assert "resumed" in out


def test_an_admins_drain_is_left_alone(node, tmp_path):
    admin = "maintenance: fan tray 2"
    assert node.scontrol("update", f"NodeName={NODE}", "State=DRAIN", f"Reason={admin}").returncode == 0
    code, out, err = run_slurm(node, HEALTHY, tmp_path)
    assert code == 0, out + err
    assert node.node()["Reason"] == admin and "DRAIN" in node.state().split("+")
    code, out, err = run_slurm(node, UNHEALTHY, tmp_path)  # unhealthy too: the admin's reason stays
    assert code == 1, out + err
    assert node.node()["Reason"] == admin and "DRAIN" in node.state().split("+")
    assert "drained by someone else" in out


def test_a_node_slurm_does_not_know_is_one_clear_line_without_retries(node, tmp_path):
    cmd = [sys.executable, "-m", "nodehealth.cli", "slurm", "--root", HEALTHY, "--node-name", "no-such-node",
           "--state-dir", str(tmp_path / "state")]
    done = subprocess.run(cmd, env=node.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "slurmctld refused `scontrol show node no-such-node`" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_slurmctld_down_is_one_clear_line_then_retried(node, tmp_path):
    node.stop_controller()
    started = time.monotonic()
    code, out, err = run_slurm(node, UNHEALTHY, tmp_path, {"attempts": 2, "retry_delay_seconds": 0.2})
    assert code == 3, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "unhealthy, but slurmctld did not answer `scontrol show node` in 2 attempt(s)" in lines[0]
    assert "Unable to contact slurm controller" in lines[0]
    assert time.monotonic() - started < 60

    # The controller comes back while nodehealth is retrying: the drain goes through.
    p = run_slurm(node, UNHEALTHY, tmp_path, {"attempts": 30, "retry_delay_seconds": 0.5}, wait=False)
    time.sleep(1)
    node.start_controller()
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1, out + err
    assert node.node()["Reason"] == "nodehealth: GpuLost 0000:5d:00.0"


def job(cluster, job_id: str) -> str:
    out = cluster.scontrol("show", "job", job_id).stdout
    return " ".join(t for t in out.split() if t.startswith(("JobState=", "Reason=")))


def wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def test_as_prolog_a_job_runs_on_a_healthy_node_and_is_requeued_from_an_unhealthy_one(node, tmp_path):
    top = os.path.dirname(node.conf)

    def submit() -> str:
        done = subprocess.run(["sbatch", "--parsable", "--wrap", "true", "-o", "/dev/null"], env=node.env,
                              capture_output=True, text=True, cwd=str(tmp_path), timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    ok = submit()
    wait_for(lambda: "JobState=COMPLETED" in job(node, ok), f"job {ok} to complete: {job(node, ok)}")

    with open(os.path.join(top, "prolog-root"), "w") as f:
        f.write(UNHEALTHY)
    try:
        bad = submit()
        wait_for(lambda: "DRAIN" in node.state().split("+"), "the Prolog to drain the node")
        # Slurm keeps nodehealth's reason, so the next healthy pass resumes the node.
        assert node.node()["Reason"] == "nodehealth: GpuLost 0000:5d:00.0"
        wait_for(lambda: "JobState=PENDING" in job(node, bad), f"job {bad} to be requeued: {job(node, bad)}")
        assert "launch_failed_requeued_held" in job(node, bad)
        subprocess.run(["scancel", bad], env=node.env, timeout=30)
        with open(os.path.join(top, "prolog.log")) as f:  # the wrapper's log: a line per run, with its context
            assert "prolog_slurmd: nodehealth: nh1: drained: nodehealth: GpuLost 0000:5d:00.0" in f.read()
    finally:
        with open(os.path.join(top, "prolog-root"), "w") as f:
            f.write(HEALTHY)


DRAIN_COMMAND = f"scontrol update NodeName={NODE} State=DRAIN 'Reason=nodehealth: GpuLost 0000:5d:00.0'"


def test_a_dry_run_logs_the_scontrol_it_would_run_and_changes_nothing(node, tmp_path, monkeypatch):
    code, out, err = run_slurm(node, UNHEALTHY, tmp_path, extra=("--dry-run",))
    assert code == 0, out + err  # as a Prolog, a non-zero exit would make Slurm drain the node itself
    assert f"nh1: unhealthy; dry-run: would run {DRAIN_COMMAND}" in out
    assert "DRAIN" not in node.state().split("+")
    code, out, err = run_slurm(node, UNHEALTHY, tmp_path)  # now for real, then a healthy dry run
    assert code == 1 and node.node()["Reason"] == "nodehealth: GpuLost 0000:5d:00.0", out + err
    code, out, err = run_slurm(node, HEALTHY, tmp_path, config={"dry_run": True})  # the setting says it too
    assert code == 0 and f"healthy; dry-run: would run scontrol update NodeName={NODE} State=RESUME" in out, out
    assert "DRAIN" in node.state().split("+")

    # The daemon's face in dry-run: the same command logged, the node as it was.
    from nodehealth import config
    from nodehealth.model import Report, Status
    from nodehealth.slurm.drainer import Drainer

    assert node.scontrol("update", f"NodeName={NODE}", "State=RESUME").returncode == 0
    node.wait_state("IDLE")
    drainer = Drainer(NODE, dict(config.defaults()["slurm"], dry_run=True))
    lost = Finding("gpu_driver", Severity.FATAL, "GpuLost", "lost", device="0000:5d:00.0")
    monkeypatch.setenv("SLURM_CONF", node.conf)
    drainer.sync_once(Report(NODE, Status.UNHEALTHY, [lost], []))
    assert drainer.errors == 0 and drainer.outcome.line == f"{NODE}: unhealthy; dry-run: would run {DRAIN_COMMAND}"
    assert "DRAIN" not in node.state().split("+")


def test_the_shipped_wrapper_as_health_check_drains_logs_and_dry_runs(node, tmp_path):
    log = tmp_path / "nodehealth-slurm.log"

    def wrapper(dry_run: bool, log_path: str) -> subprocess.CompletedProcess:
        settings = wrapper_settings(tmp_path / "defaults", UNHEALTHY, str(tmp_path / "state"), log_path, dry_run)
        return subprocess.run([WRAPPER], env=dict(node.env, NODEHEALTH_SLURM_DEFAULTS=settings),
                              capture_output=True, text=True, timeout=120)

    done = wrapper(True, str(log))
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr
    assert f"health check: nodehealth: nh1: unhealthy; dry-run: would run {DRAIN_COMMAND}" in log.read_text()
    assert "DRAIN" not in node.state().split("+")
    done = wrapper(False, str(tmp_path / "no-such-dir" / "x.log"))  # a log it cannot write: stdout, same code
    assert done.returncode == 1 and "nh1: drained: nodehealth: GpuLost 0000:5d:00.0" in done.stdout, done.stderr
    assert node.node()["Reason"] == "nodehealth: GpuLost 0000:5d:00.0"


def test_a_silenced_fault_does_not_drain(node, tmp_path):
    state = str(tmp_path / "state")
    for reason in ("GpuLost", "Xid79FallenOffBus"):
        done = subprocess.run([sys.executable, "-m", "nodehealth.cli", "silence", "add", "--reason", reason,
                               "--for", "2h", "--comment", "RMA 1234", "--allow-fatal", "--state-dir", state],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    code, out, err = run_slurm(node, UNHEALTHY, tmp_path)
    assert code == 0 and "nh1: healthy" in out, out + err
    assert "DRAIN" not in node.state().split("+")


def slurm_metric(d: DaemonProcess, name: str) -> float | None:
    code, body = d.get("/metrics")
    assert code == 200
    for line in body.decode().splitlines():
        if line.split(" ")[0] == name:
            return float(line.split()[-1])
    return None


def test_the_daemon_drains_on_its_own_passes_and_resumes_only_its_own_drain(node, tmp_path):
    """`daemon --slurm`: drain on the verdict, not a scontrol per pass, a lifted drain put back at the resync,
    slurmctld down (counted, retried, /healthz still ok), resume once healthy, an admin's drain left alone."""
    calls = tmp_path / "calls"
    wrapper = tmp_path / "scontrol"  # the real scontrol, counting its calls
    wrapper.write_text(f"#!/bin/sh\necho \"$1\" >> {calls}\nexec {require_tool('scontrol')} \"$@\"\n")
    wrapper.chmod(0o755)
    cfg = tmp_path / "nodehealth.json"
    cfg.write_text(json.dumps({"slurm": {"scontrol": str(wrapper), "node_name": NODE, "resync_seconds": 4,
                                         "attempts": 2, "retry_delay_seconds": 0.3}}))

    def start(root: str) -> DaemonProcess:
        d = DaemonProcess(root, str(tmp_path / os.path.basename(root)), "--slurm", "--config", str(cfg),
                          interval=0.5, env=node.env)
        d.wait_ready(30)
        return d

    def reason() -> str:
        return node.node().get("Reason", "")

    d = start(UNHEALTHY)
    try:
        wait_for(lambda: reason() == "nodehealth: GpuLost 0000:5d:00.0", "the daemon to drain the node")
        wait_for(lambda: slurm_metric(d, "nodehealth_slurm_drained") == 1, "the drained metric")
        drained_at = len(calls.read_text().split())
        time.sleep(2.5)  # five passes with the same verdict: no scontrol call
        assert len(calls.read_text().split()) == drained_at, calls.read_text()

        # An admin lifts the drain while the GPU is still lost: the resync puts it back.
        assert node.scontrol("update", f"NodeName={NODE}", "State=RESUME").returncode == 0
        wait_for(lambda: "DRAIN" not in node.state().split("+"), "the admin's resume")
        wait_for(lambda: reason() == "nodehealth: GpuLost 0000:5d:00.0", "the resync to drain again", 20)
        assert slurm_metric(d, "nodehealth_slurm_errors_total") == 0
        last_sync = slurm_metric(d, "nodehealth_slurm_last_sync_timestamp_seconds")
        assert last_sync and abs(last_sync - time.time()) < 30

        # slurmctld goes away: errors are counted, the daemon stays ready, and acts once it is back.
        node.stop_controller()
        assert node.scontrol("show", "node", NODE).returncode != 0
        wait_for(lambda: (slurm_metric(d, "nodehealth_slurm_errors_total") or 0) >= 1, "a failed resync", 30)
        assert d.get("/healthz")[0] == 200
    finally:
        d.stop()
    node.start_controller()
    node.wait_for(lambda: not {"UNKNOWN", "NOT_RESPONDING"} & set(node.state().split("+")), "slurmd to answer")

    d = start(HEALTHY)
    try:
        wait_for(lambda: "DRAIN" not in node.state().split("+"), "the daemon to resume its own drain")
        wait_for(lambda: slurm_metric(d, "nodehealth_slurm_drained") == 0, "the drained metric to clear")
        admin = "maintenance: fan tray 2"
        assert node.scontrol("update", f"NodeName={NODE}", "State=DRAIN", f"Reason={admin}").returncode == 0
        wait_for(lambda: slurm_metric(d, "nodehealth_slurm_drained_by_other") == 1, "the resync to see the admin's "
                 "drain", 20)
        assert reason() == admin and "DRAIN" in node.state().split("+")
    finally:
        d.stop()
    assert "slurm: nh1: healthy, resumed (was: nodehealth: GpuLost 0000:5d:00.0)" in d.output()


def test_the_daemon_without_scontrol_is_one_clear_line(tmp_path):
    cfg = tmp_path / "nodehealth.json"
    cfg.write_text(json.dumps({"slurm": {"scontrol": str(tmp_path / "no-scontrol")}}))
    done = subprocess.run([sys.executable, "-m", "nodehealth.cli", "daemon", "--slurm", "--root", HEALTHY,
                           "--config", str(cfg), "--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--slurm:" in done.stderr and "no-scontrol not found" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
