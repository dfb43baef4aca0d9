"""One agent's window folded for the analysis: what the agent sends in the packed form and the controller adds up.

Both ends fold with this code (packed.py on the agent, analysis.py on the controller for JSON
summaries), so a window weighs the same whichever form it came in. Kept apart from analysis.py,
which needs numpy: the daemon imports this module and never the analysis.
"""
from __future__ import annotations

import itertools
import math
import sys
from array import array
from dataclasses import dataclass, replace

from nodehealth.pingmesh import robust, stats
from nodehealth.pingmesh.stats import BUCKETS_SECONDS, SummaryError, quantile

CLOCK_SKEW_SECONDS = 2.0  # a window that ends later than now by more than this is not closed yet
NB = len(BUCKETS_SECONDS)  # bucket NB is the overflow bucket
NB1 = NB + 1  # buckets in a histogram
NONE = NB1  # p99 slot of an edge with no answered probe

_folded_ids = itertools.count()


class Folded:
    """One agent's window as the analysis adds it up: one edge per peer node (its TCP probes over all
    rails, its Pings only where it has none; see analysis.py), with each edge's top and p99
    bucket worked out. Compact, about 30 bytes an edge: the controller keeps ~5 per agent between runs.

    A TCP probe answered only after a SYN retransmission is a lost packet that TCP recovered: it is
    counted in `retrans` (the analysis counts it as lost) and taken off the histogram, from its
    slowest buckets, since its time is the kernel's retransmission timer (1 s), not the path's."""

    __slots__ = ("id", "names", "leaves", "sent", "lost", "retrans", "rails", "top", "p99", "offsets", "flat")

    def __init__(self, peers: list[stats.PeerStats]) -> None:
        edges: dict[str, list] = {}
        by_tcp = {p.node for p in peers if p.probe == "tcp" and p.sent > 0}
        for p in peers:
            if p.sent <= 0 or (p.probe != "tcp" and p.node in by_tcp):
                continue
            e = edges.get(p.node)
            if e is None:
                edges[p.node] = [p.sent, p.lost, p.counts, p.leaf, False, p.retrans, 1]
            else:
                e[0] += p.sent
                e[1] += p.lost
                e[5] += p.retrans
                e[6] += 1
                if not e[4]:  # the first entry's dict belongs to the caller: copy before adding to it
                    e[2], e[4] = dict(e[2]), True
                for i, n in p.counts.items():
                    e[2][i] = e[2].get(i, 0) + n
        self.id = next(_folded_ids)  # what a kept judgement is keyed by
        self.names = tuple(sys.intern(name) for name in edges)  # one string per name, however many windows
        self.leaves = tuple(sys.intern(e[3]) for e in edges.values())
        sent, lost, retrans, rails, top, p99, offsets, flat = [], [], [], [], [], [], [0], []
        for n_sent, n_lost, counts, _, _, n_retrans, n_rails in edges.values():
            if n_retrans:
                n_retrans = min(n_retrans, n_sent - n_lost)  # a summary's word: no more than were answered
                counts = robust.without_slowest(counts, n_retrans)
            sent.append(n_sent)
            lost.append(n_lost)
            retrans.append(n_retrans)
            rails.append(n_rails if n_rails < 127 else 127)
            t = max(counts) if counts else -1
            top.append(t)
            answered = n_sent - n_lost - n_retrans
            if answered == 0:
                p99.append(NONE)
            elif answered < 100:  # the p99 of fewer than 100 probes is the slowest one
                p99.append(t)
            else:
                p99.append(quantile_bucket(quantile(counts, 0.99)))
            for i, n in counts.items():
                flat.append(i)
                flat.append(n)
            offsets.append(len(flat))
        self.sent, self.lost = int_array(sent), int_array(lost)
        self.offsets, self.flat = int_array(offsets), int_array(flat)
        self.retrans, self.rails = int_array(retrans), array("b", rails)  # rails: the entries folded into the edge
        self.top, self.p99 = array("b", top), array("b", p99)  # bucket indices (-1: no answer; NONE: no p99)
        # edge j's histogram: flat[offsets[j]:offsets[j + 1]], bucket, count, bucket, count, ...

    @classmethod
    def of(cls, names: tuple[str, ...], leaves: tuple[str, ...], sent: array, lost: array, retrans: array,
           offsets: array, flat: array, rails: array, top: array, p99: array) -> Folded:
        """A window its agent folded (packed.py, which checks the arrays first)."""
        f = cls.__new__(cls)
        f.id = next(_folded_ids)
        f.names, f.leaves, f.sent, f.lost, f.retrans = names, leaves, sent, lost, retrans
        f.offsets, f.flat, f.rails, f.top, f.p99 = offsets, flat, rails, top, p99
        return f

    def share(self, other: Folded) -> None:
        """Take `other`'s names and leaves where they are the same (an agent's windows mostly are)."""
        if self.names == other.names:
            self.names = other.names
        if self.leaves == other.leaves:
            self.leaves = other.leaves


def int_array(values: list[int]) -> array:
    """An exact-size array of 4-byte integers where they fit (counts of probes do), else 8-byte ones."""
    return array("i" if -(1 << 31) <= min(values, default=0) and max(values, default=0) < 1 << 31 else "q", values)


@dataclass
class PreparedWindow:
    start: float
    closed: bool
    entries: int  # peer entries as the agent sent them
    max_sent: int  # the most probes of one entry
    folded: Folded | None  # None where the analysis does not use the window (open, ahead of `now`, alien buckets)
    skipped: int = 0  # peer entries of probe kinds this version does not know (stats.Window.skipped)


@dataclass
class Prepared:
    """One agent's summary made ready for the analysis at one time: what _Mesh checks and adds up."""

    node: str
    leaf: str
    window_seconds: float
    buckets: tuple[float, ...]
    windows: list[PreparedWindow]


def usable(closed: bool, start: float, window_seconds: float, now: float) -> bool:
    """Whether the analysis at `now` adds a window up: closed, by the agent's word and by our clock."""
    return closed and start + window_seconds <= now + CLOCK_SKEW_SECONDS


def prepare_window(w: stats.Window, window_seconds: float, buckets: tuple[float, ...], now: float) -> PreparedWindow:
    fold = buckets == BUCKETS_SECONDS and usable(w.closed, w.start, window_seconds, now)
    if w.ready is not None:  # the packed form's: folded by its agent
        return w.ready if fold else replace(w.ready, folded=None)
    if w.peers is None:
        raise SummaryError(f"window {w.start:.3f} came without its peers")
    return PreparedWindow(w.start, w.closed, len(w.peers), max((p.sent for p in w.peers), default=0),
                          Folded(w.peers) if fold else None, w.skipped)


def prepare(s: stats.Summary, now: float) -> Prepared:
    buckets = tuple(s.buckets)
    return Prepared(s.node, s.leaf, s.window_seconds, buckets,
                    [prepare_window(w, s.window_seconds, buckets, now) for w in s.windows])


def quantile_bucket(q: float | None) -> int:
    """Bucket index of a quantile returned by stats.quantile (an upper bound, or inf)."""
    if q is None:
        return NONE
    if math.isinf(q):
        return NB
    return BUCKETS_SECONDS.index(q)
