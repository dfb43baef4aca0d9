"""Pingmesh end to end on a real network: 12 daemons in namespaces under 3 leaf bridges and a spine.

Each scenario injects one fault with the kernel's own tools, lets the agents probe for a few
windows, reads their `/v1/pingmesh` over the management network, and runs the same analysis the
controller and `nodehealth pingmesh analyze` run. The right node, leaf or path must be named and
nothing else; a clean mesh must name nothing at all. Windows are short (4 s) so that the batch of
scenarios shares one topology and one set of daemons and runs in a few minutes.
"""
from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest
from conftest import require_netns, unavailable, wait_for

from nodehealth import inventory
from nodehealth.pingmesh.analysis import analyze
from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH_DEFAULTS

pytest.importorskip("grpc")
from netns.mesh import Mesh  # noqa: E402 (after the skip: it needs grpc in the daemons)
from netns.topology import Topology, Unavailable  # noqa: E402

WINDOW = 4.0
PINGMESH = {"probe_interval_seconds": 0.25, "ping_interval_seconds": 0.25, "window_seconds": WINDOW,
            "timeout_seconds": 2.0,
            "windows_kept": 20, "max_probes_per_second": 200.0}
ANALYSIS = dict(PINGMESH_DEFAULTS["analysis"])
MAX_WINDOWS_TO_DETECT = 6  # open_windows (2) plus slack for the window the fault started in



@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    require_netns()
    topo = Topology(leaves=3, per_leaf=4)
    m = None
    try:
        try:
            topo.build()
        except Unavailable as e:
            unavailable(str(e))
        m = Mesh(topo, str(tmp_path_factory.mktemp("mesh")), PINGMESH).start()
        # Every agent has probed a whole window, with nothing lost, before any scenario starts: a daemon
        # answers HTTP once its agent serves, but its peers' Pings sent before that failed, and their
        # channels reconnect after a backoff of up to a second (more on a loaded machine).
        assert settle(m, windows=6), "no window without a lost probe in the mesh's first 6 windows"
        yield m
    finally:
        if m is not None:
            m.stop()
        topo.close()


def watch(mesh: Mesh, expect=None, windows: int = MAX_WINDOWS_TO_DETECT, lied: list | None = None):
    """Analyse the windows that start after now, once per window, as the controller does (the inventory,
    the agents' probe schedule), until `expect(verdicts)` holds or `windows` windows have closed; returns
    the last analysis. With `lied`, each window is analysed once more with LIAR's summary replaced by
    lies, and that analysis appended to it."""
    first = math.ceil(time.time() / WINDOW) * WINDOW
    inv = inventory.load_file(mesh.inventory)
    result = None
    for n in range(1, windows + 1):
        close = first + n * WINDOW + PINGMESH["timeout_seconds"] + 0.3
        time.sleep(max(0.0, close - time.time()))
        summaries = mesh.summaries()
        for s in summaries:
            s["windows"] = [w for w in s["windows"] if w["start"] >= first]
        now = time.time()
        result = analyze(summaries, ANALYSIS, now, inv, PINGMESH["probe_interval_seconds"])
        if lied is not None:
            lied.append(analyze([lies(s, mesh) if s["node"] == LIAR else s for s in summaries], ANALYSIS, now, inv,
                                PINGMESH["probe_interval_seconds"]))
        if expect is not None and expect(result.verdicts):
            return result
    return result


LIAR = "n001"


def lies(summary: dict, mesh: Mesh) -> dict:
    """What a compromised agent says: every probe of every other node, its leaf-mates and the other
    leaves alike, lost, a million times a window (with each one's true leaf, as a careful liar would)."""
    others = [n for n in mesh.topo.nodes if n.name != LIAR]
    for w in summary["windows"]:
        w["peers"] = [{"node": n.name, "leaf": mesh.topo.leaf_name(n.leaf), "rail": 0, "probe": "tcp",
                       "sent": 1_000_000, "lost": 1_000_000, "counts": []} for n in others]
    return summary


def named(verdicts, kind=None):
    return {(v.kind, v.element) for v in verdicts if kind is None or v.kind == kind}


@pytest.fixture
def fault(mesh):
    yield mesh.topo
    mesh.topo.clear_faults()
    settle(mesh)


def settle(mesh: Mesh, windows: int = 8) -> bool:
    """Wait for a window in which no probe was lost (False if none came in `windows` windows): after a
    fault, TCP connections that backed off (tbf, heavy loss) take a few seconds to send again, and the
    next scenario must start clean. Looked for twice a second among the windows that ran on after the
    fault was cleared, so the wait ends when such a window closes, not at a multiple of one."""
    cleared = time.time()

    def clean() -> bool:
        closed = [[w for w in s["windows"] if w["closed"] and w["start"] + WINDOW > cleared]
                  for s in mesh.summaries(windows=3)]
        last = [c[-1] for c in closed if c]
        return len(last) == len(mesh.topo.nodes) and not any(p["lost"] for w in last for p in w["peers"])
    return bool(wait_for(clean, timeout=windows * WINDOW, step=0.5))


