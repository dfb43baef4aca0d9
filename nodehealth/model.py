"""The shared vocabulary: severities, actions, findings, metric families and the pass report.

Everything here is plain data so that collectors, checks and faces can exchange it without
importing each other.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


class Severity(str, enum.Enum):
    OK = "ok"
    INFO = "info"
    WARNING = "warning"
    DEGRADED = "degraded"  # works, but slower or at risk
    FATAL = "fatal"  # the node must not take work
    UNKNOWN = "unknown"  # the check could not judge

    @property
    def rank(self) -> int:
        """Order used to pick the worst finding; unknown sits between warning and degraded."""
        return _RANK[self]


_RANK = {
    Severity.OK: 0,
    Severity.INFO: 1,
    Severity.WARNING: 2,
    Severity.UNKNOWN: 3,
    Severity.DEGRADED: 4,
    Severity.FATAL: 5,
}


class Action(str, enum.Enum):
    NONE = "none"
    RESTART_APP = "restart-app"
    RESET_GPU = "reset-gpu"
    REBOOT = "reboot"
    HW_INSPECTION = "hw-inspection"
    FIX_CONFIG = "fix-config"


class Status(str, enum.Enum):
    """The node verdict; its value in `nodehealth_health_status` is the `check` exit code."""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"

    @property
    def code(self) -> int:
        return {Status.HEALTHY: 0, Status.UNHEALTHY: 1, Status.UNKNOWN: 2}[self]


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    reason: str  # stable CamelCase code, e.g. Xid79FallenOffBus
    message: str  # one human sentence with the numbers that matter
    device: str = ""
    action: Action = Action.NONE
    evidence: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    first_seen: float | None = field(default=None, compare=False)
    last_seen: float | None = field(default=None, compare=False)
    # The operator's silence that covers it (nodehealth/silences): still shown, never counted in the verdict.
    silenced: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity of a finding across passes."""
        return (self.check, self.reason, self.device)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "check": self.check,
            "severity": self.severity.value,
            "reason": self.reason,
            "message": self.message,
            "device": self.device,
            "action": self.action.value,
            "evidence": self.evidence,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
        }
        if self.silenced is not None:  # only then: a state file and a report without silences stay as they were
            out["silenced"] = self.silenced
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        return cls(
            check=d["check"],
            severity=Severity(d["severity"]),
            reason=d["reason"],
            message=d["message"],
            device=d.get("device", ""),
            action=Action(d.get("action", "none")),
            evidence=dict(d.get("evidence") or {}),
            first_seen=d.get("first_seen"),
            last_seen=d.get("last_seen"),
        )


@dataclass(frozen=True)
class Reason:
    """What a reason code means to an operator: the severities and actions its check gives it, and
    when. Each check keeps a table of these (`REASONS`) beside the code that makes the findings;
    docs/checks.md is written from them, and tests/test_docs.py ties them to the findings the code makes.
    An empty severity and action mean "set per code by a catalog" (the xid check's Xid and SXid codes).
    """

    severity: Severity | tuple[Severity, ...]
    action: Action | tuple[Action, ...]
    meaning: str

    @property
    def severities(self) -> tuple[Severity, ...]:
        return self.severity if isinstance(self.severity, tuple) else (self.severity,)

    @property
    def actions(self) -> tuple[Action, ...]:
        return self.action if isinstance(self.action, tuple) else (self.action,)


def sort_findings(findings: Sequence[Finding]) -> list[Finding]:
    """Worst first, then by check, device and reason, so output order is stable."""
    return sorted(findings, key=lambda f: (-f.severity.rank, f.check, f.device, f.reason))


