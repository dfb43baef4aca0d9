"""Pingmesh localization: which node, leaf or leaf-to-leaf path explains the lost and slow probes.

Long on purpose: one algorithm (fold, add up, judge in three steps, hysteresis) whose steps share
the packed per-window arrays; split, each part would reach into the others' layout.

Pure: agents' summaries (stats.Summary or the decoded JSON of `/v1/pingmesh`) in, an Analysis out.
Evidence is the TCP probes (answered by the peer's kernel); a peer's Pings count only without them.
A probe answered only after a retransmitted SYN is a lost packet that TCP recovered: it counts as
lost. Every summary is its agent's word (docs/threat-model.md): leaves, members and rails are the
inventory's; each edge weighs at most what the probe schedule can send; before an aggregate is
judged, no reporter counts more than the next one after `tolerated_liars` (robust.py), so that one
agent alone names nothing. Windows of all agents are aligned by their start; only closed ones
count. Each window is judged on its own, in three steps, each explaining away what the one before
could not:

1. Inside each leaf (its full mesh): a node is suspect when its probes with its leaf-mates lose
   (pooled, so that 1% loss on one link stands out over a few hundred peers, and beyond what the
   median node's loss explains) or when the median of its edges' p99 is over the intra-leaf
   baseline. Suspects are taken greedily, worst first, and each one's lossy edges are taken off its
   leaf-mates' totals, so that one dead node does not make its whole leaf look lossy. A node that
   answers (almost) none of its probers is suspect too, even when its own agent reports nothing.
   When most of a leaf is suspect, the leaf is at fault; otherwise a suspect is a node verdict if
   enough healthy leaf-mates and reporters back it, else inconclusive (a two-node leaf cannot tell
   a node from its leaf). A reporter whose loss its peers' own probes contradict is doubted: an
   inconclusive verdict about it, none about them.
2. Between leaves (R-Pingmesh's fold): every probe between two leaves adds to the directed
   leaf->leaf edge (loss = lost / sent, one merged histogram for p99), minus the lossy or slow edges
   of step 1's suspects. A leaf whose bad fraction of edges out or in reaches `leaf_fraction`, or
   whose loss pooled over all its edges is over `loss_fraction` and spread over most partner leaves,
   is at fault (its uplinks, or the leaf cut off), worst first, each one taken off its partners'
   counts; a bad edge between two otherwise fine leaves is a path. The latency baseline is the
   typical leaf's typical pair: a slow leaf touches most pairs where leaves are few.
3. Hysteresis over windows: a verdict opens after `open_windows` consecutive bad windows and closes
   after `close_windows` good ones; windows without data about an element neither open nor close
   it. The agents keep ~20 windows, so each run sees enough history: verdicts carry no state from run to run.

Each agent's window is first folded (folded.py: one edge per peer node), then added up: per window,
counters per node and per leaf pair in arrays, and only edges with a lost or slow probe are kept one
by one (to explain them away), up to a cap. The adding-up and step 2 run in bulk with numpy (a window
has ~2 million edges and ~100,000 leaf pairs at 10,000 nodes x 8 rails); the rest is Python over what
is suspect. analyze() keeps every window's folded contributions and adds each window up once; an
Analyzer (the controller's, one run a window) also keeps each window's judgement and judges again only
a window whose contributions changed, so a run costs about the new window. Work and memory are bounded: at
most MAX_SUMMARIES summaries, MAX_NODES names, MAX_PEER_ENTRIES peer entries, `max_windows` windows
per window size and MAX_WINDOW_SIZES sizes.
"""
from __future__ import annotations

import functools
import heapq
import math
import time
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nodehealth import inventory
from nodehealth.pingmesh import robust
from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH_DEFAULTS
from nodehealth.pingmesh.folded import NB, NB1, Folded, Prepared, prepare, quantile_bucket
from nodehealth.pingmesh.stats import BUCKETS_SECONDS, MAX_WINDOWS, Summary, SummaryError, parse_summary, quantile

MAX_SUMMARIES = 10_000  # one per agent; more is not a cluster we size for, and bounds the work
MAX_NODES = 50_000  # distinct node names, reporters and the peers they name (dead ones included)
MAX_PEER_ENTRIES = 50_000_000  # summed over summaries: ~2 minutes of work; 10,000 x 330 x 10 fits
# Lossy or slow edges kept one by one in a window (~100 bytes each; 5 windows: ~30 MiB); past it, fewer explained.
MAX_ANOMALOUS_EDGES = 60_000
MAX_WINDOW_SIZES = 3  # distinct window_seconds kept apart; the one most agents use is analysed
MAX_SENT = 1_000_000  # probes of one peer entry in one window: more is not an agent's count
MAX_REJECTED = 1000  # reasons listed; the rest are counted
MAX_LEAF_NAME = 63  # a Kubernetes label value, which is where leaves come from
RAILS_UNKNOWN = 127  # a node's rails without an inventory: each edge is capped by the rails its reporter lists

KINDS = ("leaf", "node", "path", "inconclusive")
NB2 = NB1 + 1
_LEAF_KEY = 1 << 17  # leaf pair key = source leaf * _LEAF_KEY + target leaf (leaves < MAX_NODES < 2**17)
# "lost" counts every probe that lost a packet: unanswered, or answered only after a SYN retransmission.
_NODE_COLUMNS = ("reported", "in_sent", "in_lost", "in_edges", "in_dead",
                 "intra_sent", "intra_lost", "intra_retrans", "intra_edges", "intra_lossy", "inter_sent", "inter_lost",
                 "own_sent")


@dataclass
class Verdict:
    kind: str  # node, leaf, path or inconclusive
    element: str  # node name, leaf name, "leafA->leafB", or what could not be separated
    since: float  # start of the window in which the bad streak that opened it began
    windows: int  # bad windows since then
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "element": self.element, "since": self.since, "windows": self.windows,
                "message": self.message, "evidence": self.evidence}


@dataclass
class Analysis:
    verdicts: list[Verdict]
    nodes: int  # distinct nodes in the analysed windows (reporting or probed)
    leaves: int  # distinct known leaves among them
    windows_seen: int  # closed windows analysed
    rejected: list[tuple[str, str]]  # (summary, why) for summaries that were not used
    window_seconds: float
    time: float
    notes: list[str] = field(default_factory=list)  # limits reached (the analysis went on without)
    window_starts: list[float] = field(default_factory=list)  # of the analysed windows, oldest first
    unknown_probes: int = 0  # peer entries of probe kinds this version does not know, skipped (a note says so)

    def to_dict(self) -> dict[str, Any]:
        """The verdict ConfigMap's `verdicts.json` shape."""
        return {"schema_version": 1, "time": self.time, "window_seconds": self.window_seconds,
                "verdicts": [v.to_dict() for v in self.verdicts], "nodes": self.nodes, "leaves": self.leaves}


def analyze(summaries: Iterable[Any], cfg: dict[str, Any] | None = None, now: float | None = None,
            inv: inventory.Inventory | None = None, probe_interval: float | None = None) -> Analysis:
    """Localize faults in the agents' summaries (stats.Summary, Prepared or decoded JSON, mixed).

    `cfg` is config `pingmesh.analysis` (missing keys take the defaults); `now` (default: the
    clock) is the time of the analysis: windows that end after it are not closed yet. `inv`, the
    inventory, says who is in the mesh, in which leaf, on how many rails: summaries from nodes it
    does not list are rejected and probes of them ignored. Without it, each node's leaf is what its
    own summary (or the first to name it) says. `probe_interval` is the agents'
    pingmesh.probe_interval_seconds: no reporter weighs more than that schedule can send.
    """
    mesh = _Mesh(_settings(cfg), _interval(probe_interval))
    return mesh.run(summaries, time.time() if now is None else float(now), inv)


class Analyzer:
    """analyze() again every window, keeping what did not change (the controller's).

    A window whose contributions this run are the very Folded windows of the last run (same agents,
    same data) keeps its judgement; the others are added up and judged again. The verdicts are
    analyze()'s over the same summaries. Kept between runs: one judgement per analysed window (at most
    max_windows) and the node and leaf names, forgotten (with the judgements) once they are more than
    twice the nodes in use plus 1,000.
    """

    def __init__(self, cfg: dict[str, Any] | None = None, probe_interval: float | None = None) -> None:
        self._mesh = _Mesh(_settings(cfg), _interval(probe_interval))

    def run(self, summaries: Iterable[Any], now: float, inv: inventory.Inventory | None = None) -> Analysis:
        return self._mesh.run(summaries, float(now), inv)

    @property
    def rebuilt(self) -> int:
        """Windows added up and judged by the last run (the rest kept their judgement)."""
        return self._mesh.rebuilt


