"""The Kubernetes publisher tells the pods a GPU fault hit: one Event on each, in its own namespace, once
per finding, through the real `kubernetes` client against the fake API server."""
from __future__ import annotations

import logging

import pytest
from fake_kube_apiserver import FakeApiServer

from nodehealth.collectors.gpu_facts import Gpu, NvmlFacts
from nodehealth.kube.publisher import MAX_POSTED_POD_EVENTS, Publisher
from nodehealth.model import Action, CollectorResult, Finding, Report, Severity, verdict

FAST = {"retry_initial_seconds": 0.01, "retry_max_seconds": 0.05, "request_timeout_seconds": 0.5,
        "resync_seconds": 3600.0, "heartbeat_seconds": 3600.0}
UUID3 = "GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14"  # nvml-h100-xid79-lost's GPU 3
NVML = CollectorResult("nvml", True, True, facts=NvmlFacts(
    "fake:test", "565.57.01", "12.7", 1, (Gpu(3, uuid=UUID3, pci_bus_id="0000:5d:00.0"),)))
TRAINER = {"namespace": "research", "pod": "llm-pretrain-worker-3", "container": "trainer", "device": UUID3}
NOTEBOOK = {"namespace": "team-b", "pod": "notebook-5c9d8", "container": "notebook", "device": UUID3 + "::1"}


def xid(*pods: dict, first_seen: float = 1000.0) -> Finding:
    return Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "GPU 0000:5d:00.0 logged Xid 79.",
                   device="0000:5d:00.0", action=Action.REBOOT, evidence={"code": 79, "pods": list(pods)},
                   first_seen=first_seen, last_seen=first_seen)


def report(*findings: Finding) -> Report:
    return Report("gpu-1", verdict(findings), list(findings), [NVML], 1000.0)


@pytest.fixture
def server():
    s = FakeApiServer().start()
    s.add_node("gpu-1", labels={"nvidia.com/gpu.present": "true"})
    yield s
    s.close()


@pytest.fixture
def publisher(server, tmp_path):
    made = []

    def make(**cfg) -> Publisher:
        p = Publisher("gpu-1", dict(FAST, kubeconfig=server.kubeconfig(str(tmp_path / "kubeconfig")),
                                    max_quarantined_fraction=1.0, **cfg))
        made.append(p)
        return p
    yield make
    for p in made:
        p.stop(1.0)


def pod_events(server):
    return [e for e in server.events if e["involvedObject"]["kind"] == "Pod"]


def test_each_pod_the_fault_hit_gets_one_event_in_its_own_namespace_once(server, publisher):
    p = publisher()
    for _ in range(3):  # three passes with the same finding
        p.publish(report(xid(TRAINER, NOTEBOOK)))
        assert p.sync_once()
    events = sorted(pod_events(server), key=lambda e: e["metadata"]["namespace"])
    assert [(e["metadata"]["namespace"], e["involvedObject"]["name"]) for e in events] == [
        ("research", "llm-pretrain-worker-3"), ("team-b", "notebook-5c9d8")]
    trainer = events[0]
    assert trainer["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "research",
                                         "name": "llm-pretrain-worker-3"}
    assert (trainer["type"], trainer["reason"]) == ("Warning", "Xid79FallenOffBus")
    assert trainer["message"].startswith(f"Xid 79 on GPU 0000:5d:00.0 ({UUID3}) that this pod was using "
                                         "(container trainer)")
    assert trainer["source"] == {"component": "nodehealth", "host": "gpu-1"} and trainer["reportingInstance"] == "gpu-1"
    # A new Xid on the same GPU later is another finding: its pods are told again.
    p.publish(report(xid(TRAINER, first_seen=2000.0)))
    assert p.sync_once()
    assert len(pod_events(server)) == 3


def test_dry_run_posts_nothing_and_says_once_what_it_would_post(server, publisher, caplog):
    p = publisher(dry_run=True)
    with caplog.at_level(logging.INFO, logger="nodehealth.kube"):
        for _ in range(2):
            p.publish(report(xid(TRAINER)))
            assert p.sync_once()
    assert server.events == []
    said = [r.getMessage() for r in caplog.records if "would post" in r.getMessage()]
    assert len(said) == 1 and "research/llm-pretrain-worker-3" in said[0]


def test_an_event_a_namespace_refuses_is_dropped_and_the_node_still_converges(server, publisher):
    """Without the attribution component's RBAC, Pod Events are forbidden: that must not stop the taints."""
    server.fail(403, method="POST", path_end="/namespaces/research/events")
    p = publisher()
    p.publish(report(xid(TRAINER, NOTEBOOK)))
    assert p.sync_once()
    assert [e["metadata"]["namespace"] for e in pod_events(server)] == ["team-b"]
    assert [t["key"] for t in server.node("gpu-1")["spec"]["taints"]] == ["nodehealth.io/gpu"]
    errors = {labels: v for m in p.metrics() if m.name == "nodehealth_kube_publish_errors_total"
              for labels, v in m.samples}
    assert errors == {("forbidden",): 1.0}
    p.publish(report(xid(TRAINER, NOTEBOOK)))
    assert p.sync_once()  # not posted again
    assert len(pod_events(server)) == 1


def test_the_keys_of_posted_events_are_bounded(server, publisher):
    p = publisher()
    p.publish(report(*[xid(TRAINER, first_seen=float(i)) for i in range(MAX_POSTED_POD_EVENTS + 10)]))
    assert len(p._posted) == MAX_POSTED_POD_EVENTS
