"""Pingmesh localization (nodehealth/pingmesh/analysis.py) on synthetic meshes with injected faults, its
hysteresis, bad input, and `nodehealth pingmesh analyze` (bundles, saving, agents over HTTP)."""
from __future__ import annotations

import copy
import gzip
import http.server
import json
import os
import random
import subprocess
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodehealth import config, inventory
from nodehealth.pingmesh import analysis as pingmesh
from nodehealth.pingmesh import cli
from nodehealth.pingmesh.analysis import Analysis
from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH_DEFAULTS
from nodehealth.pingmesh.stats import BUCKETS_SECONDS, bucket_index, parse_summary
from nodehealth.pingmesh.verdicts import parse_verdicts

WS = 30.0
T0 = 1_700_000_040.0  # a window boundary, in the past (the command analyses as of now)
NOW = T0 + 20 * WS
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESH_INTERVAL = 0.5  # the synthetic meshes probe a peer up to 40 times a window: a schedule that allows 62


def analyze(summaries, cfg=None, now=None, inv=None, probe_interval=MESH_INTERVAL) -> Analysis:
    """pingmesh.analyze with the probe schedule the synthetic meshes keep."""
    return pingmesh.analyze(summaries, cfg, now, inv, probe_interval)


# -- synthetic meshes --------------------------------------------------------------------------

def topology(leaves: int = 4, per_leaf: int = 16, sizes: dict[str, int] | None = None) -> dict[str, list[str]]:
    """Leaves leaf-a, leaf-b, ... of gpu-a00, gpu-a01, ...; `sizes` overrides a leaf's size."""
    topo = {}
    for x in range(leaves):
        name = f"leaf-{chr(97 + x)}"
        n = (sizes or {}).get(name, per_leaf)
        topo[name] = [f"gpu-{chr(97 + x)}{i:02d}" for i in range(n)]
    return topo


def pinglists(topo: dict[str, list[str]], pairs: int = 2) -> dict[str, list[str]]:
    """Like the real pinglist: a full mesh in each leaf, `pairs` representative pairs per leaf pair
    (distinct nodes where the leaves allow), both ends probing each other."""
    lists = {n: [m for m in nodes if m != n] for nodes in topo.values() for n in nodes}
    names = sorted(topo)
    for x, a in enumerate(names):
        for y in range(x + 1, len(names)):
            b = names[y]
            for j in range(pairs):
                na = topo[a][(x * 7 + y * 3 + j) % len(topo[a])]
                nb = topo[b][(x * 5 + y * 11 + j) % len(topo[b])]
                lists[na].append(nb)
                lists[nb].append(na)
    return lists


def mesh(topo, windows=6, sent=10, seed=1, noise=1e-4, loss=None, delay=None, silent=(), pairs=2, ws=WS,
         retrans=None):
    """Every reporting node's summary (decoded JSON). loss(src, dst, w) is the extra loss of a probe
    from src to dst in window w, delay(src, dst, w) its extra round trip, retrans(src, dst, w) the chance
    that a TCP probe that was answered needed its SYN sent again (1 s later); `silent` nodes report nothing."""
    rng = random.Random(seed)
    lists = pinglists(topo, pairs)
    leaf_of = {n: leaf for leaf, nodes in topo.items() for n in nodes}
    out = []
    for node in sorted(lists):
        if node in silent:
            continue
        windows_out = []
        for w in range(windows):
            entries = []
            for peer in lists[node]:
                p = 1 - (1 - noise) * (1 - (loss(node, peer, w) if loss else 0.0))
                base = 0.00015 if leaf_of[peer] == leaf_of[node] else 0.0004
                extra = delay(node, peer, w) if delay else 0.0
                for probe in ("ping", "tcp"):
                    lost = sum(rng.random() < p for _ in range(sent))
                    counts: dict[int, int] = {}
                    again = 0
                    for _ in range(sent - lost):
                        rtt = base * (0.8 + 0.4 * rng.random()) + extra
                        if rng.random() < 1e-3:  # the odd slow probe of a healthy mesh
                            rtt += 0.008
                        if probe == "tcp" and retrans and rng.random() < retrans(node, peer, w):
                            rtt += 1.0  # Linux sends the SYN again after 1 s
                            again += 1
                        i = bucket_index(rtt)
                        counts[i] = counts.get(i, 0) + 1
                    entries.append({"node": peer, "leaf": leaf_of[peer], "rail": 0, "probe": probe, "sent": sent,
                                    "lost": lost, "counts": sorted([k, v] for k, v in counts.items())})
                    if again:
                        entries[-1]["retrans"] = again
            windows_out.append({"start": T0 + w * ws, "closed": True, "peers": entries})
        out.append({"schema_version": 1, "node": node, "leaf": leaf_of[node], "pod": "",
                    "time": T0 + windows * ws + 1, "window_seconds": ws, "buckets_seconds": list(BUCKETS_SECONDS),
                    "windows": windows_out})
    return out


def leaf_of(topo):
    return {n: leaf for leaf, nodes in topo.items() for n in nodes}


def touching(node, p, windows=None):
    return lambda s, d, w: p if node in (s, d) and (windows is None or w in windows) else 0.0


def crossing(topo, leaf, p):
    where = leaf_of(topo)
    return lambda s, d, w: p if (where[s] == leaf) != (where[d] == leaf) else 0.0


def between(topo, a, b, p):
    where = leaf_of(topo)
    return lambda s, d, w: p if {where[s], where[d]} == {a, b} else 0.0


def found(analysis: Analysis) -> set[tuple[str, str]]:
    return {(v.kind, v.element) for v in analysis.verdicts}


TOPO = topology()


# -- localization ------------------------------------------------------------------------------

def test_a_clean_mesh_with_background_noise_names_nothing():
    for seed in range(3):
        a = analyze(mesh(TOPO, windows=8, seed=seed, noise=1e-3), {}, NOW)
        assert a.verdicts == [] and a.rejected == [] and a.notes == []
        assert (a.nodes, a.leaves, a.windows_seen) == (64, 4, 8)
        assert a.window_starts == [T0 + w * WS for w in range(8)]


@pytest.mark.parametrize("seed", range(3))
def test_a_lost_probe_in_every_window_of_every_agent_names_nothing(seed):
    # 20x Pingmesh's normal loss: several nodes cross the loss thresholds by chance in some window,
    # but not beyond what the mesh's own background explains.
    rng = random.Random(seed)
    summaries = mesh(TOPO, noise=0, windows=8)
    for s in summaries:
        for w in s["windows"]:
            e = rng.choice([e for e in w["peers"] if e["probe"] == "tcp"])  # the probes localization judges
            e["lost"], e["counts"] = 1, [[e["counts"][0][0], e["counts"][0][1] - 1]] + e["counts"][1:]
    assert analyze(summaries, {}, NOW).verdicts == []
    # What the background test is for (with every reporter believed: it is the last line then).
    assert analyze(summaries, {"significance": 1.0, "tolerated_liars": 0}, NOW).verdicts != []


