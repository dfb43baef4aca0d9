"""The Kubernetes face: the node verdict as taints, conditions and Events the scheduler can trust.

The daemon calls `Publisher.publish(report)` after each full pass; a background thread turns the
latest report into per-subsystem taints (`nodehealth.io/gpu`, ...), `NodeHealth<Subsystem>Problem`
conditions and Events, and converges with backoff whenever the API server is away. A verdict
about a node reaches its Node only as a finding of that node's own agent (the pingmesh controller's
verdicts too), so every Node keeps one writer.

Why the care: `spec.taints` has no merge key, so every taint write is read-modify-write guarded
by the node's resourceVersion (a stale one is a 409 and we read again), and the agent changes
only the taints it recorded as its own in an annotation, and only ever keys in its domain.

With attribution on, each pod a GPU finding names (its evidence's `pods`) gets one Event, in its own
namespace, once per finding (nodehealth/attribution/notices.py says what it tells).
"""
from __future__ import annotations

import json
import logging
import math
import random
import time
from collections import OrderedDict
from typing import Any, Callable

from nodehealth.attribution.gpus import gpu_refs, nvml_facts
from nodehealth.attribution.notices import pod_notices
from nodehealth.faces import Worker
from nodehealth.kube.api import ClientApi, KubeApi, KubeError, now_rfc3339
from nodehealth.kube.breaker import Breaker
from nodehealth.kube.defaults import DEFAULTS
from nodehealth.kube.events import node_event, pod_event
from nodehealth.kube.taints import (
    CONDITION_NAMES,
    SUBSYSTEMS,
    SubsystemState,
    condition_type,
    desired_state,
    taint_value,
)
from nodehealth.model import Metric, Report

log = logging.getLogger("nodehealth.kube")

QUARANTINE_EFFECTS = ("NoSchedule", "NoExecute")
MAX_PENDING_EVENTS = 100
MAX_POSTED_POD_EVENTS = 1024  # the findings whose pods were told, newest kept; an older one is not told again
# A Pod Event refused for these reasons (no RBAC for it, the pod's namespace gone) is dropped, not retried.
DROPPED_POD_EVENT_ERRORS = ("forbidden", "not_found", "client_error")


class Publisher(Worker):
    """Keeps the Node in line with the latest report, from a background thread, never blocking.

    publish() only records the desired state and wakes the thread; nothing is written before the
    first publish(), so a restart never clears a problem before the first full pass has run.
    """

    THREAD_NAME = "kube"

    def __init__(self, node_name: str, cfg: dict[str, Any], api: KubeApi | None = None,
                 on_clear: Callable[[str], None] | None = None,
                 on_silences: Callable[[str | None], None] | None = None):
        self.node = node_name
        self.cfg = dict(DEFAULTS, **cfg)
        self.domain = self.cfg["domain"]
        self.dry_run = bool(self.cfg["dry_run"])
        self.on_clear = on_clear
        self.on_silences = on_silences  # the Node's silences annotation, at every read (nodehealth/silences)
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
        self._posted: OrderedDict[tuple[Any, ...], None] = OrderedDict()  # the pod Events' keys, once each
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
        notices = pod_notices(report.findings, gpu_refs(nvml_facts(report)))
        with self._lock:
            self._desired = desired
            self._dirty = True
            for n in notices:
                if n.key in self._posted:
                    continue
                self._posted[n.key] = None
                if self.dry_run:
                    log.info("dry-run: would post Event %s on pod %s/%s: %s", n.reason, n.namespace, n.pod, n.message)
                else:
                    self._queue(pod_event(self.node, n.namespace, n.pod, n.type, n.reason, n.message))
            while len(self._posted) > MAX_POSTED_POD_EVENTS:
                self._posted.popitem(last=False)
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
        if self.on_silences is not None:  # read in dry-run too: it changes what would be written
            self.on_silences(_annotations(node).get(self.domain + "silences"))
            with self._lock:  # a changed annotation was judged at once: write that verdict, not the one before
                desired, self._dirty = self._desired or desired, False
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
        stamp = now_rfc3339(now)
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
    def note(self, kind: str, reason: str, message: str) -> None:
        """An Event on this Node from another part of the daemon (the remediation hook's outcome)."""
        if self.dry_run:
            log.info("dry-run: would record Event %s: %s", reason, message)
            return
        self._event({}, kind, reason, message)  # the Node's uid is its name, as the kubelet's Events have it
        with self._lock:
            self._dirty = True  # written at the next sync, which this starts
        self._wake.set()

    def _event(self, node: dict[str, Any], kind: str, reason: str, message: str) -> None:
        uid = (node.get("metadata") or {}).get("uid", self.node)
        with self._lock:
            self._queue(node_event(self.node, uid, self.cfg["event_namespace"], kind, reason, message))

    def _queue(self, event: dict[str, Any]) -> None:
        """Caller holds the lock."""
        self._pending_events.append(event)
        del self._pending_events[:-MAX_PENDING_EVENTS]

    def _flush_events(self, api: KubeApi) -> None:
        while True:
            with self._lock:
                if not self._pending_events:
                    return
                event = self._pending_events[0]
            try:
                api.create_event(event["metadata"]["namespace"], event)
            except KubeError as e:
                about = event["involvedObject"]
                if about["kind"] != "Pod" or e.kind not in DROPPED_POD_EVENT_ERRORS:
                    raise
                log.warning("cannot post Event %s on pod %s/%s (%s): %s; dropped", event["reason"],
                            about["namespace"], about["name"], e.kind, e)
                with self._lock:
                    self.errors[e.kind] = self.errors.get(e.kind, 0) + 1
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
