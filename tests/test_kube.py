"""The Kubernetes face, driven through the real `kubernetes` client against a fake API server."""
from __future__ import annotations

import json
import time

import pytest
from fake_kube_apiserver import FakeApiServer

from nodehealth.kube import api as kube_api
from nodehealth.kube import breaker as kube_breaker
from nodehealth.kube import publisher as kube_publisher
from nodehealth.kube import taints as kube_taints
from nodehealth.kube.defaults import DEFAULTS as KUBE_DEFAULTS
from nodehealth.model import Action, Finding, Report, Severity, verdict

GPU_LABELS = {"nvidia.com/gpu.present": "true"}
FOREIGN = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
FAST = {"retry_initial_seconds": 0.01, "retry_max_seconds": 0.05, "request_timeout_seconds": 0.5,
        "resync_seconds": 3600.0, "heartbeat_seconds": 3600.0}


def finding(check: str, severity: Severity, reason: str, **kw) -> Finding:
    return Finding(check, severity, reason, f"{reason} happened.", kw.pop("device", "dev0"), **kw)


XID79 = finding("xid", Severity.FATAL, "Xid79FallenOffBus", action=Action.REBOOT)
IB_SLOW = finding("infiniband", Severity.DEGRADED, "PortRateDegraded")


def report(*findings: Finding) -> Report:
    return Report("node", verdict(findings), list(findings), [], 0.0)


