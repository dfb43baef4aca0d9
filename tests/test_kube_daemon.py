"""The daemon with --kube against the fake API server: a sick machine's verdict reaches its Node."""
from __future__ import annotations

import json
import time

from conftest import machine
from fake_kube_apiserver import FakeApiServer

FOREIGN = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}


def wait_until(fn, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    return None


def test_the_daemon_taints_and_conditions_its_own_node(tmp_path, daemon_factory):
    server = FakeApiServer().start()
    try:
        server.add_node("gpu-h100-07", labels={"nvidia.com/gpu.present": "true"}, taints=[dict(FOREIGN)])
        server.add_node("other-node", labels={"nvidia.com/gpu.present": "true"})
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps({"kube": {"kubeconfig": server.kubeconfig(str(tmp_path / "kubeconfig")),
                                            "retry_initial_seconds": 0.1, "retry_max_seconds": 0.5,
                                            "max_quarantined_fraction": 1.0}}))
        d = daemon_factory(machine("h100-8x-cx7"), str(tmp_path / "state"), "--kube", "--config", str(cfg),
                           "--node-name", "gpu-h100-07")
        report = d.wait_ready()
        assert report["status"] == "unhealthy"

        def gpu_taint():
            taints = server.node("gpu-h100-07")["spec"].get("taints", [])
            return [t for t in taints if t["key"] == "nodehealth.io/gpu"]
        taint = wait_until(gpu_taint)
        assert taint and taint[0]["effect"] == "NoSchedule"
        node = server.node("gpu-h100-07")
        assert FOREIGN in node["spec"]["taints"]  # someone else's taint stays exactly as it was
        conditions = {c["type"]: c for c in node["status"]["conditions"]}
        assert conditions["NodeHealthGPUProblem"]["status"] == "True"
        assert conditions["Ready"]["reason"] == "KubeletReady"  # the kubelet's condition is untouched
        assert server.node("other-node")["spec"].get("taints", []) == []  # only its own Node
        applied = 'nodehealth_kube_taint_applied{subsystem="gpu",effect="NoSchedule"} 1'
        assert wait_until(lambda: applied in d.get("/metrics")[1].decode())
        d.stop()
    finally:
        server.close()


def test_dry_run_writes_nothing_but_says_what_it_would_do(tmp_path, daemon_factory):
    server = FakeApiServer().start()
    try:
        server.add_node("gpu-h100-07", labels={"nvidia.com/gpu.present": "true"})
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps({"kube": {"kubeconfig": server.kubeconfig(str(tmp_path / "kubeconfig"))}}))
        d = daemon_factory(machine("h100-8x-cx7"), str(tmp_path / "state"), "--kube", "--dry-run", "--config",
                           str(cfg), "--node-name", "gpu-h100-07")
        d.wait_ready()
        text = wait_until(lambda: (lambda t: t if 'nodehealth_kube_taint_desired{subsystem="gpu"' in t else None)(
            d.get("/metrics")[1].decode()))
        assert text and "nodehealth_kube_dry_run 1" in text
        time.sleep(0.5)
        assert [w for w in server.node_writes] == []
        d.stop()
    finally:
        server.close()
