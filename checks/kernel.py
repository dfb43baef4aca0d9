"""Kernel trouble from the kernel log: hung tasks, soft lockups and hard lockups."""
from __future__ import annotations

import re

from nodehealth.checks.kernel_log import (
    is_saved_log,
    latest_distinct,
    listed_only,
    reference_time,
    seen_range,
    span,
    still_counts,
    times,
    trim,
    whole_numbers,
    with_earlier,
)
from nodehealth.collectors.kernel_events import HARD_LOCKUP, HUNG_TASK, SOFT_LOCKUP, KernelEvent
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "kernel"
NEEDS = ("kmsg",)
SUBSYSTEM = "kernel"
DEBOUNCE = False
DEFAULTS: dict = {
    # Hung tasks and soft lockups older than this no longer count; hard lockups count all boot.
    "window_seconds": 86400.0,
    # This many hung-task reports for one task name inside the window make the node degraded.
    "hung_task_repeat": 3,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "window_seconds": "hung tasks and soft lockups older than this no longer count; hard lockups count all boot",
    "hung_task_repeat": "hung-task reports of one task in the window that make the node degraded",
}
SOURCE = "kernel log"
FINDS = "hung tasks (named, with the NVIDIA driver called out), soft and hard lockups"
REASONS = {
    "HungTask": Reason((Severity.WARNING, Severity.DEGRADED), (Action.NONE, Action.REBOOT),
                       "the kernel reported a task blocked in uninterruptible sleep (`blocked for more than N "
                       "seconds`). Degraded at `hung_task_repeat` (3) reports of one task; with the reboot action "
                       "when the task is inside the NVIDIA driver (the driver is likely wedged)"),
    "SoftLockup": Reason(Severity.DEGRADED, Action.REBOOT,
                         "CPUs ran kernel code without yielding; work on them stalls. Drain and reboot, look at "
                         "the call trace"),
    "HardLockup": Reason(Severity.FATAL, Action.REBOOT,
                         "the NMI watchdog found a CPU not taking interrupts; the kernel can no longer be trusted"),
}


# A hung task in the NVIDIA driver: its own threads (nv_queue, nvc:[driver] of the container
# toolkit), nvidia-smi, or a call trace through the nvidia modules.
_NVIDIA = re.compile(r"nvidia|nv_queue|\bnvc\b", re.IGNORECASE)
_STUCK_SECONDS = re.compile(r"stuck for ([0-9]{1,10})s")


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    events = obs.facts["kmsg"].events
    now = reference_time(obs)
    window = cfg.get("window_seconds", DEFAULTS["window_seconds"])
    repeat = cfg.get("hung_task_repeat", DEFAULTS["hung_task_repeat"])
    saved = is_saved_log(obs)
    hung: dict[str, list[KernelEvent]] = {}
    soft: list[KernelEvent] = []
    hard: list[KernelEvent] = []
    older_hung: dict[str, list[KernelEvent]] = {}  # a saved log's, listed for the post-mortem
    older_soft: list[KernelEvent] = []
    for e in events:
        if e.kind == HUNG_TASK:
            (hung if still_counts(e, now, window) else older_hung).setdefault(e.device, []).append(e)
        elif e.kind == SOFT_LOCKUP:
            (soft if still_counts(e, now, window) else older_soft).append(e)
        elif e.kind == HARD_LOCKUP:
            # The CPU stopped taking interrupts: nothing in this boot is trustworthy after it.
            hard.append(e)
    if not saved:
        older_hung, older_soft = {}, []
    findings = []
    for task in sorted(set(hung) | set(older_hung)):
        if task in hung:
            findings.append(with_earlier(_hung_task(task, hung[task], window, repeat), older_hung.get(task, ()),
                                         window))
        else:
            findings.append(listed_only(NAME, "HungTask", task, f"Task {task or '(unnamed)'} was blocked in the kernel",
                                        older_hung[task], window))
    if soft:
        findings.append(with_earlier(_soft_lockups(soft, window), older_soft, window))
    elif older_soft:
        cpus = _cpus(latest_distinct(e.device for e in older_soft))
        findings.append(listed_only(NAME, "SoftLockup", "", f"{cpus} hit a soft lockup", older_soft, window))
    if hard:
        findings.append(_hard_lockups(hard))
    return findings


