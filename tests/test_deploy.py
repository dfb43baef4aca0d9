"""deploy/: the admission policy's CEL on sample requests, manifests against the 1.30 schemas, the base."""
from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
import tempfile

import kubernetes_validate
import pytest
import yaml
from cel_policy import CelPolicy, user_info
from conftest import require_tool
from fake_kube_apiserver import FakeApiServer

from nodehealth import config
from nodehealth.kube import publisher as kube_publisher
from nodehealth.kube.defaults import DEFAULTS as KUBE_DEFAULTS
from nodehealth.model import Action, Finding, Report, Severity, Status

DEPLOY = os.path.join(os.path.dirname(__file__), "..", "deploy")
AGENT = "system:serviceaccount:nodehealth:nodehealth"
CONTROLLER = "system:serviceaccount:nodehealth:nodehealth-controller"
COMPONENTS = ("monitoring", "grafana-dashboards", "pingmesh", "hang", "hang-exit-codes", "kernel-log-privileged",
              "metrics-network-policy", "mesh-tls", "metrics-token")
KUBERNETES_VERSIONS = ("1.30.0", "1.32.0", "1.35.0")


def load(name: str) -> list[dict]:
    with open(os.path.join(DEPLOY, name), encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def build(*components: str, files: dict[str, str] | None = None) -> list[dict]:
    """kustomize itself (kubectl kustomize): the base, or an overlay of it with our components and
    `files` (an overlay's kustomization.yaml and what it names), built from a copy of deploy/."""
    return [d for d in yaml.safe_load_all(_build(components, tuple(sorted((files or {}).items())))) if d]


@functools.cache
def _build(components: tuple[str, ...], files: tuple[tuple[str, str], ...]) -> str:
    kubectl = require_tool("kubectl")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(DEPLOY, os.path.join(tmp, "deploy"))
        root = os.path.join(tmp, "deploy")
        if components or files:
            root = os.path.join(tmp, "overlay")
            os.mkdir(root)
            written = dict(files)
            written.setdefault("kustomization.yaml", yaml.safe_dump(
                {"resources": ["../deploy"], "components": [f"../deploy/components/{c}" for c in components]}))
            for name, text in written.items():
                with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                    f.write(text)
        done = subprocess.run([kubectl, "kustomize", root], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout


def manifests(*components: str) -> list[dict]:
    return build(*components)


def of_kind(kind: str, name: str | None = None, docs: list[dict] | None = None) -> dict:
    return next(doc for doc in (manifests() if docs is None else docs)
                if doc["kind"] == kind and name in (None, doc["metadata"]["name"]))


def workloads(docs: list[dict]) -> list[dict]:
    return [doc for doc in docs if doc["kind"] in ("DaemonSet", "Deployment")]


def pod_spec(docs: list[dict], kind: str = "DaemonSet") -> dict:
    return of_kind(kind, docs=docs)["spec"]["template"]["spec"]


def merged_config(docs: list[dict], tmp_path) -> dict:
    """The config the daemon loads: the ConfigMap's files in a directory, read by nodehealth's loader
    as the pods read their mounted ConfigMap (`--config DIR`)."""
    data = of_kind("ConfigMap", docs=docs)["data"]
    source = tmp_path / "config.d"
    source.mkdir(parents=True)
    for name, text in data.items():
        (source / name).write_text(text)
    return config.load(str(source))


# -- the ValidatingAdmissionPolicy, evaluated ------------------------------------------------------

class Policy(CelPolicy):
    """The shipped admission policy named `name`."""

    def __init__(self, name: str = "nodehealth-own-node-only") -> None:
        super().__init__(load("admission-policy.yaml"), name)

    def admit(self, old: dict | None, new: dict, user: str = AGENT, node_name: str | None = "gpu-1",
              subresource: str = "", operation: str = "UPDATE") -> str:
        """"not matched", "allowed", or the first failing validation's message."""
        request = {"operation": operation, "subResource": subresource, "name": new["metadata"]["name"],
                   "userInfo": user_info(user, node_name)}
        return self.evaluate(request, new, old)


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


def lease(name: str, duration: int | None = None) -> dict:
    spec = ({"holderIdentity": "someone"} if duration is None
            else {"holderIdentity": "x", "leaseDurationSeconds": duration})
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "nodehealth"}, "spec": spec}


