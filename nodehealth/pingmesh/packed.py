"""The packed form of a summary: what the controller asks agents for (`/v1/pingmesh?format=packed1`).

The JSON summary lists every peer entry (peer, rail, probe kind) with its histogram as pairs; at
10,000 nodes x 8 rails a controller decodes 8 million of them a window, three quarters of its time.
The packed form carries each window as the analysis adds it up (folded.Folded: one edge per peer
node, TCP over all rails, Pings only where a peer has no TCP), folded by the agent with the same
code, as little-endian arrays that the controller takes with array.frombytes: no Python object per
edge. JSON stays the form for people and for `pingmesh analyze`.

Layout: b"NHPK", the header's length (u32), the header (JSON: the summary's fields, the peer
names, their leaves, and per window its start, closed, and for a window sent in full its counts),
then per full window its arrays, in the order of ARRAYS. A summary is its agent's word and is
untrusted: loads() refuses more than stats.MAX_SUMMARY_BYTES, windows, names and edges past the
JSON form's caps, and any edge whose counts do not add up (lost and retransmitted within sent, the
histogram's probes exactly the answered ones, buckets in range): each edge then weighs what the
probe schedule allows, as a JSON edge does. An edge's top must be its histogram's slowest bucket (it
decides which edges the analysis lists, and only listed edges are trimmed of a liar's probes); its
p99 bucket is the agent's word, checked for range: it feeds medians a lying histogram moves as much.
"""
from __future__ import annotations

import functools
import itertools
import json
import sys
import threading
from array import array
from typing import Any, NamedTuple

from nodehealth.pingmesh import folded, stats

FORMAT = 1
QUERY = f"format=packed{FORMAT}"  # what a controller asks for; an agent that knows no such form ignores it
CONTENT_TYPE = f"application/vnd.nodehealth.pingmesh-packed{FORMAT}"
MAGIC = b"NHPK"
# Each full window's arrays, in order: (Folded attribute, typecode); "idx" is each edge's peer in `names`.
ARRAYS = (("idx", "i"), ("sent", "i"), ("lost", "i"), ("retrans", "i"), ("offsets", "i"), ("flat", "i"),
          ("rails", "b"), ("top", "b"), ("p99", "b"))
# Answers whose arrays check_each() takes at once where they come one by one (the controller's fetchers,
# `pingmesh analyze`): a check is a numpy call of a few us whatever its size, ~45 of them, so an answer
# alone costs ~130 us to check (reading it, ~65 us), 64 together ~12 us each (benchmarks/RESULTS.md).
CHECK_TOGETHER = 64
_BIG_ENDIAN = sys.byteorder == "big"
assert all(array(code).itemsize == size for code, size in (("i", 4), ("b", 1)))


def dumps(summary: stats.Summary) -> bytes:
    """An agent's summary (windows with their peers, or by their start alone) in the packed form."""
    names: dict[str, int] = {}
    leaves: dict[str, int] = {}
    leaf_of: list[int] = []
    windows: list[dict[str, Any]] = []
    body: list[bytes] = []
    for w in summary.windows:
        if w.peers is None:
            windows.append({"start": w.start, "closed": w.closed})
            continue
        f = folded.Folded(w.peers)
        for name, leaf in zip(f.names, f.leaves):
            if name not in names:
                names[name] = len(names)
                leaf_of.append(leaves.setdefault(leaf, len(leaves)))
        columns = {"idx": [names[n] for n in f.names], "offsets": f.offsets, "flat": f.flat, "sent": f.sent,
                   "lost": f.lost, "retrans": f.retrans, "rails": f.rails, "top": f.top, "p99": f.p99}
        for attr, code in ARRAYS:
            a = array(code, columns[attr])
            if _BIG_ENDIAN:
                a.byteswap()
            body.append(a.tobytes())
        windows.append({"start": w.start, "closed": w.closed, "edges": len(f.names), "flat": len(f.flat),
                        "entries": len(w.peers), "skipped": w.skipped,
                        "max_sent": max((p.sent for p in w.peers), default=0)})
    header = {"format": FORMAT, "schema_version": stats.SCHEMA_VERSION, "node": summary.node, "leaf": summary.leaf,
              "pod": summary.pod, "time": summary.time, "window_seconds": summary.window_seconds,
              "buckets_seconds": list(summary.buckets), "names": list(names), "leaves": list(leaves),
              "leaf_of": leaf_of, "windows": windows}
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([MAGIC, len(head).to_bytes(4, "little"), head, *body])


