"""deploy/: the admission policy's CEL on sample requests, manifests against the 1.30 schemas, the base."""
from __future__ import annotations

import copy
import os

import celpy
import kubernetes_validate
import pytest
import yaml
from fake_kube_apiserver import FakeApiServer

from nodehealth import kube
from nodehealth.model import Action, Finding, Report, Severity, Status

DEPLOY = os.path.join(os.path.dirname(__file__), "..", "deploy")
AGENT = "system:serviceaccount:nodehealth:nodehealth"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def load(name: str) -> list[dict]:
    with open(os.path.join(DEPLOY, name), encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def kustomization() -> dict:
    return load("kustomization.yaml")[0]


def manifests() -> list[tuple[str, dict]]:
    return [(name, doc) for name in kustomization()["resources"] for doc in load(name)]


def of_kind(kind: str) -> dict:
    return next(doc for _, doc in manifests() if doc["kind"] == kind)


# -- the ValidatingAdmissionPolicy, evaluated ------------------------------------------------------

class Policy:
    """The policy's CEL run the way the API server runs it: match conditions, variables, validations."""

    def __init__(self) -> None:
        spec = of_kind("ValidatingAdmissionPolicy")["spec"]
        env = celpy.Environment()
        self.match = [env.program(env.compile(m["expression"])) for m in spec["matchConditions"]]
        self.variables = [(v["name"], env.program(env.compile(v["expression"]))) for v in spec["variables"]]
        self.validations = [(v.get("message") or env.program(env.compile(v["messageExpression"])),
                             env.program(env.compile(v["expression"]))) for v in spec["validations"]]

    def admit(self, old: dict, new: dict, user: str = AGENT, node_name: str | None = "gpu-1",
              subresource: str = "") -> str:
        """"not matched", "allowed", or the first failing validation's message."""
        # The API server leaves `extra` out of userInfo when a token carries none (a token that is not
        # node-bound), so the policy must not assume the key exists.
        user_info = {"username": user}
        if node_name is not None:
            user_info["extra"] = {NODE_NAME_EXTRA: [node_name]}
        request = {"operation": "UPDATE", "subResource": subresource, "name": new["metadata"]["name"],
                   "userInfo": user_info}
        activation = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(new),
                      "oldObject": celpy.json_to_cel(old)}
        if not all(bool(p.evaluate(activation)) for p in self.match):
            return "not matched"
        variables = celpy.celtypes.MapType({})
        for name, program in self.variables:  # in order: a variable may use the ones before it
            variables[celpy.celtypes.StringType(name)] = program.evaluate(dict(activation, variables=variables))
        activation["variables"] = variables
        for message, program in self.validations:
            result = program.evaluate(activation)
            if isinstance(result, Exception) or not bool(result):
                return message if isinstance(message, str) else str(message.evaluate(activation))
        return "allowed"


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy()


def sample_node(name: str = "gpu-1") -> dict:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"taints": [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}]},
        "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }


def changed(node: dict, change) -> dict:
    new = copy.deepcopy(node)
    change(new)
    return new


def add_our_taint(n: dict) -> None:
    n["spec"]["taints"].append({"key": "nodehealth.io/gpu", "value": "Xid79FallenOffBus", "effect": "NoSchedule"})
    n["metadata"]["annotations"]["nodehealth.io/applied-taints"] = '[{"key":"nodehealth.io/gpu","effect":"NoSchedule"}]'


def annotate(key: str, value: str | None):
    def change(n: dict) -> None:
        if value is None:
            n["metadata"]["annotations"].pop(key, None)
        else:
            n["metadata"]["annotations"][key] = value
    return change


def with_annotation(key: str, value: str) -> dict:
    return changed(sample_node(), annotate(key, value))


OUR_CONDITION = {"type": "NodeHealthGPUProblem", "status": "True", "reason": "Xid79FallenOffBus"}


