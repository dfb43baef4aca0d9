"""NVLink error rates: CRC errors, replays and recoveries since the last pass.

Thresholds follow docs/sources.md, "NVLink errors": CRC errors at DCGM's
100 per second are fatal, any lower CRC rate and any replay or recovery are warnings (DCGM fails on
a single replay or recovery, which is strict for a counter that a healthy link also bumps). A check
of its own because rates blip: the policy raises these only after repeated bad passes. Every link
with counters is judged, whatever the SKU: a PCIe card's bridge link that errs is as bad as any.
"""
from __future__ import annotations

from nodehealth.checks.gpu_sku import device_of
from nodehealth.collectors.gpu_facts import Gpu, NvLink, rate_key
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "nvlink_errors"
NEEDS = ("nvml",)
SUBSYSTEM = "gpu"
DEBOUNCE = True
DEFAULTS: dict = {
    # CRC (flit or data) errors per second on one link that make the GPU fatal: DCGM's MAX_NVLINK_CRC_ERROR.
    "crc_errors_per_second": 100.0,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "crc_errors_per_second": "CRC errors per second on one link that make the GPU fatal (DCGM's limit)",
}
SOURCE = "NVML"
FINDS = "NVLink CRC, replay and recovery error rates (DCGM's thresholds)"
REASONS = {
    "NvLinkCrcErrorRateHigh": Reason(Severity.FATAL, Action.HW_INSPECTION,
                                     "CRC errors over `crc_errors_per_second` (100) on a link"),
    "NvLinkCrcErrors": Reason(Severity.WARNING, Action.HW_INSPECTION, "CRC errors on a link, under the limit"),
    "NvLinkReplays": Reason(Severity.WARNING, Action.HW_INSPECTION, "NVLink replays since the last pass"),
    "NvLinkRecoveries": Reason(Severity.WARNING, Action.HW_INSPECTION,
                               "NVLink recoveries (retrains) since the last pass"),
}


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    findings: list[Finding] = []
    limit = cfg["crc_errors_per_second"]
    for gpu in obs.facts["nvml"].gpus:
        crc = {link.link: _crc_rate(obs, gpu, link) for link in gpu.nvlinks}
        high = {n: r for n, r in crc.items() if r is not None and r >= limit}
        low = {n: r for n, r in crc.items() if r is not None and 0 < r < limit}
        if high:
            findings.append(Finding(
                NAME, Severity.FATAL, "NvLinkCrcErrorRateHigh",
                f"{gpu.label} has NVLink CRC errors at {_shown(high)} (limit {limit:g}/s): the link corrupts so "
                "much traffic that retries cannot keep up and collectives through it stall or fail; drain the node "
                "and have the NVLink path (GPU board, NVSwitch tray, cables) inspected.",
                device=device_of(gpu), action=Action.HW_INSPECTION,
                evidence={"crc_per_second": _by_link(high), "limit": limit}))
        if low:
            findings.append(Finding(
                NAME, Severity.WARNING, "NvLinkCrcErrors",
                f"{gpu.label} has NVLink CRC errors at {_shown(low)}: the link retransmits and loses some "
                "bandwidth; watch it and have it inspected at the next maintenance if the errors go on.",
                device=device_of(gpu), action=Action.HW_INSPECTION, evidence={"crc_per_second": _by_link(low)}))
        findings += _counter_warning(obs, gpu, "replay", "NvLinkReplays",
                                     "replays", "the link resends data it could not deliver, costing bandwidth")
        findings += _counter_warning(obs, gpu, "recovery", "NvLinkRecoveries",
                                     "recoveries", "the link retrained, pausing its traffic each time")
    return findings


def _rate(obs: Observed, gpu: Gpu, link: NvLink, counter: str) -> float | None:
    return obs.rate("nvml", rate_key(gpu, f"nvlink{link.link}:{counter}"))


def _crc_rate(obs: Observed, gpu: Gpu, link: NvLink) -> float | None:
    """The worse of the link's flit and data CRC rates, as DCGM judges each against the same limit."""
    rates = [r for r in (_rate(obs, gpu, link, "crc_flit"), _rate(obs, gpu, link, "crc_data")) if r is not None]
    return max(rates) if rates else None


def _counter_warning(obs: Observed, gpu: Gpu, counter: str, reason: str, noun: str, meaning: str) -> list[Finding]:
    rates = {link.link: _rate(obs, gpu, link, counter) for link in gpu.nvlinks}
    bad = {n: r for n, r in rates.items() if r is not None and r > 0}
    if not bad:
        return []
    return [Finding(
        NAME, Severity.WARNING, reason,
        f"{gpu.label} has NVLink {noun} at {_shown(bad, per_minute=True)}: {meaning}; watch it and "
        "have the link inspected at the next maintenance if they go on.",
        device=device_of(gpu), action=Action.HW_INSPECTION, evidence={f"{counter}_per_second": _by_link(bad)})]


def _shown(rates: dict[int, float], per_minute: bool = False) -> str:
    """`120/s on link 3, 0.5/s on link 7`."""
    scale, unit = (60, "/min") if per_minute else (1, "/s")
    return ", ".join(f"{r * scale:.3g}{unit} on link {n}" for n, r in sorted(rates.items()))


def _by_link(rates: dict[int, float]) -> dict[str, float]:
    return {str(n): r for n, r in sorted(rates.items())}