def _interval(probe_interval: float | None) -> float:
    value = PINGMESH_DEFAULTS["probe_interval_seconds"] if probe_interval is None else float(probe_interval)
    if not value > 0:
        raise ValueError(f"probe_interval must be positive, not {probe_interval!r}")
    return value


def _settings(cfg: dict[str, Any] | None) -> dict[str, Any]:
    c = dict(PINGMESH_DEFAULTS["analysis"])
    c.update(cfg or {})
    return c


# -- aggregation -------------------------------------------------------------------------------

class _Window:
    """One window of one window size: counters per node and per leaf pair, and the anomalous edges."""

    def __init__(self, start: float, per_rail: int) -> None:
        self.start = start
        self.per_rail = per_rail  # the most probes of one peer, rail and kind a window can hold: each edge's cap
        self.n = 0  # node slots: the names known when it was added up
        self.col = {name: array("q") for name in _NODE_COLUMNS}
        self.p99 = array("q")  # per node NB2 slots: how many of its intra-leaf edges have their p99 there
        self.cluster = [0] * NB2  # the same over all intra-leaf edges: the baseline
        self.lp_key: list[int] = []  # slot -> leaf pair key
        self.lp_sent, self.lp_lost, self.lp_retrans = array("q"), array("q"), array("q")
        self.lp_reporters = array("q")  # agents reporting on the leaf pair
        self.lp_hist = array("q")  # NB1 per slot
        self.anomalous: list[tuple[int, int, int, int, tuple[int, ...], int]] = []  # src, dst, sent, lost, counts, slot
        self.by_node: dict[int, list[int]] = {}
        self.overflow = False  # more than MAX_ANOMALOUS_EDGES
        self.ignored = 0  # peer entries naming nodes past MAX_NODES
        self.strangers = 0  # peer entries naming nodes the inventory does not list
        self.capped = 0  # peer entries claiming more probes than the schedule allows, scaled down


class _Group:
    """The windows of the summaries that share one window size, newest `max_windows` kept: each one's
    contributions (src, Folded), added up when it is judged."""

    def __init__(self, window_seconds: float, keep: int, per_rail: int) -> None:
        self.window_seconds = window_seconds
        self.per_rail = per_rail
        self.keep = keep
        self.windows: dict[float, list[tuple[int, Folded]]] = {}
        self.summaries: list[str] = []  # node names of the summaries accepted into this group

    def window(self, start: float) -> list[tuple[int, Folded]] | None:
        w = self.windows.get(start)
        if w is not None:
            return w
        if len(self.windows) >= self.keep:
            oldest = min(self.windows)
            if start < oldest:
                return None
            del self.windows[oldest]
        w = self.windows[start] = []
        return w


