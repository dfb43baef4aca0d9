"""Silences: a known finding is still found and shown, but counts in no verdict, taint, drain or alert;
it ends by itself, a fatal one needs --allow-fatal, and every one is logged and counted."""
from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import threading
import time

import pytest
from conftest import machine
from test_kube_daemon import wait_until

from nodehealth import config, exporter, node_pass
from nodehealth.daemon import Daemon
from nodehealth.kube.taints import desired_state
from nodehealth.model import Finding, Report, Severity, Status, verdict
from nodehealth.silences import silence, store
from nodehealth.silences.silence import Silence, apply, parse_list
from nodehealth.slurm.drainer import drain_reason, worst_finding

LOST = machine("nvml-h100-xid79-lost")  # GpuLost and Xid79FallenOffBus, both fatal, on GPU 0000:5d:00.0
GPU = "0000:5d:00.0"
NOW = 1_800_000_000.0
DAY = 86400.0
LIMITS = config.defaults()["silences"]


def finding(reason: str = "PortRateDegraded", device: str = "mlx5_0:1", severity=Severity.DEGRADED,
            check: str = "infiniband") -> Finding:
    return Finding(check, severity, reason, f"{reason} on {device}", device=device)


def rule(reason: str = "PortRateDegraded", device: str = "", expires: float = NOW + DAY, **kw) -> Silence:
    return silence.parse({"reason": reason, "device": device, "expires": expires, "comment": "RMA 1234", **kw},
                         "file")


def nodehealth(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nodehealth.cli", *argv], capture_output=True, text=True,
                          timeout=60)


# -- what a silence covers ------------------------------------------------------------------------

def test_a_silence_covers_its_reason_on_its_device_until_it_ends():
    port0, port1 = finding(device="mlx5_0:1"), finding(device="mlx5_1:1")
    other = finding("PortDown", "mlx5_0:1")
    one = rule(device="mlx5_0:1")
    out, refused = apply([port0, port1, other], [one], NOW)
    assert [f.silenced is not None for f in out] == [True, False, False] and refused == []
    assert out[0].silenced == {"id": one.id, "source": "file", "until": "2027-01-16T08:00:00Z", "by": "",
                               "comment": "RMA 1234"}
    assert out[0] == port0  # the same finding (its identity), only marked
    every = rule()  # no device: every device
    assert [f.silenced is not None for f in apply([port0, port1, other], [every], NOW)[0]] == [True, True, False]
    assert all(f.silenced is None for f in apply([port0, port1], [every], NOW + DAY)[0])  # it ended by itself


def test_a_fatal_finding_is_silenced_only_with_allow_fatal():
    lost = finding("GpuLost", GPU, Severity.FATAL, "gpu_driver")
    out, refused = apply([lost], [rule("GpuLost", GPU)], NOW)
    assert out[0].silenced is None and [(s.reason, f.reason) for s, f in refused] == [("GpuLost", "GpuLost")]
    out, refused = apply([lost], [rule("GpuLost", GPU, allow_fatal=True)], NOW)
    assert out[0].silenced is not None and refused == []


@pytest.mark.parametrize("entry, why", [
    ({"reason": "GpuLost"}, "no expires"),
    ({"reason": "Gpu Lost; rm -rf /", "expires": NOW + 60}, "not a reason code"),
    ({"reason": "GpuLost", "expires": "tomorrow"}, "not an RFC 3339 time"),
    ({"reason": "GpuLost", "expires": "2027-01-01T00:00:00"}, "without a time zone"),
    ({"reason": "GpuLost", "expires": True}, "not a time"),
    ({"reason": "GpuLost", "expires": NOW + 60, "comment": "a\nb"}, "control characters"),
    ({"reason": "GpuLost", "expires": NOW + 60, "comment": "x" * 501}, "longer than 500"),
    ({"reason": "GpuLost", "expires": NOW + 60, "device": ["0"]}, "not text"),
    ({"reason": "GpuLost", "expires": NOW + 60, "allow_fatal": "yes"}, "not true or false"),
    ({"reason": "GpuLost", "expires": NOW + 60, "id": "../../x"}, "lower-case letters"),
    ({"reason": "GpuLost", "expires": NOW + 60, "matchers": {}}, "unknown field"),
    ({"reason": "GpuLost", "expires": NOW + 40 * DAY}, "more than silences.max_seconds"),
    ("[", "not JSON"),
    ({"reason": "GpuLost", "expires": NOW + 60, "id": "a"}, None),
])
def test_each_bad_silence_is_refused_with_why_and_the_good_ones_kept(entry, why):
    good = {"reason": "PortDown", "expires": "2027-01-01T00:00:00Z", "id": "a"}
    text = entry if isinstance(entry, str) else json.dumps([good, entry])
    kept, problems = parse_list(text, "annotation", 64, NOW, LIMITS["max_seconds"])
    if why is None:  # a second one with the same id
        assert [s.id for s in kept] == ["a"] and problems == ["annotation[1]: a second silence with id a"]
        return
    assert len(problems) == 1 and why in problems[0], problems
    assert [s.reason for s in kept] == ([] if why == "not JSON" else ["PortDown"])