def wait_for(predicate, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


@pytest.fixture
def server():
    s = FakeApiServer().start()
    yield s
    s.close()


@pytest.fixture
def make(server, tmp_path):
    """Publishers for node names on the fake server, each through its own real client."""
    made = []
    config = server.kubeconfig(str(tmp_path / "kubeconfig"))

    def _make(node: str = "gpu-1", on_clear=None, **cfg) -> kube_publisher.Publisher:
        if node not in server.nodes:
            server.add_node(node, labels=GPU_LABELS, taints=[dict(FOREIGN)])
        p = kube_publisher.Publisher(node, dict(FAST, kubeconfig=config, **cfg), on_clear=on_clear)
        made.append(p)
        return p

    yield _make
    for p in made:
        p.stop(1.0)


def taints(server, node="gpu-1"):
    return [(t["key"], t.get("value"), t["effect"]) for t in server.node(node)["spec"].get("taints") or []]


def condition(server, ctype, node="gpu-1"):
    return next(c for c in server.node(node)["status"]["conditions"] if c["type"] == ctype)


def samples(publisher, name):
    return {labels: value for m in publisher.metrics() if m.name == name for labels, value in m.samples}


# -- the verdict as taints and conditions ---------------------------------------------------------

@pytest.mark.parametrize("findings, cfg, want", [
    ([XID79], {}, {"gpu": ("True", "Xid79FallenOffBus", "NoSchedule")}),
    ([XID79], {"noexecute_subsystems": ["gpu"]}, {"gpu": ("True", "Xid79FallenOffBus", "NoExecute")}),
    ([IB_SLOW], {}, {"network": ("True", "PortRateDegraded", "PreferNoSchedule")}),
    ([finding("memlock", Severity.WARNING, "MemlockLow")], {}, {"memory": ("False", "NoProblem", None)}),
    ([finding("mounts", Severity.UNKNOWN, "MountsUnreadable")], {}, {"storage": ("Unknown", "MountsUnreadable", None)}),
    ([finding("pcie", Severity.DEGRADED, "PCIeLinkWidthDegraded", evidence={"kind": "nic"})], {},
     {"network": ("True", "PCIeLinkWidthDegraded", "PreferNoSchedule")}),
    ([finding("pcie", Severity.DEGRADED, "PCIeLinkWidthDegraded")], {},
     {"kernel": ("True", "PCIeLinkWidthDegraded", "PreferNoSchedule")}),
    ([finding("thp", Severity.DEGRADED, "ThpDefragAlways"), finding("memory", Severity.FATAL, "ZoneExhausted")], {},
     {"memory": ("True", "ZoneExhausted", "NoSchedule")}),
])
def test_desired_state_per_subsystem(findings, cfg, want):
    state = kube_taints.desired_state(report(*findings), dict(KUBE_DEFAULTS, **cfg))
    assert set(state) == set(kube_taints.SUBSYSTEMS)
    for subsystem in kube_taints.SUBSYSTEMS:
        got = state[subsystem]
        assert (got.status, got.reason, got.effect) == want.get(subsystem, ("False", "NoProblem", None))


def test_condition_message_counts_the_other_findings():
    state = kube_taints.desired_state(report(XID79, finding("nvlink", Severity.DEGRADED, "NvlinkDown")), KUBE_DEFAULTS)
    assert state["gpu"].message == "Xid79FallenOffBus happened. (1 more GPU findings in the nodehealth report.)"


@pytest.mark.parametrize("reason, value", [("Xid79FallenOffBus", "Xid79FallenOffBus"),
                                           ("Bad reason!/x", "Badreasonx"), ("A" * 80, "A" * 63)])
def test_taint_value_is_a_valid_label_value(reason, value):
    assert kube_taints.taint_value(reason) == value


def test_nothing_is_written_before_the_first_publish(server, make):
    p = make()
    p.start()
    time.sleep(0.2)
    assert server.requests == []
    assert samples(p, "nodehealth_kube_last_sync_timestamp_seconds") == {}


def test_taints_conditions_and_events_follow_the_verdict(server, make):
    p = make()
    p.publish(report(XID79, IB_SLOW))
    assert p.sync_once()
    assert taints(server) == [("dedicated", "training", "NoSchedule"),
                              ("nodehealth.io/gpu", "Xid79FallenOffBus", "NoSchedule"),
                              ("nodehealth.io/network", "PortRateDegraded", "PreferNoSchedule")]
    gpu = condition(server, "NodeHealthGPUProblem")
    assert (gpu["status"], gpu["reason"]) == ("True", "Xid79FallenOffBus")
    assert gpu["message"] == "Xid79FallenOffBus happened."
    assert condition(server, "NodeHealthKernelProblem")["status"] == "False"
    assert condition(server, "Ready")["lastHeartbeatTime"] == "2024-01-01T00:00:00Z"  # the kubelet's, untouched
    assert sorted((e["type"], e["reason"]) for e in server.events) == [("Warning", "PortRateDegraded"),
                                                                      ("Warning", "Xid79FallenOffBus")]
    assert all(e["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1", "uid": "uid-gpu-1"}
               for e in server.events)
    assert samples(p, "nodehealth_kube_taint_applied") == {("gpu", "NoSchedule"): 1, ("network", "PreferNoSchedule"): 1}
    assert samples(p, "nodehealth_kube_taint_desired") == samples(p, "nodehealth_kube_taint_applied")

    p.publish(report())
    assert p.sync_once()
    assert taints(server) == [("dedicated", "training", "NoSchedule")]
    assert json.loads(server.node("gpu-1")["metadata"]["annotations"]["nodehealth.io/applied-taints"]) == []
    assert condition(server, "NodeHealthGPUProblem")["status"] == "False"
    assert sorted(e["reason"] for e in server.events[2:]) == ["NodeHealthGPURecovered", "NodeHealthNetworkRecovered"]
    assert samples(p, "nodehealth_kube_taint_applied") == {}


def test_a_changed_severity_swaps_the_effect(server, make):
    p = make()
    p.publish(report(XID79))
    p.sync_once()
    p.publish(report(finding("xid", Severity.DEGRADED, "Xid13GraphicsException")))
    p.sync_once()
    assert taints(server) == [("dedicated", "training", "NoSchedule"),
                              ("nodehealth.io/gpu", "Xid13GraphicsException", "PreferNoSchedule")]


def test_no_execute_taint_gets_time_added_from_the_server(server, make):
    p = make(noexecute_subsystems=["gpu"])
    p.publish(report(XID79))
    p.sync_once()
    taint = server.node("gpu-1")["spec"]["taints"][1]
    assert (taint["effect"], bool(taint.get("timeAdded"))) == ("NoExecute", True)


def test_a_taint_another_writer_adds_during_our_write_survives(server, make):
    p = make()

    def other_controller(srv, name):
        srv.edit_node(name, lambda n: n["spec"]["taints"].append({"key": "example.com/maintenance",
                                                                   "effect": "NoSchedule"}))

    server.before_node_write = other_controller
    p.publish(report(XID79))
    assert p.sync_once()
    assert taints(server) == [("dedicated", "training", "NoSchedule"),
                              ("example.com/maintenance", None, "NoSchedule"),
                              ("nodehealth.io/gpu", "Xid79FallenOffBus", "NoSchedule")]
    assert p.errors == {}  # the 409 was answered by a fresh read, not counted as a failure

    p.publish(report())
    p.sync_once()
    assert taints(server) == [("dedicated", "training", "NoSchedule"), ("example.com/maintenance", None, "NoSchedule")]


def test_a_node_that_keeps_changing_is_a_conflict_error_then_converges(server, make):
    p = make(conflict_retries=2)
    p.publish(report(XID79))
    server.fail(409, times=2, method="PATCH", path_end="/nodes/gpu-1")
    assert not p.sync_once()
    assert p.errors == {"conflict": 1}
    assert p.sync_once()
    assert ("nodehealth.io/gpu", "Xid79FallenOffBus", "NoSchedule") in taints(server)


def test_a_foreign_taint_with_our_key_is_neither_duplicated_nor_removed(server, make):
    # The record says the agent applied nothing, so the operator's taint is not ours.
    server.add_node("gpu-1", taints=[{"key": "nodehealth.io/gpu", "value": "ByHand", "effect": "NoSchedule"}],
                    annotations={"nodehealth.io/applied-taints": "[]"})
    p = make()
    p.publish(report(XID79))
    assert p.sync_once()
    assert taints(server) == [("nodehealth.io/gpu", "ByHand", "NoSchedule")]
    p.publish(report())
    assert p.sync_once()
    assert taints(server) == [("nodehealth.io/gpu", "ByHand", "NoSchedule")]


def test_the_record_never_makes_a_foreign_taint_ours(server, make):
    server.add_node("gpu-1", taints=[{"key": "team/x", "effect": "NoSchedule"}],
                    annotations={"nodehealth.io/applied-taints": '[{"key":"team/x","effect":"NoSchedule"}]'})
    p = make()
    p.publish(report())
    assert p.sync_once()
    assert taints(server) == [("team/x", None, "NoSchedule")]
    assert server.node("gpu-1")["metadata"]["annotations"]["nodehealth.io/applied-taints"] == "[]"


def quarantined_with_a_corrupt_record(server, lease_annotations):
    server.add_node("gpu-1", labels=GPU_LABELS,
                    taints=[dict(FOREIGN), {"key": "nodehealth.io/gpu", "value": "Xid48", "effect": "NoSchedule"}],
                    annotations={"nodehealth.io/applied-taints": "{garbage"})
    server.add_lease("nodehealth", "nodehealth-quarantine", lease_annotations)


def lease_members(server):
    lease = server.lease("nodehealth", "nodehealth-quarantine")
    return json.loads(lease["metadata"]["annotations"]["nodehealth.io/quarantined"])


@pytest.mark.parametrize("record", [None, "{garbage", "null", '["nodehealth.io/gpu"]'])
def test_without_a_readable_record_our_subsystem_taints_are_ours(server, make, record):
    annotations = {} if record is None else {"nodehealth.io/applied-taints": record}
    server.add_node("gpu-1", taints=[dict(FOREIGN), {"key": "nodehealth.io/gpu", "effect": "NoSchedule"},
                                     {"key": "nodehealth.io/other", "effect": "NoSchedule"}], annotations=annotations)
    p = make(breaker_enabled=False)
    p.publish(report())
    assert p.sync_once()
    assert taints(server) == [("dedicated", "training", "NoSchedule"), ("nodehealth.io/other", None, "NoSchedule")]


def test_a_corrupt_record_cannot_strand_a_quarantine_or_its_slot(server, make):
    quarantined_with_a_corrupt_record(server, {"nodehealth.io/quarantined": '["gpu-1"]'})
    p = make()
    p.publish(report())
    assert p.sync_once()
    assert taints(server) == [("dedicated", "training", "NoSchedule")]
    assert server.node("gpu-1")["metadata"]["annotations"]["nodehealth.io/applied-taints"] == "[]"
    assert lease_members(server) == []


def test_a_corrupt_record_keeps_a_wanted_quarantine_counted_as_ours(server, make):
    # A tripped breaker refuses new quarantines, but this node already is one: it keeps its taint and a slot.
    quarantined_with_a_corrupt_record(server, {"nodehealth.io/quarantined": "[]",
                                               "nodehealth.io/breaker-tripped": "earlier"})
    p = make()
    p.publish(report(XID79))
    assert p.sync_once()
    assert taints(server) == [("dedicated", "training", "NoSchedule"),
                              ("nodehealth.io/gpu", "Xid79FallenOffBus", "NoSchedule")]
    assert json.loads(server.node("gpu-1")["metadata"]["annotations"]["nodehealth.io/applied-taints"]) == [
        {"key": "nodehealth.io/gpu", "effect": "NoSchedule"}]
    assert lease_members(server) == ["gpu-1"]
    assert samples(p, "nodehealth_kube_taint_withheld") == {}
    assert samples(p, "nodehealth_kube_taint_applied") == {("gpu", "NoSchedule"): 1}


@pytest.mark.parametrize("taint", [
    {"key": "nodehealth.io/gpu", "value": "A" * 64, "effect": "NoSchedule"},
    {"key": "nodehealth.io/gpu", "value": "Bad reason!", "effect": "NoSchedule"},
    {"key": "nodehealth.io/gpu", "value": "-Leading", "effect": "NoSchedule"},
    {"key": "bad key", "effect": "NoSchedule"},
    {"key": "Example.com/x", "effect": "NoSchedule"},
    {"key": "nodehealth.io/gpu", "effect": "Sometimes"},
])
def test_the_fake_server_refuses_taints_the_real_one_refuses(server, tmp_path, taint):
    server.add_node("gpu-1")
    api = kube_api.ClientApi(server.kubeconfig(str(tmp_path / "kc")), 1.0)
    with pytest.raises(kube_api.KubeError) as refused:
        api.patch_node("gpu-1", {"spec": {"taints": [taint]}})
    assert refused.value.kind == "client_error" and str(refused.value).startswith("422")
    assert server.node("gpu-1")["spec"]["taints"] == []


def test_an_unruly_reason_still_makes_a_taint_the_server_accepts(server, make):
    p = make()
    p.publish(report(finding("xid", Severity.FATAL, "-Xid 79: fell off the bus/" + "x" * 80)))
    assert p.sync_once()
    value = server.node("gpu-1")["spec"]["taints"][1]["value"]
    assert value == "Xid79felloffthebus" + "x" * 44  # 63 characters from the reason, then the "-" stripped


# -- API trouble ----------------------------------------------------------------------------------

@pytest.mark.parametrize("trouble, kind", [
    (lambda s: s.fail(403), "forbidden"),
    (lambda s: s.fail(500), "server_error"),
    (lambda s: s.fail(503), "server_error"),
    (lambda s: s.fail(429), "throttled"),
    (lambda s: setattr(s, "down", True), "unreachable"),
    (lambda s: setattr(s, "delay", 0.8), "timeout"),
])
def test_api_trouble_is_counted_retried_and_converges(server, make, trouble, kind):
    p = make(request_timeout_seconds=0.3)
    trouble(server)
    p.start()
    started = time.monotonic()
    p.publish(report(XID79))
    assert time.monotonic() - started < 0.1  # publish never waits for the API
    wait_for(lambda: p.errors.get(kind, 0) >= 2)
    assert samples(p, "nodehealth_kube_publish_errors_total")[(kind,)] >= 2
    assert samples(p, "nodehealth_kube_taint_desired") == {("gpu", "NoSchedule"): 1}
    assert samples(p, "nodehealth_kube_taint_applied") == {}
    server.heal()
    wait_for(lambda: ("nodehealth.io/gpu", "Xid79FallenOffBus", "NoSchedule") in taints(server))
    wait_for(lambda: samples(p, "nodehealth_kube_last_sync_timestamp_seconds"))
    assert samples(p, "nodehealth_kube_taint_applied") == {("gpu", "NoSchedule"): 1}


def test_no_api_server_at_all_never_raises(tmp_path):
    s = FakeApiServer()
    config = s.kubeconfig(str(tmp_path / "kubeconfig"))
    s.httpd.server_close()  # nothing listens on that port
    p = kube_publisher.Publisher("gpu-1", dict(FAST, kubeconfig=config))
    p.publish(report(XID79))
    assert not p.sync_once()
    assert p.errors == {"unreachable": 1}


def test_a_missing_client_configuration_is_a_config_error(tmp_path):
    p = kube_publisher.Publisher("gpu-1", dict(FAST, kubeconfig=str(tmp_path / "absent")))
    p.publish(report(XID79))
    assert not p.sync_once()
    assert p.errors == {"config": 1}


# -- safeguards -----------------------------------------------------------------------------------

def test_dry_run_writes_nothing_and_exports_what_it_would_write(server, make):
    server.add_node("gpu-1", taints=[dict(FOREIGN)], annotations={"nodehealth.io/clear": "replaced the GPU"})
    cleared = []
    p = make(dry_run=True, on_clear=cleared.append)
    p.publish(report(XID79))
    assert p.sync_once()
    assert server.writes() == []
    assert cleared == []
    assert samples(p, "nodehealth_kube_dry_run") == {(): 1}
    assert samples(p, "nodehealth_kube_taint_desired") == {("gpu", "NoSchedule"): 1}
    assert samples(p, "nodehealth_kube_taint_applied") == {}


def test_dry_run_never_acts_on_a_breaker_reset(server, make):
    reset = {"nodehealth.io/quarantined": '["gpu-7"]', "nodehealth.io/breaker-tripped": "earlier",
             "nodehealth.io/breaker-reset": "alice"}
    server.add_lease("nodehealth", "nodehealth-quarantine", reset)
    p = make(dry_run=True)
    p.publish(report(XID79))
    assert p.sync_once()
    assert server.writes() == []
    assert server.lease("nodehealth", "nodehealth-quarantine")["metadata"]["annotations"] == reset


def test_hold_keeps_our_taints_until_it_is_lifted(server, make):
    p = make()
    p.publish(report(XID79))
    p.sync_once()
    server.edit_node("gpu-1", lambda n: n["metadata"]["annotations"].update({"nodehealth.io/hold": "ticket 42"}))
    p.publish(report())
    assert p.sync_once()
    assert ("nodehealth.io/gpu", "Xid79FallenOffBus", "NoSchedule") in taints(server)
    assert condition(server, "NodeHealthGPUProblem")["status"] == "False"  # conditions still tell the truth
    assert samples(p, "nodehealth_kube_hold") == {(): 1}
    server.edit_node("gpu-1", lambda n: n["metadata"]["annotations"].pop("nodehealth.io/hold"))
    assert p.sync_once()
    assert taints(server) == [("dedicated", "training", "NoSchedule")]


def test_a_node_someone_cordoned_stays_cordoned_and_keeps_our_taints(server, make):
    p = make()
    p.publish(report(XID79))
    p.sync_once()
    server.edit_node("gpu-1", lambda n: n["spec"].update({"unschedulable": True}))
    p.publish(report(IB_SLOW))
    assert p.sync_once()
    node = server.node("gpu-1")
    assert node["spec"]["unschedulable"] is True
    assert ("nodehealth.io/gpu", "Xid79FallenOffBus", "NoSchedule") in taints(server)
    assert ("nodehealth.io/network", "PortRateDegraded", "PreferNoSchedule") in taints(server)


def test_breaker_caps_quarantines_and_stays_tripped_until_reset(server, make):
    for i in range(4, 21):  # 20 managed nodes: a cap of 2
        server.add_node(f"gpu-{i}", labels=GPU_LABELS)
    server.add_node("cpu-1")  # not managed: not counted
    publishers = [make(f"gpu-{i}") for i in (1, 2, 3)]
    for p in publishers:
        p.publish(report(XID79))
        assert p.sync_once()
    quarantined = [("nodehealth.io/gpu", "Xid79FallenOffBus", "NoSchedule") in taints(server, f"gpu-{i}")
                   for i in (1, 2, 3)]
    assert quarantined == [True, True, False]
    third = publishers[2]
    assert condition(server, "NodeHealthGPUProblem", "gpu-3")["status"] == "True"  # still told
    assert "NodeHealthTaintWithheld" in [e["reason"] for e in server.events if e["involvedObject"]["name"] == "gpu-3"]
    assert samples(third, "nodehealth_kube_taint_withheld") == {("gpu",): 1}
    assert samples(third, "nodehealth_kube_breaker_tripped") == {(): 1}
    assert samples(third, "nodehealth_kube_breaker_cap_nodes") == {(): 2}
    assert samples(third, "nodehealth_kube_breaker_quarantined_nodes") == {(): 2}

    publishers[0].publish(report())  # gpu-1 recovers and gives its slot back ...
    assert publishers[0].sync_once()
    lease = server.lease("nodehealth", "nodehealth-quarantine")
    assert json.loads(lease["metadata"]["annotations"]["nodehealth.io/quarantined"]) == ["gpu-2"]
    assert third.sync_once()  # ... but the breaker stays tripped
    assert ("nodehealth.io/gpu", "Xid79FallenOffBus", "NoSchedule") not in taints(server, "gpu-3")

    server.edit_lease("nodehealth", "nodehealth-quarantine",
                      lambda lease: lease["metadata"]["annotations"].update({"nodehealth.io/breaker-reset": "alice"}))
    third.publish(report(XID79))
    assert third.sync_once()
    assert ("nodehealth.io/gpu", "Xid79FallenOffBus", "NoSchedule") in taints(server, "gpu-3")
    annotations = server.lease("nodehealth", "nodehealth-quarantine")["metadata"]["annotations"]
    assert "nodehealth.io/breaker-tripped" not in annotations and "nodehealth.io/breaker-reset" not in annotations
    assert samples(third, "nodehealth_kube_taint_withheld") == {}


def test_degraded_taints_need_no_quarantine_slot(server, make):
    server.add_node("gpu-9", labels=GPU_LABELS)
    first, second = make("gpu-1"), make("gpu-2")  # 3 managed nodes: a cap of 1
    first.publish(report(XID79))
    first.sync_once()
    second.publish(report(IB_SLOW))
    second.sync_once()
    assert ("nodehealth.io/network", "PortRateDegraded", "PreferNoSchedule") in taints(server, "gpu-2")
    assert samples(second, "nodehealth_kube_taint_withheld") == {}


def test_breaker_reset_helper(server, make, tmp_path):
    for node in ("gpu-1", "gpu-2"):
        p = make(node)
        p.publish(report(XID79))
        p.sync_once()
    annotations = server.lease("nodehealth", "nodehealth-quarantine")["metadata"]["annotations"]
    assert annotations["nodehealth.io/breaker-tripped"]
    api = kube_api.ClientApi(server.kubeconfig(str(tmp_path / "kc")), 1.0)
    assert kube_breaker.reset_breaker({}, api) == "breaker reset; 1 node(s) still hold quarantine slots: gpu-1"
    assert "nodehealth.io/breaker-tripped" not in server.lease("nodehealth", "nodehealth-quarantine")["metadata"][
        "annotations"]


def test_concurrent_slot_claims_never_exceed_the_cap(server, make):
    # Two agents claim the last slot from the same read: the CAS lets exactly one win.
    server.add_node("gpu-9", labels=GPU_LABELS)
    first, second = make("gpu-1"), make("gpu-2")
    api = first._client()
    real_get = api.get_lease
    raced = []

    def get_lease_then_race(namespace, name):
        lease = real_get(namespace, name)
        if not raced and lease is not None:
            raced.append(True)
            second.publish(report(XID79))
            assert second.sync_once()  # takes the only slot between first's read and write
        return lease

    api.create_lease("nodehealth", {"metadata": {"name": "nodehealth-quarantine"}})
    api.get_lease = get_lease_then_race
    first.publish(report(XID79))
    assert first.sync_once()
    members = json.loads(server.lease("nodehealth", "nodehealth-quarantine")["metadata"]["annotations"][
        "nodehealth.io/quarantined"])
    assert members == ["gpu-2"]
    assert ("nodehealth.io/gpu", "Xid79FallenOffBus", "NoSchedule") not in taints(server, "gpu-1")


# -- conditions, heartbeats, restarts, clears ------------------------------------------------------

def test_conditions_heartbeat_and_transition_times(server, make):
    p = make(heartbeat_seconds=0.0)
    p.publish(report(XID79))
    p.sync_once()
    first = condition(server, "NodeHealthGPUProblem")
    server.edit_node("gpu-1", lambda n: [c.update({"lastHeartbeatTime": "2000-01-01T00:00:00Z"})
                                         for c in n["status"]["conditions"] if c["type"] == "NodeHealthGPUProblem"])
    assert p.sync_once()
    again = condition(server, "NodeHealthGPUProblem")
    assert again["lastHeartbeatTime"] != "2000-01-01T00:00:00Z"  # refreshed on the heartbeat
    assert again["lastTransitionTime"] == first["lastTransitionTime"]
    assert len(server.events) == 1  # a heartbeat is no transition


def test_no_status_write_between_heartbeats_when_nothing_changed(server, make):
    p = make()
    p.publish(report(XID79))
    p.sync_once()
    before = len([r for r in server.writes() if r[1].endswith("/status")])
    p.publish(report(XID79))
    p.sync_once()
    assert len([r for r in server.writes() if r[1].endswith("/status")]) == before


def test_a_restarted_agent_repeats_no_events(server, make):
    first = make()
    first.publish(report(XID79))
    first.sync_once()
    restarted = make()
    restarted.publish(report(XID79))
    assert restarted.sync_once()
    assert [e["reason"] for e in server.events] == ["Xid79FallenOffBus"]


def test_clear_annotation_calls_back_is_removed_and_recorded(server, make):
    cleared = []
    p = make(on_clear=cleared.append)
    p.publish(report(XID79))
    p.sync_once()
    server.edit_node("gpu-1", lambda n: n["metadata"]["annotations"].update({"nodehealth.io/clear": "GPU reseated"}))
    assert p.sync_once()
    assert cleared == ["GPU reseated"]
    assert "nodehealth.io/clear" not in server.node("gpu-1")["metadata"]["annotations"]
    assert server.events[-1]["reason"] == "NodeHealthCleared"
    assert "GPU reseated" in server.events[-1]["message"]


# -- what the pingmesh controller reads and writes --------------------------------------------------

def test_list_nodes_reads_page_by_page_and_keeps_what_the_inventory_needs(server, tmp_path):
    for i in range(1201):
        server.add_node(f"gpu-{i:04d}", labels=dict(GPU_LABELS, **{"nodehealth.io/leaf": f"leaf-{i // 32}"}),
                        annotations={"nodehealth.io/probe-addresses": f"10.0.{i // 256}.{i % 256}"},
                        internal_ip=f"192.168.{i // 256}.{i % 256}")
    server.add_node("cpu-1", labels={"nodehealth.io/leaf": "leaf-x"})
    api = kube_api.ClientApi(server.kubeconfig(str(tmp_path / "kc")))
    nodes = api.list_nodes("nvidia.com/gpu.present=true")
    assert len(nodes) == 1201 and len({n["metadata"]["name"] for n in nodes}) == 1201
    assert [r for r in server.requests if r == ("GET", "/api/v1/nodes")] == [("GET", "/api/v1/nodes")] * 3
    assert nodes[7] == {
        "metadata": {"name": "gpu-0007", "labels": {"nvidia.com/gpu.present": "true", "nodehealth.io/leaf": "leaf-0"},
                     "annotations": {"nodehealth.io/probe-addresses": "10.0.0.7"}},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.7"},
                                 {"type": "Hostname", "address": "gpu-0007"}]}}
    assert api.count_nodes("nvidia.com/gpu.present=true") == 1201


