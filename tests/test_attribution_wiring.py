"""Attribution wired into the product: `check` and the daemon on a fixture machine whose GPU 3 fell off
the bus, the fake kubelet answering with the pod that held it (tests/fixtures/podresources)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import machine
from fake_kube_apiserver import FakeApiServer
from fake_kubelet import FakeKubelet
from test_kube_daemon import wait_until

XID79 = machine("nvml-h100-xid79-lost")
LOST = "0000:5d:00.0"  # GPU 3
TRAINER = {"namespace": "research", "pod": "llm-pretrain-worker-3", "container": "trainer",
           "device": "GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14"}


def config(tmp_path, kube: dict | None = None, **attribution) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"attribution": dict(enabled=True, **attribution), "kube": kube or {}}))
    return str(path)


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nodehealth.cli", "check", "--root", XID79, *args],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, COLUMNS="120"))


@pytest.fixture
def kubelet(tmp_path):
    sock = str(tmp_path / "kubelet.sock")
    with FakeKubelet(sock, "h100-xid79-lost.json") as k:
        yield sock, k


def test_check_json_names_the_pod_on_both_findings_of_the_lost_gpu(tmp_path, kubelet):
    sock, k = kubelet
    done = check("--json", "--config", config(tmp_path, kubelet_socket=sock))
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    lost = {f["reason"]: f for f in report["findings"] if f["device"] == LOST}
    assert set(lost) == {"GpuLost", "Xid79FallenOffBus"}
    assert all(f["evidence"]["pods"] == [TRAINER] for f in lost.values())
    assert k.calls == ["List"]
    assert not [f for f in report["findings"] if f["check"] == "attribution"]


def test_check_s_table_names_the_pod_under_each_finding_of_the_lost_gpu(tmp_path, kubelet):
    sock, _ = kubelet
    done = check("--config", config(tmp_path, kubelet_socket=sock))
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    hit = [i for i, line in enumerate(lines) if line.strip() == "hit: pod research/llm-pretrain-worker-3"]
    assert len(hit) == 2, done.stdout  # GpuLost and Xid79FallenOffBus
    column = next(line for line in lines if line.startswith("STATUS")).index("MESSAGE")
    assert all(lines[i].index("hit:") == column for i in hit)  # in the message column, under its message


def test_check_without_the_socket_says_attribution_is_unavailable_and_keeps_its_verdict(tmp_path):
    done = check("--json", "--config", config(tmp_path, kubelet_socket=str(tmp_path / "absent.sock")))
    assert done.returncode == 1, done.stderr  # unhealthy, as without attribution: info changes no verdict
    report = json.loads(done.stdout)
    [note] = [f for f in report["findings"] if f["check"] == "attribution"]
    assert (note["severity"], note["reason"], note["device"]) == ("info", "AttributionUnavailable", "kubelet")
    assert "absent.sock does not exist" in note["message"] and LOST in note["message"]
    assert report["status"] == "unhealthy"


def test_the_daemon_without_the_socket_says_so_in_its_report_and_metrics_and_keeps_its_verdict(tmp_path,
                                                                                                daemon_factory):
    d = daemon_factory(XID79, str(tmp_path / "state"), "--config",
                       config(tmp_path, kubelet_socket=str(tmp_path / "absent.sock")))
    report = d.wait_ready()
    assert report["status"] == "unhealthy"
    [note] = [f for f in report["findings"] if f["check"] == "attribution"]
    assert (note["severity"], note["reason"], note["device"]) == ("info", "AttributionUnavailable", "kubelet")
    assert "absent.sock does not exist" in note["message"]
    metrics = d.get("/metrics")[1].decode()
    assert ('nodehealth_finding{check="attribution",severity="info",reason="AttributionUnavailable",'
            'device="kubelet"} 1') in metrics
    assert "nodehealth_health_status 1" in metrics  # unhealthy (1), as it was: the note is info
    d.stop()


def test_metric_labels_export_which_pod_holds_which_gpu(tmp_path, kubelet, daemon_factory):
    sock, k = kubelet
    d = daemon_factory(XID79, str(tmp_path / "state"), "--config",
                       config(tmp_path, kubelet_socket=sock, metric_labels=True))
    report = d.wait_ready()
    assert all(f["evidence"]["pods"] == [TRAINER] for f in report["findings"] if f["device"] == LOST)
    metrics = d.get("/metrics")[1].decode()
    # GPU 3 answers nothing, not even its UUID: it is the one GPU its pod's UUID can be (pods_inferred).
    assert ('nodehealth_gpu_pod_info{gpu="3",uuid="",pci_bus_id="0000:5d:00.0",namespace="research",'
            'pod="llm-pretrain-worker-3",container="trainer"} 1') in metrics
    assert "# TYPE nodehealth_gpu_pod_info gauge" in metrics
    d.stop()


def test_the_daemon_asks_slurm_only_through_its_slurm_face(tmp_path):
    done = subprocess.run([sys.executable, "-m", "nodehealth.cli", "daemon", "--root", XID79, "--state-dir",
                           str(tmp_path / "state"), "--listen", "127.0.0.1:0", "--config",
                           config(tmp_path, sources=["kubelet", "slurm"])], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "attribution.sources has slurm" in done.stderr and "--slurm" in done.stderr


def test_the_daemon_tells_the_pod_once_in_its_own_namespace(tmp_path, kubelet, daemon_factory):
    sock, k = kubelet
    server = FakeApiServer().start()
    try:
        server.add_node("h100-sxm-02", labels={"nvidia.com/gpu.present": "true"})
        kube = {"kubeconfig": server.kubeconfig(str(tmp_path / "kubeconfig")), "retry_initial_seconds": 0.1,
                "retry_max_seconds": 0.5, "max_quarantined_fraction": 1.0}
        d = daemon_factory(XID79, str(tmp_path / "state"), "--kube", "--node-name", "h100-sxm-02", "--config",
                           config(tmp_path, kube, kubelet_socket=sock), interval=0.5)
        d.wait_ready()

        def pod_events():
            return [e for e in server.events if e["involvedObject"]["kind"] == "Pod"]
        # One Event per finding of the lost GPU (GpuLost, Xid79FallenOffBus; the Xid comes when the kernel
        # log has been read) ...
        assert wait_until(lambda: len(pod_events()) >= 2)
        asked = len(k.calls)
        assert wait_until(lambda: len(k.calls) >= asked + 3)  # ... and three passes later, still one each
        assert wait_until(lambda: any(t["key"] == "nodehealth.io/gpu"
                                      for t in server.node("h100-sxm-02")["spec"].get("taints", [])))
        events = pod_events()
        assert sorted(e["reason"] for e in events) == ["GpuLost", "Xid79FallenOffBus"]
        for e in events:
            assert e["metadata"]["namespace"] == "research"
            assert e["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "research",
                                           "name": "llm-pretrain-worker-3"}
            assert "GPU 0000:5d:00.0" in e["message"] and "container trainer" in e["message"]
            assert e["source"] == {"component": "nodehealth", "host": "h100-sxm-02"}
        d.stop()
    finally:
        server.close()
