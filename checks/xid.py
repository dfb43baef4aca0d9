"""GPU and NVSwitch errors from the kernel log: Xid, SXid and "fallen off the bus".

Each kernel event is judged on its own (catalog, decoded text, operator overrides), then the
events that still count are grouped into one finding per (device, reason).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from nodehealth.checks import xid_catalog as catalog
from nodehealth.checks.kernel_log import (
    is_saved_log,
    latest_distinct,
    listed_only,
    near,
    reference_time,
    seen_range,
    span,
    still_counts,
    times,
    trim,
    whole_numbers,
    with_earlier,
)
from nodehealth.collectors.kernel_events import GPU_FALLEN_OFF_BUS, SXID, XID, KernelEvent
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "xid"
NEEDS = ("kmsg",)
SUBSYSTEM = "gpu"
DEBOUNCE = False
DEFAULTS: dict = {
    # Warning and info events older than this no longer count; fatal hardware events count all boot.
    "window_seconds": 86400.0,
    # A warning-level code seen this often on one GPU inside the window makes the GPU degraded.
    "repeat_count": 5,
    # Per-code changes to the catalog: {79: {"severity": "fatal", "action": "reboot"}}.
    # Severity "ok" silences a code.
    "overrides": {},
    "sxid_overrides": {},
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "window_seconds": ("warning and info Xid events older than this no longer count; fatal hardware events count "
                       "all boot"),
    "repeat_count": "a warning-level Xid seen this often on one GPU in the window makes the GPU degraded",
    "overrides": ("per-code changes to the Xid catalog: `{79: {severity: fatal, action: reboot}}`; severity `ok` "
                  "silences a code. A bad entry is ignored and reported as `XidOverrideInvalid`"),
    "sxid_overrides": "the same for SXid codes",
}
SOURCE = "kernel log"
FINDS = ("GPU Xid errors rated by NVIDIA's whole Xid catalog (all 172 codes), NVSwitch SXids, "
         "\"fallen off the bus\" without a number, Xid 154 recovery actions, repeats")
REASONS = {
    "Xid<N><Name>": Reason((), (),
                           "a GPU logged Xid N: severity and action from the [Xid catalog](xid.md); a "
                           "warning-level code seen `repeat_count` (5) times on one GPU in the window becomes "
                           "degraded, hw-inspection (not the codes that only follow another error: 43, 45, 94)"),
    "SXid<N><Name>": Reason((), (),
                            "an NVSwitch logged SXid N: see the [SXid table](xid.md#sxids); a line the driver "
                            "marks Fatal is never rated below fatal. Xid 79 together with SXid 20034 on one host "
                            "means the node must be rebooted"),
    "Xid<N>": Reason(Severity.WARNING, Action.NONE,
                     "a code newer than nodehealth's catalog: look it up in NVIDIA's newer Xid documentation and "
                     "set `checks.xid.overrides` if it needs more"),
    "XidUnknown": Reason(Severity.WARNING, Action.NONE, "an Xid line whose number could not be read"),
    "SXid<N>": Reason((Severity.WARNING, Severity.FATAL), (Action.NONE, Action.RESET_GPU),
                      "an SXid not in the Fabric Manager guide: fatal when the driver marked it Fatal"),
    "SXidUnknown": Reason((Severity.WARNING, Severity.FATAL), (Action.NONE, Action.RESET_GPU),
                          "an SXid line whose number could not be read"),
    "XidOverrideInvalid": Reason(Severity.WARNING, Action.FIX_CONFIG,
                                 "an entry of `checks.xid.overrides` or `sxid_overrides` is invalid and was "
                                 "ignored; the catalog applies to that code until it is fixed"),
}

# Fatal events with one of these actions are hardware faults: they count for the whole boot.
WHOLE_BOOT_ACTIONS = (Action.RESET_GPU, Action.REBOOT, Action.HW_INSPECTION)

ADVICE = {
    Action.NONE: "nothing to do unless it keeps happening",
    Action.RESTART_APP: "restart the affected application; the GPU itself can keep working",
    Action.RESET_GPU: ("drain the GPU's work and reset it (nvidia-smi -r), reboot if the reset fails, "
                       "and have it inspected if the error returns after a reboot"),
    Action.REBOOT: "drain the node and reboot it (power-cycle it if a warm reboot does not bring everything back)",
    Action.HW_INSPECTION: "drain the node and have the hardware inspected (field diagnostics, dcgmi diag -r 3)",
    Action.FIX_CONFIG: "fix the configuration named above",
}

_RECOVERY_VALUE = re.compile(r"\bto\s+0x([0-9a-fA-F]{1,16})\b")
_RECOVERY_LABEL = re.compile(r"\bto\s+(?:0x[0-9a-fA-F]+\s*)?\(([^)]*)\)")
_NONFATAL = re.compile(r"\bnon-?fatal\b", re.IGNORECASE)
_FATAL = re.compile(r"\bfatal\b", re.IGNORECASE)
_CAUSED_BY = re.compile(r"caused by previous Xid ([0-9]{1,9})", re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    """What one event means: its finding's reason, severity, action and a note for the message."""

    reason: str
    severity: Severity
    action: Action
    note: str
    advice: str | None = None  # what to do, where the event says more than ADVICE[action]


