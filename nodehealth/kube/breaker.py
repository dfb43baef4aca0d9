"""The quarantine circuit breaker: a cluster-wide cap on the nodes nodehealth quarantines at once."""
from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

from nodehealth.kube.api import ClientApi, KubeApi, KubeError, micro_time, now_rfc3339
from nodehealth.kube.defaults import DEFAULTS

log = logging.getLogger("nodehealth.kube")


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
                           f"at {now_rfc3339(time.time())}")
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