class _Mesh:
    def __init__(self, cfg: dict[str, Any], probe_interval: float) -> None:
        self.cfg = cfg
        self.probe_interval = probe_interval
        self.inventory: dict[str, tuple[str, int]] | None = None  # name -> (leaf, rails), when given
        self.keep = max(1, min(int(cfg["max_windows"]), MAX_WINDOWS))
        self.slow = next((i for i, b in enumerate(BUCKETS_SECONDS) if b > float(cfg["p99_floor_seconds"])), NB)
        self.in_use = 0  # nodes known to the last run
        self.rebuilt = 0
        self._forget()

    def _forget(self) -> None:
        """Drop the names and the judgements that use their indices."""
        self.node_index: dict[str, int] = {}
        self.names: list[str] = []
        self.leaf_of: list[int] = []
        self.rails_of: list[int] = []  # rails with an address in the inventory; RAILS_UNKNOWN without one
        self.leaf_index: dict[str, int] = {"": 0}  # leaf 0 is "unknown": nothing is blamed on it
        self.leaves: list[str] = [""]
        self.judged: dict[tuple[float, float], tuple[frozenset[int], _Judge]] = {}  # (ws, start) -> ids, judgement
        # _peers's: id(names) -> (names, peer indices), of the last run and of this one.
        self._known_peers: dict[int, tuple[tuple[str, ...], Any]] = {}
        self._peers_used: dict[int, tuple[tuple[str, ...], Any]] = {}

    def run(self, summaries: Iterable[Any], now: float, inv: inventory.Inventory | None = None) -> Analysis:
        self.now = now
        known = None if inv is None else {n.name: (n.leaf, max(1, sum(1 for a in n.addresses if a)))
                                          for n in inv.nodes}
        if (len(self.names) > 2 * self.in_use + 1000 or (known is None) != (self.inventory is None)
                or (known is not None and any(known.get(name, (None,))[0] != self.leaves[leaf]
                                              for name, leaf in zip(self.names, self.leaf_of)))):
            self._forget()  # the names, or where they are, changed: judged again from scratch
        self.inventory = known
        self.groups: dict[float, _Group] = {}
        self.reporting: set[str] = set()  # nodes whose summary was taken
        self.rejected: list[tuple[str, str]] = []
        self.rejected_more = 0
        self.notes: list[str] = []
        self.entries = 0
        self.unknown_probes = 0  # peer entries of probe kinds this version does not know: skipped
        for i, obj in enumerate(summaries):
            if i >= MAX_SUMMARIES:
                self.notes.append(f"more than {MAX_SUMMARIES} summaries: the rest were not read")
                break
            self.add(i, obj)
        return self.finish()

    # -- input ---------------------------------------------------------------------------------
    def reject(self, label: str, why: str) -> None:
        if len(self.rejected) < MAX_REJECTED:
            self.rejected.append((label, why))
        else:
            self.rejected_more += 1

    def add(self, i: int, obj: Any) -> None:
        label = f"summary {i}"
        try:
            if isinstance(obj, dict) and isinstance(obj.get("node"), str) and 0 < len(obj["node"]) <= 253:
                label = obj["node"]
            if not isinstance(obj, Prepared):
                summary = obj if isinstance(obj, Summary) else parse_summary(self._trim(obj))
                label = summary.node
                obj = prepare(summary, self.now)
            label = obj.node
            self._check(obj)
            self._ingest(obj)
        except SummaryError as e:
            self.reject(label, str(e))

    def _trim(self, obj: Any) -> Any:
        """Only the closed windows we may use are worth validating (and paying for)."""
        if isinstance(obj, dict) and isinstance(obj.get("windows"), list) and len(obj["windows"]) <= MAX_WINDOWS:
            kept = [w for w in obj["windows"] if isinstance(w, dict) and w.get("closed") is True]
            return dict(obj, windows=kept[-self.keep:])
        return obj

    def _check(self, s: Prepared) -> None:
        if self.inventory is not None and s.node not in self.inventory:
            raise SummaryError(f"node {s.node} is not in the inventory")
        if tuple(s.buckets) != BUCKETS_SECONDS:
            raise SummaryError("buckets_seconds differ from this version's: histograms would not merge")
        if s.node in self.reporting:
            raise SummaryError(f"a second summary for node {s.node} (the first one is used)")
        ws = s.window_seconds
        starts = set()
        for w in s.windows:
            k = w.start / ws
            if abs(k - round(k)) > 1e-6:
                raise SummaryError(f"window start {w.start:.3f} is not a multiple of window_seconds {ws:g}")
            if w.start in starts:
                raise SummaryError(f"window {w.start:.3f} is listed twice")
            starts.add(w.start)
            if w.max_sent > MAX_SENT:
                raise SummaryError(f"{w.max_sent} probes of one peer in one window: more than {MAX_SENT}")
        entries = sum(w.entries for w in s.windows if w.closed)
        if self.entries + entries > MAX_PEER_ENTRIES:
            raise SummaryError(f"the analysis already holds {self.entries} peer entries (at most {MAX_PEER_ENTRIES})")
        if ws not in self.groups and len(self.groups) >= MAX_WINDOW_SIZES:
            raise SummaryError(f"window_seconds {ws:g}: already {MAX_WINDOW_SIZES} different window sizes")
        self.entries += entries
        self.unknown_probes += sum(w.skipped for w in s.windows if w.closed)
        self.reporting.add(s.node)

    def _node(self, name: str, leaf: str) -> int:
        """The index of node `name`, or -1 (past MAX_NODES, or not in the inventory). Its leaf is the
        inventory's; without an inventory, `leaf` (what the first summary to name it says)."""
        i = self.node_index.get(name)
        if i is not None:
            return i
        rails = RAILS_UNKNOWN
        if self.inventory is not None:
            if name not in self.inventory:
                return -1
            leaf, rails = self.inventory[name]
        if len(self.names) >= MAX_NODES:
            return -1
        i = self.node_index[name] = len(self.names)
        self.names.append(name)
        self.leaf_of.append(self._leaf(leaf))
        self.rails_of.append(rails)
        return i

    def _leaf(self, name: str) -> int:
        j = self.leaf_index.get(name)
        if j is None:
            if len(name) > MAX_LEAF_NAME or "->" in name or "|" in name or len(self.leaves) >= MAX_NODES:
                j = 0  # not a label value (it would garble "a->b"), or too many: unknown, nothing blamed on it
            else:
                j = len(self.leaves)
                self.leaves.append(name)
            if j or len(self.leaf_index) < 2 * MAX_NODES:  # garbage names are not remembered without end
                self.leaf_index[name] = j
        return j

    def _ingest(self, s: Prepared) -> None:
        ws = s.window_seconds
        group = self.groups.get(ws)
        if group is None:
            # A peer's probes in one window: one per interval, one more for where the window cuts the
            # schedule, one more for a pinglist change that restarts it.
            group = self.groups[ws] = _Group(ws, self.keep, math.ceil(ws / self.probe_interval) + 2)
        src = self._node(s.node, s.leaf)
        if src < 0:
            raise SummaryError(f"more than {MAX_NODES} node names")
        leaf = self._leaf(s.leaf)  # without an inventory, the agent's word for its own leaf
        if self.inventory is None and self.leaf_of[src] != leaf:
            self.leaf_of[src] = leaf
            self.judged = {}  # judged with its old leaf
        group.summaries.append(s.node)
        last = None
        for w in s.windows:
            if w.folded is None:
                continue
            win = group.window(w.start)
            if win is not None:
                if last is not None:  # one names tuple for an agent's windows: kept until they are judged
                    w.folded.share(last)
                win.append((src, w.folded))
                last = w.folded

    def _add_up(self, win: _Window, contributions: list[tuple[int, Folded]]) -> None:
        """Every agent's folded window into the window's counters, in bulk (numpy: one pass over the edges
        per counter, not a Python step per edge; at 10,000 nodes x 8 rails a window has ~2 million), a
        chunk of agents at a time so that its temporary arrays stay small.

        A peer's Pings count only where it has no TCP probes (Folded): the kernel answers a SYN whatever
        the load, while a Ping waits for the peer's agent, which a CPU-bound training job can starve; a
        slow or silent agent is not a network fault (the agents' own metrics show it). Each edge weighs
        at most what the probe schedule can have sent on the rails both ends have (the inventory's), so
        that no reporter outweighs the others; a peer's leaf is the inventory's (or its own summary's),
        never the reporter's word. Lossy and slow edges are listed one by one in the agents' order."""
        peers = [self._peers(f, win) for _, f in contributions]  # registers new names, in the agents' order
        n = win.n = len(self.names)
        leaf_of, rails_of = np.array(self.leaf_of, np.int64), np.array(self.rails_of, np.int64)
        cols = {name: np.zeros(n, np.int64) for name in _NODE_COLUMNS}
        p99_of, cluster = np.zeros(n * NB2, np.int64), np.zeros(NB2, np.int64)
        lp: dict[int, int] = {}  # leaf pair key -> slot, in the order the agents first name them
        lp_sums = np.zeros((0, 4), np.int64)  # per slot: sent, lost, retransmitted, reporters
        lp_hist = np.zeros((0, NB1), np.int64)
        by = functools.partial(_sums, size=n)  # per node
        for at in range(0, len(contributions), _CHUNK):
            chunk = contributions[at:at + _CHUNK]
            part = _Part(chunk, peers[at:at + _CHUNK], win.per_rail, leaf_of, rails_of)
            win.capped += len(part.scaled)
            c, intra, inter, src, dst = part.counted, part.intra, part.inter, part.src, part.dst
            for name, index, weights in (("in_sent", dst[c], part.sent[c]), ("in_lost", dst[c], part.lost[c]),
                                         ("in_edges", dst[c], None), ("in_dead", dst[part.dead], None),
                                         ("own_sent", src[intra], part.sent[intra])):
                cols[name] += by(index, weights)
            for name, values in (("sent", part.sent), ("lost", part.lost), ("retrans", part.retrans),
                                 ("edges", None), ("lossy", part.lost > 0)):  # intra-leaf: both ends' counts
                w = None if values is None else values[intra]
                cols[f"intra_{name}"] += by(dst[intra], w) + by(src[intra], w)
            for name, values in (("sent", part.sent), ("lost", part.lost)):
                cols[f"inter_{name}"] += by(dst[inter], values[inter]) + by(src[inter], values[inter])
            cols["reported"][np.array([s for s, _ in chunk], np.int64)] = 1
            k = part.p99[intra]
            p99_of += _sums(dst[intra] * NB2 + k, size=n * NB2) + _sums(src[intra] * NB2 + k, size=n * NB2)
            cluster += _sums(k, size=NB2)
            # Leaf pairs: new ones get the next slots, in the order of their first edge.
            keys = leaf_of[src] * _LEAF_KEY + leaf_of[dst]
            distinct, first, which = np.unique(keys[inter], return_index=True, return_inverse=True)
            for key in distinct[np.argsort(first)].tolist():
                if key not in lp:
                    lp[key] = len(lp)
            slot_of = np.array([lp[key] for key in distinct.tolist()], np.int64)
            slot = np.full(len(keys), -1, np.int64)
            slot[inter] = slot_of[which.reshape(-1)]
            slots, chosen = len(lp), slot[inter]
            grown = slots - len(lp_sums)
            lp_sums = np.concatenate([lp_sums, np.zeros((grown, 4), np.int64)])
            lp_hist = np.concatenate([lp_hist, np.zeros((grown, NB1), np.int64)])
            for j, values in enumerate((part.sent, part.lost, part.retrans)):
                lp_sums[:, j] += _sums(chosen, values[inter], slots)
            reporting = _distinct(part.agent[inter] * max(slots, 1) + chosen)  # (agent, slot) pairs
            lp_sums[:, 3] += _sums(reporting % max(slots, 1), size=slots)
            pair_slot = slot[part.pair_edge]
            into = pair_slot >= 0
            lp_hist += _sums(pair_slot[into] * NB1 + part.bucket[into], part.count[into], slots * NB1).reshape(-1, NB1)
            for e in np.flatnonzero(c & ((part.lost > 0) | (part.top >= self.slow))).tolist():
                if len(win.anomalous) >= MAX_ANOMALOUS_EDGES:
                    win.overflow = True
                    break
                s, d = int(src[e]), int(dst[e])
                eid = len(win.anomalous)
                win.anomalous.append((s, d, int(part.sent[e]), int(part.lost[e]), tuple(part.histogram(e)),
                                      int(slot[e])))
                win.by_node.setdefault(s, []).append(eid)
                win.by_node.setdefault(d, []).append(eid)
        win.col = {name: _int_array(cols[name]) for name in _NODE_COLUMNS}
        win.p99, win.cluster = _int_array(p99_of), cluster.tolist()
        win.lp_key = list(lp)
        win.lp_sent, win.lp_lost, win.lp_retrans, win.lp_reporters = (_int_array(lp_sums[:, j]) for j in range(4))
        win.lp_hist = _int_array(lp_hist.reshape(-1))

    def _peers(self, f: Folded, win: _Window) -> Any:
        """Each edge's peer node index (-1: a name past MAX_NODES or not in the inventory, counted in
        `win`); new names are registered as they come. Kept per names tuple (an agent's windows share
        theirs, controller.keep_windows) while every name is known: one lookup per agent, not per name."""
        known = self._peers_used.get(id(f.names)) or self._known_peers.get(id(f.names))
        if known is not None and known[0] is f.names:
            self._peers_used[id(f.names)] = known
            return known[1]
        node_index, out = self.node_index, []
        for name, leaf in zip(f.names, f.leaves):
            i = node_index.get(name)
            if i is None:
                i = self._node(name, leaf)
                if i < 0 and self.inventory is not None and name not in self.inventory:
                    win.strangers += 1
                elif i < 0:
                    win.ignored += 1
            out.append(i)
        peers = np.array(out, np.int64)
        if out and min(out) >= 0:
            self._peers_used[id(f.names)] = (f.names, peers)
        return peers


    def _leaves_by_word(self, group: _Group) -> None:
        """Without an inventory, a node's leaf is its own summary's word, else that of the first summary to
        name it, in this run, as analyze() takes it: a leaf kept from an earlier run's word is taken again
        (its windows are judged again)."""
        first: dict[str, str] = {}
        for start in sorted(group.windows):
            for _, f in group.windows[start]:
                for name, leaf in zip(f.names, f.leaves):
                    if name not in first:
                        first[name] = leaf
        for name, i in self.node_index.items():
            leaf = first.get(name)
            if name not in self.reporting and leaf is not None and self.leaf_of[i] != self._leaf(leaf):
                self.leaf_of[i] = self._leaf(leaf)
                self.judged = {}

    # -- output --------------------------------------------------------------------------------
    def finish(self) -> Analysis:
        group = None
        if self.groups:
            group = max(self.groups.values(), key=lambda g: len(g.summaries))
            for g in self.groups.values():
                if g is not group:
                    for name in g.summaries:
                        self.reject(name, f"window_seconds {g.window_seconds:g} differs from the "
                                          f"{group.window_seconds:g} of {len(group.summaries)} agents")
        if self.rejected_more:
            self.notes.append(f"{self.rejected_more} more summaries rejected than the {MAX_REJECTED} listed")
        if self.unknown_probes:
            self.notes.append(f"{self.unknown_probes} peer entries of probe kinds this version does not know were "
                              "skipped (agents newer than this analysis); the rest of their summaries was used")
        if group and self.inventory is None:
            self._leaves_by_word(group)
        judged, kept = [], {}
        self.rebuilt = 0
        for start in sorted(group.windows) if group else []:
            win = group.windows[start]
            key, ids = (group.window_seconds, start), frozenset(f.id for _, f in win)
            last = self.judged.get(key)
            if last is None or last[0] != ids:
                built = _Window(start, group.per_rail)
                self._add_up(built, win)
                last = (ids, _Judge(self, built).run())
                self.rebuilt += 1
            kept[key] = last
            judged.append(last[1])
        self.judged = kept  # windows no longer analysed are forgotten
        self._known_peers, self._peers_used = self._peers_used, {}
        ignored = sum(j.ignored for j in judged)
        if ignored:
            self.notes.append(f"{ignored} peer entries named nodes past the first {MAX_NODES}: ignored")
        strangers = sum(j.strangers for j in judged)
        if strangers:
            self.notes.append(f"{strangers} peer entries named nodes the inventory does not list: ignored")
        capped = sum(j.capped for j in judged)
        if capped:
            self.notes.append(f"{capped} peer entries claimed more probes than a probe every "
                              f"{self.probe_interval:g} s can send in a window: each weighed as that many")
        overflowed = sum(j.overflow for j in judged)
        if overflowed:
            self.notes.append(f"more than {MAX_ANOMALOUS_EDGES} lossy or slow edges in {overflowed} windows: the rest "
                              "are not explained away, so nodes next to bad ones may look bad too")
        known_nodes, known_leaves = set(), set()
        for j in judged:
            known_nodes.update(j.known_nodes)
            known_leaves.update(j.known_leaves)
        known_leaves.discard(0)
        self.in_use = len(known_nodes)
        verdicts = _hysteresis(judged, int(self.cfg["open_windows"]), int(self.cfg["close_windows"]))
        return Analysis(verdicts, len(known_nodes), len(known_leaves), len(judged), self.rejected,
                        group.window_seconds if group else 0.0, self.now, self.notes, [j.start for j in judged],
                        self.unknown_probes)

