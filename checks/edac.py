"""Memory errors counted by EDAC (collectors/edac.py): any uncorrected error is fatal, corrected
errors on one DIMM at or over a limit make it degraded (host-hardware.md sections 1 and 9)."""
from __future__ import annotations

from nodehealth.model import Action, Finding, Observed, Severity

NAME = "edac"
NEEDS = ("edac",)
SUBSYSTEM = "memory"
DEBOUNCE = False
DEFAULTS: dict = {
    # Corrected errors on one DIMM since boot that make it suspect: mcelog's default
    # ce-error-threshold (10 per 24 h per DIMM), applied to the boot's count, which only grows.
    "corrected_limit": 10,
}


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    limit = int(dict(DEFAULTS, **cfg)["corrected_limit"])
    findings = []
    for mc in obs.facts["edac"].controllers:
        named = f"memory controller {mc.name}" + (f" ({mc.mc_name})" if mc.mc_name else "")
        places = [(f"{mc.name}/{d.name}", d.label or d.location or d.name, d.ce_count, d.ue_count) for d in mc.dimms]
        if mc.ue_noinfo_count or mc.ce_noinfo_count:
            places.append((f"{mc.name}/unattributed", "no DIMM named", mc.ce_noinfo_count, mc.ue_noinfo_count))
        if not mc.dimms:  # counters of the controller only
            places.append((mc.name, "the controller's DIMMs", mc.ce_count, mc.ue_count))
        for device, label, ce, ue in places:
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