@pytest.mark.parametrize("rate", [0.01, 0.02, 0.05])
def test_a_node_with_a_few_percent_loss_is_named_within_a_few_windows(rate):
    # 40 TCP probes per edge and window: what 20 of each kind gave when Pings counted too.
    a = analyze(mesh(TOPO, windows=8, sent=40, loss=touching("gpu-b03", rate, windows=range(3, 8))), {}, NOW)
    assert found(a) == {("node", "gpu-b03")}
    v = a.verdicts[0]
    assert T0 + 3 * WS <= v.since <= T0 + 5 * WS and v.windows >= 3
    assert v.evidence["healthy_leaf_mates"] == 15 and v.evidence["loss"] > rate / 2
    assert "gpu-b03" in v.message and "leaf-b" in v.message


def test_summaries_with_a_probe_kind_this_version_does_not_know_are_used_not_rejected():
    """During a rolling upgrade newer agents may report a probe kind the controller does not know:
    their summaries still count (the unknown entries are skipped and counted), and the verdicts are
    those of the same mesh without them."""
    summaries = mesh(TOPO, windows=8, sent=40, loss=touching("gpu-b03", 0.05, windows=range(3, 8)))
    want = analyze(summaries, {}, NOW)
    for s in summaries[::2]:
        for w in s["windows"]:
            w["peers"].append({"node": w["peers"][0]["node"], "probe": "rdma", "sent": 10, "lost": 0, "qp": 7})
    a = analyze(summaries, {}, NOW)
    assert a.rejected == [] and found(a) == found(want) == {("node", "gpu-b03")}
    assert a.unknown_probes == 8 * len(summaries[::2])
    assert any(f"{a.unknown_probes} peer entries of probe kinds" in n for n in a.notes)


def test_a_dead_node_that_reports_nothing_is_named_from_its_probers():
    a = analyze(mesh(TOPO, loss=touching("gpu-c05", 1.0), silent={"gpu-c05"}), {}, NOW)
    assert found(a) == {("node", "gpu-c05")}
    v = a.verdicts[0]
    assert v.windows == 6 and v.since == T0
    probers = sum("gpu-c05" in peers for peers in pinglists(TOPO).values())
    assert v.evidence["unreachable_from"] == v.evidence["probers"] == probers >= 15
    assert "reports nothing" in v.message


def test_two_dead_nodes_in_one_leaf_are_two_nodes_not_the_leaf():
    dead = {"gpu-a01", "gpu-a09"}
    a = analyze(mesh(TOPO, loss=lambda s, d, w: 1.0 if dead & {s, d} else 0.0, silent=dead), {}, NOW)
    assert found(a) == {("node", "gpu-a01"), ("node", "gpu-a09")}


def test_a_node_that_cannot_reach_anyone_but_reports_is_named():
    a = analyze(mesh(TOPO, loss=touching("gpu-d00", 1.0)), {}, NOW)
    assert found(a) == {("node", "gpu-d00")}


def test_leaf_uplink_loss_is_one_leaf_verdict_not_paths_or_nodes():
    a = analyze(mesh(TOPO, loss=crossing(TOPO, "leaf-c", 0.1)), {}, NOW)
    assert found(a) == {("leaf", "leaf-c")}
    assert a.verdicts[0].evidence["lossy_partners"] == 3 and "uplinks" in a.verdicts[0].message


def test_low_uplink_loss_spread_over_all_partner_leaves_is_still_the_leaf():
    # 5% over 80 probes per leaf edge: too few losses to judge most edges one by one.
    a = analyze(mesh(TOPO, sent=20, loss=crossing(TOPO, "leaf-b", 0.05)), {}, NOW)
    assert found(a) == {("leaf", "leaf-b")}


@pytest.mark.parametrize("silent", [False, True])
def test_a_leaf_cut_off_is_the_leaf(silent):
    cut = set(TOPO["leaf-d"]) if silent else ()
    a = analyze(mesh(TOPO, loss=crossing(TOPO, "leaf-d", 1.0), silent=cut), {}, NOW)
    assert found(a) == {("leaf", "leaf-d")}
    if silent:
        assert "cut off" in a.verdicts[0].message


def test_loss_inside_a_leaf_is_the_leaf():
    where = leaf_of(TOPO)
    a = analyze(mesh(TOPO, loss=lambda s, d, w: 0.3 if "leaf-a" in (where[s], where[d]) else 0.0), {}, NOW)
    assert found(a) == {("leaf", "leaf-a")}
    assert "inside" in a.verdicts[0].message


def test_one_bad_leaf_pair_is_a_path_in_each_direction():
    a = analyze(mesh(TOPO, loss=between(TOPO, "leaf-a", "leaf-c", 0.3)), {}, NOW)
    assert found(a) == {("path", "leaf-a->leaf-c"), ("path", "leaf-c->leaf-a")}
    assert all(v.evidence["reporters"] == 2 and v.evidence["loss"] > 0.1 for v in a.verdicts)


def test_a_dead_representative_does_not_make_its_leaf_pairs_paths():
    # It represents leaf-a towards other leaves: its lost probes are its own, not the paths'.
    lists = pinglists(TOPO)
    rep = next(n for n in TOPO["leaf-a"] if any(not p.startswith("gpu-a") for p in lists[n]))
    a = analyze(mesh(TOPO, loss=touching(rep, 1.0), silent={rep}), {}, NOW)
    assert found(a) == {("node", rep)}


def test_a_slow_node_is_named_and_its_leaf_mates_are_not():
    a = analyze(mesh(TOPO, delay=lambda s, d, w: 0.02 if "gpu-b07" in (s, d) else 0.0), {}, NOW)
    assert found(a) == {("node", "gpu-b07")}
    ev = a.verdicts[0].evidence
    assert ev["p99_seconds"] >= 0.02 and ev["baseline_p99_seconds"] <= 0.0005


def test_a_p99_past_the_last_bucket_is_null_in_the_evidence():
    a = analyze(mesh(TOPO, delay=lambda s, d, w: 9.0 if "gpu-b07" in (s, d) else 0.0), {}, NOW)
    assert found(a) == {("node", "gpu-b07")}
    assert a.verdicts[0].evidence["p99_seconds"] is None and "over 5 s" in a.verdicts[0].message
    json.loads(json.dumps(a.to_dict(), allow_nan=False))


