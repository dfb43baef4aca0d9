"""Host memory and CPU hardware errors from the kernel log: machine checks, APEI/CPER records,
EDAC error lines, memory-failure recovery and CPU thermal throttling (docs/sources.md, "Host hardware severities")."""
from __future__ import annotations

from nodehealth.checks.host_log import Rating, judge_events
from nodehealth.checks.kernel_log import near
from nodehealth.collectors.kernel_events import CPER, CPU_THROTTLE, EDAC_ERROR, MCE, MEMORY_FAILURE, KernelEvent
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "memory_errors"
NEEDS = ("kmsg",)
SUBSYSTEM = "memory"
DEBOUNCE = False
DEFAULTS: dict = {
    # Corrected errors and throttling older than this no longer count; uncorrected ones count all boot.
    "window_seconds": 86400.0,
    # Corrected memory errors in the window that make a DIMM suspect: mcelog's default
    # ce-error-threshold is 10 per 24 h per DIMM; one EDAC line may report many at once.
    "corrected_limit": 10,
    # Throttling reports in the window that make cooling a problem rather than a passing peak.
    "throttle_repeat": 3,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "window_seconds": ("corrected errors and throttling older than this no longer count; uncorrected ones count all "
                       "boot"),
    "corrected_limit": ("corrected errors of one kind on one device (a DIMM, a CPU) in the window that make it "
                        "degraded (mcelog's default: 10 in 24 h)"),
    "throttle_repeat": "CPU thermal throttling episodes in the window that make cooling a problem (degraded)",
}
SOURCE = "kernel log"
FINDS = ("machine checks (`mce: [Hardware Error]`, decoded from the status word: corrected, uncorrected, fatal), "
         "APEI/CPER records by `event severity`, EDAC error lines with the DIMM label, memory-failure recovery, CPU "
         "thermal throttling; uncorrected is fatal; corrected errors at or over 10 per DIMM in 24 h (mcelog's "
         "default) are degraded")
REASONS = {
    "MachineCheckFatal": Reason(Severity.FATAL, Action.HW_INSPECTION,
                                "a fatal machine check (processor context corrupt); counts all boot"),
    "MachineCheckUncorrected": Reason(Severity.FATAL, Action.HW_INSPECTION,
                                      "an uncorrected machine check: data was lost and the process using it "
                                      "killed; counts all boot"),
    "MachineCheckCorrected": Reason((Severity.WARNING, Severity.DEGRADED), (Action.NONE, Action.HW_INSPECTION),
                                    "corrected machine checks; degraded at `corrected_limit` (10) in the window"),
    "MachineCheckLogged": Reason((Severity.WARNING, Severity.DEGRADED), (Action.NONE, Action.HW_INSPECTION),
                                 "the kernel printed only `Machine check events logged` (no decoded record within "
                                 "60 s says more): read them with `mcelog --client` or `ras-mc-ctl --errors`; "
                                 "degraded at `corrected_limit` in the window"),
    "HardwareErrorFatal": Reason(Severity.FATAL, Action.HW_INSPECTION,
                                 "firmware (APEI/CPER) reported a fatal hardware error"),
    "HardwareErrorRecoverable": Reason(Severity.FATAL, Action.HW_INSPECTION,
                                       "firmware reported an uncorrected, contained hardware error: data was lost"),
    "HardwareErrorCorrected": Reason((Severity.WARNING, Severity.DEGRADED), (Action.NONE, Action.HW_INSPECTION),
                                     "firmware reported corrected hardware errors; degraded at `corrected_limit` (10)"),
    "MemoryUncorrectable": Reason(Severity.FATAL, Action.HW_INSPECTION,
                                  "an EDAC line reported an uncorrectable error on a DIMM (named by its label): "
                                  "replace that DIMM"),
    "MemoryCorrected": Reason((Severity.WARNING, Severity.DEGRADED), (Action.NONE, Action.HW_INSPECTION),
                              "EDAC lines reported corrected errors on a DIMM; degraded at `corrected_limit` (10) "
                              "errors in the window (one line may report many)"),
    "MemoryFailureUnrecovered": Reason(Severity.FATAL, Action.HW_INSPECTION,
                                       "the kernel could not take a bad memory page out of use"),
    "MemoryFailureRecovered": Reason((Severity.WARNING, Severity.DEGRADED), (Action.NONE, Action.HW_INSPECTION),
                                     "the kernel took a bad page out of use (the process using it was killed); "
                                     "degraded at 3"),
    "CpuThermalThrottling": Reason((Severity.WARNING, Severity.DEGRADED), (Action.NONE, Action.HW_INSPECTION),
                                   "CPUs were throttled for temperature; degraded at `throttle_repeat` (3) "
                                   "episodes. Check fans, airflow, inlet temperature"),
}

_W, _D, _F = Severity.WARNING, Severity.DEGRADED, Severity.FATAL
_INSPECT = "drain the node and have its memory and CPUs inspected (the DIMM named, or the socket and bank)"


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    cfg = dict(DEFAULTS, **cfg)
    limit = int(cfg["corrected_limit"])
    throttle = int(cfg["throttle_repeat"])
    said_more = decoded_notices(obs.facts["kmsg"].events)
    return judge_events(NAME, obs, cfg, (MCE, CPER, EDAC_ERROR, MEMORY_FAILURE, CPU_THROTTLE),
                        lambda e: None if id(e) in said_more else rate(e, limit, throttle))


