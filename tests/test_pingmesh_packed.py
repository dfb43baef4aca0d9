"""The packed summary (nodehealth/pingmesh/packed.py): the same analysis as its JSON, bounded decoding.

The cluster is the localization benchmark's (benchmarks/pingmesh_analyze.py: a dead node, a lossy
node, a leaf with lossy uplinks), small, with SYN retransmissions added.
"""
from __future__ import annotations

import copy
import json
import os
import random
import sys
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.pingmesh import analysis, controller, folded, packed, stats

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import pingmesh_analyze as bench  # noqa: E402

NODES, LEAF, RAILS, PAIRS, WINDOWS = 96, 16, 2, 2, 5


def json_summaries() -> list[dict]:
    names, leaf, inter = bench.cluster(NODES, LEAF, PAIRS, RAILS)
    out = list(bench.summaries(names, leaf, inter, LEAF, RAILS, WINDOWS))
    rng = random.Random(7)
    for s in out:  # some TCP probes answered only after a retransmitted SYN
        for w in s["windows"]:
            for k, p in enumerate(w["peers"]):
                if p["probe"] == "tcp" and p["counts"] and rng.random() < 0.05:
                    w["peers"][k] = dict(p, retrans=1, counts=[*p["counts"], [13, 1]], sent=p["sent"] + 1)
    return out


@pytest.fixture(scope="module")
def summaries() -> list[dict]:
    return json_summaries()


def test_a_packed_window_folds_to_what_its_json_folds_to(summaries):
    for s in summaries[:10]:
        parsed = stats.parse_summary(s)
        again = packed.loads(packed.dumps(parsed))
        assert (again.node, again.leaf, again.time, again.window_seconds, again.buckets) == (
            parsed.node, parsed.leaf, parsed.time, parsed.window_seconds, parsed.buckets)
        for w, p in zip(parsed.windows, again.windows):
            want = folded.prepare_window(w, parsed.window_seconds, parsed.buckets, bench.T0 + 1e6)
            got = folded.prepare_window(p, again.window_seconds, again.buckets, bench.T0 + 1e6)
            assert (got.start, got.closed, got.entries, got.max_sent, got.skipped) == (
                want.start, want.closed, want.entries, want.max_sent, want.skipped)
            for attr in folded.Folded.__slots__[1:]:
                assert getattr(got.folded, attr) == getattr(want.folded, attr), attr


def test_packed_summaries_give_the_analysis_their_json_gives(summaries):
    names, leaf, _ = bench.cluster(NODES, LEAF, PAIRS, RAILS)
    inv = bench.inventory(names, leaf, RAILS)
    now = bench.T0 + WINDOWS * bench.WS + 3
    from_json = analysis.analyze(summaries, now=now, inv=inv, probe_interval=bench.PROBE_INTERVAL)
    from_packed = analysis.analyze((packed.loads(packed.dumps(stats.parse_summary(s))) for s in summaries),
                                   now=now, inv=inv, probe_interval=bench.PROBE_INTERVAL)
    assert {(v.kind, v.element) for v in from_json.verdicts} >= {("node", names[bench.DEAD])}
    assert from_packed.to_dict() == from_json.to_dict()


def test_an_answer_to_since_keeps_what_the_controller_has(summaries):
    """keep_windows takes a packed answer's full windows as they come and the others from what it kept."""
    s = stats.parse_summary(summaries[0])
    now = bench.T0 + WINDOWS * bench.WS + 3
    first, kept, parsed = controller.keep_windows(None, packed.loads(packed.dumps(s)), now)
    assert parsed == WINDOWS
    since = kept.since()
    s.windows[:-1] = [stats.Window(w.start, w.closed, None) for w in s.windows[:-1]]
    with pytest.raises(stats.SummaryError, match="without its edges"):
        packed.loads(packed.dumps(s))  # stubs only where they were asked for
    again, kept2, parsed = controller.keep_windows(kept, packed.loads(packed.dumps(s), stubs=True), now)
    assert parsed == 1 and kept2.since() == since
    assert [w.folded.flat for w in again.windows] == [w.folded.flat for w in first.windows]


