"""Attribution added to GPU findings, and what the faces show of it: pure, table-driven."""
from __future__ import annotations

import json

import kubernetes_validate
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodehealth.attribution.evidence import CHECK, UNAVAILABLE, Lookup, attribute
from nodehealth.attribution.gpus import Assignment, GpuRef, MigDevice, PodRef
from nodehealth.attribution.notices import PodNotice, drain_detail, gpu_pod_info, holders, pod_notices
from nodehealth.attribution.slurm_jobs import JobAssignment, SlurmJob
from nodehealth.exporter import render
from nodehealth.kube import events
from nodehealth.model import Finding, Severity, Status, verdict

NOW = 1_731_567_614.0
UUID3 = "GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14"
MIG_UUIDS = ("MIG-feb88891-0321-5fef-9c87-d4af3b54259e", "MIG-a25704ba-3a06-5299-a795-fd7cf4d13973")
GPUS = (GpuRef(2, "GPU-2d50cdf6-dd67-9f2e-855e-0d4d6d395a2f", "0000:3a:00.0"),
        GpuRef(3, UUID3, "0000:5d:00.0"),
        GpuRef(4, "GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16", "0000:00:05.0",
               (MigDevice(MIG_UUIDS[0], gpu_instance=7), MigDevice(MIG_UUIDS[1], gpu_instance=8))))
TRAINER = PodRef("research", "llm-pretrain-worker-3", "trainer", UUID3)
PODS = Assignment({3: (TRAINER,), 4: (PodRef("serving", "embed-a", "server", MIG_UUIDS[0]),
                                      PodRef("serving", "embed-b", "server", MIG_UUIDS[1]))}, ())


def xid(device: str = "0000:5d:00.0", age: float = 1.0, code: int = 79, **evidence) -> Finding:
    return Finding("xid", Severity.FATAL, f"Xid{code}FallenOffBus", f"GPU {device} logged Xid {code} once.",
                   device=device, evidence=dict({"code": code, "pids": []}, **evidence),
                   first_seen=NOW - age, last_seen=NOW - age)


def lost(device: str = "0000:5d:00.0") -> Finding:  # a state, not an event: no time of its own
    return Finding("gpu_driver", Severity.FATAL, "GpuLost", f"GPU 3 ({device}) is lost.", device=device,
                   evidence={"uuid": UUID3})


def run(findings, pods=PODS, jobs=None, pid_jobs=None, max_age=300.0):
    return attribute(findings, GPUS, Lookup(pods, jobs, pid_jobs or {}), NOW, max_age)


def test_a_fresh_xid_and_a_lost_gpu_name_the_container_that_held_the_gpu():
    out = run([xid(), lost()])
    assert [f.evidence["pods"] for f in out] == [[TRAINER.to_dict()]] * 2
    assert json.loads(json.dumps([f.to_dict() for f in out]))  # the report stays JSON
    assert "pods" not in xid().evidence  # the input is not changed


@pytest.mark.parametrize("case, findings, pods, want_pods, unavailable", [
    ("a GPU nobody held", [xid("0000:3a:00.0")], PODS, [], None),
    ("an event older than the bound: its GPU's users may have changed", [xid(age=3600)], PODS, None, None),
    ("a warning gets the pods too",
     [Finding("xid", Severity.WARNING, "Xid43", "m", device="0000:5d:00.0", last_seen=NOW)],
     PODS, [TRAINER.to_dict()], None),
    ("an info finding is nobody's fault", [Finding("xid", Severity.INFO, "Xid63", "m", device="0000:5d:00.0")],
     PODS, None, None),
    ("a finding about no GPU", [Finding("memory", Severity.FATAL, "X", "m", device="Normal zone of node 0")],
     None, None, None),
    ("the kubelet did not answer", [xid()], "the kubelet did not answer PodResources List within 5 s", None,
     "the kubelet did not answer PodResources List within 5 s"),
    ("ids no GPU here has, and nobody found: not an empty list",
     [xid("0000:3a:00.0")], Assignment({}, ("MIG-a65afc88-50b5-5ccf-b0a8-f93b3247ae9e",)), None,
     "MIG-a65afc88-50b5-5ccf-b0a8-f93b3247ae9e"),
    ("ids no GPU here has, and someone found", [xid()], Assignment(PODS.by_gpu, ("GPU-ad63c684",)),
     [TRAINER.to_dict()], "GPU-ad63c684"),
])
def test_attribute(case, findings, pods, want_pods, unavailable):
    out = run(findings, pods=pods)
    first = out[0]
    assert first.evidence.get("pods") == want_pods, case
    extra = [f for f in out if f.check == CHECK]
    if unavailable is None:
        assert extra == [], case
    else:
        [f] = extra
        assert (f.severity, f.reason, f.device) == (Severity.INFO, UNAVAILABLE, "kubelet"), case
        assert unavailable in f.message and "0000:" in f.message, case


def test_pods_placed_by_elimination_say_so():
    out = run([xid()], pods=Assignment(PODS.by_gpu, (), inferred=(3,)))
    assert out[0].evidence["pods"] == [TRAINER.to_dict()] and out[0].evidence["pods_inferred"] is True
    assert "pods_inferred" not in run([xid()])[0].evidence


def test_attribution_unavailable_never_changes_the_verdict():
    assert verdict(run([xid()], pods="no socket")) is Status.UNHEALTHY
    warning = Finding("xid", Severity.WARNING, "Xid43", "m", device="0000:5d:00.0", last_seen=NOW)
    assert verdict(run([warning], pods="no socket")) is Status.HEALTHY


