"""Downtrained PCIe links and AER errors on GPUs, NVSwitches, NICs and NVMe drives."""
from __future__ import annotations

import math

from nodehealth.collectors.pcie import PciDevice, aer_key
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "pcie"
NEEDS = ("pcie",)
SUBSYSTEM = "kernel"  # a device of no known kind; see finding_subsystem
DEBOUNCE = True

DEFAULTS: dict = {
    # PCI addresses (0000:01:00.0) whose links are not judged, e.g. an onboard NIC that the board
    # wires with fewer lanes than the chip supports.
    "ignore_devices": [],
    # Correctable AER errors are allowed up to what this bit error rate produces on the link as it
    # runs now: GT/s x 1e9 x lanes x BER per second. At 1e-12 that is DCGM's PCIe replay budget,
    # ceil(0.06 x GT/s x lanes) per minute: 31/min at x16 32 GT/s (Gen5), 16/min at x16 Gen4.
    "correctable_error_ber": 1e-12,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "ignore_devices": ("PCI addresses (`0000:01:00.0`) whose links are not judged, e.g. an onboard NIC wired with "
                       "fewer lanes than it supports"),
    "correctable_error_ber": ("correctable AER errors are allowed up to what this bit error rate gives at the "
                              "link's width and speed (1e-12: 31 per minute at Gen5 x16)"),
}
SOURCE = "`/sys/bus/pci/devices`"
FINDS = ("GPUs, NICs, NVMe drives and NVSwitches whose link trained below its width or speed; AER fatal, non-fatal "
         "and correctable errors. GPUs that NVML reports are left to `gpu_pcie`. A finding's subsystem follows its "
         "device: gpu, network (a NIC), storage (an NVMe drive), else kernel")
REASONS = {
    "PCIeLinkWidthDegraded": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                                    "a link trained with fewer lanes than the device and its slot support"),
    "PCIeLinkSpeedDegraded": Reason((Severity.DEGRADED, Severity.WARNING), Action.HW_INSPECTION,
                                    "a link runs below its speed; warning for an NVSwitch (its PCIe link carries "
                                    "only management traffic)"),
    "PCIeLinkSpeedBelowMax": Reason(Severity.INFO, Action.NONE,
                                    "a GPU's link is below its speed in sysfs: normal while the GPU is idle"),
    "PCIeSlotSlowerThanDevice": Reason(Severity.INFO, Action.NONE,
                                       "the slot offers fewer lanes or a lower speed than the device; the link is "
                                       "judged against the slot"),
    "PCIeAERFatal": Reason(Severity.FATAL, Action.HW_INSPECTION,
                           "fatal uncorrectable AER errors since boot: the link was reset and work on the device "
                           "failed"),
    "PCIeAERNonFatal": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                              "new non-fatal uncorrectable AER errors (a counter event, held 10 min)"),
    "PCIeAERCorrectable": Reason(Severity.WARNING, Action.HW_INSPECTION,
                                 "correctable AER errors above what a bit error rate of `correctable_error_ber` "
                                 "(1e-12) allows at the link's width and speed"),
}


# A finding taints the subsystem of its device's kind.
KIND_SUBSYSTEMS = {"gpu": "gpu", "nvswitch": "gpu", "nic": "network", "nvme": "storage"}


def finding_subsystem(f: Finding) -> str:
    return KIND_SUBSYSTEMS.get(str(f.evidence.get("kind", "")), SUBSYSTEM)


# Non-fatal AER errors are judged by their increase: one increase is the whole event, raised at once
# and held by the policy instead of waiting for repeated bad passes.
EVENT_REASONS = frozenset({"PCIeAERNonFatal"})


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    ignored = set(cfg["ignore_devices"])
    judged_by_nvml = _gpus_with_nvml_link(obs)
    findings: list[Finding] = []
    for device in obs.facts["pcie"].devices:
        if device.address in ignored:
            continue
        if device.address not in judged_by_nvml:
            findings.extend(_link(device))
        findings.extend(_aer(device, obs, cfg))
    return findings


def _gpus_with_nvml_link(obs: Observed) -> set[str]:
    """GPUs whose link the gpu_pcie check judges from NVML, knowing whether the GPU is busy (an idle
    GPU drops its link speed on purpose); judging them here too would report one link twice."""
    facts = obs.facts.get("nvml")
    if facts is None:
        return set()
    return {g.pci_bus_id for g in facts.gpus if g.pci_bus_id and g.pcie is not None and g.pcie.current_width}