def test_a_slow_leaf_pair_is_a_path_against_the_inter_leaf_baseline():
    a = analyze(mesh(TOPO, delay=lambda s, d, w: 0.02 if {s[4], d[4]} == {"a", "b"} else 0.0), {}, NOW)
    assert found(a) == {("path", "leaf-a->leaf-b"), ("path", "leaf-b->leaf-a")}
    assert a.verdicts[0].evidence["baseline_p99_seconds"] == 0.0005  # inter-leaf, not intra-leaf (0.0002)


def test_inter_leaf_latency_is_not_compared_with_intra_leaf_latency():
    # Every inter-leaf probe is 2 ms slower than the intra-leaf ones: normal, the baselines differ.
    a = analyze(mesh(TOPO, delay=lambda s, d, w: 0.002 if s[4] != d[4] else 0.0), {}, NOW)
    assert a.verdicts == []


@pytest.mark.parametrize("seed", range(3))
def test_a_node_whose_probes_tcp_recovers_is_named_for_its_loss(seed):
    """A NIC dropping packets that TCP recovers from (the SYN sent again after 1 s) is loss: counted as
    such, with its own evidence, and worded as loss, never as the retransmission timer's latency."""
    a = analyze(mesh(TOPO, seed=seed, retrans=touching("gpu-b05", 0.1)), {}, NOW)
    assert found(a) == {("node", "gpu-b05")}
    v = a.verdicts[0]
    assert v.evidence["retransmitted"] >= v.evidence["lost"] > 0 and v.evidence["loss"] > 0.03
    assert "loses" in v.message and "retransmitted SYN" in v.message and "p99" not in v.message


def test_a_lossy_node_is_worded_as_loss_not_as_a_p99_of_seconds():
    # Most of its probes that lose a packet are answered after a retransmission (~1-2 s), a few time out.
    a = analyze(mesh(TOPO, loss=touching("gpu-c02", 0.05), retrans=touching("gpu-c02", 0.3)), {}, NOW)
    assert found(a) == {("node", "gpu-c02")}
    v = a.verdicts[0]
    assert v.message.startswith("Node gpu-c02 loses ") and "p99" not in v.message, v.message
    assert "p99_seconds" not in v.evidence


def test_a_leaf_uplink_that_tcp_recovers_from_is_the_leaf():
    a = analyze(mesh(TOPO, retrans=crossing(TOPO, "leaf-d", 0.15)), {}, NOW)
    assert found(a) == {("leaf", "leaf-d")}
    v = a.verdicts[0]
    assert v.evidence["retransmitted"] > 0 and "loses" in v.message and "retransmitted SYN" in v.message


@pytest.mark.parametrize("seed", range(3))
def test_a_slow_leaf_among_three_is_the_leaf_not_a_baseline(seed):
    """With 3 leaves, 4 of the 6 leaf pairs touch a leaf whose uplinks are slow: the inter-leaf baseline
    is the typical leaf's, which that leaf cannot make its own."""
    topo = topology(leaves=3, per_leaf=8)
    where = leaf_of(topo)
    a = analyze(mesh(topo, seed=seed, delay=lambda s, d, w: 0.03 if "leaf-b" in (where[s], where[d])
                     and where[s] != where[d] else 0.0), {}, NOW)
    assert found(a) == {("leaf", "leaf-b")}
    assert a.verdicts[0].evidence["p99_seconds"] >= 0.03


# -- lying and broken reporters (docs/threat-model.md) -------------------------------------------

def inventory_of(topo) -> inventory.Inventory:
    nodes = sorted((n, leaf) for leaf, names in topo.items() for n in names)
    return inventory.Inventory(tuple(inventory.Node(n, leaf, addresses=(f"10.0.{i // 250}.{i % 250 + 1}",))
                                     for i, (n, leaf) in enumerate(nodes)), 1)


INV = inventory_of(TOPO)


def lie(summaries, liar, entries):
    """The liar's agent reports `entries` (peer entries, its lies) in every window, instead of the truth
    about those peers (the rest of its summary stays true, so that it looks like any other agent)."""
    out = copy.deepcopy(summaries)
    doc = next(s for s in out if s["node"] == liar)
    told = {e["node"] for e in entries}
    for w in doc["windows"]:
        w["peers"] = [p for p in w["peers"] if p["node"] not in told] + copy.deepcopy(entries)
    return out


def tcp(node, sent, lost, counts=None, leaf="", retrans=0):
    entry = {"node": node, "leaf": leaf, "rail": 0, "probe": "tcp", "sent": sent, "lost": lost,
             "counts": counts if counts is not None else ([[1, sent - lost]] if sent > lost else [])}
    if retrans:
        entry["retrans"] = retrans
    return entry


def framed(a: Analysis, liars) -> set:
    """Verdicts that name anything but the liars' own agents as doubted reporters."""
    return {(v.kind, v.element) for v in a.verdicts
            if not (v.kind == "inconclusive" and v.evidence.get("doubted_reporter")
                    and v.element.split("|")[0] in liars)}


@pytest.mark.parametrize("inv", [INV, None])
def test_one_agent_claiming_a_million_lost_probes_frames_no_leaf_mate(inv):
    """The attack of the issue: one agent says all of 1,000,000 probes of a leaf-mate were lost."""
    a = analyze(lie(mesh(TOPO), "gpu-a00", [tcp("gpu-a05", 1_000_000, 1_000_000, leaf="leaf-a")]), {}, NOW, inv)
    assert framed(a, {"gpu-a00"}) == set()
    doubted = [v for v in a.verdicts if v.evidence.get("doubted_reporter")]
    assert [v.element for v in doubted] == ["gpu-a00|leaf-a"] and "not believed" in doubted[0].message
    assert any("claimed more probes than a probe every 0.5 s" in n for n in a.notes)


@pytest.mark.parametrize("topo, sent, interval", [(topology(leaves=3, per_leaf=4), 3, 10.0), (TOPO, 10, MESH_INTERVAL)])
def test_modest_lies_padded_with_good_probes_frame_no_one(topo, sent, interval):
    """3 of 3 lost to one leaf-mate, and made-up good probes to another, so that the liar's own loss
    looks like noise: the leaf-mate is not named, and the liar is doubted. First as in the issue: 12
    nodes in 3 leaves probing every 10 s, 3 probes of each peer a window."""
    lies = [tcp("gpu-b03", 3, 3, leaf="leaf-b"), tcp("gpu-b01", 1_000_000, 0, leaf="leaf-b")]
    a = analyze(lie(mesh(topo, sent=sent), "gpu-b00", lies), {}, NOW, inventory_of(topo), interval)
    assert framed(a, {"gpu-b00"}) == set()
    assert found(a) == {("inconclusive", "gpu-b00|leaf-b")}


