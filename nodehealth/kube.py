"""The Kubernetes face: the node verdict as taints, conditions and Events the scheduler can trust.

The daemon calls `Publisher.publish(report)` after each full pass; a background thread turns the
latest report into per-subsystem taints (`nodehealth.io/gpu`, ...), `NodeHealth<Subsystem>Problem`
conditions and Events, and converges with backoff whenever the API server is away. This is the
only module that imports `kubernetes`, and only inside ClientApi, so importing it is cheap.
It also carries what the pingmesh controller (nodehealth/controller.py) needs from the API, and
reads the controller's verdicts back for the agent: a verdict about a node reaches its Node only
as a finding of that node's own agent.

Why the care: `spec.taints` has no merge key, so every taint write is read-modify-write guarded
by the node's resourceVersion (a stale one is a 409 and we read again), and the agent changes
only the taints it recorded as its own in an annotation, and only ever keys in its domain.
"""
from __future__ import annotations

import json
import logging
import math
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from nodehealth.config import KUBE_DEFAULTS
from nodehealth.model import Finding, Metric, Report, Severity, sort_findings
from nodehealth.probe import inventory, verdicts
from nodehealth.worker import Worker

log = logging.getLogger("nodehealth.kube")

DEFAULTS = KUBE_DEFAULTS  # kept in config.py, so `nodehealth check` need not import this module

SUBSYSTEMS = ("gpu", "network", "memory", "storage", "kernel")
CONDITION_NAMES = {"gpu": "GPU", "network": "Network", "memory": "Memory", "storage": "Storage",
                   "kernel": "Kernel"}
CHECK_SUBSYSTEMS = {
    "xid": "gpu", "gpu_driver": "gpu", "gpu_memory": "gpu", "nvlink": "gpu", "nvlink_errors": "gpu",
    "gpu_pcie": "gpu", "clocks": "gpu",
    "infiniband": "network", "link_events": "network", "pingmesh": "network", "nic_health": "network",
    "rdma_bw": "network",
    "gpu_nic": "network",  # a GPU far from its RDMA NIC slows GPUDirect RDMA, i.e. the network
    "memory": "memory", "thp": "memory", "memlock": "memory", "memory_errors": "memory", "edac": "memory",
    "mounts": "storage", "storage_errors": "storage",
    "kernel": "kernel", "modules": "kernel", "crashes": "kernel",
}
PCIE_KIND_SUBSYSTEMS = {"gpu": "gpu", "nvswitch": "gpu", "nic": "network", "nvme": "storage"}
QUARANTINE_EFFECTS = ("NoSchedule", "NoExecute")
MAX_MESSAGE_CHARS = 1024
MAX_PENDING_EVENTS = 100
# Nodes per list page: 10,000 Nodes never arrive as one response (each Node, with its image list
# and managed fields, can be tens of KiB). A consistent read, not resourceVersion=0: the watch
# cache of older API servers ignores `limit` for that and answers with everything at once.
LIST_PAGE_SIZE = 500
# A ConfigMap holds at most 1 MiB of data; its JSON (base64 binaryData, metadata, managed fields)
# stays well below this. Anything larger is not read into memory.
MAX_CONFIGMAP_RESPONSE_BYTES = 2 << 20


def subsystem_of(f: Finding) -> str:
    """The subsystem a finding taints; PCIe findings follow the device's kind when it is known."""
    if f.check == "pcie":
        return PCIE_KIND_SUBSYSTEMS.get(str(f.evidence.get("kind", "")), "kernel")
    return CHECK_SUBSYSTEMS.get(f.check, "kernel")


def condition_type(subsystem: str) -> str:
    return f"NodeHealth{CONDITION_NAMES[subsystem]}Problem"


@dataclass(frozen=True)
class SubsystemState:
    """What one subsystem should look like on the Node."""

    status: str  # condition status: "True" (a problem), "False" or "Unknown"
    reason: str
    message: str
    effect: str | None  # taint effect, or None for no taint


def desired_state(report: Report, cfg: dict[str, Any]) -> dict[str, SubsystemState]:
    """Per subsystem: the worst finding decides the condition and the taint."""
    worst: dict[str, list[Finding]] = {s: [] for s in SUBSYSTEMS}
    for f in sort_findings(report.findings):
        worst[subsystem_of(f)].append(f)
    noexecute = set(cfg["noexecute_subsystems"])
    out = {}
    for subsystem, findings in worst.items():
        top = findings[0] if findings else None
        if top is None or top.severity.rank < Severity.UNKNOWN.rank:
            out[subsystem] = SubsystemState("False", "NoProblem",
                                            f"nodehealth found no {CONDITION_NAMES[subsystem]} problem.", None)
            continue
        message = top.message
        if len(findings) > 1:
            message += f" ({len(findings) - 1} more {CONDITION_NAMES[subsystem]} findings in the nodehealth report.)"
        effect = None
        status = "True"
        if top.severity is Severity.FATAL:
            effect = "NoExecute" if subsystem in noexecute else "NoSchedule"
        elif top.severity is Severity.DEGRADED:
            effect = "PreferNoSchedule"
        else:
            status = "Unknown"
        out[subsystem] = SubsystemState(status, top.reason, message[:MAX_MESSAGE_CHARS], effect)
    return out


