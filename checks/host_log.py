"""Shared judging for the host hardware and kernel events of the kernel log (memory and CPU errors,
crashes and stalls, storage, NIC health): each event is rated on its own by its check's `rate`,
events of one reason on one device become one finding, and repeats may raise it one step.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

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
    with_earlier,
)
from nodehealth.collectors.kernel_events import KernelEvent
from nodehealth.model import Action, Finding, Observed, Severity


@dataclass(frozen=True)
class Rating:
    reason: str  # stable CamelCase
    severity: Severity
    action: Action
    what: str  # "Memory controller mc1 reported corrected errors on DIMM X"
    todo: str  # what to do, in words
    whole_boot: bool = False  # counts all boot (the damage stays until a reboot), not only inside the window
    repeat: int = 0  # this many events in the window raise the severity to `repeated` (0: never)
    repeated: Severity | None = None
    repeated_action: Action | None = None
    weight: int = 1  # how many errors the event reports (an EDAC line may count 262 at once)
    episode: object = None  # events of one episode (one line per CPU of one throttle) count once toward `repeat`


def judge_events(check: str, obs: Observed, cfg: dict, kinds: Iterable[str],
                 rate: Callable[[KernelEvent], Rating | None]) -> list[Finding]:
    """One finding per (reason, device) among the events of `kinds` that `rate` rates."""
    wanted = frozenset(kinds)
    now = reference_time(obs)
    window = float(cfg["window_seconds"])
    saved = is_saved_log(obs)
    groups: dict[tuple[str, str], tuple[list[tuple[KernelEvent, Rating]], list[KernelEvent]]] = {}
    for e in obs.facts["kmsg"].events:
        if e.kind not in wanted:
            continue
        rating = rate(e)
        if rating is None:
            continue
        counted, earlier = groups.setdefault((rating.reason, e.device), ([], []))
        if still_counts(e, now, window, rating.whole_boot):
            counted.append((e, rating))
        elif saved:
            earlier.append(e)
    findings = []
    for (reason, device), (counted, earlier) in sorted(groups.items()):
        if counted:
            findings.append(with_earlier(_finding(check, device, counted, window), earlier, window))
        elif earlier:
            last = rate(earlier[-1])
            findings.append(listed_only(check, reason, device, last.what, earlier, window))
    return findings


def _finding(check: str, device: str, items: list[tuple[KernelEvent, Rating]], window: float) -> Finding:
    events = [e for e, _ in items]
    worst = max(items, key=lambda item: item[1].severity.rank)[1]
    severity, action, todo = worst.severity, worst.action, worst.todo
    episodes: dict[object, int] = {}
    for i, (_, r) in enumerate(items):
        key = ("event", i) if r.episode is None else ("episode", r.episode)
        episodes[key] = max(episodes.get(key, 0), max(r.weight, 1))
    total = sum(episodes.values())
    if worst.repeat and total >= worst.repeat and worst.repeated is not None \
            and worst.repeated.rank > severity.rank:
        severity = worst.repeated
        action = worst.repeated_action or action
        todo = f"{total} in all, at or over the limit of {worst.repeat}; {todo}"
    last = events[-1]
    first, latest = seen_range(events)
    when = "this boot" if worst.whole_boot else f"in the last {span(window)}"
    return Finding(
        check, severity, worst.reason,
        f"{worst.what} {times(len(events))} {when}, the last saying \"{trim(last.text)}\": {todo}.",
        device=device, action=action,
        evidence={"count": len(events), "errors": total, "last_text": trim(last.text), "first_time": first,
                  "last_time": latest, "details": latest_distinct(_detail(e) for e in events)},
        first_seen=first, last_seen=latest)


def _detail(e: KernelEvent) -> str:
    """A short, bounded summary of what the parser read (for evidence)."""
    return trim(", ".join(f"{k}={v}" for k, v in sorted(e.detail.items()) if v is not None and k != "headers"), 160)