def test_one_agent_lying_about_another_leaf_frames_no_leaf_and_no_path():
    """A representative (or any agent) claiming that every node of another leaf loses every probe."""
    lies = [tcp(n, 1000, 1000, leaf="leaf-a") for n in TOPO["leaf-c"]]  # and a false leaf, which is not believed
    a = analyze(lie(mesh(TOPO), "gpu-a03", lies), {}, NOW, INV)
    assert framed(a, {"gpu-a03"}) == set()


def test_one_agent_claiming_retransmissions_or_slow_answers_frames_no_one():
    slow = [tcp("gpu-d02", 40, 0, [[15, 40]], "leaf-d", 40), tcp("gpu-d09", 40, 0, [[16, 40]], "leaf-d")]  # 2 s, 5+ s
    a = analyze(lie(mesh(TOPO), "gpu-d01", slow + [tcp(n, 40, 0, [[16, 40]]) for n in TOPO["leaf-b"]]), {}, NOW, INV)
    assert framed(a, {"gpu-d01"}) == set()


LIAR = "gpu-b02"
SMALL_TOPO = topology(leaves=3, per_leaf=5)
SMALL_INV = inventory_of(SMALL_TOPO)
SMALL_CLEAN = mesh(SMALL_TOPO, windows=4, sent=10)


@st.composite
def lies(draw):
    """Anything one agent may say about any of the others: counts from none to a million, losses,
    retransmissions, any buckets, any leaf."""
    names = [n for nodes in SMALL_TOPO.values() for n in nodes if n != LIAR]
    out = []
    for node in draw(st.lists(st.sampled_from(names), min_size=1, max_size=8, unique=True)):
        sent = draw(st.sampled_from([1, 3, 10, 40, 1000, 1_000_000]))
        lost = draw(st.integers(0, sent))
        answered = sent - lost
        bucket = draw(st.integers(0, len(BUCKETS_SECONDS)))
        out.append(tcp(node, sent, lost, [[bucket, answered]] if answered else [],
                       leaf=draw(st.sampled_from(["", "leaf-a", "leaf-b", "leaf-c"])),
                       retrans=draw(st.integers(0, answered))))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lies(), st.sampled_from([SMALL_INV, None]))
def test_no_lie_of_one_agent_names_any_other_node_leaf_or_path(told, inv):
    a = analyze(lie(SMALL_CLEAN, LIAR, told), {}, NOW, inv)
    assert framed(a, {LIAR}) == set(), [v.message for v in a.verdicts]


def test_two_colluding_agents_are_one_more_than_the_analysis_tolerates_unless_told():
    """What k liars can do: as many as `tolerated_liars` cannot name a node; one more can, when they all
    probe it (docs/threat-model.md). Each one more tolerated costs sensitivity where few agents see a fault."""
    both = lie(lie(mesh(TOPO), "gpu-a00", [tcp("gpu-a05", 40, 40)]), "gpu-a01", [tcp("gpu-a05", 40, 40)])
    assert ("node", "gpu-a05") in found(analyze(both, {}, NOW, INV))
    assert framed(analyze(both, {"tolerated_liars": 2}, NOW, INV), {"gpu-a00", "gpu-a01"}) == set()


def test_one_agent_cannot_hide_a_faulty_node_behind_made_up_good_probes():
    summaries = mesh(TOPO, sent=20, loss=touching("gpu-b03", 0.05))
    a = analyze(lie(summaries, "gpu-b00", [tcp("gpu-b03", 1_000_000, 0)]), {}, NOW, INV)
    assert found(a) == {("node", "gpu-b03")}


def test_leaves_and_members_come_from_the_inventory_not_from_summaries():
    summaries = mesh(TOPO, loss=touching("gpu-c05", 1.0), silent={"gpu-c05"})
    for s in summaries:  # every agent says gpu-c05 is in leaf-a
        for w in s["windows"]:
            for p in w["peers"]:
                if p["node"] == "gpu-c05":
                    p["leaf"] = "leaf-a"
    stranger = copy.deepcopy(summaries[0])
    stranger["node"] = "gpu-x00"  # not in the inventory: its summary is not taken
    lies_about_strangers = lie(summaries, "gpu-a02", [tcp("gpu-y01", 40, 40)])
    a = analyze(lies_about_strangers + [stranger], {}, NOW, INV)
    assert found(a) == {("node", "gpu-c05")} and "leaf leaf-c" in a.verdicts[0].message
    assert ("gpu-x00", "node gpu-x00 is not in the inventory") in a.rejected
    assert any("named nodes the inventory does not list" in n for n in a.notes)


# -- hysteresis --------------------------------------------------------------------------------

def bad_in(windows):
    return touching("gpu-a03", 1.0, windows=set(windows))


@pytest.mark.parametrize("bad,expect", [
    ([5], None),  # one bad window names nothing
    ([2, 4], None),  # two bad windows, not consecutive
    ([4, 5], (T0 + 4 * WS, 2)),  # open after two
    ([0, 1, 2, 3, 4, 5], (T0, 6)),
    ([0, 1, 2, 3], (T0, 4)),  # two good windows since: still open
    ([0, 1, 2], None),  # three good windows since: closed
    ([0, 1, 3], (T0, 3)),  # a bad window resets the good count; windows counts bad ones
])
def test_open_after_two_bad_windows_close_after_three_good(bad, expect):
    a = analyze(mesh(TOPO, loss=bad_in(bad)), {}, NOW)
    if expect is None:
        assert a.verdicts == []
    else:
        assert found(a) == {("node", "gpu-a03")}
        assert (a.verdicts[0].since, a.verdicts[0].windows) == expect


def test_windows_without_data_neither_open_nor_close():
    summaries = mesh(TOPO, loss=bad_in([0, 1]))
    for s in summaries:  # windows 2..4 lost everywhere (say, the agents restarted); 5 is good
        s["windows"] = [w for w in s["windows"] if not T0 + 2 * WS <= w["start"] <= T0 + 4 * WS]
    a = analyze(summaries, {}, NOW)
    assert found(a) == {("node", "gpu-a03")} and a.windows_seen == 3


def test_thresholds_come_from_the_config():
    summaries = mesh(TOPO, loss=bad_in([5]))
    assert analyze(summaries, {"open_windows": 1}, NOW).verdicts[0].windows == 1
    assert analyze(mesh(TOPO, loss=bad_in([0, 1, 2, 3])), {"close_windows": 2}, NOW).verdicts == []
    assert analyze(mesh(TOPO, sent=20, loss=touching("gpu-b03", 0.02)), {"node_loss_fraction": 0.05},
                   NOW).verdicts == []


def test_analysis_keys_are_validated_settings():
    cfg = config.defaults()
    config.merge(cfg, {"pingmesh": {"analysis": {"leaf_fraction": 0.7}}}, "")
    assert cfg["pingmesh"]["analysis"]["leaf_fraction"] == 0.7
    with pytest.raises(config.ConfigError, match="pingmesh.analysis.lossfraction"):
        config.merge(cfg, {"pingmesh": {"analysis": {"lossfraction": 0.1}}}, "")
    with pytest.raises(config.ConfigError, match="open_windows"):
        config.merge(cfg, {"pingmesh": {"analysis": {"open_windows": "two"}}}, "")