@dataclass(frozen=True)
class Override:
    severity: Severity | None
    action: Action | None


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    window = cfg.get("window_seconds", DEFAULTS["window_seconds"])
    repeat = cfg.get("repeat_count", DEFAULTS["repeat_count"])
    xid_overrides, findings = parse_overrides(cfg.get("overrides") or {}, "overrides")
    sxid_overrides, problems = parse_overrides(cfg.get("sxid_overrides") or {}, "sxid_overrides")
    findings += problems
    groups: dict[tuple[str, str, str], list[tuple[KernelEvent, Verdict]]] = {}
    for e in without_companions(obs.facts["kmsg"].events):
        if e.kind in (XID, GPU_FALLEN_OFF_BUS):
            verdict = judge_xid(e, xid_overrides)
        elif e.kind == SXID:
            verdict = judge_sxid(e, sxid_overrides)
        else:
            continue
        groups.setdefault((_family(e), e.device, verdict.reason), []).append((e, verdict))
    saved = is_saved_log(obs)
    split = {key: _counting(key, items, reference_time(obs), window, saved) for key, items in groups.items()}
    counted = {key: counting for key, (counting, _) in split.items()}
    fallen_off = any(fam == XID and _code(items[0][0]) == catalog.FALLEN_OFF_BUS_XID
                     for (fam, _, _), items in counted.items() if items)
    link_fault = any(fam == SXID and items[0][0].code == catalog.LINK_FAULT_SXID
                     for (fam, _, _), items in counted.items() if items)
    paired = fallen_off and link_fault
    for key in sorted(counted):
        fam, device, reason = key
        earlier = [e for e, _ in split[key][1]]
        if not counted[key]:
            if earlier:
                findings.append(listed_only(NAME, reason, device, _what(fam, device, earlier[-1]), earlier, window))
            continue
        if fam == XID:
            finding = _xid_finding(device, counted[key], len(groups[key]), window, repeat, paired)
        else:
            finding = _sxid_finding(device, counted[key], window, paired)
        findings.append(with_earlier(finding, earlier, window))
    return findings


# The driver prints "NVRM: GPU <bus id>: GPU has fallen off the bus." beside the Xid 79 it reports for that GPU.
COMPANION_SECONDS = 10.0


def without_companions(events) -> list[KernelEvent]:
    """The events less each "fallen off the bus" line (no Xid number) printed next to an Xid 79 of the same GPU,
    before or after it: one fault, one count. A GPU's later reports count on their own."""
    dropped: set[int] = set()
    paired: set[int] = set()
    previous: dict[str, KernelEvent] = {}  # by GPU, its event before this one
    for e in events:
        if e.kind not in (XID, GPU_FALLEN_OFF_BUS):
            continue
        before, previous[e.device] = previous.get(e.device), e
        if before is None or id(before) in paired:
            continue
        numbered, companion = (before, e) if before.kind == XID else (e, before)
        if (numbered.kind == XID and numbered.code == catalog.FALLEN_OFF_BUS_XID
                and companion.kind == GPU_FALLEN_OFF_BUS and companion.code is None
                and near(numbered, companion, COMPANION_SECONDS)):
            paired.update((id(before), id(e)))
            dropped.add(id(companion))
    return [e for e in events if id(e) not in dropped]


def _what(family: str, device: str, e: KernelEvent) -> str:
    """'GPU 0000:3b:00.0 logged Xid 13 (Graphics Engine Exception)', for a saved log's older events."""
    if family == SXID:
        info = catalog.SXID_CATALOG.get(e.code) if e.code is not None else None
        return (f"NVSwitch {device or '(address not in the log)'} logged SXid {_number(e.code)}"
                + (f" ({info.name})" if info else ""))
    code = _code(e)
    info = catalog.XID_CATALOG.get(code) if code is not None else None
    return (f"GPU {device or '(address not in the log)'} logged Xid {_number(code)}"
            + (f" ({_title(info)})" if info else ""))


