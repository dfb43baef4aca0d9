"""`nodehealth netcheck` end to end over TCP: six agents in network namespaces under two leaves.

The coordinator reaches the agents over the management network; their tests stream over the data
network, where the faults are: a tbf rate limit makes a slow node, nftables dropping everything
that reaches a node's data interface (or its cable set down) makes a broken one. One topology and
one set of agents serve every scenario; each scenario clears the faults it made.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import require_netns, unavailable
from netns.topology import Topology, Unavailable, sh

PORT = 18600
SECONDS = "0.5"



@pytest.fixture(scope="module")
def topo():
    require_netns()
    t = Topology(leaves=2, per_leaf=3)
    agents = []
    try:
        try:
            t.build()
        except Unavailable as e:
            unavailable(str(e))
        for n in t.nodes:
            agents.append(subprocess.Popen(
                ["ip", "netns", "exec", n.ns, sys.executable, "-m", "nodehealth.cli", "netcheck", "serve",
                 "--listen", f"{n.mgmt}:{PORT}", "--data", f"{n.address}:{PORT}", "--name", n.name, "--for", "600"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(_listening(n) for n in t.nodes):
            time.sleep(0.2)
        yield t
    finally:
        for a in agents:
            a.terminate()
        for a in agents:
            a.wait(10)
        t.close()


def _listening(n) -> bool:
    return f"{n.mgmt}:{PORT}" in sh("ss", "-ltnH", ns=n.ns, check=False)


def netcheck(topo, *extra, inventory=None):
    hosts = ",".join(f"{n.mgmt}:{PORT}" for n in topo.nodes)
    cmd = [sys.executable, "-m", "nodehealth.cli", "netcheck", "run", "--hosts", hosts, "--seconds", SECONDS, *extra]
    if inventory:
        cmd += ["--inventory", inventory]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def fault(topo):
    yield topo
    topo.clear_faults()


def test_clean_network_all_sound(topo, tmp_path):
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps(topo.inventory()))
    rc, out, err = netcheck(topo, "--json", inventory=str(inv))
    doc = json.loads(out)
    assert rc == 0, out
    assert doc["method"] == "tcp" and doc["rounds"] == 1
    assert {n["status"] for n in doc["nodes"].values()} == {"sound"}
    partners = {name: node["tests"][0]["partner"] for name, node in doc["nodes"].items()}
    # same leaf first; each leaf's odd node out meets the other leaf's
    assert partners["n000"] == "n001" and partners["n100"] == "n101" and partners["n002"] == "n102"


def test_rate_limited_node_is_slow(fault):
    fault.rate_limit("n101", "40mbit")
    rc, out, err = netcheck(fault, "--json")
    doc = json.loads(out)
    assert rc == 1, (out, err)
    assert doc["slow"] == ["n101"] and doc["faulty"] == []
    proof = doc["nodes"]["n101"]["tests"]
    assert any(t["outcome"] == "slow" and doc["nodes"][t["partner"]]["status"] == "sound" for t in proof)


def test_node_dropping_all_data_traffic_is_faulty(fault):
    n = fault.node("n002")
    sh("nft", "-f", "-", ns=n.ns, stdin='table inet nhfault {\n chain input {\n  type filter hook input priority -10\n'
                                        '  iifname "eth0" drop\n }\n}\n')
    rc, out, err = netcheck(fault)
    assert rc == 1, (out, err)
    assert "faulty: n002;" in out and "slow: none" in out
    assert "TCP" in out  # labelled as the TCP test, not RDMA
    row = next(line for line in out.splitlines() if line.startswith("n002 "))
    assert "faulty" in row and "fail" in row


def test_broken_and_slow_node_together_cable_down(fault):
    fault.link_down("n000")
    fault.rate_limit("n102", "40mbit")
    rc, out, err = netcheck(fault, "--json")
    doc = json.loads(out)
    assert rc == 1, (out, err)
    assert doc["faulty"] == ["n000"] and doc["slow"] == ["n102"]
    assert doc["nodes"]["n001"]["status"] == "sound"
    errors = [t["error"] for t in doc["nodes"]["n000"]["tests"]]
    assert errors and all(e.split(" -> ")[0] in doc["nodes"] for e in errors), errors  # who sent, to whom


def test_unreachable_agent_and_bad_usage(topo):
    rc, out, err = netcheck(topo, "--hosts", f"{topo.nodes[0].mgmt}:{PORT},10.78.0.250:{PORT}", "--json")
    # the second --hosts wins: one agent answers, the other is listed as unreachable
    doc = json.loads(out)
    assert rc == 2 and doc["unreachable"][0]["agent"] == f"10.78.0.250:{PORT}"
    p = subprocess.run([sys.executable, "-m", "nodehealth.cli", "netcheck", "run", "--hosts", "nocolon"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "not HOST:PORT" in p.stderr


def test_job_on_every_node_names_the_broken_and_the_missing_node(fault):
    """`netcheck job` in five of the six namespaces (the sixth never starts), given the management
    addresses as the host list and tested over the data network, where n002 drops everything: every
    node prints the same verdict and exits 1."""
    n = fault.node("n002")
    sh("nft", "-f", "-", ns=n.ns, stdin='table inet nhfault {\n chain input {\n  type filter hook input priority -10\n'
                                        '  iifname "eth0" drop\n }\n}\n')
    hosts = ",".join(node.mgmt for node in fault.nodes)
    absent = fault.node("n102")
    procs = {node.name: subprocess.Popen(
        ["ip", "netns", "exec", node.ns, sys.executable, "-m", "nodehealth.cli", "netcheck", "job", "--hosts", hosts,
         "--port", str(PORT + 20), "--data", node.address, "--name", node.name, "--seconds", SECONDS, "--wait", "8",
         "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in fault.nodes if node is not absent}
    results = {name: (*p.communicate(timeout=90), p.returncode) for name, p in procs.items()}
    for name, (out, err, rc) in results.items():
        assert rc == 1, (name, out, err)
        doc = json.loads(out)
        assert doc["faulty"] == ["n002"] and doc["slow"] == [], (name, doc)
        assert doc["missing"] == [{"node": absent.mgmt, "error": "never joined within 8 s"}]
        assert doc["coordinator"] == fault.nodes[0].mgmt and doc["method"] == "tcp"
        assert doc["nodes"]["n001"]["status"] == "sound"
