"""Leader election over a Lease, as kube-controller-manager does it: one replica of a Deployment acts.

A 15 s Lease renewed every 5 s; a leader that could not renew for 10 s (the Lease less one renewal)
stops acting before anyone may take over. A standby looks every 2 s and once more just when the
Lease runs out, so it takes over at most HANDOVER_SECONDS (17 s) after the leader's last renewal: a
Lease's duration from the moment it saw that renewal, which is at most one look after it was made.
A Lease that claims a far longer duration (written by anyone but us) is honoured for at most
MAX_DURATION_FACTOR of our own, so that it cannot stop every leader for good.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

from nodehealth.kube.api import KubeApi, KubeError, micro_time

log = logging.getLogger("nodehealth.kube")

LEASE_SECONDS = 15.0
RENEW_SECONDS = 5.0
RETRY_SECONDS = 2.0  # a standby's look at the Lease (client-go's retry period); a leader's after a failed renewal
HANDOVER_SECONDS = LEASE_SECONDS + RETRY_SECONDS  # the most a standby waits after the leader's last renewal
MAX_DURATION_FACTOR = 2.0


class LeaderElector:
    """Holds the Lease while it can renew it; takes it over only once it has expired.

    Expiry is judged on this process's monotonic clock from the moment the Lease's record last
    changed (as client-go does), never from a renewTime written by another machine's clock. Every
    write is a compare-and-swap on the resourceVersion: of two candidates only one wins.
    """

    def __init__(self, api: Callable[[], KubeApi], namespace: str, name: str, identity: str, role: str,
                 lease_seconds: float = LEASE_SECONDS, renew_seconds: float = RENEW_SECONDS,
                 retry_seconds: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.role = role  # what the leader is, for the log: "the pingmesh controller"
        self.lease_seconds, self.renew_seconds = lease_seconds, renew_seconds
        self.retry_seconds = min(RETRY_SECONDS, renew_seconds) if retry_seconds is None else retry_seconds
        self.clock = clock
        self._record: tuple[Any, ...] | None = None
        self._seen_at = 0.0
        self._expires_at = -math.inf  # another holder's Lease, as judged from here
        self._valid_until = -math.inf
        self._renewed = False  # the last tick renewed our Lease
        self.holder = ""  # as last read, for the log

    @property
    def handover_seconds(self) -> float:
        """The most a standby waits after the leader's last renewal: a Lease, plus one look."""
        return self.lease_seconds + self.retry_seconds

    def is_leader(self) -> bool:
        return self.clock() < self._valid_until

    def next_delay(self) -> float:
        """Seconds until the next tick: a leader that renewed renews every renew_seconds; anyone else
        looks every retry_seconds, and once more just when the holder's Lease runs out."""
        if self._renewed and self.is_leader():
            return self.renew_seconds
        left = self._expires_at - self.clock()
        return left if 0 < left < self.retry_seconds else self.retry_seconds

    def tick(self) -> bool:
        """One try to acquire or renew the Lease; whether this replica leads. Raises KubeError
        (then a leader stays one until its renewal deadline passes)."""
        self._renewed = False
        api = self.api()
        started = self.clock()
        lease = api.get_lease(self.namespace, self.name)
        if lease is None:
            return self._write(api, None, started)
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, spec.get("renewTime"), spec.get("acquireTime"), spec.get("leaseTransitions"),
                  spec.get("leaseDurationSeconds"))
        if record != self._record:
            self._record, self._seen_at = record, started
        duration = spec.get("leaseDurationSeconds")
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or duration <= 0:
            duration = self.lease_seconds
        if duration > MAX_DURATION_FACTOR * self.lease_seconds:
            if self._seen_at == started:
                log.warning("Lease %s/%s claims %s s, far past our %g s: honoured for %g s only", self.namespace,
                            self.name, duration, self.lease_seconds, MAX_DURATION_FACTOR * self.lease_seconds)
            duration = MAX_DURATION_FACTOR * self.lease_seconds
        if holder and holder != self.identity and started - self._seen_at < duration:
            if self.holder != holder:
                log.info("%s %s leads; %s stands by", self.role, holder, self.identity)
            self.holder = holder
            self._expires_at = self._seen_at + duration
            self._valid_until = -math.inf
            return False
        return self._write(api, lease, started)

    def _write(self, api: KubeApi, lease: dict[str, Any] | None, started: float) -> bool:
        now = micro_time(time.time())
        spec = dict((lease or {}).get("spec") or {})
        taking = spec.get("holderIdentity") != self.identity
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=max(1, math.ceil(self.lease_seconds)),
                    renewTime=now)
        if taking:
            spec.update(acquireTime=now, leaseTransitions=int(spec.get("leaseTransitions") or 0) + (lease is not None))
        body = dict(lease or {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                              "metadata": {"name": self.name, "namespace": self.namespace}}, spec=spec)
        try:
            if lease is None:
                api.create_lease(self.namespace, body)
            else:
                api.update_lease(self.namespace, body)
        except KubeError as e:
            if e.kind != "conflict":  # AlreadyExists or a stale resourceVersion: another candidate won
                raise
            self._valid_until = -math.inf
            return False
        if taking:
            log.info("%s leads %s now (Lease %s/%s; it was %s's)", self.identity, self.role,
                     self.namespace, self.name, self.holder or "nobody")
        self.holder = self.identity
        self._valid_until = started + self.lease_seconds - self.renew_seconds
        self._expires_at = -math.inf
        self._renewed = True
        return True

    def release(self) -> None:
        """Give the Lease up (a clean stop), so that a standby takes over at once."""
        if not self.is_leader():
            return
        self._valid_until = -math.inf
        try:
            api = self.api()
            lease = api.get_lease(self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = {k: v for k, v in lease["spec"].items() if k != "holderIdentity"}
            api.update_lease(self.namespace, dict(lease, spec=dict(spec, leaseDurationSeconds=1,
                                                                  renewTime=micro_time(time.time()))))
            log.info("%s gave up the Lease of %s", self.identity, self.role)
        except KubeError as e:
            log.warning("could not give up the Lease (%s); a standby takes over once it expires", e)