def _tampered(summary: dict, change) -> bytes:
    """The packed bytes of `summary` with its first window's arrays (or header) changed by `change`."""
    data = packed.dumps(stats.parse_summary(summary))
    end = 8 + int.from_bytes(data[4:8], "little")
    head = json.loads(data[8:end])
    w = head["windows"][0]
    arrays, view = {}, memoryview(data)[end:]
    for attr, code in packed.ARRAYS:
        n = w["flat"] if attr == "flat" else w["edges"] + 1 if attr == "offsets" else w["edges"]
        a = arrays[attr] = array(code)
        a.frombytes(view[:n * a.itemsize])
        view = view[n * a.itemsize:]
    change(head, arrays)
    body = b"".join(arrays[attr].tobytes() for attr, _ in packed.ARRAYS)
    text = json.dumps(head).encode()
    return packed.MAGIC + len(text).to_bytes(4, "little") + text + body + bytes(view)


def _set(attr, k, value):
    def change(head, a):
        a[attr][k] = value
    return change


def _header(key, value, window=True):
    def change(head, a):
        (head["windows"][0] if window else head)[key] = value
    return change


def _more_counts(head, a):  # more probes in the histogram than were answered: a weight past the cap
    a["flat"][1] += 1000


@pytest.mark.parametrize("change,why", [
    (_set("lost", 0, 999), "add up"),
    (_set("lost", 0, -1), "non-negative"),
    (_set("sent", 0, 10_000), "max_sent"),
    (_set("sent", 0, 0), "sent a probe"),
    (_more_counts, "add up"),
    (_set("flat", 0, 99), "buckets"),
    (_set("offsets", 1, 3), "offsets"),
    (_set("offsets", 1, 10 ** 6), "offsets"),
    (_set("offsets", 0, 2), "offsets"),
    (_set("idx", 1, 0), "distinct"),
    (_set("idx", 0, 10_000), "distinct"),
    (_set("top", 0, 40), "top"),
    (_set("top", 0, -1), "slowest bucket"),  # hides an answered edge's slow probes from the liars' trim
    (_set("p99", 0, -2), "p99"),
    (_set("rails", 0, 0), "rails"),
    (_set("flat", 1, -5), "non-negative"),
    (_header("entries", 3), "entries"),
    (_header("entries", stats.MAX_PEERS_PER_WINDOW + 1), "at most"),
    (_header("edges", 1), "does not add up"),
    (_header("max_sent", 0), "max_sent"),
    (_header("flat", 10 ** 6), "does not add up"),
    (_header("format", 2, window=False), "format"),
    (_header("names", ["x"] * 3, window=False), "names"),
    (_header("node", "", window=False), "node"),
])
def test_a_hostile_packed_summary_is_refused_with_the_reason(summaries, change, why):
    with pytest.raises(stats.SummaryError, match=why):
        packed.loads(_tampered(summaries[0], change))


def test_a_count_past_any_integer_the_checks_hold_is_a_count_like_another(summaries):
    got = packed.loads(_tampered(summaries[0], _header("max_sent", 10 ** 30)))  # Python's int: numpy's would overflow
    assert got.windows[0].ready.max_sent == 10 ** 30


def test_sizes_are_refused_before_decoding(summaries):
    with pytest.raises(stats.SummaryError, match="more than"):
        packed.loads(b"NHPK" + b"\0" * stats.MAX_SUMMARY_BYTES)
    with pytest.raises(stats.SummaryError, match="past the end"):
        packed.loads(b"NHPK" + (1 << 30).to_bytes(4, "little") + b"{}")
    data = packed.dumps(stats.parse_summary(summaries[0]))
    with pytest.raises(stats.SummaryError, match="past the end"):
        packed.loads(data[:-3])
    with pytest.raises(stats.SummaryError, match="not a packed"):
        packed.loads(b'{"schema_version": 1}')


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_damage_is_a_summary_or_a_summary_error(data):
    clean = packed.dumps(stats.parse_summary(SMALL))
    raw = bytearray(clean)
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        packed.loads(bytes(raw[:cut]), stubs=data.draw(st.booleans()))
    except stats.SummaryError:
        pass


