"""The daemon's Pingmesh object: windows, the summary it serves, and metrics bounded at 10,000 nodes."""
from __future__ import annotations

import os

import pytest
from conftest import HERE

from nodehealth.exporter import render
from nodehealth.inventory import InventoryError, from_data
from nodehealth.pingmesh import stats
from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH_DEFAULTS
from nodehealth.pingmesh.mesh import Pingmesh

GOLDEN = os.path.join(HERE, "golden", "pingmesh.metrics.txt")


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def inventory(leaves: int, per_leaf: int, rails: int = 1):
    nodes = []
    for leaf in range(leaves):
        for i in range(per_leaf):
            n = leaf * per_leaf + i
            nodes.append({"name": f"n{n:05d}", "leaf": f"leaf{leaf:03d}", "pod": f"pod{leaf // 32}",
                          "addresses": [f"10.{r}.{n // 256}.{n % 256}" for r in range(rails)]})
    return from_data({"nodes": nodes})


def mesh(inv, me="n00000", clock=None, **over):
    cfg = dict(PINGMESH_DEFAULTS, **over)
    return Pingmesh(me, cfg, lambda: inv, clock=clock or Clock(1000.0))


def test_windows_align_to_the_clock_close_after_the_timeout_and_are_kept_bounded():
    clock = Clock(1000.0)
    m = mesh(inventory(2, 4), clock=clock, window_seconds=30.0, timeout_seconds=2.0, windows_kept=3)
    m.refresh(clock.now)
    peer = m.targets[0]
    for t in (1000.0, 1031.0, 1062.0, 1093.0):
        m.record(peer, "ping", t, 0.0004, False)
    m.record(peer, "tcp", 1093.5, None, False)
    clock.now = 1111.0  # 1080's window ended at 1110, but a probe sent at 1109.9 may answer until 1111.9
    doc = m.summary()
    assert [w["start"] for w in doc["windows"]] == [1020.0, 1050.0, 1080.0]  # the oldest was dropped
    assert [w["closed"] for w in doc["windows"]] == [True, True, False]
    clock.now = 1112.0
    assert m.summary()["windows"][-1]["closed"]
    last = {(p["node"], p["probe"]): p for p in doc["windows"][-1]["peers"]}
    assert last[(peer.node, "tcp")]["lost"] == 1 and last[(peer.node, "ping")]["lost"] == 0
    assert len(m.summary(windows=1)["windows"]) == 1 and m.summary(windows=0)["windows"] == []
    stats.parse_summary(doc)  # what we serve, our own parser accepts


def test_metrics_stay_bounded_at_10000_nodes_and_8_rails():
    inv = inventory(313, 32, rails=8)
    m = mesh(inv, me="n05000", max_peer_series=50)
    m.refresh(1000.0)
    assert 300 <= len(m.targets) <= 420  # about 40-50 peers per rail
    for i, t in enumerate(m.targets):  # every peer answers slowly, a few lose everything
        for k in range(3):
            m.record(t, "ping", 1000.0 + k, None if i % 7 == 0 else 0.02, False)
            m.record(t, "tcp", 1000.0 + k, 1.02 if i % 5 == 0 else 0.0003, i % 5 == 0)
    m.clock.now = 1100.0
    metrics = m.metrics()
    series = sum(len(f.samples) for f in metrics)
    groups = {s[0][0] for f in metrics if f.name == "nodehealth_pingmesh_probes_total" for s in f.samples}
    assert groups <= {"same-leaf", "other-leaf"} | {f"pod:pod{p}" for p in range(10)}, groups
    per_peer = [f for f in metrics if f.name == "nodehealth_pingmesh_peer_loss_ratio"][0]
    assert len(per_peer.samples) == 50  # capped, worst first
    assert all(v == 1.0 for _, v in per_peer.samples)
    assert series < 1000, series


def test_a_failed_inventory_read_keeps_the_last_pinglist_and_says_so():
    inv = inventory(2, 4)
    calls = []

    def load():
        calls.append(1)
        if len(calls) > 1:
            raise InventoryError("inventory.yaml: not valid YAML")
        return inv
    m = Pingmesh("n00000", dict(PINGMESH_DEFAULTS), load, clock=Clock(0.0))
    assert [f.reason for f in m.findings()] == ["PingmeshNoInventory"]
    m.refresh(0.0)
    before = list(m.targets)
    assert before and m.findings() == []
    m.refresh(10.0)
    assert m.targets == before
    assert m.findings() == []  # the last good inventory is still in use


def test_a_node_missing_from_the_inventory_probes_nobody_and_says_so():
    m = mesh(inventory(2, 4), me="stranger")
    m.refresh(1000.0)
    assert m.targets == []
    assert [f.reason for f in m.findings()] == ["PingmeshNotInInventory"]


def test_metrics_golden():
    """The families and their text, byte for byte (UPDATE_GOLDEN=1 rewrites)."""
    inv = inventory(3, 3)
    clock = Clock(1000.0)
    m = mesh(inv, me="n00000", clock=clock, window_seconds=10.0, inter_leaf_pairs=1)
    m.refresh(clock.now)
    for t in m.targets:
        m.record(t, "ping", 1000.0, 0.0004, False)
        m.record(t, "ping", 1001.0, None if t.leaf != "leaf000" else 0.0006, False)
        m.record(t, "tcp", 1000.0, 1.01, True)
    clock.now = 1100.0
    text = render(m.metrics()).decode()
    if os.environ.get("UPDATE_GOLDEN"):
        with open(GOLDEN, "w") as f:
            f.write(text)
    with open(GOLDEN) as f:
        assert text == f.read()


@pytest.mark.parametrize("windows", [None, 2])
def test_summary_counts_add_up(windows):
    clock = Clock(1000.0)
    m = mesh(inventory(1, 3), clock=clock, window_seconds=10.0)
    m.refresh(clock.now)
    for k in range(30):
        m.record(m.targets[k % 2], "ping", 1000.0 + k, None if k % 10 == 0 else 0.001, False)
    clock.now = 1100.0
    doc = m.summary(windows)
    for w in doc["windows"]:
        for p in w["peers"]:
            assert p["sent"] - p["lost"] == sum(n for _, n in p["counts"])
    assert sum(p["sent"] for w in m.summary()["windows"] for p in w["peers"]) == 30
