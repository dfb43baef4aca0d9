"""The packed form of a summary: what the controller asks agents for (`/v1/pingmesh?format=packed1`).

The JSON summary lists every peer entry (peer, rail, probe kind) with its histogram as pairs; at
10,000 nodes x 8 rails a controller decodes 8 million of them a window, three quarters of its time.
The packed form carries each window as the analysis adds it up (analysis.Folded: one edge per peer
node, TCP over all rails, Pings only where a peer has no TCP), folded by the agent with the same
code, as little-endian arrays that the controller takes with array.frombytes: no Python object per
edge. JSON stays the form for people and for `pingmesh analyze`.

Layout: b"NHPK", the header's length (u32), the header (JSON: the summary's fields, the peer
names, their leaves, and per window its start, closed, and for a window sent in full its counts),
then per full window its arrays, in the order of ARRAYS. A summary is its agent's word and is
untrusted: loads() refuses more than stats.MAX_SUMMARY_BYTES, windows, names and edges past the
JSON form's caps, and any edge whose counts do not add up (lost and retransmitted within sent, the
histogram's probes exactly the answered ones, buckets in range): each edge then weighs what the
probe schedule allows, as a JSON edge does. An edge's top and p99 bucket are the agent's word,
checked for range only: a wrong one says no more than a histogram that agrees with it would.
"""
from __future__ import annotations

import itertools
import json
import operator
import sys
from array import array
from typing import Any

from nodehealth.pingmesh import analysis, stats

FORMAT = 1
QUERY = f"format=packed{FORMAT}"  # what a controller asks for; an agent that knows no such form ignores it
CONTENT_TYPE = f"application/vnd.nodehealth.pingmesh-packed{FORMAT}"
MAGIC = b"NHPK"
# Each full window's arrays, in order: (Folded attribute, typecode); "idx" is each edge's peer in `names`.
ARRAYS = (("idx", "i"), ("sent", "i"), ("lost", "i"), ("retrans", "i"), ("offsets", "i"), ("flat", "i"),
          ("rails", "b"), ("top", "b"), ("p99", "b"))
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
        f = analysis.Folded(w.peers)
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
    names, leaves = _names(head)
    view = memoryview(data)[end:]
    for w in windows:
        if not isinstance(w, dict):
            raise stats.SummaryError("a window must be an object")
        start, closed = stats.number(w.get("start"), "window start"), w.get("closed") is True
        if "edges" not in w:
            if not stubs:
                raise stats.SummaryError(f"window {start:.3f} came without its edges")
            s.windows.append(stats.Window(start, closed, None))
            continue
        ready, view = _window(w, start, closed, view, names, leaves, len(s.buckets))
        s.windows.append(stats.Window(start, closed, None, ready.skipped, ready))
    if len(view):
        raise stats.SummaryError(f"{len(view)} bytes past the last window")
    return s