def test_a_paginated_list_is_one_snapshot(server, tmp_path):
    """Nodes added between pages do not appear in a list already under way (etcd's consistent pages)."""
    for i in range(600):
        server.add_node(f"gpu-{i:04d}")
    first = server.route("GET", "/api/v1/nodes", {"limit": ["500"]}, "", None)[1]
    server.add_node("gpu-0000a")
    rest = server.route("GET", "/api/v1/nodes", {"limit": ["500"], "continue": [first["metadata"]["continue"]]},
                        "", None)[1]
    assert len(first["items"]) + len(rest["items"]) == 600 and "continue" not in rest["metadata"]
    api = kube_api.ClientApi(server.kubeconfig(str(tmp_path / "kc")))
    assert len(api.list_nodes("")) == 601


def test_configmaps_create_get_and_compare_and_swap(server, tmp_path):
    api = kube_api.ClientApi(server.kubeconfig(str(tmp_path / "kc")))
    assert api.get_configmap("nodehealth", "cm") is None
    created = api.create_configmap("nodehealth", {"metadata": {"name": "cm"}, "data": {"a": "1"},
                                                  "binaryData": {"b.gz": "AAEC"}})
    with pytest.raises(kube_api.KubeError) as e:
        api.create_configmap("nodehealth", {"metadata": {"name": "cm"}, "data": {}})
    assert e.value.kind == "conflict"
    got = api.get_configmap("nodehealth", "cm")
    assert (got["data"], got["binaryData"]) == ({"a": "1"}, {"b.gz": "AAEC"})
    stale = dict(created, data={"a": "2"})
    api.replace_configmap("nodehealth", dict(got, data={"a": "3"}))
    with pytest.raises(kube_api.KubeError) as e:
        api.replace_configmap("nodehealth", stale)  # the resourceVersion it carries is gone
    assert e.value.kind == "conflict"
    assert api.get_configmap("nodehealth", "cm")["data"] == {"a": "3"}