def taint_value(reason: str) -> str:
    """A reason as a valid label value: at most 63 characters of [A-Za-z0-9._-], alphanumeric ends."""
    value = re.sub(r"[^A-Za-z0-9._-]", "", reason)[:63]
    return value.strip("._-")


class KubeError(Exception):
    """An API call that did not succeed; `kind` is a bounded label for the error metric."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def error_kind(status: int) -> str:
    if status == 0:  # the client's own failure to talk to the server (e.g. TLS)
        return "unreachable"
    if status == 401:
        return "unauthorized"
    if status == 403:
        return "forbidden"
    if status == 404:
        return "not_found"
    if status == 409:
        return "conflict"
    if status == 429:
        return "throttled"
    if status >= 500:
        return "server_error"
    return "client_error"


class KubeApi(Protocol):
    """The narrow interface the publisher needs; objects are plain dicts in the API's JSON shape."""

    def get_node(self, name: str) -> dict[str, Any]: ...

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Strategic-merge patch; `metadata.resourceVersion` in the patch makes it conditional."""

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...

    def create_event(self, namespace: str, event: dict[str, Any]) -> None: ...

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]: ...

    def update_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        """PUT; the lease's `metadata.resourceVersion` makes it a compare-and-swap (409 if stale)."""

    def count_nodes(self, label_selector: str) -> int: ...

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        """Every matching Node, cut down to name, labels, annotations and addresses; read page by page."""

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """None when there is none; a response over MAX_CONFIGMAP_RESPONSE_BYTES is KubeError("too_large")."""

    def create_configmap(self, namespace: str, configmap: dict[str, Any]) -> dict[str, Any]: ...

    def replace_configmap(self, namespace: str, configmap: dict[str, Any]) -> dict[str, Any]:
        """PUT; the ConfigMap's `metadata.resourceVersion` makes it a compare-and-swap (409 if stale)."""


def require_client() -> None:
    """The `kubernetes` package, or one KubeError that names the extra installing it (no traceback)."""
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        raise KubeError("config", "the kubernetes package is not installed; install it with "
                                  "pip install 'nodehealth[k8s]'") from None