def test_more_silences_than_the_limit_keep_the_first_and_say_so():
    many = [{"reason": "PortDown", "device": f"mlx5_{i}:1", "expires": NOW + 60} for i in range(5)]
    kept, problems = parse_list(json.dumps(many), "file", 3, NOW, LIMITS["max_seconds"])
    assert [s.device for s in kept] == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1"]
    assert problems == ["file: 5 silences, more than silences.max_silences (3); the first 3 are used"]


def test_a_silenced_finding_counts_in_no_verdict_taint_or_drain_and_is_exported_apart():
    lost = finding("GpuLost", GPU, Severity.FATAL, "gpu_driver")
    slow = finding()
    findings, _ = apply([lost, slow], [rule("GpuLost", GPU, allow_fatal=True)], NOW)
    assert verdict(findings) is Status.UNHEALTHY  # the degraded port still counts
    report = Report("gpu-1", verdict(findings), findings, [])
    assert drain_reason(worst_finding(report), 120) == "nodehealth: PortRateDegraded mlx5_0:1"
    # (not the silenced GpuLost)
    state = desired_state(report, config.defaults()["kube"])
    assert state["gpu"].status == "False" and state["gpu"].effect is None
    assert state["network"].effect == "PreferNoSchedule"
    text = exporter.render(exporter.core_metrics(report)).decode()
    assert ('nodehealth_finding_silenced{check="gpu_driver",severity="fatal",reason="GpuLost",'
            'device="0000:5d:00.0"} 1') in text
    assert 'nodehealth_finding{check="infiniband",severity="degraded",reason="PortRateDegraded",' in text
    assert 'reason="GpuLost"' not in "\n".join(line for line in text.splitlines()
                                               if line.startswith("nodehealth_finding{"))
    assert 'nodehealth_findings{severity="fatal"} 0' in text
    only_silenced = [f for f in findings if f.silenced]
    assert verdict(only_silenced) is Status.HEALTHY


# -- the command and the file ---------------------------------------------------------------------

def test_silence_add_list_remove_in_the_state_dir(tmp_path):
    state = str(tmp_path / "state")
    done = nodehealth("silence", "add", "--reason", "GpuLost", "--device", GPU, "--for", "48h", "--comment",
                      "RMA 1234", "--allow-fatal", "--state-dir", state)
    assert done.returncode == 0, done.stderr
    assert "GpuLost on 0000:5d:00.0 until" in done.stdout
    assert stat.S_IMODE(os.stat(store.path(state)).st_mode) == 0o600
    done = nodehealth("silence", "add", "--reason", "PortDown", "--for", "90m", "--comment", "cable",
                      "--state-dir", state)
    assert done.returncode == 0 and "(a fatal finding stays loud without --allow-fatal)" in done.stdout
    listed = json.loads(nodehealth("silence", "list", "--json", "--state-dir", state).stdout)
    assert [(s["reason"], s["device"], s.get("allow_fatal", False), s["in_force"]) for s in listed] == [
        ("GpuLost", GPU, True, True), ("PortDown", "", False, True)]
    assert 47 * 3600 < listed[0]["expires"] - time.time() <= 48 * 3600
    assert listed[0]["by"] and listed[0]["comment"] == "RMA 1234"
    done = nodehealth("silence", "remove", listed[0]["id"], "--state-dir", state)
    assert done.returncode == 0, done.stderr
    assert "PortDown" in nodehealth("silence", "list", "--state-dir", state).stdout
    assert "GpuLost" not in nodehealth("silence", "list", "--state-dir", state).stdout
    done = nodehealth("silence", "remove", "nosuch", "--state-dir", state)
    assert done.returncode == 2 and "no silence nosuch" in done.stderr


@pytest.mark.parametrize("argv, said", [
    (("--for", "31d"), "at most silences.max_seconds"),
    (("--for", "0h"), "more than 0 seconds"),
    (("--for", "soon"), "not a duration"),
])
def test_add_refuses_what_would_never_end(tmp_path, argv, said):
    done = nodehealth("silence", "add", "--reason", "GpuLost", "--comment", "x", "--state-dir", str(tmp_path), *argv)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert not os.path.exists(store.path(str(tmp_path)))