def test_every_agent_probes_its_pinglist_and_a_clean_mesh_loses_nothing(mesh):
    """The first window to start from now, on every node: each probed its leaf-mates, and lost nothing."""
    since = time.time()

    def next_windows() -> dict | None:
        found = {}
        for s in mesh.summaries(windows=3):
            after = [w for w in s["windows"] if w["closed"] and w["start"] >= since]
            if after:
                found[s["node"]] = (s["leaf"], after[0])
        return found if len(found) == len(mesh.topo.nodes) else None
    windows = wait_for(next_windows, timeout=3 * WINDOW + PINGMESH["timeout_seconds"], step=0.5)
    assert windows, "a window that started after the test did not close on every node"
    for node, (leaf, window) in windows.items():
        peers = {p["node"] for p in window["peers"]}
        leaf_mates = {n.name for n in mesh.topo.nodes if mesh.topo.leaf_name(n.leaf) == leaf} - {node}
        assert leaf_mates <= peers, (node, peers)
        assert [p for p in window["peers"] if p["lost"]] == [], node


def test_a_clean_mesh_names_nothing_for_many_windows_and_one_lying_agent_frames_no_one(mesh):
    lied: list = []
    result = watch(mesh, windows=10, lied=lied)
    assert result.windows_seen >= 8
    assert result.verdicts == [], [v.message for v in result.verdicts]
    # The same windows with one agent's summary made of lies: nothing is named but that agent itself,
    # which is doubted (an inconclusive verdict: no taint).
    assert len(lied) == 10 and lied[-1].windows_seen >= 8
    for a in lied:
        assert {(v.kind, v.element) for v in a.verdicts} <= {("inconclusive", f"{LIAR}|leaf0")}, \
            [v.message for v in a.verdicts]
    assert ("inconclusive", f"{LIAR}|leaf0") in {(v.kind, v.element) for v in lied[-1].verdicts}


def test_the_cli_analyses_live_agents(mesh):
    urls = [mesh.url(n.name) for n in mesh.topo.nodes]
    p = subprocess.run([sys.executable, "-m", "nodehealth.cli", "pingmesh", "analyze", "--json", "--timeout", "30",
                        "--from", *urls],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert '"verdicts": []' in p.stdout


def test_random_loss_on_one_node_names_that_node(mesh, fault):
    fault.node_loss("n102", 10)
    result = watch(mesh, lambda vs: ("node", "n102") in named(vs))
    assert named(result.verdicts) == {("node", "n102")}, [v.message for v in result.verdicts]


def test_a_link_set_down_names_its_node(mesh, fault):
    fault.link_down("n203")
    result = watch(mesh, lambda vs: ("node", "n203") in named(vs))
    assert named(result.verdicts) == {("node", "n203")}, [v.message for v in result.verdicts]


def test_a_rate_limited_node_is_named(mesh, fault):
    fault.rate_limit("n002", "16kbit")
    result = watch(mesh, lambda vs: ("node", "n002") in named(vs))
    assert named(result.verdicts) == {("node", "n002")}, [v.message for v in result.verdicts]


def test_loss_on_a_leaf_uplink_names_the_leaf(mesh, fault):
    fault.leaf_uplink_loss(1, 25)
    result = watch(mesh, lambda vs: ("leaf", "leaf1") in named(vs), windows=8)
    assert named(result.verdicts) == {("leaf", "leaf1")}, [v.message for v in result.verdicts]


def test_ten_percent_loss_on_a_leaf_uplink_names_the_leaf(mesh, fault):
    """With 3 leaves, 4 of the 6 leaf pairs touch the faulty leaf, and TCP recovers most of what is
    dropped by sending the SYN again: that is loss all the same, and the leaf's."""
    fault.leaf_uplink_loss(1, 10)
    result = watch(mesh, lambda vs: ("leaf", "leaf1") in named(vs))
    assert named(result.verdicts) == {("leaf", "leaf1")}, [v.message for v in result.verdicts]
    v = result.verdicts[0]
    assert "loses" in v.message and v.evidence["retransmitted"] > 0, v.message


def test_a_leaf_cut_off_from_the_spine_names_the_leaf(mesh, fault):
    fault.leaf_uplink_loss(2, 100)
    result = watch(mesh, lambda vs: ("leaf", "leaf2") in named(vs))
    assert named(result.verdicts) == {("leaf", "leaf2")}, [v.message for v in result.verdicts]


def test_loss_on_one_leaf_to_leaf_path_names_the_path(mesh, fault):
    fault.path_loss(0, 1, 30)
    paths = {("path", "leaf0->leaf1"), ("path", "leaf1->leaf0")}  # a round trip crosses both directions
    result = watch(mesh, lambda vs: named(vs) & paths)
    assert named(result.verdicts) and named(result.verdicts) <= paths, [v.message for v in result.verdicts]


@pytest.mark.skip(reason="delay faults need netem, which this host kernel lacks; they belong to the QEMU "
                         "guest tier (stock Debian kernel with sch_netem) of the RDMA issue, not built yet")
def test_delay_on_one_node_names_that_node():
    """`tc qdisc add dev eth0 root netem delay 20ms` on one node: its edges' p99 over the baseline."""