_CHUNK = 1000  # agents added up at once: ~200,000 edges at 8 rails, some 50 MiB of temporary arrays


class _Part:
    """A chunk of agents' folded windows end to end as numpy arrays, one item per edge (and per histogram
    pair): whom it counts for (`counted`: a known peer, not the reporter itself), its counts once capped
    by the probe schedule (`scaled`: the edges scaled down, by index, with their new histograms), and
    whether it stays inside its reporter's leaf."""

    def __init__(self, chunk: list[tuple[int, Folded]], peers: list[Any], per_rail: int, leaf_of: Any,
                 rails_of: Any) -> None:
        lengths = np.array([len(f.names) for _, f in chunk], np.int64)
        self.agent = np.repeat(np.arange(len(chunk)), lengths)
        src = np.repeat(np.array([s for s, _ in chunk], np.int64), lengths)
        dst = _joined(peers)
        self.counted = (dst >= 0) & (dst != src)
        self.src, self.dst = src, np.where(self.counted, dst, src)  # an index everywhere
        sent, lost, retrans, rails, self.top, self.p99 = (_joined(_view(getattr(f, a)) for _, f in chunk)
                                                          for a in ("sent", "lost", "retrans", "rails", "top", "p99"))
        self.flat = _joined(_view(f.flat) for _, f in chunk)
        self.sizes = _joined(np.diff(_view(f.offsets)) for _, f in chunk)  # each edge's histogram, in flat
        self.starts = np.cumsum(self.sizes) - self.sizes
        self.bucket, self.count = self.flat[0::2], self.flat[1::2]
        self.pair_edge = np.repeat(np.arange(len(self.sizes)), self.sizes // 2)
        cap = per_rail * np.minimum(np.minimum(rails, rails_of[src]), rails_of[self.dst])
        self.scaled: dict[int, list[int]] = {}
        for e in np.flatnonzero(self.counted & (sent > per_rail) & (sent > cap)).tolist():
            sent[e], lost[e], retrans[e], self.scaled[e] = robust.scaled(
                int(cap[e]), int(sent[e]), int(lost[e]), int(retrans[e]), self.histogram(e))
        if self.scaled:  # their histograms are the scaled ones
            keep = ~np.isin(self.pair_edge, np.fromiter(self.scaled, np.int64))
            more = np.array([(e, hist[x], hist[x + 1]) for e, hist in self.scaled.items()
                             for x in range(0, len(hist), 2)], np.int64).reshape(-1, 3)
            self.pair_edge = np.concatenate([self.pair_edge[keep], more[:, 0]])
            self.bucket = np.concatenate([self.bucket[keep], more[:, 1]])
            self.count = np.concatenate([self.count[keep], more[:, 2]])
        self.dead = self.counted & (lost == sent)
        self.sent, self.lost, self.retrans = sent, lost + retrans, retrans  # lost: every probe that lost a packet
        same = leaf_of[self.dst] == leaf_of[src]
        self.intra, self.inter = self.counted & same, self.counted & ~same

    def histogram(self, e: int) -> list[int]:
        """Edge e's histogram as it counts: (bucket, count, ...)."""
        if e in self.scaled:
            return self.scaled[e]
        return self.flat[self.starts[e]:self.starts[e] + self.sizes[e]].tolist()


def _distinct(values: Any) -> Any:
    """The distinct values, sorted (np.unique without its hash table, slow on millions of values)."""
    ordered = np.sort(values)
    return ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])] if len(ordered) else ordered


def _sums(index: Any, weights: Any = None, size: int = 0) -> Any:
    """Sums of `weights` (or counts) per index, as int64 (float sums are exact below 2**53)."""
    return np.rint(np.bincount(index, weights, minlength=size)).astype(np.int64)


_DTYPES = {"i": np.int32, "q": np.int64, "b": np.int8}  # array typecodes of Folded's arrays


def _view(values: array) -> Any:
    """One of Folded's arrays as numpy sees it, without a copy."""
    return np.frombuffer(values, _DTYPES[values.typecode])