def test_a_configmap_answer_over_the_bound_is_not_read(server, tmp_path, monkeypatch):
    api = kube_api.ClientApi(server.kubeconfig(str(tmp_path / "kc")))
    server.put_configmap("nodehealth", "cm", data={"verdicts.json": "x" * 5000})
    monkeypatch.setattr(kube_api, "MAX_CONFIGMAP_RESPONSE_BYTES", 4096)
    with pytest.raises(kube_api.KubeError) as e:
        api.get_configmap("nodehealth", "cm")
    assert e.value.kind == "too_large"
    monkeypatch.setattr(kube_api, "MAX_CONFIGMAP_RESPONSE_BYTES", 8192)
    assert api.get_configmap("nodehealth", "cm")["data"]["verdicts.json"] == "x" * 5000
    assert api.get_configmap("nodehealth", "cm") is not None  # the connection went back to the pool intact


def test_pingmesh_findings_taint_the_network_subsystem():
    f = finding("pingmesh", Severity.DEGRADED, "PingmeshNodeFaulty", action=Action.HW_INSPECTION)
    assert kube_taints.subsystem_of(f) == "network"
    state = kube_taints.desired_state(report(f), KUBE_DEFAULTS)["network"]
    assert (state.status, state.reason, state.effect) == ("True", "PingmeshNodeFaulty", "PreferNoSchedule")


