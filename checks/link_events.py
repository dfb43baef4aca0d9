"""Network ports going down and flapping, as the kernel log tells it (mlx5, IB and netdev lines).

The port's current state is the infiniband check's business (sysfs); this check judges the
history: a down without a later up, repeated downs in a short time, a down that recovered.

Only a down after the port was seen up is a drop. Bringing up a port without a cable prints
"Link down" too (a real boot log: three uncabled mlx5 Ethernet ports, one minute after boot), and
such a port is not broken, merely unused. The price: where the ring buffer has lost the boot's
first records, a port's first drop after that is missed; its later ones still count.
"""
from __future__ import annotations

from nodehealth.checks.kernel_log import (
    clock,
    is_saved_log,
    listed_only,
    reference_time,
    seen_range,
    span,
    still_counts,
    times,
    trim,
    with_earlier,
)
from nodehealth.collectors.kernel_events import LINK_DOWN, LINK_UP, KernelEvent
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "link_events"
NEEDS = ("kmsg",)
SUBSYSTEM = "network"
DEBOUNCE = False
DEFAULTS: dict = {
    # Downs older than this no longer count.
    "window_seconds": 86400.0,
    # Flapping: this many downs of one port within flap_window_seconds. What peers do: gpud calls 3
    # down-then-up cycles a flap; NVSentinel escalates a port at 3 degradations per hour; aznhc
    # fails at 5 carrier losses in 24 h. 3 in 1 h follows the first two; a slower trickle of downs
    # still shows as LinkDownRecovered warnings.
    "flap_count": 3,
    "flap_window_seconds": 3600.0,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "window_seconds": "link downs older than this no longer count",
    "flap_count": "downs of one port within `flap_window_seconds` that make it `LinkFlapping`",
    "flap_window_seconds": "see `flap_count`",
}
SOURCE = "kernel log"
FINDS = ("mlx5/IB links that went down, stayed down or flap; only a down after the port was seen up counts (an "
         "uncabled port also prints \"Link down\")")
REASONS = {
    "LinkDown": Reason(Severity.DEGRADED, Action.HW_INSPECTION, "a port went down and the log shows no link up since"),
    "LinkFlapping": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                           "a port went down `flap_count` (3) times within `flap_window_seconds` (1 h)"),
    "LinkDownRecovered": Reason(Severity.WARNING, Action.NONE,
                                "a port went down and came back up; nothing to do unless it keeps happening"),
}

ADVICE = ("check the cable, transceiver and switch port (ibstat, ip link, the switch's port log) and "
          "replace the cable or transceiver if it keeps happening")


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    window = cfg.get("window_seconds", DEFAULTS["window_seconds"])
    flap_count = cfg.get("flap_count", DEFAULTS["flap_count"])
    flap_window = cfg.get("flap_window_seconds", DEFAULTS["flap_window_seconds"])
    by_port: dict[str, list[KernelEvent]] = {}
    for e in obs.facts["kmsg"].events:
        if e.kind in (LINK_DOWN, LINK_UP):
            by_port.setdefault(port_name(e), []).append(e)
    findings = []
    for port, events in sorted(by_port.items()):
        findings += judge_port(port, events, reference_time(obs), window, flap_count, flap_window,
                               is_saved_log(obs))
    return findings


def port_name(e: KernelEvent) -> str:
    """`mlx5_0:1` for an HCA port (as the infiniband check names it), else the netdev name."""
    port = e.detail.get("port")
    return f"{e.device}:{port}" if isinstance(port, int) and not isinstance(port, bool) else e.device


def judge_port(port: str, events: list[KernelEvent], now: float, window: float, flap_count: int,
               flap_window: float, saved: bool = False) -> list[Finding]:
    """One port's link events, in log order; a saved log's downs before the window are listed as info."""
    first_up = next((i for i, e in enumerate(events) if e.kind == LINK_UP), None)
    if first_up is None:
        return []
    events = events[first_up:]
    downs = [e for e in events if e.kind == LINK_DOWN and still_counts(e, now, window)]
    older = [e for e in events if e.kind == LINK_DOWN and not still_counts(e, now, window)] if saved else []
    if not downs:
        return [listed_only(NAME, "LinkDownRecovered", port, f"Port {port} went down", older, window)] if older else []
    return [with_earlier(f, older, window) for f in _judge_downs(port, events, downs, window, flap_count, flap_window)]