SMALL = {"schema_version": 1, "node": "n1", "leaf": "l0", "pod": "", "time": 100.0, "window_seconds": 30.0,
         "buckets_seconds": list(stats.BUCKETS_SECONDS),
         "windows": [{"start": 30.0, "closed": True, "peers": [
             {"node": "n2", "leaf": "l0", "rail": 0, "probe": "tcp", "sent": 6, "lost": 1, "retrans": 1,
              "counts": [[2, 4], [13, 1]]},
             {"node": "n2", "leaf": "l0", "rail": 1, "probe": "tcp", "sent": 6, "lost": 0, "counts": [[3, 6]]},
             {"node": "n3", "leaf": "l1", "rail": 0, "probe": "ping", "sent": 6, "lost": 6, "counts": []}]},
             {"start": 60.0, "closed": False, "peers": []}]}


def test_a_names_list_checked_once_is_taken_again_and_a_bad_one_never(summaries, monkeypatch):
    """The controller sees each agent's names list every window: checked once, then taken as checked; a
    list that fails is refused every time, and the memo empties past its bound."""
    checks = []
    check = packed._checked_names
    monkeypatch.setattr(packed, "_checked_names", lambda *lists: checks.append(1) or check(*lists))
    memo = packed._names.__self__
    monkeypatch.setattr(memo, "_lists", {})
    data = packed.dumps(stats.parse_summary(summaries[0]))
    first, again = packed.loads(data), packed.loads(data)
    assert len(checks) == 1 and len(memo._lists) == 1
    assert [w.ready.folded.names for w in first.windows if w.ready] == \
        [w.ready.folded.names for w in again.windows if w.ready]
    bad = _tampered(summaries[0], _header("names", ["x"] * 3, window=False))
    for _ in range(2):
        with pytest.raises(stats.SummaryError, match="names"):
            packed.loads(bad)
    assert len(checks) == 3 and len(memo._lists) == 1
    other = dict(summaries[0], node="someone-else")  # the same list from another node: checked for it
    packed.loads(packed.dumps(stats.parse_summary(other)))
    assert len(checks) == 4 and len(memo._lists) == 2
    changed = copy.deepcopy(summaries[0])  # a node whose list changed: checked again, and kept in its place
    changed["windows"][0]["peers"][0]["node"] = "n9"
    got = packed.loads(packed.dumps(stats.parse_summary(changed)))
    assert len(checks) == 5 and len(memo._lists) == 2 and "n9" in got.windows[0].ready.folded.names
    monkeypatch.setattr(memo, "MAX_NAMES", 1)
    packed.loads(packed.dumps(stats.parse_summary(summaries[1])))
    assert len(memo._lists) == 1 and len(checks) == 6


def _refused(arrays: packed.Arrays) -> bool:
    """packed.check's rules in plain Python, an edge at a time: whether the window is refused."""
    idx, sent, lost, retrans, offsets, flat, rails, top, p99 = (list(a) for a in arrays[:9])
    edges, nflat, nbuckets, names, entries, max_sent = arrays.limits
    if min(idx + sent + lost + retrans + offsets + flat, default=0) < 0:
        return True
    if any(r < 1 for r in rails) or any(not -1 <= t <= nbuckets for t in top) or any(
            not 0 <= q <= folded.NONE for q in p99):
        return True
    if nflat % 2 or any(o % 2 for o in offsets) or any(b > nbuckets for b in flat[0::2]):
        return True
    if offsets[0] != 0 or offsets[-1] != nflat or any(b < a for a, b in zip(offsets, offsets[1:])):
        return True
    if any(i >= names for i in idx) or len(set(idx)) != len(idx):
        return True
    if sum(rails) > entries or any(s < 1 or s > max_sent * r for s, r in zip(sent, rails)):
        return True
    for j in range(edges):
        pairs = flat[offsets[j]:offsets[j + 1]]
        if sum(pairs[1::2]) != sent[j] - lost[j] - retrans[j] or top[j] != max(pairs[0::2], default=-1):
            return True
    return False