class ClientApi:
    """KubeApi over the official `kubernetes` client: in-cluster config, else a kubeconfig."""

    def __init__(self, kubeconfig: str = "", timeout_seconds: float = 10.0):
        require_client()
        from kubernetes import client, config

        configuration = client.Configuration()
        try:
            if kubeconfig:
                config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            else:
                try:
                    config.load_incluster_config(client_configuration=configuration)
                except config.ConfigException:
                    config.load_kube_config(client_configuration=configuration)
        except (config.ConfigException, OSError, TypeError, ValueError) as e:
            raise KubeError("config", f"no usable Kubernetes client configuration: {e}") from None
        configuration.retries = 0  # our own backoff decides when to try again
        api_client = client.ApiClient(configuration)
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.timeout = timeout_seconds

    def _call(self, method: Callable[..., Any], *args: Any, max_bytes: int | None = None, **kwargs: Any) -> Any:
        import urllib3
        from kubernetes.client.rest import ApiException

        try:
            response = method(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
            if max_bytes is None:
                data = response.data
            else:
                data = response.read(max_bytes + 1)
                if len(data) > max_bytes:
                    response.close()  # the rest is never read; the connection goes with it
                    raise KubeError("too_large", f"the API server's answer is over {max_bytes} bytes")
                response.release_conn()
            return json.loads(data) if data else None
        except ApiException as e:
            raise KubeError(error_kind(int(e.status or 0)), f"{e.status} {e.reason}: {_status_message(e.body)}") \
                from None
        except urllib3.exceptions.MaxRetryError as e:
            raise KubeError(_network_kind(e.reason), f"API server unreachable: {e.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeError(_network_kind(e), f"API server unreachable: {e}") from None
        except ValueError as e:
            raise KubeError("invalid", f"API server answered with a body that is not JSON: {e}") from None

    def get_node(self, name: str) -> dict[str, Any]:
        return self._call(self.core.read_node, name)

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.core.patch_node, name, patch)

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.core.patch_node_status, name, patch)

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        self._call(self.core.create_namespaced_event, namespace, event)

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call(self.coordination.read_namespaced_lease, name, namespace)
        except KubeError as e:
            if e.kind == "not_found":
                return None
            raise

    def create_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.coordination.create_namespaced_lease, namespace, lease)

    def update_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.coordination.replace_namespaced_lease, lease["metadata"]["name"], namespace, lease)

    def count_nodes(self, label_selector: str) -> int:
        return sum(len(items) for items in self._node_pages(label_selector))

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        nodes = []
        for items in self._node_pages(label_selector):
            for node in items:  # each page's full Nodes are dropped once cut down
                meta, status = node.get("metadata") or {}, node.get("status") or {}
                nodes.append({"metadata": {"name": meta.get("name"), "labels": meta.get("labels") or {},
                                           "annotations": meta.get("annotations") or {}},
                              "status": {"addresses": status.get("addresses") or []}})
        return nodes

    def _node_pages(self, label_selector: str) -> Iterator[list[dict[str, Any]]]:
        token = None
        while True:
            kwargs: dict[str, Any] = {"label_selector": label_selector, "limit": LIST_PAGE_SIZE}
            if token:
                kwargs["_continue"] = token
            page = self._call(self.core.list_node, **kwargs)
            yield page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The matching pods cut down to what `netcheck job` needs: name, labels, annotations,
        deletion, phase and IP; read page by page."""
        pods, token = [], None
        while True:
            kwargs: dict[str, Any] = {"label_selector": label_selector, "limit": LIST_PAGE_SIZE}
            if token:
                kwargs["_continue"] = token
            page = self._call(self.core.list_namespaced_pod, namespace, **kwargs)
            for pod in page.get("items") or []:
                meta, status = pod.get("metadata") or {}, pod.get("status") or {}
                pods.append({"metadata": {k: meta.get(k) for k in ("name", "labels", "annotations",
                                                                   "deletionTimestamp")},
                             "status": {"phase": status.get("phase"), "podIP": status.get("podIP")}})
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return pods

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call(self.core.read_namespaced_config_map, name, namespace,
                              max_bytes=MAX_CONFIGMAP_RESPONSE_BYTES)
        except KubeError as e:
            if e.kind == "not_found":
                return None
            raise

    def create_configmap(self, namespace: str, configmap: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.core.create_namespaced_config_map, namespace, configmap)

    def replace_configmap(self, namespace: str, configmap: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.core.replace_namespaced_config_map, configmap["metadata"]["name"], namespace,
                          configmap)


def _network_kind(error: Any) -> str:
    """"timeout" for a server that did not answer in time, else "unreachable"."""
    import urllib3

    if isinstance(error, urllib3.exceptions.NewConnectionError):  # a subclass of ConnectTimeoutError
        return "unreachable"
    if isinstance(error, (urllib3.exceptions.TimeoutError, TimeoutError)):
        return "timeout"
    return "unreachable"


def _status_message(body: Any) -> str:
    """The message of a Kubernetes Status body, or the body itself, shortened."""
    try:
        return str(json.loads(body).get("message", ""))[:300]
    except (TypeError, ValueError, AttributeError):
        return str(body or "")[:300]


def _now_rfc3339(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


def micro_time(now: float) -> str:
    """A Lease's MicroTime: RFC 3339 in UTC with microseconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


# -- the quarantine circuit breaker --------------------------------------------------------------


