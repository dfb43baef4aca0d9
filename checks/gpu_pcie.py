"""A GPU's PCIe link as NVML sees it: downtrained under load, held back by its slot, or replaying.

Idle GPUs lower their link generation to save power and raise it again under load, so a low
generation counts only while the GPU is busy. Width does not change with load: a link narrower
than it can be is a fault even at idle (a lane did not train: riser, cable or slot). The sysfs
pcie check sees the same width from the host side; this one adds what only NVML knows: whether
the GPU is busy, the SKU's expected link, and the replay counter.
"""
from __future__ import annotations

import math

from nodehealth.checks.gpu_sku import FACTS_UNKNOWN, device_of, match_sku, unknown_findings
from nodehealth.collectors.gpu_facts import Gpu, Pcie, rate_key
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "gpu_pcie"
NEEDS = ("nvml",)
SUBSYSTEM = "gpu"
DEBOUNCE = True
DEFAULTS: dict = {
    # GPU utilization (percent) from which the link must run at its maximum generation.
    "busy_utilization_percent": 30.0,
    # Replays are allowed up to what this bit error rate gives on the link as it runs now, per minute:
    # GT/s x 1e9 x lanes x BER x 60. At 1e-12 that is DCGM's PCIe watch: Gen4 x16 16/min, Gen5 x16 31/min.
    "replay_ber": 1e-12,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "busy_utilization_percent": "GPU utilization from which the link must run at its maximum generation",
    "replay_ber": "PCIe replays are allowed up to what this bit error rate gives at the link's width and speed",
}
SOURCE = "NVML"
FINDS = ("a GPU link narrower than its max (even idle), a lower generation while busy (idle GPUs downshift on "
         "purpose), a slot below what the SKU expects, PCIe replay rates over DCGM's per-link budget")
REASONS = {
    "GpuPcieWidthDegraded": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                                   "the GPU's link is narrower than its max (even idle)"),
    "GpuPcieGenDegraded": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                                 "the link runs below its max generation while the GPU is busy (utilization at or "
                                 "over `busy_utilization_percent`, 30)"),
    "GpuPcieBelowSku": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                              "the slot gives the GPU less than its SKU expects"),
    "GpuPcieReplays": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                             "PCIe replays over what `replay_ber` (1e-12) allows at the link's width and speed"),
    "GpuFactsUnknown": FACTS_UNKNOWN,
}

GT_PER_SECOND = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}  # per lane, by generation
GROUPS = ("all", "pcie", "utilization")
FIX_LINK = "reseat the GPU or its riser and check the cable, then have the slot inspected"


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    findings: list[Finding] = []
    for gpu in obs.facts["nvml"].gpus:
        findings += unknown_findings(NAME, gpu, GROUPS)
        if gpu.pcie is None:
            continue
        findings += _width(gpu, gpu.pcie)
        findings += _generation(gpu, gpu.pcie, cfg["busy_utilization_percent"])
        findings += _below_sku(gpu, gpu.pcie)
        findings += _replays(gpu, gpu.pcie, obs, cfg["replay_ber"])
    return findings


def _evidence(p: Pcie, **more) -> dict:
    return dict(current_gen=p.current_gen, max_gen=p.max_gen, current_width=p.current_width,
                max_width=p.max_width, **more)


def _width(gpu: Gpu, p: Pcie) -> list[Finding]:
    if p.current_width is None or p.max_width is None or p.current_width >= p.max_width:
        return []
    return [Finding(
        NAME, Severity.DEGRADED, "GpuPcieWidthDegraded",
        f"{gpu.label} runs its PCIe link at x{p.current_width} of x{p.max_width}: {p.max_width - p.current_width} "
        f"lane(s) did not train, so host-to-GPU copies get {p.current_width / p.max_width:.0%} of the bandwidth; "
        f"{FIX_LINK}.",
        device=device_of(gpu), action=Action.HW_INSPECTION, evidence=_evidence(p))]


def _generation(gpu: Gpu, p: Pcie, busy_percent: float) -> list[Finding]:
    utilization = gpu.utilization_gpu_percent
    if p.current_gen is None or p.max_gen is None or p.current_gen >= p.max_gen:
        return []
    if utilization is None or utilization < busy_percent:
        return []  # idle GPUs lower their link generation to save power
    return [Finding(
        NAME, Severity.DEGRADED, "GpuPcieGenDegraded",
        f"{gpu.label} runs its PCIe link at Gen{p.current_gen} of Gen{p.max_gen} while {utilization:.0f}% busy: "
        f"host-to-GPU copies get about {_speed_share(p.current_gen, p.max_gen)} of the bandwidth; {FIX_LINK}.",
        device=device_of(gpu), action=Action.HW_INSPECTION,
        evidence=_evidence(p, utilization_percent=utilization, busy_percent=busy_percent))]


def _below_sku(gpu: Gpu, p: Pcie) -> list[Finding]:
    """The best the link can do (the lower of the GPU's and the slot's) is less than the product supports."""
    sku = match_sku(gpu.name)
    if sku is None:
        return []
    short = []
    if sku.pcie_gen is not None and p.max_gen is not None and p.max_gen < sku.pcie_gen:
        short.append(f"Gen{p.max_gen} instead of Gen{sku.pcie_gen}")
    if sku.pcie_width is not None and p.max_width is not None and p.max_width < sku.pcie_width:
        short.append(f"x{p.max_width} instead of x{sku.pcie_width}")
    if not short:
        return []
    return [Finding(
        NAME, Severity.DEGRADED, "GpuPcieBelowSku",
        f"{gpu.label} can reach only {' and '.join(short)} on PCIe, less than a {sku.name} supports: the slot, "
        "riser or a BIOS link-speed setting holds it back and host-to-GPU copies lose bandwidth; check the BIOS "
        "PCIe settings and the riser, and move the GPU to a full slot.",
        device=device_of(gpu), action=Action.HW_INSPECTION,
        evidence=_evidence(p, sku=sku.name, sku_gen=sku.pcie_gen, sku_width=sku.pcie_width))]


def _replays(gpu: Gpu, p: Pcie, obs: Observed, ber: float) -> list[Finding]:
    rate = obs.rate("nvml", rate_key(gpu, "pcie_replay"))
    gen = p.current_gen or p.max_gen
    width = p.current_width or p.max_width
    if not rate or gen not in GT_PER_SECOND or width is None or width <= 0:
        return []
    per_minute = rate * 60
    allowed = math.ceil(GT_PER_SECOND[gen] * 1e9 * width * ber * 60)
    if round(per_minute, 6) <= allowed:  # rates are floats: 31/60 per second is 31 per minute
        return []
    return [Finding(
        NAME, Severity.DEGRADED, "GpuPcieReplays",
        f"{gpu.label} replays {per_minute:.3g} PCIe packets per minute, above the {allowed} per minute a bit "
        f"error rate of {ber:g} allows at Gen{gen} x{width}: the link is marginal and copies slow down; {FIX_LINK}.",
        device=device_of(gpu), action=Action.HW_INSPECTION,
        evidence=_evidence(p, replays_per_minute=per_minute, allowed_per_minute=allowed, total=p.replay))]


def _speed_share(current_gen: int, max_gen: int) -> str:
    if current_gen in GT_PER_SECOND and max_gen in GT_PER_SECOND:
        return f"{GT_PER_SECOND[current_gen] / GT_PER_SECOND[max_gen]:.0%}"
    return "a fraction"