@pytest.fixture(scope="module")
def parsed_windows(summaries) -> list[list[packed.Arrays]]:
    return [packed.parse(packed.dumps(stats.parse_summary(s)))[1] for s in summaries[:8]]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_answers_checked_together_are_refused_exactly_where_each_alone_breaks_a_rule(parsed_windows, data):
    """check_each() checks many answers' windows in one numpy pass over them all: it must refuse exactly the
    answers that a rule refuses, one edge at a time in plain Python, whatever the others hold."""
    answers = []
    for windows in data.draw(st.lists(st.sampled_from(parsed_windows), min_size=1, max_size=5)):
        windows = [packed.Arrays(*(array(a.typecode, a) for a in w[:9]), w.limits) for w in windows]
        for _ in range(data.draw(st.integers(0, 2))):
            w = data.draw(st.sampled_from(windows))
            column = w[data.draw(st.integers(0, 8))]
            if column:
                value = data.draw(st.one_of(st.integers(-2, 20), st.integers(-128, 127)) if column.typecode == "b"
                                  else st.one_of(st.integers(-2, 40), st.integers(-(1 << 31), (1 << 31) - 1)))
                column[data.draw(st.integers(0, len(column) - 1))] = value
        answers.append(windows)
    expected = [any(map(_refused, windows)) for windows in answers]
    assert [e is not None for e in packed.check_each(answers)] == expected
    for windows, refused in zip(answers, expected):
        assert (packed.check_each([windows]) != [None]) == refused


def test_an_answer_checked_with_others_is_refused_alone_with_its_reason(summaries):
    good = [packed.dumps(stats.parse_summary(s)) for s in summaries[:3]]
    bad = _tampered(summaries[3], _set("top", 0, -1))
    got = packed.loads_each([good[0], bad, good[1], b"not packed", good[2]])
    assert [type(g).__name__ for g in got] == ["Summary", "SummaryError", "Summary", "SummaryError", "Summary"]
    assert "slowest bucket" in str(got[1]) and "not a packed" in str(got[3])
    assert [g.node for g in got[::2]] == [s["node"] for s in summaries[:3]]


def test_pingmesh_analyze_decodes_packed_answers_together_and_names_the_one_refused(summaries):
    """`pingmesh analyze` takes packed answers packed.CHECK_TOGETHER at a time: past a batch, in a batch and
    in the last one, a refused answer is a problem under its own label and every other one is analysed."""
    from nodehealth.pingmesh import cli

    count = packed.CHECK_TOGETHER + 6
    data = [packed.dumps(stats.parse_summary(s)) for s in summaries[:count]]
    bad = {3, packed.CHECK_TOGETHER + 2}
    for k in bad:
        data[k] = _tampered(summaries[k], _set("top", 0, -1))
    problems: list = []
    got = list(cli._decoded([iter((f"agent-{k}", d, cli._UNDECODED) for k, d in enumerate(data))], problems, None))
    assert [s.node for s in got] == [s["node"] for k, s in enumerate(summaries[:count]) if k not in bad]
    assert [label for label, _ in problems] == [f"agent-{k}" for k in sorted(bad)]
    assert all("packed summary refused" in why and "slowest bucket" in why for _, why in problems)


def test_the_names_memo_gives_only_lists_checked_for_that_node(summaries):
    """The memo compares the header's bytes from "names" to "windows": a key written again past them (which
    json takes last) can only get the node the lists it sent and had checked before, never unchecked ones."""
    data = packed.dumps(stats.parse_summary(summaries[5]))
    honest = packed.loads(data)
    end = 8 + int.from_bytes(data[4:8], "little")
    text = data[8:end][:-1] + b',"n\\u0061mes":["x"]}'
    again = packed.loads(packed.MAGIC + len(text).to_bytes(4, "little") + text + data[end:])
    assert again.windows[0].ready.folded.names == honest.windows[0].ready.folded.names
    stranger = dict(summaries[5], node="never-seen")
    data = packed.dumps(stats.parse_summary(stranger))
    end = 8 + int.from_bytes(data[4:8], "little")
    text = data[8:end][:-1] + b',"n\\u0061mes":["x"]}'
    with pytest.raises(stats.SummaryError, match="names"):
        packed.loads(packed.MAGIC + len(text).to_bytes(4, "little") + text + data[end:])