def parse_overrides(raw: dict, section: str) -> tuple[dict[int, Override], list[Finding]]:
    """Operator overrides by code; a bad entry is ignored and reported, never fatal to the check."""
    overrides: dict[int, Override] = {}
    problems: list[Finding] = []
    for key, value in raw.items():
        setting = f"checks.xid.{section}.{key}"
        try:
            overrides[int(key)] = _override(value)
        except (TypeError, ValueError) as e:
            problems.append(Finding(
                NAME, Severity.WARNING, "XidOverrideInvalid",
                f"The setting {setting} was ignored: {e}; the catalog's default applies to that code until "
                "the configuration is fixed.",
                device=setting, action=Action.FIX_CONFIG, evidence={"value": repr(value)[:100]}))
    return overrides, problems


def _override(value: object) -> Override:
    if not isinstance(value, dict) or not value or set(value) - {"severity", "action"}:
        raise ValueError("expected a mapping with 'severity' and/or 'action'")
    severity = value.get("severity")
    action = value.get("action")
    severities = [s.value for s in Severity if s is not Severity.UNKNOWN]
    if severity is not None and severity not in severities:
        raise ValueError(f"severity {severity!r} is not one of {', '.join(severities)}")
    if action is not None and action not in [a.value for a in Action]:
        raise ValueError(f"action {action!r} is not one of {', '.join(a.value for a in Action)}")
    return Override(Severity(severity) if severity is not None else None,
                    Action(action) if action is not None else None)


def judge_xid(e: KernelEvent, overrides: dict[int, Override]) -> Verdict:
    """One GPU event: the catalog row, refined by what the line itself says, then the operator's override."""
    code = _code(e)
    info = catalog.XID_CATALOG.get(code) if code is not None else None
    if info is None:
        verdict = Verdict(f"Xid{code}" if code is not None and code >= 0 else "XidUnknown",
                          Severity.WARNING, Action.NONE,
                          f"this code is not in {catalog.XID_DOCUMENT} (nodehealth catalog {catalog.CATALOG_VERSION}); "
                          "look it up in NVIDIA's newer Xid documentation and set checks.xid.overrides if it "
                          "needs more")
    elif code == catalog.RECOVERY_ACTION_CODE:
        verdict = _recovery_action(info, e.text)
    elif code in catalog.NVLINK5_CODES:
        verdict = _nvlink5(info, e.text)
    else:
        verdict = Verdict(info.reason, info.severity, info.action, info.meaning)
    cause = _CAUSED_BY.search(e.text)
    if cause:
        verdict = Verdict(verdict.reason, verdict.severity, verdict.action,
                          f"{verdict.note}; it followed Xid {cause.group(1)} on this GPU",
                          "act on that Xid's finding, this one needs nothing of its own")
    if e.kind == GPU_FALLEN_OFF_BUS:
        verdict = Verdict(verdict.reason, verdict.severity, verdict.action,
                          f"{verdict.note} (the driver said so without an Xid number)")
    return _apply(verdict, overrides.get(code) if code is not None else None)


def _code(e: KernelEvent) -> int | None:
    """The Xid number; "fallen off the bus" without a number is Xid 79."""
    if e.kind == GPU_FALLEN_OFF_BUS and e.code is None:
        return catalog.FALLEN_OFF_BUS_XID
    return e.code


def _recovery_action(info: catalog.XidInfo, text: str) -> Verdict:
    """Xid 154: the recovery action the driver now asks for (docs/sources.md, "Xid recovery actions")."""
    value = _recovery_value(text)
    wanted = catalog.RECOVERY_ACTIONS.get(value) if value is not None else None
    if wanted is None:
        shown = f"0x{value:x}" if value is not None else "a value that could not be read"
        return Verdict(info.reason, info.severity, info.action,
                       f"{info.meaning}, to {shown}, which nodehealth does not know; read the line and "
                       "query the GPU's recovery action with NVML")
    return Verdict(info.reason, wanted.severity, wanted.action,
                   f"{info.meaning}, now 0x{wanted.value:x} ({wanted.name})", wanted.advice)


def _recovery_value(text: str) -> int | None:
    m = _RECOVERY_VALUE.search(text)
    if m:
        return int(m.group(1), 16)
    m = _RECOVERY_LABEL.search(text)
    return catalog.RECOVERY_LABELS.get(m.group(1).strip().lower()) if m else None