def _effective_max(device_max, slot_max):
    """What the link can reach: the lower of the device's and its upstream port's capability."""
    if device_max is None or slot_max is None:
        return device_max
    return min(device_max, slot_max)


def _link(d: PciDevice) -> list[Finding]:
    out: list[Finding] = []
    max_width = _effective_max(d.max_width, d.parent_max_width)
    max_speed = _effective_max(d.max_speed_gts, d.parent_max_speed_gts)
    runs = f"{d.label} runs at {_versus(d.current_width, max_width, d.current_speed_gts, max_speed)}"
    evidence = {"kind": d.kind, "current_width": d.current_width, "max_width": max_width,
                "current_speed_gts": d.current_speed_gts, "max_speed_gts": max_speed}
    if d.current_width is not None and max_width is not None and d.current_width < max_width:
        out.append(Finding(
            NAME, Severity.DEGRADED, "PCIeLinkWidthDegraded",
            f"{runs}: {_lost_lanes(d.current_width, max_width)}, so its bandwidth falls to "
            f"{_share(d.current_width, max_width)}; reseat the card and check the riser or cable, "
            "then have the slot inspected.",
            device=d.address, action=Action.HW_INSPECTION, evidence=evidence))
    if d.current_speed_gts is not None and max_speed is not None and d.current_speed_gts < max_speed:
        out.append(_slow_link(d, runs, _share(d.current_speed_gts, max_speed), evidence))
    slot = _slot_limit(d)
    if slot is not None:
        out.append(slot)
    return out


def _slow_link(d: PciDevice, runs: str, share: str, evidence: dict) -> Finding:
    if d.kind == "gpu":
        # NVIDIA GPUs drop their link to 2.5 GT/s when idle to save power and train back up
        # under load, so sysfs alone cannot tell an idle GPU from a bad link. Reported as info
        # only; the NVML collector judges the link generation under load.
        return Finding(
            NAME, Severity.INFO, "PCIeLinkSpeedBelowMax",
            f"{runs}: normal for an idle GPU, which lowers its link speed to save power; "
            "a fault only if it stays low under load.",
            device=d.address, evidence=evidence)
    if d.kind == "nvswitch":
        # The NVSwitch's PCIe link carries only management traffic (NVLink carries the data), so
        # a slow link costs no job bandwidth, but it still points at a marginal board connection.
        return Finding(
            NAME, Severity.WARNING, "PCIeLinkSpeedDegraded",
            f"{runs}: this management link carries no NVLink traffic, but a link below its speed points "
            "at a marginal board connection; have it inspected at the next maintenance.",
            device=d.address, action=Action.HW_INSPECTION, evidence=evidence)
    return Finding(
        NAME, Severity.DEGRADED, "PCIeLinkSpeedDegraded",
        f"{runs}: its bandwidth falls to {share}; reseat the card and check the riser or cable, "
        "then have the slot inspected.",
        device=d.address, action=Action.HW_INSPECTION, evidence=evidence)


def _slot_limit(d: PciDevice) -> Finding | None:
    """A device in a slot that offers fewer lanes or a lower speed than the device supports."""
    narrower = d.max_width is not None and d.parent_max_width is not None and d.parent_max_width < d.max_width
    slower = (d.max_speed_gts is not None and d.parent_max_speed_gts is not None
              and d.parent_max_speed_gts < d.max_speed_gts)
    if not (narrower or slower):
        return None
    return Finding(
        NAME, Severity.INFO, "PCIeSlotSlowerThanDevice",
        f"{d.label} can run {_describe_link(d.max_width, d.max_speed_gts)} but its upstream port "
        f"{d.parent_address} offers only {_describe_link(d.parent_max_width, d.parent_max_speed_gts)}: "
        "the link is judged against the slot; move the card to a full slot to get its full bandwidth.",
        device=d.address,
        evidence={"kind": d.kind, "slot_max_width": d.parent_max_width, "slot_max_speed_gts": d.parent_max_speed_gts})


