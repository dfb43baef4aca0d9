"""Rules every kernel-log check shares: which events still count, and how an event's text and
time are shown, so that xid, kernel and link_events judge time the same way."""
from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace

from nodehealth.collectors.kernel_events import KernelEvent
from nodehealth.model import Finding, Observed, Severity

TEXT_LIMIT = 160
LIST_LIMIT = 8  # at most this many pids / cpus in evidence and messages
_WHOLE_NUMBER = re.compile(r"[0-9]{1,18}")


def reference_time(obs: Observed) -> float:
    """"Now" for event windows. A saved log (no boot id: `check --kernel-log`) is judged as of its
    last event, so the post-mortem of a dead node sees what the node saw when it went down."""
    facts = obs.facts["kmsg"]
    if facts.boot_id is None:
        latest = max((e.wall_time for e in facts.events if e.wall_time is not None), default=None)
        if latest is not None:
            return latest
    return obs.now


def is_saved_log(obs: Observed) -> bool:
    """A saved log (`check --kernel-log`): a post-mortem, where every event is listed, counting or not."""
    return obs.facts["kmsg"].boot_id is None


def when(events: Sequence[KernelEvent]) -> str:
    """When events happened, in words: 'at T', 'N times between T1 and T2', or 'at a time the log does not say'."""
    first, last = seen_range(events)
    if first is None or last is None:
        return f"{times(len(events))}, at times the log does not give"
    if len(events) == 1 or first == last:
        return f"{times(len(events))}, at {clock(last)}"
    return f"{times(len(events))}, between {clock(first)} and {clock(last)}"


def _earlier_evidence(events: Sequence[KernelEvent]) -> dict:
    return {"earlier_count": len(events),
            "earlier_times": latest_distinct(e.wall_time for e in events if e.wall_time is not None)}


def with_earlier(finding: Finding, earlier: Sequence[KernelEvent], window_seconds: float) -> Finding:
    """A saved log's finding that also names its events from before the window (they no longer count)."""
    if not earlier:
        return finding
    return replace(finding, message=f"{finding.message} Earlier, more than {span(window_seconds)} before the log's "
                                    f"last record and no longer counted: {when(earlier)}.",
                   evidence=dict(finding.evidence, **_earlier_evidence(earlier)))


def listed_only(check: str, reason: str, device: str, what: str, events: Sequence[KernelEvent],
                window_seconds: float) -> Finding:
    """Info about a saved log's events that are all older than the window: a post-mortem lists every
    event with its time, but a transient one that long before the end no longer counts against the node."""
    first, last = seen_range(events)
    return Finding(check, Severity.INFO, reason,
                   f"{what} {when(events)}, the last saying \"{trim(events[-1].text)}\": more than "
                   f"{span(window_seconds)} before the log's last record, so it is listed for the post-mortem "
                   "and no longer counts against the node.",
                   device=device, evidence=dict(_earlier_evidence(events), count=len(events),
                                                last_text=trim(events[-1].text), first_time=first, last_time=last),
                   first_seen=first, last_seen=last)


def still_counts(event: KernelEvent, now: float, window_seconds: float, whole_boot: bool = False) -> bool:
    """Whether an event counts in this pass.

    The collector hands over the current boot only, so whole-boot events always count; so do
    events without a wall time (a saved log replayed after the fact has no 'now' to age from).
    """
    if whole_boot or event.wall_time is None:
        return True
    return event.wall_time >= now - window_seconds


def near(a: KernelEvent, b: KernelEvent, seconds: float) -> bool:
    """Whether two events of one log are at most `seconds` apart: by their times since boot where both have
    them, else by their wall times; two events the log gives no comparable time for count as near."""
    if a.monotonic_us is not None and b.monotonic_us is not None:
        return abs(a.monotonic_us - b.monotonic_us) <= seconds * 1e6
    if a.wall_time is not None and b.wall_time is not None:
        return abs(a.wall_time - b.wall_time) <= seconds
    return True


def trim(text: str, limit: int = TEXT_LIMIT) -> str:
    """One line of at most `limit` characters, for messages and evidence."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def span(seconds: float) -> str:
    """A window in words: 86400 -> '24 h', 3600 -> '1 h', 600 -> '10 min', 30 -> '30 s'."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def clock(epoch: float) -> str:
    """An epoch time as UTC wall-clock text; deterministic, unlike local time."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def seen_range(events: Sequence[KernelEvent]) -> tuple[float | None, float | None]:
    """Earliest and latest wall time among the events (None where none has one)."""
    times = [e.wall_time for e in events if e.wall_time is not None]
    return (min(times), max(times)) if times else (None, None)


def times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def whole_numbers(values: Iterable[object]) -> list[int]:
    """The values that are whole numbers (the log may say '<unknown>' or nothing)."""
    out = []
    for v in values:
        if isinstance(v, bool):
            continue
        if isinstance(v, int) or (isinstance(v, str) and _WHOLE_NUMBER.fullmatch(v)):
            out.append(int(v))
    return out


def latest_distinct(values: Iterable[object]) -> list:
    """Distinct values in order of last appearance, keeping the latest LIST_LIMIT (bounded evidence)."""
    seen: dict = {}
    for v in values:
        seen.pop(v, None)
        seen[v] = True
    return list(seen)[-LIST_LIMIT:]