class Breaker:
    """A cluster-wide cap on nodes quarantined (NoSchedule/NoExecute) by nodehealth at once.

    The set of quarantined node names lives in a Lease's annotations, changed only by
    compare-and-swap on its resourceVersion. Once a node is refused a slot the breaker is tripped
    and refuses every new node until an operator resets it (annotation `<domain>breaker-reset`
    on the Lease, or reset_breaker()).
    """

    def __init__(self, cfg: dict[str, Any], node: str):
        self.cfg = cfg
        self.node = node
        self.namespace = cfg["breaker_namespace"]
        self.name = cfg["breaker_name"]
        self.quarantined_key = cfg["domain"] + "quarantined"
        self.tripped_key = cfg["domain"] + "breaker-tripped"
        self.reset_key = cfg["domain"] + "breaker-reset"
        self.managed: int | None = None
        self.managed_at = -math.inf
        self.read_at = -math.inf
        # What the last read of the Lease showed, for the metrics.
        self.tripped: bool | None = None
        self.members: list[str] | None = None

    def cap(self) -> int:
        return max(1, int(self.cfg["max_quarantined_fraction"] * (self.managed or 0)))

    def refresh_managed(self, api: KubeApi) -> None:
        if time.monotonic() - self.managed_at < self.cfg["managed_nodes_refresh_seconds"]:
            return
        self.managed = api.count_nodes(self.cfg["managed_node_selector"])
        self.managed_at = time.monotonic()

    def admit(self, api: KubeApi, already_quarantined: bool, dry_run: bool) -> bool:
        """May this node hold a quarantine taint? Takes a slot (CAS) when it may."""
        self.refresh_managed(api)
        for _ in range(self.cfg["conflict_retries"]):
            lease = self._read(api, create=not dry_run, dry_run=dry_run)
            members = self._members(lease)
            tripped = bool(self._annotations(lease).get(self.tripped_key))
            if self.node in members:
                return True
            if not already_quarantined and (tripped or len(members) >= self.cap()):
                if not tripped and not dry_run:
                    why = (f"{self.node} needed a quarantine slot with {len(members)} of {self.cap()} in use "
                           f"at {_now_rfc3339(time.time())}")
                    if not self._write(api, lease, members, why):
                        continue
                    log.warning("quarantine circuit breaker tripped: %s", why)
                self.tripped = True
                return False
            if dry_run or self._write(api, lease, sorted(members + [self.node]), None if not tripped else "keep"):
                return True
        raise KubeError("conflict", f"Lease {self.namespace}/{self.name} kept changing under us")

    def release(self, api: KubeApi) -> None:
        """Give this node's slot back (its quarantine taints are gone)."""
        for _ in range(self.cfg["conflict_retries"]):
            lease = self._read(api, create=False, dry_run=False)
            members = self._members(lease)
            if self.node not in members:
                return
            tripped = "keep" if self._annotations(lease).get(self.tripped_key) else None
            if self._write(api, lease, [m for m in members if m != self.node], tripped):
                return
        raise KubeError("conflict", f"Lease {self.namespace}/{self.name} kept changing under us")

    def observe(self, api: KubeApi, dry_run: bool) -> None:
        """Now and then, read the Lease for the metrics and act on an operator's reset."""
        if time.monotonic() - self.read_at < self.cfg["managed_nodes_refresh_seconds"]:
            return
        self.refresh_managed(api)
        self._read(api, create=False, dry_run=dry_run)

    def holds_slot(self) -> bool:
        """Whether the last read showed this node holding a slot (True when not read yet)."""
        return self.members is None or self.node in self.members

    def _read(self, api: KubeApi, create: bool, dry_run: bool) -> dict[str, Any]:
        """The Lease (created when `create`); acts on an operator's reset unless `dry_run`."""
        lease = api.get_lease(self.namespace, self.name)
        if lease is None and create:
            try:
                lease = api.create_lease(self.namespace, self._new_lease())
            except KubeError as e:
                if e.kind != "conflict":  # AlreadyExists: someone else created it first
                    raise
                lease = api.get_lease(self.namespace, self.name)
        lease = lease or self._new_lease()
        annotations = self._annotations(lease)
        if annotations.get(self.reset_key) and not dry_run and lease["metadata"].get("resourceVersion"):
            log.warning("quarantine circuit breaker reset by an operator (%s)", annotations[self.reset_key])
            if self._write(api, lease, self._members(lease), None):
                lease = api.get_lease(self.namespace, self.name) or lease
        self.members = self._members(lease)
        self.tripped = bool(self._annotations(lease).get(self.tripped_key))
        self.read_at = time.monotonic()
        return lease

    def _new_lease(self) -> dict[str, Any]:
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "annotations": {self.quarantined_key: "[]"}},
                "spec": {"holderIdentity": self.node}}

    def _annotations(self, lease: dict[str, Any]) -> dict[str, str]:
        return (lease.get("metadata") or {}).get("annotations") or {}

    def _members(self, lease: dict[str, Any]) -> list[str]:
        try:
            names = json.loads(self._annotations(lease).get(self.quarantined_key) or "[]")
        except ValueError:
            log.error("Lease %s/%s: annotation %s is not a JSON list; treating it as empty",
                      self.namespace, self.name, self.quarantined_key)
            return []
        return sorted(str(n) for n in names) if isinstance(names, list) else []

    def _write(self, api: KubeApi, lease: dict[str, Any], members: list[str], tripped: str | None) -> bool:
        """CAS the Lease to `members` and the tripped state ("keep": leave it as it is); False on a 409."""
        body = json.loads(json.dumps(lease))
        annotations = body["metadata"].setdefault("annotations", {})
        annotations[self.quarantined_key] = json.dumps(members, separators=(",", ":"))
        annotations[f"{self.cfg['domain']}quarantine-cap"] = str(self.cap())
        if tripped is None:
            annotations.pop(self.tripped_key, None)
            annotations.pop(self.reset_key, None)
        elif tripped != "keep":
            annotations[self.tripped_key] = tripped
        body["spec"] = dict(body.get("spec") or {}, holderIdentity=self.node, renewTime=micro_time(time.time()))
        try:
            if body["metadata"].get("resourceVersion"):
                api.update_lease(self.namespace, body)
            else:
                api.create_lease(self.namespace, body)
        except KubeError as e:
            if e.kind == "conflict":
                return False
            raise
        self.members = members
        self.tripped = bool(annotations.get(self.tripped_key))
        return True


