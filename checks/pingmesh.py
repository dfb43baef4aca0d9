"""The pingmesh controller's verdicts about this node, its leaf and their paths, as findings.

The controller localizes a fault from every agent's probes and already holds a verdict open over
several windows (pingmesh.analysis.open_windows), so one noisy window names nothing: no debounce
here. A verdict about a node reaches it only through its own agent, which is what this check is.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nodehealth.model import Action, Finding, Observed, Reason, Severity

if TYPE_CHECKING:  # the facts' type only: `check` never has them, and need not load their module
    from nodehealth.collectors.pingmesh import Verdicts

NAME = "pingmesh"
NEEDS = ("pingmesh",)
SUBSYSTEM = "network"
DEBOUNCE = False
DEFAULTS: dict = {}

SOURCE = "the pingmesh controller's verdicts (the daemon with pingmesh on)"
FINDS = "this node or its leaf named faulty, a path from or to its leaf degraded, no inventory"
REASONS = {
    "PingmeshNodeFaulty": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                                 "the controller localized a network fault to this node"),
    "PingmeshLeafFaulty": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                                 "the controller localized a network fault to this node's leaf"),
    "PingmeshPathDegraded": Reason(Severity.WARNING, Action.NONE,
                                   "a leaf-to-leaf path from or to this node's leaf is degraded"),
    "PingmeshVerdictsStale": Reason(Severity.INFO, Action.NONE,
                                    "the controller's verdicts are older than 3 windows; they are ignored"),
    "PingmeshNoInventory": Reason(Severity.WARNING, Action.FIX_CONFIG, "the agent probes nobody: no inventory"),
    "PingmeshNotInInventory": Reason(Severity.WARNING, Action.FIX_CONFIG,
                                     "the agent probes nobody: this node is not in the inventory"),
}
# Verdicts older than this many of their windows are ignored: a controller that stopped (or an API
# server the agent cannot reach) must not keep a taint on a node forever. Three windows ride out a
# missed analysis or two and a leader change (a 15 s Lease).
STALE_WINDOWS = 3


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


def judge(obs: Observed, cfg: dict[str, Any]) -> list[Finding]:
    facts: Verdicts = obs.facts[NAME]
    return verdict_findings(facts.doc, facts.node, facts.leaf, facts.read_at)