def _judge_downs(port: str, events: list[KernelEvent], downs: list[KernelEvent], window: float, flap_count: int,
                 flap_window: float) -> list[Finding]:
    still_down = events[-1].kind == LINK_DOWN and downs[-1] is events[-1]
    burst = most_in_span(downs, flap_window)
    findings = []
    if burst >= flap_count:
        findings.append(_flapping(port, downs, burst, window, flap_count, flap_window))
    if still_down:
        findings.append(_down(port, downs, window))
    elif burst < flap_count:
        findings.append(_recovered(port, downs, window))
    return findings


def most_in_span(events: list[KernelEvent], seconds: float) -> int:
    """The most events inside any stretch of `seconds`.

    Times are the monotonic clock where every event has one (it never jumps), else wall time.
    Events with no time at all may have fallen in any stretch, so they are added to the count.
    """
    if all(e.monotonic_us is not None for e in events):
        stamps = sorted(e.monotonic_us / 1e6 for e in events)
    else:
        stamps = sorted(e.wall_time for e in events if e.wall_time is not None)
    untimed = len(events) - len(stamps)
    most = start = 0
    for end, stamp in enumerate(stamps):
        while stamp - stamps[start] > seconds:
            start += 1
        most = max(most, end - start + 1)
    return most + untimed


def _when(e: KernelEvent) -> str:
    return f" at {clock(e.wall_time)}" if e.wall_time is not None else ""


def _earlier(downs: list[KernelEvent], window: float) -> str:
    return f" ({len(downs)} downs in the last {span(window)})" if len(downs) > 1 else ""


def _evidence(downs: list[KernelEvent], **extra: object) -> dict:
    first, last = seen_range(downs)
    return dict({"downs": len(downs), "last_text": trim(downs[-1].text), "first_time": first, "last_time": last},
                **extra)


def _flapping(port: str, downs: list[KernelEvent], burst: int, window: float, flap_count: int,
              flap_window: float) -> Finding:
    first, last = seen_range(downs)
    return Finding(
        NAME, Severity.DEGRADED, "LinkFlapping",
        f"Port {port} went down {burst} times within {span(flap_window)} ({times(len(downs))} in the last "
        f"{span(window)}, the last{_when(downs[-1])} saying \"{trim(downs[-1].text)}\"), at or above the flap "
        f"limit of {flap_count}: each drop stalls or breaks the collective traffic on it (NCCL timeouts); "
        f"{ADVICE}.",
        device=port, action=Action.HW_INSPECTION,
        evidence=_evidence(downs, most_downs_in_flap_window=burst),
        first_seen=first, last_seen=last)


def _down(port: str, downs: list[KernelEvent], window: float) -> Finding:
    first, last = seen_range(downs)
    return Finding(
        NAME, Severity.DEGRADED, "LinkDown",
        f"Port {port} went down{_when(downs[-1])} (\"{trim(downs[-1].text)}\") and the kernel log shows no "
        f"link up since{_earlier(downs, window)}: traffic over it fails or moves to other ports; {ADVICE}.",
        device=port, action=Action.HW_INSPECTION, evidence=_evidence(downs),
        first_seen=first, last_seen=last)


def _recovered(port: str, downs: list[KernelEvent], window: float) -> Finding:
    first, last = seen_range(downs)
    return Finding(
        NAME, Severity.WARNING, "LinkDownRecovered",
        f"Port {port} went down {times(len(downs))} in the last {span(window)} and came back up "
        f"{'each time ' if len(downs) > 1 else ''}"
        f"(the last{_when(downs[-1])} saying \"{trim(downs[-1].text)}\"): jobs using it may have seen a stall "
        "or a timeout; nothing to do unless it keeps happening.",
        device=port, action=Action.NONE, evidence=_evidence(downs),
        first_seen=first, last_seen=last)
