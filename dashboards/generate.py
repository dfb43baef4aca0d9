"""Writes the Grafana dashboards (dashboards/nodehealth-node.json, dashboards/nodehealth-fleet.json) from
Python with Grafana's typed builders (grafana-foundation-sdk, the `dashboards` extra).

    python dashboards/generate.py           # rewrite both files
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
FAMILY = re.compile(r"\bnodehealth_[a-z0-9_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'instance=~"$instance"'  # the node dashboard's node selector
# The node dashboard for one node, keeping the time range and data source: the fleet's data links.
NODE_LINK = f"/d/{NODE_UID}/nodehealth-node?var-datasource=${{datasource}}&${{__url_time_range}}&var-instance="


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    """One panel: `kind` is stat, table or timeseries; tables are instant queries in table format."""

    title: str
    kind: str
    queries: tuple[Query, ...]
    unit: str = ""
    width: int = 12
    height: int = 8
    description: str = ""
    per_node: bool = True  # its series carry `instance`; else it counts over nodes, and links to all of them


def q(expr: str, legend: str = "") -> Query:
    return Query(expr, legend)


def node_rows() -> list[tuple[str, list[Panel]]]:
    """The per-node dashboard: the verdict, the kernel log, GPUs, network, PCIe and memory, pingmesh."""
    kinds = {
        "Hardware errors in the kernel log (per hour)": "mce|cper|edac_error|memory_failure|cpu_throttle",
        "Kernel crashes, stalls and NIC faults (per hour)": "kernel_crash|rcu_stall|mlx5_health|netdev_watchdog"
                                                            "|netdev_unregister",
        "Storage errors in the kernel log (per hour)": "fs_error|fs_readonly|io_error|nvme_error",
    }
    gpu_ids = "instance, gpu, pci_bus_id"
    return [
        ("Verdict", [
            Panel("Node verdict (0 healthy, 1 unhealthy, 2 unknown)", "stat",
                  (q(f"max by (instance) (nodehealth_health_status{{{SEL}}})", "{{instance}}"),), width=8, height=5),
            Panel("Current findings by severity", "stat",
                  (q(f"sum by (severity) (nodehealth_findings{{{SEL}}})", "{{severity}}"),), width=8, height=5),
            Panel("Collectors failing", "stat",
                  (q(f"count by (instance) ((nodehealth_collector_success{{{SEL}}} == 0) and on (instance, collector) "
                     f"(nodehealth_collector_supported{{{SEL}}} == 1))", "{{instance}}"),), width=8, height=5),
            Panel("Findings", "table", (q(f"nodehealth_finding{{{SEL}}} == 1"),), width=24),
        ]),
        ("Kernel log", [
            Panel("GPU Xid events (per hour)", "timeseries",
                  (q(f"sum by (instance, pci_bus_id, xid) (increase(nodehealth_gpu_xid_events_total{{{SEL}}}[1h]))",
                     "{{instance}} {{pci_bus_id}} Xid {{xid}}"),)),
            Panel("Kernel events (per hour)", "timeseries",
                  (q(f"sum by (instance, kind) (increase(nodehealth_kernel_events_total{{{SEL}}}[1h]))",
                     "{{instance}} {{kind}}"),)),
            *[Panel(title, "timeseries",
                    (q(f'sum by (instance, kind) (increase(nodehealth_kernel_events_total{{{SEL},kind=~"{k}"}}[1h]))',
                       "{{instance}} {{kind}}"),)) for title, k in kinds.items()],
            Panel("Kernel log records lost to ring-buffer overrun (per hour)", "timeseries",
                  (q(f"increase(nodehealth_kernel_log_overwritten_records_total{{{SEL}}}[1h])", "{{instance}}"),)),
        ]),
        ("GPUs", [
            Panel("GPUs lost (NVML: fell off the bus)", "table", (q(f"nodehealth_gpu_lost{{{SEL}}} == 1"),)),
            Panel("Volatile ECC errors (since the driver loaded)", "timeseries",
                  (q(f'sum by ({gpu_ids}, type) (nodehealth_gpu_ecc_errors_total{{{SEL},scope="volatile"}})',
                     "{{instance}} GPU {{gpu}} {{type}}"),)),
            Panel("Remapped rows", "timeseries",
                  (q(f"nodehealth_gpu_remapped_rows{{{SEL}}}", "{{instance}} GPU {{gpu}} {{type}}"),)),
            Panel("Row remaps pending (reset the GPU) or failed (RMA candidate)", "table",
                  (q(f"nodehealth_gpu_remapped_rows_pending{{{SEL}}} == 1", "pending"),
                   q(f"nodehealth_gpu_remapped_rows_failure{{{SEL}}} == 1", "failure"))),
            Panel("NVLink links down", "table", (q(f"nodehealth_gpu_nvlink_active{{{SEL}}} == 0"),)),
            Panel("Active NVLink links per GPU", "timeseries",
                  (q(f"sum by ({gpu_ids}) (nodehealth_gpu_nvlink_active{{{SEL}}})", "{{instance}} GPU {{gpu}}"),)),
            Panel("NVLink errors per second, by type (5m)", "timeseries",
                  (q(f"sum by ({gpu_ids}, type) (rate(nodehealth_gpu_nvlink_errors_total{{{SEL}}}[5m]))",
                     "{{instance}} GPU {{gpu}} {{type}}"),)),
            Panel("NVLink throughput per GPU (sum of its links, by direction)", "timeseries",
                  (q(f"sum by (instance, gpu, direction) (nodehealth_gpu_nvlink_throughput_bytes_per_second{{{SEL}}})",
                     "{{instance}} GPU {{gpu}} {{direction}}"),), unit="Bps"),
            Panel("GPU PCIe generation and width (current and max)", "table",
                  (q(f"nodehealth_gpu_pcie_link_generation{{{SEL}}}", "generation"),
                   q(f"nodehealth_gpu_pcie_link_width_lanes{{{SEL}}}", "width"))),
            Panel("GPU PCIe links narrower than their max", "table",
                  (q(f'nodehealth_gpu_pcie_link_width_lanes{{{SEL},bound="current"}} < on (instance, pci_bus_id) '
                     f'nodehealth_gpu_pcie_link_width_lanes{{{SEL},bound="max"}}'),)),
            Panel("GPU PCIe replays per second (5m)", "timeseries",
                  (q(f"rate(nodehealth_gpu_pcie_replays_total{{{SEL}}}[5m])", "{{instance}} GPU {{gpu}}"),)),
            Panel("PCIe throughput per GPU (NVML)", "timeseries",
                  (q(f"nodehealth_gpu_pcie_transmit_bytes_per_second{{{SEL}}}", "{{instance}} GPU {{gpu}} TX"),
                   q(f"nodehealth_gpu_pcie_receive_bytes_per_second{{{SEL}}}", "{{instance}} GPU {{gpu}} RX")),
                  unit="Bps"),
            Panel("Clock event reasons active", "table",
                  (q(f"nodehealth_gpu_clocks_event_active{{{SEL}}} == 1"),),
                  description="gpu_idle and sw_power_cap are normal; the hw_* reasons slow a GPU down."),
            Panel("Share of time in each slowdown (5m)", "timeseries",
                  (q(f"rate(nodehealth_gpu_clocks_event_seconds_total{{{SEL}}}[5m])",
                     "{{instance}} GPU {{gpu}} {{reason}}"),), unit="percentunit"),
            Panel("GPU temperature", "timeseries",
                  (q(f"nodehealth_gpu_temperature_celsius{{{SEL}}}", "{{instance}} GPU {{gpu}}"),), unit="celsius"),
            Panel("GPU power draw and limit", "timeseries",
                  (q(f"nodehealth_gpu_power_watts{{{SEL}}}", "{{instance}} GPU {{gpu}}"),
                   q(f"nodehealth_gpu_power_limit_watts{{{SEL}}}", "{{instance}} GPU {{gpu}} limit")), unit="watt"),
        ]),
        ("Network", [
            Panel("InfiniBand port rate", "timeseries",
                  (q(f"nodehealth_infiniband_port_rate_bytes_per_second{{{SEL}}} * 8",
                     "{{instance}} {{device}}:{{port}}"),),
                  unit="bps", width=8),
            Panel("InfiniBand traffic", "timeseries",
                  (q(f"rate(nodehealth_infiniband_port_transmitted_bytes_total{{{SEL}}}[5m]) * 8",
                     "tx {{instance}} {{device}}:{{port}}"),
                   q(f"rate(nodehealth_infiniband_port_received_bytes_total{{{SEL}}}[5m]) * 8",
                     "rx {{instance}} {{device}}:{{port}}")), unit="bps", width=8),
            Panel("InfiniBand errors (per second)", "timeseries",
                  (q(f"rate(nodehealth_infiniband_port_symbol_errors_total{{{SEL}}}[5m])",
                     "symbol {{device}}:{{port}}"),
                   q(f"rate(nodehealth_infiniband_port_link_downed_total{{{SEL}}}[5m])",
                     "link downed {{device}}:{{port}}"),
                   q(f"rate(nodehealth_infiniband_port_link_error_recoveries_total{{{SEL}}}[5m])",
                     "recovery {{device}}:{{port}}")), width=8),
            Panel("InfiniBand port throughput", "timeseries",
                  (q(f"nodehealth_infiniband_port_throughput_bytes_per_second{{{SEL}}}",
                     "{{instance}} {{device}}:{{port}} {{direction}}"),), unit="Bps"),
            Panel("InfiniBand port throughput as a fraction of its trained rate", "timeseries",
                  (q(f"nodehealth_infiniband_port_throughput_bytes_per_second{{{SEL}}} / ignoring(direction) "
                     f"group_left nodehealth_infiniband_port_rate_bytes_per_second{{{SEL}}}",
                     "{{instance}} {{device}}:{{port}} {{direction}}"),), unit="percentunit"),
            Panel("GPU to nearest RDMA NIC (0 same switch, 1 root complex, 2 NUMA node, 3 across sockets)", "table",
                  (q(f"nodehealth_gpu_nic_relation{{{SEL}}}"),), width=24),
            Panel("RDMA memlock (smallest limit among RDMA processes)", "stat",
                  (q(f"nodehealth_rdma_process_memlock_min_bytes{{{SEL}}}", "{{instance}}"),), unit="bytes", height=5),
            Panel("RDMA WRITE bandwidth per rail and peer (the daemon's periodic tests)", "timeseries",
                  (q(f'nodehealth_rdma_write_bw_gbps{{stat="avg",{SEL}}}',
                     "{{instance}} {{device}}:{{port}} to {{peer}}"),),
                  unit="Gbits", description="Absent while a rail's last test failed: see the next panel."),
            Panel("RDMA tests whose last run failed", "table",
                  (q(f"nodehealth_rdma_bw_last_run_success{{{SEL}}} == 0"),)),
        ]),
        ("PCIe and memory", [
            Panel("PCIe links below their width", "table",
                  (q(f'nodehealth_pcie_link_width_lanes{{{SEL},bound="current"}} < on (instance, pci_bus_id, kind) '
                     f'nodehealth_pcie_link_width_lanes{{{SEL},bound="max"}}'),)),
            Panel("Memory: unusable free space at 2 MiB (Normal zones)", "timeseries",
                  (q(f'nodehealth_memory_zone_unusable_index{{{SEL},zone="Normal"}}', "{{instance}} node {{node}}"),),
                  unit="percentunit"),
            Panel("Memory errors by DIMM (EDAC, since boot)", "timeseries",
                  (q(f"sum by (instance, controller, label, type) (nodehealth_edac_dimm_errors_total{{{SEL}}})",
                     "{{instance}} {{controller}} {{label}} {{type}}"),)),
        ]),
        ("Pingmesh", [
            Panel("Pingmesh: lost fraction by leaf and peer group (5m)", "table",
                  (q("sum by (leaf, peer_group) (rate(nodehealth_pingmesh_lost_total[5m]) * on (instance) group_left "
                     "(leaf) nodehealth_pingmesh_info) / sum by (leaf, peer_group) "
                     "(rate(nodehealth_pingmesh_probes_total[5m]) * on (instance) group_left (leaf) "
                     "nodehealth_pingmesh_info)"),), unit="percentunit"),
            Panel("Pingmesh: p99 round trip by leaf and peer group (TCP connect, 5m)", "table",
                  (q('histogram_quantile(0.99, sum by (leaf, peer_group, le) ('
                     'rate(nodehealth_pingmesh_rtt_seconds_bucket{probe="tcp"}[5m]) * on (instance) group_left (leaf) '
                     'nodehealth_pingmesh_info))'),), unit="s"),
            Panel("Pingmesh: worst peers of the selected nodes (last closed window)", "table",
                  (q(f"topk(20, max by (instance, peer, rail, probe) (nodehealth_pingmesh_peer_loss_ratio{{{SEL}}}))",
                     "loss"),
                   q(f"topk(20, max by (instance, peer, rail, probe) "
                     f"(nodehealth_pingmesh_peer_rtt_p99_seconds{{{SEL}}}))",
                     "p99"))),
            Panel("Pingmesh verdicts (controller)", "table",
                  (q("max by (kind, element) (nodehealth_pingmesh_verdict) == 1"),)),
            Panel("Pingmesh: lost fraction of the selected nodes' probes by peer group", "timeseries",
                  (q(f"sum by (instance, peer_group) (rate(nodehealth_pingmesh_lost_total{{{SEL}}}[5m])) / "
                     f"sum by (instance, peer_group) (rate(nodehealth_pingmesh_probes_total{{{SEL}}}[5m]))",
                     "{{instance}} {{peer_group}}"),), unit="percentunit", width=24),
        ]),
    ]


def fleet_rows() -> list[tuple[str, list[Panel]]]:
    """The fleet: which nodes are sick and why, what quarantine did, and where the hardware is worst."""
    bad_width = ('nodehealth_gpu_pcie_link_width_lanes{bound="current"} < on (instance, pci_bus_id) '
                 'nodehealth_gpu_pcie_link_width_lanes{bound="max"}')
    ib_errors = " + ".join(f"sum by (instance, device, port) (rate(nodehealth_infiniband_port_{c}_total[5m]))"
                           for c in ("symbol_errors", "link_error_recoveries", "link_downed"))
    return [
        ("Verdicts", [
            Panel("Nodes by status", "stat",
                  (q("count(nodehealth_health_status == 0) or vector(0)", "healthy"),
                   q("count(nodehealth_health_status == 1) or vector(0)", "unhealthy"),
                   q("count(nodehealth_health_status == 2) or vector(0)", "unknown")), width=8, height=5,
                  per_node=False),
            Panel("Nodes that are not healthy (1 unhealthy, 2 unknown)", "table",
                  (q("nodehealth_health_status != 0"),), width=16, height=5),
            Panel("Nodes by finding", "table",
                  (q('sort_desc(count by (severity, check, reason) (nodehealth_finding{severity!="info"} == 1))'),),
                  description="How many nodes have each finding; the node dashboard lists them.", per_node=False),
            Panel("Fatal and degraded findings by node", "table",
                  (q('nodehealth_finding{severity=~"fatal|degraded"} == 1'),)),
        ]),
        ("Quarantine", [
            Panel("Tainted nodes (nodehealth taints on the Node)", "table",
                  (q("nodehealth_kube_taint_applied == 1"),)),
            Panel("Taints the circuit breaker withholds", "table", (q("nodehealth_kube_taint_withheld == 1"),)),
            Panel("Circuit breaker", "stat",
                  (q("max(nodehealth_kube_breaker_tripped)", "tripped"),
                   q("max(nodehealth_kube_breaker_quarantined_nodes)", "quarantined nodes"),
                   q("max(nodehealth_kube_breaker_cap_nodes)", "cap")), width=12, height=5, per_node=False),
            Panel("Nodes in dry run or under an operator's hold", "table",
                  (q("nodehealth_kube_dry_run == 1", "dry run"), q("nodehealth_kube_hold == 1", "hold")), height=5),
            Panel("Slurm: nodes drained by nodehealth, by an administrator, and scontrol failing (daemon --slurm)",
                  "table",
                  (q("nodehealth_slurm_drained == 1", "drained by nodehealth"),
                   q("nodehealth_slurm_drained_by_other == 1", "drained by someone else"),
                   q("increase(nodehealth_slurm_errors_total[15m]) > 0", "scontrol failing")), width=24, height=6),
        ]),
        ("GPUs", [
            Panel("Top Xid codes across the fleet (nodes that logged each this boot)", "table",
                  (q("topk(10, count by (xid) (nodehealth_gpu_xid_events_total > 0))"),), per_node=False),
            Panel("GPUs with the most Xid errors this boot", "table",
                  (q("topk(20, sum by (instance, pci_bus_id, xid) (nodehealth_gpu_xid_events_total > 0))"),)),
            Panel("GPU faults by node", "table",
                  (q("count by (instance) (nodehealth_gpu_lost == 1)", "lost GPUs"),
                   q("count by (instance) (nodehealth_gpu_nvlink_active == 0)", "NVLink links down"),
                   q('count by (instance) (nodehealth_gpu_ecc_errors_total{type="uncorrected",scope="volatile"} > 0)',
                     "GPUs with volatile uncorrected ECC errors"),
                   q("count by (instance) (nodehealth_gpu_remapped_rows_pending == 1 or "
                     "nodehealth_gpu_remapped_rows_failure == 1)", "row remap pending or failed"),
                   q('count by (instance) (nodehealth_gpu_clocks_event_active{reason=~"hw_.*"} == 1)',
                     "GPUs in a HW slowdown")), width=24),
        ]),
        ("Network and PCIe", [
            Panel("Worst InfiniBand ports (symbol errors, link recoveries and downs per second, 5m)", "table",
                  (q(f"topk(10, {ib_errors})", "errors per second"),
                   q("nodehealth_infiniband_port_state_id != 4", "not ACTIVE")),
                  description="state_id 4 is ACTIVE; any other state is listed."),
            Panel("PCIe downtrained links", "table",
                  (q('nodehealth_pcie_link_width_lanes{bound="current"} < on (instance, pci_bus_id, kind) '
                     'nodehealth_pcie_link_width_lanes{bound="max"}', "sysfs"),
                   q(bad_width, "GPU (NVML)"))),
            Panel("Slowest RDMA rails (average WRITE bandwidth of the last test, Gb/s)", "table",
                  (q('bottomk(10, nodehealth_rdma_write_bw_gbps{stat="avg"})'),
                   q("nodehealth_rdma_bw_last_run_success == 0", "last test failed"))),
            Panel("Pingmesh verdicts (controller)", "table",
                  (q("max by (kind, element) (nodehealth_pingmesh_verdict) == 1"),), per_node=False),
            Panel("Pingmesh: lost fraction per node (5m)", "table",
                  (q("topk(20, sum by (instance) (rate(nodehealth_pingmesh_lost_total[5m])) / "
                     "sum by (instance) (rate(nodehealth_pingmesh_probes_total[5m])))"),), unit="percentunit"),
        ]),
        ("Memory and training jobs", [
            Panel("Memory fragmentation outliers (unusable free space at 2 MiB, Normal zones)", "table",
                  (q('topk(10, max by (instance) (nodehealth_memory_zone_unusable_index{zone="Normal"}))'),),
                  unit="percentunit"),
            Panel("Hung training jobs and stragglers", "table",
                  (q("nodehealth_hang_detected == 1", "hung"), q("nodehealth_hang_straggler == 1", "straggler"))),
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


def build(uid: str, title: str, rows: list[tuple[str, list[Panel]]], description: str,
          node_variable: bool) -> dict:
    dash = (builder.Dashboard(title).uid(uid).description(description).tags(["nodehealth", "gpu"])
            .timezone("utc").refresh("30s").time("now-6h", "now").version(1)
            .with_variable(builder.DatasourceVariable("datasource").label("Data source").type("prometheus")))
    if node_variable:
        dash = dash.with_variable(
            builder.QueryVariable("instance").label("Node").datasource(DATASOURCE)
            .query("label_values(nodehealth_health_status, instance)").multi(True).include_all(True)
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED))
    else:
        dash = dash.link(builder.DashboardLink("Node dashboard").type(model.DashboardLinkType.LINK)
                         .url(f"/d/{NODE_UID}/nodehealth-node").keep_time(True).include_vars(True))
    panel_id = 0
    for row_title, panels in rows:
        panel_id += 1
        dash = dash.with_row(builder.Row(row_title).id(panel_id))
        for spec in panels:
            panel_id += 1
            dash = dash.with_panel(_panel(spec, panel_id, link_to_node=not node_variable))
    return json.loads(json.dumps(dash.build(), cls=JSONEncoder))


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
    panel = panel.id(panel_id).title(spec.title).datasource(DATASOURCE).span(spec.width).height(spec.height)
    if spec.description:
        panel = panel.description(spec.description)
    if spec.unit:
        panel = panel.unit(spec.unit)
    for i, query in enumerate(spec.queries):
        target = prometheus.Dataquery().ref_id(chr(ord("A") + i)).expr(query.expr).datasource(DATASOURCE)
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
        path = OUTPUTS[uid]
        if args.check:
            try:
                with open(path) as f:
                    current = f.read()
            except FileNotFoundError:
                current = None
            if current != text:
                stale.append(os.path.relpath(path, ROOT))
        else:
            with open(path, "w") as f:
                f.write(text)
    if stale:
        print(f"dashboards/generate.py: out of date: {', '.join(stale)}; run python dashboards/generate.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