# -- inconclusive ------------------------------------------------------------------------------

def test_a_bad_node_in_a_two_node_leaf_is_inconclusive():
    topo = topology(sizes={"leaf-d": 2})
    a = analyze(mesh(topo, loss=touching("gpu-d01", 0.3)), {}, NOW)
    assert found(a) == {("inconclusive", "gpu-d01|leaf-d")}
    assert "healthy leaf-mate" in a.verdicts[0].message


def test_a_node_seen_by_one_reporter_only_is_not_named_at_all():
    """One reporter decides no verdict about another node, not even an inconclusive one; believing every
    reporter (tolerated_liars 0), the one report is inconclusive."""
    topo = {"leaf-a": ["gpu-a00", "gpu-a01", "gpu-a02", "gpu-a03"]}
    summaries = [s for s in mesh(topo, sent=20, loss=touching("gpu-a03", 1.0)) if s["node"] in ("gpu-a00",
                                                                                              "gpu-a01")]
    for s in summaries:  # only gpu-a00 probes gpu-a03
        for w in s["windows"]:
            w["peers"] = [p for p in w["peers"] if p["node"] != "gpu-a03" or s["node"] == "gpu-a00"]
    assert analyze(summaries, {}, NOW).verdicts == []
    a = analyze(summaries, {"tolerated_liars": 0}, NOW)
    assert found(a) == {("inconclusive", "gpu-a03|leaf-a")}
    assert a.verdicts[0].evidence["reporters"] == 1


def test_a_bad_path_between_the_only_two_leaves_is_inconclusive():
    topo = topology(leaves=2)
    a = analyze(mesh(topo, loss=between(topo, "leaf-a", "leaf-b", 0.5)), {}, NOW)
    assert found(a) == {("inconclusive", "leaf-a->leaf-b"), ("inconclusive", "leaf-b->leaf-a")}


def test_nothing_is_blamed_on_an_unknown_leaf():
    summaries = mesh(TOPO, loss=lambda s, d, w: 0.3 if "gpu-a" in s[:5] + d[:5] else 0.0)
    for s in summaries:  # leaf-a is unlabelled: its nodes say leaf ""
        if s["leaf"] == "leaf-a":
            s["leaf"] = ""
        for w in s["windows"]:
            for p in w["peers"]:
                p["leaf"] = "" if p["leaf"] == "leaf-a" else p["leaf"]
    a = analyze(summaries, {}, NOW)
    assert a.verdicts and all(v.kind in ("node", "inconclusive") and "leaf" not in v.element for v in a.verdicts)


# -- the verdict document ----------------------------------------------------------------------

def test_to_dict_is_what_the_agents_accept():
    a = analyze(mesh(TOPO, loss=touching("gpu-c05", 1.0), silent={"gpu-c05"}), {}, NOW)
    doc = parse_verdicts(json.dumps(a.to_dict()))
    assert doc["verdicts"][0]["kind"] == "node" and doc["verdicts"][0]["element"] == "gpu-c05"
    assert doc["verdicts"][0]["evidence"] == a.verdicts[0].evidence
    assert (doc["nodes"], doc["leaves"], doc["window_seconds"], doc["time"]) == (64, 4, WS, NOW)


def test_parsed_summaries_give_the_same_analysis_and_are_left_as_they_were():
    summaries = mesh(TOPO, loss=touching("gpu-a03", 0.2))
    parsed = [parse_summary(s) for s in summaries]
    before = copy.deepcopy(parsed)
    assert analyze(parsed, {}, NOW).to_dict() == analyze(summaries, {}, NOW).to_dict()
    assert parsed == before


def test_only_closed_windows_count():
    summaries = mesh(TOPO, loss=bad_in([4, 5]))
    for s in summaries:
        s["windows"][-1]["closed"] = False
    assert analyze(summaries, {}, NOW).verdicts == []
    # Closed by the agent's word but ending in the future: not closed yet.
    assert analyze(mesh(TOPO, loss=bad_in([4, 5])), {}, T0 + 5 * WS).verdicts == []


# -- bad input ---------------------------------------------------------------------------------

def with_fault():
    return mesh(TOPO, loss=touching("gpu-c05", 1.0), silent={"gpu-c05"})


def test_garbage_is_rejected_with_a_reason_and_the_rest_analysed():
    good = with_fault()
    wrong = [None, 7, "summary", [], {}, {"schema_version": 2, "node": "x"}]
    bad = copy.deepcopy(good[0])
    bad["node"] = "gpu-zz"
    bad["windows"][0]["peers"][0]["lost"] = 99  # more lost than sent
    odd_buckets = dict(copy.deepcopy(good[1]), node="gpu-zy", buckets_seconds=[2 * b for b in BUCKETS_SECONDS])
    misaligned = copy.deepcopy(good[2])
    misaligned["node"] = "gpu-zx"
    misaligned["windows"][0]["start"] += 7
    too_many = dict(copy.deepcopy(good[3]), node="gpu-zw")
    too_many["windows"][0]["peers"][0]["sent"] = 10 ** 9
    too_many["windows"][0]["peers"][0]["counts"] = [[1, 10 ** 9 - too_many["windows"][0]["peers"][0]["lost"]]]
    a = analyze(wrong + good + [bad, odd_buckets, misaligned, too_many], {}, NOW)
    assert found(a) == {("node", "gpu-c05")}
    reasons = dict(a.rejected)
    assert len(a.rejected) == len(wrong) + 4
    assert "lost must not exceed sent" in reasons["gpu-zz"]
    assert "buckets_seconds differ" in reasons["gpu-zy"]
    assert "not a multiple of window_seconds" in reasons["gpu-zx"]
    assert "probes of one peer" in reasons["gpu-zw"]
    assert "schema_version" in reasons["x"] and "object" in reasons["summary 0"]


def test_huge_summaries_are_refused():
    s = with_fault()[0]
    many_windows = dict(s, node="gpu-many", windows=[dict(s["windows"][0], start=T0 + k * WS) for k in range(65)])
    peer = s["windows"][0]["peers"][0]
    many_peers = dict(s, node="gpu-wide", windows=[dict(s["windows"][0], peers=[peer] * 10001)])
    a = analyze([many_windows, many_peers], {}, NOW)
    assert [r for _, r in a.rejected] == ["65 windows, more than 64",
                                          "a window lists 10001 peers, more than 10000"]
    assert a.windows_seen == 0 and a.verdicts == []


