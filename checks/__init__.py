"""Checks: one module per concern. Pure functions from facts (and thresholds) to findings.

A check is a module that conforms to Check below (its globals are the members). Optional, where
the check has them:
    EVENT_REASONS: frozenset[str]        reasons that report a counter's increase: raised at once
                                         and held by the policy (policy.event_hold_seconds)
    finding_subsystem(finding) -> str    the subsystem of one finding, where it is not SUBSYSTEM
                                         (a PCIe finding follows its device's kind)

A check never reads a file, calls NVML or opens a socket.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from nodehealth.model import Finding, Observed, Reason


@runtime_checkable
class Check(Protocol):
    NAME: str  # the check's name (finding label, --only/--skip)
    # Collectors whose facts it reads: if one failed the engine reports the check as `unknown`, if
    # one is unsupported the check is skipped.
    NEEDS: tuple[str, ...]
    # What its findings taint on a Kubernetes Node: gpu, network, memory, storage or kernel
    # (nodehealth/kube/taints.py). Declared here, so that a new check cannot be forgotten there.
    SUBSYSTEM: str
    DEFAULTS: dict[str, Any]  # its thresholds (config section checks.<NAME>); MEANINGS says what each means
    # True for performance findings the daemon raises only after repeated bad passes; False for
    # events and hardware facts.
    DEBOUNCE: bool
    # For the operator (docs/checks.md, `nodehealth check --list`), in words, without Markdown links:
    SOURCE: str  # what it reads ("kernel log", "`/sys/class/infiniband`")
    FINDS: str  # what it finds
    # Every reason its findings can carry, with their severities, actions and meaning (model.Reason).
    REASONS: dict[str, Reason]

    def judge(self, obs: Observed, cfg: dict[str, Any]) -> list[Finding]:
        """The findings on these facts; never reads anything else."""
