"""What a few reporters can add to one of the analysis's aggregates, and no more.

Every agent's summary is its own word (docs/threat-model.md). An edge weighs at most what the probe
schedule can send (scaled); before an aggregate is judged, no reporter (and, for a leaf, no node at
its end) counts more than the next one after the few that count most (trimmed, slow_trimmed), so that
what one liar says alone is cut to what the others see, and a fault the others see still counts.
Pure functions over counts, for analysis.py.
"""
from __future__ import annotations

from typing import Any


def without_slowest(counts: dict[int, int], n: int) -> dict[int, int]:
    """A copy of histogram `counts` with `n` of its probes taken off, slowest first."""
    out = dict(counts)
    for i in sorted(out, reverse=True):
        take = min(n, out[i])
        out[i] -= take
        n -= take
        if not out[i]:
            del out[i]
        if not n:
            break
    return out


def scaled(cap: int, sent: int, lost: int, retrans: int, flat: Any) -> tuple[int, int, int, list[int]]:
    """An edge's counts scaled down to `cap` probes, its loss and histogram in proportion (the histogram's
    largest remainders get the odd probes): a reporter weighs no more than its schedule can have probed."""
    lost2 = min(cap, round(lost * cap / sent))
    retrans2 = min(cap - lost2, round(retrans * cap / sent))
    want = cap - lost2 - retrans2
    total = sum(flat[1::2])
    shares = [(flat[x + 1] * want / total if total else 0.0, flat[x]) for x in range(0, len(flat), 2)]
    counts = {i: int(share) for share, i in shares}
    by_remainder = sorted(shares, key=lambda item: item[0] - int(item[0]), reverse=True)
    for _, i in by_remainder[:want - sum(counts.values())]:
        counts[i] += 1
    if not counts or not sum(counts.values()):  # nothing to scale: what is not lost was not answered either
        lost2 += want
    hist = [x for i in sorted(counts) if counts[i] for x in (i, counts[i])]
    return cap, lost2, retrans2, hist


def trimmed(lost: int, edges: list[tuple[int, int, int, int]], reporters: int, ends: int = 0) -> int:
    """An aggregate's lost probes with no one reporter (and then no one node at its end) counting more
    than the one after the `reporters` (`ends`) that count most: what a few liars add alone is cut
    to what the others see. `edges` are its lossy edges: (reporter, end node, sent, lost). Lost that
    no edge accounts for (edges past MAX_ANOMALOUS_EDGES) counts as one more reporter's."""
    unlisted = lost - sum(e[3] for e in edges)
    weighed: list[tuple[int, int, float]] = [(e[0], e[1], float(e[3])) for e in edges]
    if unlisted > 0:
        weighed.append((-1, -1, float(unlisted)))
    for field, count in ((0, reporters), (1, ends)):
        by: dict[int, float] = {}
        for e in weighed:
            by[e[field]] = by.get(e[field], 0.0) + e[2]
        ranked = sorted(by.values(), reverse=True)
        cap = ranked[count] if len(ranked) > count else 0.0
        factor = {k: cap / v for k, v in by.items() if v > cap}
        weighed = [(r, x, n * factor.get((r, x)[field], 1.0)) for r, x, n in weighed]
    return int(sum(n for _, _, n in weighed) + 1e-9)


def slow_trimmed(hist: list[int], edges: list[tuple[int, int, int, int, tuple[int, ...]]], slow: int,
                  reporters: int) -> list[int]:
    """A leaf pair's histogram with no one reporter's probes at or over bucket `slow` counting more than
    those of the one after the `reporters` with most (their slowest probes over that are taken off)."""
    by: dict[int, dict[int, int]] = {}
    for src, _, _, _, flat in edges:
        mine = by.setdefault(src, {})
        for x in range(0, len(flat), 2):
            if flat[x] >= slow:
                mine[flat[x]] = mine.get(flat[x], 0) + flat[x + 1]
    ranked = sorted(by.values(), key=lambda counts: sum(counts.values()), reverse=True)
    cap = sum(ranked[reporters].values()) if len(ranked) > reporters else 0
    for counts in ranked[:reporters]:
        for i, n in counts.items():
            hist[i] -= n
        for i, n in without_slowest(counts, max(0, sum(counts.values()) - cap)).items():
            hist[i] += n
    return hist
