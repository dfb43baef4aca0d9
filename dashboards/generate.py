"""Writes the Grafana dashboards (dashboards/nodehealth-node.json, dashboards/nodehealth-fleet.json) from
Python with Grafana's typed builders (grafana-foundation-sdk, the `dashboards` extra), and the same files
as ConfigMaps for Grafana's sidecar (deploy/components/grafana-dashboards).

    python dashboards/generate.py           # rewrite the four files
    python dashboards/generate.py --check   # exit 1 if a committed file is not what this script writes

Before writing, every metric family a query names is looked up among the families nodehealth exports:
the literal names its source passes to a metric constructor, and the families the exporter produces
for every fixture machine (which covers names built at run time, such as the InfiniBand counters).
A renamed or removed family stops the generator, so no panel is left querying a name that is gone.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as builder
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prometheus_model

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NODE_UID, FLEET_UID = "nodehealth-node", "nodehealth-fleet"
OUTPUTS = {NODE_UID: os.path.join(HERE, "nodehealth-node.json"),
           FLEET_UID: os.path.join(HERE, "nodehealth-fleet.json")}
# The same dashboards as ConfigMaps for Grafana's dashboard sidecar (deploy/components/grafana-dashboards).
CONFIGMAPS = {uid: os.path.join(ROOT, "deploy", "components", "grafana-dashboards", f"{uid}.yaml")
              for uid in OUTPUTS}
FAMILY = re.compile(r"\bnodehealth_[a-z0-9_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'instance=~"$node"'  # the node dashboard's node selector (the node name is `instance`: the PodMonitor's relabel)
CLUSTER = 'cluster=~"$cluster"'  # every query's: a Prometheus (Thanos, Mimir) holding several clusters' series
# The node dashboard for one node, keeping the time range, data source and cluster: the fleet's data links.
NODE_LINK = (f"/d/{NODE_UID}/nodehealth-node?var-datasource=${{datasource}}&var-cluster=${{cluster}}"
             f"&${{__url_time_range}}&var-node=")
SELECTOR = re.compile(r"\b(nodehealth_[a-z0-9_]+)(?:\{([^}]*)\})?")


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


# (value, text, colour) for each code a panel can show; a panel with a mapping shows words, not numbers.
Mapping = tuple[tuple[int, str, str], ...]
# (from, colour) steps above a green base: where a ratio turns from fine to worrying to bad.
Steps = tuple[tuple[float, str], ...]

VERDICT: Mapping = ((0, "healthy", "green"), (1, "unhealthy", "red"), (2, "unknown", "orange"))
NIC_RELATION: Mapping = ((0, "same PCIe switch", "green"), (1, "same root complex", "green"),
                         (2, "same NUMA node", "yellow"), (3, "across NUMA nodes", "red"), (4, "unknown", "orange"))
IB_STATE: Mapping = ((0, "no change", "orange"), (1, "down", "red"), (2, "init", "orange"), (3, "armed", "orange"),
                     (4, "active", "green"), (5, "active-defer", "orange"))
BREAKER: Mapping = ((0, "closed", "green"), (1, "tripped", "red"))


def flag(text: str, colour: str = "red", value: int = 1) -> Mapping:
    """A table that lists the series equal to `value`: the value column says what that means."""
    return ((value, text, colour),)


@dataclass(frozen=True)
class Panel:
    """One panel: `kind` is stat, table or timeseries; tables are instant queries in table format.
    Every panel says what it shows and how to read it (`description`) and in which unit."""

    title: str
    kind: str
    queries: tuple[Query, ...]
    description: str
    unit: str
    width: int = 12
    height: int = 8
    per_node: bool = True  # its series carry `instance`; else it counts over nodes, and links to all of them
    mapping: Mapping = ()
    thresholds: Steps = ()


def q(expr: str, legend: str = "") -> Query:
    return Query(expr, legend)


def thresholds() -> dict[str, Steps]:
    """The ratios' colours, from the checks' own defaults: a panel turns red where the check would fire."""
    from nodehealth import config

    cfg = config.defaults()
    analysis = cfg["pingmesh"]["analysis"]
    return {
        "slowdown": ((cfg["checks"]["clocks"]["slowdown_share"] / 2, "yellow"),
                     (cfg["checks"]["clocks"]["slowdown_share"], "red")),
        "unusable": ((0.75, "yellow"), (cfg["checks"]["memory"]["unusable_index"], "red")),
        "loss": ((analysis["node_loss_fraction"], "yellow"), (analysis["loss_fraction"], "red")),
        "utilisation": ((0.9, "yellow"),),  # a port near its trained rate is saturated, not broken
    }


def node_rows() -> list[tuple[str, list[Panel]]]:
    """The per-node dashboard: the verdict, the kernel log, GPUs, network, PCIe and memory, pingmesh."""
    kinds = {
        "Hardware errors in the kernel log (per hour)": ("mce|cper|edac_error|memory_failure|cpu_throttle",
                                                         "Machine checks, APEI/CPER records, EDAC and memory-failure "
                                                         "messages and CPU thermal throttling the kernel logged."),
        "Kernel crashes, stalls and NIC faults (per hour)": ("kernel_crash|rcu_stall|mlx5_health|netdev_watchdog"
                                                             "|netdev_unregister",
                                                             "Oopses and panics, RCU stalls, mlx5 firmware health "
                                                             "events and stuck network devices: each one is a reason "
                                                             "to drain the node."),
        "Storage errors in the kernel log (per hour)": ("fs_error|fs_readonly|io_error|nvme_error",
                                                        "Filesystem errors, read-only remounts, block I/O and NVMe "
                                                        "errors; the storage_errors findings name the device."),
    }
    gpu_ids = "instance, gpu, pci_bus_id"
    limits = thresholds()
    return [
        ("Verdict", [
            Panel("Node verdict", "stat",
                  (q(f"max by (instance) (nodehealth_health_status{{{SEL}}})", "{{instance}}"),),
                  "The node's verdict: healthy, unhealthy (a degraded or fatal finding) or unknown (a check could "
                  "not judge). The findings table below says why.", "none", width=8, height=5, mapping=VERDICT),
            Panel("Current findings by severity", "stat",
                  (q(f"sum by (severity) (nodehealth_findings{{{SEL}}})", "{{severity}}"),),
                  "How many findings the selected nodes have now, by severity (info, warning, degraded, fatal, "
                  "unknown).", "short", width=8, height=5),
            Panel("Collectors failing", "stat",
                  (q(f"count by (instance) ((nodehealth_collector_success{{{SEL}}} == 0) and on (instance, collector) "
                     f"(nodehealth_collector_supported{{{SEL}}} == 1))", "{{instance}}"),),
                  "Collectors whose source exists on the node but whose last run failed: their checks say unknown. "
                  "Empty when every collector works.", "short", width=8, height=5),
            Panel("Findings", "table", (q(f"nodehealth_finding{{{SEL}}} == 1"),),
                  "Every current finding: the check, its severity, the reason code and the device. /v1/report on "
                  "the node gives the message and the action.", "none", width=24, mapping=flag("current", "red")),
            Panel("Agent workers down", "table", (q(f"nodehealth_worker_up{{{SEL}}} == 0"),),
                  "The agent's worker threads that are dead or wait to be run again (passes, kmsg, pingmesh-*, "
                  "rdma-bw*): what they feed is stale, and /healthz answers 503. Empty while all run; "
                  "NodeHealthWorkerDown fires after 5 minutes.", "none", width=24, mapping=flag("down", value=0)),
        ]),
        ("Kernel log", [
            Panel("GPU Xid events (per hour)", "timeseries",
                  (q(f"sum by (instance, pci_bus_id, xid) (increase(nodehealth_gpu_xid_events_total{{{SEL}}}[1h]))",
                     "{{instance}} {{pci_bus_id}} Xid {{xid}}"),),
                  "Xid errors the NVIDIA driver logged, per GPU and code, counted over the past hour.", "short"),
            Panel("Kernel events (per hour)", "timeseries",
                  (q(f"sum by (instance, kind) (increase(nodehealth_kernel_events_total{{{SEL}}}[1h]))",
                     "{{instance}} {{kind}}"),),
                  "Every kind of kernel event nodehealth recognises in the kernel log, counted over the past hour.",
                  "short"),
            *[Panel(title, "timeseries",
                    (q(f'sum by (instance, kind) (increase(nodehealth_kernel_events_total{{{SEL},kind=~"{k}"}}[1h]))',
                       "{{instance}} {{kind}}"),), what + " Counted over the past hour.", "short")
              for title, (k, what) in kinds.items()],
            Panel("Kernel log records lost to ring-buffer overrun (per hour)", "timeseries",
                  (q(f"increase(nodehealth_kernel_log_overwritten_records_total{{{SEL}}}[1h])", "{{instance}}"),),
                  "Records the kernel overwrote before nodehealth read them: anything in them (an Xid) was missed.",
                  "short"),
        ]),
        ("GPUs", [
            Panel("GPUs lost (NVML: fell off the bus)", "table", (q(f"nodehealth_gpu_lost{{{SEL}}} == 1"),),
                  "GPUs NVML cannot reach any more: the node needs a reboot, and the GPU an inspection if it "
                  "happens again.", "none", mapping=flag("lost")),
            Panel("Volatile ECC errors (since the driver loaded)", "timeseries",
                  (q(f'sum by ({gpu_ids}, type) (nodehealth_gpu_ecc_errors_total{{{SEL},scope="volatile"}})',
                     "{{instance}} GPU {{gpu}} {{type}}"),),
                  "Corrected and uncorrected ECC errors per GPU since the driver loaded; any uncorrected one is a "
                  "fault.", "short"),
            Panel("Remapped rows", "timeseries",
                  (q(f"nodehealth_gpu_remapped_rows{{{SEL}}}", "{{instance}} GPU {{gpu}} {{type}}"),),
                  "Memory rows each GPU has remapped, by cause (correctable, uncorrectable errors).", "short"),
            Panel("Row remaps pending (reset the GPU) or failed (RMA candidate)", "table",
                  (q(f"nodehealth_gpu_remapped_rows_pending{{{SEL}}} == 1", "pending"),
                   q(f"nodehealth_gpu_remapped_rows_failure{{{SEL}}} == 1", "failure")),
                  "A pending remap takes effect at the next GPU reset; a failed one means the GPU ran out of spare "
                  "rows.", "none", mapping=flag("yes")),
            Panel("NVLink links down", "table", (q(f"nodehealth_gpu_nvlink_active{{{SEL}}} == 0"),),
                  "NVLink links that are not active: collectives across that GPU fall back to slower paths.",
                  "none", mapping=flag("down", value=0)),
            Panel("Active NVLink links per GPU", "timeseries",
                  (q(f"sum by ({gpu_ids}) (nodehealth_gpu_nvlink_active{{{SEL}}})", "{{instance}} GPU {{gpu}}"),),
                  "How many NVLink links each GPU has up; a drop is a link that went down.", "short"),
            Panel("NVLink errors per second, by type", "timeseries",
                  (q(f"sum by ({gpu_ids}, type) (rate(nodehealth_gpu_nvlink_errors_total{{{SEL}}}[$__rate_interval]))",
                     "{{instance}} GPU {{gpu}} {{type}}"),),
                  "NVLink CRC, replay and recovery errors per second per GPU; a steady rate is a bad link.", "cps"),
            Panel("NVLink throughput per GPU (sum of its links, by direction)", "timeseries",
                  (q(f"sum by (instance, gpu, direction) (nodehealth_gpu_nvlink_throughput_bytes_per_second{{{SEL}}})",
                     "{{instance}} GPU {{gpu}} {{direction}}"),),
                  "Bytes per second over each GPU's NVLinks, summed over its links.", "Bps"),
            Panel("GPU PCIe generation and width (current and max)", "table",
                  (q(f"nodehealth_gpu_pcie_link_generation{{{SEL}}}", "generation"),
                   q(f"nodehealth_gpu_pcie_link_width_lanes{{{SEL}}}", "width")),
                  "Each GPU's PCIe link: generation and lanes, as trained now and at most. An idle GPU may train "
                  "down its generation to save power; a narrower width is a fault.", "short"),
            Panel("GPU PCIe links narrower than their max", "table",
                  (q(f'nodehealth_gpu_pcie_link_width_lanes{{{SEL},bound="current"}} < on (instance, pci_bus_id) '
                     f'nodehealth_gpu_pcie_link_width_lanes{{{SEL},bound="max"}}'),),
                  "GPUs whose PCIe link trained to fewer lanes than it has (the value): reseat or replace.",
                  "suffix: lanes"),
            Panel("GPU PCIe replays per second", "timeseries",
                  (q(f"rate(nodehealth_gpu_pcie_replays_total{{{SEL}}}[$__rate_interval])",
                     "{{instance}} GPU {{gpu}}"),),
                  "PCIe transactions each GPU had to replay, per second: a steady rate is a marginal link.", "cps"),
            Panel("PCIe throughput per GPU (NVML)", "timeseries",
                  (q(f"nodehealth_gpu_pcie_transmit_bytes_per_second{{{SEL}}}", "{{instance}} GPU {{gpu}} TX"),
                   q(f"nodehealth_gpu_pcie_receive_bytes_per_second{{{SEL}}}", "{{instance}} GPU {{gpu}} RX")),
                  "Bytes per second over each GPU's PCIe link, as NVML samples it.", "Bps"),
            Panel("Clock event reasons active", "table",
                  (q(f"nodehealth_gpu_clocks_event_active{{{SEL}}} == 1"),),
                  "Why each GPU's clocks are held down now. gpu_idle and sw_power_cap are normal; the hw_* reasons "
                  "slow a GPU down.", "none", mapping=flag("active", "orange")),
            Panel("Share of time in each slowdown", "timeseries",
                  (q(f"rate(nodehealth_gpu_clocks_event_seconds_total{{{SEL}}}[$__rate_interval])",
                     "{{instance}} GPU {{gpu}} {{reason}}"),),
                  "The share of time each clock event reason held each GPU down; red where the clocks check "
                  "counts a slowdown.", "percentunit", thresholds=limits["slowdown"]),
            Panel("GPU temperature", "timeseries",
                  (q(f"nodehealth_gpu_temperature_celsius{{{SEL}}}", "{{instance}} GPU {{gpu}}"),),
                  "Each GPU's core temperature.", "celsius"),
            Panel("GPU power draw and limit", "timeseries",
                  (q(f"nodehealth_gpu_power_watts{{{SEL}}}", "{{instance}} GPU {{gpu}}"),
                   q(f"nodehealth_gpu_power_limit_watts{{{SEL}}}", "{{instance}} GPU {{gpu}} limit")),
                  "Each GPU's power draw and its enforced limit; a draw pinned at the limit is power capping.",
                  "watt"),
        ]),
        ("Network", [
            Panel("InfiniBand port rate", "timeseries",
                  (q(f"nodehealth_infiniband_port_rate_bytes_per_second{{{SEL}}} * 8",
                     "{{instance}} {{device}}:{{port}}"),),
                  "The signalling rate each port trained to; a port below its peers' rate trained down.", "bps",
                  width=8),
            Panel("InfiniBand traffic", "timeseries",
                  (q(f"rate(nodehealth_infiniband_port_transmitted_bytes_total{{{SEL}}}[$__rate_interval]) * 8",
                     "tx {{instance}} {{device}}:{{port}}"),
                   q(f"rate(nodehealth_infiniband_port_received_bytes_total{{{SEL}}}[$__rate_interval]) * 8",
                     "rx {{instance}} {{device}}:{{port}}")),
                  "Bits per second each port sent and received, from its counters.", "bps", width=8),
            Panel("InfiniBand errors (per second)", "timeseries",
                  (q(f"rate(nodehealth_infiniband_port_symbol_errors_total{{{SEL}}}[$__rate_interval])",
                     "symbol {{device}}:{{port}}"),
                   q(f"rate(nodehealth_infiniband_port_link_downed_total{{{SEL}}}[$__rate_interval])",
                     "link downed {{device}}:{{port}}"),
                   q(f"rate(nodehealth_infiniband_port_link_error_recoveries_total{{{SEL}}}[$__rate_interval])",
                     "recovery {{device}}:{{port}}")),
                  "Symbol errors, link downs and link error recoveries per second: a cable, transceiver or switch "
                  "port going bad.", "cps", width=8),
            Panel("InfiniBand port throughput", "timeseries",
                  (q(f"nodehealth_infiniband_port_throughput_bytes_per_second{{{SEL}}}",
                     "{{instance}} {{device}}:{{port}} {{direction}}"),),
                  "Bytes per second through each port between two passes, by direction.", "Bps"),
            Panel("InfiniBand port throughput as a fraction of its trained rate", "timeseries",
                  (q(f"nodehealth_infiniband_port_throughput_bytes_per_second{{{SEL}}} / ignoring(direction) "
                     f"group_left nodehealth_infiniband_port_rate_bytes_per_second{{{SEL}}}",
                     "{{instance}} {{device}}:{{port}} {{direction}}"),),
                  "How full each port is; yellow near its trained rate (saturated, not broken).", "percentunit",
                  thresholds=limits["utilisation"]),
            Panel("GPU to nearest RDMA NIC", "table", (q(f"nodehealth_gpu_nic_relation{{{SEL}}}"),),
                  "How each GPU reaches its nearest RDMA NIC in the PCIe tree (nvidia-smi topo -m: PIX/PXB, PHB, "
                  "NODE, SYS). Across NUMA nodes, GPUDirect RDMA crosses the CPU interconnect.", "none", width=24,
                  mapping=NIC_RELATION),
            Panel("RDMA memlock (smallest limit among RDMA processes)", "stat",
                  (q(f"nodehealth_rdma_process_memlock_min_bytes{{{SEL}}}", "{{instance}}"),),
                  "The smallest locked-memory limit among the processes using RDMA; below 16 GiB memory "
                  "registration may fail.", "bytes", height=5),
            Panel("RDMA WRITE bandwidth per rail and peer (the daemon's periodic tests)", "timeseries",
                  (q(f'nodehealth_rdma_write_bw_gbps{{stat="avg",{SEL}}}',
                     "{{instance}} {{device}}:{{port}} to {{peer}}"),),
                  "Average bandwidth of the last perftest-style RDMA WRITE test per rail and peer. Absent while a "
                  "rail's last test failed: see the next panel.", "Gbits"),
            Panel("RDMA tests whose last run failed", "table",
                  (q(f"nodehealth_rdma_bw_last_run_success{{{SEL}}} == 0"),),
                  "Rails whose last bandwidth test failed, with the peer it ran against.", "none",
                  mapping=flag("failed", value=0)),
        ]),
        ("PCIe and memory", [
            Panel("PCIe links below their width", "table",
                  (q(f'nodehealth_pcie_link_width_lanes{{{SEL},bound="current"}} < on (instance, pci_bus_id, kind) '
                     f'nodehealth_pcie_link_width_lanes{{{SEL},bound="max"}}'),),
                  "GPUs, NICs, NVMe drives and switches (sysfs) whose link trained to fewer lanes (the value) than "
                  "it has.", "suffix: lanes"),
            Panel("Memory: unusable free space at 2 MiB (Normal zones)", "timeseries",
                  (q(f'nodehealth_memory_zone_unusable_index{{{SEL},zone="Normal"}}', "{{instance}} node {{node}}"),),
                  "The share of free memory that cannot serve a 2 MiB allocation (fragmentation); red where the "
                  "memory check reports it.", "percentunit", thresholds=limits["unusable"]),
            Panel("Memory errors by DIMM (EDAC, since boot)", "timeseries",
                  (q(f"sum by (instance, controller, label, type) (nodehealth_edac_dimm_errors_total{{{SEL}}})",
                     "{{instance}} {{controller}} {{label}} {{type}}"),),
                  "Corrected and uncorrected memory errors per DIMM since boot; the label is the board's silkscreen "
                  "name.", "short"),
        ]),
        ("Pingmesh", [
            Panel("Pingmesh: lost fraction by leaf and peer group", "table",
                  (q("sum by (leaf, peer_group) (rate(nodehealth_pingmesh_lost_total[$__rate_interval]) "
                     "* on (instance) group_left (leaf) nodehealth_pingmesh_info) / sum by (leaf, peer_group) "
                     "(rate(nodehealth_pingmesh_probes_total[$__rate_interval]) * on (instance) group_left (leaf) "
                     "nodehealth_pingmesh_info)"),),
                  "The share of probes lost, by the prober's leaf and the peers' group (same leaf, other leaves); "
                  "yellow at a node's loss threshold, red at a path's.", "percentunit", thresholds=limits["loss"]),
            Panel("Pingmesh: p99 round trip by leaf and peer group (TCP connect)", "table",
                  (q('histogram_quantile(0.99, sum by (leaf, peer_group, le) ('
                     'rate(nodehealth_pingmesh_rtt_seconds_bucket{probe="tcp"}[$__rate_interval]) * on (instance) '
                     'group_left (leaf) nodehealth_pingmesh_info))'),),
                  "The 99th percentile of TCP connect times by the prober's leaf and the peers' group.", "s"),
            Panel("Pingmesh: worst peers of the selected nodes (last closed window)", "table",
                  (q(f"topk(20, max by (instance, peer, rail, probe) (nodehealth_pingmesh_peer_loss_ratio{{{SEL}}}))",
                     "loss"),
                   q(f"topk(20, max by (instance, peer, rail, probe) "
                     f"(nodehealth_pingmesh_peer_rtt_p99_seconds{{{SEL}}}))",
                     "p99")),
                  "The peers with the highest loss ratio and the slowest p99 round trip in the last closed "
                  "window, per rail and probe.", "short"),
            Panel("Pingmesh verdicts (controller)", "table",
                  (q("max by (kind, element) (nodehealth_pingmesh_verdict) == 1"),),
                  "The controller's open verdicts: a faulty node, leaf or leaf-to-leaf path.", "none",
                  mapping=flag("open")),
            Panel("Pingmesh: lost fraction of the selected nodes' probes by peer group", "timeseries",
                  (q(f"sum by (instance, peer_group) "
                     f"(rate(nodehealth_pingmesh_lost_total{{{SEL}}}[$__rate_interval])) / "
                     f"sum by (instance, peer_group) "
                     f"(rate(nodehealth_pingmesh_probes_total{{{SEL}}}[$__rate_interval]))",
                     "{{instance}} {{peer_group}}"),),
                  "The share of the selected nodes' probes lost, by peer group; yellow at a node's loss threshold, "
                  "red at a path's.", "percentunit", width=24, thresholds=limits["loss"]),
        ]),
    ]


def fleet_rows() -> list[tuple[str, list[Panel]]]:
    """The fleet: which nodes are sick and why, what quarantine did, and where the hardware is worst."""
    bad_width = ('nodehealth_gpu_pcie_link_width_lanes{bound="current"} < on (instance, pci_bus_id) '
                 'nodehealth_gpu_pcie_link_width_lanes{bound="max"}')
    ib_errors = " + ".join(f"sum by (instance, device, port) "
                           f"(rate(nodehealth_infiniband_port_{c}_total[$__rate_interval]))"
                           for c in ("symbol_errors", "link_error_recoveries", "link_downed"))
    limits = thresholds()
    return [
        ("Verdicts", [
            Panel("Nodes by status", "stat",
                  (q("count(nodehealth_health_status == 0) or vector(0)", "healthy"),
                   q("count(nodehealth_health_status == 1) or vector(0)", "unhealthy"),
                   q("count(nodehealth_health_status == 2) or vector(0)", "unknown")),
                  "How many nodes are healthy, unhealthy (a degraded or fatal finding) and unknown (a check could "
                  "not judge).", "short", width=8, height=5, per_node=False),
            Panel("Nodes that are not healthy", "table",
                  (q("nodehealth_health_status != 0"),),
                  "Every node whose verdict is unhealthy or unknown; open one for its findings.", "none", width=16,
                  height=5, mapping=VERDICT),
            Panel("Nodes by finding", "table",
                  (q('sort_desc(count by (severity, check, reason) (nodehealth_finding{severity!="info"} == 1))'),),
                  "How many nodes have each finding; the node dashboard lists them.", "short", per_node=False),
            Panel("Fatal and degraded findings by node", "table",
                  (q('nodehealth_finding{severity=~"fatal|degraded"} == 1'),),
                  "Every fatal or degraded finding on every node, with its device.", "none",
                  mapping=flag("current")),
        ]),
        ("Quarantine", [
            Panel("Tainted nodes (nodehealth taints on the Node)", "table",
                  (q("nodehealth_kube_taint_applied == 1"),),
                  "The nodehealth taints on each Node, by subsystem and effect, as the agent last read or wrote "
                  "them.", "none", mapping=flag("tainted", "orange")),
            Panel("Taints the circuit breaker withholds", "table", (q("nodehealth_kube_taint_withheld == 1"),),
                  "Nodes that need a quarantine taint the circuit breaker withholds: they still take work.",
                  "none", mapping=flag("withheld")),
            Panel("Circuit breaker", "stat", (q("max(nodehealth_kube_breaker_tripped)", "breaker"),),
                  "Tripped when more nodes needed quarantine than kube.max_quarantined_fraction allows; it stays "
                  "tripped until an operator resets it (docs/runbooks.md).", "none", width=6, height=5,
                  per_node=False, mapping=BREAKER),
            Panel("Quarantined nodes and the cap", "stat",
                  (q("max(nodehealth_kube_breaker_quarantined_nodes)", "quarantined nodes"),
                   q("max(nodehealth_kube_breaker_cap_nodes)", "cap")),
                  "Nodes holding a quarantine slot in the breaker's Lease, and how many may at once.", "short",
                  width=6, height=5, per_node=False),
            Panel("Nodes in dry run or under an operator's hold", "table",
                  (q("nodehealth_kube_dry_run == 1", "dry run"), q("nodehealth_kube_hold == 1", "hold")),
                  "Agents that only log what they would write (dry run), and nodes whose taints an operator holds.",
                  "none", height=5, mapping=flag("yes", "blue")),
            Panel("Slurm: nodes drained by nodehealth or by someone else (daemon --slurm)", "table",
                  (q("nodehealth_slurm_drained == 1", "drained by nodehealth"),
                   q("nodehealth_slurm_drained_by_other == 1", "drained by someone else")),
                  "Slurm's view: the nodes nodehealth drained (query A), and those an administrator or Slurm "
                  "itself drained (query B), which nodehealth never touches.", "none", width=12, height=6,
                  mapping=flag("drained", "orange")),
            Panel("Slurm: scontrol failing (daemon --slurm)", "table",
                  (q("increase(nodehealth_slurm_errors_total[15m]) > 0", "scontrol failing"),),
                  "Nodes whose scontrol calls failed in the last 15 minutes: an unhealthy one may not be drained.",
                  "short", width=12, height=6),
        ]),
        ("GPUs", [
            Panel("Top Xid codes across the fleet (nodes that logged each this boot)", "table",
                  (q("topk(10, count by (xid) (nodehealth_gpu_xid_events_total > 0))"),),
                  "The Xid codes logged on the most nodes since their boot.", "short", per_node=False),
            Panel("GPUs with the most Xid errors this boot", "table",
                  (q("topk(20, sum by (instance, pci_bus_id, xid) (nodehealth_gpu_xid_events_total > 0))"),),
                  "The GPUs that logged the most Xid errors since their node booted.", "short"),
            Panel("GPU faults by node", "table",
                  (q("count by (instance) (nodehealth_gpu_lost == 1)", "lost GPUs"),
                   q("count by (instance) (nodehealth_gpu_nvlink_active == 0)", "NVLink links down"),
                   q('count by (instance) (nodehealth_gpu_ecc_errors_total{type="uncorrected",scope="volatile"} > 0)',
                     "GPUs with volatile uncorrected ECC errors"),
                   q("count by (instance) (nodehealth_gpu_remapped_rows_pending == 1 or "
                     "nodehealth_gpu_remapped_rows_failure == 1)", "row remap pending or failed"),
                   q('count by (instance) (nodehealth_gpu_clocks_event_active{reason=~"hw_.*"} == 1)',
                     "GPUs in a HW slowdown")),
                  "Per node, how many GPUs are lost, NVLink links down, GPUs with uncorrected ECC errors, with a "
                  "row remap pending or failed, and in a hardware slowdown.", "short", width=24),
        ]),
        ("Network and PCIe", [
            Panel("Worst InfiniBand ports (symbol errors, link recoveries and downs per second)", "table",
                  (q(f"topk(10, {ib_errors})", "errors per second"),),
                  "The ten ports with the most link errors per second: cables, transceivers or switch ports going "
                  "bad.", "cps"),
            Panel("InfiniBand ports not ACTIVE", "table",
                  (q("nodehealth_infiniband_port_state_id != 4"),),
                  "Ports whose logical state is not ACTIVE: the link is down or still coming up.", "none",
                  mapping=IB_STATE),
            Panel("PCIe downtrained links", "table",
                  (q('nodehealth_pcie_link_width_lanes{bound="current"} < on (instance, pci_bus_id, kind) '
                     'nodehealth_pcie_link_width_lanes{bound="max"}', "sysfs"),
                   q(bad_width, "GPU (NVML)")),
                  "Links trained to fewer lanes (the value) than they have, from sysfs and from NVML.",
                  "suffix: lanes"),
            Panel("Slowest RDMA rails (average WRITE bandwidth of the last test)", "table",
                  (q('bottomk(10, nodehealth_rdma_write_bw_gbps{stat="avg"})'),),
                  "The ten rails with the lowest bandwidth in their last RDMA WRITE test.", "Gbits"),
            Panel("RDMA tests whose last run failed", "table",
                  (q("nodehealth_rdma_bw_last_run_success == 0"),),
                  "Rails whose last bandwidth test failed, with the peer it ran against.", "none",
                  mapping=flag("failed", value=0)),
            Panel("Pingmesh verdicts (controller)", "table",
                  (q("max by (kind, element) (nodehealth_pingmesh_verdict) == 1"),),
                  "The controller's open verdicts: a faulty node, leaf or leaf-to-leaf path.", "none",
                  per_node=False, mapping=flag("open")),
            Panel("Pingmesh: lost fraction per node", "table",
                  (q("topk(20, sum by (instance) (rate(nodehealth_pingmesh_lost_total[$__rate_interval])) / "
                     "sum by (instance) (rate(nodehealth_pingmesh_probes_total[$__rate_interval])))"),),
                  "The twenty nodes losing the largest share of their probes; yellow at a node's loss threshold, "
                  "red at a path's.", "percentunit", thresholds=limits["loss"]),
        ]),
        ("Memory and training jobs", [
            Panel("Memory fragmentation outliers (unusable free space at 2 MiB, Normal zones)", "table",
                  (q('topk(10, max by (instance) (nodehealth_memory_zone_unusable_index{zone="Normal"}))'),),
                  "The ten nodes whose free memory is the most fragmented; red where the memory check reports it.",
                  "percentunit", thresholds=limits["unusable"]),
            Panel("Hung training jobs and stragglers", "table",
                  (q("nodehealth_hang_detected == 1", "hung"), q("nodehealth_hang_straggler == 1", "straggler")),
                  "Training jobs hung on a node, and the ranks that lag their peers (the hang component).", "none",
                  mapping=flag("yes")),
        ]),
    ]


def check_families(dashboards: dict[str, list[tuple[str, list[Panel]]]], exported: set[str]) -> list[str]:
    """The families the queries name that nodehealth does not export, with the panel naming each."""
    missing = []
    for uid, rows in dashboards.items():
        for _, panels in rows:
            for panel in panels:
                for query in panel.queries:
                    for name in FAMILY.findall(query.expr):
                        base = next((name[:-len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s)), name)
                        if name not in exported and base not in exported:
                            missing.append(f"{uid}: {panel.title!r} queries {name}")
    return missing


def exported_families() -> set[str]:
    """Every metric family nodehealth can export: the literal first argument of any call in its source
    that is a family name (Metric(...), the NVML collector's family(...), ...), and the families the
    exporter produces for each fixture machine (names built at run time)."""
    names: set[str] = set()
    for package in ("nodehealth", "collectors", "checks"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                with open(os.path.join(dirpath, f)) as src:
                    tree = ast.parse(src.read())
                for node in ast.walk(tree):
                    if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                            and isinstance(node.args[0].value, str)
                            and re.fullmatch(FAMILY.pattern, node.args[0].value)):
                        names.add(node.args[0].value)
    return names | fixture_families()


def fixture_families() -> set[str]:
    """The families with samples in the exporter's output for each fixture machine, as `nodehealth check
    --root` would judge it (the daemon's own, Kubernetes', hang and pingmesh families are literals)."""
    from nodehealth import config, exporter, node_pass, registry

    machines = os.path.join(ROOT, "tests", "fixtures", "machines")
    names: set[str] = set()
    for machine in sorted(os.listdir(machines)):
        cfg = config.load(None)
        report = node_pass.run(node_pass.build_engine(cfg, os.path.join(machines, machine)), cfg, "fixture")
        names |= {m.name for m in exporter.report_metrics(report, registry.COLLECTORS) if m.samples}
    return names


def scoped(expr: str) -> str:
    """`expr` with the cluster variable's matcher in every nodehealth series selector."""
    return SELECTOR.sub(lambda m: f"{m.group(1)}{{{CLUSTER}{',' + m.group(2) if m.group(2) else ''}}}", expr)


def annotations(node_variable: bool) -> list[dict]:
    """Verdict changes and nodehealth's taints, on every panel's time axis."""
    sel = scoped(f"nodehealth_health_status{{{SEL}}}" if node_variable else "nodehealth_health_status")
    taints = scoped(f"nodehealth_kube_taint_applied{{{SEL}}}" if node_variable else "nodehealth_kube_taint_applied")
    return [
        {"name": "Verdict changes", "datasource": {"type": "prometheus", "uid": "${datasource}"}, "enable": True,
         "iconColor": "red", "expr": f"changes({sel}[2m]) > 0", "step": "60s",
         "titleFormat": "{{instance}}: verdict changed", "textFormat": "0 healthy, 1 unhealthy, 2 unknown"},
        {"name": "nodehealth taints", "datasource": {"type": "prometheus", "uid": "${datasource}"}, "enable": True,
         "iconColor": "orange", "expr": f"{taints} == 1", "step": "60s",
         "titleFormat": "{{instance}}: nodehealth.io/{{subsystem}} {{effect}}", "textFormat": "tainted"},
    ]


def build(uid: str, title: str, rows: list[tuple[str, list[Panel]]], description: str,
          node_variable: bool) -> dict:
    dash = (builder.Dashboard(title).uid(uid).description(description).tags(["nodehealth", "gpu"])
            .timezone("utc").refresh("30s").time("now-6h", "now").version(1)
            .with_variable(builder.DatasourceVariable("datasource").label("Data source").type("prometheus"))
            .with_variable(builder.QueryVariable("cluster").label("Cluster").datasource(DATASOURCE)
                           .query("label_values(nodehealth_build_info, cluster)").include_all(True).all_value(".*")
                           .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)))
    if node_variable:
        dash = dash.with_variable(
            builder.QueryVariable("node").label("Node").datasource(DATASOURCE)
            .query(f"label_values(nodehealth_health_status{{{CLUSTER}}}, instance)").multi(True).include_all(True)
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED))
    else:
        dash = dash.link(builder.DashboardLink("Node dashboard").type(model.DashboardLinkType.LINK)
                         .url(f"/d/{NODE_UID}/nodehealth-node").keep_time(True).include_vars(True))
    panel_id = 0
    colour_cells = set()
    for row_title, panels in rows:
        panel_id += 1
        dash = dash.with_row(builder.Row(row_title).id(panel_id))
        for spec in panels:
            panel_id += 1
            dash = dash.with_panel(_panel(spec, panel_id, link_to_node=not node_variable))
            if spec.kind == "table" and (spec.mapping or spec.thresholds):
                colour_cells.add(panel_id)
    out = json.loads(json.dumps(dash.build(), cls=JSONEncoder))
    out["annotations"] = {"list": annotations(node_variable)}
    for panel in out["panels"]:
        if panel["id"] in colour_cells:  # the builders of this SDK version have no cell options
            panel["fieldConfig"]["defaults"].setdefault("custom", {})["cellOptions"] = {"type": "color-text"}
    return out


def _panel(spec: Panel, panel_id: int, link_to_node: bool):
    if spec.kind == "stat":
        panel = (stat.Panel().graph_mode(common.BigValueGraphMode.NONE)
                 .reduce_options(common_builder.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    elif spec.kind == "table":
        # Columns that say nothing about the row: the query's time, the family name, the scrape job.
        hidden = model.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True, "__name__": True, "job": True}})
        panel = table.Panel().show_header(True).with_transformation(hidden)
    else:
        panel = timeseries.Panel().legend(common_builder.VizLegendOptions().show_legend(True)
                                          .display_mode(common.LegendDisplayMode.LIST)
                                          .placement(common.LegendPlacement.BOTTOM))
        if spec.thresholds:
            panel = panel.thresholds_style(common_builder.GraphThresholdsStyleConfig()
                                           .mode(common.GraphTresholdsStyleMode.LINE))
    panel = (panel.id(panel_id).title(spec.title).datasource(DATASOURCE).span(spec.width).height(spec.height)
             .description(spec.description).unit(spec.unit))
    if spec.mapping:
        panel = panel.mappings([model.ValueMap(options={
            str(value): model.ValueMappingResult(text=text, color=colour, index=i)
            for i, (value, text, colour) in enumerate(spec.mapping)})])
    if spec.thresholds:
        panel = panel.thresholds(builder.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(
            [model.Threshold(value=None, color="green")]
            + [model.Threshold(value=value, color=colour) for value, colour in spec.thresholds]))
    for i, query in enumerate(spec.queries):
        target = prometheus.Dataquery().ref_id(chr(ord("A") + i)).expr(scoped(query.expr)).datasource(DATASOURCE)
        if query.legend:
            target = target.legend_format(query.legend)
        if spec.kind == "table":
            target = target.instant().format(prometheus_model.PromQueryFormat.TABLE)
        panel = panel.with_target(target)
    if link_to_node:
        # A table row's instance is a column; a series' is a label; a count over nodes has none.
        if not spec.per_node:
            instance = "$__all"
        elif spec.kind == "table":
            instance = "${__data.fields.instance}"
        else:
            instance = "${__field.labels.instance}"
        panel = panel.data_links([builder.DashboardLink("Open the node dashboard").url(NODE_LINK + instance)])
    return panel


def dashboards() -> dict[str, dict]:
    return {
        NODE_UID: build(NODE_UID, "nodehealth: node", node_rows(),
                        "One node or a few: verdict, findings, kernel log, GPUs, network, PCIe, memory, pingmesh.",
                        node_variable=True),
        FLEET_UID: build(FLEET_UID, "nodehealth: fleet", fleet_rows(),
                         "The whole fleet: sick nodes and why, quarantine, the worst GPUs, ports, links and "
                         "memory; every panel opens the node dashboard.", node_variable=False),
    }


def render(dashboard: dict) -> str:
    return json.dumps(dashboard, indent=2, sort_keys=True) + "\n"


def render_configmap(uid: str, text: str) -> str:
    """A ConfigMap holding the dashboard file as it is, labelled for Grafana's sidecar."""
    import yaml

    class Literal(yaml.SafeDumper):
        pass

    Literal.add_representer(str, lambda dumper, value: dumper.represent_scalar(
        "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))
    doc = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": f"{uid}-dashboard", "namespace": "nodehealth", "labels": {"grafana_dashboard": "1"}},
           "data": {os.path.basename(OUTPUTS[uid]): text}}
    return ("# Generated by dashboards/generate.py from the dashboard of the same name: do not edit.\n"
            + yaml.dump(doc, Dumper=Literal, sort_keys=False, width=1000))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the committed files")
    args = parser.parse_args(argv)
    missing = check_families({NODE_UID: node_rows(), FLEET_UID: fleet_rows()}, exported_families())
    if missing:
        print("dashboards/generate.py: queries name families nodehealth does not export:\n  "
              + "\n  ".join(missing), file=sys.stderr)
        return 1
    stale = []
    for uid, dashboard in dashboards().items():
        text = render(dashboard)
        for path, content in ((OUTPUTS[uid], text), (CONFIGMAPS[uid], render_configmap(uid, text))):
            if args.check:
                try:
                    with open(path) as f:
                        current = f.read()
                except FileNotFoundError:
                    current = None
                if current != content:
                    stale.append(os.path.relpath(path, ROOT))
            else:
                with open(path, "w") as f:
                    f.write(content)
    if stale:
        print(f"dashboards/generate.py: out of date: {', '.join(stale)}; run python dashboards/generate.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