def test_a_second_summary_for_a_node_is_refused():
    good = with_fault()
    twin = copy.deepcopy(good[0])
    for w in twin["windows"]:  # a liar claiming gpu-a00 cannot reach anyone
        for p in w["peers"]:
            p["lost"], p["counts"] = p["sent"], []
    a = analyze(good + [twin], {}, NOW)
    assert a.rejected == [(good[0]["node"], f"a second summary for node {good[0]['node']} (the first one is used)")]
    assert found(a) == {("node", "gpu-c05")}


def test_windows_of_another_size_are_left_out_for_the_size_most_agents_use():
    good = with_fault()
    other = mesh(topology(leaves=1, per_leaf=4), ws=60.0)
    for s in other:
        s["node"] = s["node"].replace("gpu-a", "gpu-z")
    a = analyze(other[:2] + good + other[2:], {}, NOW)
    assert found(a) == {("node", "gpu-c05")} and a.window_seconds == WS
    assert sorted(r[0] for r in a.rejected) == sorted(s["node"] for s in other)
    assert all("window_seconds 60 differs from the 30 of 63 agents" == r for _, r in a.rejected)


def test_work_and_memory_caps_hold_and_say_so(monkeypatch):
    monkeypatch.setattr(pingmesh, "MAX_SUMMARIES", 10)
    a = analyze(iter(with_fault()), {}, NOW)
    assert a.notes == ["more than 10 summaries: the rest were not read"]
    monkeypatch.setattr(pingmesh, "MAX_SUMMARIES", 10_000)
    monkeypatch.setattr(pingmesh, "MAX_NODES", 40)
    a = analyze(with_fault(), {}, NOW)
    assert any("past the first 40" in n for n in a.notes) and "more than 40 node names" in a.rejected[-1][1]
    monkeypatch.setattr(pingmesh, "MAX_NODES", 50_000)
    monkeypatch.setattr(pingmesh, "MAX_ANOMALOUS_EDGES", 5)
    a = analyze(with_fault(), {}, NOW)
    assert any("lossy or slow edges" in n for n in a.notes)
    monkeypatch.setattr(pingmesh, "MAX_PEER_ENTRIES", 1000)
    a = analyze(with_fault(), {}, NOW)
    assert 50 < len(a.rejected) < 63 and all("peer entries (at most 1000)" in why for _, why in a.rejected)


def test_many_garbage_names_are_bounded(monkeypatch):
    monkeypatch.setattr(pingmesh, "MAX_NODES", 100)
    s = with_fault()[0]
    w = s["windows"][0]
    noisy = dict(s, windows=[dict(w, peers=[dict(w["peers"][0], node=f"x{i}", leaf=f"l{i}") for i in range(5000)])])
    a = analyze([noisy], {}, NOW)
    assert a.nodes <= 100 and a.leaves <= 100


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=25)


def near_summary():
    """Summaries whose every field may be right or garbage: the validator's corners, not just its door."""
    def maybe(valid):
        return st.one_of(valid, JSONISH)
    peer = st.fixed_dictionaries({
        "node": maybe(st.sampled_from(["gpu-a00", "gpu-a01", "gpu-b00", "x" * 300])),
        "leaf": maybe(st.sampled_from(["leaf-a", "leaf-b", "", "a->b"])),
        "rail": maybe(st.integers(0, 70)), "probe": maybe(st.sampled_from(["ping", "tcp"])),
        "sent": maybe(st.integers(0, 5)), "lost": maybe(st.integers(0, 5)),
        "counts": maybe(st.lists(st.lists(st.integers(-1, 20), min_size=2, max_size=2), max_size=4))})
    window = st.fixed_dictionaries({"start": maybe(st.sampled_from([T0, T0 + WS, T0 + 7, NOW + WS])),
                                    "closed": maybe(st.booleans()), "peers": maybe(st.lists(peer, max_size=5))})
    return st.fixed_dictionaries({
        "schema_version": maybe(st.just(1)), "node": maybe(st.sampled_from(["gpu-a00", "gpu-a01", "gpu-b00"])),
        "leaf": maybe(st.sampled_from(["leaf-a", "leaf-b"])), "time": maybe(st.just(NOW)),
        "window_seconds": maybe(st.sampled_from([WS, 60.0, 0.5])),
        "buckets_seconds": maybe(st.just(list(BUCKETS_SECONDS))), "windows": maybe(st.lists(window, max_size=3))})


SMALL = mesh(topology(leaves=2, per_leaf=3), windows=3, sent=3, loss=touching("gpu-a01", 0.5))


@st.composite
def mutated(draw):
    """A valid summary of a small faulty mesh with one value somewhere inside replaced by garbage."""
    doc = copy.deepcopy(draw(st.sampled_from(SMALL)))
    parent, key = None, None
    node = doc
    while isinstance(node, (dict, list)) and node and (parent is None or draw(st.integers(0, 3))):
        keys = sorted(node) if isinstance(node, dict) else range(len(node))
        parent, key = node, draw(st.sampled_from(list(keys)))
        node = parent[key]
    if parent is not None:
        parent[key] = draw(st.one_of(JSONISH, st.integers(0, 20), st.sampled_from(["gpu-b00", "leaf-b", "tcp"])))
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(JSONISH, near_summary(), mutated()), max_size=8))
def test_any_jsonish_input_gives_an_analysis_never_an_exception(items):
    a = analyze(items, {}, NOW)
    assert isinstance(a, Analysis)
    json.dumps(a.to_dict(), allow_nan=False)
    taken = len(items) - len(a.rejected)
    assert 0 <= taken <= len(items)
    for item in items:
        if not isinstance(item, dict):
            assert any(why.startswith("a summary is an object") for _, why in a.rejected)


# -- the command -------------------------------------------------------------------------------

