"""What a verdict asks of the Node: per subsystem, a condition and a taint. Pure: no API calls.

Every check names its subsystem (SUBSYSTEM, checks/__init__.py); the worst finding of a subsystem
decides its condition (True: a problem) and its taint (fatal: NoSchedule, or NoExecute where
configured; degraded: PreferNoSchedule).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from nodehealth import registry
from nodehealth.model import Finding, Report, Severity, sort_findings

SUBSYSTEMS = ("gpu", "network", "memory", "storage", "kernel")
CONDITION_NAMES = {"gpu": "GPU", "network": "Network", "memory": "Memory", "storage": "Storage",
                   "kernel": "Kernel"}
CHECKS = {c.NAME: c for c in registry.CHECKS}
MAX_MESSAGE_CHARS = 1024


def subsystem_of(f: Finding) -> str:
    """The subsystem a finding taints: its check's (a PCIe finding follows its device's kind); the
    findings that come from no check (NothingChecked, a hung training job) taint the kernel's."""
    check = CHECKS.get(f.check)
    if check is None:
        return "kernel"
    one = getattr(check, "finding_subsystem", None)
    return one(f) if one is not None else check.SUBSYSTEM


def subsystems_of(f: Finding) -> set[str]:
    """The subsystems a finding counts in: its check's, or for a failed source's one finding
    (KernelLogUnreadable, under the collector's name) those of every check that reads the source."""
    if f.check not in CHECKS:
        readers = {c.SUBSYSTEM for c in registry.CHECKS if f.check in c.NEEDS}
        if readers:
            return readers
    return {subsystem_of(f)}


def condition_type(subsystem: str) -> str:
    return f"NodeHealth{CONDITION_NAMES[subsystem]}Problem"


@dataclass(frozen=True)
class SubsystemState:
    """What one subsystem should look like on the Node."""

    status: str  # condition status: "True" (a problem), "False" or "Unknown"
    reason: str
    message: str
    effect: str | None  # taint effect, or None for no taint


def desired_state(report: Report, cfg: dict[str, Any]) -> dict[str, SubsystemState]:
    """Per subsystem: the worst finding decides the condition and the taint."""
    worst: dict[str, list[Finding]] = {s: [] for s in SUBSYSTEMS}
    for f in sort_findings(report.findings):
        if f.silenced is None:  # a silenced finding neither taints nor sets a condition
            for subsystem in subsystems_of(f):
                worst[subsystem].append(f)
    noexecute = set(cfg["noexecute_subsystems"])
    out = {}
    for subsystem, findings in worst.items():
        top = findings[0] if findings else None
        if top is None or top.severity.rank < Severity.UNKNOWN.rank:
            out[subsystem] = SubsystemState("False", "NoProblem",
                                            f"nodehealth found no {CONDITION_NAMES[subsystem]} problem.", None)
            continue
        message = top.message
        if len(findings) > 1:
            message += f" ({len(findings) - 1} more {CONDITION_NAMES[subsystem]} findings in the nodehealth report.)"
        effect = None
        status = "True"
        if top.severity is Severity.FATAL:
            effect = "NoExecute" if subsystem in noexecute else "NoSchedule"
        elif top.severity is Severity.DEGRADED:
            effect = "PreferNoSchedule"
        else:
            status = "Unknown"
        out[subsystem] = SubsystemState(status, top.reason, message[:MAX_MESSAGE_CHARS], effect)
    return out


def taint_value(reason: str) -> str:
    """A reason as a valid label value: at most 63 characters of [A-Za-z0-9._-], alphanumeric ends."""
    value = re.sub(r"[^A-Za-z0-9._-]", "", reason)[:63]
    return value.strip("._-")

