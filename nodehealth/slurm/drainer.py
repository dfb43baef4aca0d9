"""The Slurm face: drain this node or resume it through scontrol, after one check pass (`nodehealth
slurm`, cli.py) or from the daemon's own passes (`nodehealth daemon --slurm`, Drainer).

A degraded or fatal verdict drains the node with the worst finding as the reason; a healthy one
resumes only a drain of ours (scontrol.PREFIX); an unknown one leaves the node as it is.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from nodehealth.faces import Worker
from nodehealth.model import Finding, Metric, Report, Severity, Status
from nodehealth.slurm.scontrol import PREFIX, Scontrol, SlurmError

log = logging.getLogger("nodehealth.slurm")

# Exit codes of `nodehealth slurm` (0-2 are `check`'s).
EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_UNKNOWN, EXIT_SLURM = 0, 1, 2, 3
_UNSAFE = re.compile(r"[^A-Za-z0-9 ._:/,+@()-]+")


def drain_reason(finding: Finding, limit: int) -> str:
    """`nodehealth: Xid79FallenOffBus 0000:cb:00.0`: printable, one line, at most `limit` characters."""
    text = " ".join(_UNSAFE.sub("_", f"{PREFIX} {finding.reason} {finding.device or ''}").split())
    return text[:limit].rstrip()


@dataclass(frozen=True)
class Outcome:
    code: int  # the exit code of `nodehealth slurm`
    line: str  # what was done, for a person
    ours: bool  # the node is drained by nodehealth now
    other: bool  # the node is drained by someone else


def worst_reason(report: Report, limit: int) -> str | None:
    """The drain reason an unhealthy verdict asks for; None for any other verdict."""
    if report.status is not Status.UNHEALTHY:
        return None
    return drain_reason(next(f for f in report.findings
                             if f.severity.rank >= Severity.DEGRADED.rank and f.silenced is None), limit)


def act(report: Report, node: str, ctl: Scontrol, reason_limit: int) -> Outcome:
    """Drain on a degraded or fatal verdict, resume our own drain once healthy."""
    current = ctl.node(node)
    other = current.drained and not current.ours
    reason = worst_reason(report, reason_limit)
    if reason is not None:
        if other:
            return Outcome(EXIT_UNHEALTHY, f"{node}: unhealthy ({reason}); left as drained by someone else: "
                                           f"{current.reason}", False, True)
        if current.ours and current.reason == reason:
            return Outcome(EXIT_UNHEALTHY, f"{node}: unhealthy, already drained: {reason}", True, False)
        would = ctl.drain(node, reason)
        if would is not None:
            return Outcome(EXIT_UNHEALTHY, f"{node}: unhealthy; dry-run: would run {would}", False, False)
        return Outcome(EXIT_UNHEALTHY, f"{node}: drained: {reason}", True, False)
    if report.status is Status.HEALTHY:
        if current.ours:
            would = ctl.resume(node)
            if would is not None:
                return Outcome(EXIT_HEALTHY, f"{node}: healthy; dry-run: would run {would}", True, False)
            return Outcome(EXIT_HEALTHY, f"{node}: healthy, resumed (was: {current.reason})", False, False)
        return Outcome(EXIT_HEALTHY, f"{node}: healthy" + (f"; drained by someone else: {current.reason}"
                                                           if other else ""), False, other)
    # Unknown: no evidence either way, so the node stays as it is (a drain of ours stays too).
    return Outcome(EXIT_UNKNOWN, f"{node}: could not judge; node left {current.state}", current.ours, other)


class Drainer(Worker):
    """The daemon's Slurm face: keeps the node's drain in line with the latest verdict from its own
    thread, so a slow or absent slurmctld never holds up a pass.

    scontrol runs when the verdict or its worst finding changes, and every `resync_seconds` besides
    (a drain an admin lifted while the fault stays comes back, as HealthCheckProgram would do); not at
    every pass, which across a large cluster would load slurmctld for nothing.
    """

    THREAD_NAME = "slurm"

    def __init__(self, node: str, cfg: dict[str, Any], ctl: Scontrol | None = None):
        super().__init__()
        self.node = node
        self.cfg = cfg
        self.ctl = ctl or Scontrol(cfg, sleep=self._stop.wait)  # retries end at shutdown
        self._report: Report | None = None
        self._key: tuple[str, str | None] | None = None  # the verdict last acted on
        self._due = 0.0
        # What the metrics show.
        self.errors = 0
        self.last_sync: float | None = None
        self.outcome: Outcome | None = None

    def publish(self, report: Report) -> None:
        key = (report.status.value, worst_reason(report, self.cfg["reason_max_chars"]))
        with self._lock:
            self._report = report
            if key != self._key:
                self._due = 0.0
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                report, wait = self._report, max(0.0, self._due - time.monotonic())
            if report is None or wait > 0:
                self._wake.wait(None if report is None else wait)
                self._wake.clear()
                continue
            self.sync_once(report)

    def sync_once(self, report: Report) -> None:
        key = (report.status.value, worst_reason(report, self.cfg["reason_max_chars"]))
        try:
            outcome = act(report, self.node, self.ctl, self.cfg["reason_max_chars"])
        except Exception as e:  # slurmctld's refusal, or a bug: the thread lives on, counted and retried
            with self._lock:
                self.errors += 1
                self._due = time.monotonic() + self.cfg["retry_delay_seconds"] * self.cfg["attempts"]
            if isinstance(e, SlurmError):
                log.warning("slurm: node %s is %s, but %s", self.node, report.status.value, e)
            else:
                log.exception("slurm: acting on node %s failed; retrying", self.node)
            return
        with self._lock:
            changed = self.outcome is None or outcome.line != self.outcome.line
            self.outcome, self.last_sync, self._key = outcome, time.time(), key
            if self._report is report:  # a newer verdict that came in meanwhile is acted on at once
                self._due = time.monotonic() + self.cfg["resync_seconds"]
        if changed:
            log.info("slurm: %s", outcome.line)

    def metrics(self) -> list[Metric]:
        with self._lock:
            outcome, errors, last_sync = self.outcome, self.errors, self.last_sync
        m = Metric("nodehealth_slurm_errors_total", "scontrol calls of the daemon that failed after their retries.",
                   "counter")
        m.add((), errors)
        out = [m]
        m = Metric("nodehealth_slurm_last_sync_timestamp_seconds",
                   "Unix time the Slurm node's drain last matched the verdict.")
        m.add((), last_sync)
        out.append(m)
        drained = Metric("nodehealth_slurm_drained",
                         "1 while nodehealth's drain is on the Slurm node, as last read or written.")
        other = Metric("nodehealth_slurm_drained_by_other",
                       "1 while someone else's drain (an administrator's) is on the Slurm node; nodehealth leaves it.")
        drained.add((), None if outcome is None else int(outcome.ours))
        other.add((), None if outcome is None else int(outcome.other))
        dry_run = Metric("nodehealth_slurm_dry_run", "1 when the Slurm face only logs the scontrol update it would run "
                         "(slurm.dry_run).")
        dry_run.add((), int(self.ctl.dry_run))
        out += [drained, other, dry_run]
        return out