@pytest.mark.parametrize("case, old, change, kwargs, want", [
    ("our taint on our node", sample_node(), add_our_taint, {}, "allowed"),
    ("our taint on another node", sample_node("gpu-2"), add_our_taint, {},
     "the nodehealth agent on gpu-1 may only modify its own Node"),
    ("no node-bound token", sample_node(), add_our_taint, {"node_name": None},
     "the nodehealth agent must use a node-bound service account token"),
    ("removing a foreign taint", sample_node(), lambda n: n["spec"].update(taints=[]), {},
     "the nodehealth agent may only add, change or remove nodehealth.io/ taints"),
    ("adding a foreign taint", sample_node(),
     lambda n: n["spec"]["taints"].append({"key": "example.com/x", "effect": "NoSchedule"}), {},
     "the nodehealth agent may only add, change or remove nodehealth.io/ taints"),
    ("a foreign annotation", sample_node(), annotate("example.com/owner", "me"), {},
     "the nodehealth agent may only change nodehealth.io/ annotations"),
    ("removing a foreign annotation", sample_node(), annotate("node.alpha.kubernetes.io/ttl", None), {},
     "the nodehealth agent may only change nodehealth.io/ annotations"),
    ("lifting an operator's hold", with_annotation("nodehealth.io/hold", "ticket 42"),
     annotate("nodehealth.io/hold", None), {}, "the nodehealth.io/hold annotation belongs to operators"),
    ("removing a clear request", with_annotation("nodehealth.io/clear", "reseated"),
     annotate("nodehealth.io/clear", None), {}, "allowed"),
    ("making a clear request", sample_node(), annotate("nodehealth.io/clear", "x"), {},
     "the nodehealth agent may remove a nodehealth.io/clear request but never make one"),
    ("a label", sample_node(), lambda n: n["metadata"]["labels"].update(x="y"), {},
     "the nodehealth agent may not change labels"),
    ("cordoning", sample_node(), lambda n: n["spec"].update(unschedulable=True), {},
     "the nodehealth agent never cordons or uncordons"),
    ("our condition", sample_node(), lambda n: n["status"]["conditions"].append(OUR_CONDITION),
     {"subresource": "status"}, "allowed"),
    ("the kubelet's condition", sample_node(), lambda n: n["status"]["conditions"][0].update(status="False"),
     {"subresource": "status"}, "the nodehealth agent may only write NodeHealth* conditions"),
    ("capacity", sample_node(), lambda n: n["status"]["capacity"].update({"nvidia.com/gpu": "0"}),
     {"subresource": "status"}, "the nodehealth agent may not change the Node's capacity"),
    ("another user", sample_node("gpu-2"), lambda n: n["spec"].update(taints=[]),
     {"user": "system:serviceaccount:kube-system:node-controller"}, "not matched"),
])
def test_admission_policy(policy, case, old, change, kwargs, want):
    assert policy.admit(old, changed(old, change), **kwargs) == want, case


def test_admission_policy_admits_every_write_the_publisher_makes(policy, tmp_path):
    """What the real publisher writes (taints, race retries, hold, clear, conditions) passes the policy."""
    server = FakeApiServer().start()
    try:
        server.add_node("gpu-1", labels={"nvidia.com/gpu.present": "true"},
                        taints=[{"key": "dedicated", "value": "training", "effect": "NoSchedule"}],
                        annotations={"nodehealth.io/clear": "GPU reseated"})
        publisher = kube.Publisher("gpu-1", {"kubeconfig": server.kubeconfig(str(tmp_path / "kc")),
                                             "heartbeat_seconds": 0.0}, on_clear=lambda reason: None)
        xid = Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "GPU fell off the bus.", "0000:3b:00.0",
                      Action.REBOOT)
        server.before_node_write = lambda srv, name: srv.edit_node(
            name, lambda n: n["spec"]["taints"].append({"key": "example.com/drain", "effect": "NoExecute"}))
        for findings in ([xid], [], [xid]):
            publisher.publish(Report("gpu-1", Status.UNHEALTHY if findings else Status.HEALTHY, findings, []))
            assert publisher.sync_once()
        assert {sub for sub, _, _ in server.node_writes} == {"", "status"}
        assert len(server.node_writes) >= 6
        for subresource, old, new in server.node_writes:
            assert policy.admit(old, new, subresource=subresource) == "allowed", (subresource, old, new)
    finally:
        server.close()