def _nvlink5(info: catalog.XidInfo, text: str) -> Verdict:
    """Xid 144-150: the Fatal/Nonfatal word the driver prints is the fallback decode."""
    if _NONFATAL.search(text):
        return Verdict(info.reason, Severity.WARNING, Action.NONE, f"{info.meaning}, marked Nonfatal by the driver")
    if _FATAL.search(text):
        return Verdict(info.reason, Severity.FATAL, Action.RESET_GPU, f"{info.meaning}, marked Fatal by the driver")
    return Verdict(info.reason, info.severity, info.action, info.meaning)


def judge_sxid(e: KernelEvent, overrides: dict[int, Override]) -> Verdict:
    """One NVSwitch event: the SXid table, or the driver's Fatal/Non-fatal word for unknown codes.

    A line the driver calls Fatal is never rated below fatal, whatever the table says.
    """
    fatal = e.detail.get("fatal")
    info = catalog.SXID_CATALOG.get(e.code) if e.code is not None else None
    if info is not None:
        verdict = Verdict(info.reason, info.severity, info.action, info.meaning)
        if fatal is True and info.severity is not Severity.FATAL:
            action = info.action if info.action in WHOLE_BOOT_ACTIONS else Action.RESET_GPU
            verdict = Verdict(info.reason, Severity.FATAL, action, f"{info.meaning}; the driver marked it Fatal")
    else:
        reason = f"SXid{e.code}" if e.code is not None and e.code >= 0 else "SXidUnknown"
        unlisted = (f"this SXid is not in {catalog.SXID_DOCUMENT} nor nodehealth's additions "
                    f"({catalog.SXID_CATALOG_VERSION})")
        if fatal is True:
            verdict = Verdict(reason, Severity.FATAL, Action.RESET_GPU,
                              f"{unlisted}; the driver marked it Fatal, so the switch's links are in error")
        else:
            verdict = Verdict(reason, Severity.WARNING, Action.NONE,
                              f"{unlisted}; the driver did not mark it Fatal")
    return _apply(verdict, overrides.get(e.code) if e.code is not None else None)


def _apply(verdict: Verdict, override: Override | None) -> Verdict:
    if override is None:
        return verdict
    severity = verdict.severity if override.severity is None else override.severity
    action = verdict.action if override.action is None else override.action
    advice = verdict.advice if override.action is None else None
    return Verdict(verdict.reason, severity, action,
                   f"{verdict.note} (severity/action set by the operator's override)", advice)


def _family(e: KernelEvent) -> str:
    return SXID if e.kind == SXID else XID


def _whole_boot(v: Verdict) -> bool:
    return v.severity is Severity.FATAL and v.action in WHOLE_BOOT_ACTIONS


def _counting(key: tuple[str, str, str], items: list[tuple[KernelEvent, Verdict]], now: float, window: float,
              saved: bool) -> tuple[list[tuple[KernelEvent, Verdict]], list[tuple[KernelEvent, Verdict]]]:
    """The events of one group that count now, and (for a saved log) those older than the window.

    Xid 154 is a state, not a count: only its latest value matters (a later 0x0 clears an
    earlier request). An SXid is printed as a headline plus continuation lines (Severity ...,
    Data {...}); only headlines, which say Fatal or Non-fatal, are counted where there are any.
    """
    family = key[0]
    if family == XID and _code(items[0][0]) == catalog.RECOVERY_ACTION_CODE:
        items = items[-1:]
    if family == SXID:
        items = [(e, v) for e, v in items if e.detail.get("fatal") is not None] or items
    live = [(e, v) for e, v in items if v.severity is not Severity.OK]
    counting = [(e, v) for e, v in live if still_counts(e, now, window, _whole_boot(v))]
    older = [(e, v) for e, v in live if not still_counts(e, now, window, _whole_boot(v))] if saved else []
    return counting, older


def _worst(items: list[tuple[KernelEvent, Verdict]]) -> Verdict:
    """The most severe verdict; among equals, the latest."""
    best = items[-1][1]
    for _, v in reversed(items):
        if v.severity.rank > best.severity.rank:
            best = v
    return best


