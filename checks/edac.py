"""Memory errors counted by EDAC (collectors/edac.py): any uncorrected error is fatal, corrected
errors on one DIMM at or over a limit make it degraded (docs/sources.md, "Host hardware severities")."""
from __future__ import annotations

from nodehealth.collectors.edac import MemoryController
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "edac"
NEEDS = ("edac",)
SUBSYSTEM = "memory"
DEBOUNCE = False
DEFAULTS: dict = {
    # Corrected errors on one DIMM since boot that make it suspect: mcelog's default
    # ce-error-threshold (10 per 24 h per DIMM), applied to the boot's count, which only grows.
    "corrected_limit": 10,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "corrected_limit": "corrected errors on one DIMM since boot that make it degraded",
}
SOURCE = "`/sys/devices/system/edac/mc/mc*/` and `dimmN/` (or legacy `csrowN/`)"
FINDS = ("uncorrectable errors on a DIMM (fatal), corrected errors at or over 10 this boot (degraded), named by the "
         "DIMM's label; an unreadable counter is absent, never 0")
REASONS = {
    "MemoryUncorrectableErrors": Reason(Severity.FATAL, Action.HW_INSPECTION,
                                        "EDAC counted uncorrectable errors on a DIMM this boot: data was lost; "
                                        "replace the DIMM"),
    "MemoryCorrectedErrorsHigh": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                                        "EDAC counted `corrected_limit` (10) or more corrected errors on a DIMM "
                                        "this boot: it is failing; replace it at the next drain"),
    "MemoryCorrectedErrors": Reason(Severity.WARNING, Action.NONE,
                                    "EDAC counted corrected errors on a DIMM this boot, under the limit; watch the "
                                    "count"),
}


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    limit = int(dict(DEFAULTS, **cfg)["corrected_limit"])
    findings = []
    for mc in obs.facts["edac"].controllers:
        named = f"memory controller {mc.name}" + (f" ({mc.mc_name})" if mc.mc_name else "")
        for device, label, ce, ue in places(mc):
            evidence = {"controller": mc.name, "label": label, "corrected": ce, "uncorrected": ue, "limit": limit}
            if ue:
                findings.append(Finding(
                    NAME, Severity.FATAL, "MemoryUncorrectableErrors",
                    f"EDAC counted {ue} uncorrectable memory errors on {label} of {named} this boot: data was lost; "
                    "drain the node and replace that DIMM.", device=device, action=Action.HW_INSPECTION,
                    evidence=evidence))
            elif ce is not None and ce >= limit:
                findings.append(Finding(
                    NAME, Severity.DEGRADED, "MemoryCorrectedErrorsHigh",
                    f"EDAC counted {ce} corrected memory errors on {label} of {named} this boot, at or over the "
                    f"limit of {limit}: the DIMM is failing; replace it at the next drain.",
                    device=device, action=Action.HW_INSPECTION, evidence=evidence))
            elif ce:
                findings.append(Finding(
                    NAME, Severity.WARNING, "MemoryCorrectedErrors",
                    f"EDAC counted {ce} corrected memory errors on {label} of {named} this boot (limit {limit}): "
                    "corrected by ECC; watch the count.", device=device, action=Action.NONE, evidence=evidence))
    return findings


def places(mc: MemoryController) -> list[tuple[str, str, int | None, int | None]]:
    """(device, label, corrected, uncorrected) of every place the controller's counters name.

    DIMMs (or legacy channels) first, then legacy rows for their uncorrected errors, the errors the
    driver could not attribute, and last what the controller's own totals count beyond all of those
    (a counter that could not be read, or a driver that names no DIMM): every error counts once.
    """
    out = [(f"{mc.name}/{d.name}", d.label or d.location or d.name, d.ce_count, d.ue_count) for d in mc.dimms]
    for row in mc.csrows:
        if row.ue_count:
            labels = " or ".join(dict.fromkeys(x for x in row.labels if x)) or f"the DIMMs of {row.name}"
            out.append((f"{mc.name}/{row.name}", labels, None, row.ue_count))
    if mc.ue_noinfo_count or mc.ce_noinfo_count:
        out.append((f"{mc.name}/unattributed", "no DIMM named", mc.ce_noinfo_count, mc.ue_noinfo_count))
    ce_left = _beyond(mc.ce_count, (ce for _, _, ce, _ in out))
    ue_left = _beyond(mc.ue_count, (ue for _, _, _, ue in out))
    if ce_left or ue_left:
        where = ("the controller's DIMMs" if not mc.dimms
                 else "DIMMs of this controller (not attributed to a DIMM by their own counters)")
        out.append((mc.name, where, ce_left, ue_left))
    return out


def _beyond(total: int | None, parts) -> int | None:
    """How much of the controller's total its parts do not account for (None when none or unknown)."""
    left = (total or 0) - sum(p for p in parts if p)
    return left if left > 0 else None