def test_an_xid_on_a_gpu_instance_names_the_mig_devices_of_that_instance_only():
    out = run([xid("0000:00:05.0", gpu_instances=[8])])
    assert [p["pod"] for p in out[0].evidence["pods"]] == ["embed-b"]
    out = run([xid("0000:00:05.0")])  # the whole GPU
    assert [p["pod"] for p in out[0].evidence["pods"]] == ["embed-a", "embed-b"]


def test_slurm_jobs_by_gres_and_by_the_xids_pid():
    jobs = JobAssignment({3: (SlurmJob("41", "alice", (2,)),)}, ())
    out = run([xid(pids=[7001, 7002])], pods=None, jobs=jobs, pid_jobs={7001: "41", 7002: "57"})
    assert out[0].evidence["slurm_jobs"] == [{"job_id": "41", "user": "alice", "via": ["gres", "pid"]},
                                             {"job_id": "57", "user": None, "via": ["pid"]}]
    assert "pods" not in out[0].evidence
    out = run([xid()], pods=None, jobs="scontrol listpids: slurmctld did not answer")
    [f] = [f for f in out if f.check == CHECK]
    assert f.device == "slurm" and "slurmctld did not answer" in f.message


# -- what the faces show -------------------------------------------------------------------------------

def test_pod_notices_name_the_gpu_and_the_container():
    [notice] = pod_notices(run([xid()]), GPUS)
    assert (notice.namespace, notice.pod, notice.reason, notice.type) == (
        "research", "llm-pretrain-worker-3", "Xid79FallenOffBus", "Warning")
    assert notice.message.startswith(
        f"Xid 79 on GPU 0000:5d:00.0 ({UUID3}) that this pod was using (container trainer): GPU 0000:5d:00.0 logged")
    [notice] = pod_notices(run([lost()]), GPUS)
    assert notice.message.startswith(f"GpuLost on GPU 0000:5d:00.0 ({UUID3}) that this pod was using")
    [a, b] = pod_notices(run([xid("0000:00:05.0")]), GPUS)
    assert f"(container server, MIG device {MIG_UUIDS[0]})" in a.message
    assert a.key != b.key and a.key == pod_notices(run([xid("0000:00:05.0")]), GPUS)[0].key  # stable: post once


def test_pod_notices_are_bounded_and_skip_findings_without_pods():
    long = Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "x" * 5000, device="0000:5d:00.0", last_seen=NOW)
    [notice] = pod_notices(run([long]), GPUS)
    assert len(posted(notice)["message"]) == 1024 and posted(notice)["message"].endswith("x...")
    assert pod_notices(run([xid()], pods="no socket"), GPUS) == []


def posted(notice: PodNotice) -> dict:
    """The Event the Kubernetes publisher posts for a notice."""
    return events.pod_event("gpu-1", notice.namespace, notice.pod, notice.type, notice.reason, notice.message, NOW)


def test_a_pod_event_is_a_valid_core_v1_event_in_the_pods_namespace():
    [notice] = pod_notices(run([xid()]), GPUS)
    event = posted(notice)
    kubernetes_validate.validate(event, "1.30.0", strict=True)
    assert event["metadata"]["namespace"] == "research"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "research",
                                       "name": "llm-pretrain-worker-3"}
    assert event["source"] == {"component": "nodehealth", "host": "gpu-1"} and event["reportingInstance"] == "gpu-1"
    assert len(event["metadata"]["name"]) <= 253


@pytest.mark.parametrize("jobs, want", [
    ([], ""), (["42"], "job 42"), (["41", "42"], "jobs 41,42"),
    ([str(i) for i in range(1, 9)], "jobs 1,2,3,4,5+3"),
])
def test_drain_detail(jobs, want):
    f = xid(slurm_jobs=[{"job_id": j, "user": None, "via": ["gres"]} for j in jobs])
    assert drain_detail(f) == want


@pytest.mark.parametrize("pods, jobs, want", [
    ([], [], ""),
    ([("research", "llm-pretrain-worker-3"), ("research", "llm-pretrain-worker-3")], [],
     "pod research/llm-pretrain-worker-3"),
    ([("team-b", "b"), ("team-a", "a")], ["42"], "pods team-a/a, team-b/b; job 42"),
    ([("ns", f"p{i}") for i in range(7)], [], "pods ns/p0, ns/p1, ns/p2, ns/p3, ns/p4 and 2 more"),
])
def test_holders_for_the_table(pods, jobs, want):
    f = xid(pods=[{"namespace": n, "pod": p, "container": "c", "device": UUID3} for n, p in pods],
            slurm_jobs=[{"job_id": j, "user": None, "via": ["gres"]} for j in jobs])
    assert holders(f) == want


def test_gpu_pod_info_joins_gpus_and_containers():
    [family] = text_string_to_metric_families(render([gpu_pod_info(PODS, GPUS)]).decode())
    assert family.name == "nodehealth_gpu_pod_info"
    assert sorted((s.labels["gpu"], s.labels["namespace"], s.labels["pod"], s.value) for s in family.samples) == [
        ("3", "research", "llm-pretrain-worker-3", 1.0), ("4", "serving", "embed-a", 1.0),
        ("4", "serving", "embed-b", 1.0)]
    trainer = next(s for s in family.samples if s.labels["pod"] == "llm-pretrain-worker-3")
    assert trainer.labels == {"gpu": "3", "uuid": UUID3, "pci_bus_id": "0000:5d:00.0", "namespace": "research",
                              "pod": "llm-pretrain-worker-3", "container": "trainer"}