# A decoded record this close to a "Machine check events logged" notice is what the notice announced.
NOTICE_SECONDS = 60.0


def decoded_notices(events) -> set[int]:
    """The ids of the "Machine check events logged" notices that a decoded machine check, EDAC, APEI or
    memory-failure record of the same moment says more about (the notice alone carries no severity)."""
    decoded = [e for e in events if e.kind in (CPER, EDAC_ERROR, MEMORY_FAILURE)
               or (e.kind == MCE and not e.detail.get("logged"))]
    return {id(e) for e in events if e.kind == MCE and e.detail.get("logged")
            and any(near(e, d, NOTICE_SECONDS) for d in decoded)}


def rate(e: KernelEvent, limit: int, throttle: int) -> Rating | None:
    """One event's rating (the table in docs/sources.md, "Host hardware severities")."""
    d = e.detail
    if e.kind == MCE and d.get("logged"):
        return Rating("MachineCheckLogged", _W, Action.NONE, "The kernel logged machine check events",
                      "the line does not say how severe they were: read them with mcelog --client, ras-mc-ctl --errors "
                      "or the mcelog/rasdaemon log", repeat=limit, repeated=_D, repeated_action=Action.HW_INSPECTION)
    if e.kind == MCE:
        if d.get("panic") or d.get("pcc"):
            return Rating("MachineCheckFatal", _F, Action.HW_INSPECTION,
                          f"A fatal machine check (processor context corrupt) on {e.device}", _INSPECT, True)
        if d.get("uc"):
            return Rating("MachineCheckUncorrected", _F, Action.HW_INSPECTION,
                          f"An uncorrected machine check on {e.device}",
                          "data was lost and the process using it killed; " + _INSPECT, True)
        return Rating("MachineCheckCorrected", _W, Action.NONE, f"A corrected machine check on {e.device}",
                      "corrected by the hardware; many of them mean a failing DIMM or CPU",
                      repeat=limit, repeated=_D, repeated_action=Action.HW_INSPECTION)
    if e.kind == CPER:
        severity = d.get("severity")
        if severity == "fatal":
            return Rating("HardwareErrorFatal", _F, Action.HW_INSPECTION,
                          "Firmware reported a fatal hardware error (APEI/CPER)",
                          "the node went down for it; " + _INSPECT, True)
        if severity == "recoverable":
            return Rating("HardwareErrorRecoverable", _F, Action.HW_INSPECTION,
                          "Firmware reported an uncorrected, contained hardware error (APEI/CPER)",
                          "data was lost; " + _INSPECT, True)
        if severity == "corrected":
            return Rating("HardwareErrorCorrected", _W, Action.NONE,
                          "Firmware reported a corrected hardware error (APEI/CPER)",
                          "corrected; many of them mean failing hardware",
                          repeat=limit, repeated=_D, repeated_action=Action.HW_INSPECTION)
        return None  # "info" records need nothing
    if e.kind == EDAC_ERROR:
        label = d.get("label") or "an unnamed DIMM"
        mc = d.get("controller") or e.device
        count = d.get("count") if isinstance(d.get("count"), int) else 1
        if d.get("type") == "UE":
            return Rating("MemoryUncorrectable", _F, Action.HW_INSPECTION,
                          f"Memory controller {mc} reported an uncorrectable error on {label}",
                          "data was lost; replace that DIMM", True)
        return Rating("MemoryCorrected", _W, Action.NONE,
                      f"Memory controller {mc} reported corrected errors on {label}",
                      "corrected by ECC; at the limit the DIMM is failing: replace it at the next drain",
                      repeat=limit, repeated=_D, repeated_action=Action.HW_INSPECTION, weight=max(count, 1))
    if e.kind == MEMORY_FAILURE:
        if d.get("result") in ("Failed", "Ignored"):
            return Rating("MemoryFailureUnrecovered", _F, Action.HW_INSPECTION,
                          f"The kernel could not recover a memory page ({d.get('pfn')}) after a hardware error",
                          "the bad page may still be in use; " + _INSPECT, True)
        return Rating("MemoryFailureRecovered", _W, Action.NONE,
                      f"The kernel took a memory page ({d.get('pfn')}) out of use after a hardware error",
                      "the process using it was killed; repeated failures mean a failing DIMM",
                      repeat=3, repeated=_D, repeated_action=Action.HW_INSPECTION)
    if e.kind == CPU_THROTTLE:
        # The kernel prints one line per CPU of a package when it throttles: the lines of one second are one episode.
        second = (e.monotonic_us // 1_000_000 if e.monotonic_us is not None
                  else int(e.wall_time) if e.wall_time is not None else e.seq)
        return Rating("CpuThermalThrottling", _W, Action.NONE, "CPUs were throttled for temperature",
                      "the CPUs run slower while hot; check the fans, airflow and inlet temperature",
                      repeat=throttle, repeated=_D, repeated_action=Action.HW_INSPECTION, episode=second)
    return None
