"""The pingmesh controller's ConfigMaps as both sides see them: their documents, the controller's
writes and the agents' reads.

The controller (nodehealth/pingmesh/controller.py) writes `verdicts.json` to one ConfigMap and the
inventory it built to another (pingmesh.configmap, pingmesh.inventory_configmap); each agent reads
them, and the `pingmesh` check (checks/pingmesh.py) turns a verdict about its node or its leaf into a
finding, so that its Node keeps one writer. What they hold comes from another component through the
API server: untrusted input, bounded and validated before anything acts on it.
"""
from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import random
import threading
import time
import zlib
from typing import Any, Callable

from nodehealth import inventory
from nodehealth.kube.api import KubeApi, KubeError

log = logging.getLogger("nodehealth.controller")

VERDICTS_KEY = "verdicts.json"  # in `data`
INVENTORY_KEY = "inventory.json.gz"  # in `binaryData`: gzip of the inventory's to_data() JSON
SCHEMA_VERSION = 1
KINDS = ("node", "leaf", "path", "inconclusive")
MAX_DOC_BYTES = 512 * 1024  # verdicts.json; a ConfigMap as a whole is capped at 1 MiB
MAX_CONFIGMAP_BYTES = 1 << 20  # kube-apiserver refuses more data + binaryData in one ConfigMap
MAX_VERDICTS = 1000  # the controller writes no more (actionable kinds first); an agent refuses more
MAX_ELEMENT_CHARS = 330  # a node name (253), a path "leafA->leafB", an inconclusive "node|leaf" (253 + 1 + 63)
MAX_MESSAGE_CHARS = 500
MAX_EVIDENCE_BYTES = 2048  # serialized; larger evidence is dropped, the verdict kept


class VerdictError(ValueError):
    """A verdict document (or inventory) that is malformed or too large; the message says why."""


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise VerdictError(f"{what} must be a finite number, not {str(value)[:40]!r}")
    return float(value)