def loads(data: bytes, stubs: bool = False) -> stats.Summary:
    """A packed summary, validated; its full windows come made ready (stats.Window.ready). With `stubs`,
    a window may come by its start alone (an answer to `?since=`). Raises stats.SummaryError."""
    summary, arrays = parse(data, stubs)
    check(arrays)
    return summary


def loads_each(answers: list[bytes], stubs: bool = False) -> list[stats.Summary | stats.SummaryError]:
    """loads() of each answer, their arrays checked together (check_each): a summary, or the reason it
    was refused."""
    out: list[stats.Summary | stats.SummaryError] = []
    parsed = []
    for data in answers:
        try:
            summary, arrays = parse(data, stubs)
        except stats.SummaryError as e:
            out.append(e)
            continue
        out.append(summary)
        parsed.append((len(out) - 1, arrays))
    for (k, _), error in zip(parsed, check_each([arrays for _, arrays in parsed])):
        if error is not None:
            out[k] = error
    return out


def parse(data: bytes, stubs: bool = False) -> tuple[stats.Summary, list[Arrays]]:
    """loads() without check(): the summary read, its structure checked and its full windows made ready,
    and their arrays as they came. Their numbers are the agent's word until check() passes on them, which
    the controller does for many answers at once (check_each). Raises stats.SummaryError."""
    if len(data) > stats.MAX_SUMMARY_BYTES:
        raise stats.SummaryError(f"summary of {len(data)} bytes, more than {stats.MAX_SUMMARY_BYTES}")
    if data[:4] != MAGIC or len(data) < 8:
        raise stats.SummaryError("not a packed summary")
    end = 8 + int.from_bytes(data[4:8], "little")
    if end > len(data):
        raise stats.SummaryError("the header runs past the end")
    try:
        head = json.loads(data[8:end])
    except (ValueError, RecursionError) as e:
        raise stats.SummaryError(f"the header is not JSON: {e}") from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise stats.SummaryError(f"not a packed summary of format {FORMAT}")
    windows = head.get("windows")
    if not isinstance(windows, list) or len(windows) > stats.MAX_WINDOWS:
        raise stats.SummaryError(f"windows must be a list of at most {stats.MAX_WINDOWS}")
    # The summary's own fields, checked as in the JSON form (its windows are checked below).
    s = stats.parse_summary(dict(head, windows=[]))
    lists, windows_at = data.find(b'"names":', 8, end), data.find(b',"windows":', 8, end)
    names, leaves = _names(s.node, data[lists:windows_at] if 0 <= lists < windows_at else None, head)
    view = memoryview(data)[end:]
    arrays: list[Arrays] = []
    for w in windows:
        if not isinstance(w, dict):
            raise stats.SummaryError("a window must be an object")
        start, closed = stats.number(w.get("start"), "window start"), w.get("closed") is True
        if "edges" not in w:
            if not stubs:
                raise stats.SummaryError(f"window {start:.3f} came without its edges")
            s.windows.append(stats.Window(start, closed, None))
            continue
        ready, view = _window(w, start, closed, view, names, leaves, len(s.buckets), arrays)
        s.windows.append(stats.Window(start, closed, None, ready.skipped, ready))
    if len(view):
        raise stats.SummaryError(f"{len(view)} bytes past the last window")
    return s, arrays


