"""The Kubernetes API as nodehealth uses it: a narrow protocol (KubeApi), its one real backend
(ClientApi over the official client) and the errors as bounded kinds for the metrics.

This is the only module that imports `kubernetes`, and only inside ClientApi, so importing it is cheap.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, Callable, Protocol

# Nodes per list page: 10,000 Nodes never arrive as one response (each Node, with its image list
# and managed fields, can be tens of KiB). A consistent read, not resourceVersion=0: the watch
# cache of older API servers ignores `limit` for that and answers with everything at once.
LIST_PAGE_SIZE = 500
# A ConfigMap holds at most 1 MiB of data; its JSON (base64 binaryData, metadata, managed fields)
# stays well below this. Anything larger is not read into memory.
MAX_CONFIGMAP_RESPONSE_BYTES = 2 << 20


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


def require_config(kubeconfig: str = "") -> None:
    """Credentials to reach the API server, or one KubeError that says none were found: the daemon says
    so at start instead of retrying for ever."""
    require_client()
    from kubernetes import client

    _load(kubeconfig, client.Configuration())


def _load(kubeconfig: str, configuration: Any) -> None:
    """The client configuration: `kubeconfig`, else the in-cluster service account, else ~/.kube/config."""
    from kubernetes import config

    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                config.load_kube_config(client_configuration=configuration)
    except (config.ConfigException, OSError, TypeError, ValueError) as e:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else ("no in-cluster service account and no usable "
                                                               "kubeconfig ($KUBECONFIG, ~/.kube/config)")
        raise KubeError("config", f"no usable Kubernetes credentials: {where}: {e}") from None


class ClientApi:
    """KubeApi over the official `kubernetes` client: in-cluster config, else a kubeconfig."""

    def __init__(self, kubeconfig: str = "", timeout_seconds: float = 10.0):
        require_client()
        from kubernetes import client

        configuration = client.Configuration()
        _load(kubeconfig, configuration)
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

    def _found(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """The object, or None where there is none (404)."""
        try:
            return self._call(method, *args, **kwargs)
        except KubeError as e:
            if e.kind == "not_found":
                return None
            raise

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._found(self.coordination.read_namespaced_lease, name, namespace)

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
        return self._found(self.core.read_namespaced_config_map, name, namespace,
                           max_bytes=MAX_CONFIGMAP_RESPONSE_BYTES)

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


def now_rfc3339(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


def micro_time(now: float) -> str:
    """A Lease's MicroTime: RFC 3339 in UTC with microseconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"