@pytest.mark.parametrize("case, user, operation, name, duration, want", [
    ("the agents' breaker Lease", AGENT, "CREATE", "nodehealth-quarantine", None, "allowed"),
    ("an agent creating the controller's Lease", AGENT, "CREATE", "nodehealth-controller", 10 ** 9,
     f"{AGENT} may only write the Lease nodehealth-quarantine"),
    ("an agent creating any other Lease", AGENT, "CREATE", "anything", None,
     f"{AGENT} may only write the Lease nodehealth-quarantine"),
    ("the controller's own Lease", CONTROLLER, "CREATE", "nodehealth-controller", 15, "allowed"),
    ("the controller giving its Lease up", CONTROLLER, "UPDATE", "nodehealth-controller", 1, "allowed"),
    ("the controller creating the agents' Lease", CONTROLLER, "CREATE", "nodehealth-quarantine", None,
     f"{CONTROLLER} may only write the Lease nodehealth-controller"),
    ("the controller's Lease for years", CONTROLLER, "UPDATE", "nodehealth-controller", 10 ** 9,
     "a nodehealth Lease lasts at most 60 s"),
    ("another user", "system:serviceaccount:kube-system:x", "CREATE", "nodehealth-controller", 10 ** 9,
     "not matched"),
])
def test_each_service_account_may_write_only_its_own_lease(case, user, operation, name, duration, want):
    """RBAC lets each create any Lease in the namespace; the policy pins it to its own, of bounded duration."""
    new = lease(name, duration)
    old = None if operation == "CREATE" else lease(name, 15)
    assert Policy("nodehealth-own-lease-only").admit(old, new, user=user, node_name=None,
                                                     operation=operation) == want, case


def test_the_lease_policy_names_the_leases_the_code_writes():
    text = " ".join(d["spec"]["variables"][0]["expression"] for d in load("admission-policy.yaml")
                    if d["metadata"]["name"] == "nodehealth-own-lease-only"
                    and d["kind"] == "ValidatingAdmissionPolicy")
    assert f"'{KUBE_DEFAULTS['breaker_name']}'" in text and f"'{PINGMESH['controller_lease']}'" in text


# -- the kustomize base and its components, built by kustomize ---------------------------------------

def validate(doc: dict) -> None:
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_base_needs_no_crd_and_validates_against_kubernetes_1_30_to_1_35():
    docs = manifests()
    assert not [d["kind"] for d in docs if not d["apiVersion"].startswith(
        ("v1", "apps/", "rbac.authorization.k8s.io/", "admissionregistration.k8s.io/", "scheduling.k8s.io/"))]
    assert {d["kind"] for d in docs} == {"Namespace", "PriorityClass", "ServiceAccount", "ClusterRole",
                                        "ClusterRoleBinding", "Role", "RoleBinding", "ValidatingAdmissionPolicy",
                                        "ValidatingAdmissionPolicyBinding", "ConfigMap", "DaemonSet", "Service"}
    for doc in docs:
        validate(doc)


def test_every_component_builds_and_validates():
    docs = build(*COMPONENTS)
    for doc in docs:
        if doc["apiVersion"].startswith(("monitoring.coreos.com/", "cert-manager.io/")):
            continue  # CRDs: test_the_monitoring_component_scrapes_what_the_workloads_serve, test_mesh_tls_...
        validate(doc)
    assert {d["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") for d in docs} == {"nodehealth"}


def test_the_monitoring_component_scrapes_what_the_workloads_serve():
    docs = build("monitoring", "pingmesh")
    monitors = [d for d in docs if d["kind"] == "PodMonitor"]
    assert len(monitors) == 2
    for monitor in monitors:
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        [selected] = [w for w in workloads(docs) if wanted <= w["spec"]["template"]["metadata"]["labels"].items()]
        ports = {p["name"] for p in selected["spec"]["template"]["spec"]["containers"][0]["ports"]}
        assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= ports
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["spec"]["groups"] and rule["metadata"]["namespace"] == "nodehealth"