def _hung_task(task: str, events: list[KernelEvent], window: float, repeat: int) -> Finding:
    last = events[-1]
    pids = latest_distinct(whole_numbers(e.detail.get("pid") for e in events))
    seconds = whole_numbers(e.detail.get("seconds") for e in events)
    longest = max(seconds) if seconds else None
    in_driver = any(_NVIDIA.search(e.device) or _NVIDIA.search(e.text) for e in events)
    repeated = len(events) >= repeat
    name = task or "(unnamed)"
    what = (f"Task {name} (pid {', '.join(map(str, pids)) or 'unknown'}) was blocked in the kernel "
            f"{times(len(events))} in the last {span(window)}{_blocked_for(longest)}")
    if in_driver:
        what += ", inside the NVIDIA driver"
    if repeated and in_driver:
        severity, action = Severity.DEGRADED, Action.REBOOT
        todo = (f"that is at or above the limit of {repeat}, so the GPU driver is likely wedged and "
                "GPU work on this node will hang too: drain the node and reboot it")
    elif in_driver:
        severity, action = Severity.WARNING, Action.NONE
        todo = ("GPU calls on this node may hang behind it; check the call trace in the kernel log, "
                "and drain and reboot the node if it happens again")
    elif repeated:
        severity, action = Severity.DEGRADED, Action.NONE
        todo = (f"that is at or above the limit of {repeat}: something it waits on (storage, a network "
                "file system, a driver) is stuck; find it in the call trace in the kernel log and fix "
                "or drain the node")
    else:
        severity, action = Severity.WARNING, Action.NONE
        todo = ("a task stuck in uninterruptible sleep cannot be killed and stalls whatever waits on "
                "it; check the call trace in the kernel log for what it waits on")
    first, latest = seen_range(events)
    return Finding(
        NAME, severity, "HungTask",
        f"{what}, the last report saying \"{trim(last.text)}\": {todo}.",
        device=task, action=action,
        evidence={"count": len(events), "longest_blocked_seconds": longest, "pids": pids,
                  "nvidia_driver": in_driver, "last_text": trim(last.text),
                  "first_time": first, "last_time": latest},
        first_seen=first, last_seen=latest)


def _soft_lockups(events: list[KernelEvent], window: float) -> Finding:
    cpus = latest_distinct(e.device for e in events)
    longest = _longest_stuck(events)
    stuck = f" for up to {longest} s" if longest is not None else ""
    first, latest = seen_range(events)
    return Finding(
        NAME, Severity.DEGRADED, "SoftLockup",
        f"{_cpus(cpus)} hit a soft lockup {times(len(events))} in the last {span(window)}, "
        f"running kernel code without yielding{stuck}, the last report saying \"{trim(events[-1].text)}\": work on "
        "those CPUs stalls and timers and network traffic slip; drain the node and reboot it, and look "
        "at the call trace in the kernel log for the driver involved.",
        device="", action=Action.REBOOT,
        evidence={"count": len(events), "cpus": cpus, "longest_stuck_seconds": longest,
                  "last_text": trim(events[-1].text), "first_time": first, "last_time": latest},
        first_seen=first, last_seen=latest)


def _hard_lockups(events: list[KernelEvent]) -> Finding:
    cpus = latest_distinct(e.device for e in events)
    first, latest = seen_range(events)
    return Finding(
        NAME, Severity.FATAL, "HardLockup",
        f"{_cpus(cpus)} hit a hard lockup {times(len(events))} this boot, found by the NMI watchdog "
        f"not taking interrupts, the last report saying \"{trim(events[-1].text)}\": the kernel's state can no "
        "longer be trusted; drain the node and reboot it, and have the hardware (CPU, memory, firmware) "
        "inspected if it happens again.",
        device="", action=Action.REBOOT,
        evidence={"count": len(events), "cpus": cpus, "last_text": trim(events[-1].text),
                  "first_time": first, "last_time": latest},
        first_seen=first, last_seen=latest)


def _cpus(cpus: list) -> str:
    return ", ".join(c for c in cpus if c) or "A CPU"


def _blocked_for(seconds: int | None) -> str:
    return f", for more than {seconds} s at the longest" if seconds is not None else ""


def _longest_stuck(events: list[KernelEvent]) -> int | None:
    seconds = whole_numbers(e.detail.get("seconds") for e in events)
    for e in events:
        m = _STUCK_SECONDS.search(e.text)
        if m:
            seconds.append(int(m.group(1)))
    return max(seconds) if seconds else None