# -- schemas and the kustomize base ---------------------------------------------------------------

def test_kustomization_lists_files_that_exist_and_parse():
    k = kustomization()
    assert k["kind"] == "Kustomization"
    for name in k["resources"]:
        docs = load(name)
        assert docs and all("apiVersion" in d and "kind" in d and d["metadata"].get("name") for d in docs), name
    component = yaml.safe_load(open(os.path.join(DEPLOY, "components", "kernel-log-privileged", "kustomization.yaml")))
    assert component["kind"] == "Component"
    image = of_kind("DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert [i["name"] for i in k["images"]] == [image]


@pytest.mark.parametrize("name, doc", manifests(), ids=lambda x: x if isinstance(x, str) else x["kind"])
def test_manifest_validates_against_kubernetes_1_30(name, doc):
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        # A CRD kind: kubernetes-validate bundles only built-in schemas, so check its structure.
        pod_labels = of_kind("DaemonSet")["spec"]["template"]["metadata"]["labels"]
        ports = {p["name"] for p in of_kind("DaemonSet")["spec"]["template"]["spec"]["containers"][0]["ports"]}
        assert doc["kind"] == "PodMonitor" and doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert doc["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert {e["port"] for e in doc["spec"]["podMetricsEndpoints"]} <= ports
        return
    kubernetes_validate.validate(doc, "1.30.0", strict=True)


def test_daemonset_is_the_unprivileged_agent_the_issue_asks_for():
    spec = of_kind("DaemonSet")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    security = container["securityContext"]
    assert security["privileged"] is False and security["readOnlyRootFilesystem"] is True
    assert {"SYS_PTRACE", "IPC_LOCK"} <= set(security["capabilities"]["add"])
    assert security["capabilities"]["drop"] == ["ALL"]
    assert spec["hostPID"] is True and spec["priorityClassName"] == "system-node-critical"
    assert "nvidia.com/gpu" not in str(container["resources"])  # never takes GPUs from jobs
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]
    assert {"name": "NODE_NAME",
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}} in container["env"]
    assert "runtimeClassName" in spec
    assert container["args"][:3] == ["daemon", "--root", "/host"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for path in ("/host/proc", "/host/sys", "/host/dev/kmsg"):
        assert mounts[path]["readOnly"] is True
    assert "readOnly" not in mounts["/var/lib/nodehealth"]
    assert "readOnly" not in mounts["/run/nodehealth/hang"]  # the detector writes Flight Recorder requests there
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    effects = {t["effect"] for t in spec["tolerations"] if t["operator"] == "Exists" and "key" not in t}
    assert effects == {"NoSchedule", "PreferNoSchedule", "NoExecute"}  # its own taints never evict it
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert kube.DEFAULTS["managed_node_selector"] == "nvidia.com/gpu.present=true"  # the breaker counts the same


def test_rbac_is_least_privilege():
    cluster = of_kind("ClusterRole")["rules"]
    assert {(tuple(r["resources"]), tuple(r["verbs"])) for r in cluster} == {
        (("nodes",), ("get", "list", "patch")),
        (("nodes/status",), ("patch",)),
        (("events",), ("create",)),
    }
    role = of_kind("Role")
    assert role["metadata"]["namespace"] == kube.DEFAULTS["breaker_namespace"]
    assert {v for r in role["rules"] for v in r["verbs"]} == {"create", "get", "update"}
    assert [r.get("resourceNames") for r in role["rules"] if "get" in r["verbs"]] == [[kube.DEFAULTS["breaker_name"]]]


def test_service_selects_the_agent_pods():
    pod_labels = of_kind("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    service = of_kind("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_shipped_config_starts_in_dry_run():
    config = yaml.safe_load(of_kind("ConfigMap")["data"]["config.yaml"])
    assert config["kube"]["enabled"] is True and config["kube"]["dry_run"] is True
    assert set(config["kube"]) <= set(kube.DEFAULTS)
