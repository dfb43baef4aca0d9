"""The pingmesh controller's verdicts as this node's agent last read them, as facts for the `pingmesh`
check.

Not a polled collector: in the daemon with pingmesh and Kubernetes on, a thread reads the
controller's ConfigMap every window (nodehealth/pingmesh/verdicts.py) and hands the daemon these
facts, which it judges at once. `nodehealth check` reads no ConfigMap, so it has no such facts and
the check stays silent there. The agent's own families (probes, RTTs) come from
nodehealth/pingmesh/mesh.py, not from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodehealth.model import Metric

NAME = "pingmesh"


@dataclass(frozen=True)
class Verdicts:
    node: str  # this node's name, as the controller names it
    leaf: str  # this node's leaf in the inventory ("" when it has none)
    doc: dict[str, Any] | None  # the validated verdicts.json; None while the controller has written none
    read_at: float  # this node's wall clock at the read: the document's age is judged from it


def metrics(facts: Verdicts) -> list[Metric]:
    return []
