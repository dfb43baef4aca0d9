"""The Slurm face: drain this node or resume it through scontrol, after one check pass (`nodehealth
slurm`, cli.py) or from the daemon's own passes (`nodehealth daemon --slurm`, Drainer).

A degraded or fatal verdict drains the node with the worst finding as the reason (and, with
attribution on, the Slurm jobs it hit); a healthy one resumes only a drain of ours (scontrol.PREFIX);
an unknown one leaves the node as it is.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from nodehealth.attribution.notices import drain_detail
from nodehealth.faces import Worker
from nodehealth.model import Finding, Metric, Report, Severity, Status
from nodehealth.slurm.scontrol import PREFIX, Scontrol, SlurmError

log = logging.getLogger("nodehealth.slurm")

# Exit codes of `nodehealth slurm` (0-2 are `check`'s).
EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_UNKNOWN, EXIT_SLURM = 0, 1, 2, 3
_UNSAFE = re.compile(r"[^A-Za-z0-9 ._:/,+@()-]+")


def drain_reason(finding: Finding, limit: int) -> str:
    """`nodehealth: Xid79FallenOffBus 0000:cb:00.0 job 42`: printable, one line, at most `limit`
    characters; the jobs the finding hit only where they fit whole."""
    base = _base_reason(finding, limit)
    jobs = drain_detail(finding)
    full = f"{base} {_clean(jobs)}" if jobs else base
    return full if len(full) <= limit else base


def _base_reason(finding: Finding, limit: int) -> str:
    """The reason without the jobs: which finding drained the node."""
    return _clean(f"{PREFIX} {finding.reason} {finding.device or ''}")[:limit].rstrip()


def _clean(text: str) -> str:
    return " ".join(_UNSAFE.sub("_", text).split())


def _drained_for(current: str, finding: Finding, limit: int) -> bool:
    """Whether our drain reason `current` is already this finding's: the same words, or the finding with
    the jobs it named when it drained (a job that ended, or a new holder of the GPU, calls no scontrol)."""
    base = _base_reason(finding, limit)
    return current == drain_reason(finding, limit) or current.startswith(base + " job")


@dataclass(frozen=True)
class Outcome:
    code: int  # the exit code of `nodehealth slurm`
    line: str  # what was done, for a person
    ours: bool  # the node is drained by nodehealth now
    other: bool  # the node is drained by someone else


def worst_finding(report: Report) -> Finding | None:
    """The finding an unhealthy verdict drains for; None for any other verdict."""
    if report.status is not Status.UNHEALTHY:
        return None
    return next((f for f in report.findings if f.severity.rank >= Severity.DEGRADED.rank and f.silenced is None),
                None)


def act(report: Report, node: str, ctl: Scontrol, reason_limit: int) -> Outcome:
    """Drain on a degraded or fatal verdict, resume our own drain once healthy."""
    current = ctl.node(node)
    other = current.drained and not current.ours
    worst = worst_finding(report)
    if worst is not None:
        reason = drain_reason(worst, reason_limit)
        if other:
            return Outcome(EXIT_UNHEALTHY, f"{node}: unhealthy ({reason}); left as drained by someone else: "
                                           f"{current.reason}", False, True)
        if current.ours and _drained_for(current.reason, worst, reason_limit):
            return Outcome(EXIT_UNHEALTHY, f"{node}: unhealthy, already drained: {current.reason}", True, False)
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

    scontrol runs when the verdict or its worst finding changes (or that finding first names its jobs),
    and every `resync_seconds` besides (a drain an admin lifted while the fault stays comes back, as
    HealthCheckProgram would do); not at every pass, which across a large cluster would load slurmctld
    for nothing, nor when only the jobs on the GPU change.
    """

    THREAD_NAME = "slurm"

    def __init__(self, node: str, cfg: dict[str, Any], ctl: Scontrol | None = None):
        super().__init__()
        self.node = node
        self.cfg = cfg
        self.ctl = ctl or Scontrol(cfg, sleep=self._stop.wait)  # retries end at shutdown
        self._report: Report | None = None
        self._key: tuple[str, Any] | None = None  # the verdict and worst finding last acted on
        self._named = False  # whether the reason acted on named the finding's jobs
        self._due = 0.0
        # What the metrics show.
        self.errors = 0
        self.last_sync: float | None = None
        self.outcome: Outcome | None = None

    def publish(self, report: Report) -> None:
        key, named = self._verdict(report)
        with self._lock:
            self._report = report
            if key != self._key or (named and not self._named):
                self._due = 0.0
        self._wake.set()

    def _verdict(self, report: Report) -> tuple[tuple[str, Any], bool]:
        """What the drain is about (the verdict, its worst finding's key), and whether its reason names jobs."""
        worst, limit = worst_finding(report), self.cfg["reason_max_chars"]
        named = worst is not None and drain_reason(worst, limit) != _base_reason(worst, limit)
        return (report.status.value, worst.key if worst is not None else None), named

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
        key, named = self._verdict(report)
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
            self.outcome, self.last_sync, self._key, self._named = outcome, time.time(), key, named
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
