"""Window statistics of probes, and the summary document agents exchange.

Round-trip times go into fixed buckets, the same on every node and in every window, so that
windows and nodes merge exactly by adding counts: a percentile is computed from the merged
histogram, never averaged. The summary (`/v1/pingmesh`) comes from other nodes and is untrusted:
`parse_summary` bounds its size and shape before anything is built from it.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 1
# Upper bounds in seconds: 50 us (same leaf, idle) to 5 s (past every timeout we use), about
# three per decade. Pingmesh's intra-pod P50 is hundreds of microseconds, P99 low milliseconds;
# a TCP connect that needed one SYN retransmission takes about 1 s, two about 3 s.
BUCKETS_SECONDS: tuple[float, ...] = (
    0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
    0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)
PROBES = ("ping", "tcp")
_BUCKETS = list(BUCKETS_SECONDS)  # as a summary lists them: valid, no need to check them one by one

MAX_SUMMARY_BYTES = 1 << 20
MAX_WINDOWS = 64
MAX_PEERS_PER_WINDOW = 10000
MAX_NAME = 253  # a DNS name
MAX_PROBE_NAME = 32  # a probe kind's name; a longer one is garbage, not a kind
_LIMIT = 1 << 40  # any count at or past this is garbage


class SummaryError(ValueError):
    """A summary that cannot be used, with the reason."""


def bucket_index(rtt: float, buckets: Sequence[float] = BUCKETS_SECONDS) -> int:
    """The bucket an answered probe's round trip falls in; len(buckets) is the overflow bucket."""
    lo, hi = 0, len(buckets)
    while lo < hi:
        mid = (lo + hi) // 2
        if rtt <= buckets[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def quantile(counts: dict[int, int], q: float, buckets: Sequence[float] = BUCKETS_SECONDS) -> float | None:
    """The q-quantile of a histogram: the upper bound of the bucket holding it, as Prometheus
    would bound it; the overflow bucket gives +Inf. None for an empty histogram."""
    total = sum(counts.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i in sorted(counts):
        seen += counts[i]
        if seen >= rank:
            return buckets[i] if i < len(buckets) else math.inf
    return math.inf


class PeerStats:
    """One peer and probe kind in one window. Slotted: an agent keeps about 7,000 of these (330
    peers, both kinds, 20 windows), and a dataclass's instance dict would double their memory."""

    __slots__ = ("node", "leaf", "rail", "probe", "sent", "lost", "retrans", "counts")

    def __init__(self, node: str, leaf: str, rail: int, probe: str, sent: int = 0, lost: int = 0, retrans: int = 0,
                 counts: dict[int, int] | None = None):
        self.node, self.leaf, self.rail, self.probe = node, leaf, rail, probe
        self.sent, self.lost = sent, lost
        self.retrans = retrans  # TCP connects whose time shows a SYN retransmission
        self.counts: dict[int, int] = {} if counts is None else counts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PeerStats) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __repr__(self) -> str:
        return f"PeerStats({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"

    def copy(self) -> PeerStats:
        return PeerStats(self.node, self.leaf, self.rail, self.probe, self.sent, self.lost, self.retrans,
                         dict(self.counts))

    def add(self, rtt: float | None, retransmitted: bool = False) -> None:
        """One probe: its round trip, or None when it was lost."""
        self.sent += 1
        if rtt is None:
            self.lost += 1
            return
        i = bucket_index(rtt)
        self.counts[i] = self.counts.get(i, 0) + 1
        if retransmitted:
            self.retrans += 1

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"node": self.node, "leaf": self.leaf, "rail": self.rail, "probe": self.probe,
                             "sent": self.sent, "lost": self.lost,
                             "counts": [[i, n] for i, n in sorted(self.counts.items())]}
        if self.retrans:
            d["retrans"] = self.retrans
        return d


@dataclass
class Window:
    start: float
    closed: bool
    peers: list[PeerStats] | None  # None: sent by its start alone (`?since=`): one the asker has, or still open
    # Peer entries of probe kinds this version does not know (a newer agent's), left out: a rolling
    # upgrade must not make a controller refuse the agents that are already new.
    skipped: int = 0
    # A window of the packed form (packed.py) comes folded by its agent: folded.PreparedWindow, peers None.
    ready: Any = None


@dataclass
class Summary:
    node: str
    leaf: str
    pod: str
    time: float
    window_seconds: float
    buckets: tuple[float, ...]
    windows: list[Window]