def _loads(text: str | bytes, limit: int, what: str) -> Any:
    if len(text) > limit:
        raise VerdictError(f"{what} is {len(text)} bytes, more than {limit}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: nesting deeper than the parser's stack
        raise VerdictError(f"{what} is not JSON: {str(e)[:200]}") from None


def parse_verdicts(text: str | bytes) -> dict[str, Any]:
    """`verdicts.json` validated and normalized; raises VerdictError with a reason.

    Unknown verdict kinds are skipped (a newer controller may add some); anything else malformed
    rejects the whole document, which is then as good as no document.
    """
    doc = _loads(text, MAX_DOC_BYTES, VERDICTS_KEY)
    if not isinstance(doc, dict):
        raise VerdictError(f"{VERDICTS_KEY} is not a JSON object")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise VerdictError(f"schema_version {str(doc.get('schema_version'))[:20]!r} is not {SCHEMA_VERSION}")
    window = _number(doc.get("window_seconds"), "window_seconds")
    if window <= 0:
        raise VerdictError(f"window_seconds must be positive, not {window:g}")
    raw = doc.get("verdicts")
    if not isinstance(raw, list):
        raise VerdictError("verdicts must be a list")
    if len(raw) > MAX_VERDICTS:
        raise VerdictError(f"{len(raw)} verdicts, more than {MAX_VERDICTS}")
    verdicts = []
    for i, v in enumerate(raw):
        if not isinstance(v, dict):
            raise VerdictError(f"verdicts[{i}] is not an object")
        if v.get("kind") not in KINDS:
            continue
        element = v.get("element")
        if not isinstance(element, str) or not element or len(element) > MAX_ELEMENT_CHARS:
            raise VerdictError(f"verdicts[{i}].element must be a name of 1 to {MAX_ELEMENT_CHARS} characters")
        windows = v.get("windows", 0)
        if isinstance(windows, bool) or not isinstance(windows, int) or windows < 0:
            raise VerdictError(f"verdicts[{i}].windows must be a count")
        message = v.get("message", "")
        if not isinstance(message, str):
            raise VerdictError(f"verdicts[{i}].message must be a string")
        evidence = v.get("evidence") or {}
        if not isinstance(evidence, dict) or len(json.dumps(evidence)) > MAX_EVIDENCE_BYTES:
            evidence = {}
        verdicts.append({"kind": v["kind"], "element": element,
                         "since": _number(v.get("since"), f"verdicts[{i}].since"), "windows": windows,
                         "message": message[:MAX_MESSAGE_CHARS], "evidence": evidence})
    counts = {k: doc.get(k) for k in ("nodes", "leaves")
              if isinstance(doc.get(k), int) and not isinstance(doc.get(k), bool)}
    return {"schema_version": SCHEMA_VERSION, "time": _number(doc.get("time"), "time"), "window_seconds": window,
            "verdicts": verdicts, **counts}


def encode_inventory(inv: inventory.Inventory) -> str:
    """The inventory as the ConfigMap's binaryData value: base64 of gzip of its compact to_data() JSON.

    gzip without a timestamp, so the same inventory is the same bytes.
    """
    import gzip

    raw = json.dumps(inventory.to_data(inv), separators=(",", ":")).encode()
    return base64.b64encode(gzip.compress(raw, mtime=0)).decode("ascii")


def decode_inventory(value: str) -> inventory.Inventory:
    """The inverse of encode_inventory; inflates at most inventory.MAX_BYTES (a gzip bomb stops
    there). Raises VerdictError; entries that cannot be used are in the inventory's problems."""
    try:
        packed = base64.b64decode(value, validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise VerdictError(f"{INVENTORY_KEY} is not base64") from None
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing
    try:
        raw = inflater.decompress(packed, inventory.MAX_BYTES + 1)
    except zlib.error as e:
        raise VerdictError(f"{INVENTORY_KEY} is not gzip: {e}") from None
    if len(raw) > inventory.MAX_BYTES or inflater.unconsumed_tail:
        raise VerdictError(f"{INVENTORY_KEY} inflates to more than {inventory.MAX_BYTES} bytes")
    try:
        return inventory.parse(raw, INVENTORY_KEY, "json")
    except inventory.InventoryError as e:
        raise VerdictError(str(e)) from None


# -- the pingmesh controller's ConfigMaps, as an agent reads them ----------------------------------


def read_verdicts(api: KubeApi, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The controller's verdicts (validated by parse_verdicts), or None while it has written none.

    `cfg` is the `pingmesh` section. Raises KubeError: the API's errors, and kind "invalid" for a
    document that fails validation (treat it like no document; never act on part of it).
    """
    return _read(api, cfg, "configmap", "data", VERDICTS_KEY, parse_verdicts)


def read_inventory(api: KubeApi, cfg: dict[str, Any]) -> inventory.Inventory | None:
    """The inventory the controller built from the Nodes (bad entries in its problems), or None while it
    has written none. It has a ConfigMap of its own (`inventory_configmap`): the agents read the
    verdicts every window, this one only every `refresh_seconds`. Raises KubeError as read_verdicts does."""
    return _read(api, cfg, "inventory_configmap", "binaryData", INVENTORY_KEY, decode_inventory)


def _read(api: KubeApi, cfg: dict[str, Any], setting: str, part: str, key: str, parse: Callable[[str], Any]) -> Any:
    """`key` in the `part` (data or binaryData) of the ConfigMap the `pingmesh` setting `setting` names,
    parsed; None while there is none."""
    configmap = api.get_configmap(cfg["controller_namespace"], cfg[setting])
    values = (configmap.get(part) if isinstance(configmap, dict) else None) or {}
    if key not in values:
        return None
    try:
        return parse(str(values[key]))
    except VerdictError as e:
        raise KubeError("invalid", f"ConfigMap {cfg['controller_namespace']}/{cfg[setting]}: {e}") from None


def inventory_source(pingmesh: dict[str, Any], kube: dict[str, Any]) -> Callable[[], inventory.Inventory]:
    """Where an agent reads the inventory: the static file (pingmesh.inventory_file), else (in
    Kubernetes) the one the controller publishes. The loader raises InventoryError."""
    path = pingmesh["inventory_file"]
    if path:
        return lambda: inventory.load_file(path)
    from nodehealth.kube.api import ClientApi

    api = ClientApi(kube["kubeconfig"], kube["request_timeout_seconds"])

    def load() -> inventory.Inventory:
        try:
            inv = read_inventory(api, pingmesh)
        except KubeError as e:
            raise inventory.InventoryError(f"cannot read the controller's inventory: {e}") from None
        if inv is None:
            raise inventory.InventoryError("the controller has not published an inventory yet")
        return inv
    return load


def follow_verdicts(api: KubeApi, pingmesh: dict[str, Any], on_read: Callable[[dict[str, Any] | None, float], None],
                    stop: threading.Event) -> None:
    """An agent's reader: every window, the controller's verdicts and this node's clock go to
    `on_read` (the daemon judges them at once). A failed read hands on the last document: its own
    age expires it (the `pingmesh` check)."""
    doc = None
    while not stop.is_set():
        try:
            doc = read_verdicts(api, pingmesh)
        except KubeError as e:
            log.warning("cannot read the pingmesh verdicts: %s", e)
        on_read(doc, time.time())
        # Jittered, so that thousands of agents do not read the ConfigMap in the same second.
        stop.wait(pingmesh["window_seconds"] * (1 + 0.1 * random.random()))


# -- the controller's ConfigMaps, as it writes them -------------------------------------------------


class ConfigMapWriter:
    """Writes the controller's ConfigMaps (verdicts, inventory) by compare-and-swap, never one over
    what a ConfigMap may hold; `refused` and `stored` are for the metrics.

    Every write is allowed by `may_write` (the controller's: it still leads), asked after the read
    whose resourceVersion the write carries: a leader that stood still between its check and its
    write meets the new leader's resourceVersion, and asks again before it reads and writes anew."""

    def __init__(self, api: Callable[[], KubeApi], namespace: str, names: list[str], conflict_retries: int,
                 may_write: Callable[[], bool] = lambda: True):
        self.api = api
        self.namespace = namespace
        self.conflict_retries = conflict_retries
        self.may_write = may_write
        self._rv: dict[str, str] = {}  # ConfigMap name -> the resourceVersion this replica last wrote or read
        self._lock = threading.Lock()
        self.refused = {name: 0 for name in names}  # writes not made: over the size a ConfigMap may hold
        self.stored: dict[str, int] = {}  # ConfigMap name -> bytes of data it holds, as last written or found

    def write_binary(self, name: str, key: str, value: str, unwritten: str) -> bool:
        """Write `key: value` as the binaryData of ConfigMap `name` unless it holds just that already.

        Compared with what is there, not with what this replica last wrote: after a change of leader,
        or an operator's delete, the stored one may be neither (one read, ~0.7 MiB for an inventory of
        10,000 nodes, against rewriting it for every agent to fetch again). Raises KubeError."""
        content = {"binaryData": {key: value}}
        current = self.api().get_configmap(self.namespace, name)
        if current is None:
            self._rv.pop(name, None)
        elif (current.get("binaryData") or {}).get(key) == value:
            self._stored(name, current, data_bytes(content))
            return True
        else:
            self._rv[name] = current["metadata"]["resourceVersion"]
        return self.write(name, content, unwritten)

    def write(self, name: str, content: dict[str, dict[str, str]], unwritten: str) -> bool:
        """Create or replace ConfigMap `name` with `content` (its data and binaryData), compare-and-swap
        on the resourceVersion this replica last wrote or read; False when the data is over what a
        ConfigMap may hold or `may_write` says no (nothing is written then; `unwritten` says what
        follows, for the log). Raises KubeError."""
        size = data_bytes(content)
        if size > MAX_CONFIGMAP_BYTES:
            with self._lock:
                self.refused[name] += 1
            log.error("ConfigMap %s/%s would hold %d bytes, more than the %d a ConfigMap may; not written (%s)",
                      self.namespace, name, size, MAX_CONFIGMAP_BYTES, unwritten)
            return False
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/name": "nodehealth",
                                        "app.kubernetes.io/component": "controller"}},
                **content}
        api = self.api()
        for _ in range(self.conflict_retries):
            if name not in self._rv:
                current = api.get_configmap(self.namespace, name)
                if not self._may_write(name):
                    return False
                if current is None:
                    try:
                        stored = api.create_configmap(self.namespace, body)
                    except KubeError as e:
                        if e.kind != "conflict":
                            raise
                        continue  # created by someone else meanwhile: read it
                    self._stored(name, stored, size)
                    return True
                self._rv[name] = current["metadata"]["resourceVersion"]
            elif not self._may_write(name):
                return False
            body["metadata"]["resourceVersion"] = self._rv[name]
            try:
                stored = api.replace_configmap(self.namespace, body)
            except KubeError as e:
                self._rv.pop(name, None)
                if e.kind not in ("conflict", "not_found"):
                    raise
                continue
            self._stored(name, stored, size)
            return True
        raise KubeError("conflict", f"ConfigMap {self.namespace}/{name} kept changing under us")

    def _may_write(self, name: str) -> bool:
        if self.may_write():
            return True
        log.info("ConfigMap %s/%s: not written, this replica no longer leads", self.namespace, name)
        return False

    def _stored(self, name: str, stored: dict[str, Any], size: int) -> None:
        self._rv[name] = stored["metadata"]["resourceVersion"]
        with self._lock:
            self.stored[name] = size

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Refused writes and stored bytes, per ConfigMap, for the metrics."""
        with self._lock:
            return dict(self.refused), dict(self.stored)


def data_bytes(content: dict[str, dict[str, str]]) -> int:
    """What the API server counts against a ConfigMap's 1 MiB: data as UTF-8, binaryData decoded."""
    return (sum(len(v.encode()) for v in (content.get("data") or {}).values())
            + sum(len(v) // 4 * 3 - v[-2:].count("=") for v in (content.get("binaryData") or {}).values()))
