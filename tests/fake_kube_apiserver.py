"""A stand-in for the Kubernetes API server: a real HTTP server on 127.0.0.1 for the real client.

It behaves like kube-apiserver on the points the publisher and the controller depend on:
- nodes: GET, list with a label selector (paginated with `limit` and an opaque `continue` token, a
  consistent snapshot across pages like etcd's), PUT and PATCH (strategic-merge and merge patch) guarded
  by `metadata.resourceVersion` (stale -> 409 Conflict with a Status body); `spec.taints` has no
  merge key, so a patch replaces the whole list; NoExecute taints get `timeAdded`; a duplicate
  taint, a key that is no qualified name, a value that is no label value or an unknown effect is
  422 Invalid;
- nodes/status: PATCH merges `status.conditions` by type and ignores spec and metadata;
- events: POST; leases (coordination.k8s.io/v1): GET, POST (409 AlreadyExists), PUT with
  resourceVersion compare-and-swap;
- configmaps: GET, POST (409 AlreadyExists), PUT (conditional when it carries a resourceVersion,
  as the real one allows an unconditional update); more than 1 MiB of data and binaryData together,
  a bad key, a key in both or binaryData that is not base64 is 422 Invalid;
- pods: list in a namespace with a label selector (one page: the jobs tested are small), for
  `netcheck job`; pods are added and changed by the test (the kubelet's part);
- trouble on demand: forced answers (403, 429, 5xx), an outage (connections dropped), slow
  answers, and a hook that runs as another writer between our read and our write.
"""
from __future__ import annotations

import base64
import binascii
import copy
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

STATUS_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 410: "Expired",
                  415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
                  503: "ServiceUnavailable"}
MERGE_KEYS = {("status", "conditions"): "type"}  # strategic merge: lists merged by key; others replaced
NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")  # a label value, when not empty
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
CONFIGMAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")
MAX_CONFIGMAP_BYTES = 1 << 20  # kube-apiserver's limit on data and binaryData together (core.MaxSecretSize)


