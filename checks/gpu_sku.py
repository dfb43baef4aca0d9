"""What each NVIDIA data-center GPU should look like, and the few helpers the GPU checks share.

The checks compare what NVML reports with these expectations: a link count or a PCIe generation
means nothing without knowing the product. A GPU is matched by its product name; a product not in
the table gets None, and the checks that need an expectation then say nothing about it.

Sources: docs/sources.md, "GPU models" (NVLink links and per-link speed as `nvidia-smi nvlink -s`
and NVML's link-speed field give them, in MB/s; PCIe generation and width from real `nvidia-smi -q`
outputs' `Max` lines or, where named, the product's data sheet; minimum drivers as the first driver
branch that knows the architecture). Where a value is not verified, it is None and nothing is judged
against it.
"""
from __future__ import annotations

from dataclasses import dataclass

from nodehealth.collectors.gpu_facts import Gpu
from nodehealth.model import Action, Finding, Reason, Severity

# First driver branches per architecture. Ampere: R450, the first data-center branch whose release
# notes (450.51.05) list A100 VBIOS versions. Hopper: R520 (CUDA 11.8, the first with sm_90), from
# the project brief, not checked against release notes. Blackwell: R570, the branch of the first
# HGX B200/GB200 support (NVIDIA/cloud-native-docs PR #184).
AMPERE_DRIVER = (450,)
HOPPER_DRIVER = (520,)
BLACKWELL_DRIVER = (570,)
# HGX B200 needs driver 570.133.20 or later (NVIDIA/cloud-native-docs PR #184, GPU Operator docs).
HGX_B200_DRIVER = (570, 133, 20)

A100_LINK_MBPS = 25000  # section 6: 25 GB/s; gpud's 8x A100-SXM4-80GB `nvlink --status` shows 25 GB/s
NVLINK4_LINK_MBPS = 26562  # section 6: 26.562 GB/s; HV checks expect 26562 MB/s on H100
NVLINK5_LINK_MBPS = 53125  # section 6: 53.125 GB/s; HV checks expect 53125 MB/s on GB200/GB300


@dataclass(frozen=True)
class GpuSku:
    name: str
    patterns: tuple[str, ...]  # product-name fragments, matched as whole words (see match_sku)
    architecture: str
    nvlinks: int | None = None  # active NVLinks expected; None: no expectation (PCIe cards: bridges are optional)
    nvlink_speed_mbps: int | None = None  # per-link speed expected on every active link
    pcie_gen: int | None = None  # PCIe generation and width the GPU should reach in its slot
    pcie_width: int | None = None
    min_driver: tuple[int, ...] | None = None  # lowest driver version, (branch,) or (branch, minor, patch)