def test_mesh_tls_and_the_metrics_token_reach_both_workloads_as_their_config_names_them(tmp_path):
    docs = build("monitoring", "pingmesh", "mesh-tls", "metrics-token")
    cfg = merged_config(docs, tmp_path)
    assert cfg["tls"]["enabled"] and cfg["daemon"]["token_file"] == "/etc/nodehealth/token/token"
    tls_dir = os.path.dirname(cfg["tls"]["cert_file"])
    assert {os.path.dirname(cfg["tls"][k]) for k in ("ca_file", "key_file")} == {tls_dir}
    for kind in ("DaemonSet", "Deployment"):
        spec = pod_spec(docs, kind)
        container = spec["containers"][0]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes[mounts[tls_dir]].get("hostPath" if kind == "DaemonSet" else "secret")
        assert volumes[mounts[os.path.dirname(cfg["daemon"]["token_file"])]]["secret"]["secretName"] == \
            "nodehealth-metrics-token"
        probes = [container[p] for p in ("livenessProbe", "readinessProbe") if p in container]
        assert probes and all(p["httpGet"]["scheme"] == "HTTPS" for p in probes)
    [cert] = [d for d in docs if d["kind"] == "Certificate" and not d["spec"].get("isCA")]
    assert cert["spec"]["dnsNames"] == [cfg["tls"]["controller_name"]]
    assert {"server auth", "client auth"} <= set(cert["spec"]["usages"])
    assert cert["spec"]["secretName"] == volumes[mounts[tls_dir]]["secret"]["secretName"]
    for monitor in (d for d in docs if d["kind"] == "PodMonitor"):
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["scheme"] == "https"
        assert endpoint["authorization"]["credentials"]["name"] == "nodehealth-metrics-token"


def test_the_daemonset_carries_only_what_the_base_checks_need():
    spec = pod_spec(manifests())
    container = spec["containers"][0]
    security = container["securityContext"]
    assert security["privileged"] is False and security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(spec.get(k) for k in ("hostPID", "hostIPC", "hostNetwork"))
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    host_paths = {v["name"]: (v["hostPath"]["path"], v["hostPath"]["type"]) for v in spec["volumes"] if "hostPath" in v}
    # The kernel log from the journal (deploy/README.md, "The kernel log"): /var/log must be there, /run/log
    # may be created (a node with a persistent journal only), never /var/log/journal (journald would
    # turn persistent when it appears).
    assert host_paths == {"host-proc": ("/proc", "Directory"), "host-sys": ("/sys", "Directory"),
                          "host-var-log": ("/var/log", "Directory"), "host-run-log": ("/run/log", "DirectoryOrCreate"),
                          "state": ("/var/lib/nodehealth", "DirectoryOrCreate")}
    for path in ("/host/proc", "/host/sys", "/host/var/log", "/host/run/log"):
        assert mounts[path]["readOnly"] is True
    defaults = config.defaults()["collectors"]["kmsg"]
    assert defaults["source"] == "auto" and all("/host" + d.rsplit("/", 1)[0] in mounts
                                                for d in defaults["journal_directories"])
    assert "readOnly" not in mounts["/var/lib/nodehealth"]
    assert "/run/nodehealth/hang" not in mounts
    assert "nvidia.com/gpu" not in str(container["resources"])  # never takes GPUs from jobs
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]
    assert {"name": "NODE_NAME",
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}} in container["env"]
    assert container["args"][:3] == ["daemon", "--root", "/host"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    effects = {t["effect"] for t in spec["tolerations"] if t["operator"] == "Exists" and "key" not in t}
    assert effects == {"NoSchedule", "PreferNoSchedule", "NoExecute"}  # its own taints never evict it


def test_the_agent_listens_on_its_pod_address_only():
    container = pod_spec(manifests())["containers"][0]
    args = container["args"]
    assert args[args.index("--listen") + 1] == "[$(POD_IP)]:9456"
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}} in \
        container["env"]


def test_the_agent_has_its_own_priority_class():
    docs = manifests()
    [priority] = [d for d in docs if d["kind"] == "PriorityClass"]
    assert pod_spec(docs)["priorityClassName"] == priority["metadata"]["name"] == "nodehealth-node-critical"
    assert priority["value"] == 1000000000  # the highest a user-defined class may have
    assert not priority.get("globalDefault")


def test_gpu_operator_conventions_are_defaults():
    spec = pod_spec(manifests())
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert KUBE_DEFAULTS["managed_node_selector"] == "nvidia.com/gpu.present=true"  # the breaker counts the same


