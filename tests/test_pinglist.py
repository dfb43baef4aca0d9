"""The pinglist: who probes whom, the same on every node, and what it adds up to at 10,000 nodes."""
from __future__ import annotations

import collections
import math
import os
import subprocess
import sys

import pytest

from nodehealth.inventory import from_data
from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH_DEFAULTS
from nodehealth.pingmesh.pinglist import Target, peer_group, pinglist


def config(**overrides):
    return {**PINGMESH_DEFAULTS, **overrides}


def build(leaves, rails=2, pods=None, gaps=()):
    """Leaves {name: size} ("" for nodes without a leaf); node `<leaf>-<i>` has 10.<rail>.<leaf#>.<i+1>,
    except on the (node, rail) pairs in `gaps`."""
    nodes = []
    for number, (leaf, size) in enumerate(leaves.items()):
        for i in range(size):
            name = f"{leaf or 'x'}-{i:03d}"
            addresses = ["" if (name, r) in gaps else f"10.{r}.{number}.{i + 1}" for r in range(rails)]
            nodes.append({"name": name, "leaf": leaf, "pod": (pods or {}).get(leaf, ""), "addresses": addresses})
    return from_data({"nodes": nodes})


def edges(inv, cfg, epoch=0):
    """Every directed probe (prober, target, rail) of the inventory, checking each Target on the way."""
    out = set()
    for node in inv.nodes:
        for t in pinglist(inv, node.name, epoch, cfg):
            peer = inv.get(t.node)
            assert t.node != node.name and t.address == peer.addresses[t.rail] and t.leaf == peer.leaf
            assert node.addresses[t.rail], "probes from a rail it has no address on"
            out.add((node.name, t.node, t.rail))
    return out


SHAPES = [  # (leaves, rails, gaps, inter_leaf_pairs)
    ({"leaf-a": 4, "leaf-b": 4}, 1, (), 2),
    ({"leaf-a": 5, "leaf-b": 3, "leaf-c": 1, "leaf-d": 8}, 2, (), 2),
    ({"leaf-a": 5, "leaf-b": 3, "leaf-c": 1, "leaf-d": 8}, 2, (), 3),
    ({"leaf-a": 5, "leaf-b": 3, "leaf-c": 1, "leaf-d": 8}, 2, (), 10),  # more pairs than members
    ({"leaf-a": 6, "leaf-b": 6, "leaf-c": 2}, 3, (("leaf-a-000", 1), ("leaf-b-005", 2), ("leaf-c-001", 0)), 1),
    ({"leaf-a": 6, "": 7}, 2, (), 2),  # nodes without a leaf: groups of 3 by name
    ({f"leaf-{i:02d}": 4 for i in range(20)}, 1, (), 2),
]


@pytest.mark.parametrize("leaves, rails, gaps, pairs", SHAPES)
@pytest.mark.parametrize("epoch", [0, 7, 480_123])
def test_mesh_inside_leaves_pairs_between_them_both_ways(leaves, rails, gaps, pairs, epoch):
    cfg = config(inter_leaf_pairs=pairs, unknown_leaf_group_size=3)
    inv = build(leaves, rails, gaps=gaps)
    probes = edges(inv, cfg, epoch)
    assert all((b, a, r) in probes for a, b, r in probes), "a pair is probed one way only"
    unknown = [n.name for n in inv.nodes if not n.leaf]
    group = {n.name: n.leaf or f"~{unknown.index(n.name) // 3}" for n in inv.nodes}
    on = {(n.name, r) for n in inv.nodes for r, a in enumerate(n.addresses) if a}
    members = collections.defaultdict(list)
    for name, r in sorted(on):
        members[group[name], r].append(name)
    between = collections.Counter(frozenset((group[a], group[b], r)) for a, b, r in probes if group[a] != group[b])
    for (g, r), names in members.items():
        # full mesh inside the leaf on this rail, and nobody in it reaches a rail it has no address on
        inside = {(a, b) for a, b, rail in probes if rail == r and group[a] == group[b] == g}
        assert inside == {(a, b) for a in names for b in names if a != b}
        for (h, s), theirs in members.items():
            if s == r and h > g:
                # pair i = (representative i of g, representative i of h): distinct ones up to the lcm
                assert between[frozenset((g, h, r))] == 2 * min(pairs, math.lcm(len(names), len(theirs)))