SKUS: tuple[GpuSku, ...] = (
    # Volta: 6 links (section 6); per-link speed ~25.8 GB/s is unverified, so not judged.
    # Gen3 x16 from thamada/V100_x8.nvidia-smi-a.txt.
    GpuSku("V100 SXM2", ("V100 SXM2",), "volta", nvlinks=6, pcie_gen=3, pcie_width=16),
    # Gen4 x16 from thamada/A100SXMx4.nvidia-smi-a.txt; "A100-SXM-64GB" style names included.
    GpuSku("A100 SXM4", ("A100 SXM4", "A100 SXM"), "ampere", nvlinks=12, nvlink_speed_mbps=A100_LINK_MBPS,
           pcie_gen=4, pcie_width=16, min_driver=AMPERE_DRIVER),
    # PCIe Gen4 x16 from the A100 PCIe data sheet (not in the notes).
    GpuSku("A100 PCIe", ("A100 PCIe", "A100 80GB PCIe"), "ampere", pcie_gen=4, pcie_width=16,
           min_driver=AMPERE_DRIVER),
    # A800: 8 links is inferred from 400 GB/s total (unverified); PCIe as the A100 (same GA100, inferred).
    # Driver: the A800 came after R450 and which branch first knows it is not in the notes: not judged.
    GpuSku("A800 SXM4", ("A800 SXM4", "A800 SXM"), "ampere", nvlinks=8, nvlink_speed_mbps=A100_LINK_MBPS,
           pcie_gen=4, pcie_width=16),
    GpuSku("A800 PCIe", ("A800 PCIe", "A800 80GB PCIe", "A800 40GB PCIe"), "ampere", pcie_gen=4, pcie_width=16),
    # H100 SXM5 reports "NVIDIA H100 80GB HBM3"; Gen5 x16 from thamada/H100SXMx8.nvidia-smi-a.txt.
    GpuSku("H100 SXM5", ("H100 80GB HBM3", "H100 SXM5", "H100 SXM"), "hopper", nvlinks=18,
           nvlink_speed_mbps=NVLINK4_LINK_MBPS, pcie_gen=5, pcie_width=16, min_driver=HOPPER_DRIVER),
    # H100 PCIe: Gen5 x16 from its data sheet (not in the notes).
    GpuSku("H100 PCIe", ("H100 PCIe",), "hopper", pcie_gen=5, pcie_width=16, min_driver=HOPPER_DRIVER),
    # H100 NVL: Gen5 x16 from thamada/H100NVLx2.nvidia-smi-a.txt; NVLink only through optional bridges.
    GpuSku("H100 NVL", ("H100 NVL",), "hopper", pcie_gen=5, pcie_width=16, min_driver=HOPPER_DRIVER),
    # H800 SXM reports "NVIDIA H800": 8 links at 26.562 GB/s and Gen5 x16 in llm-action/h800.* (driver 525).
    GpuSku("H800 SXM5", ("H800",), "hopper", nvlinks=8, nvlink_speed_mbps=NVLINK4_LINK_MBPS, pcie_gen=5,
           pcie_width=16, min_driver=HOPPER_DRIVER),
    GpuSku("H800 PCIe", ("H800 PCIe",), "hopper", pcie_gen=5, pcie_width=16, min_driver=HOPPER_DRIVER),
    # H200 SXM reports "NVIDIA H200": Gen5 x16 from thamada/H200.nvidia-smi-a.txt; 18 links (section 6).
    GpuSku("H200 SXM", ("H200",), "hopper", nvlinks=18, nvlink_speed_mbps=NVLINK4_LINK_MBPS, pcie_gen=5,
           pcie_width=16, min_driver=HOPPER_DRIVER),
    # H200 NVL is a PCIe card; its PCIe generation is not in the notes.
    GpuSku("H200 NVL", ("H200 NVL",), "hopper", min_driver=HOPPER_DRIVER),
    # H20: 18 links (section 6); PCIe not in the notes.
    GpuSku("H20", ("H20",), "hopper", nvlinks=18, nvlink_speed_mbps=NVLINK4_LINK_MBPS, min_driver=HOPPER_DRIVER),
    # GH200: the GPU hangs off Grace by NVLink-C2C (thamada/GH200.nvidia-smi-a.txt shows PCIe Gen4 x1), and
    # whether its NVLinks are wired depends on the system: no link or PCIe expectation.
    GpuSku("GH200", ("GH200",), "hopper", min_driver=HOPPER_DRIVER),
    # B200: 18 links at 53.125 GB/s (section 6); the host PCIe generation of HGX B200 boards is not in the notes.
    GpuSku("B200", ("B200",), "blackwell", nvlinks=18, nvlink_speed_mbps=NVLINK5_LINK_MBPS,
           min_driver=HGX_B200_DRIVER),
    GpuSku("GB200", ("GB200",), "blackwell", nvlinks=18, nvlink_speed_mbps=NVLINK5_LINK_MBPS,
           min_driver=BLACKWELL_DRIVER),
    # B300/GB300: links from section 6 and the HV checks; their first driver branch is not in the notes.
    GpuSku("B300", ("B300",), "blackwell", nvlinks=18, nvlink_speed_mbps=NVLINK5_LINK_MBPS),
    GpuSku("GB300", ("GB300",), "blackwell", nvlinks=18, nvlink_speed_mbps=NVLINK5_LINK_MBPS),
)


def _words(text: str) -> str:
    """Lower case, with runs of spaces, hyphens and underscores as one space, padded: ` a100 sxm4 80gb `."""
    return " " + " ".join(text.lower().replace("-", " ").replace("_", " ").split()) + " "


def match_sku(product_name: str | None) -> GpuSku | None:
    """The SKU whose longest pattern appears in the product name as whole words; None when none does.

    Whole words keep "H20" from matching "H200" and "B200" from matching "GB200"; the longest match
    tells "NVIDIA H100 NVL" (H100 NVL) from "NVIDIA H100 80GB HBM3" (H100 SXM5).
    """
    if not product_name:
        return None
    name = _words(product_name)
    best: GpuSku | None = None
    best_length = 0
    for sku in SKUS:
        for pattern in sku.patterns:
            words = _words(pattern)
            if words in name and len(words) > best_length:
                best, best_length = sku, len(words)
    return best


def device_of(gpu: Gpu) -> str:
    """The finding's device: the PCI address (joins the kernel log's Xid findings), else the UUID."""
    return gpu.pci_bus_id or gpu.uuid or f"GPU {gpu.index}"


# The reason of unknown_findings, in the REASONS of every check that calls it.
FACTS_UNKNOWN = Reason(Severity.UNKNOWN, Action.NONE, "NVML did not answer for a group of facts this pass; if it "
                       "lasts, the GPU or driver may be hung")


def unknown_findings(check: str, gpu: Gpu, groups: tuple[str, ...]) -> list[Finding]:
    """One `unknown` finding naming the fact groups this check needs that NVML could not produce."""
    missing = sorted(g for g in groups if g in gpu.unknown)
    if not missing:
        return []
    why = ", ".join(f"{g} ({gpu.unknown[g]})" for g in missing)
    return [Finding(
        check, Severity.UNKNOWN, "GpuFactsUnknown",
        f"Could not judge {gpu.label}: NVML did not answer for {why} this pass; if this lasts, the GPU or "
        "driver may be hung (check the kernel log for Xids).",
        device=device_of(gpu), evidence={"unknown": {g: gpu.unknown[g] for g in missing}})]
