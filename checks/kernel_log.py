"""Rules every kernel-log check shares: which events still count, and how an event's text and
time are shown, so that xid, kernel and link_events judge time the same way."""
from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence

from nodehealth.collectors.kernel_events import KernelEvent
from nodehealth.model import Observed

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


def still_counts(event: KernelEvent, now: float, window_seconds: float, whole_boot: bool = False) -> bool:
    """Whether an event counts in this pass.

    The collector hands over the current boot only, so whole-boot events always count; so do
    events without a wall time (a saved log replayed after the fact has no 'now' to age from).
    """
    if whole_boot or event.wall_time is None:
        return True
    return event.wall_time >= now - window_seconds


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