def _joined(parts: Iterable[Any]) -> Any:
    """The agents' arrays end to end, as int64 (an empty one where there are none)."""
    return np.concatenate([np.zeros(0, np.int64), *parts]).astype(np.int64)


class _Links:
    """The judged leaf pairs between each leaf and each partner leaf added up, both directions, one row
    per (leaf, partner), sorted by leaf: out, bad out, in, bad in, sent, lost, dead in, retransmitted."""

    def __init__(self, n_leaves: int, src: Any, dst: Any, bad: Any, sent: Any, lost: Any, retrans: Any) -> None:
        self.n = n_leaves
        ones, zeros = np.ones(len(src), np.int64), np.zeros(len(src), np.int64)
        self.code, where = np.unique(np.concatenate([src * n_leaves + dst, dst * n_leaves + src]), return_inverse=True)
        where = where.reshape(-1)
        columns = ((ones, zeros), (bad, zeros), (zeros, ones), (zeros, bad), (sent, sent), (lost, lost),
                   (zeros, lost == sent), (retrans, retrans))
        self.total = np.stack([np.rint(np.bincount(where, np.concatenate([a, b]).astype(np.float64),
                                                   minlength=len(self.code))).astype(np.int64)
                               for a, b in columns], axis=1)
        self.leaf, self.partner = self.code // n_leaves, self.code % n_leaves
        self.leaves = np.unique(self.leaf).tolist()
        self.lossy = np.zeros(len(self.code), bool)  # lossy without the liars' edges (set by the judge)

    def rows(self, leaf: int) -> Any:
        return np.arange(np.searchsorted(self.leaf, leaf, "left"), np.searchsorted(self.leaf, leaf, "right"))

    def row(self, leaf: int, partner: int) -> int:
        return int(np.searchsorted(self.code, leaf * self.n + partner))

    def counts(self, leaf: int, partner: int) -> list[int]:
        return self.total[self.row(leaf, partner)].tolist()