def _names(head: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The peer names and each one's leaf (what its reporter says), interned: one string per name."""
    names, leaves, leaf_of = head.get("names"), head.get("leaves"), head.get("leaf_of")
    if not (isinstance(names, list) and isinstance(leaves, list) and isinstance(leaf_of, list)
            and len(names) == len(leaf_of) and len(names) <= stats.MAX_WINDOWS * stats.MAX_PEERS_PER_WINDOW
            and len(leaves) <= len(names) + 1):
        raise stats.SummaryError("names, leaves and leaf_of must be lists, leaf_of as long as names")
    if not all(type(n) is str and 0 < len(n) <= stats.MAX_NAME for n in names) or len(set(names)) != len(names):
        raise stats.SummaryError(f"peer names must be distinct strings of 1 to {stats.MAX_NAME} characters")
    if not all(type(n) is str and len(n) <= stats.MAX_NAME for n in leaves):
        raise stats.SummaryError(f"leaves must be strings of at most {stats.MAX_NAME} characters")
    if not all(type(j) is int and 0 <= j < len(leaves) for j in leaf_of):
        raise stats.SummaryError("leaf_of must index leaves")
    leaves = [sys.intern(x) for x in leaves]
    return [sys.intern(n) for n in names], [leaves[j] for j in leaf_of]


def _window(w: dict[str, Any], start: float, closed: bool, view: memoryview, names: list[str], leaves: list[str],
            nbuckets: int) -> tuple[analysis.PreparedWindow, memoryview]:
    edges, nflat, entries, skipped, max_sent = (w.get(k) for k in ("edges", "flat", "entries", "skipped", "max_sent"))
    if not all(type(x) is int and x >= 0 for x in (edges, nflat, entries, skipped, max_sent)):
        raise stats.SummaryError("a window's edges, flat, entries, skipped and max_sent must be counts")
    if entries > stats.MAX_PEERS_PER_WINDOW or edges > entries or nflat > 2 * (nbuckets + 1) * edges:
        raise stats.SummaryError(f"a window of {entries} entries ({stats.MAX_PEERS_PER_WINDOW} at most), {edges} "
                                 f"edges and {nflat} histogram values does not add up")
    got: dict[str, array] = {}
    for attr, code in ARRAYS:
        n = nflat if attr == "flat" else edges + 1 if attr == "offsets" else edges
        size = n * array(code).itemsize
        if size > len(view):
            raise stats.SummaryError("the arrays run past the end")
        a = got[attr] = array(code)
        a.frombytes(view[:size])
        view = view[size:]
        if _BIG_ENDIAN:
            a.byteswap()
    _check_edges(got, len(names), nbuckets, entries, max_sent)
    f = analysis.Folded.of(tuple(map(names.__getitem__, got["idx"])), tuple(map(leaves.__getitem__, got["idx"])),
                           *(got[attr] for attr, _ in ARRAYS[1:]))
    return analysis.PreparedWindow(start, closed, entries, max_sent, f, skipped), view


def _check_edges(a: dict[str, array], names: int, nbuckets: int, entries: int, max_sent: int) -> None:
    """What makes an edge weigh what the JSON form's would: refused with the reason where it does not."""
    idx, sent, lost, retrans, offsets, flat, rails = (a[k] for k in ("idx", "sent", "lost", "retrans", "offsets",
                                                                      "flat", "rails"))
    if not idx:
        if len(offsets) != 1 or offsets[0] != 0:
            raise stats.SummaryError("a window without edges has offsets [0]")
        return
    if min(idx) < 0 or max(idx) >= names or len(set(idx)) != len(idx):
        raise stats.SummaryError("each edge names a distinct peer of the names list")
    if min(rails) < 1 or sum(rails) > entries or min(lost) < 0 or min(retrans) < 0 or min(sent) < 1:
        raise stats.SummaryError("counts must be non-negative, each edge at least one entry with a probe sent, "
                                 "and no more entries folded than the window lists")
    if any(map(operator.gt, map(operator.add, lost, retrans), sent)) \
            or any(map(operator.gt, sent, map(operator.mul, rails, itertools.repeat(max_sent)))):
        raise stats.SummaryError("an edge's lost and retransmitted probes exceed its sent ones, or it sent more "
                                 "than its entries' max_sent")
    if min(a["top"]) < -1 or max(a["top"]) > nbuckets or min(a["p99"]) < 0 or max(a["p99"]) > analysis.NONE:
        raise stats.SummaryError("a top or p99 bucket is out of range")
    if (offsets[0] != 0 or offsets[-1] != len(flat) or any(map(operator.and_, offsets, itertools.repeat(1)))
            or not all(map(operator.le, offsets, offsets[1:]))):
        raise stats.SummaryError("histogram offsets must rise in steps of bucket, count pairs to the end")
    buckets, counts = flat[0::2], flat[1::2]
    if buckets and (min(buckets) < 0 or max(buckets) > nbuckets or min(counts) < 0):
        raise stats.SummaryError(f"histogram buckets must be 0 to {nbuckets} and counts non-negative")
    # Each edge's histogram holds exactly its answered probes: by the running total at its offsets.
    total = array("q", itertools.accumulate(counts, initial=0))
    halves = list(map(operator.rshift, offsets, itertools.repeat(1)))
    answered = map(operator.sub, map(operator.sub, sent, lost), retrans)
    if not all(map(operator.eq, map(operator.sub, map(total.__getitem__, halves[1:]), map(total.__getitem__, halves)),
                   answered)):
        raise stats.SummaryError("an edge's histogram does not add up to its answered probes")
