"""GPU clocks held down by hardware: thermal slowdown, the external power brake, HW slowdown.

Judged from the time each slowdown was active since the last pass where the driver counts it,
else from the reasons active right now; the policy's debounce turns "active" into "sustained".
Reasons that are normal operation are never findings: idle, the software power cap (a busy GPU at
its power limit; NVSentinel#465), application clocks, sync boost and display settings.
"""
from __future__ import annotations

from dataclasses import dataclass

from nodehealth.checks.gpu_sku import FACTS_UNKNOWN, device_of, unknown_findings
from nodehealth.collectors.gpu_facts import (
    CLOCKS_HW_POWER_BRAKE,
    CLOCKS_HW_SLOWDOWN,
    CLOCKS_HW_THERMAL,
    CLOCKS_SW_THERMAL,
    Gpu,
    rate_key,
)
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "clocks"
NEEDS = ("nvml",)
SUBSYSTEM = "gpu"
DEBOUNCE = True
DEFAULTS: dict = {
    # Share of the time since the last pass a slowdown must have been active to count, where the driver
    # counts its duration. Below it, a slowdown was a brief dip (a power spike, a clock change).
    "slowdown_share": 0.10,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "slowdown_share": "share of the time since the last pass a HW slowdown must have been active to count",
}
SOURCE = "NVML"
FINDS = "sustained HW slowdown, HW thermal slowdown and HW power brake (the SW power cap and idle are never findings)"
REASONS = {
    "GpuHwThermalSlowdown": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                                   "over its hardware temperature limit for more than `slowdown_share` (10 %) of "
                                   "the time: check the cooling"),
    "GpuHwPowerBrake": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                              "the external power brake was asserted: check the power supplies and the BMC's log"),
    "GpuHwSlowdown": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                            "hardware cut the clocks by half or more, for no thermal or power-brake reason"),
    "GpuSwThermalSlowdown": Reason(Severity.WARNING, Action.HW_INSPECTION,
                                   "the driver lowers the clocks to stay under its temperature target"),
    "GpuFactsUnknown": FACTS_UNKNOWN,
}

GROUPS = ("all", "clocks")
COOLING = "check the cooling: fans, airflow, inlet temperature and the heatsink's contact"


@dataclass(frozen=True)
class Slowdown:
    bit: int
    counter: str  # the rate key's name: nanoseconds spent in this slowdown
    reason: str
    severity: Severity
    meaning: str
    advice: str


HW_THERMAL = Slowdown(CLOCKS_HW_THERMAL, "clocks_hw_thermal_ns", "GpuHwThermalSlowdown", Severity.DEGRADED,
                      "the GPU is over its hardware temperature limit and its clocks are cut hard", COOLING)
HW_POWER_BRAKE = Slowdown(CLOCKS_HW_POWER_BRAKE, "clocks_hw_power_brake_ns", "GpuHwPowerBrake", Severity.DEGRADED,
                          "the system asserted the external power brake (a power supply or the board told the GPU "
                          "to draw less) and its clocks are cut hard",
                          "check the power supplies and the BMC's event log for a power fault")
HW_SLOWDOWN = Slowdown(CLOCKS_HW_SLOWDOWN, "clocks_hw_slowdown_ns", "GpuHwSlowdown", Severity.DEGRADED,
                       "hardware cut its clocks by half or more (over temperature, a power-brake signal or a "
                       "power spike)", f"{COOLING}, and the power supplies and BMC event log")
SW_THERMAL = Slowdown(CLOCKS_SW_THERMAL, "clocks_sw_thermal_ns", "GpuSwThermalSlowdown", Severity.WARNING,
                      "the driver lowers its clocks to keep it under its temperature target", COOLING)


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    findings: list[Finding] = []
    for gpu in obs.facts["nvml"].gpus:
        findings += unknown_findings(NAME, gpu, GROUPS)
        share = cfg["slowdown_share"]
        found = [_judge(obs, gpu, s, share) for s in (HW_THERMAL, HW_POWER_BRAKE)]
        if not any(found):
            # HW slowdown is also set by the two causes above: alone, it points at another cause.
            found.append(_judge(obs, gpu, HW_SLOWDOWN, share))
        found.append(_judge(obs, gpu, SW_THERMAL, share))
        findings += [f for f in found if f is not None]
    return findings


def _judge(obs: Observed, gpu: Gpu, s: Slowdown, share_limit: float) -> Finding | None:
    rate = obs.rate("nvml", rate_key(gpu, s.counter))
    if rate is not None:
        share = rate / 1e9  # nanoseconds per second
        if share <= share_limit:
            return None
        when = f"was slowed {min(share, 1.0):.0%} of the time since the last check"
        evidence = {"share": share, "limit": share_limit}
    else:
        reasons = gpu.clocks.event_reasons if gpu.clocks is not None else None
        if reasons is None or not reasons & s.bit:
            return None
        when = "is slowed right now"
        evidence = {"event_reasons": f"0x{reasons:x}"}
    return Finding(
        NAME, s.severity, s.reason,
        f"{gpu.label} {when}{_conditions(gpu)}: {s.meaning}, so work on it runs slower and holds "
        f"back every job step it takes part in; {s.advice}.",
        device=device_of(gpu), action=Action.HW_INSPECTION,
        evidence=dict(evidence, temperature_c=gpu.temperature_c, power_w=gpu.power_w,
                      power_limit_w=gpu.power_limit_w))


def _conditions(gpu: Gpu) -> str:
    """` (at 91 C, 680 of 700 W)`, leaving out what is unknown."""
    parts = []
    if gpu.temperature_c is not None:
        parts.append(f"{gpu.temperature_c:.0f} C")
    if gpu.power_w is not None:
        limit = f" of {gpu.power_limit_w:.0f}" if gpu.power_limit_w is not None else ""
        parts.append(f"{gpu.power_w:.0f}{limit} W")
    return f" (at {', '.join(parts)})" if parts else ""
