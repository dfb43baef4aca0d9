"""One attribution round on a whole fixture machine (engine pass + NVML facts) against the fake kubelet."""
from __future__ import annotations

import json
import os
import re

import pytest
from conftest import machine
from fake_kubelet import FakeKubelet

from nodehealth import config, registry
from nodehealth.attribution.attributor import Attributor
from nodehealth.attribution.defaults import DEFAULTS, settings
from nodehealth.attribution.evidence import CHECK, UNAVAILABLE
from nodehealth.collectors import nvml
from nodehealth.config import ConfigError
from nodehealth.engine import Engine
from nodehealth.host import HostPaths
from nodehealth.model import Finding, Severity, Status, verdict

TRAINER = {"namespace": "research", "pod": "llm-pretrain-worker-3", "container": "trainer",
           "device": "GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14"}


@pytest.fixture(scope="module")
def xid79_pass():
    """nvml-h100-xid79-lost: GPU 3 (0000:5d:00.0) lost, with its Xid 79; the machine's own clock."""
    host = HostPaths(machine("nvml-h100-xid79-lost"))
    results, findings = Engine(registry.COLLECTORS, registry.CHECKS, host, config.defaults()).run()
    return host, results["nvml"].facts, findings, host.now()


def attributor(sock: str, **cfg) -> Attributor:
    return Attributor(dict(enabled=True, kubelet_socket=sock, **cfg), HostPaths("/nonexistent"), "gpu-1")


def gpu3(findings):
    return {f.reason: f for f in findings if f.device == "0000:5d:00.0"}


def test_the_lost_gpu_and_its_xid_name_the_pod_that_held_it(tmp_path, xid79_pass):
    host, facts, findings, now = xid79_pass
    sock = str(tmp_path / "kubelet.sock")
    with FakeKubelet(sock, "h100-xid79-lost.json") as kubelet:
        out = attributor(sock).annotate(findings, facts, now)
    assert kubelet.calls == ["List"]  # one round, one call, however many GPU findings
    assert set(gpu3(out)) == {"GpuLost", "Xid79FallenOffBus"}
    for f in gpu3(out).values():
        assert f.evidence["pods"] == [TRAINER], f.reason
        # GPU 3 answers GpuIsLost to every NVML call, its UUID too: the one UUID no other GPU has is its.
        assert f.evidence["pods_inferred"] is True
    assert not [f for f in out if f.check == CHECK]
    json.dumps([f.to_dict() for f in out])  # /v1/report and check --json carry it as it is


def test_no_gpu_finding_no_question(tmp_path):
    host = HostPaths(machine("nvml-h100-healthy"))
    results, findings = Engine(registry.COLLECTORS, registry.CHECKS, host, config.defaults()).run()
    sock = str(tmp_path / "kubelet.sock")
    with FakeKubelet(sock, "h100-xid79-lost.json") as kubelet:
        out = attributor(sock).annotate(findings, results["nvml"].facts, host.now())
    assert kubelet.calls == [] and out == findings


@pytest.mark.parametrize("scenario, cfg, why", [
    (None, {}, "kubelet.sock does not exist"),
    ("slow.json", {"kubelet_timeout_seconds": 0.5}, "did not answer PodResources List within 0.5 s"),
    ("garbage.json", {}, "sent no PodResources message"),
])
def test_no_answer_is_an_info_finding_and_the_verdict_stands(tmp_path, xid79_pass, scenario, cfg, why):
    host, facts, findings, now = xid79_pass
    sock = str(tmp_path / "kubelet.sock")
    kubelet = FakeKubelet(sock, scenario).start() if scenario else None
    try:
        out = attributor(sock, **cfg).annotate(findings, facts, now)
    finally:
        if kubelet:
            kubelet.stop()
    [note] = [f for f in out if f.check == CHECK]
    assert (note.severity, note.reason, note.device) == (Severity.INFO, UNAVAILABLE, "kubelet")
    assert why in note.message and "0000:5d:00.0" in note.message
    assert all("pods" not in f.evidence for f in gpu3(out).values())
    assert verdict(out) is verdict(findings) is Status.UNHEALTHY


def test_an_xid_keeps_its_pods_after_it_is_no_longer_fresh_but_a_restart_does_not_guess(tmp_path, xid79_pass):
    host, facts, findings, now = xid79_pass
    sock = str(tmp_path / "kubelet.sock")
    a = attributor(sock)
    with FakeKubelet(sock, "h100-xid79-lost.json"):
        a.annotate(findings, facts, now)
    with FakeKubelet(sock, "h100-time-sliced.json"):  # an hour on: someone else holds GPU 3 now
        later = gpu3(a.annotate(findings, facts, now + 3600))
        restarted = gpu3(attributor(sock).annotate(findings, facts, now + 3600))
    assert later["Xid79FallenOffBus"].evidence["pods"] == [TRAINER]  # who was using it when it happened
    assert [p["pod"] for p in later["GpuLost"].evidence["pods"]] == ["jupyter-bob", "jupyter-carol"]  # now
    assert "pods" not in restarted["Xid79FallenOffBus"].evidence  # too old to tell, and not remembered
    assert "pods" in restarted["GpuLost"].evidence


def test_a_bug_in_attribution_is_a_finding_not_a_failed_pass(tmp_path, xid79_pass, monkeypatch):
    host, facts, findings, now = xid79_pass
    sock = str(tmp_path / "kubelet.sock")
    monkeypatch.setattr("nodehealth.attribution.attributor.assign", lambda *a: 1 / 0)
    with FakeKubelet(sock, "h100-xid79-lost.json"):
        out = attributor(sock).annotate(findings, facts, now)
    assert out[:len(findings)] == findings
    [note] = out[len(findings):]
    assert note.severity is Severity.INFO and "ZeroDivisionError" in note.message