@pytest.mark.parametrize("check,subsystem", [
    ("memory_errors", "memory"), ("edac", "memory"), ("crashes", "kernel"), ("storage_errors", "storage"),
    ("nic_health", "network"),
])
def test_host_fault_checks_taint_their_subsystem(check, subsystem):
    f = finding(check, Severity.FATAL, "SomeFault", action=Action.HW_INSPECTION)
    assert kube_taints.subsystem_of(f) == subsystem
    state = kube_taints.desired_state(report(f), KUBE_DEFAULTS)[subsystem]
    assert (state.status, state.reason, state.effect) == ("True", "SomeFault", "NoSchedule")


def test_every_registered_check_has_a_subsystem():
    # Each check declares its SUBSYSTEM (the side list kube.CHECK_SUBSYSTEMS that a new check had to
    # remember is gone); pcie's findings follow their device's kind.
    from nodehealth.registry import CHECKS

    assert {c.NAME: c.SUBSYSTEM for c in CHECKS if c.SUBSYSTEM not in kube_taints.SUBSYSTEMS} == {}
    assert all(kube_taints.subsystem_of(finding(c.NAME, Severity.FATAL, "SomeFault")) == c.SUBSYSTEM
               for c in CHECKS if c.NAME != "pcie")


def test_an_unreadable_kernel_log_leaves_every_subsystem_its_checks_judge_unknown():
    """One KernelLogUnreadable finding stands for xid (gpu), link_events (network), memory_errors (memory),
    storage_errors (storage) and crashes (kernel): none of those conditions may read "no problem"."""
    f = finding("kmsg", Severity.UNKNOWN, "KernelLogUnreadable")
    states = kube_taints.desired_state(report(f), KUBE_DEFAULTS)
    assert {s: (st.status, st.reason, st.effect) for s, st in states.items()} == {
        s: ("Unknown", "KernelLogUnreadable", None) for s in kube_taints.SUBSYSTEMS}
