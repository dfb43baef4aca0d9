"""GPU-NIC topology from the sysfs PCIe tree of a real H100 + ConnectX-7 host (built from its lspci -vvv)."""
from __future__ import annotations

import importlib.util
import os

from conftest import HERE
from test_machines import compare

from nodehealth import exporter
from nodehealth.checks import gpu_nic
from nodehealth.collectors import topology
from nodehealth.collectors.topology import Endpoint, relation
from nodehealth.host import HostPaths
from nodehealth.model import Observed, Severity

TREES = os.path.join(HERE, "fixtures", "topology")
H100 = os.path.join(TREES, "h100-8x-cx7")


def facts(root: str = H100):
    host = HostPaths(root)
    assert topology.supported(host, {}) is None
    return topology.collect(host, {})


def judge(f, **cfg):
    return gpu_nic.judge(Observed({"topology": f}, {}, 0.0), {**gpu_nic.DEFAULTS, **cfg})


def test_each_h100_shares_a_switch_with_its_connectx7():
    f = facts()
    assert [(p.gpu, p.nic, p.relation) for p in f.nearest] == [
        ("0000:19:00.0", "0000:1a:00.0", "same_switch"), ("0000:3b:00.0", "0000:3c:00.0", "same_switch"),
        ("0000:4c:00.0", "0000:4d:00.0", "same_switch"), ("0000:5d:00.0", "0000:5e:00.0", "same_switch"),
        ("0000:9b:00.0", "0000:9c:00.0", "same_switch"), ("0000:bb:00.0", "0000:bc:00.0", "same_switch"),
        ("0000:cb:00.0", "0000:cc:00.0", "same_switch"), ("0000:db:00.0", "0000:dc:00.0", "same_switch")]
    gpu = {g.address: g for g in f.gpus}
    assert gpu["0000:19:00.0"].ancestors == ("0000:15:01.0", "0000:16:00.0", "0000:17:01.0")
    assert (gpu["0000:19:00.0"].numa_node, gpu["0000:db:00.0"].numa_node) == (0, 1)
    nic = {n.address: n for n in f.nics}
    assert relation(gpu["0000:19:00.0"], nic["0000:3c:00.0"]) == "same_numa_node"  # another switch and root port
    assert relation(gpu["0000:19:00.0"], nic["0000:dc:00.0"]) == "across_numa_nodes"
    assert judge(f) == []


def endpoint(root_bus: str, ancestors: tuple, numa):
    return Endpoint("0000:99:00.0", "nic", root_bus, ancestors, numa, ())


def test_relations_nearest_first():
    gpu = endpoint("0000:15", ("0000:15:01.0", "0000:16:00.0", "0000:17:01.0"), 0)
    assert relation(gpu, endpoint("0000:15", ("0000:15:01.0", "0000:16:00.0", "0000:17:02.0"), 0)) == "same_switch"
    assert relation(gpu, endpoint("0000:15", ("0000:15:03.0",), 0)) == "same_root_complex"
    assert relation(gpu, endpoint("0000:37", ("0000:37:01.0",), 0)) == "same_numa_node"
    assert relation(gpu, endpoint("0000:97", ("0000:97:01.0",), 1)) == "across_numa_nodes"
    assert relation(gpu, endpoint("0000:97", ("0000:97:01.0",), None)) == "unknown"


def test_a_designated_nic_across_the_cpu_interconnect_is_a_finding():
    [finding] = judge(facts(), designated_nics={"0000:19:00.0": "0000:9c:00.0"})
    assert (finding.reason, finding.severity, finding.device) == ("GpuNicAcrossSockets", Severity.DEGRADED,
                                                                  "0000:19:00.0")
    assert "NUMA node 0" in finding.message and "NUMA node 1" in finding.message
    [missing] = judge(facts(), designated_nics={"0000:19:00.0": "0000:ff:00.0"})
    assert (missing.reason, missing.severity) == ("DesignatedNicMissing", Severity.UNKNOWN)


def test_a_narrowed_switch_link_is_a_finding_for_each_device_below_it():
    findings = judge(facts(os.path.join(TREES, "h100-8x-cx7-switch-x8")))
    assert {(f.reason, f.device) for f in findings} == {
        ("UpstreamLinkNarrowed", a) for a in ("0000:19:00.0", "0000:1a:00.0", "0000:1b:00.0", "0000:1b:00.1")}
    assert all(f.evidence["port"] == "0000:16:00.0" and f.evidence["current_width"] == 8 for f in findings)


def test_metrics():
    text = exporter.render(topology.metrics(facts())).decode()
    compare("topology.metrics.txt", text)
    assert 'nodehealth_gpu_nic_relation{pci_bus_id="0000:19:00.0",nic="0000:1a:00.0"} 0' in text
    assert 'nodehealth_pcie_device_numa_node{pci_bus_id="0000:dc:00.0",kind="nic"} 1' in text


def test_flat_sysfs_or_garbled_links_are_not_a_tree(tmp_path):
    flat = tmp_path / "flat" / "sys" / "bus" / "pci" / "devices" / "0000:19:00.0"
    flat.mkdir(parents=True)
    assert "no PCIe tree" in topology.supported(HostPaths(str(tmp_path / "flat")), {})
    devices = tmp_path / "odd" / "sys" / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    target = tmp_path / "odd" / "sys" / "devices" / "platform" / "0000:19:00.0"  # no pciDDDD:BB root
    target.mkdir(parents=True)
    (target / "vendor").write_text("0x10de\n")
    (target / "class").write_text("0x030200\n")
    os.symlink(os.path.relpath(target, devices), devices / "0000:19:00.0")
    f = topology.collect(HostPaths(str(tmp_path / "odd")), {})
    assert f.gpus == () and f.nearest == ()


def test_trees_are_the_builders_output(tmp_path):
    spec = importlib.util.spec_from_file_location("build_tree", os.path.join(TREES, "build_tree.py"))
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    assert builder.main(["--out", str(tmp_path)]) == 0
    for name in builder.TREES:
        for directory, _, files in os.walk(os.path.join(TREES, name)):
            for file in files:
                committed = os.path.join(directory, file)
                built = os.path.join(tmp_path, os.path.relpath(committed, TREES))
                if os.path.islink(committed):
                    assert os.readlink(built) == os.readlink(committed)
                else:
                    with open(committed) as a, open(built) as b:
                        assert a.read() == b.read(), committed
