"""The daemon with --kube against the fake API server: a sick machine's verdict reaches its Node."""
from __future__ import annotations

import json
import time

from conftest import free_port, machine
from fake_kube_apiserver import FakeApiServer

from nodehealth import inventory
from nodehealth.pingmesh import verdicts

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


def test_a_pingmesh_verdict_about_the_node_taints_network_through_its_own_daemon(tmp_path, daemon_factory):
    """The daemon with --kube and --probe-listen and no inventory file: it reads the controller's
    inventory and verdict ConfigMaps, probes its peers, and taints nodehealth.io/network on its own
    Node when a verdict names it; when the verdict goes, the taint goes."""
    server = FakeApiServer().start()
    try:
        for name in ("gpu-a", "gpu-b"):
            server.add_node(name, labels={"nvidia.com/gpu.present": "true"})
        inv = inventory.from_data({"nodes": [{"name": "gpu-a", "leaf": "leaf-1", "address": "127.0.0.2"},
                                             {"name": "gpu-b", "leaf": "leaf-1", "address": "127.0.0.3"}]})
        server.put_configmap("nodehealth", "nodehealth-pingmesh-inventory",
                             binary_data={verdicts.INVENTORY_KEY: verdicts.encode_inventory(inv)})

        def publish(kinds):
            doc = {"schema_version": 1, "time": time.time(), "window_seconds": 2.0, "nodes": 2, "leaves": 1,
                   "verdicts": [{"kind": kind, "element": element, "since": time.time() - 4, "windows": 2,
                                 "message": f"{element} loses 12% of its probes", "evidence": {}}
                                for kind, element in kinds]}
            server.put_configmap("nodehealth", "nodehealth-pingmesh", data={verdicts.VERDICTS_KEY: json.dumps(doc)})
        publish([("node", "gpu-a"), ("node", "gpu-b-elsewhere")])
        port = free_port()
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps({
            "kube": {"kubeconfig": server.kubeconfig(str(tmp_path / "kubeconfig")), "retry_initial_seconds": 0.1,
                     "retry_max_seconds": 0.5, "max_quarantined_fraction": 1.0, "resync_seconds": 1.0},
            "pingmesh": {"window_seconds": 2.0, "port": port, "tcp_port": free_port(), "refresh_seconds": 1.0,
                         "probe_interval_seconds": 0.5, "ping_interval_seconds": 0.5}}))
        d = daemon_factory(machine("plain-host"), str(tmp_path / "state"), "--kube", "--config", str(cfg),
                           "--node-name", "gpu-a", "--only", "modules,pingmesh", "--probe-listen", f"127.0.0.2:{port}",
                           interval=1.0)
        d.wait_ready()

        def network_taint():
            return [t for t in server.node("gpu-a")["spec"].get("taints", []) if t["key"] == "nodehealth.io/network"]
        taint = wait_until(network_taint)
        assert taint and taint[0] == {"key": "nodehealth.io/network", "value": "PingmeshNodeFaulty",
                                      "effect": "PreferNoSchedule"}
        conditions = {c["type"]: c for c in server.node("gpu-a")["status"]["conditions"]}
        assert conditions["NodeHealthNetworkProblem"]["status"] == "True"
        assert server.node("gpu-b")["spec"].get("taints", []) == []  # one writer per Node: never another's
        # It probes the peer the controller's inventory gave it.
        summary = json.loads(d.get("/v1/pingmesh")[1])
        assert summary["leaf"] == "leaf-1"
        assert wait_until(lambda: any(p["node"] == "gpu-b" for w in json.loads(d.get("/v1/pingmesh")[1])["windows"]
                                      for p in w["peers"]))
        publish([])  # the controller closed the verdict
        assert wait_until(lambda: not network_taint(), timeout=20.0)
        d.stop()
    finally:
        server.close()
