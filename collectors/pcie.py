"""PCIe link state and AER error counts of the devices a GPU node lives on.

Only GPUs, NVSwitches, NICs and NVMe drives are kept (a bounded set: chipset functions, bridges
and the like are skipped after one read of their class). Per device: trained vs. capable link
speed and width, the upstream port's capability (a card in a slower slot can only do what the
slot does), and the kernel's AER counters.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from nodehealth.collectors import require_sysfs
from nodehealth.host import HostPaths, list_dir, read_attr
from nodehealth.model import Metric

NAME = "pcie"
DEFAULTS: dict = {}

NVIDIA = 0x10DE
HEX_DIGITS = re.compile(r"[0-9a-fA-F]+\Z")
PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
AER_SEVERITIES = ("fatal", "nonfatal", "correctable")
KIND_LABELS = {"gpu": "GPU", "nvswitch": "NVSwitch", "nic": "NIC", "nvme": "NVMe"}


@dataclass(frozen=True)
class AerCounts:
    """One aer_dev_* file: the kernel's total (TOTAL_ERR_*) and its per-error-type lines."""

    total: int | None
    by_type: dict[str, int]


@dataclass(frozen=True)
class PciDevice:
    address: str  # 0000:3b:00.0
    kind: str  # gpu, nvswitch, nic, nvme
    vendor_id: int | None
    device_id: int | None
    current_speed_gts: float | None
    max_speed_gts: float | None
    current_width: int | None
    max_width: int | None
    parent_address: str | None  # the upstream bridge port, when the device sits below one
    parent_max_speed_gts: float | None
    parent_max_width: int | None
    aer: dict[str, AerCounts]  # by severity: fatal, nonfatal, correctable; absent when unreadable

    @property
    def label(self) -> str:
        return f"{self.address} ({KIND_LABELS.get(self.kind, self.kind)})"

    def aer_total(self, severity: str) -> int | None:
        counts = self.aer.get(severity)
        return None if counts is None else counts.total


@dataclass(frozen=True)
class Pcie:
    devices: tuple[PciDevice, ...]


def supported(host: HostPaths, cfg: dict):
    if host.sysfs_missing():
        return None  # collect() says why: unknown, not absent
    if not os.path.isdir(host.sys("bus", "pci", "devices")):
        return "no PCI bus in sysfs (/sys/bus/pci/devices is missing)"
    return None


def kind_of(pci_class: int, vendor_id: int | None) -> str | None:
    """Which device of interest a class code (0xCCSSPP) is, or None to skip it."""
    base = pci_class >> 8
    if base in (0x0300, 0x0302) and vendor_id == NVIDIA:
        return "gpu"
    if base == 0x0680 and vendor_id == NVIDIA:
        return "nvswitch"
    if base in (0x0200, 0x0207):
        return "nic"
    if base == 0x0108:
        return "nvme"
    return None


def parse_hex(text: str | None) -> int | None:
    """`0x10de` -> 0x10de; anything else -> None."""
    if text is None or not text.startswith("0x") or not HEX_DIGITS.match(text, 2):
        return None
    return int(text[2:], 16)


def parse_speed(text: str | None) -> float | None:
    """`32.0 GT/s PCIe` (older kernels: `8 GT/s`) -> 32.0; `Unknown` and anything else -> None."""
    if text is None:
        return None
    parts = text.split()
    if len(parts) < 2 or not parts[1].startswith("GT/s"):
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def parse_width(text: str | None) -> int | None:
    """`16` -> 16 lanes (0 when the link is down); anything else -> None."""
    if text is None or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def parse_aer(text: str | None) -> AerCounts | None:
    """aer_dev_* text: `NAME count` lines and a `TOTAL_ERR_*` line; None when nothing parses."""
    if text is None:
        return None
    total = None
    by_type: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[1].isascii() or not parts[1].isdigit():
            continue
        if parts[0].startswith("TOTAL_"):
            total = int(parts[1])
        else:
            by_type[parts[0]] = int(parts[1])
    if total is None and not by_type:
        return None
    return AerCounts(total, by_type)