def run_cli(capsys, *argv):
    code = cli.main(["pingmesh", "analyze", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def write(path, doc, packed=False):
    data = json.dumps(doc).encode()
    with (gzip.open(path, "wb") if packed else open(path, "wb")) as f:
        f.write(data)
    return str(path)


def test_cli_reads_bundles_in_both_shapes_and_gzip(tmp_path, capsys):
    summaries = with_fault()
    for name, doc, packed in (("list.json", summaries, False), ("obj.json", {"x": [1, {"y": 2}], "summaries":
                              summaries, "unreadable": []}, False), ("b.json.gz", summaries, True)):
        code, out, err = run_cli(capsys, "--bundle", write(tmp_path / name, doc, packed))
        assert code == 1, err
        assert out.splitlines()[0].split() == ["KIND", "ELEMENT", "SINCE", "WINDOWS", "MESSAGE"]
        assert out.splitlines()[1].split()[:2] == ["node", "gpu-c05"]
        assert "63 nodes" not in out and "64 nodes in 4 leaves, 6 windows of 30 s" in out


def test_cli_json_exit_codes_and_inconclusive_alone(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "--bundle", write(tmp_path / "ok.json", mesh(TOPO)), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["verdicts"] == [] and doc["windows_seen"] == 6 and doc["rejected"] == []
    topo = topology(sizes={"leaf-d": 2})
    schedule = tmp_path / "schedule.json"  # the agents' probe interval: the synthetic mesh's
    schedule.write_text(json.dumps({"pingmesh": {"probe_interval_seconds": MESH_INTERVAL}}))
    code, out, _ = run_cli(capsys, "--bundle", write(tmp_path / "inc.json", mesh(topo, loss=touching("gpu-d01", 0.3))),
                           "--config", str(schedule))
    assert code == 0 and "inconclusive" in out and "gpu-d01|leaf-d" in out and "note:" not in out


def test_cli_saves_what_it_gathered_and_reads_it_back(tmp_path, capsys):
    src = write(tmp_path / "in.json", with_fault() + ["not a summary"])
    for name in ("saved.json", "saved.json.gz"):
        code, first, _ = run_cli(capsys, "--bundle", src, "--save", str(tmp_path / name), "--json")
        assert code == 1
        code, again, _ = run_cli(capsys, "--bundle", str(tmp_path / name), "--json")
        assert code == 1
        a, b = json.loads(first), json.loads(again)
        assert a["verdicts"] == b["verdicts"] and a["rejected"] == b["rejected"] == []
        assert [u["reason"] for u in a["unreadable"]] == [u["reason"] for u in b["unreadable"]] \
            == ["a string in a bundle is a packed summary in base64: this one is not base64"]
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_cli_broken_and_oversized_bundles_are_listed_not_fatal(tmp_path, capsys, monkeypatch):
    text = json.dumps(with_fault())
    cut = tmp_path / "cut.json"
    cut.write_text(text[:len(text) * 2 // 3])
    code, out, err = run_cli(capsys, "--bundle", str(cut), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["unreadable"][0]["source"] == str(cut) and doc["windows_seen"] == 6
    deep = tmp_path / "deep.json"
    deep.write_text("[" + "[" * 100000)
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x1f\x8b not gzip")
    code, out, err = run_cli(capsys, "--bundle", str(deep), "--bundle", str(garbage), "--bundle",
                             str(tmp_path / "missing.json"))
    assert code == 2 and "no closed window" in err
    assert "nested too deep" in err and "garbage.json: cannot read" in err and "missing.json" in err
    monkeypatch.setattr(cli, "MAX_BUNDLE_BYTES", 1000)
    code, _, err = run_cli(capsys, "--bundle", write(tmp_path / "big.json", with_fault()))
    assert code == 2 and "more than 1000" in err
    monkeypatch.setattr(cli, "MAX_BUNDLE_BYTES", 20000)  # the packed file is smaller, what it holds is not
    code, _, err = run_cli(capsys, "--bundle", write(tmp_path / "big.json.gz", with_fault(), packed=True))
    assert code == 2 and "more than 20000 characters once decompressed" in err


def lines_run(module_file: str, call):
    """How many lines of `module_file` ran during call(): the work done, whatever the machine's speed."""
    count = [0]

    def tracer(frame, event, arg):
        if frame.f_code.co_filename != module_file:
            return None
        count[0] += event == "line"
        return tracer

    sys.settrace(tracer)
    try:
        result = call()
    finally:
        sys.settrace(None)
    return count[0], result


@pytest.mark.parametrize("where", ["before the list", "between summaries"])
def test_a_bundle_padded_with_whitespace_is_refused_with_little_work(tmp_path, capsys, monkeypatch, where):
    """2 MB of gzip that expands to 2 GiB of whitespace, in proportion: the whitespace is skipped in
    bulk (lines run per chunk read, not per character) and a run of it longer than a summary is refused."""
    monkeypatch.setattr(cli, "MAX_BUNDLE_BYTES", 4 << 20)
    pad = " \n\t\r" * (2 << 20)  # 8 MiB: twice the bound, as 2 GiB is twice the real one
    text = pad + "[]" if where == "before the list" else "[" + json.dumps(with_fault()[0]) + "," + pad + "]"
    path = tmp_path / "pad.json.gz"
    path.write_bytes(gzip.compress(text.encode()))
    assert path.stat().st_size < 64 << 10
    lines, (_, _, err) = lines_run(cli.__file__, lambda: run_cli(capsys, "--bundle", str(path)))
    assert "pad.json.gz: more than 1048576 characters of whitespace in a row" in err, err
    assert lines < 3000  # per character, it was more than 2 lines for each of millions


def test_cli_bad_usage_is_2(tmp_path, capsys):
    assert run_cli(capsys)[0] == 2
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"pingmesh": {"analysis": {"nope": 1}}}))
    code, _, err = run_cli(capsys, "--bundle", "x.json", "--config", str(bad))
    assert code == 2 and "pingmesh.analysis.nope" in err
    assert run_cli(capsys, "--from", "http://127.0.0.1:1/", "--windows", "0")[0] == 2
    code, _, err = run_cli(capsys, "--bundle", write(tmp_path / "b.json", with_fault()), "--save",
                           str(tmp_path / "no" / "such" / "dir.json"))
    assert code == 2 and "cannot write" in err


class Agents(http.server.ThreadingHTTPServer):
    """Serves /<node>/v1/pingmesh from a dict; anything else 404."""

    daemon_threads = True

    def __init__(self, docs):
        self.docs, self.paths = docs, []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(h):
                self.paths.append(h.path)
                node = h.path.split("/")[1]
                if node not in self.docs:
                    h.send_error(404)
                    return
                body = self.docs[node]
                h.send_response(200)
                h.send_header("Content-Type", "application/json")
                h.end_headers()
                h.wfile.write(body)

            def log_message(h, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def test_cli_fetches_agents_over_http_and_lists_the_unreachable(tmp_path, capsys):
    summaries = with_fault()
    docs = {s["node"]: json.dumps(s).encode() for s in summaries}
    docs["huge"] = b"[" + b" " * (2 << 20) + b"]"
    server = Agents(docs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        urls = [f"{base}/{s['node']}/v1/pingmesh" for s in summaries]
        urls += [f"{base}/gone/v1/pingmesh", f"{base}/huge/v1/pingmesh", "http://127.0.0.1:1/v1/pingmesh",
                 "file:///etc/passwd"]
        code, out, _ = run_cli(capsys, "--from", *urls, "--concurrency", "4", "--timeout", "30", "--json",
                               "--save", str(tmp_path / "s.json"))
    finally:
        server.shutdown()
    doc = json.loads(out)
    assert code == 1 and [(v["kind"], v["element"]) for v in doc["verdicts"]] == [("node", "gpu-c05")]
    why = {u["source"].split("/")[3] if "127.0.0.1:1/" not in u["source"] else "closed": u["reason"]
           for u in doc["unreadable"] if u["source"].startswith("http")}
    assert why["gone"] == "HTTP 404 Not Found" and "more than 1048576 bytes" in why["huge"] and "closed" in why
    assert any(u["source"] == "file:///etc/passwd" and "only http" in u["reason"] for u in doc["unreadable"])
    windows = PINGMESH_DEFAULTS["fetch_windows"]
    assert server.paths and all(p.endswith(f"?windows={windows}") for p in server.paths)
    saved = json.loads((tmp_path / "s.json").read_text())
    assert len(saved["summaries"]) == len(summaries) and len(saved["unreadable"]) == 4


def test_nodehealth_pingmesh_analyze_runs_as_a_program(tmp_path):
    bundle = write(tmp_path / "b.json", with_fault())
    r = subprocess.run([sys.executable, "-m", "nodehealth.cli", "pingmesh", "analyze", "--bundle", bundle],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stdout.splitlines()[1].split()[:2] == ["node", "gpu-c05"]
    r = subprocess.run([sys.executable, "-m", "nodehealth.cli", "pingmesh", "analyze"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "--bundle" in r.stderr


def ping_loss(summaries, node: str) -> list:
    """Every Ping to or from `node` lost: its agent is starved (or gone) while its kernel answers SYNs."""
    for s in summaries:
        for w in s["windows"]:
            for e in w["peers"]:
                if e["probe"] == "ping" and node in (s["node"], e["node"]):
                    e["lost"], e["counts"] = e["sent"], []
    return summaries


def test_a_starved_agent_that_answers_no_ping_is_not_a_network_fault():
    assert analyze(ping_loss(mesh(TOPO), "gpu-b03"), {}, NOW).verdicts == []


def test_where_there_are_no_tcp_probes_the_pings_are_judged():
    summaries = ping_loss(mesh(TOPO), "gpu-b03")
    for s in summaries:
        for w in s["windows"]:
            w["peers"] = [e for e in w["peers"] if e["probe"] == "ping"]
    assert found(analyze(summaries, {}, NOW)) == {("node", "gpu-b03")}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 50), min_size=len(BUCKETS_SECONDS) + 1, max_size=len(BUCKETS_SECONDS) + 1),
                max_size=6))
def test_p99_of_many_leaf_pairs_at_once_is_the_quantile_of_each(hists):
    """The leaf pairs' p99 taken in bulk is stats.quantile's bucket, histogram by histogram."""
    from array import array

    from nodehealth.pingmesh.folded import quantile_bucket
    from nodehealth.pingmesh.stats import quantile

    got = pingmesh._p99_buckets(array("q", [c for h in hists for c in h]))
    want = [quantile_bucket(quantile({k: c for k, c in enumerate(h) if c}, 0.99)) if any(h) else -1 for h in hists]
    assert got == want


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_adding_up_a_chunk_of_agents_at_a_time_changes_nothing(monkeypatch, chunk):
    """The window's counters come the same however many agents are added up at once (leaf pairs first
    named in a later chunk, edges scaled down by the schedule, lossy and slow edges listed in order)."""
    topo = topology(leaves=3, per_leaf=6)
    docs = mesh(topo, windows=4, loss=lambda s, d, w: (0.3 if "gpu-b02" in (s, d) else 0.0)
                + (0.2 if (s[4], d[4]) in {("a", "c"), ("c", "a")} else 0.0),
                delay=lambda s, d, w: 0.05 if "gpu-c03" in (s, d) else 0.0)
    for p in docs[4]["windows"][1]["peers"][:5]:  # claims far more probes than the schedule sends
        p.update(sent=5000, lost=5000, counts=[])
    want = analyze(docs, {}, NOW)
    assert want.verdicts and any("claimed more probes" in note for note in want.notes)
    monkeypatch.setattr(pingmesh, "_CHUNK", chunk)
    got = analyze(docs, {}, NOW)
    assert got.to_dict() == want.to_dict() and got.notes == want.notes
    assert [v.evidence for v in got.verdicts] == [v.evidence for v in want.verdicts]


def test_cli_packed_fetches_and_saves_the_packed_form_and_reads_it_back(tmp_path, capsys):
    """--packed asks for the packed form, saves it as base64 strings beside an old agent's JSON, and the
    bundle reads back to the same verdicts as JSON gives; a damaged packed summary is listed, not fatal."""
    import base64

    from nodehealth.pingmesh import packed

    summaries = with_fault()
    old = summaries[0]["node"]  # an agent that does not know the packed form answers JSON
    docs = {s["node"]: json.dumps(s).encode() for s in summaries}
    forms = {s["node"]: packed.dumps(parse_summary(s)) for s in summaries if s["node"] != old}
    server = Agents(docs)
    handler = server.RequestHandlerClass
    serve_json = handler.do_GET

    def do_get(h):
        node = h.path.split("/")[1]
        if packed.QUERY not in h.path or node not in forms:
            return serve_json(h)
        server.paths.append(h.path)
        h.send_response(200)
        h.send_header("Content-Type", packed.CONTENT_TYPE)
        h.end_headers()
        h.wfile.write(forms[node])

    handler.do_GET = do_get
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        code, out, _ = run_cli(capsys, "--from", *[f"{base}/{s['node']}/v1/pingmesh" for s in summaries],
                               "--packed", "--timeout", "30", "--json", "--save", str(tmp_path / "s.json"))
    finally:
        server.shutdown()
    got = json.loads(out)
    want = json.loads(run_cli(capsys, "--bundle", write(tmp_path / "j.json", summaries), "--json")[1])
    assert code == 1 and got["verdicts"] == want["verdicts"] and got["unreadable"] == []
    assert all(p.endswith(packed.QUERY) for p in server.paths) and len(server.paths) == len(summaries)
    saved = json.loads((tmp_path / "s.json").read_text())["summaries"]
    assert sorted(type(s).__name__ for s in saved).count("str") == len(summaries) - 1
    assert isinstance(saved[0], dict) and saved[0]["node"] == old
    code, again, _ = run_cli(capsys, "--bundle", str(tmp_path / "s.json"), "--json")
    assert code == 1 and json.loads(again)["verdicts"] == want["verdicts"]
    damaged = bytearray(base64.b64decode(saved[1]))
    damaged[-1] ^= 0xFF  # the last p99 bucket, out of range
    saved[1] = base64.b64encode(bytes(damaged)).decode()
    code, again, _ = run_cli(capsys, "--bundle", write(tmp_path / "d.json", saved), "--json")
    reasons = [u["reason"] for u in json.loads(again)["unreadable"]]
    assert len(reasons) == 1 and reasons[0].startswith("packed summary refused: ")
