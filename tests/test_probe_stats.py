"""Window statistics and the summary document: exact merges, quantiles, bounded parsing."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.exporter import render
from nodehealth.model import Metric
from nodehealth.pingmesh import stats
from nodehealth.pingmesh.stats import BUCKETS_SECONDS, PeerStats, SummaryError, bucket_index, quantile


def test_bucket_index_bounds_are_inclusive():
    assert bucket_index(0.0) == 0
    assert bucket_index(0.00005) == 0
    assert bucket_index(0.00005001) == 1
    assert bucket_index(1.0) == BUCKETS_SECONDS.index(1.0)
    assert bucket_index(99.0) == len(BUCKETS_SECONDS)  # overflow


def test_merging_windows_equals_one_histogram_of_all_probes():
    """Merged per-node histograms give the same p99 as one histogram of every probe: never averaged."""
    a, b, whole = PeerStats("x", "l", 0, "ping"), PeerStats("y", "l", 0, "ping"), PeerStats("z", "l", 0, "ping")
    fast = [0.0001] * 990
    slow = [0.3] * 10
    for rtt in fast:
        a.add(rtt)
        whole.add(rtt)
    for rtt in slow:
        b.add(rtt)
        whole.add(rtt)
    merged = {i: a.counts.get(i, 0) + b.counts.get(i, 0) for i in a.counts.keys() | b.counts.keys()}
    assert merged == whole.counts
    assert quantile(merged, 0.99) == 0.0001
    assert quantile(merged, 0.995) == 0.5  # the bucket holding 0.3 s
    # The mean of the two nodes' p99s would say 0.25 s: the exact merge says otherwise.
    assert (quantile(a.counts, 0.99) + quantile(b.counts, 0.99)) / 2 > 0.2


def test_quantile_of_empty_and_overflow():
    assert quantile({}, 0.99) is None
    assert quantile({len(BUCKETS_SECONDS): 3}, 0.5) == math.inf


def test_lost_probes_count_as_sent_not_in_histogram():
    p = PeerStats("n", "l", 0, "tcp")
    p.add(None)
    p.add(1.02, retransmitted=True)
    d = p.to_dict()
    assert d["sent"] == 2 and d["lost"] == 1 and d["retrans"] == 1
    assert sum(n for _, n in d["counts"]) == 1


def _summary(**over):
    s = {"schema_version": 1, "node": "n1", "leaf": "l0", "pod": "", "time": 100.0, "window_seconds": 30.0,
         "buckets_seconds": list(BUCKETS_SECONDS),
         "windows": [{"start": 60.0, "closed": True,
                      "peers": [{"node": "n2", "leaf": "l0", "rail": 0, "probe": "ping", "sent": 3, "lost": 1,
                                 "counts": [[2, 2]]}]}]}
    s.update(over)
    return s


def test_parse_summary_round_trip():
    parsed = stats.parse_summary(_summary())
    assert parsed.node == "n1" and parsed.windows[0].closed
    peer = parsed.windows[0].peers[0]
    assert (peer.sent, peer.lost, peer.counts) == (3, 1, {2: 2})


@pytest.mark.parametrize("bad,why", [
    ({"schema_version": 2}, "schema_version"),
    ({"node": ""}, "node"),
    ({"node": "x" * 300}, "node"),
    ({"window_seconds": float("nan")}, "window_seconds"),
    ({"window_seconds": 0}, "window_seconds"),
    ({"buckets_seconds": [1, 0.5]}, "buckets_seconds"),
    ({"windows": {}}, "windows"),
    ({"windows": [{"start": 0, "peers": []}] * 65}, "65 windows"),
    ({"windows": [{"start": 0, "peers": [{}] * 10001}]}, "10001 peers"),
    ({"windows": [{"start": 0, "peers": [{"node": "a", "probe": 7, "sent": 1, "lost": 0, "counts": []}]}]},
     "probe"),  # a kind that is no name (a well-formed kind this version does not know is skipped, below)
    ({"windows": [{"start": 0, "peers": [{"node": "a", "probe": "ping", "sent": 1, "lost": 2, "counts": []}]}]},
     "lost"),
    ({"windows": [{"start": 0, "peers": [{"node": "a", "probe": "ping", "sent": 5, "lost": 0,
                                          "counts": [[0, 1]]}]}]}, "add up"),
    ({"windows": [{"start": 0, "peers": [{"node": "a", "probe": "ping", "sent": 1, "lost": 0,
                                          "counts": [[99, 1]]}]}]}, "bucket"),
    ({"windows": [{"start": 0, "peers": [{"node": "a", "probe": "ping", "sent": True, "lost": 0,
                                          "counts": []}]}]}, "sent"),
])
def test_parse_summary_refuses_with_a_reason(bad, why):
    with pytest.raises(SummaryError, match=why):
        stats.parse_summary(_summary(**bad))


def test_a_probe_kind_this_version_does_not_know_is_skipped_and_counted():
    """A newer agent may probe a new way: its entries of that kind are left out and counted, whatever
    they hold, and the rest of its summary is used (a rolling upgrade must not break the mesh)."""
    newer = {"node": "n3", "probe": "udp", "sent": "many", "jitter": [1, 2]}
    s = _summary()
    s["windows"][0]["peers"].insert(0, newer)
    window = stats.parse_summary(s).windows[0]
    assert window.skipped == 1 and [(p.node, p.probe) for p in window.peers] == [("n2", "ping")]
    assert stats.parse_summary(_summary()).windows[0].skipped == 0


def test_loads_summary_refuses_oversized_and_deep_input_before_parsing():
    with pytest.raises(SummaryError, match="more than"):
        stats.loads_summary(b" " * (stats.MAX_SUMMARY_BYTES + 1))
    with pytest.raises(SummaryError):
        stats.loads_summary(b"[" * 100000)
    with pytest.raises(SummaryError, match="not JSON"):
        stats.loads_summary(b"\xff\xfe garbage")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["schema_version", "node", "leaf", "time", "window_seconds",
                                        "buckets_seconds", "windows", "pod"]), json_values))
def test_any_garbage_is_a_summary_or_a_summary_error(garbage):
    obj = _summary()
    obj.update(garbage)
    try:
        stats.parse_summary(obj)
    except SummaryError:
        pass


def test_histogram_exposition_is_valid_prometheus_text():
    from prometheus_client.parser import text_string_to_metric_families

    m = Metric("nodehealth_pingmesh_rtt_seconds", "RTT.", "histogram", ("peer_group", "probe"))
    m.add_histogram(("same-leaf", "ping"), BUCKETS_SECONDS, {0: 5, 3: 2, len(BUCKETS_SECONDS): 1}, 6.5)
    text = render([m]).decode()
    families = list(text_string_to_metric_families(text))
    assert families[0].type == "histogram"
    buckets = {s.labels["le"]: s.value for s in families[0].samples if s.name.endswith("_bucket")}
    assert buckets["5e-05"] == 5 and buckets["0.0005"] == 7 and buckets["+Inf"] == 8
    les = [float(s.labels["le"]) for s in families[0].samples if s.name.endswith("_bucket")]
    assert les == sorted(les)


def test_summary_json_of_a_live_window_parses():
    p = PeerStats("n2", "l0", 1, "tcp")
    for rtt in (0.0002, None, 1.1):
        p.add(rtt, retransmitted=rtt is not None and rtt > 1)
    doc = _summary(windows=[{"start": 0.0, "closed": False, "peers": [p.to_dict()]}])
    parsed = stats.loads_summary(json.dumps(doc).encode())
    assert parsed.windows[0].peers[0].retrans == 1