def test_an_unreadable_silences_file_is_never_overwritten_and_silences_nothing(tmp_path):
    path = tmp_path / store.FILE
    path.write_text('{"version": 1, "silences": [')
    done = nodehealth("silence", "add", "--reason", "GpuLost", "--for", "1h", "--comment", "x",
                      "--state-dir", str(tmp_path))
    assert done.returncode == 2 and "is not JSON" in done.stderr and len(done.stderr.splitlines()) == 1
    assert path.read_text() == '{"version": 1, "silences": ['
    assert store.load(str(tmp_path), 64, NOW, DAY) == ([], [f"{path} is not JSON"])
    os.unlink(path)
    os.mkfifo(path)  # a FIFO in its place is refused, never waited on
    assert "cannot read" in store.load(str(tmp_path), 64, NOW, DAY)[1][0]


def test_two_commands_adding_at_once_lose_nothing(tmp_path):
    def add(i: int) -> None:
        store.change(str(tmp_path), lambda entries: [*entries, rule(device=f"mlx5_{i}:1").to_dict()])

    threads = [threading.Thread(target=add, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept, problems = store.load(str(tmp_path), 64, NOW, LIMITS["max_seconds"])
    assert problems == [] and sorted(s.device for s in kept) == sorted(f"mlx5_{i}:1" for i in range(16))


def test_check_honours_the_state_dirs_silences(tmp_path):
    state = str(tmp_path)
    for reason in ("GpuLost", "Xid79FallenOffBus"):
        assert nodehealth("silence", "add", "--reason", reason, "--device", GPU, "--for", "1h", "--comment", "RMA 7",
                          *(("--allow-fatal",) if reason == "GpuLost" else ()), "--state-dir", state).returncode == 0
    done = nodehealth("check", "--root", LOST, "--state-dir", state, "--json")
    assert done.returncode == 1, done.stdout  # Xid79FallenOffBus is fatal and its silence does not allow it
    report = json.loads(done.stdout)
    assert {f["reason"]: "silenced" in f for f in report["findings"]} == {"GpuLost": True,
                                                                        "Xid79FallenOffBus": False}
    assert nodehealth("silence", "add", "--reason", "Xid79FallenOffBus", "--for", "1h", "--comment", "RMA 7",
                      "--allow-fatal", "--state-dir", state).returncode == 0
    done = nodehealth("check", "--root", LOST, "--state-dir", state)
    assert done.returncode == 0 and "HEALTHY" in done.stdout and "fatal (silenced)" in done.stdout, done.stdout
    assert "[silenced until" in done.stdout and "RMA 7]" in done.stdout


# -- the daemon ------------------------------------------------------------------------------------

def metric(text: str, line_start: str) -> str | None:
    return next((line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(line_start + " ")), None)


def test_the_daemon_applies_silences_at_its_next_pass_logs_counts_and_lets_them_end(tmp_path, caplog):
    caplog.set_level(logging.INFO, "nodehealth")
    cfg = config.load(None)
    cfg["daemon"]["state_dir"] = state = str(tmp_path / "state")
    d = Daemon(node_pass.build_engine(cfg, LOST), cfg, "gpu-a")
    d.load_state()
    d.run_pass()
    assert d.report.status is Status.UNHEALTHY
    for reason in ("GpuLost", "Xid79FallenOffBus"):
        assert nodehealth("silence", "add", "--reason", reason, "--device", GPU, "--for", "2h", "--comment",
                          "RMA 9", "--allow-fatal", "--state-dir", state).returncode == 0
    d.run_pass()
    assert d.report.status is Status.HEALTHY and d.shown is d.report
    assert all(f.silenced and f.silenced["comment"] == "RMA 9" for f in d.report.findings)
    text = exporter.render(d.metrics()).decode()
    assert metric(text, 'nodehealth_silences_active{source="file"}') == "2"
    assert metric(text, 'nodehealth_silences_started_total{source="file"}') == "2"
    assert metric(text, "nodehealth_health_status") == "0"
    assert metric(text, 'nodehealth_finding_silenced{check="gpu_driver",severity="fatal",reason="GpuLost",'
                        'device="0000:5d:00.0"}') == "1"
    said = [r.getMessage() for r in caplog.records if r.name == "nodehealth.silences"]
    assert len([m for m in said if m.endswith(": in force")]) == 2 and "RMA 9" in said[0], said
    assert "by " in said[0] and "fatal included" in said[0]
    d.run_pass()  # nothing new: nothing logged again, nothing counted again
    assert len([r for r in caplog.records if r.name == "nodehealth.silences"]) == 2
    d.silences.clock = lambda: time.time() + 3 * 3600  # two hours later, and some
    d.run_pass()
    assert d.report.status is Status.UNHEALTHY and not any(f.silenced for f in d.report.findings)
    ended = [r.getMessage() for r in caplog.records if "ended" in r.getMessage()]
    assert len(ended) == 2 and all("ended: expired" in m for m in ended)
    text = exporter.render(d.metrics()).decode()
    assert metric(text, 'nodehealth_silences_active{source="file"}') == "0"
    assert metric(text, 'nodehealth_silences_started_total{source="file"}') == "2"


def test_a_silence_that_does_not_allow_a_fatal_finding_is_said_once(tmp_path, caplog):
    caplog.set_level(logging.INFO, "nodehealth")
    cfg = config.load(None)
    cfg["daemon"]["state_dir"] = state = str(tmp_path / "state")
    assert nodehealth("silence", "add", "--reason", "GpuLost", "--for", "2h", "--comment", "x",
                      "--state-dir", state).returncode == 0
    d = Daemon(node_pass.build_engine(cfg, LOST), cfg, "gpu-a")
    for _ in range(3):
        d.run_pass()
    assert d.report.status is Status.UNHEALTHY
    loud = [r.getMessage() for r in caplog.records if "stays loud" in r.getMessage()]
    assert len(loud) == 1 and "GpuLost on 0000:5d:00.0, which is fatal" in loud[0]


def test_a_broken_silences_file_is_said_once_counted_and_silences_nothing(tmp_path, caplog):
    cfg = config.load(None)
    cfg["daemon"]["state_dir"] = state = str(tmp_path / "state")
    os.makedirs(state)
    with open(store.path(state), "w") as f:
        json.dump({"version": 1, "silences": [{"reason": "GpuLost", "expires": "never"}]}, f)
    d = Daemon(node_pass.build_engine(cfg, LOST), cfg, "gpu-a")
    d.run_pass()
    d.run_pass()
    assert d.report.status is Status.UNHEALTHY
    refused = [r for r in caplog.records if r.getMessage().startswith("silence refused")]
    assert len(refused) == 1 and refused[0].levelname == "ERROR" and "never" in refused[0].getMessage()
    assert metric(exporter.render(d.metrics()).decode(), 'nodehealth_silences_refused{source="file"}') == "1"


# -- on Kubernetes: the Node's annotation, read by its own agent -----------------------------------

def test_a_silence_annotation_lifts_the_taint_through_the_nodes_own_agent(tmp_path, daemon_factory):
    from fake_kube_apiserver import FakeApiServer

    server = FakeApiServer().start()
    try:
        server.add_node("gpu-7", labels={"nvidia.com/gpu.present": "true"})
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps({"kube": {"kubeconfig": server.kubeconfig(str(tmp_path / "kubeconfig")),
                                            "resync_seconds": 0.3, "retry_initial_seconds": 0.1,
                                            "retry_max_seconds": 0.5, "max_quarantined_fraction": 1.0}}))
        d = daemon_factory(LOST, str(tmp_path / "state"), "--kube", "--config", str(cfg), "--node-name", "gpu-7",
                           interval=0.5)
        d.wait_ready(30)

        def gpu_taint():
            return [t for t in server.node("gpu-7")["spec"].get("taints", []) if t["key"] == "nodehealth.io/gpu"]

        assert wait_until(gpu_taint)
        # The operator's command writes the annotation (the same CLI as on a host, with --kube NODE).
        for reason in ("GpuLost", "Xid79FallenOffBus"):
            done = nodehealth("silence", "add", "--kube", "gpu-7", "--config", str(cfg), "--reason", reason,
                              "--device", GPU, "--for", "48h", "--comment", "RMA 1234", "--allow-fatal")
            assert done.returncode == 0 and "Node gpu-7 annotation nodehealth.io/silences" in done.stdout, done.stderr
        assert wait_until(lambda: not gpu_taint(), 20), server.node("gpu-7")["spec"]
        conditions = {c["type"]: c for c in server.node("gpu-7")["status"]["conditions"]}
        assert conditions["NodeHealthGPUProblem"]["status"] == "False"
        report = json.loads(d.get("/v1/report")[1])
        assert report["status"] == "healthy"
        assert {f["silenced"]["source"] for f in report["findings"]} == {"annotation"}
        text = d.get("/metrics")[1].decode()
        assert metric(text, 'nodehealth_silences_active{source="annotation"}') == "2"

        listed = json.loads(nodehealth("silence", "list", "--json", "--kube", "gpu-7", "--config", str(cfg)).stdout)
        done = nodehealth("silence", "remove", listed[0]["id"], "--kube", "gpu-7", "--config", str(cfg))
        assert done.returncode == 0, done.stderr
        assert wait_until(gpu_taint, 20)  # one fatal finding is loud again: the node is quarantined again
        d.stop()
        assert "(annotation): GpuLost on 0000:5d:00.0 until" in d.output()
    finally:
        server.close()