def _lower_medians(dists: Any) -> Any:
    """_lower_median of each row of NB1 buckets that has any count, all at once."""
    totals = dists.sum(axis=1)
    rows = dists[totals > 0]
    return np.argmax(np.cumsum(rows, axis=1) >= ((totals[totals > 0] + 1) // 2)[:, None], axis=1)


def _p99_buckets(hists: array) -> list[int]:
    """The p99 bucket of each histogram of NB1 buckets laid end to end (-1 for an empty one), as
    quantile_bucket(stats.quantile(...)) finds it, for all of them at once."""
    h = np.frombuffer(hists, np.int64).reshape(-1, NB1)
    if not len(h):
        return []
    running = np.cumsum(h, axis=1)
    reached = running >= 0.99 * running[:, -1:]
    return np.where(running[:, -1] > 0, np.argmax(reached, axis=1), -1).tolist()


def _int_array(values: Any) -> array:
    """A numpy column as the array("q") the judgement indexes (a Python int per item, not a numpy scalar)."""
    out = array("q")
    out.frombytes(np.ascontiguousarray(values, np.int64).tobytes())
    return out


# -- judging one window ------------------------------------------------------------------------

def _bound(k: int) -> float:
    return BUCKETS_SECONDS[k] if k < NB else math.inf


def _lower_median(dist: Any, base: int = 0) -> int | None:
    """Bucket of the lower median of a distribution over the answered slots dist[base : base + NB1]."""
    total = sum(dist[base:base + NB1])
    if not total:
        return None
    rank, seen = (total + 1) // 2, 0
    for k in range(NB1):
        seen += dist[base + k]
        if seen >= rank:
            return k
    return NB


def _poisson_tail(x: int, lam: float) -> float:
    """P(X >= x) for X ~ Poisson(lam): how likely `x` lost probes are when `lam` are expected."""
    if x <= 0:
        return 1.0
    if lam <= 0 or x > lam + 40 * math.sqrt(lam) + 40:
        return 0.0
    if lam > 200:  # normal approximation, with continuity correction
        return 0.5 * math.erfc((x - 0.5 - lam) / math.sqrt(2 * lam))
    term = cdf = math.exp(-lam)
    for k in range(1, x):
        term *= lam / k
        cdf += term
    return max(0.0, 1.0 - cdf)


def _recovered(lost: int, retrans: int, lead: str = ",") -> str:
    """How many of `lost` probes TCP recovered by sending the SYN again: loss all the same."""
    if not retrans:
        return ""
    return f"{lead} {retrans} of them answered only after a retransmitted SYN" if retrans < lost else \
        f"{lead} each answered only after a retransmitted SYN"


def _pct(x: float) -> str:
    return f"{100 * x:.2g}%" if x < 0.1 else f"{100 * x:.0f}%"


def _ms(seconds: float) -> str:
    return "over 5 s" if math.isinf(seconds) else f"{1000 * seconds:g} ms"


def _confidence(reporters: int) -> float:
    """R-Pingmesh's: more independent reporters, more confidence."""
    return round(1 - 1 / (1 + reporters), 3)


class _Judge:
    """The verdicts of one window, before hysteresis: subject -> (kind, element, message, evidence)."""

    def __init__(self, mesh: _Mesh, win: _Window) -> None:
        self.m, self.w, self.cfg = mesh, win, mesh.cfg
        self.liars = int(mesh.cfg["tolerated_liars"])
        self._doubted: dict[int, dict[str, Any]] = {}
        self.start = win.start
        self.bad: dict[tuple[str, int], tuple[str, str, str, dict[str, Any]]] = {}
        self.known_nodes: set[int] = set()
        self.known_leaves: set[int] = set()
        self.judged_pairs: set[int] = set()  # leaf pair keys with enough probes to judge
        self.ignored, self.overflow, self.strangers, self.capped = win.ignored, win.overflow, win.strangers, win.capped

    def run(self) -> _Judge:
        win, col = self.w, self.w.col
        n = min(win.n, len(self.m.names))
        reported, in_edges = col["reported"], col["in_edges"]
        self.known_nodes = {i for i in range(n) if reported[i] or in_edges[i]}
        self.known_leaves = {self.m.leaf_of[i] for i in self.known_nodes}
        suspects = self._node_suspects(n)
        bad_leaves = self._leaves_inside(suspects)
        for i, ev in self._doubted.items():
            self._doubted_verdict(i, ev)
        explained = [i for i in suspects if self.m.leaf_of[i] not in bad_leaves]
        self._between_leaves(bad_leaves, explained)
        # Free the window's bulk: only the judgement is needed from here on.
        win.col, win.p99, win.lp_hist, win.anomalous, win.by_node = {}, array("q"), array("q"), [], {}
        del self.w  # an Analyzer keeps the judgement, not the window's counters
        return self

    # step 1 ----------------------------------------------------------------------------------
    def _node_suspects(self, n: int) -> dict[int, dict[str, Any]]:
        cfg, col, win = self.cfg, self.w.col, self.w
        min_probes, min_bad = int(cfg["min_probes"]), int(cfg["min_bad_probes"])
        node_loss = float(cfg["node_loss_fraction"])
        i_sent, i_lost = col["intra_sent"], col["intra_lost"]
        # The background: the median node's loss (most nodes are fine). Loss it explains is noise,
        # however many probes are lost; with the usual background near 0 the thresholds decide.
        rates = sorted(i_lost[i] / i_sent[i] for i in range(n) if i_sent[i] >= min_probes)
        background = rates[(len(rates) - 1) // 2] if rates else 0.0
        alpha = float(cfg["significance"])
        done: set[int] = set()  # lossy edges of the suspects taken so far, taken off their leaf-mates

        def judged_loss(i: int) -> tuple[float, int, int] | None:
            """Node i's loss with its leaf-mates (loss, lost, witnesses) when it is lossy without the
            `tolerated_liars` reporters that add most to it, else None: no such few can make it lossy."""
            if i_lost[i] < min_bad:
                return None
            witnesses = self._loss_witnesses(i, done)
            lost, sent = robust.trimmed(i_lost[i], witnesses, self.liars), i_sent[i]
            if not (sent >= min_probes and lost >= min_bad and lost >= node_loss * sent
                    and _poisson_tail(lost, background * sent) < alpha):
                return None
            return lost / sent, lost, len({w[0] for w in witnesses})

        def elsewhere(i: int) -> float:
            """Node i's loss with other leaves: of two leaf-mates that lose as much with each other (a leaf
            of two), the one that loses with other leaves too is taken first."""
            return col["inter_lost"][i] / col["inter_sent"][i] if col["inter_sent"][i] else 0.0

        suspects: dict[int, dict[str, Any]] = {}
        heap = []
        for i in range(n):
            found = judged_loss(i)
            if found:
                heap.append((-found[0], -elsewhere(i), i))
        heapq.heapify(heap)
        while heap:
            neg, _, i = heapq.heappop(heap)
            found = judged_loss(i)
            if found is None:
                continue
            if found[0] != -neg:  # its leaf-mates' suspects were taken off since: judge it again in its place
                heapq.heappush(heap, (-found[0], -elsewhere(i), i))
                continue
            loss = i_lost[i] / i_sent[i]
            suspects[i] = {"loss": round(loss, 4), "lost": i_lost[i], "sent": i_sent[i],
                           "retransmitted": col["intra_retrans"][i], "witnesses": found[2]}
            for eid in win.by_node.get(i, ()):
                src, dst, sent, lost, _, slot = win.anomalous[eid]
                if slot >= 0 or eid in done:
                    continue
                done.add(eid)
                other = dst if src == i else src
                i_sent[other] -= sent
                i_lost[other] -= lost
        # Latency: the median of a node's intra-leaf edges, so that one slow node does not make its
        # leaf-mates slow (each has only one edge with it).
        base = _lower_median(win.cluster)
        if base is not None:
            limit = max(float(cfg["p99_factor"]) * _bound(base), float(cfg["p99_floor_seconds"]))
            min_edges = int(cfg["min_reporters"])
            for i in range(n):
                k = _lower_median(win.p99, i * NB2)
                if k is None or _bound(k) <= limit:
                    continue
                dist = win.p99[i * NB2:i * NB2 + NB1]
                slow = sum(c for j, c in enumerate(dist) if _bound(j) > limit)
                if sum(dist) >= min_edges and slow >= min_bad:
                    suspects.setdefault(i, {}).update(p99_seconds=_bound(k), baseline_p99_seconds=_bound(base),
                                                      slow_edges=slow)
        # Unreachable: (almost) every prober got no answer at all, whether or not its agent reports.
        frac = float(cfg["node_bad_peer_fraction"])
        in_sent, in_lost, in_edges, in_dead = col["in_sent"], col["in_lost"], col["in_edges"], col["in_dead"]
        liars = self.liars
        for i in range(n):  # as many probers as may lie are left out first: they cannot make it unreachable
            if (in_dead[i] > liars and in_sent[i] >= min_probes and in_lost[i] >= min_bad
                    and in_dead[i] - liars >= frac * (in_edges[i] - liars)):
                suspects.setdefault(i, {}).update({"unreachable_from": in_dead[i], "probers": in_edges[i]})
        self._doubted = self._doubted_reporters(n, suspects, done, background)
        return suspects

    def _loss_witnesses(self, i: int, done: set[int]) -> list[tuple[int, int, int, int]]:
        """Node i's lossy edges inside its leaf still counted, as _trimmed takes them: (reporter, i, sent,
        lost); i's own agent is one reporter too."""
        anomalous = self.w.anomalous
        return [(src, i, sent, lost) for src, _, sent, lost, _, slot in (anomalous[eid] for eid in
                                                                        self.w.by_node.get(i, ()) if eid not in done)
                if lost and slot < 0]

    def _doubted_reporters(self, n: int, suspects: dict[int, dict[str, Any]], done: set[int],
                           background: float) -> dict[int, dict[str, Any]]:
        """Reporters whose loss with leaf-mates none of those leaf-mates sees: each says it lost probes
        to peers whose own reports on it lost none. Its agent (or its view of the kernel) is not to be
        believed; where it is the only one to see a loss, the loss is its own, never the peers'."""
        cfg, col, win = self.cfg, self.w.col, self.w
        min_bad, node_loss, alpha = int(cfg["min_bad_probes"]), float(cfg["node_loss_fraction"]), \
            float(cfg["significance"])
        reported, own_sent = col["reported"], col["own_sent"]
        lossy_pairs = {(src, dst) for src, dst, _, lost, _, slot in win.anomalous if lost and slot < 0}
        doubted = {}
        for i in range(n):
            if not reported[i] or i in suspects:
                continue
            lost, peers = 0, 0
            for eid in win.by_node.get(i, ()):
                src, dst, _, n_lost, _, slot = win.anomalous[eid]
                if (src == i and n_lost and slot < 0 and eid not in done and dst not in suspects and reported[dst]
                        and (dst, i) not in lossy_pairs):  # the peer probed it too, and lost nothing
                    lost += n_lost
                    peers += 1
            sent = own_sent[i]
            if (peers and lost >= min_bad and lost >= node_loss * sent
                    and _poisson_tail(lost, background * sent) < alpha):
                doubted[i] = {"lost": lost, "sent": sent, "peers": peers}
        return doubted

    def _leaves_inside(self, suspects: dict[int, dict[str, Any]]) -> set[int]:
        """Leaves most of whose nodes are suspect; the other suspects become node or inconclusive."""
        m, cfg = self.m, self.cfg
        frac, min_rep = float(cfg["leaf_fraction"]), int(cfg["min_reporters"])
        members: dict[int, list[int]] = {}
        for i in self.known_nodes:
            members.setdefault(m.leaf_of[i], []).append(i)
        bad_leaves = set()
        for leaf, nodes in members.items():
            bad = sorted(i for i in nodes if i in suspects)
            if not bad:
                continue
            # Nothing is blamed on leaf 0, a guess: its nodes are judged one by one.
            if leaf and len(nodes) > min_rep and len(bad) >= frac * len(nodes):
                bad_leaves.add(leaf)
                self._leaf_inside(leaf, nodes, bad, suspects)
                continue
            healthy = [i for i in nodes if i not in suspects]
            for i in bad:
                self._node_verdict(i, suspects[i], len(healthy))
        return bad_leaves

    def _leaf_inside(self, leaf: int, nodes: list[int], bad: list[int], suspects: dict[int, dict[str, Any]]) -> None:
        m, col = self.m, self.w.col
        name = m.leaves[leaf]
        reporting = sum(1 for i in nodes if col["reported"][i])
        unreachable = sum(1 for i in bad if "unreachable_from" in suspects[i])
        lossy = sum(1 for i in bad if "loss" in suspects[i])
        reports = sum(col["in_edges"][i] for i in bad)  # agents' reports on its bad nodes
        evidence = {"bad_nodes": len(bad), "nodes": len(nodes), "reporting": reporting, "reports": reports,
                    "examples": sorted(m.names[i] for i in bad)[:5]}
        if unreachable >= len(bad) / 2 and not reporting:
            message = (f"Leaf {name} is cut off: {unreachable} of its {len(nodes)} nodes answer no prober and "
                       "none of its agents reports.")
        elif unreachable >= len(bad) / 2:
            message = f"Leaf {name}: {unreachable} of its {len(nodes)} nodes answer (almost) no prober."
        elif lossy:
            sent = sum(col["intra_sent"][i] for i in nodes)
            lost = sum(col["intra_lost"][i] for i in nodes)
            evidence["loss"] = round(lost / sent, 4) if sent else None
            message = (f"Leaf {name} loses probes inside: {len(bad)} of its {len(nodes)} nodes lose "
                       f"{_pct(lost / sent) if sent else 'probes'} with their leaf-mates.")
        else:
            message = f"Leaf {name} is slow inside: {len(bad)} of its {len(nodes)} nodes are over the p99 baseline."
        evidence["confidence"] = _confidence(reporting + reports)
        self.bad[("leaf", leaf)] = ("leaf", name, message, evidence)

    def _node_verdict(self, i: int, ev: dict[str, Any], healthy: int) -> None:
        m, col, cfg = self.m, self.w.col, self.cfg
        name, leaf = m.names[i], m.leaves[m.leaf_of[i]]
        reporters = col["in_edges"][i] + col["reported"][i]
        evidence = dict(ev, lossy_edges=col["intra_lossy"][i], edges=col["intra_edges"][i], reporters=reporters,
                        healthy_leaf_mates=healthy, confidence=_confidence(reporters))
        if col["inter_sent"][i]:
            evidence["loss_other_leaves"] = round(col["inter_lost"][i] / col["inter_sent"][i], 4)
        where = f"leaf {leaf}" if leaf else "its peers without a leaf"
        if "unreachable_from" in ev:
            what = (f"answers none of the probes from {ev['unreachable_from']} of its {ev['probers']} probers"
                    + ("" if col["reported"][i] else " and its agent reports nothing"))
        elif "loss" in ev:
            what = (f"loses {_pct(ev['loss'])} of its probes with its leaf-mates ({ev['lost']} of {ev['sent']}"
                    f"{_recovered(ev['lost'], ev['retransmitted'], ';')}; seen by {ev['witnesses']} agents)")
        else:
            what = ""
        if "p99_seconds" in ev:
            slow = (f"has a median p99 of {_ms(ev['p99_seconds'])} to its leaf-mates, over "
                    f"{cfg['p99_factor']:g}x the intra-leaf baseline of {_ms(ev['baseline_p99_seconds'])}")
            what = f"{what}, and {slow}" if what else slow
        min_rep = int(cfg["min_reporters"])
        if healthy >= min_rep and reporters >= min_rep:
            self.bad[("node", i)] = ("node", name, f"Node {name} {what}, while its {healthy} healthy "
                                     f"leaf-mates in {where} are fine.", evidence)
        else:
            why = (f"only {reporters} agent{' reports' if reporters == 1 else 's report'} on it" if reporters < min_rep
                   else f"only {healthy} healthy leaf-mate{'s' if healthy != 1 else ''} to compare with")
            element = f"{name}|{leaf}" if leaf and len(name) + len(leaf) < 253 else name
            self.bad[("node", i)] = ("inconclusive", element,
                                     f"Node {name} {what}, but {why}: the node cannot be told from "
                                     f"{'its leaf' if leaf else 'its peers'}.", evidence)

    def _doubted_verdict(self, i: int, ev: dict[str, Any]) -> None:
        m = self.m
        name, leaf = m.names[i], m.leaves[m.leaf_of[i]]
        element = f"{name}|{leaf}" if leaf and len(name) + len(leaf) < 253 else name
        message = (f"The agent on {name} reports {ev['lost']} of its {ev['sent']} probes with {ev['peers']} leaf-mates "
                   f"lost, while their own probes of {name} lost none: its reports are not believed (its agent, or "
                   "its view of its own probes, is wrong), and nothing is blamed on those leaf-mates.")
        self.bad[("reporter", i)] = ("inconclusive", element, message, dict(ev, doubted_reporter=True))

    # step 2 ----------------------------------------------------------------------------------
    def _between_leaves(self, bad_leaves: set[int], explained: list[int]) -> None:
        """Step 2 over all leaf pairs at once (numpy; ~100,000 pairs at 313 leaves): a Python step only for
        the pairs with listed edges, the bad pairs and the leaves judged."""
        cfg, win, liars = self.cfg, self.w, self.liars
        lp_sent, lp_lost, lp_hist, lp_retrans = win.lp_sent, win.lp_lost, win.lp_hist, win.lp_retrans
        done = set()
        for i in explained:  # take the suspects' lossy and slow edges off the leaf pairs they pass
            for eid in win.by_node.get(i, ()):
                _, _, sent, lost, flat, slot = win.anomalous[eid]
                if slot < 0 or eid in done:
                    continue
                done.add(eid)
                lp_sent[slot] -= sent
                lp_lost[slot] -= lost
                for k in range(0, len(flat), 2):
                    lp_hist[slot * NB1 + flat[k]] -= flat[k + 1]
        edges_of: dict[int, list[tuple[int, int, int, int, tuple[int, ...]]]] = {}  # slot -> its lossy or slow edges
        for eid, (src, dst, sent, lost, flat, slot) in enumerate(win.anomalous):
            if slot >= 0 and eid not in done:
                edges_of.setdefault(slot, []).append((src, dst, sent, lost, flat))
        # Each leaf pair is judged without the `liars` reporters that add most lost and slow probes to it;
        # a pair without listed edges has its loss from one unknown reporter (robust.trimmed): kept only
        # where no liar is tolerated.
        min_probes, min_bad, slow_bucket = int(cfg["min_probes"]), int(cfg["min_bad_probes"]), self.m.slow
        sent_of, lost_of = np.frombuffer(lp_sent, np.int64), np.frombuffer(lp_lost, np.int64)
        retrans_of = np.frombuffer(lp_retrans, np.int64)
        keys = np.array(win.lp_key, np.int64)
        src_of, dst_of = keys // _LEAF_KEY, keys % _LEAF_KEY
        judged = sent_of >= min_probes
        lost_kept = lost_of.copy() if liars == 0 else np.zeros(len(keys), np.int64)
        p99 = np.array(_p99_buckets(lp_hist), np.int64)  # -1: no answered probe
        hists = np.frombuffer(lp_hist, np.int64).reshape(-1, NB1).copy()  # trimmed below where edges are listed
        for slot in (s for s in edges_of if judged[s]):
            edges = edges_of[slot]
            lost_kept[slot] = robust.trimmed(lp_lost[slot], [(e[0], e[1], e[2], e[3]) for e in edges], liars)
            hists[slot] = robust.slow_trimmed(hists[slot].tolist(), edges, slow_bucket, liars)
            counts = {k: c for k, c in enumerate(hists[slot].tolist()) if c}
            p99[slot] = quantile_bucket(quantile(counts, 0.99)) if counts else -1
        # The baseline: the typical leaf's typical pair. A fault at one leaf touches most pairs where
        # leaves are few (4 of the 6 with 3 leaves), never most of another leaf's.
        n_leaves = len(self.m.leaves)
        timed = judged & (p99 >= 0)
        per_leaf = np.bincount(np.concatenate([src_of[timed], dst_of[timed]]) * NB1
                               + np.concatenate([p99[timed], p99[timed]]), minlength=n_leaves * NB1)
        medians = np.bincount(_lower_medians(per_leaf.reshape(n_leaves, NB1)), minlength=NB1).tolist()
        base = _lower_median(medians)
        limit = max(float(cfg["p99_factor"]) * _bound(base), float(cfg["p99_floor_seconds"])) \
            if base is not None else math.inf
        over = next((j for j in range(NB1) if _bound(j) > limit), NB1)  # the first bucket over the limit
        slow = hists[:, over:].sum(axis=1)
        loss_fraction = float(cfg["loss_fraction"])
        lossy = judged & (lost_kept > 0) & (lost_kept >= min_bad) & (lost_kept >= loss_fraction * sent_of)
        too_slow = judged & (p99 >= over) & (slow >= min_bad)
        self.judged_pairs.update(keys[judged].tolist())
        bad_pairs: dict[int, dict[str, Any]] = {}
        for slot in np.flatnonzero(lossy | too_slow).tolist():
            ev: dict[str, Any] = {}
            if lossy[slot]:
                ev.update(loss=round(lp_lost[slot] / lp_sent[slot], 4), lost=lp_lost[slot], sent=lp_sent[slot],
                          retransmitted=lp_retrans[slot])
            if too_slow[slot]:
                ev.update(p99_seconds=_bound(int(p99[slot])), baseline_p99_seconds=_bound(base))
            ev["reporters"] = win.lp_reporters[slot]
            bad_pairs[slot] = ev
        # Leaves, worst first: R-Pingmesh's outFrac / inFrac of bad edges, or a loss over the SLA pooled
        # over all of a leaf's edges and spread over most of its partner leaves (one leaf edge sees a
        # few dozen probes a window, too few to judge a few percent of loss edge by edge; one bad path
        # is not spread). The pooled loss must stand without the `liars` reporters and the one node of
        # the leaf that add most to it: a liar, or one faulty node, is not its leaf. A leaf found is
        # taken off its partners' counts: they are not blamed for it.
        frac, min_rep = float(cfg["leaf_fraction"]), int(cfg["min_reporters"])
        was_bad = np.zeros(n_leaves, bool)
        was_bad[list(bad_leaves)] = True
        bad = np.zeros(len(keys), bool)
        bad[list(bad_pairs)] = True
        pairs = np.flatnonzero(judged & ~was_bad[src_of] & ~was_bad[dst_of])
        links = _Links(n_leaves, src_of[pairs], dst_of[pairs], bad[pairs], sent_of[pairs], lost_of[pairs],
                       retrans_of[pairs])
        witnesses: dict[int, dict[int, list[tuple[int, int, int, int]]]] = {}  # leaf -> partner -> lossy edges
        slowest: dict[int, float] = {}
        for slot in pairs.tolist():
            if slot not in edges_of and slot not in bad_pairs:
                continue
            src, dst = int(src_of[slot]), int(dst_of[slot])
            for reporter, target, sent, lost, _ in edges_of.get(slot, ()):
                if lost:  # (reporter, the end in that leaf, sent, lost)
                    witnesses.setdefault(src, {}).setdefault(dst, []).append((reporter, reporter, sent, lost))
                    witnesses.setdefault(dst, {}).setdefault(src, []).append((reporter, target, sent, lost))
            if slot in bad_pairs and "p99_seconds" in bad_pairs[slot]:
                for leaf in (src, dst):
                    slowest[leaf] = max(slowest.get(leaf, 0.0), bad_pairs[slot]["p99_seconds"])
        self.known_leaves.update(links.leaves)
        for leaf, by in witnesses.items():
            for partner, edges in by.items():
                if robust.trimmed(links.counts(leaf, partner)[5], edges, liars) > 0:
                    links.lossy[links.row(leaf, partner)] = True

        def fault(leaf: int) -> tuple[float, float, list[int], int, int] | None:
            rows = links.rows(leaf)
            kept = rows[~was_bad[links.partner[rows]]]
            total = links.total[kept].sum(axis=0).tolist() if len(kept) else [0] * 8
            lossy_rows = kept[links.total[kept, 5] > 0]
            lossy, partners = int(links.lossy[lossy_rows].sum()), len(kept)
            mine = witnesses.get(leaf, {})
            edges = [e for partner in links.partner[lossy_rows].tolist() for e in mine.get(partner, ())]
            o, ob, n_in, ib, sent, lost = total[:6]
            worst = max(ob / o if o >= min_rep else 0.0, ib / n_in if n_in >= min_rep else 0.0)
            kept_lost = robust.trimmed(lost, edges, liars, 1)
            spread = (kept_lost >= min_bad and partners >= min_rep and lossy >= frac * partners
                      and kept_lost >= loss_fraction * sent)
            loss = lost / sent if sent else 0.0
            return (worst, loss, total, lossy, partners) if (worst and worst >= frac) or spread else None

        heap = []
        for leaf in links.leaves:
            found = fault(leaf) if leaf else None
            if found:
                heap.append((-found[0], -found[1], leaf))
        heapq.heapify(heap)
        while heap:
            neg_worst, neg_loss, leaf = heapq.heappop(heap)
            found = None if leaf in bad_leaves else fault(leaf)
            if found is None:
                continue
            if (-found[0], -found[1]) != (neg_worst, neg_loss):
                heapq.heappush(heap, (-found[0], -found[1], leaf))
                continue
            bad_leaves.add(leaf)
            was_bad[leaf] = True
            self._leaf_uplink(leaf, found, slowest.get(leaf))
            for partner in links.partner[links.rows(leaf)].tolist():  # their counts changed: judge them again
                again = fault(partner) if partner and partner not in bad_leaves else None
                if again:
                    heapq.heappush(heap, (-again[0], -again[1], partner))
        # Paths: a bad edge between two leaves that are fine inside and with other leaves.
        good = judged & ~bad & ~was_bad[src_of] & ~was_bad[dst_of]
        good_out = np.bincount(np.concatenate([src_of[good], dst_of[good]]), minlength=n_leaves)
        for slot, ev in sorted(bad_pairs.items()):
            src, dst = int(src_of[slot]), int(dst_of[slot])
            if src in bad_leaves or dst in bad_leaves or src == 0 or dst == 0:
                continue
            self._path(src, dst, ev, int(good_out[src]), int(good_out[dst]))

    def _leaf_uplink(self, leaf: int, found: tuple[float, float, list[int], int, int], slowest: float | None) -> None:
        name = self.m.leaves[leaf]
        _, loss, (o, ob, n_in, ib, _, lost, dead_in, retrans), lossy, partners = found
        evidence: dict[str, Any] = {"bad_out": ob, "out": o, "bad_in": ib, "in": n_in, "loss": round(loss, 4),
                                    "retransmitted": retrans, "lossy_partners": lossy, "partners": partners,
                                    "confidence": _confidence(partners)}
        if slowest:
            evidence["p99_seconds"] = slowest
        if n_in and dead_in == n_in and not o:
            message = (f"Leaf {name} is cut off: no probe into it from {n_in} other leaves was answered, "
                       "and none of its agents reports probes to other leaves.")
        else:
            what = (f"loses {_pct(loss)} of its probes with other leaves{_recovered(lost, retrans)}, with {lossy} "
                    f"of {partners} leaves" if lost else "is slow to other leaves")
            message = (f"Leaf {name} {what}: bad edges to {ob} of {o} leaves and from {ib} of {n_in} "
                       "(its uplinks or the leaf switch).")
        self.bad[("leaf", leaf)] = ("leaf", name, message, evidence)

    def _path(self, src: int, dst: int, ev: dict[str, Any], good_src: int, good_dst: int) -> None:
        m, min_rep = self.m, int(self.cfg["min_reporters"])
        a, b = m.leaves[src], m.leaves[dst]
        element = f"{a}->{b}"
        what = []
        if "loss" in ev:
            what.append(f"loses {_pct(ev['loss'])} of its probes ({ev['lost']} of {ev['sent']}"
                        f"{_recovered(ev['lost'], ev['retransmitted'], ';')})")
        if "p99_seconds" in ev:
            what.append(f"has a p99 of {_ms(ev['p99_seconds'])} (baseline {_ms(ev['baseline_p99_seconds'])})")
        evidence = dict(ev, good_edges_src=good_src, good_edges_dst=good_dst,
                        confidence=_confidence(ev["reporters"]))
        if ev["reporters"] >= min_rep and good_src and good_dst:
            kind = "path"
            message = f"Path {element} {' and '.join(what)}, while both leaves are fine inside and with other leaves."
        else:
            kind = "inconclusive"
            why = (f"only {ev['reporters']} agent reports on it" if ev["reporters"] < min_rep
                   else "a leaf at its ends has no other good edge to compare with")
            message = f"Path {element} {' and '.join(what)}, but {why}: the path cannot be told from its leaves."
        self.bad[("path", src * _LEAF_KEY + dst)] = (kind, element, message, evidence)


def _hysteresis(judged: list[_Judge], open_after: int, close_after: int) -> list[Verdict]:
    """Verdicts open after `open_after` consecutive bad windows and close after `close_after` good
    ones; a window without data about the element does neither. The kind, message and evidence are
    the last bad window's (a node may be inconclusive in one window and separable in the next)."""
    open_after, close_after = max(1, open_after), max(1, close_after)
    subjects = sorted({subject for j in judged for subject in j.bad})
    verdicts = []
    for subject in subjects:
        is_open, streak, good, since, first, count, last = False, 0, 0, 0.0, 0.0, 0, None
        for j in judged:
            found = j.bad.get(subject)
            if found is not None:
                good, last = 0, found
                if is_open:
                    count += 1
                    continue
                if streak == 0:
                    first = j.start
                streak += 1
                if streak >= open_after:
                    is_open, since, count = True, first, streak
            elif _knows(j, subject):
                streak = 0
                if is_open:
                    good += 1
                    if good >= close_after:
                        is_open = False
        if is_open and last is not None:
            kind, element, message, evidence = last
            # JSON has no infinity: a p99 past the last bucket is null in the evidence ("over 5 s" in words).
            evidence = {k: None if isinstance(v, float) and math.isinf(v) else v for k, v in evidence.items()}
            verdicts.append(Verdict(kind, element, since, count, message, evidence))
    verdicts.sort(key=lambda v: (KINDS.index(v.kind), v.element))
    return verdicts


def _knows(j: _Judge, subject: tuple[str, int]) -> bool:
    kind, key = subject
    if kind in ("node", "reporter"):
        return key in j.known_nodes
    if kind == "leaf":
        return key in j.known_leaves
    return key in j.judged_pairs
