"""NVLink state: links that are down or trained below their speed, judged against the GPU's SKU.

A link that is down or slow is a hardware state, not a blip, so it is judged at once (no debounce);
the error counters, which do blip, are judged in nvlink_errors. Only GPUs whose SKU expects NVLinks
are judged: PCIe cards (H100 NVL, H100 PCIe, ...) have optional bridges, and judging them raised
false link-down alarms elsewhere (NVSentinel PR #1481). Like DCGM, links that are down while MIG is
enabled are ignored: MIG does not use NVLink.
"""
from __future__ import annotations

from nodehealth.checks.gpu_sku import FACTS_UNKNOWN, GpuSku, device_of, match_sku, unknown_findings
from nodehealth.collectors.gpu_facts import Gpu
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "nvlink"
NEEDS = ("nvml",)
SUBSYSTEM = "gpu"
DEBOUNCE = False
DEFAULTS: dict = {
    # Active links every GPU must have; 0 takes the count from the SKU table (checks/gpu_sku.py). Set it
    # where a board wires fewer links than the product has.
    "expected_links": 0,
    # A link below this share of its SKU's per-link speed is degraded. Not 1.0: NVML rounds speeds to
    # whole MB/s (26562 for 26.5625 GB/s). A degraded H200 showed links at 1.0 and 1.562 GB/s of 26.562.
    "min_link_speed_share": 0.98,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "expected_links": "active links every GPU must have; 0 takes the count from the SKU table",
    "min_link_speed_share": ("a link below this share of its SKU's per-link speed is degraded (not 1.0: NVML rounds "
                             "speeds)"),
}
SOURCE = "NVML"
FINDS = ("fewer active NVLinks than the SKU has (18 on H100/H200 SXM, 8 on H800, 12 on A100), links slower than the "
         "SKU's speed; MIG and PCIe cards left out")
REASONS = {
    "NvLinkDown": Reason(Severity.FATAL, Action.RESET_GPU,
                         "fewer active NVLinks than the SKU has (or `expected_links`)"),
    "NvLinkSpeedDegraded": Reason(Severity.DEGRADED, Action.RESET_GPU,
                                  "a link below `min_link_speed_share` (0.98) of the SKU's per-link speed"),
    "NvLinkStateUnknown": Reason(Severity.UNKNOWN, Action.NONE,
                                 "the links NVML could not read would decide whether enough are up"),
    "GpuFactsUnknown": FACTS_UNKNOWN,
}

GROUPS = ("all", "nvlink")


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    findings: list[Finding] = []
    for gpu in obs.facts["nvml"].gpus:
        # Without its product name a GPU has no SKU to be judged by: then its identity matters too.
        findings += unknown_findings(NAME, gpu, GROUPS if gpu.name else GROUPS + ("identity",))
        sku = match_sku(gpu.name)
        if sku is None or sku.nvlinks is None or not gpu.nvlinks:
            continue
        if not gpu.mig_enabled:
            findings += _link_count(gpu, sku, cfg["expected_links"] or sku.nvlinks)
        findings += _link_speed(gpu, sku, cfg["min_link_speed_share"])
    return findings


def _link_count(gpu: Gpu, sku: GpuSku, expected: int) -> list[Finding]:
    active = [link.link for link in gpu.nvlinks if link.active is True]
    down = [link.link for link in gpu.nvlinks if link.active is False]
    unread = [link.link for link in gpu.nvlinks if link.active is None]
    if len(active) >= expected:
        return []
    evidence = {"active": len(active), "expected": expected, "down": down, "state_unknown": unread,
                "sku": sku.name}
    if len(active) + len(unread) >= expected:
        return [Finding(
            NAME, Severity.UNKNOWN, "NvLinkStateUnknown",
            f"Could not judge the NVLinks of {gpu.label}: {len(active)} of the {expected} links a {sku.name} needs "
            f"are active and NVML gave no state for {_links(unread)}.",
            device=device_of(gpu), evidence=evidence)]
    named = f"; down: {_links(down)}" if down else ""
    return [Finding(
        NAME, Severity.FATAL, "NvLinkDown",
        f"{gpu.label} has {len(active)} of {expected} NVLinks active ({sku.name}{named}): GPU-to-GPU traffic "
        "through it slows down or fails, which stalls every collective it takes part in; drain the node and "
        "reset the GPU (nvidia-smi -r; on NVSwitch systems reboot), and have the NVLink path inspected if a link "
        "stays down.",
        device=device_of(gpu), action=Action.RESET_GPU, evidence=evidence)]


def _link_speed(gpu: Gpu, sku: GpuSku, share: float) -> list[Finding]:
    if sku.nvlink_speed_mbps is None:
        return []
    floor = sku.nvlink_speed_mbps * share
    slow = [(link.link, link.speed_mbps) for link in gpu.nvlinks
            if link.active is True and link.speed_mbps is not None and link.speed_mbps < floor]
    if not slow:
        return []
    shown = ", ".join(f"link {n} at {speed / 1000:.3g} GB/s" for n, speed in slow)
    return [Finding(
        NAME, Severity.DEGRADED, "NvLinkSpeedDegraded",
        f"{gpu.label} has {len(slow)} NVLink(s) trained below the {sku.nvlink_speed_mbps / 1000:g} GB/s a "
        f"{sku.name} link runs at ({shown}): collectives through this GPU run at the slowest link's pace; reset "
        "the GPU (nvidia-smi -r; on NVSwitch systems reboot) and have the link inspected if it stays slow.",
        device=device_of(gpu), action=Action.RESET_GPU,
        evidence={"slow_links": {str(n): speed for n, speed in slow}, "expected_mbps": sku.nvlink_speed_mbps})]


def _links(numbers: list[int]) -> str:
    return ("link " if len(numbers) == 1 else "links ") + ", ".join(map(str, numbers))