class ApiError(Exception):
    def __init__(self, code: int, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.details = details or {}


def status_body(code: int, message: str, details: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": STATUS_REASONS.get(code, "Unknown"), "details": details, "code": code}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: mappings merge, null deletes, everything else (lists included) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """Strategic merge for the fields nodes use: lists with a merge key merge item by item."""
    if not isinstance(patch, dict):
        merge_key = MERGE_KEYS.get(path)
        if merge_key and isinstance(patch, list) and isinstance(target, list):
            merged = [copy.deepcopy(t) for t in target]
            for item in patch:
                for i, old in enumerate(merged):
                    if old.get(merge_key) == item.get(merge_key):
                        merged[i] = strategic_merge(old, item, path + ("[]",))
                        break
                else:
                    merged.append(copy.deepcopy(item))
            return merged
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
        else:
            out[key] = strategic_merge(out.get(key), value, path + (key,))
    return out


def taint_problem(taint: dict[str, Any]) -> str | None:
    """Why kube-apiserver would refuse this taint (its key, value and effect rules), or None."""
    key, value = str(taint.get("key") or ""), str(taint.get("value") or "")
    prefix, _, name = key.rpartition("/")
    if len(name) > 63 or not NAME_PART.fullmatch(name) or (prefix and (len(prefix) > 253
                                                                      or not DNS_SUBDOMAIN.fullmatch(prefix))):
        return f'key: Invalid value: "{key}": not a qualified name'
    if len(value) > 63:
        return f'value: Invalid value: "{value}": must be no more than 63 characters'
    if value and not NAME_PART.fullmatch(value):
        return (f'value: Invalid value: "{value}": a valid label must be an empty string or consist of '
                "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")
    if taint.get("effect") not in TAINT_EFFECTS:
        return f'effect: Unsupported value: "{taint.get("effect")}"'
    return None


def matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selectors: `a=b`, `a==b`, `a!=b`, `a`, `!a`, comma-separated."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakeApiServer:
    """Holds the objects and the trouble switches; `url` is where the real client should point."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.rv = 100
        self.nodes: dict[str, dict[str, Any]] = {}
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.snapshots: dict[str, tuple[str, list[dict[str, Any]]]] = {}  # continue token -> the rest of a list
        self.events: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request answered
        self.node_writes: list[tuple[str, dict[str, Any], dict[str, Any]]] = []  # (subresource, old, new)
        self.forced: list[list[Any]] = []  # [code, times left, which(method, path)]
        self.down = False  # outage: connections are dropped without an answer
        self.delay = 0.0
        self.before_node_write: Callable[[FakeApiServer, str], None] | None = None  # runs once, then clears
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> FakeApiServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, path: str) -> str:
        """Write a kubeconfig that points the real client at this server; returns the path."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "agent", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "agent"}}],
        }
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
        return path

    # -- test helpers --------------------------------------------------------------------------
    def add_node(self, name: str, labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None,
                 annotations: dict[str, str] | None = None, conditions: list[dict[str, Any]] | None = None,
                 unschedulable: bool = False, internal_ip: str | None = None) -> None:
        with self.lock:
            node = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "uid": f"uid-{name}", "labels": dict(labels or {}),
                                 "annotations": dict(annotations or {})},
                    "spec": {"taints": list(taints or [])},
                    "status": {"conditions": list(conditions or [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady",
                         "message": "kubelet is posting ready status",
                         "lastHeartbeatTime": "2024-01-01T00:00:00Z", "lastTransitionTime": "2024-01-01T00:00:00Z"}]),
                        "addresses": [{"type": "Hostname", "address": name}]}}
            if internal_ip is not None:
                node["status"]["addresses"].insert(0, {"type": "InternalIP", "address": internal_ip})
            if unschedulable:
                node["spec"]["unschedulable"] = True
            self._store_node(node)

    def node(self, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.nodes[name])

    def edit_node(self, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        """Another writer: change the stored node and bump its resourceVersion."""
        with self.lock:
            node = copy.deepcopy(self.nodes[name])
            change(node)
            self._store_node(node)

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            lease = self.leases.get((namespace, name))
            return copy.deepcopy(lease) if lease else None

    def add_lease(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        with self.lock:
            self.leases[(namespace, name)] = self._bump(
                {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations)}, "spec": {}})

    def edit_lease(self, namespace: str, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        with self.lock:
            lease = copy.deepcopy(self.leases[(namespace, name)])
            change(lease)
            self.leases[(namespace, name)] = self._bump(lease)

    def add_pod(self, namespace: str, name: str, labels: dict[str, str], ip: str | None = None,
                phase: str = "Pending", annotations: dict[str, str] | None = None) -> None:
        """A pod as the kubelet shows it: Pending while its init containers run, with an IP once
        its sandbox is up (`ip` None: not yet)."""
        with self.lock:
            status: dict[str, Any] = {"phase": phase}
            if ip:
                status["podIP"] = ip
                status["podIPs"] = [{"ip": ip}]
            self.pods[(namespace, name)] = self._bump({
                "kind": "Pod", "apiVersion": "v1", "status": status,
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                             "annotations": dict(annotations or {}), "uid": f"uid-{name}"},
                "spec": {"containers": [{"name": "main", "image": "train:latest"}]}})

    def configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            cm = self.configmaps.get((namespace, name))
            return copy.deepcopy(cm) if cm else None

    def put_configmap(self, namespace: str, name: str, data: dict[str, str] | None = None,
                      binary_data: dict[str, str] | None = None) -> None:
        """Another writer (or a test) stores a ConfigMap as it likes, bypassing validation."""
        with self.lock:
            self.configmaps[(namespace, name)] = self._bump(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
                 "data": dict(data or {}), "binaryData": dict(binary_data or {})})

    def fail(self, code: int, times: int = 1_000_000, method: str = "", path_end: str = "") -> None:
        """Answer the next `times` matching requests (method, path ending) with `code` and a Status body."""
        with self.lock:
            self.forced.append([code, times, lambda m, p: (not method or m == method) and p.endswith(path_end)])

    def heal(self) -> None:
        with self.lock:
            self.forced.clear()
            self.down = False
            self.delay = 0.0

    def writes(self) -> list[tuple[str, str]]:
        with self.lock:
            return [r for r in self.requests if r[0] != "GET"]

    # -- objects -------------------------------------------------------------------------------
    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        return obj

    def _store_node(self, node: dict[str, Any]) -> dict[str, Any]:
        for taint in (node.get("spec") or {}).get("taints") or []:
            if taint.get("effect") == "NoExecute" and not taint.get("timeAdded"):
                taint["timeAdded"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        name = node["metadata"]["name"]
        taints = (node.get("spec") or {}).get("taints") or []
        keys = [(t.get("key"), t.get("effect")) for t in taints]
        problems = [f"spec.taints[{i}].{taint_problem(t)}" for i, t in enumerate(taints) if taint_problem(t)]
        if len(keys) != len(set(keys)):
            problems.append("spec.taints: Duplicate value")
        if problems:
            raise ApiError(422, f'Node "{name}" is invalid: {problems[0]}', {"name": name, "kind": "nodes"})
        self._bump(node)
        self.nodes[name] = node
        return node

    def _check_rv(self, current: dict[str, Any], sent: dict[str, Any], kind: str, name: str) -> None:
        rv = (sent.get("metadata") or {}).get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise ApiError(409, f'Operation cannot be fulfilled on {kind} "{name}": the object has been modified; '
                                "please apply your changes to the latest version and try again",
                           {"name": name, "kind": kind})

    # -- routes --------------------------------------------------------------------------------
    def route(self, method: str, path: str, query: dict[str, list[str]], content_type: str, body: Any) -> Any:
        parts = [p for p in path.split("/") if p]
        with self.lock:
            if parts[:3] == ["api", "v1", "nodes"]:
                return self._nodes(method, parts[3:], query, content_type, body)
            if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 5 and parts[4] == "events":
                if method != "POST":
                    raise ApiError(405, "method not allowed")
                event = dict(body, metadata=dict(body.get("metadata") or {}, namespace=parts[3]))
                self.events.append(self._bump(event))
                return 201, event
            if parts[:4] == ["apis", "coordination.k8s.io", "v1", "namespaces"] and len(parts) >= 6 \
                    and parts[5] == "leases":
                return self._leases(method, parts[4], parts[6] if len(parts) > 6 else None, body)
            if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 5 and parts[4] == "pods":
                if method != "GET":
                    raise ApiError(405, "method not allowed")
                selector = (query.get("labelSelector") or [""])[0]
                items = [copy.deepcopy(p) for (ns, _), p in sorted(self.pods.items())
                         if ns == parts[3] and matches(p["metadata"].get("labels") or {}, selector)]
                return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)},
                             "items": items}
            if parts[:3] == ["api", "v1", "namespaces"] and len(parts) in (5, 6) and parts[4] == "configmaps":
                return self._configmaps(method, parts[3], parts[5] if len(parts) > 5 else None, body)
        raise ApiError(404, f"the server could not find the requested resource ({method} {path})")

    def _nodes(self, method: str, rest: list[str], query: dict[str, list[str]], content_type: str,
               body: Any) -> Any:
        if not rest:
            if method != "GET":
                raise ApiError(405, "method not allowed")
            return 200, self._node_list(query)
        name = rest[0]
        if name not in self.nodes:
            raise ApiError(404, f'nodes "{name}" not found', {"name": name, "kind": "nodes"})
        status = rest[1:] == ["status"]
        if method == "GET":
            return 200, copy.deepcopy(self.nodes[name])
        if method not in ("PATCH", "PUT"):
            raise ApiError(405, "method not allowed")
        if self.before_node_write is not None:
            hook, self.before_node_write = self.before_node_write, None
            hook(self, name)
        current = self.nodes[name]
        self._check_rv(current, body, "nodes", name)
        if method == "PUT":
            new = copy.deepcopy(body)
        elif content_type.startswith("application/merge-patch+json"):
            new = merge_patch(current, body)
        elif content_type.startswith("application/strategic-merge-patch+json"):
            new = strategic_merge(current, body)
        else:
            raise ApiError(415, f"the body of the request was in an unknown format: {content_type}")
        if status:  # the status subresource ignores spec and metadata changes
            new = dict(new, spec=copy.deepcopy(current.get("spec")), metadata=copy.deepcopy(current["metadata"]))
        else:  # the main resource ignores status changes
            new = dict(new, status=copy.deepcopy(current.get("status")))
        new["metadata"] = dict(new["metadata"], name=name, uid=current["metadata"]["uid"])
        old = copy.deepcopy(current)
        stored = self._store_node(new)
        self.node_writes.append(("status" if status else "", old, copy.deepcopy(stored)))
        return 200, copy.deepcopy(stored)

    def _node_list(self, query: dict[str, list[str]]) -> dict[str, Any]:
        """One page: the first `limit` items, the rest kept under a continue token (one snapshot)."""
        token = (query.get("continue") or [""])[0]
        if token:
            if token not in self.snapshots:
                raise ApiError(410, "The provided continue parameter is too old to display a consistent list result.")
            rv, items = self.snapshots.pop(token)
        else:
            selector = (query.get("labelSelector") or [""])[0]
            rv = str(self.rv)
            items = [copy.deepcopy(n) for _, n in sorted(self.nodes.items())
                     if matches(n["metadata"].get("labels") or {}, selector)]
        limit = int((query.get("limit") or ["0"])[0])
        metadata = {"resourceVersion": rv}
        if 0 < limit < len(items):
            items, rest = items[:limit], items[limit:]
            metadata["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"rv": rv, "start": rest[0]["metadata"]["name"], "n": len(self.snapshots)}).encode()).decode()
            metadata["remainingItemCount"] = len(rest)
            self.snapshots[metadata["continue"]] = (rv, rest)
        return {"kind": "NodeList", "apiVersion": "v1", "metadata": metadata, "items": items}

    def _leases(self, method: str, namespace: str, name: str | None, body: Any) -> Any:
        if method == "POST" and name is None:
            lease_name = body["metadata"]["name"]
            if (namespace, lease_name) in self.leases:
                raise ApiError(409, f'leases.coordination.k8s.io "{lease_name}" already exists',
                               {"name": lease_name, "group": "coordination.k8s.io", "kind": "leases"})
            lease = copy.deepcopy(body)
            lease["metadata"] = dict(lease["metadata"], namespace=namespace)
            lease["metadata"].pop("resourceVersion", None)
            self.leases[(namespace, lease_name)] = self._bump(lease)
            return 201, copy.deepcopy(lease)
        key = (namespace, name)
        if key not in self.leases:
            raise ApiError(404, f'leases.coordination.k8s.io "{name}" not found',
                           {"name": name, "group": "coordination.k8s.io", "kind": "leases"})
        if method == "GET":
            return 200, copy.deepcopy(self.leases[key])
        if method == "PUT":
            if not (body.get("metadata") or {}).get("resourceVersion"):
                raise ApiError(422, "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update")
            self._check_rv(self.leases[key], body, "leases.coordination.k8s.io", name)
            lease = copy.deepcopy(body)
            lease["metadata"] = dict(lease["metadata"], namespace=namespace, name=name)
            self.leases[key] = self._bump(lease)
            return 200, copy.deepcopy(lease)
        raise ApiError(405, "method not allowed")

    def _configmaps(self, method: str, namespace: str, name: str | None, body: Any) -> Any:
        details = {"name": name or "", "kind": "configmaps"}
        if method == "POST" and name is None:
            name = details["name"] = str((body.get("metadata") or {}).get("name") or "")
            if (namespace, name) in self.configmaps:
                raise ApiError(409, f'configmaps "{name}" already exists', details)
            cm = self._valid_configmap(body, namespace, name)
            self.configmaps[(namespace, name)] = self._bump(cm)
            return 201, copy.deepcopy(cm)
        key = (namespace, name)
        if key not in self.configmaps:
            raise ApiError(404, f'configmaps "{name}" not found', details)
        if method == "GET":
            return 200, copy.deepcopy(self.configmaps[key])
        if method == "PUT":
            self._check_rv(self.configmaps[key], body, "configmaps", str(name))
            cm = self._valid_configmap(body, namespace, str(name))
            self.configmaps[key] = self._bump(cm)
            return 200, copy.deepcopy(cm)
        raise ApiError(405, "method not allowed")

    def _valid_configmap(self, body: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
        """The ConfigMap as stored, or the 422 kube-apiserver's validation gives."""
        cm = copy.deepcopy(body)
        cm["metadata"] = dict(cm.get("metadata") or {}, namespace=namespace, name=name)
        cm["metadata"].pop("resourceVersion", None)
        data, binary = cm.get("data") or {}, cm.get("binaryData") or {}
        size = 0
        for key in list(data) + list(binary):
            if not CONFIGMAP_KEY.fullmatch(key) or len(key) > 253:
                raise ApiError(422, f'ConfigMap "{name}" is invalid: data[{key}]: Invalid value: "{key}": '
                                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'")
            if key in data and key in binary:
                raise ApiError(422, f'ConfigMap "{name}" is invalid: data[{key}]: Invalid value: "{key}": '
                                    "duplicate of key present in binaryData")
        for value in data.values():
            size += len(str(value).encode())
        for key, value in binary.items():
            try:
                size += len(base64.b64decode(value, validate=True))
            except (binascii.Error, TypeError, ValueError):
                raise ApiError(400, f"binaryData[{key}] is not base64") from None
        if size > MAX_CONFIGMAP_BYTES:
            raise ApiError(422, f'ConfigMap "{name}" is invalid: []: Too long: must have at most '
                                f"{MAX_CONFIGMAP_BYTES} bytes", {"name": name, "kind": "configmaps"})
        return cm

    def _forced(self, method: str, path: str) -> int | None:
        with self.lock:
            for entry in self.forced:
                code, times, which = entry
                if times > 0 and which(method, path):
                    entry[1] -= 1
                    return code
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if server.down:
                    self.close_connection = True
                    self.connection.close()
                    return
                if server.delay:
                    time.sleep(server.delay)
                code = server._forced(self.command, url.path)
                try:
                    if code is not None:
                        raise ApiError(code, f"forced {code} for the test")
                    body = json.loads(raw) if raw else None
                    code, answer = server.route(self.command, url.path, parse_qs(url.query),
                                                self.headers.get("Content-Type", ""), body)
                except ApiError as e:
                    code, answer = e.code, status_body(e.code, str(e), e.details)
                except ValueError as e:
                    code, answer = 400, status_body(400, f"the body is not JSON: {e}", {})
                with server.lock:
                    server.requests.append((self.command, url.path))
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if code == 429:
                    self.send_header("Retry-After", "1")
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815

            def log_message(self, fmt: str, *args: Any) -> None:
                pass

        return Handler