def readme_block(after: str) -> str:
    """The first ```yaml block after the line `after` in deploy/README.md."""
    with open(os.path.join(DEPLOY, "README.md"), encoding="utf-8") as f:
        text = f.read()
    rest = text[text.index(after):]
    return rest.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_the_readme_overlay_without_the_gpu_operator_builds_and_changes_one_key(tmp_path):
    kustomization = readme_block("<!-- overlay: without-gpu-operator -->").replace("../../deploy", "../deploy")
    site = readme_block("<!-- overlay: 90-site.yaml -->")
    docs = build(files={"kustomization.yaml": kustomization, "90-site.yaml": site})
    spec = pod_spec(docs)
    assert "runtimeClassName" not in spec
    assert spec["nodeSelector"] == {"example.com/accelerator": "nvidia"}
    cfg = merged_config(docs, tmp_path / "site")
    base = merged_config(manifests(), tmp_path / "base")
    assert cfg["kube"]["managed_node_selector"] == "example.com/accelerator=nvidia"
    cfg["kube"]["managed_node_selector"] = base["kube"]["managed_node_selector"]
    assert cfg == base  # every other key as the base has it
    for doc in docs:
        validate(doc)


def test_a_config_change_renames_the_configmap_so_the_pods_roll(tmp_path):
    overlay = {"kustomization.yaml": yaml.safe_dump({
        "resources": ["../deploy"],
        "configMapGenerator": [{"name": "nodehealth-config", "namespace": "nodehealth", "behavior": "merge",
                                "files": ["90-site.yaml"]}]})}
    names = set()
    for interval in (30, 60):
        docs = build(files=dict(overlay, **{"90-site.yaml": f"daemon:\n  interval_seconds: {interval}\n"}))
        [configmap] = [d for d in docs if d["kind"] == "ConfigMap"]
        volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
        assert volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"]
        assert merged_config(docs, tmp_path / str(interval))["daemon"]["interval_seconds"] == interval
        names.add(configmap["metadata"]["name"])
    assert len(names) == 2 and all(n.startswith("nodehealth-config-") for n in names)