def reset_breaker(cfg: dict[str, Any], api: KubeApi | None = None) -> str:
    """An operator's reset (for `nodehealth breaker reset`): untrip the breaker, keep its members.

    Returns a line to print. Raises KubeError when the API cannot be reached.
    """
    cfg = dict(DEFAULTS, **cfg)
    api = api or ClientApi(cfg["kubeconfig"], cfg["request_timeout_seconds"])
    breaker = Breaker(cfg, node="operator")
    for _ in range(cfg["conflict_retries"]):
        lease = api.get_lease(breaker.namespace, breaker.name)
        if lease is None:
            return f"no Lease {breaker.namespace}/{breaker.name}: the breaker has never been used"
        members = breaker._members(lease)
        if breaker._write(api, lease, members, None):
            return (f"breaker reset; {len(members)} node(s) still hold quarantine slots: "
                    f"{', '.join(members) or 'none'}")
    raise KubeError("conflict", f"Lease {breaker.namespace}/{breaker.name} kept changing; try again")


# -- the pingmesh controller's ConfigMaps, as an agent reads them ----------------------------------


def read_verdicts(api: KubeApi, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The controller's verdicts (validated, see probe/verdicts.py), or None while it has written none.

    `cfg` is the `pingmesh` section. Raises KubeError: the API's errors, and kind "invalid" for a
    document that fails validation (treat it like no document; never act on part of it).
    """
    data = _pingmesh_configmap(api, cfg, "configmap").get("data") or {}
    if verdicts.VERDICTS_KEY not in data:
        return None
    try:
        return verdicts.parse_verdicts(str(data[verdicts.VERDICTS_KEY]))
    except verdicts.VerdictError as e:
        raise KubeError("invalid", f"ConfigMap {cfg['controller_namespace']}/{cfg['configmap']}: {e}") from None


def read_inventory(api: KubeApi, cfg: dict[str, Any]) -> inventory.Inventory | None:
    """The inventory the controller built from the Nodes (bad entries in its problems), or None while it
    has written none. It has a ConfigMap of its own (`inventory_configmap`): the agents read the
    verdicts every window, this one only every `refresh_seconds`. Raises KubeError as read_verdicts does."""
    binary = _pingmesh_configmap(api, cfg, "inventory_configmap").get("binaryData") or {}
    if verdicts.INVENTORY_KEY not in binary:
        return None
    try:
        return verdicts.decode_inventory(str(binary[verdicts.INVENTORY_KEY]))
    except verdicts.VerdictError as e:
        raise KubeError("invalid", f"ConfigMap {cfg['controller_namespace']}/{cfg['inventory_configmap']}: "
                                   f"{e}") from None


def _pingmesh_configmap(api: KubeApi, cfg: dict[str, Any], key: str) -> dict[str, Any]:
    """The ConfigMap named by the `pingmesh` setting `key`, or {} while there is none."""
    configmap = api.get_configmap(cfg["controller_namespace"], cfg[key])
    return configmap if isinstance(configmap, dict) else {}


# -- the publisher --------------------------------------------------------------------------------


class Publisher(Worker):
    """Keeps the Node in line with the latest report, from a background thread, never blocking.

    publish() only records the desired state and wakes the thread; nothing is written before the
    first publish(), so a restart never clears a problem before the first full pass has run.
    """

    THREAD_NAME = "kube"

    def __init__(self, node_name: str, cfg: dict[str, Any], api: KubeApi | None = None,
                 on_clear: Callable[[str], None] | None = None):
        self.node = node_name
        self.cfg = dict(DEFAULTS, **cfg)
        self.domain = self.cfg["domain"]
        self.dry_run = bool(self.cfg["dry_run"])
        self.on_clear = on_clear
        self._api = api
        self.breaker = Breaker(self.cfg, node_name) if self.cfg["breaker_enabled"] else None
        super().__init__()
        self._desired: dict[str, SubsystemState] | None = None
        self._dirty = False
        self._failures = 0
        self._retry_at = 0.0
        self._next_resync = 0.0
        self._last_heartbeat = -math.inf
        self._pending_events: list[dict[str, Any]] = []
        self._withheld: set[str] = set()
        # What the metrics show.
        self.errors: dict[str, int] = {}
        self.last_sync: float | None = None
        self.applied: dict[str, str] = {}  # our taints on the node: subsystem -> effect
        self.hold = False

    @property
    def applied_key(self) -> str:
        return self.domain + "applied-taints"

    # -- the daemon's side ---------------------------------------------------------------------
    def publish(self, report: Report) -> None:
        desired = desired_state(report, self.cfg)
        with self._lock:
            self._desired = desired
            self._dirty = True
        self._wake.set()

    # -- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._wait_seconds())
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._due():
                self.sync_once()

    def _wait_seconds(self) -> float | None:
        now = time.monotonic()
        with self._lock:
            if self._desired is None:
                return None
            if self._retry_at > now:
                return self._retry_at - now
            if self._dirty:
                return 0.0
        return max(0.0, self._next_resync - now)

    def _due(self) -> bool:
        now = time.monotonic()
        with self._lock:
            return self._desired is not None and now >= self._retry_at and (self._dirty or now >= self._next_resync)

    def sync_once(self) -> bool:
        """One attempt to converge; errors are counted and retried with backoff, never raised."""
        with self._lock:
            desired = self._desired
            self._dirty = False
        if desired is None:
            return False
        try:
            self._sync(desired)
        except KubeError as e:
            self._failed(e.kind, str(e))
            return False
        except Exception as e:  # a bug must not stop the daemon's checks; count it and retry
            log.exception("Kubernetes publish failed")
            self._failed("internal", str(e))
            return False
        with self._lock:
            self._failures = 0
            self._retry_at = 0.0
            self._next_resync = time.monotonic() + min(self.cfg["resync_seconds"], self.cfg["heartbeat_seconds"])
            self.last_sync = time.time()
        return True

    def _failed(self, kind: str, message: str) -> None:
        with self._lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1
            self._failures += 1
            base = min(self.cfg["retry_max_seconds"],
                       self.cfg["retry_initial_seconds"] * 2 ** min(self._failures - 1, 30))
            delay = base * random.uniform(0.5, 1.0)
            self._retry_at = time.monotonic() + delay
            self._dirty = True
        log.warning("Kubernetes publish for node %s failed (%s): %s; retrying in %.1fs",
                    self.node, kind, message, delay)

    def _client(self) -> KubeApi:
        if self._api is None:
            self._api = ClientApi(self.cfg["kubeconfig"], self.cfg["request_timeout_seconds"])
        return self._api

    # -- one sync ------------------------------------------------------------------------------
    def _sync(self, desired: dict[str, SubsystemState]) -> None:
        api = self._client()
        node = api.get_node(self.node)
        node = self._honour_clear(api, node)
        node = self._sync_conditions(api, node, desired)
        self._sync_taints(api, node, desired)
        if self.breaker is not None:
            self.breaker.observe(api, self.dry_run)
        self._flush_events(api)

    def _honour_clear(self, api: KubeApi, node: dict[str, Any]) -> dict[str, Any]:
        """An operator's `<domain>clear=<reason>` annotation: tell the daemon, drop it, record it."""
        key = self.domain + "clear"
        reason = _annotations(node).get(key)
        if reason is None:
            return node
        if self.dry_run:
            log.info("dry-run: would clear sticky findings (%s) and remove annotation %s", reason, key)
            return node
        if self.on_clear is not None:
            self.on_clear(reason or "cleared by an annotation")
        node = api.patch_node(self.node, {"metadata": {"annotations": {key: None}}})
        self._event(node, "Normal", "NodeHealthCleared",
                    f"An operator cleared nodehealth's sticky findings: {reason or 'no reason given'}.")
        return node

    def _sync_conditions(self, api: KubeApi, node: dict[str, Any],
                         desired: dict[str, SubsystemState]) -> dict[str, Any]:
        """Write the conditions when they change or a heartbeat is due; returns the node as now stored."""
        existing = {c.get("type"): c for c in (node.get("status") or {}).get("conditions") or []}
        now = time.time()
        stamp = _now_rfc3339(now)
        conditions, transitions, changed = [], [], False
        for subsystem in SUBSYSTEMS:
            want = desired[subsystem]
            ctype = condition_type(subsystem)
            old = existing.get(ctype) or {}
            flipped = old.get("status") != want.status
            if flipped or old.get("reason") != want.reason or old.get("message") != want.message:
                changed = True
            if (flipped or old.get("reason") != want.reason) and (old or want.status != "False"):
                transitions.append((subsystem, want))
            conditions.append({"type": ctype, "status": want.status, "reason": want.reason,
                               "message": want.message, "lastHeartbeatTime": stamp,
                               "lastTransitionTime": stamp if flipped else old.get("lastTransitionTime", stamp)})
        if not changed and time.monotonic() - self._last_heartbeat < self.cfg["heartbeat_seconds"]:
            return node
        if self.dry_run:
            for subsystem, want in transitions:
                log.info("dry-run: would set %s=%s (%s): %s", condition_type(subsystem), want.status,
                         want.reason, want.message)
        else:
            node = api.patch_node_status(self.node, {"status": {"conditions": conditions}})
            for subsystem, want in transitions:
                self._transition_event(node, subsystem, want)
        self._last_heartbeat = time.monotonic()
        return node

    def _transition_event(self, node: dict[str, Any], subsystem: str, want: SubsystemState) -> None:
        name = CONDITION_NAMES[subsystem]
        if want.status == "False":
            self._event(node, "Normal", f"NodeHealth{name}Recovered", f"nodehealth found no {name} problem anymore.")
        else:
            self._event(node, "Warning", want.reason, want.message)

    # -- taints --------------------------------------------------------------------------------
    def _sync_taints(self, api: KubeApi, node: dict[str, Any], desired: dict[str, SubsystemState]) -> None:
        wanted = {s: st for s, st in desired.items() if st.effect is not None}
        for attempt in range(self.cfg["conflict_retries"]):
            if attempt:
                node = api.get_node(self.node)
            admitted = self._admit(api, node, wanted)
            body = self._taint_patch(node, admitted)
            if body is None:
                break
            if self.dry_run:
                log.info("dry-run: would set taints %s", body["spec"]["taints"])
                return
            try:
                node = api.patch_node(self.node, body)
                break
            except KubeError as e:
                if e.kind != "conflict":
                    raise
                log.info("node %s changed under us (409); reading it again", self.node)
        else:
            raise KubeError("conflict", f"node {self.node} kept changing; {self.cfg['conflict_retries']} writes lost")
        self._record_applied(node)
        if self.breaker is not None and not self.dry_run and not self._quarantined(node) and self.breaker.holds_slot():
            self.breaker.release(api)

    def _admit(self, api: KubeApi, node: dict[str, Any],
               wanted: dict[str, SubsystemState]) -> dict[str, SubsystemState]:
        """Wanted taints minus the quarantine taints the circuit breaker withholds."""
        quarantine = [s for s, st in wanted.items() if st.effect in QUARANTINE_EFFECTS]
        withheld: set[str] = set()
        if quarantine and self.breaker is not None:
            if not self.breaker.admit(api, self._quarantined(node), self.dry_run):
                withheld = set(quarantine)
        if withheld and withheld != self._withheld:
            log.warning("quarantine circuit breaker withholds taints for %s on %s", sorted(withheld), self.node)
            if not self.dry_run:
                self._event(node, "Warning", "NodeHealthTaintWithheld",
                            f"The quarantine circuit breaker withholds the {', '.join(sorted(withheld))} taint(s): "
                            "too many nodes are quarantined by nodehealth; an operator must reset the breaker.")
        with self._lock:
            self._withheld = withheld
        return {s: st for s, st in wanted.items() if s not in withheld}

    def _owned(self, node: dict[str, Any]) -> set[tuple[str, str]]:
        """The (key, effect) of the taints we applied: only ever keys in our domain.

        Without a readable record, our subsystem keys are ours: a lost or corrupt annotation must
        not leave a quarantine taint on the node forever, outside the breaker's count.
        """
        recorded = _annotations(node).get(self.applied_key)
        if recorded is not None:
            try:
                owned = {(str(e["key"]), str(e["effect"])) for e in json.loads(recorded)}
                return {(k, e) for k, e in owned if k.startswith(self.domain)}
            except (ValueError, TypeError, KeyError):
                log.error("node %s: annotation %s is unreadable; treating the %s<subsystem> taints as ours",
                          self.node, self.applied_key, self.domain)
        ours = {self.domain + s for s in SUBSYSTEMS}
        return {(t.get("key"), t.get("effect")) for t in _taints(node) if t.get("key") in ours}

    def _quarantined(self, node: dict[str, Any]) -> bool:
        owned = self._owned(node)
        return any((t.get("key"), t.get("effect")) in owned and t.get("effect") in QUARANTINE_EFFECTS
                   for t in _taints(node))

    def _taint_patch(self, node: dict[str, Any], wanted: dict[str, SubsystemState]) -> dict[str, Any] | None:
        """The conditional patch that makes our taints `wanted`, or None if they already are.

        Taints we did not apply stay exactly as they are, in their order. Under an operator's
        hold, or on a node someone cordoned, our taints are added but never removed.
        """
        current = _taints(node)
        owned = self._owned(node)
        keep_ours = self.domain + "hold" in _annotations(node) or bool((node.get("spec") or {}).get("unschedulable"))
        want = {(self.domain + s, st.effect): taint_value(st.reason) for s, st in wanted.items()}
        foreign = {(t.get("key"), t.get("effect")) for t in current if (t.get("key"), t.get("effect")) not in owned}
        result, ours = [], []
        for t in current:
            ident = (t.get("key"), t.get("effect"))
            if ident in foreign:
                result.append(t)
            elif ident in want:
                result.append(dict(t, value=want[ident]))
                ours.append(ident)
            elif keep_ours:
                result.append(t)
                ours.append(ident)
        for ident, value in sorted(want.items()):
            if ident not in foreign and ident not in ours:
                result.append({"key": ident[0], "value": value, "effect": ident[1]})
                ours.append(ident)
        record = json.dumps([{"key": k, "effect": e} for k, e in sorted(ours)], separators=(",", ":"))
        if result == current and _annotations(node).get(self.applied_key, "[]") == record:
            return None
        return {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"],
                             "annotations": {self.applied_key: record}},
                "spec": {"taints": result}}

    def _record_applied(self, node: dict[str, Any]) -> None:
        owned = self._owned(node)
        applied = {t["key"][len(self.domain):]: t["effect"] for t in _taints(node)
                   if (t.get("key"), t.get("effect")) in owned and t["key"].startswith(self.domain)}
        with self._lock:
            self.applied = applied
            self.hold = self.domain + "hold" in _annotations(node)

    # -- events --------------------------------------------------------------------------------
    def _event(self, node: dict[str, Any], kind: str, reason: str, message: str) -> None:
        now = time.time()
        stamp = _now_rfc3339(now)
        meta = node.get("metadata") or {}
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{self.node}.{int(now * 1e9):x}{random.getrandbits(16):04x}",
                         "namespace": self.cfg["event_namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node,
                               "uid": meta.get("uid", self.node)},
            "reason": reason, "message": message[:MAX_MESSAGE_CHARS], "type": kind,
            "source": {"component": "nodehealth", "host": self.node},
            "reportingComponent": "nodehealth", "reportingInstance": self.node,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        with self._lock:
            self._pending_events.append(event)
            del self._pending_events[:-MAX_PENDING_EVENTS]

    def _flush_events(self, api: KubeApi) -> None:
        while True:
            with self._lock:
                if not self._pending_events:
                    return
                event = self._pending_events[0]
            api.create_event(self.cfg["event_namespace"], event)
            with self._lock:
                if self._pending_events and self._pending_events[0] is event:
                    self._pending_events.pop(0)

    # -- metrics -------------------------------------------------------------------------------
    def metrics(self) -> list[Metric]:
        with self._lock:
            desired = dict(self._desired or {})
            errors = dict(self.errors)
            last_sync, applied, withheld, hold = self.last_sync, dict(self.applied), set(self._withheld), self.hold
        out = []
        m = Metric("nodehealth_kube_publish_errors_total",
                   "Kubernetes API calls of the publisher that failed, by kind of error.", "counter", ("kind",))
        for kind in sorted(errors):
            m.add((kind,), errors[kind])
        out.append(m)
        m = Metric("nodehealth_kube_last_sync_timestamp_seconds",
                   "Unix time the Node last matched the verdict (taints, conditions, events written).")
        m.add((), last_sync)
        out.append(m)
        out.append(_taint_metric("nodehealth_kube_taint_desired",
                                 "1 for each nodehealth taint the current verdict asks for on this node.",
                                 {s: st.effect for s, st in desired.items() if st.effect}))
        out.append(_taint_metric("nodehealth_kube_taint_applied",
                                 "1 for each nodehealth taint on the Node as last read or written.", applied))
        m = Metric("nodehealth_kube_taint_withheld",
                   "1 for each subsystem whose quarantine taint the circuit breaker withholds.", labels=("subsystem",))
        for s in sorted(withheld):
            m.add((s,), 1)
        out.append(m)
        out.append(_flag("nodehealth_kube_dry_run", "1 when the publisher only logs what it would write.",
                         self.dry_run))
        out.append(_flag("nodehealth_kube_hold", "1 while an operator's hold annotation keeps our taints on.", hold))
        if self.breaker is not None:
            b = self.breaker
            out.append(_flag("nodehealth_kube_breaker_tripped",
                             "1 while the quarantine circuit breaker refuses new quarantines (reset by an operator).",
                             b.tripped))
            m = Metric("nodehealth_kube_breaker_quarantined_nodes",
                       "Nodes holding a nodehealth quarantine slot, as last read from the breaker Lease.")
            m.add((), None if b.members is None else len(b.members))
            out.append(m)
            m = Metric("nodehealth_kube_breaker_cap_nodes",
                       "Most nodes nodehealth may quarantine at once (a share of the managed nodes, at least 1).")
            m.add((), None if b.managed is None else b.cap())
            out.append(m)
        return out


def _taint_metric(name: str, help_text: str, effects: dict[str, str]) -> Metric:
    m = Metric(name, help_text, labels=("subsystem", "effect"))
    for subsystem in sorted(effects):
        m.add((subsystem, effects[subsystem]), 1)
    return m


def _flag(name: str, help_text: str, value: bool | None) -> Metric:
    m = Metric(name, help_text)
    m.add((), None if value is None else int(bool(value)))
    return m


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])
