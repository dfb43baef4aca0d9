"""GPUDirect RDMA paths: a GPU whose NIC is across the CPU interconnect, a narrowed switch port on the way."""
from __future__ import annotations

from nodehealth.collectors.topology import Endpoint, Topology, relation
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "gpu_nic"
NEEDS = ("topology",)
SUBSYSTEM = "network"  # a GPU far from its RDMA NIC slows GPUDirect RDMA, i.e. the network
DEBOUNCE = False  # the tree does not change while the node runs

DEFAULTS: dict = {
    # The NIC each GPU's RDMA traffic uses, by PCI address ({"0000:19:00.0": "0000:1a:00.0"}), as the
    # job's NCCL_IB_HCA or the fabric plan assigns it; a GPU not listed uses its nearest RDMA NIC.
    "designated_nics": {},
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "designated_nics": ("the NIC each GPU's RDMA traffic uses, by PCI address "
                        "(`{\"0000:19:00.0\": \"0000:1a:00.0\"}`); a GPU not listed uses its nearest RDMA NIC"),
}
SOURCE = "the sysfs PCIe tree (`/sys/devices/pci*`, through the `/sys/bus/pci/devices` links)"
FINDS = ("a GPU whose RDMA NIC (`designated_nics`, else its nearest: same switch, same root complex, same NUMA "
         "node, across) is across the CPU interconnect; a narrowed link between a PCIe switch and the CPU above a "
         "GPU or NIC (GPUDirect RDMA then crawls)")
REASONS = {
    "GpuNicAcrossSockets": Reason(Severity.DEGRADED, Action.FIX_CONFIG,
                                  "a GPU's RDMA NIC is on another NUMA node: GPUDirect RDMA crosses the CPU "
                                  "interconnect"),
    "UpstreamLinkNarrowed": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                                   "the PCIe link above a GPU's or NIC's switch runs narrower than its max"),
    "DesignatedNicMissing": Reason(Severity.UNKNOWN, Action.FIX_CONFIG,
                                   "a NIC in `designated_nics` is not in the PCIe tree"),
}


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    facts: Topology = obs.facts["topology"]
    nics = {n.address: n for n in facts.nics}
    nearest = {p.gpu: p.nic for p in facts.nearest}
    designated = cfg["designated_nics"] if isinstance(cfg["designated_nics"], dict) else {}
    findings: list[Finding] = []
    for gpu in facts.gpus:
        nic_address = designated.get(gpu.address, nearest.get(gpu.address))
        nic = nics.get(nic_address)
        if nic_address is not None and nic is None:
            findings.append(Finding(NAME, Severity.UNKNOWN, "DesignatedNicMissing",
                                    f"GPU {gpu.address}'s designated NIC {nic_address} is not in the PCIe tree.",
                                    device=gpu.address, action=Action.FIX_CONFIG))
            continue
        if nic is not None and relation(gpu, nic) == "across_numa_nodes":
            findings.append(Finding(
                NAME, Severity.DEGRADED, "GpuNicAcrossSockets",
                f"GPU {gpu.address} (NUMA node {gpu.numa_node}) sends its RDMA traffic through NIC {nic.address} "
                f"(NUMA node {nic.numa_node}), across the CPU interconnect: GPUDirect RDMA runs at a fraction of "
                "its speed there. Pair the GPU with a NIC on its own socket (NCCL_IB_HCA, the rail plan).",
                device=gpu.address, action=Action.FIX_CONFIG,
                evidence={"nic": nic.address, "gpu_numa_node": gpu.numa_node, "nic_numa_node": nic.numa_node}))
    for endpoint in facts.gpus + facts.nics:
        findings.extend(_narrow_ports(endpoint))
    return findings


def _narrow_ports(e: Endpoint) -> list[Finding]:
    """A narrowed link above the device's own (ports[0] and ports[1] are the two ends of that one,
    which the pcie and gpu_pcie checks judge): the switch's link to the CPU, shared by all below it."""
    for port in e.ports[2:]:
        if port.current_width is not None and port.max_width is not None and port.current_width < port.max_width:
            what = "GPU" if e.kind == "gpu" else "NIC"
            return [Finding(
                NAME, Severity.DEGRADED, "UpstreamLinkNarrowed",
                f"The PCIe link of port {port.address} above {what} {e.address} runs at x{port.current_width} of "
                f"x{port.max_width}: every transfer of the {what} through it, GPUDirect RDMA included, gets "
                f"{port.current_width / port.max_width:.0%} of the bandwidth. Reseat the switch board or riser.",
                device=e.address, action=Action.HW_INSPECTION,
                evidence={"port": port.address, "current_width": port.current_width, "max_width": port.max_width})]
    return []