def parse_summary(obj: Any, stubs: bool = False) -> Summary:
    """Validate one agent's summary (already decoded JSON). Raises SummaryError with the reason.

    With `stubs`, a window may come without its peers (an answer to `?since=`); its peers are None."""
    if not isinstance(obj, dict):
        raise SummaryError(f"a summary is an object, not {type(obj).__name__}")
    if obj.get("schema_version") != SCHEMA_VERSION:
        raise SummaryError(f"schema_version {obj.get('schema_version')!r} is not {SCHEMA_VERSION}")
    node = _name(obj.get("node"), "node", required=True)
    window_seconds = number(obj.get("window_seconds"), "window_seconds")
    if not 1 <= window_seconds <= 3600:
        raise SummaryError(f"window_seconds {window_seconds:g} is outside 1..3600")
    buckets = obj.get("buckets_seconds")
    if buckets != _BUCKETS and (not isinstance(buckets, list) or not 1 <= len(buckets) <= 64
            or any(isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) for b in buckets)
            or any(a >= b for a, b in zip(buckets, buckets[1:]))):
        raise SummaryError("buckets_seconds must be 1 to 64 increasing finite numbers")
    windows = obj.get("windows")
    if not isinstance(windows, list):
        raise SummaryError("windows must be a list")
    if len(windows) > MAX_WINDOWS:
        raise SummaryError(f"{len(windows)} windows, more than {MAX_WINDOWS}")
    out = []
    for w in windows:
        if stubs and isinstance(w, dict) and "peers" not in w:
            out.append(Window(number(w.get("start"), "window start"), w.get("closed") is True, None))
            continue
        if not isinstance(w, dict) or not isinstance(w.get("peers"), list):
            raise SummaryError("a window must be an object with a peers list")
        if len(w["peers"]) > MAX_PEERS_PER_WINDOW:
            raise SummaryError(f"a window lists {len(w['peers'])} peers, more than {MAX_PEERS_PER_WINDOW}")
        start = number(w.get("start"), "window start")
        peers = [_peer(p, len(buckets)) for p in w["peers"]]
        skipped = peers.count(None)
        if skipped:
            peers = [p for p in peers if p is not None]
        out.append(Window(start, w.get("closed") is True, peers, skipped))
    return Summary(node, _name(obj.get("leaf"), "leaf"), _name(obj.get("pod"), "pod"),
                   number(obj.get("time"), "time"), window_seconds,
                   BUCKETS_SECONDS if buckets == _BUCKETS else tuple(float(b) for b in buckets), out)


def loads_summary(data: bytes, stubs: bool = False) -> Summary:
    """Parse the bytes of a summary, refusing more than MAX_SUMMARY_BYTES before decoding."""
    if len(data) > MAX_SUMMARY_BYTES:
        raise SummaryError(f"summary of {len(data)} bytes, more than {MAX_SUMMARY_BYTES}")
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise SummaryError(f"not JSON: {e}") from None
    return parse_summary(obj, stubs)


def _peer(p: Any, nbuckets: int) -> PeerStats | None:
    """One peer entry, or None for one of a probe kind this version does not know. The controller
    parses millions of these per analysis: the common, valid entry takes one pass of exact type
    tests; anything else goes to _checked_peer for the reason."""
    if type(p) is dict:
        node, leaf, probe = p.get("node"), p.get("leaf", ""), p.get("probe")
        sent, lost, retrans, rail, raw = p.get("sent"), p.get("lost"), p.get("retrans", 0), p.get("rail", 0), \
            p.get("counts")
        if (type(node) is str and 0 < len(node) <= MAX_NAME and type(leaf) is str and len(leaf) <= MAX_NAME
                and probe in PROBES and type(sent) is int and type(lost) is int and type(retrans) is int
                and type(rail) is int and 0 <= lost <= sent < _LIMIT and 0 <= retrans < _LIMIT and 0 <= rail <= 64
                and type(raw) is list and len(raw) <= nbuckets + 1):
            counts: dict[int, int] = {}
            total = 0
            for pair in raw:
                if type(pair) is not list or len(pair) != 2:
                    break
                i, n = pair
                if type(i) is not int or type(n) is not int or not 0 <= i <= nbuckets or not 0 <= n < _LIMIT:
                    break
                counts[i] = counts.get(i, 0) + n
                total += n
            else:
                if total == sent - lost:
                    return PeerStats(node, leaf, rail, probe, sent, lost, retrans, counts)
    return _checked_peer(p, nbuckets)


def _checked_peer(p: Any, nbuckets: int) -> PeerStats | None:
    if not isinstance(p, dict):
        raise SummaryError("a peer entry must be an object")
    probe = p.get("probe")
    if isinstance(probe, str) and 0 < len(probe) <= MAX_PROBE_NAME and probe not in PROBES:
        return None  # a newer agent's kind: skipped (Window.skipped), the rest of the summary is used
    if probe not in PROBES:
        raise SummaryError(f"probe {probe!r} is not one of {', '.join(PROBES)}")
    sent, lost = _count(p.get("sent"), "sent"), _count(p.get("lost"), "lost")
    retrans = _count(p.get("retrans", 0), "retrans")
    rail = _count(p.get("rail", 0), "rail")
    if lost > sent or rail > 64:
        raise SummaryError("lost must not exceed sent, and rail must be at most 64")
    raw = p.get("counts")
    if not isinstance(raw, list) or len(raw) > nbuckets + 1:
        raise SummaryError("counts must be a list of [bucket, count] pairs")
    counts: dict[int, int] = {}
    for pair in raw:
        if not isinstance(pair, list) or len(pair) != 2:
            raise SummaryError("counts must be a list of [bucket, count] pairs")
        i, n = _count(pair[0], "bucket"), _count(pair[1], "count")
        if i > nbuckets:
            raise SummaryError(f"bucket {i} is past the {nbuckets} buckets")
        counts[i] = counts.get(i, 0) + n
    if sum(counts.values()) != sent - lost:
        raise SummaryError(f"counts add up to {sum(counts.values())}, not sent - lost = {sent - lost}")
    return PeerStats(_name(p.get("node"), "peer node", required=True), _name(p.get("leaf"), "peer leaf"), rail,
                     probe, sent, lost, retrans, counts)


def _name(value: Any, what: str, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or len(value) > MAX_NAME or (required and not value):
        raise SummaryError(f"{what} must be a string of at most {MAX_NAME} characters")
    return value


def number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SummaryError(f"{what} must be a finite number, not {value!r}")
    return float(value)


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _LIMIT:
        raise SummaryError(f"{what} must be a non-negative integer, not {value!r}")
    return value