@pytest.mark.parametrize("components, kind", [((), "DaemonSet"), (("pingmesh",), "Deployment")])
def test_the_pods_read_the_configmap_files_as_a_directory(components, kind):
    """No init container merges the files: the daemon and the controller read the mounted ConfigMap's
    directory (`--config DIR`), so the ConfigMap holds config files only."""
    docs = build(*components)
    pod = pod_spec(docs, kind)
    assert "initContainers" not in pod
    [container] = pod["containers"]
    args = container["args"]
    directory = args[args.index("--config") + 1]
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
    assert mount["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mount["name"]]["configMap"]["name"] == of_kind("ConfigMap", docs=docs)["metadata"]["name"]
    assert all(name.endswith(".yaml") for name in of_kind("ConfigMap", docs=docs)["data"])


def test_shipped_config_starts_in_dry_run_with_hang_detection_and_pingmesh_off(tmp_path):
    cfg = merged_config(manifests(), tmp_path)
    assert cfg["kube"]["enabled"] is True and cfg["kube"]["dry_run"] is True
    assert cfg["hang"]["enabled"] is False and cfg["pingmesh"]["enabled"] is False


def test_the_hang_component_adds_exactly_what_hang_detection_needs(tmp_path):
    docs = build("hang")
    spec, base = pod_spec(docs), pod_spec(manifests())
    assert spec["hostPID"] is True
    context = spec["containers"][0]["securityContext"]
    assert context["capabilities"]["add"] == ["SYS_PTRACE", "DAC_READ_SEARCH"]  # the last one its own
    assert not context.get("privileged")
    mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert "readOnly" not in mounts["/run/nodehealth/hang"]  # the detector writes Flight Recorder requests there
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/run/nodehealth/hang"]["name"]]["hostPath"]["path"] == "/run/nodehealth/hang"
    assert len(spec["volumes"]) == len(base["volumes"]) + 1
    assert merged_config(docs, tmp_path)["hang"]["enabled"] is True


def test_the_hang_exit_codes_component_adds_only_net_admin_and_host_network():
    spec, hang = pod_spec(build("hang", "hang-exit-codes")), pod_spec(build("hang"))
    assert spec["hostNetwork"] is True and spec["hostPID"] is True
    context, hang_context = spec["containers"][0]["securityContext"], hang["containers"][0]["securityContext"]
    assert context["capabilities"]["add"] == hang_context["capabilities"]["add"] + ["NET_ADMIN"]
    assert context["capabilities"]["drop"] == ["ALL"] and not context.get("privileged")


def test_the_kernel_log_privileged_component_makes_only_the_agent_privileged():
    docs = build("kernel-log-privileged")
    spec = pod_spec(docs)
    base = copy.deepcopy(pod_spec(manifests()))
    assert spec["containers"][0]["securityContext"]["privileged"] is True
    base["containers"][0]["securityContext"].update(privileged=True, allowPrivilegeEscalation=True)
    # and the device itself, which the agent then opens first (collectors.kmsg.source: auto)
    base["containers"][0]["volumeMounts"].append({"name": "host-kmsg", "mountPath": "/host/dev/kmsg", "readOnly": True})
    base["volumes"].append({"name": "host-kmsg", "hostPath": {"path": "/dev/kmsg", "type": "CharDevice"}})
    assert spec == base  # nothing else changes


def test_the_metrics_network_policy_admits_only_prometheus_to_the_agents_and_the_controllers_port():
    docs = build("metrics-network-policy", "pingmesh")
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for kind in ("DaemonSet", "Deployment"):
        labels = of_kind(kind, docs=docs)["spec"]["template"]["metadata"]["labels"]
        [policy] = [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert policy["spec"]["policyTypes"] == ["Ingress"], labels
        [rule] = policy["spec"]["ingress"]
        assert [p["port"] for p in rule["ports"]] == ["metrics"] and rule["from"]


PINGMESH = config.defaults()["pingmesh"]
PINGMESH_CONFIGMAPS = (PINGMESH["configmap"], PINGMESH["inventory_configmap"])  # verdicts, inventory


def rules(role: dict) -> set[tuple]:
    """(apiGroup, resource, verb, resourceNames) for every combination a role's rules allow."""
    return {(group, resource, verb, tuple(r.get("resourceNames") or ()))
            for r in role["rules"] for group in r["apiGroups"] for resource in r["resources"] for verb in r["verbs"]}


def granted(subject: str, docs: list[dict]) -> set[tuple]:
    """(scope, rule) of everything the RBAC objects bind to `subject` (namespace "" = cluster-wide)."""
    out = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        names = {f"system:serviceaccount:{s['namespace']}:{s['name']}" for s in binding["subjects"]}
        if subject in names:
            role = of_kind(binding["roleRef"]["kind"], binding["roleRef"]["name"], docs)
            scope = binding["metadata"].get("namespace", "") if binding["kind"] == "RoleBinding" else ""
            out |= {(scope, *rule) for rule in rules(role)}
    return out


def test_rbac_is_least_privilege():
    ns = KUBE_DEFAULTS["breaker_namespace"]
    base = {
        ("", "", "nodes", "get", ()), ("", "", "nodes", "list", ()), ("", "", "nodes", "patch", ()),
        ("", "", "nodes/status", "patch", ()),
        ("", "", "events", "create", ()),
        (ns, "coordination.k8s.io", "leases", "create", ()),  # RBAC cannot restrict create by name
        (ns, "coordination.k8s.io", "leases", "get", (KUBE_DEFAULTS["breaker_name"],)),
        (ns, "coordination.k8s.io", "leases", "update", (KUBE_DEFAULTS["breaker_name"],)),
    }
    assert granted(AGENT, manifests()) == base
    # Pingmesh: the agents read the controller's two ConfigMaps (verdicts, inventory), nothing more.
    assert granted(AGENT, build("pingmesh")) == base | {
        (PINGMESH["controller_namespace"], "", "configmaps", "get", PINGMESH_CONFIGMAPS)}


def test_no_rbac_rule_has_a_wildcard():
    for doc in build(*COMPONENTS):
        if doc["kind"] in ("Role", "ClusterRole"):
            for group, resource, verb, names in rules(doc):
                assert "*" not in (group, resource, verb, *names), doc["metadata"]["name"]


def test_the_controller_may_write_only_its_lease_and_its_configmaps():
    ns = PINGMESH["controller_namespace"]
    docs = build("pingmesh")
    assert granted(CONTROLLER, docs) == {
        ("", "", "nodes", "list", ()),  # the managed Nodes, page by page; no get, no write
        (ns, "coordination.k8s.io", "leases", "create", ()),  # RBAC cannot restrict create by name
        (ns, "coordination.k8s.io", "leases", "get", (PINGMESH["controller_lease"],)),
        (ns, "coordination.k8s.io", "leases", "update", (PINGMESH["controller_lease"],)),
        (ns, "", "configmaps", "create", ()),
        (ns, "", "configmaps", "get", PINGMESH_CONFIGMAPS),
        (ns, "", "configmaps", "update", PINGMESH_CONFIGMAPS),
    }
    assert pod_spec(docs, "Deployment")["serviceAccountName"] == "nodehealth-controller"
    # The admission policy stays about the agent alone, exactly as strict as before.
    policy = of_kind("ValidatingAdmissionPolicy", "nodehealth-own-node-only", docs=docs)["spec"]
    assert [m["expression"] for m in policy["matchConditions"]] == [
        "request.userInfo.username == 'system:serviceaccount:nodehealth:nodehealth'"]


def test_the_controller_comes_with_the_pingmesh_component_only():
    assert not [d for d in manifests() if d["metadata"]["name"].startswith("nodehealth-controller")]
    assert not granted(CONTROLLER, manifests())


def test_controller_deployment(tmp_path):
    docs = build("pingmesh")
    deployment = of_kind("Deployment", "nodehealth-controller", docs)
    spec, pod = deployment["spec"], pod_spec(docs, "Deployment")
    container = pod["containers"][0]
    assert spec["replicas"] >= 2 and spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"][
        "labels"].items()
    assert container["args"][0] == "controller"
    assert container["image"] == pod_spec(docs)["containers"][0]["image"] == "ghcr.io/example/nodehealth:0.1.0"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"] and "add" not in security["capabilities"]
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    [port] = container["ports"]
    assert port["containerPort"] == int(PINGMESH["controller_listen"].rpartition(":")[2])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    # The agents' config, from the same ConfigMap.
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"] == {v["name"]: v for v in pod_spec(docs)["volumes"]}["config"]
    assert merged_config(docs, tmp_path)["pingmesh"]["enabled"] is True


def test_the_controller_has_a_disruption_budget_that_keeps_one_replica():
    docs = build("pingmesh")
    [budget] = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    deployment = of_kind("Deployment", "nodehealth-controller", docs)
    assert budget["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"][
        "labels"].items()
    assert budget["spec"]["maxUnavailable"] == 1 < deployment["spec"]["replicas"]


def test_components_with_resources_give_them_the_base_images_and_labels():
    """A component's resources get none of the base's transformers."""
    with open(os.path.join(DEPLOY, "kustomization.yaml")) as f:
        base = yaml.safe_load(f)
    for name in COMPONENTS:
        with open(os.path.join(DEPLOY, "components", name, "kustomization.yaml")) as f:
            component = yaml.safe_load(f)
        if component.get("resources"):
            assert component["labels"] == base["labels"], name
        if any(d["kind"] in ("DaemonSet", "Deployment") for r in component.get("resources", [])
               for d in load(os.path.join("components", name, r))):
            assert component["images"] == base["images"], name


def test_the_daemonset_declares_the_ping_port_and_the_base_stays_off_the_host_network():
    spec = pod_spec(manifests())
    ports = {p["name"]: p["containerPort"] for p in spec["containers"][0]["ports"]}
    assert ports == {"metrics": 9456, "pingmesh": int(PINGMESH["listen"].rpartition(":")[2])}
    assert "hostNetwork" not in spec


def test_the_pingmesh_component_turns_on_host_network_and_the_probe(tmp_path):
    docs = build("pingmesh")
    spec = pod_spec(docs)
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    cfg, base = merged_config(docs, tmp_path / "pingmesh"), merged_config(manifests(), tmp_path / "base")
    assert cfg["pingmesh"]["enabled"] is True
    cfg["pingmesh"]["enabled"] = False
    assert cfg == base


def test_service_selects_the_agent_pods():
    pod_labels = of_kind("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    service = of_kind("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
