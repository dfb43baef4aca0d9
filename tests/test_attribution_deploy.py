"""deploy/components/attribution: built onto the base by kustomize itself, the RBAC it renders, and its
admission policy's CEL run on the Events the agent posts (and on the ones it must not)."""
from __future__ import annotations

import os
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml
from cel_policy import CelPolicy, user_info
from conftest import require_tool

from nodehealth.attribution.defaults import DEFAULTS
from nodehealth.kube import events

DEPLOY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy")
COMPONENT = os.path.join(DEPLOY, "components", "attribution")
AGENT = "system:serviceaccount:nodehealth:nodehealth"
SOCKET_DIR = "/var/lib/kubelet/pod-resources"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> list[dict]:
    """The base with the component, as `kubectl kustomize` builds it."""
    kubectl = require_tool("kubectl")
    top = tmp_path_factory.mktemp("overlay")
    shutil.copytree(DEPLOY, top / "deploy")
    (top / "overlay").mkdir()
    (top / "overlay" / "kustomization.yaml").write_text(
        "resources: [../deploy]\ncomponents: [../deploy/components/attribution]\n")
    out = subprocess.run([kubectl, "kustomize", str(top / "overlay")], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def base_daemonset() -> dict:
    with open(os.path.join(DEPLOY, "daemonset.yaml"), encoding="utf-8") as f:
        return yaml.safe_load(f)


def test_the_component_mounts_only_the_pod_resources_directory_read_only(rendered):
    ds = next(d for d in rendered if d["kind"] == "DaemonSet")
    spec, base = ds["spec"]["template"]["spec"], base_daemonset()["spec"]["template"]["spec"]
    [volume] = [v for v in spec["volumes"] if v["name"] not in {b["name"] for b in base["volumes"]}]
    assert volume == {"name": "pod-resources", "hostPath": {"path": SOCKET_DIR, "type": "Directory"}}
    container, base_container = spec["containers"][0], base["containers"][0]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "pod-resources"]
    assert mount == {"name": "pod-resources", "mountPath": SOCKET_DIR, "readOnly": True}
    assert container["securityContext"] == base_container["securityContext"]  # no new capability
    assert len(container["volumeMounts"]) == len(base_container["volumeMounts"]) + 1
    assert os.path.dirname(DEFAULTS["kubelet_socket"]) == SOCKET_DIR
    for doc in rendered:
        if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(doc, "1.30.0", strict=True)


def agent_rules(docs: list[dict]) -> list[dict]:
    """Every rule of every Role and ClusterRole bound to the agent's service account."""
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in docs if b["kind"] in ("RoleBinding",
                                                                                          "ClusterRoleBinding")
             for s in b.get("subjects", []) if (s["kind"], s["name"], s.get("namespace")) ==
             ("ServiceAccount", "nodehealth", "nodehealth")}
    return [r for d in docs if (d["kind"], d["metadata"]["name"]) in bound for r in d.get("rules", [])]


def test_the_component_adds_event_creation_and_nothing_on_pods(rendered):
    [role] = [d for d in rendered if d["kind"] == "ClusterRole" and d["metadata"]["name"] ==
              "nodehealth-attribution-events"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    for rule in agent_rules(rendered):
        assert not {"pods", "pods/log", "pods/exec", "nodes/proxy", "*"} & set(rule["resources"]), rule
        if "events" in rule["resources"]:
            assert rule["verbs"] == ["create"], rule


class EventPolicy(CelPolicy):
    """The component's policy on the Events the agent writes."""

    def __init__(self, docs: list[dict]):
        super().__init__(docs, "nodehealth-events-own-node-only")

    def admit(self, event: dict, node_name: str | None = "gpu-1", group: str = "", user: str = AGENT) -> str:
        request = {"operation": "CREATE", "userInfo": user_info(user, node_name),
                   "resource": {"group": group, "version": "v1", "resource": "events"}}
        return self.evaluate(request, event)


@pytest.fixture(scope="module")
def policy(rendered) -> EventPolicy:
    return EventPolicy(rendered)


def test_the_policy_matches_event_writes_of_the_agent(policy):
    [rule] = policy.spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["events"] and set(rule["operations"]) == {"CREATE", "UPDATE"}


def node_event(node: str = "gpu-1") -> dict:
    """A Node Event as the publisher posts it (kube/events.py, the one builder of both)."""
    return events.node_event(node, "0b7f0c2e-5d1b-4c3e-9f5a-2a4f6d8e1c3b", "default", "Normal", "NodeHealthCleared",
                             "m", 1_731_567_614.0)


def edited(event: dict, **changes) -> dict:
    out = yaml.safe_load(yaml.safe_dump(event))
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        target = out
        for p in parents:
            target = target[p]
        target[leaf] = value
    return out


POD_EVENT = events.pod_event(
    "gpu-1", "research", "llm-pretrain-worker-3", "Warning", "Xid79FallenOffBus",
    "Xid 79 on GPU 0000:5d:00.0 (GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14) that this pod was using", 1_731_567_614.0)


@pytest.mark.parametrize("case, event, kwargs, want", [
    ("the pod Event attribution posts", POD_EVENT, {}, "allowed"),
    ("the publisher's Node Event", node_event(), {}, "allowed"),
    ("a Node Event about another node", node_event("gpu-2"), {},
     "the nodehealth agent on gpu-1 may only report as gpu-1"),
    ("a Node Event about another node, in its own name", edited(node_event(), involvedObject__name="gpu-2"), {},
     "the nodehealth agent on gpu-1 may only post Events about its own Node"),
    ("a pod Event in another node's name", edited(POD_EVENT, source__host="gpu-2", reportingInstance="gpu-2"), {},
     "the nodehealth agent on gpu-1 may only report as gpu-1"),
    ("a pod Event without a reporting instance", {k: v for k, v in POD_EVENT.items() if k != "reportingInstance"},
     {}, "the nodehealth agent on gpu-1 may only report as gpu-1"),
    ("a pod Event outside the pod's namespace", edited(POD_EVENT, metadata__namespace="kube-system"), {},
     "a Pod Event belongs in the Pod's own namespace"),
    ("an Event about a Service", edited(POD_EVENT, involvedObject__kind="Service"), {},
     "the nodehealth agent posts core/v1 Events about a Node or a Pod only"),
    ("an events.k8s.io Event", POD_EVENT, {"group": "events.k8s.io"},
     "the nodehealth agent posts core/v1 Events about a Node or a Pod only"),
    ("no node-bound token", POD_EVENT, {"node_name": None},
     "the nodehealth agent must use a node-bound service account token"),
    ("the kubelet's own Event", POD_EVENT, {"user": "system:node:gpu-1"}, "not matched"),
])
def test_the_event_policy(policy, case, event, kwargs, want):
    assert policy.admit(event, **kwargs) == want, case