class Metric:
    """One metric family as collectors describe it; exporter.py turns it into exposition.

    `kind` is "gauge", "counter" or "histogram". A counter's name ends in `_total` (as exposed); a
    histogram's samples come from `add_histogram` only.
    """

    __slots__ = ("name", "help", "kind", "labels", "samples", "buckets")

    def __init__(self, name: str, help: str, kind: str = "gauge", labels: Sequence[str] = ()):
        if kind not in ("gauge", "counter", "histogram"):
            raise ValueError(f"metric kind must be gauge, counter or histogram, not {kind!r}")
        if kind == "counter" and not name.endswith("_total"):
            raise ValueError(f"counter {name} must end in _total")
        self.name = name
        self.help = help
        self.kind = kind
        self.labels = tuple(labels)
        self.samples: list[tuple[tuple[str, ...], float]] = []
        self.buckets: tuple[float, ...] = ()  # a histogram's upper bounds, the same for all its series

    @classmethod
    def one(cls, name: str, help: str, value: float | None, kind: str = "gauge") -> Metric:
        """A family of one sample without labels (absent when `value` is None)."""
        m = cls(name, help, kind)
        m.add((), value)
        return m

    def add(self, label_values: Sequence[Any], value: float | None) -> None:
        """Add one sample; a None value (absent fact) adds nothing: absent is not zero."""
        if value is not None:
            self.put(tuple(map(str, label_values)), value)

    def put(self, labels: tuple[str, ...], value: float | None) -> None:
        """add() for a loop that made its labels once, a tuple of strings: a third of add()'s cost, which
        at the infiniband collector's ~450 samples a scrape is a tenth of the daemon's CPU at a 1 s
        cadence (benchmarks/RESULTS.md); the render finds the same tuple again, not an equal one."""
        if value is None:
            return
        if len(labels) != len(self.labels):
            raise ValueError(f"{self.name}: expected labels {self.labels}, got {labels}")
        self.samples.append((labels, float(value)))

    def add_histogram(self, label_values: Sequence[Any], buckets: Sequence[float], counts: dict[int, int],
                      total: float) -> None:
        """Add one histogram: sparse per-bucket counts ({index: n}, index len(buckets) = overflow) and
        the sum of the observations. Samples carry (labels..., part, bucket index); the exporter writes
        the cumulative `_bucket` series in order, then `_count` and `_sum`."""
        labels = tuple(map(str, label_values))
        if self.kind != "histogram" or len(labels) != len(self.labels):
            raise ValueError(f"{self.name}: not a histogram with labels {self.labels}")
        if self.buckets and tuple(buckets) != self.buckets:
            raise ValueError(f"{self.name}: every series of a histogram has the same buckets")
        self.buckets = tuple(buckets)
        running = 0
        for i in range(len(buckets) + 1):
            running += counts.get(i, 0)
            self.samples.append(((*labels, "0", f"{i:03d}"), float(running)))
        self.samples.append(((*labels, "1", ""), float(running)))
        self.samples.append(((*labels, "2", ""), float(total)))


@dataclass
class CollectorResult:
    name: str
    supported: bool
    success: bool
    duration_seconds: float = 0.0
    error: str | None = None  # why it failed, or why it is unsupported
    facts: Any = None
    # When it failed: the reason of the one finding its checks give together (the collector's
    # FAILED_REASON, e.g. KernelLogUnreadable); None gives each check its own CollectorFailed.
    failed_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "supported": self.supported,
            "success": self.success,
            "duration_seconds": round(self.duration_seconds, 6),
            "error": self.error,
        }


@dataclass
class Report:
    """One verdict and what it rests on: what every face shows (its own way), never judges again."""

    node: str
    status: Status
    findings: list[Finding]
    collectors: list[CollectorResult]
    time: float = 0.0
    rates: dict[str, dict[str, float]] = field(default_factory=dict)  # per collector, for the exporter only

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "status": self.status.value,
            "findings": [f.to_dict() for f in self.findings],
            "collectors": [c.to_dict() for c in self.collectors],
        }


def verdict(findings: Sequence[Finding], fail_on_warning: bool = False) -> Status:
    """healthy / unhealthy (a degraded or fatal finding) / unknown (could not judge, nothing worse).
    A silenced finding is shown but never counted: an operator said it is known."""
    findings = [f for f in findings if f.silenced is None]
    worst = max((f.severity.rank for f in findings), default=0)
    if worst >= Severity.DEGRADED.rank:
        return Status.UNHEALTHY
    if fail_on_warning and any(f.severity is Severity.WARNING for f in findings):
        return Status.UNHEALTHY
    if worst == Severity.UNKNOWN.rank:
        return Status.UNKNOWN
    return Status.HEALTHY


@dataclass
class Observed:
    """What a check sees: facts per collector, rates per collector, and the pass time."""

    facts: dict[str, Any]
    rates: dict[str, dict[str, float]] = field(default_factory=dict)
    now: float = 0.0

    def rate(self, collector: str, key: str) -> float | None:
        """Per-second rate of a counter since the previous pass; None on the first pass or after a reset."""
        return self.rates.get(collector, {}).get(key)
