"""deploy/: the admission policy's CEL on sample requests, manifests against the 1.30 schemas, the base."""
from __future__ import annotations

import copy
import os
import shutil
import subprocess

import celpy
import kubernetes_validate
import pytest
import yaml
from conftest import require_tool
from fake_kube_apiserver import FakeApiServer

from nodehealth import config
from nodehealth.kube import publisher as kube_publisher
from nodehealth.kube.defaults import DEFAULTS as KUBE_DEFAULTS
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


def of_kind(kind: str, name: str | None = None) -> dict:
    return next(doc for _, doc in manifests() if doc["kind"] == kind and name in (None, doc["metadata"]["name"]))


def workloads() -> list[dict]:
    return [doc for _, doc in manifests() if doc["kind"] in ("DaemonSet", "Deployment")]


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
        publisher = kube_publisher.Publisher("gpu-1", {"kubeconfig": server.kubeconfig(str(tmp_path / "kc")),
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
        # A CRD kind: kubernetes-validate bundles only built-in schemas, so check its structure:
        # it selects the pods of exactly one workload, on a port they have.
        assert doc["kind"] == "PodMonitor" and doc["apiVersion"] == "monitoring.coreos.com/v1"
        wanted = doc["spec"]["selector"]["matchLabels"].items()
        selected = [w for w in workloads() if wanted <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(selected) == 1
        ports = {p["name"] for p in selected[0]["spec"]["template"]["spec"]["containers"][0]["ports"]}
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
    assert KUBE_DEFAULTS["managed_node_selector"] == "nvidia.com/gpu.present=true"  # the breaker counts the same


def test_rbac_is_least_privilege():
    cluster = of_kind("ClusterRole", "nodehealth")["rules"]
    assert {(tuple(r["resources"]), tuple(r["verbs"])) for r in cluster} == {
        (("nodes",), ("get", "list", "patch")),
        (("nodes/status",), ("patch",)),
        (("events",), ("create",)),
    }
    role = of_kind("Role", "nodehealth-breaker")
    assert role["metadata"]["namespace"] == KUBE_DEFAULTS["breaker_namespace"]
    assert {v for r in role["rules"] for v in r["verbs"]} == {"create", "get", "update"}
    assert [r.get("resourceNames") for r in role["rules"] if "get" in r["verbs"]] == [[KUBE_DEFAULTS["breaker_name"]]]
    # Pingmesh: the agents read the controller's two ConfigMaps (verdicts, inventory), nothing more.
    reader = of_kind("Role", "nodehealth-pingmesh-reader")
    assert reader["metadata"]["namespace"] == PINGMESH["controller_namespace"]
    assert rules(reader) == {("", "configmaps", "get", PINGMESH_CONFIGMAPS)}


PINGMESH = config.defaults()["pingmesh"]
PINGMESH_CONFIGMAPS = (PINGMESH["configmap"], PINGMESH["inventory_configmap"])  # verdicts, inventory
CONTROLLER = "system:serviceaccount:nodehealth:nodehealth-controller"


def rules(role: dict) -> set[tuple]:
    """(apiGroup, resource, verb, resourceNames) for every combination a role's rules allow."""
    return {(group, resource, verb, tuple(r.get("resourceNames") or ()))
            for r in role["rules"] for group in r["apiGroups"] for resource in r["resources"] for verb in r["verbs"]}


def granted(subject: str) -> set[tuple]:
    """(scope, rule) of everything the RBAC objects bind to `subject` (namespace "" = cluster-wide)."""
    out = set()
    for _, binding in manifests():
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        names = {f"system:serviceaccount:{s['namespace']}:{s['name']}" for s in binding["subjects"]}
        if subject in names:
            role = of_kind(binding["roleRef"]["kind"], binding["roleRef"]["name"])
            scope = binding["metadata"].get("namespace", "") if binding["kind"] == "RoleBinding" else ""
            out |= {(scope, *rule) for rule in rules(role)}
    return out


def test_no_rbac_rule_has_a_wildcard():
    for _, doc in manifests():
        if doc["kind"] in ("Role", "ClusterRole"):
            for group, resource, verb, names in rules(doc):
                assert "*" not in (group, resource, verb, *names), doc["metadata"]["name"]


def test_the_controller_may_write_only_its_lease_and_its_configmaps():
    ns = PINGMESH["controller_namespace"]
    assert granted(CONTROLLER) == {
        ("", "", "nodes", "list", ()),  # the managed Nodes, page by page; no get, no write
        (ns, "coordination.k8s.io", "leases", "create", ()),  # RBAC cannot restrict create by name
        (ns, "coordination.k8s.io", "leases", "get", (PINGMESH["controller_lease"],)),
        (ns, "coordination.k8s.io", "leases", "update", (PINGMESH["controller_lease"],)),
        (ns, "", "configmaps", "create", ()),
        (ns, "", "configmaps", "get", PINGMESH_CONFIGMAPS),
        (ns, "", "configmaps", "update", PINGMESH_CONFIGMAPS),
    }
    deployment = of_kind("Deployment", "nodehealth-controller")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "nodehealth-controller"
    # The admission policy stays about the agent alone, exactly as strict as before.
    policy = of_kind("ValidatingAdmissionPolicy")["spec"]
    assert [m["expression"] for m in policy["matchConditions"]] == [
        "request.userInfo.username == 'system:serviceaccount:nodehealth:nodehealth'"]


def test_the_agents_may_read_the_verdicts_and_the_inventory_and_write_no_configmap():
    agent = granted(AGENT)
    assert PINGMESH["configmap"] != PINGMESH["inventory_configmap"]
    assert {r for r in agent if r[2] == "configmaps"} == {
        (PINGMESH["controller_namespace"], "", "configmaps", "get", PINGMESH_CONFIGMAPS)}
    assert not {r for r in agent if r[2] == "leases" and PINGMESH["controller_lease"] in r[4]}


def test_controller_deployment():
    spec = of_kind("Deployment", "nodehealth-controller")["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert spec["replicas"] >= 1 and spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"][
        "labels"].items()
    assert container["args"][0] == "controller" and container["image"] == of_kind("DaemonSet")["spec"]["template"][
        "spec"]["containers"][0]["image"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"] and "add" not in security["capabilities"]
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    [port] = container["ports"]
    assert port["containerPort"] == int(PINGMESH["controller_listen"].rpartition(":")[2])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == of_kind("ConfigMap")["metadata"]["name"]  # the agents' config


def test_the_daemonset_declares_the_ping_port_and_the_base_stays_off_the_host_network():
    spec = of_kind("DaemonSet")["spec"]["template"]["spec"]
    ports = {p["name"]: p["containerPort"] for p in spec["containers"][0]["ports"]}
    assert ports == {"metrics": 9456, "pingmesh": int(PINGMESH["listen"].rpartition(":")[2])}
    assert "hostNetwork" not in spec
    config_ = yaml.safe_load(of_kind("ConfigMap")["data"]["config.yaml"])
    assert not config_.get("pingmesh", {}).get("enabled")


def test_the_pingmesh_component_turns_on_host_network_and_the_probe():
    folder = os.path.join(DEPLOY, "components", "pingmesh")
    component = yaml.safe_load(open(os.path.join(folder, "kustomization.yaml")))
    assert component["kind"] == "Component"
    [patch] = [p for p in component["patches"] if "target" in p]
    assert yaml.safe_load(patch["patch"]) == [
        {"op": "add", "path": "/spec/template/spec/hostNetwork", "value": True},
        {"op": "add", "path": "/spec/template/spec/dnsPolicy", "value": "ClusterFirstWithHostNet"}]
    [configmap] = load(os.path.join("components", "pingmesh", "configmap.yaml"))
    assert configmap["metadata"]["name"] == of_kind("ConfigMap")["metadata"]["name"]
    # The whole config.yaml is replaced: it must be the base's with pingmesh enabled, nothing else.
    base = yaml.safe_load(of_kind("ConfigMap")["data"]["config.yaml"])
    assert yaml.safe_load(configmap["data"]["config.yaml"]) == dict(base, pingmesh={"enabled": True})
    kubernetes_validate.validate(configmap, "1.30.0", strict=True)


def build_overlay(tmp_path, component: str) -> list[dict]:
    """kustomize itself: an overlay of the base with one of our components, built."""
    kubectl = require_tool("kubectl")
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text(
        f"resources: [../deploy]\ncomponents: [../deploy/components/{component}]\n")
    out = subprocess.run([kubectl, "kustomize", str(tmp_path / "overlay")], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_an_overlay_with_the_pingmesh_component_builds(tmp_path):
    """kustomize itself: the component applies to the base and the result still validates."""
    docs = build_overlay(tmp_path, "pingmesh")
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    assert daemonset["spec"]["template"]["spec"]["hostNetwork"] is True
    cfg = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["config.yaml"])
    assert cfg["pingmesh"]["enabled"] is True and cfg["kube"]["dry_run"] is True
    for doc in docs:
        if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(doc, "1.30.0", strict=True)


def test_an_overlay_with_the_hang_exit_codes_component_adds_only_net_admin_and_host_network(tmp_path):
    """kustomize itself; the exit listener's needs (tests/test_hang_exits.py) and nothing else widened."""
    daemonset = next(d for d in build_overlay(tmp_path, "hang-exit-codes") if d["kind"] == "DaemonSet")
    spec, base = daemonset["spec"]["template"]["spec"], of_kind("DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["hostPID"] is True
    context, base_context = spec["containers"][0]["securityContext"], base["containers"][0]["securityContext"]
    assert context["capabilities"]["add"] == base_context["capabilities"]["add"] + ["NET_ADMIN"]
    assert context["capabilities"]["drop"] == ["ALL"] and not context.get("privileged")
    kubernetes_validate.validate(daemonset, "1.30.0", strict=True)


def test_service_selects_the_agent_pods():
    pod_labels = of_kind("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    service = of_kind("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_shipped_config_starts_in_dry_run():
    config = yaml.safe_load(of_kind("ConfigMap")["data"]["config.yaml"])
    assert config["kube"]["enabled"] is True and config["kube"]["dry_run"] is True
    assert set(config["kube"]) <= set(KUBE_DEFAULTS)