def _xid_finding(device: str, items: list[tuple[KernelEvent, Verdict]], in_boot: int, window: float,
                 repeat: int, paired: bool) -> Finding:
    events = [e for e, _ in items]
    last = events[-1]
    code = _code(last)
    verdict = _worst(items)
    info = catalog.XID_CATALOG.get(code) if code is not None else None
    severity, action, note = verdict.severity, verdict.action, verdict.note
    sticky = _whole_boot(verdict)
    if code == catalog.RECOVERY_ACTION_CODE:
        how_often = f"{times(in_boot)} this boot"
    else:
        how_often = f"{times(len(events))} {'this boot' if sticky else 'in the last ' + span(window)}"
    todo = verdict.advice or ADVICE[action]
    if (severity is Severity.WARNING and len(events) >= repeat and code != catalog.RECOVERY_ACTION_CODE
            and code not in catalog.SYMPATHETIC):
        severity, action = Severity.DEGRADED, Action.HW_INSPECTION
        todo = (f"that is at or above the repeat limit of {repeat} on one GPU, so the GPU itself is suspect: "
                f"{ADVICE[action]}")
    if paired and code == catalog.FALLEN_OFF_BUS_XID:
        note += (f"; an NVSwitch on this host also reported SXid {catalog.LINK_FAULT_SXID} (link fault), "
                 "and the two together mean the node must be restarted")
    pids = latest_distinct(whole_numbers(e.detail.get("pid") for e in events))
    processes = latest_distinct(str(e.detail["name"]) for e in events
                                if e.detail.get("name") not in (None, "", "<unknown>"))
    instances = latest_distinct(whole_numbers(e.detail.get("gpu_instance") for e in events))
    causes = latest_distinct(int(m.group(1)) for m in (_CAUSED_BY.search(e.text) for e in events) if m)
    first, latest = seen_range(events)
    label = f"Xid {_number(code)}" + (f" ({_title(info)})" if info else "")
    message = (f"GPU {device or '(address not in the log)'}{_instances(instances)} logged {label} {how_often}"
               f"{_processes(pids, processes)}, the last saying \"{trim(last.text)}\": {note}; {todo}.")
    return Finding(
        NAME, severity, verdict.reason, message, device=device, action=action,
        evidence={"code": code, "count": len(events), "last_text": trim(last.text), "pids": pids,
                  "processes": processes, "gpu_instances": instances, "caused_by": causes, "first_time": first,
                  "last_time": latest, "catalog": catalog.CATALOG_VERSION},
        first_seen=first, last_seen=latest)


def _sxid_finding(device: str, items: list[tuple[KernelEvent, Verdict]], window: float,
                  paired: bool) -> Finding:
    events = [e for e, _ in items]
    last = events[-1]
    verdict = _worst(items)
    action, note = verdict.action, verdict.note
    if paired and last.code == catalog.LINK_FAULT_SXID:
        action = Action.REBOOT
        note += (f"; a GPU on this host also fell off the bus (Xid {catalog.FALLEN_OFF_BUS_XID}), and the two "
                 "together mean the node must be restarted")
    links = latest_distinct(str(e.detail["link"]) for e in events if e.detail.get("link") is not None)
    on_links = f" on link {', '.join(links)}" if links else ""
    how_often = f"{times(len(events))} {'this boot' if _whole_boot(verdict) else 'in the last ' + span(window)}"
    info = catalog.SXID_CATALOG.get(last.code) if last.code is not None else None
    label = f"SXid {_number(last.code)}" + (f" ({info.name})" if info else "")
    switch = next((str(e.detail["nvswitch"]) for e in reversed(events) if e.detail.get("nvswitch")), "")
    named = f" ({switch})" if switch else ""
    first, latest = seen_range(events)
    return Finding(
        NAME, verdict.severity, verdict.reason,
        f"NVSwitch {device or '(address not in the log)'}{named} logged {label}{on_links} {how_often}, "
        f"the last saying \"{trim(last.text)}\": {note}; {verdict.advice or ADVICE[action]}.",
        device=device, action=action,
        evidence={"code": last.code, "count": len(events), "last_text": trim(last.text), "links": links,
                  "first_time": first, "last_time": latest, "catalog": catalog.SXID_CATALOG_VERSION},
        first_seen=first, last_seen=latest)


def _title(info: catalog.XidInfo) -> str:
    """NVIDIA's short description, or its symbol for the codes it calls Unused."""
    return info.mnemonic if info.unused or not info.name else info.name


def _number(code: int | None) -> str:
    return str(code) if code is not None else "(no number)"


def _instances(instances: list) -> str:
    return f" (GPU instance {', '.join(map(str, instances))})" if instances else ""


def _processes(pids: list, processes: list) -> str:
    if processes and pids:
        return f", most recently from {processes[-1]} (pid {pids[-1]})"
    if pids:
        return f", most recently from pid {pids[-1]}"
    if processes:
        return f", most recently from {processes[-1]}"
    return ""