def _parent(directory: str) -> str | None:
    """The upstream bridge's directory: the device's parent in the real /sys/devices tree."""
    parent = os.path.dirname(os.path.realpath(directory))
    return parent if PCI_ADDRESS.match(os.path.basename(parent)) else None


def _read_device(address: str, directory: str, kind: str, vendor_id: int | None) -> PciDevice:
    prefix = directory + "/"
    parent = _parent(directory)
    aer = {}
    for severity, file_name in zip(AER_SEVERITIES, ("aer_dev_fatal", "aer_dev_nonfatal", "aer_dev_correctable")):
        counts = parse_aer(read_attr(prefix + file_name))
        if counts is not None:
            aer[severity] = counts
    return PciDevice(
        address=address, kind=kind, vendor_id=vendor_id, device_id=parse_hex(read_attr(prefix + "device")),
        current_speed_gts=parse_speed(read_attr(prefix + "current_link_speed")),
        max_speed_gts=parse_speed(read_attr(prefix + "max_link_speed")),
        current_width=parse_width(read_attr(prefix + "current_link_width")),
        max_width=parse_width(read_attr(prefix + "max_link_width")),
        parent_address=None if parent is None else os.path.basename(parent),
        parent_max_speed_gts=None if parent is None else parse_speed(read_attr(parent + "/max_link_speed")),
        parent_max_width=None if parent is None else parse_width(read_attr(parent + "/max_link_width")),
        aer=aer,
    )


def collect(host: HostPaths, cfg: dict) -> Pcie:
    """A device that vanishes mid-walk is skipped (no class) or keeps None for what it lost."""
    require_sysfs(host)
    root = host.sys("bus", "pci", "devices") + "/"
    devices = []
    for address in list_dir(root):
        directory = root + address
        pci_class = parse_hex(read_attr(directory + "/class"))
        if pci_class is None:
            continue
        vendor_id = parse_hex(read_attr(directory + "/vendor"))
        kind = kind_of(pci_class, vendor_id)
        if kind is not None:
            devices.append(_read_device(address, directory, kind, vendor_id))
    return Pcie(tuple(devices))


def aer_key(device: PciDevice, severity: str) -> str:
    return f"{device.address}:aer_{severity}"


def counters(facts: Pcie) -> dict[str, float]:
    """AER totals per device and severity, for per-second rates."""
    out: dict[str, float] = {}
    for device in facts.devices:
        for severity in AER_SEVERITIES:
            total = device.aer_total(severity)
            if total is not None:
                out[aer_key(device, severity)] = total
    return out


def metrics(facts: Pcie) -> list[Metric]:
    labels = ("pci_bus_id", "kind", "bound")
    info = Metric("nodehealth_pcie_device_info",
                  "PCIe device watched by nodehealth, with its vendor and device id; always 1.",
                  labels=("pci_bus_id", "kind", "vendor_id", "device_id"))
    speed = Metric("nodehealth_pcie_link_speed_transfers_per_second",
                   "PCIe link speed per lane: bound=current is what the link trained to, bound=max what the "
                   "device can do.", labels=labels)
    width = Metric("nodehealth_pcie_link_width_lanes",
                   "PCIe link width: bound=current is what the link trained to, bound=max what the device can do.",
                   labels=labels)
    aer = Metric("nodehealth_pcie_aer_errors_total",
                 "PCIe Advanced Error Reporting errors the device reported since boot, by severity.",
                 "counter", labels=("pci_bus_id", "kind", "severity"))
    for d in facts.devices:
        info.add((d.address, d.kind, _hex(d.vendor_id), _hex(d.device_id)), 1)
        for bound, gts, lanes in (("current", d.current_speed_gts, d.current_width),
                                  ("max", d.max_speed_gts, d.max_width)):
            speed.add((d.address, d.kind, bound), None if gts is None else gts * 1e9)
            width.add((d.address, d.kind, bound), lanes)
        for severity in AER_SEVERITIES:
            aer.add((d.address, d.kind, severity), d.aer_total(severity))
    return [info, speed, width, aer]


def _hex(value: int | None) -> str:
    return "" if value is None else f"0x{value:04x}"