def test_metric_labels_ask_every_pass_and_export_gpu_pod_info(tmp_path):
    host = HostPaths(machine("nvml-h100-healthy"))
    results, findings = Engine(registry.COLLECTORS, registry.CHECKS, host, config.defaults()).run()
    sock = str(tmp_path / "kubelet.sock")
    off, on = attributor(sock), attributor(sock, metric_labels=True)
    with FakeKubelet(sock, "h100-xid79-lost.json") as kubelet:
        off.annotate(findings, results["nvml"].facts, host.now())
        on.annotate(findings, results["nvml"].facts, host.now())
    assert kubelet.calls == ["List"] and off.metrics() == []
    [metric] = on.metrics()
    assert {s[0][4] for s in metric.samples} == {"llm-pretrain-worker-3", "notebook-5c9d8", "triton-0"}


def test_slurm_needs_the_slurm_face():
    with pytest.raises(ValueError, match="attribution.sources has slurm, but no scontrol"):
        Attributor({"enabled": True, "sources": ["slurm"]}, HostPaths("/"), "gpu-1")


@pytest.mark.parametrize("cfg, message", [
    ({"sources": ["kubelet", "nvml"]}, "attribution.sources"),
    ({"kubelet_timeout_seconds": 0}, "attribution.kubelet_timeout_seconds: 0 is not a positive number"),
    ({"kubelet_socket": "kubelet.sock"}, "is not an absolute path"),
    ({"metric_labels": "yes"}, "attribution.metric_labels"),
    ({"socket": "/x"}, "attribution.socket: unknown setting"),
])
def test_settings_are_checked(cfg, message):
    with pytest.raises(ValueError, match=message):
        settings(cfg)
    assert settings({}) == DEFAULTS and not DEFAULTS["enabled"] and not DEFAULTS["metric_labels"]


@pytest.mark.parametrize("text, fragment", [
    ("attribution:\n  sources: [kubelet, nvml]\n", "attribution.sources: ['kubelet', 'nvml'] is not a list of"),
    ("attribution:\n  kubelet_timeout_seconds: 0\n", "attribution.kubelet_timeout_seconds: 0.0 is not a positive"),
    ("attribution:\n  kubelet_socket: kubelet.sock\n", "attribution.kubelet_socket: 'kubelet.sock' is not an absolute"),
    ("attribution:\n  socket: /x\n", "attribution.socket: unknown setting"),
    ("attribution:\n  metric_labels: maybe\n", "attribution.metric_labels: expected bool"),
])
def test_the_config_file_has_an_attribution_section_and_it_is_checked(tmp_path, text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        config.load(str(path))
    assert config.defaults()["attribution"] == DEFAULTS
    path.write_text("attribution:\n  enabled: true\n  sources: [kubelet, slurm]\n")
    assert config.load(str(path))["attribution"] == dict(DEFAULTS, enabled=True, sources=["kubelet", "slurm"])


def test_between_passes_nobody_is_asked_and_the_last_round_stands(tmp_path, xid79_pass):
    """A report judged between passes (a kernel record) must not wait on the kubelet: it gets what the
    findings were given at the last pass, and the last pass's notes."""
    host, facts, findings, now = xid79_pass
    sock = str(tmp_path / "kubelet.sock")
    a = attributor(sock)
    with FakeKubelet(sock, "h100-xid79-lost.json") as kubelet:
        a.annotate(findings, facts, now)
        between = a.annotate(findings, facts, now + 1, ask=False)
    assert kubelet.calls == ["List"]
    assert all(f.evidence["pods"] == [TRAINER] for f in gpu3(between).values())
    failing = attributor(str(tmp_path / "absent.sock"))
    failing.annotate(findings, facts, now)
    [note] = [f for f in failing.annotate(findings, facts, now + 1, ask=False) if f.check == CHECK]
    assert note.reason == UNAVAILABLE and "does not exist" in note.message


def test_pods_given_mig_devices_are_placed_through_the_nvml_collectors_mig_listing(tmp_path):
    """DataDog/datadog-agent#33120's A100 in MIG mode, as the NVML collector lists it, and the kubelet's
    mixed-strategy answer (nvidia.com/mig-1g.10gb, MIG UUIDs): an Xid on the GPU names every pod on it."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "nvml", "datadog",
                           "a100-mig-1g10gb.nvml.json"), encoding="utf-8") as f:
        (tmp_path / "nvml.json").write_text(f.read())
    nvml.reset_backend()
    try:
        facts = nvml.collect(HostPaths(str(tmp_path)), nvml.DEFAULTS)
    finally:
        nvml.reset_backend()
    now = 1_737_337_016.0
    xid = Finding("xid", Severity.DEGRADED, "Xid43", "GPU 0000:00:05.0 logged Xid 43.", device="0000:00:05.0",
                  first_seen=now, last_seen=now)
    sock = str(tmp_path / "kubelet.sock")
    with FakeKubelet(sock, "a100-mig-1g10gb.json"):
        [out] = attributor(sock).annotate([xid], facts, now)
    assert sorted((p["namespace"], p["pod"], p["container"]) for p in out.evidence["pods"]) == [
        ("ci", "ci-runner-42", "build"), ("ci", "ci-runner-42", "test"), ("serving", "embed-api-6d9f7-abcde", "server"),
        ("serving", "embed-api-6d9f7-fghij", "server")]
    assert "pods_inferred" not in out.evidence
