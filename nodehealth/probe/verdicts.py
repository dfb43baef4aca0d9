"""The pingmesh controller's ConfigMaps as both sides see them, and what a node's agent makes of them.

The controller (nodehealth/controller.py) writes `verdicts.json` to one ConfigMap and the inventory it
built to another (pingmesh.configmap, pingmesh.inventory_configmap); each agent reads them and turns a
verdict about itself or its leaf into a `pingmesh` finding, so that its Node keeps one writer. What
they hold comes from another component through the API server: untrusted input, bounded and
validated before anything acts on it.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import zlib
from typing import Any

from nodehealth.model import Action, Finding, Severity
from nodehealth.probe import inventory

VERDICTS_KEY = "verdicts.json"  # in `data`
INVENTORY_KEY = "inventory.json.gz"  # in `binaryData`: gzip of the inventory's to_data() JSON
SCHEMA_VERSION = 1
KINDS = ("node", "leaf", "path", "inconclusive")
MAX_DOC_BYTES = 512 * 1024  # verdicts.json; a ConfigMap as a whole is capped at 1 MiB
MAX_VERDICTS = 1000  # the controller writes no more (actionable kinds first); an agent refuses more
MAX_ELEMENT_CHARS = 330  # a node name (253), a path "leafA->leafB", an inconclusive "node|leaf" (253 + 1 + 63)
MAX_MESSAGE_CHARS = 500
MAX_EVIDENCE_BYTES = 2048  # serialized; larger evidence is dropped, the verdict kept
# Verdicts older than this many of their windows are ignored: a controller that stopped (or an API
# server the agent cannot reach) must not keep a taint on a node forever. Three windows ride out a
# missed analysis or two and a leader change (a 15 s Lease).
STALE_WINDOWS = 3


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


def verdict_findings(doc: dict[str, Any] | None, node: str, leaf: str, now: float) -> list[Finding]:
    """The `pingmesh` findings this node draws from the controller's (validated) verdicts.

    A node verdict naming this node and a leaf verdict naming its leaf are degraded (the taint
    `network` gets PreferNoSchedule); a path verdict from or to its leaf is a warning. A document
    older than STALE_WINDOWS of its windows (or as far ahead of this node's clock) yields only an
    info finding: it shows, and it never taints.
    """
    if doc is None:
        return []
    age = now - doc["time"]
    if abs(age) > STALE_WINDOWS * doc["window_seconds"]:
        when = "old" if age > 0 else "ahead of this node's clock"
        return [Finding("pingmesh", Severity.INFO, "PingmeshVerdictsStale",
                        f"The pingmesh controller's verdicts are {abs(age):.0f} s {when}, more than "
                        f"{STALE_WINDOWS} windows of {doc['window_seconds']:g} s; they are ignored until it "
                        "writes again.", evidence={"age_seconds": round(age, 1)})]
    out = []
    for v in doc["verdicts"]:
        kind, element = v["kind"], v["element"]
        if kind == "node" and element == node:
            reason, severity, action = "PingmeshNodeFaulty", Severity.DEGRADED, Action.HW_INSPECTION
            fallback = f"Pingmesh localized a network fault to this node ({node})."
        elif kind == "leaf" and leaf and element == leaf:
            reason, severity, action = "PingmeshLeafFaulty", Severity.DEGRADED, Action.HW_INSPECTION
            fallback = f"Pingmesh localized a network fault to this node's leaf switch group {leaf}."
        elif kind == "path" and leaf and leaf in element.split("->", 1):
            reason, severity, action = "PingmeshPathDegraded", Severity.WARNING, Action.NONE
            fallback = f"Pingmesh found the path {element} (touching this node's leaf) degraded."
        else:
            continue
        out.append(Finding("pingmesh", severity, reason, v["message"] or fallback, element, action,
                           evidence=dict(v["evidence"], since=v["since"], windows=v["windows"]),
                           first_seen=v["since"], last_seen=doc["time"]))
    return out
