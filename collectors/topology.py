"""Where each GPU and RDMA NIC hangs in the PCIe tree (sysfs), and how each GPU reaches its nearest NIC.

GPUDirect RDMA moves data between a GPU and a NIC over PCIe peer-to-peer: through a shared PCIe
switch at full speed, through the CPU's root complex slower, and across the CPU interconnect
(another socket) slowest. The tree is in the path each /sys/bus/pci/devices/ADDR link points to
(/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/.../0000:19:00.0); the NUMA node and the link
width of every port on the way are files there.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from nodehealth.collectors import require_sysfs
from nodehealth.host import HostPaths, list_dir, read_attr
from nodehealth.model import Metric

NAME = "topology"
DEFAULTS: dict = {}

NVIDIA, MELLANOX = "0x10de", "0x15b3"
PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
ROOT_BUS = re.compile(r"pci([0-9a-f]{4}:[0-9a-f]{2})\Z")
# How a GPU reaches a NIC, nearest first (nvidia-smi topo -m: PIX/PXB, PHB, NODE, SYS).
RELATIONS = ("same_switch", "same_root_complex", "same_numa_node", "across_numa_nodes", "unknown")
MAX_DEPTH = 16  # deeper than any real PCIe hierarchy: a looping or garbled tree


@dataclass(frozen=True)
class Port:
    """A link on the way from a device up to its root port: the device's own, then each bridge's."""

    address: str
    current_width: int | None
    max_width: int | None


@dataclass(frozen=True)
class Endpoint:
    address: str
    kind: str  # gpu or nic
    root_bus: str  # 0000:15: the root complex (host bridge) the device hangs below
    ancestors: tuple[str, ...]  # bridges from the root port down to the device's own port
    numa_node: int | None  # None: the kernel does not know (-1)
    ports: tuple[Port, ...]
    rdma_devices: tuple[str, ...] = ()  # mlx5_0: the device's infiniband/ entries


@dataclass(frozen=True)
class Pairing:
    gpu: str
    nic: str
    relation: str


@dataclass(frozen=True)
class Topology:
    gpus: tuple[Endpoint, ...]
    nics: tuple[Endpoint, ...]
    nearest: tuple[Pairing, ...]  # each GPU's nearest RDMA NIC


def supported(host: HostPaths, cfg: dict) -> str | None:
    if host.sysfs_missing():
        return None  # collect() says why: unknown, not absent
    root = host.sys("bus", "pci", "devices")
    if not any(os.path.islink(os.path.join(root, a)) for a in list_dir(root)):
        return "no PCIe tree in sysfs (bus/pci/devices holds no links into devices/)"
    return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _endpoint(host: HostPaths, address: str, kind: str) -> Endpoint | None:
    link = host.sys("bus", "pci", "devices", address)
    target = os.path.normpath(os.path.join(os.path.dirname(link), os.readlink(link)))
    parts = target.split(os.sep)
    roots = [i for i, p in enumerate(parts) if ROOT_BUS.match(p)]
    if not roots or parts[-1] != address:
        return None
    chain = parts[roots[-1] + 1:]
    if not chain or len(chain) > MAX_DEPTH or not all(PCI_ADDRESS.match(p) for p in chain):
        return None
    ports = []
    for depth in range(len(chain), 0, -1):  # the device, then each bridge above it
        path = os.sep.join(parts[:roots[-1] + 1] + chain[:depth])
        ports.append(Port(chain[depth - 1], _int(read_attr(os.path.join(path, "current_link_width"))),
                          _int(read_attr(os.path.join(path, "max_link_width")))))
    numa = _int(read_attr(os.path.join(target, "numa_node")))
    rdma = tuple(sorted(list_dir(os.path.join(target, "infiniband"))))
    return Endpoint(address, kind, ROOT_BUS.match(parts[roots[-1]]).group(1), tuple(chain[:-1]),
                    numa if numa is not None and numa >= 0 else None, tuple(ports), rdma)


def _shared(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """How many bridges two devices share from the root port down."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def relation(gpu: Endpoint, nic: Endpoint) -> str:
    """Below one switch when they share a bridge under the root port (the root port alone is not a
    switch); else one root complex, one NUMA node, or not."""
    if gpu.root_bus == nic.root_bus and _shared(gpu.ancestors, nic.ancestors) >= 2:
        return "same_switch"
    if gpu.root_bus == nic.root_bus:
        return "same_root_complex"
    if gpu.numa_node is None or nic.numa_node is None:
        return "unknown"
    return "same_numa_node" if gpu.numa_node == nic.numa_node else "across_numa_nodes"


def _distance(gpu: Endpoint, nic: Endpoint) -> int:
    if gpu.root_bus != nic.root_bus:
        return len(gpu.ancestors) + len(nic.ancestors)
    return len(gpu.ancestors) + len(nic.ancestors) - 2 * _shared(gpu.ancestors, nic.ancestors)


def collect(host: HostPaths, cfg: dict) -> Topology:
    require_sysfs(host)
    root = host.sys("bus", "pci", "devices")
    gpus, nics = [], []
    for address in sorted(list_dir(root)):
        if not PCI_ADDRESS.match(address) or not os.path.islink(os.path.join(root, address)):
            continue
        vendor = read_attr(os.path.join(root, address, "vendor"))
        cls = read_attr(os.path.join(root, address, "class")) or ""
        if vendor == NVIDIA and cls.startswith(("0x0300", "0x0302")):
            kind = "gpu"
        elif (vendor == MELLANOX and cls.startswith(("0x0200", "0x0207"))) or \
                os.path.isdir(os.path.join(root, address, "infiniband")):
            kind = "nic"
        else:
            continue
        endpoint = _endpoint(host, address, kind)
        if endpoint is not None:
            (gpus if kind == "gpu" else nics).append(endpoint)
    nearest = []
    for gpu in gpus:
        ranked = sorted(nics, key=lambda n: (RELATIONS.index(relation(gpu, n)), _distance(gpu, n), n.address))
        if ranked:
            nearest.append(Pairing(gpu.address, ranked[0].address, relation(gpu, ranked[0])))
    return Topology(tuple(gpus), tuple(nics), tuple(nearest))


def metrics(facts: Topology) -> list[Metric]:
    pairing = Metric("nodehealth_gpu_nic_relation",
                     "How each GPU reaches its nearest RDMA NIC in the PCIe tree: 0 same switch, 1 same root "
                     "complex, 2 same NUMA node, 3 across NUMA nodes (the CPU interconnect), 4 unknown "
                     "(nvidia-smi topo -m: PIX/PXB, PHB, NODE, SYS).", labels=("pci_bus_id", "nic"))
    for p in facts.nearest:
        pairing.add((p.gpu, p.nic), RELATIONS.index(p.relation))
    numa = Metric("nodehealth_pcie_device_numa_node", "NUMA node of each GPU and RDMA NIC (sysfs numa_node).",
                  labels=("pci_bus_id", "kind"))
    for e in facts.gpus + facts.nics:
        numa.add((e.address, e.kind), e.numa_node)
    return [pairing, numa]