class _CheckedNames:
    """Each agent's names lists as it last sent them and checked, by its node: the header's bytes that
    hold them, and the check's result in interned strings. An agent sends the same lists window after
    window: comparing their bytes with the last ones (one memcmp) costs a fraction of comparing the
    decoded lists (a string at a time, 8 us) or of checking them again (a fifth of a steady cycle's
    decoding). Whatever the bytes, what comes out was checked for this node. A node whose lists changed,
    or that another agent claims to be, is checked again. Bounded by the names it holds (10,000 agents'
    lists fit, ~50 MiB), then emptied; shared by the fetchers' threads."""

    MAX_NAMES = 8_000_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lists: dict[str, tuple[bytes | None, tuple[tuple[str, ...], tuple[str, ...]]]] = {}
        self._names = 0

    def get(self, node: str, sent: bytes | None, head: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The checked (names, their leaves) of `head`; `sent` is the header's bytes from "names" to
        "windows" as dumps() writes them (None where they are not found: checked every time)."""
        with self._lock:
            last = self._lists.get(node)
        if last is not None and sent is not None and last[0] == sent:
            return last[1]
        checked = _checked_names(head.get("names"), head.get("leaves"), head.get("leaf_of"))
        size = 2 * len(checked[0])
        with self._lock:
            if self._names + size > self.MAX_NAMES:
                self._lists.clear()
                self._names = 0
            old = self._lists.get(node)
            if old is not None:
                self._names -= 2 * len(old[1][0])
            self._lists[node] = (sent, checked)
            self._names += size
        return checked


_names = _CheckedNames().get


def _checked_names(names: Any, leaves: Any, leaf_of: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The peer names and each one's leaf (what its reporter says), interned: one string per name. Checked
    a list at a time: a Python step per name would be a good part of a steady cycle's decoding."""
    if not (isinstance(names, list) and isinstance(leaves, list) and isinstance(leaf_of, list)
            and len(names) == len(leaf_of) and len(names) <= stats.MAX_WINDOWS * stats.MAX_PEERS_PER_WINDOW
            and len(leaves) <= len(names) + 1):
        raise stats.SummaryError("names, leaves and leaf_of must be lists, leaf_of as long as names")
    try:
        "".join(names), "".join(leaves)  # a TypeError where one is not a string
        where = array("H", leaf_of)  # a TypeError or OverflowError where one is no index
    except (TypeError, OverflowError):
        raise stats.SummaryError("names and leaves must be strings, leaf_of indices") from None
    names = list(map(sys.intern, names))
    distinct = set(names)
    if ("" in distinct or len(distinct) != len(names) or max(map(len, names), default=0) > stats.MAX_NAME
            or max(map(len, leaves), default=0) > stats.MAX_NAME
            or max(where, default=0) >= max(1, len(leaves))):
        raise stats.SummaryError(f"peer names must be distinct, of 1 to {stats.MAX_NAME} characters, leaves of at "
                                 f"most {stats.MAX_NAME}, and leaf_of must index leaves")
    leaves = list(map(sys.intern, leaves))
    return tuple(names), tuple(map(leaves.__getitem__, where))


def _window(w: dict[str, Any], start: float, closed: bool, view: memoryview, names: tuple[str, ...],
            leaves: tuple[str, ...], nbuckets: int, arrays: list[Arrays]) -> tuple[folded.PreparedWindow, memoryview]:
    """One full window made ready, its arrays appended to `arrays` for check(), and the bytes after it."""
    edges, nflat, entries, skipped, max_sent = w.get("edges"), w.get("flat"), w.get("entries"), w.get("skipped"), \
        w.get("max_sent")
    if not (type(edges) is type(nflat) is type(entries) is type(skipped) is type(max_sent) is int
            and min(edges, nflat, entries, skipped, max_sent) >= 0):
        raise stats.SummaryError("a window's edges, flat, entries, skipped and max_sent must be counts")
    if entries > stats.MAX_PEERS_PER_WINDOW or edges > entries or nflat > 2 * (nbuckets + 1) * edges:
        raise stats.SummaryError(f"a window of {entries} entries ({stats.MAX_PEERS_PER_WINDOW} at most), {edges} "
                                 f"edges and {nflat} histogram values does not add up")
    n_ints = 5 * edges + 1 + nflat  # the 4-byte arrays (idx .. flat) come first, then the 1-byte ones
    if 4 * n_ints + 3 * edges > len(view):
        raise stats.SummaryError("the arrays run past the end")
    ints, bytes_ = array("i"), array("b")
    ints.frombytes(view[:4 * n_ints])
    bytes_.frombytes(view[4 * n_ints:4 * n_ints + 3 * edges])
    if _BIG_ENDIAN:
        ints.byteswap()
    columns = []
    at = 0
    for attr, code in ARRAYS:
        n = nflat if attr == "flat" else edges + 1 if attr == "offsets" else edges
        columns.append((ints if code == "i" else bytes_)[at:at + n])
        at = 0 if attr == "flat" else at + n
    # max_sent is the agent's word, of any size: past any 4-byte sent it bounds nothing more
    arrays.append(Arrays(*columns, (edges, nflat, nbuckets, len(names), entries, min(max_sent, 1 << 31))))
    idx = columns[0]
    if edges == len(names) and idx == _counting(edges):
        peers, their_leaves = names, leaves  # the edges in the names list's order, as dumps() writes one window
    else:  # check() finds a peer named twice; an index out of the list must not name anyone before that
        if edges and (min(idx) < 0 or max(idx) >= len(names)):
            raise stats.SummaryError("each edge names a distinct peer of the names list")
        peers, their_leaves = tuple(map(names.__getitem__, idx)), tuple(map(leaves.__getitem__, idx))
    f = folded.Folded.of(peers, their_leaves, *columns[1:])
    return folded.PreparedWindow(start, closed, entries, max_sent, f, skipped), view[4 * n_ints + 3 * edges:]


@functools.lru_cache(maxsize=64)
def _counting(n: int) -> array:
    return array("i", range(n))


class Arrays(NamedTuple):
    """A full window's arrays as its agent sent them (in the order of ARRAYS; all but idx are its Folded's),
    for check(), and what they are checked against."""

    idx: array
    sent: array
    lost: array
    retrans: array
    offsets: array
    flat: array
    rails: array
    top: array
    p99: array
    limits: tuple[int, int, int, int, int, int]  # edges, flat values, buckets, names, entries, max_sent


def check_each(answers: list[list[Arrays]]) -> list[stats.SummaryError | None]:
    """check() of each answer's windows, all in one: an error for each answer that fails, None for the
    others. A check is a numpy call of about a microsecond whatever its size, some 25 of them, so checked
    an answer at a time they cost more than reading it; together they cost a few microseconds an answer.
    Where the whole fails, each answer is checked alone to name the ones that do."""
    try:
        check([w for windows in answers for w in windows])
        return [None] * len(answers)
    except stats.SummaryError:
        pass
    errors: list[stats.SummaryError | None] = []
    for windows in answers:
        try:
            check(windows)
            errors.append(None)
        except stats.SummaryError as e:
            errors.append(e)
    return errors


def check(windows: list[Arrays]) -> None:
    """What makes every edge of these windows weigh what the JSON form's would: refused with the reason
    where one does not. Each check is one numpy pass over all the windows' arrays end to end (numpy is
    imported here, on the controller's side only: the daemon dumps, it never loads)."""
    if not windows:
        return
    import numpy as np

    limits = np.array(list(itertools.chain.from_iterable(w.limits for w in windows)), np.int64)
    edges, nflat, nbuckets, names, entries, max_sent = limits.reshape(len(windows), 6).T
    idx, sent, lost, retrans, offsets, flat = (np.frombuffer(b"".join([w[k] for w in windows]), np.int32)
                                               for k in range(6))
    rails, top, p99 = (np.frombuffer(b"".join([w[k] for w in windows]), np.int8) for k in range(6, 9))
    if min(np.minimum.reduce(a, initial=0) for a in (idx, sent, lost, retrans, offsets, flat)) < 0:
        raise stats.SummaryError("counts, offsets and buckets must be non-negative")
    if len(idx) and (np.minimum.reduce(rails) < 1 or np.minimum.reduce(top) < -1
                     or np.count_nonzero(top > np.repeat(nbuckets, edges)) or np.minimum.reduce(p99) < 0
                     or np.maximum.reduce(p99) > folded.NONE):
        raise stats.SummaryError("an edge's rails (folded entries) must be 1 to 127, its top and p99 bucket in range")
    buckets, counts = flat[0::2], flat[1::2]
    if (np.count_nonzero(nflat & 1) or np.count_nonzero(offsets & 1)
            or np.count_nonzero(buckets > np.repeat(nbuckets, nflat // 2))):
        raise stats.SummaryError("histogram buckets must be 0 to the buckets' count, offsets in bucket, count pairs")
    # Each window's offsets are its edges' and one more: edge j of window w begins at offsets[j + w].
    first_edge, first_flat = _starts(edges), _starts(nflat)
    window = np.repeat(np.arange(len(windows)), edges)
    shifted = offsets.astype(np.int64)
    shifted += np.repeat(first_flat, edges + 1)  # where in `flat` of all the windows
    begin, end = shifted[np.arange(len(idx)) + window], shifted[np.arange(len(idx)) + window + 1]
    if (np.count_nonzero(shifted[first_edge + np.arange(len(windows))] != first_flat)
            or np.count_nonzero(shifted[first_edge + edges + np.arange(len(windows))] != first_flat + nflat)
            or np.count_nonzero(end < begin)):
        raise stats.SummaryError("histogram offsets must rise from 0 to the end of the histograms")
    if not len(idx):
        return
    key = (window << 32) + idx  # a window's peers are distinct where its keys rise (dumps writes them so)
    if np.count_nonzero(key[1:] <= key[:-1]):
        key = np.sort(key)
    if np.count_nonzero(idx >= np.repeat(names, edges)) or np.count_nonzero(key[1:] == key[:-1]):
        raise stats.SummaryError("each edge names a distinct peer of the names list")
    folds = np.zeros(len(idx) + 1, np.int64)
    np.cumsum(rails, out=folds[1:])
    if (np.count_nonzero(folds[first_edge + edges] - folds[first_edge] > entries) or np.minimum.reduce(sent) < 1
            or np.count_nonzero(sent > np.repeat(max_sent, edges) * rails)):
        raise stats.SummaryError("each edge must have sent a probe, no more than its entries' max_sent each, and "
                                 "fold no more entries than the window lists")
    # Each edge's histogram holds exactly its answered probes (sent - lost - retrans, so never fewer than 0).
    counted = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=counted[1:])
    answers = sent.astype(np.int64)
    answers -= lost
    answers -= retrans
    if np.count_nonzero(counted[end >> 1] - counted[begin >> 1] != answers):
        raise stats.SummaryError("an edge's histogram does not add up to its answered probes")
    # An edge's top picks what the analysis lists as slow, and only listed edges are trimmed of a liar's
    # probes: a top below the histogram's slowest bucket would slip slow probes past the trim.
    tops = np.full(len(idx), -1, np.int64)
    answered = end > begin
    if np.count_nonzero(answered):
        tops[answered] = np.maximum.reduceat(np.ascontiguousarray(buckets), (begin >> 1)[answered])
    if np.count_nonzero(tops != top):
        raise stats.SummaryError("an edge's top must be its histogram's slowest bucket")


def _starts(lengths: Any) -> Any:
    """Where each of these lengths starts, laid end to end (numpy)."""
    import numpy as np

    out = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=out[1:])
    return out