def _aer(d: PciDevice, obs: Observed, cfg: dict) -> list[Finding]:
    out: list[Finding] = []
    fatal = d.aer_total("fatal")
    if fatal:
        # An uncorrectable fatal error means the link itself was declared unreliable and reset:
        # data in flight was lost, and on a GPU it usually comes with Xid 79 (fallen off the bus).
        # The count only resets at reboot, so the finding lasts until then (sticky, like other
        # fatal hardware faults).
        out.append(Finding(
            NAME, Severity.FATAL, "PCIeAERFatal",
            f"{d.label} reported {fatal} fatal uncorrectable PCIe error(s) since boot "
            f"({_types(d, 'fatal')}): the link was reset and work using the device failed; "
            "drain the node, reseat the device and check the riser or cable, and replace it if it recurs.",
            device=d.address, action=Action.HW_INSPECTION,
            evidence={"kind": d.kind, "fatal_total": fatal, "by_type": dict(d.aer["fatal"].by_type)}))
    nonfatal_rate = obs.rate("pcie", aer_key(d, "nonfatal"))
    if nonfatal_rate:
        # Non-fatal uncorrectable errors are counted since boot and a few are common during boot
        # enumeration, so only new ones count: the device recovered, but a transaction was lost.
        out.append(Finding(
            NAME, Severity.DEGRADED, "PCIeAERNonFatal",
            f"{d.label} reports new non-fatal uncorrectable PCIe errors ({nonfatal_rate * 60:.3g} per minute, "
            f"{d.aer_total('nonfatal')} since boot; {_types(d, 'nonfatal')}): transactions are lost and retried "
            "by the driver; check the riser or cable and reseat the device.",
            device=d.address, action=Action.HW_INSPECTION,
            evidence={"kind": d.kind, "per_second": nonfatal_rate, "nonfatal_total": d.aer_total("nonfatal")}))
    correctable = _correctable(d, obs, cfg)
    if correctable is not None:
        out.append(correctable)
    return out


def _correctable(d: PciDevice, obs: Observed, cfg: dict) -> Finding | None:
    rate = obs.rate("pcie", aer_key(d, "correctable"))
    width = d.current_width or d.max_width
    speed = d.current_speed_gts or d.max_speed_gts
    if not rate or not width or not speed:
        return None
    per_minute = rate * 60
    allowed = math.ceil(speed * 1e9 * width * cfg["correctable_error_ber"] * 60)
    if round(per_minute, 6) <= allowed:  # rates are floats: 31/60 per second is 31 per minute
        return None
    return Finding(
        NAME, Severity.WARNING, "PCIeAERCorrectable",
        f"{d.label} reports {per_minute:.3g} correctable PCIe errors per minute, above the {allowed} per minute "
        f"a bit error rate of {cfg['correctable_error_ber']:g} allows at x{width} {speed:.1f} GT/s: the link is "
        "replaying packets and may degrade further; check the riser or cable at the next maintenance.",
        device=d.address, action=Action.HW_INSPECTION,
        evidence={"kind": d.kind, "per_minute": per_minute, "allowed_per_minute": allowed})


def _describe_link(width: int | None, speed: float | None) -> str:
    parts = []
    if width is not None:
        parts.append(f"x{width}")
    if speed is not None:
        parts.append(f"{speed:.1f} GT/s")
    return " ".join(parts) or "an unknown link"


def _versus(width: int | None, max_width: int | None, speed: float | None, max_speed: float | None) -> str:
    """`x8 of x16, 16.0 of 32.0 GT/s`, leaving out what is unknown."""
    parts = []
    if width is not None:
        parts.append(f"x{width}" if max_width is None else f"x{width} of x{max_width}")
    if speed is not None:
        parts.append(f"{speed:.1f} GT/s" if max_speed is None else f"{speed:.1f} of {max_speed:.1f} GT/s")
    return ", ".join(parts)


def _lost_lanes(width: int, max_width: int) -> str:
    lost = max_width - width
    return f"{lost} lane{'s' if lost != 1 else ''} did not train"


def _share(current: float, maximum: float) -> str:
    return f"{current / maximum:.0%} of what the link can carry"


def _types(d: PciDevice, severity: str) -> str:
    counts = d.aer.get(severity)
    named = sorted((k, v) for k, v in (counts.by_type.items() if counts else ()) if v)
    return ", ".join(f"{k} {v}" for k, v in named) or "no type recorded"