def test_representatives_share_the_load_evenly():
    """Leaf L's partners take one run of positions per epoch: each member represents L towards
    partners x k / members leaves, give or take one."""
    leaves = {f"leaf-{i:02d}": 7 for i in range(12)}
    inv = build(leaves, rails=2)
    for pairs in (1, 2, 3):
        cfg = config(inter_leaf_pairs=pairs)
        for epoch in (0, 1, 99):
            counts = collections.Counter((a, r) for a, b, r in edges(inv, cfg, epoch) if a[:7] != b[:7])
            share = 11 * pairs / 7
            assert set(counts.values()) <= {math.floor(share), math.ceil(share)}, (pairs, epoch, counts)
            assert len(counts) == 12 * 7 * 2  # nobody is left out


@pytest.mark.parametrize("sizes, pairs", [((32, 32), 2), ((32, 7), 2), ((5, 1), 1), ((9, 4), 4)])
def test_every_member_represents_its_leaf_within_a_cycle(sizes, pairs):
    """A cycle is ceil(members / k) epochs; any 2 cycles - 1 consecutive epochs hold a whole one."""
    inv = build({"leaf-a": sizes[0], "leaf-b": sizes[1]}, rails=1)
    cfg = config(inter_leaf_pairs=pairs)
    couplings = []
    for leaf, size in zip(("leaf-a", "leaf-b"), sizes):
        cycle = -(-size // pairs)
        for first, length in ((0, cycle), (3 * cycle, cycle), (1, 2 * cycle - 1), (480_017, 2 * cycle - 1)):
            seen = set()
            for epoch in range(first, first + length):
                probes = edges(inv, cfg, epoch)
                seen |= {a for a, b, _ in probes if a.startswith(leaf) and not b.startswith(leaf)}
                if leaf == "leaf-a" and first == 0:
                    couplings.append({(a, b) for a, b, _ in probes if a.startswith(leaf) and b.startswith("leaf-b")})
            assert seen == {f"{leaf}-{i:03d}" for i in range(size)}, (leaf, first, length)
    if min(sizes) > pairs:  # representatives rotate from one epoch to the next
        assert couplings[0] != couplings[1]


def test_who_pairs_with_whom_changes_between_cycles():
    inv = build({"leaf-a": 32, "leaf-b": 32}, rails=1)
    cfg = config(inter_leaf_pairs=2)

    def couplings(epochs):
        return {(a, b) for e in epochs for a, b, _ in edges(inv, cfg, e) if a < b and a[:6] != b[:6]}

    first, second = couplings(range(16)), couplings(range(16, 32))
    assert len(first) == len(second) == 32  # each cycle pairs every member once
    assert first != second  # a new permutation on each side, so new couples


def test_same_inventory_same_lists_in_any_process():
    """Both ends must agree: nothing may depend on Python's per-process string hash."""
    code = ("from nodehealth.pingmesh.defaults import DEFAULTS as c\n"
            "from nodehealth.inventory import from_data\n"
            "from nodehealth.pingmesh.pinglist import pinglist\n"
            "inv = from_data({'nodes': [{'name': f'n{i}', 'leaf': f'l{i % 9}', 'address': f'10.0.0.{i + 1}'}"
            " for i in range(90)]})\n"
            "print(sorted((n.name, t.node) for n in inv.nodes for t in pinglist(inv, n.name, 12345, c)))\n")
    outputs = set()
    for seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 0, result.stderr
        outputs.add(result.stdout)
    assert len(outputs) == 1
    inv = build({"leaf-a": 5, "leaf-b": 9}, rails=2)
    again = build({"leaf-a": 5, "leaf-b": 9}, rails=2)  # equal, not the same object
    cfg = config()
    assert pinglist(inv, "leaf-a-001", 3, cfg) == pinglist(again, "leaf-a-001", 3, cfg)
    assert pinglist(inv, "leaf-a-001", 3, cfg) == pinglist(inv, "leaf-a-001", 3, cfg)


def test_edges_of_the_inventory():
    inv = build({"leaf-a": 3, "leaf-b": 2}, rails=2, gaps=(("leaf-a-000", 1),))
    cfg = config(inter_leaf_pairs=0)
    assert pinglist(inv, "gpu-404", 0, cfg) == []
    assert pinglist(inv, "leaf-a-000", 0, cfg) == [
        Target("leaf-a-001", "10.0.0.2", 0, "leaf-a", "same-leaf"),
        Target("leaf-a-002", "10.0.0.3", 0, "leaf-a", "same-leaf")]
    assert [(t.node, t.rail) for t in pinglist(inv, "leaf-a-001", 0, cfg)] == [
        ("leaf-a-000", 0), ("leaf-a-002", 0), ("leaf-a-002", 1)]
    lonely = from_data({"nodes": [{"name": "a", "leaf": "l"}, {"name": "b", "leaf": "l", "address": "10.0.0.2"}]})
    assert pinglist(lonely, "a", 0, cfg) == [] and pinglist(lonely, "b", 0, cfg) == []
    assert pinglist(from_data({"nodes": []}), "a", 0, cfg) == []


def test_nodes_without_a_leaf_are_meshed_in_name_order_groups():
    inv = build({"leaf-a": 2, "": 5}, rails=1)
    cfg = config(inter_leaf_pairs=0, unknown_leaf_group_size=2)
    assert [t.node for t in pinglist(inv, "x-002", 0, cfg)] == ["x-003"]
    assert [t.node for t in pinglist(inv, "x-004", 0, cfg)] == []
    targets = pinglist(inv, "x-000", 0, config(inter_leaf_pairs=1, unknown_leaf_group_size=2))
    assert {t.node for t in targets} >= {"x-001"} and all(t.leaf in ("", "leaf-a") for t in targets)
    assert {t.group for t in targets if not t.leaf} == {"other-leaf"}  # never same-leaf on a guess


@pytest.mark.parametrize("leaves, pods, max_groups, me, peer, group", [
    ({"a": 2, "b": 2}, {}, 16, "a-000", "a-001", "same-leaf"),
    ({"a": 2, "b": 2}, {}, 16, "a-000", "b-000", "leaf:b"),
    ({"a": 2, "b": 2, "c": 2}, {"a": "p1", "b": "p1", "c": "p2"}, 2, "a-000", "b-000", "pod:p1"),
    ({"a": 2, "b": 2, "c": 2}, {"a": "p1", "b": "p1", "c": "p2"}, 2, "a-000", "c-000", "pod:p2"),
    ({"a": 2, "b": 2, "c": 2}, {"a": "p1", "b": "p2", "c": "p3"}, 2, "a-000", "b-000", "other-leaf"),
    ({"a": 2, "b": 2, "c": 2}, {}, 2, "a-000", "b-000", "other-leaf"),
    ({"a": 2, "": 2}, {}, 16, "x-000", "x-001", "other-leaf"),
    ({"a": 2, "": 2}, {}, 16, "x-000", "a-001", "leaf:a"),
    ({"a": 2, "": 2}, {"": "p1"}, 16, "a-000", "x-001", "pod:p1"),
    ({"a": 2}, {}, 16, "a-000", "gpu-404", "other-leaf"),
])
def test_peer_groups_stay_few(leaves, pods, max_groups, me, peer, group):
    inv = build(leaves, rails=1, pods=pods)
    cfg = config(max_peer_groups=max_groups, inter_leaf_pairs=8)
    assert peer_group(inv, me, peer, cfg) == group
    assert {t.group for t in pinglist(inv, me, 0, cfg) if t.node == peer} <= {group}


def test_ten_thousand_nodes_eight_rails_every_list():
    """313 leaves (312 of 32, one of 16), 8 rails, k = 2. A node of a full leaf probes its 31
    leaf-mates, and represents its leaf towards 312 x 2 / 32 = 19.5 leaves: 50 or 51 peers per
    rail. The 16-node leaf's members: 15 + 312 x 2 / 16 = 54."""
    count, rails = 10_000, 8
    inv = from_data({"nodes": [{"name": f"gpu-{i:05d}", "leaf": f"leaf-{i // 32:03d}", "pod": f"pod-{i // 1024}",
                                "addresses": [f"10.{r}.{i // 256}.{i % 256}" for r in range(rails)]}
                               for i in range(count)]})
    cfg = config()
    per_rail = collections.Counter()
    groups = collections.Counter()
    forward = backward = 0
    for node in inv.nodes:
        targets = pinglist(inv, node.name, 480_000, cfg)
        counts = collections.Counter(t.rail for t in targets)
        assert sorted(counts) == list(range(rails))
        expected = {54} if node.name >= "gpu-09984" else {50, 51}
        assert set(counts.values()) <= expected, (node.name, counts)
        per_rail.update(counts.values())
        groups.update(t.group for t in targets)
        for t in targets:  # symmetric iff the multisets of (a, b, r) and (b, a, r) are equal
            forward += hash((node.name, t.node, t.rail))
            backward += hash((t.node, node.name, t.rail))
    assert forward == backward
    # 312 partners x 2 = 624 consecutive positions over 32 members: 19 rounds and 16 more, so in
    # every full leaf exactly 16 members represent it towards 20 leaves and 16 towards 19
    assert per_rail == {50: 9_984 // 2 * 8, 51: 9_984 // 2 * 8, 54: 16 * 8}
    # 313 leaves are too many for leaf groups: 10 pods instead
    assert set(groups) == {"same-leaf"} | {f"pod:pod-{p}" for p in range(10)}
