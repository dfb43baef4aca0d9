"""InfiniBand and RoCE ports from /sys/class/infiniband: state, rate, link layer and counters.

Every attribute is read once a pass (bounded, non-blocking; some drivers answer EAGAIN forever to
retries) through a descriptor kept open between passes (host.KeptFiles: a read at offset 0 runs
the attribute's show() again), paths are built by plain concatenation, and no path is checked
before it is read: a pass over an 8-rail node costs its few hundred small reads and little more.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from nodehealth.collectors import require_sysfs
from nodehealth.collectors.pcie import PCI_ADDRESS
from nodehealth.host import HostPaths, KeptFiles, list_dir
from nodehealth.model import Metric

NAME = "infiniband"
DEFAULTS: dict = {}

STATE_ACTIVE = 4
PHYS_STATE_DISABLED = 3
PHYS_STATE_LINK_UP = 5

# port_xmit_data / port_rcv_data (and their counters_ext _64 forms) count 4-byte words.
BYTES_PER_DATA_WORD = 4
BYTES_PER_SECOND_PER_GBPS = 125_000_000

PORT_ATTRIBUTES = ("state", "phys_state", "rate", "link_layer")
DEVICE_ATTRIBUTES = ("fw_ver", "board_id", "hca_type", "node_guid")

# hw_counters/lifespan is the driver's cache time for the other hw counters (ms), not a counter.
NOT_COUNTERS = frozenset({"lifespan"})

# The quantities exported as metrics, each with the counters/ file of kernels >= 4.5 and the
# counters_ext/ file of older kernels, both in the same unit (data in 4-byte words, packets). Where
# both exist the larger wins: a legacy 32-bit counters/ file sticks at its maximum below the _64
# one, while a driver whose counters_ext/ is not kept up reads less than counters/. Metrics and
# rates take the same one.
TRAFFIC = (
    # (metric suffix, counters/ name, counters_ext/ name, multiplier, help)
    ("transmitted_bytes_total", "port_xmit_data", "port_xmit_data_64", BYTES_PER_DATA_WORD,
     "Data bytes transmitted on the port."),
    ("received_bytes_total", "port_rcv_data", "port_rcv_data_64", BYTES_PER_DATA_WORD,
     "Data bytes received on the port."),
    ("transmitted_packets_total", "port_xmit_packets", "port_xmit_packets_64", 1,
     "Packets transmitted on the port, on all virtual lanes."),
    ("received_packets_total", "port_rcv_packets", "port_rcv_packets_64", 1,
     "Packets received on the port, on all virtual lanes, errors included."),
    ("unicast_transmitted_packets_total", "unicast_xmit_packets", "port_unicast_xmit_packets", 1,
     "Unicast packets transmitted on the port."),
    ("unicast_received_packets_total", "unicast_rcv_packets", "port_unicast_rcv_packets", 1,
     "Unicast packets received on the port."),
    ("multicast_transmitted_packets_total", "multicast_xmit_packets", "port_multicast_xmit_packets", 1,
     "Multicast packets transmitted on the port."),
    ("multicast_received_packets_total", "multicast_rcv_packets", "port_multicast_rcv_packets", 1,
     "Multicast packets received on the port."),
)

# Error and congestion counters of counters/ (the port's performance management agent).
ERROR_COUNTERS = (
    ("symbol_error", "symbol_errors_total",
     "Minor link errors detected on one or more physical lanes."),
    ("link_error_recovery", "link_error_recoveries_total",
     "Times the link recovered from an error state by retraining."),
    ("link_downed", "link_downed_total",
     "Times the link failed to recover from an error state and went down."),
    ("port_rcv_errors", "receive_errors_total",
     "Packets received with an error (bad CRC, malformed, buffer overrun)."),
    ("port_rcv_remote_physical_errors", "receive_remote_physical_errors_total",
     "Packets received marked bad by the sender (EBP delimiter)."),
    ("port_rcv_switch_relay_errors", "receive_switch_relay_errors_total",
     "Received packets that could not be forwarded by the switch."),
    ("port_rcv_constraint_errors", "receive_constraint_errors_total",
     "Received packets dropped by partition or raw-packet enforcement."),
    ("port_rcv_discards", "receive_discards_total",
     "Received packets discarded because the port was down or congested."),
    ("port_xmit_discards", "transmit_discards_total",
     "Outbound packets discarded because the port was down or congested."),
    ("port_xmit_constraint_errors", "transmit_constraint_errors_total",
     "Outbound packets not sent because of partition or raw-packet enforcement."),
    ("port_xmit_wait", "transmit_wait_ticks_total",
     "Ticks during which the port had data to send but no flow-control credit to send it."),
    ("local_link_integrity_errors", "local_link_integrity_errors_total",
     "Times the count of local physical errors exceeded the port's threshold."),
    ("excessive_buffer_overrun_errors", "excessive_buffer_overrun_errors_total",
     "Times consecutive flow-control update periods saw a receive buffer overrun."),
    ("VL15_dropped", "vl15_dropped_total",
     "Subnet management packets dropped for lack of buffer space."),
)

STATE_HELP = "Logical state of the port: 0 no change, 1 down, 2 init, 3 armed, 4 active, 5 active-defer."
PHYS_STATE_HELP = ("Physical state of the port: 1 sleep, 2 polling, 3 disabled, 4 port configuration training, "
                   "5 link up, 6 link error recovery, 7 phy test.")


@dataclass(frozen=True)
class Port:
    device: str
    port: int
    state_id: int | None  # 4 = ACTIVE
    state: str | None  # the kernel's name for it, e.g. ACTIVE
    phys_state_id: int | None  # 5 = LinkUp
    phys_state: str | None
    rate_gbps: float | None
    rate_text: str | None  # lanes and generation, e.g. "4X NDR"
    link_layer: str | None  # InfiniBand or Ethernet (RoCE)
    counters: dict[str, int | None]  # counters/: every file present; None where it had no number
    counters_ext: dict[str, int | None]  # counters_ext/ of kernels before 4.5
    hw_counters: dict[str, int | None]  # hw_counters/: the driver's own counters

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"

    def counter(self, name: str) -> int | None:
        return self.counters.get(name)

    def traffic(self, name: str, legacy_name: str) -> int | None:
        """A traffic counter: the larger of its counters/ and counters_ext/ files (see TRAFFIC)."""
        value, legacy = self.counters.get(name), self.counters_ext.get(legacy_name)
        if value is None or legacy is None:
            return legacy if value is None else value
        return max(value, legacy)

    @property
    def transmitted_bytes(self) -> int | None:
        words = self.traffic("port_xmit_data", "port_xmit_data_64")
        return None if words is None else words * BYTES_PER_DATA_WORD

    @property
    def received_bytes(self) -> int | None:
        words = self.traffic("port_rcv_data", "port_rcv_data_64")
        return None if words is None else words * BYTES_PER_DATA_WORD


@dataclass(frozen=True)
class Device:
    name: str
    fw_version: str | None
    board_id: str | None
    hca_type: str | None
    node_guid: str | None
    ports: tuple[Port, ...]
    pci_bus_id: str | None = None  # the PCI function behind it (its `device` link), to name a NIC's rail


@dataclass(frozen=True)
class InfiniBand:
    devices: tuple[Device, ...]

    @property
    def ports(self) -> tuple[Port, ...]:
        return tuple(p for d in self.devices for p in d.ports)


def supported(host: HostPaths, cfg: dict):
    if host.sysfs_missing():
        return None  # collect() says why: unknown, not absent
    if not os.path.isdir(host.sys("class", "infiniband")):
        return "no InfiniBand/RoCE devices (no /sys/class/infiniband)"
    return None


def parse_state(text: str | None) -> tuple[int | None, str | None]:
    """`4: ACTIVE` or `5: LinkUp` -> (4, "ACTIVE"); anything else -> (None, None)."""
    if text is None:
        return None, None
    number, sep, name = text.partition(":")
    number = number.strip()
    if not sep or not number.isascii() or not number.isdigit():
        return None, None
    return int(number), name.strip() or None


def parse_rate(text: str | None) -> tuple[float | None, str | None]:
    """`400 Gb/sec (4X NDR)` -> (400.0, "4X NDR"); `10 Gb/sec (4X)` -> (10.0, "4X"); the kernel's
    `0 GB/sec` (a rate it does not know, e.g. a port still training) -> (0.0, None)."""
    if text is None:
        return None, None
    if text.strip() == "0 GB/sec":
        return 0.0, None
    number, sep, rest = text.partition(" Gb/sec")
    if not sep:
        return None, None
    try:
        gbps = float(number)
    except ValueError:
        return None, None
    if not math.isfinite(gbps) or gbps < 0:
        return None, None
    rest = rest.strip()
    detail = rest[1:-1].strip() if rest.startswith("(") and rest.endswith(")") else None
    return gbps, detail or None


def _read_port(device: str, number: int, directory: str, kept: KeptFiles) -> Port:
    prefix = directory + "/"
    attributes = kept.read_texts(directory, PORT_ATTRIBUTES)
    state_id, state = parse_state(attributes["state"])
    phys_state_id, phys_state = parse_state(attributes["phys_state"])
    rate_gbps, rate_text = parse_rate(attributes["rate"])
    return Port(
        device=device, port=number, state_id=state_id, state=state,
        phys_state_id=phys_state_id, phys_state=phys_state,
        rate_gbps=rate_gbps, rate_text=rate_text, link_layer=attributes["link_layer"],
        counters=kept.read_int_dir(prefix + "counters", NOT_COUNTERS),
        counters_ext=kept.read_int_dir(prefix + "counters_ext", NOT_COUNTERS),
        hw_counters=kept.read_int_dir(prefix + "hw_counters", NOT_COUNTERS),
    )


def _read_device(name: str, directory: str, kept: KeptFiles) -> Device:
    prefix = directory + "/"
    ports = tuple(_read_port(name, int(p), prefix + "ports/" + p, kept)
                  for p in list_dir(prefix + "ports") if p.isascii() and p.isdigit())
    attributes = kept.read_texts(directory, DEVICE_ATTRIBUTES)  # after its ports: one that went reads None
    return Device(
        name=name, fw_version=attributes["fw_ver"], board_id=attributes["board_id"],
        hca_type=attributes["hca_type"], node_guid=attributes["node_guid"],
        ports=tuple(sorted(ports, key=lambda p: p.port)), pci_bus_id=_pci_bus_id(prefix + "device"),
    )


def _pci_bus_id(link: str) -> str | None:
    """`0000:3b:00.0` from the device link (`../../../0000:3b:00.0`); None where it is absent or odd."""
    try:
        target = os.path.basename(os.readlink(link))
    except OSError:
        return None
    return target if PCI_ADDRESS.match(target) else None


def collect(host: HostPaths, cfg: dict) -> InfiniBand:
    """A device that vanishes mid-walk reads as a device with no ports and None attributes. The
    attributes and the counter directories (~50 files a port) are read through descriptors kept
    between passes."""
    require_sysfs(host)
    root = host.sys("class", "infiniband") + "/"
    kept = host.kept(NAME)
    facts = InfiniBand(tuple(_read_device(name, root + name, kept) for name in list_dir(root)))
    kept.sweep()  # a device gone since the last pass: its descriptors closed
    return facts


def counter_key(port: Port, name: str) -> str:
    """Key of a counters/ counter (or `transmitted_bytes` / `received_bytes`) in counters()."""
    return f"{port.device}:{port.port}:{name}"


def hw_counter_key(port: Port, name: str) -> str:
    """Key of a hw_counters/ counter in counters(), apart from counters/ names."""
    return f"{port.device}:{port.port}:hw_counters/{name}"


# The counters whose per-second rates are read: the check's error counters (checks/infiniband.py) and,
# as transmitted_bytes and received_bytes, the throughput family's data counters. The other ~45 files a
# port are exported as they are: rating them too, for nobody, was a third of the pass's own work on the
# H100 fixture (benchmarks/RESULTS.md). A test ties this list to the rates the check reads.
RATED = ("link_downed", "excessive_buffer_overrun_errors", "local_link_integrity_errors", "symbol_error",
         "link_error_recovery", "port_rcv_errors", "port_xmit_discards")
RATED_HW = ("local_ack_timeout_err",)


def counters(facts: InfiniBand) -> dict[str, float]:
    """The RATED counters, for per-second rates; data counters in bytes, not words."""
    out: dict[str, float] = {}
    for port in facts.ports:
        prefix, hw_prefix = counter_key(port, ""), hw_counter_key(port, "")  # once a port, not once a key
        for name in RATED:
            value = port.counters.get(name)
            if value is not None:
                out[prefix + name] = value
        for name in RATED_HW:
            value = port.hw_counters.get(name)
            if value is not None:
                out[hw_prefix + name] = value
        for name, value in (("transmitted_bytes", port.transmitted_bytes), ("received_bytes", port.received_bytes)):
            if value is not None:
                out[prefix + name] = value
    return out


def rate_metrics(facts: InfiniBand, rates: dict[str, float]) -> list[Metric]:
    """Port bandwidth per direction: the rate of the data counters (bytes, not words)."""
    throughput = Metric("nodehealth_infiniband_port_throughput_bytes_per_second",
                        "Data throughput of the port since the previous pass (rate of port_xmit_data and "
                        "port_rcv_data, in bytes).", labels=("device", "port", "direction"))
    for port in facts.ports:
        for direction, name in (("transmit", "transmitted_bytes"), ("receive", "received_bytes")):
            throughput.add((port.device, str(port.port), direction), rates.get(counter_key(port, name)))
    return [throughput]


def metrics(facts: InfiniBand) -> list[Metric]:
    labels = ("device", "port")
    info = Metric("nodehealth_infiniband_device_info",
                  "InfiniBand/RoCE device identity; always 1.",
                  labels=("device", "board_id", "fw_version", "hca_type"))
    port_info = Metric("nodehealth_infiniband_port_info",
                       "Link layer of the port (InfiniBand, or Ethernet for RoCE); always 1.",
                       labels=("device", "port", "link_layer"))
    state = Metric("nodehealth_infiniband_port_state_id", STATE_HELP, labels=labels)
    phys = Metric("nodehealth_infiniband_port_physical_state_id", PHYS_STATE_HELP, labels=labels)
    rate = Metric("nodehealth_infiniband_port_rate_bytes_per_second",
                  "Signalling rate the port trained to, in bytes per second.", labels=labels)
    traffic = [(Metric(f"nodehealth_infiniband_port_{suffix}", help_text, "counter", labels), name, legacy, mult)
               for suffix, name, legacy, mult, help_text in TRAFFIC]
    errors = [(Metric(f"nodehealth_infiniband_port_{suffix}", help_text, "counter", labels), name)
              for name, suffix, help_text in ERROR_COUNTERS]
    hw = Metric("nodehealth_infiniband_port_hw_events_total",
                "Events counted by the driver's own port counters (hw_counters/), labelled by the counter's name.",
                "counter", labels=("device", "port", "counter"))
    for device in facts.devices:
        info.add((device.name, device.board_id or "", device.fw_version or "", device.hca_type or ""), 1)
        for port in device.ports:
            number = str(port.port)
            key = (device.name, number)  # the labels of ~20 families, made once (Metric.put)
            port_info.put((device.name, number, port.link_layer or ""), 1)
            state.put(key, port.state_id)
            phys.put(key, port.phys_state_id)
            rate.put(key, None if port.rate_gbps is None else port.rate_gbps * BYTES_PER_SECOND_PER_GBPS)
            for metric, name, legacy, mult in traffic:
                value = port.traffic(name, legacy)
                metric.put(key, None if value is None else value * mult)
            for metric, name in errors:
                metric.put(key, port.counters.get(name))
            for name, value in port.hw_counters.items():
                hw.put((device.name, number, name), value)
    return [info, port_info, state, phys, rate] + [m for m, *_ in traffic] + [m for m, _ in errors] + [hw]
