"""Every panel query of the generated dashboards, evaluated on a real Prometheus that scrapes daemons
replaying different fixture machines; each query returns series for exactly the machines it should.

One Prometheus and one set of daemons serve the whole module: a GPU node with a Xid-filled kernel log
and InfiniBand, healthy and sick GPU nodes (a lost GPU, an NVLink down, a downtrained link, a HW
slowdown, ECC errors, a failed row remap), a fragmented host watching two training jobs (one hung,
one with a straggler), a host with memory and storage faults, two pingmesh agents probing each other
and a peer with no agent, and two `--kube` daemons on a fake API server: the lost GPU's node takes
the one quarantine slot, the NVLink-down node trips the circuit breaker.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse

import pytest
from conftest import HERE, DaemonProcess, free_port, http_get, machine, require_tool
from fake_kube_apiserver import FakeApiServer
from test_hang_detector import make_record, publish, start_ticks
from test_hang_merge import lockstep

from nodehealth.hang.detector import DEFAULTS as HANG_DEFAULTS

DASHBOARDS = os.path.join(os.path.dirname(HERE), "dashboards")
FILES = ("nodehealth-node.json", "nodehealth-fleet.json")
SLEEPER = "import time\ntime.sleep(600)\n"


def targets():
    """(file, panel title, refId, expr) of every query of both dashboards."""
    out = []
    for name in FILES:
        with open(os.path.join(DASHBOARDS, name)) as f:
            dashboard = json.load(f)
        for panel in dashboard["panels"]:
            for t in panel.get("targets", []):
                out.append((name, panel["title"], t["refId"], t["expr"]))
    return out


def link_of(title: str) -> str:
    """The data link of a fleet panel."""
    with open(os.path.join(DASHBOARDS, F)) as f:
        (panel,) = [p for p in json.load(f)["panels"] if p["title"] == title]
    (link,) = panel["fieldConfig"]["defaults"]["links"]
    return link["url"]


class Empty:
    """A query no fixture makes non-empty: it must still evaluate, and return nothing here."""

    def __init__(self, why: str):
        self.why = why


AGGREGATE = "aggregate"  # series without an instance label (counts over the fleet): non-empty
GPU_NODES = {"nvml-h100-healthy", "nvml-h100-xid79-lost", "nvml-h100-nvlink-down", "nvml-h100-pcie-downtrained",
             "nvml-h100-hw-slowdown", "nvml-a100-remap-failure", "nvml-h100-volatile-dbe"}
KMSG = {"h100-8x-cx7", "nvml-h100-xid79-lost", "host-faults"}  # machines with a kernel log (dev/kmsg)
BUDDY = {"h100-8x-cx7", "fragmented", "host-faults"}  # machines with /proc/buddyinfo
PINGMESH = {"nvml-h100-healthy", "nvml-h100-hw-slowdown"}
EVERY = GPU_NODES | KMSG | BUDDY
UNHEALTHY = EVERY - {"nvml-h100-healthy"}
SLURM = Empty("no daemon here runs --slurm; tests/test_slurm.py reads these families from one against a real "
              "slurmctld")
RDMA = Empty("no verbs device here; the VM tier (tests/test_vm_tier.py) reads these families from a daemon testing "
             "rxe0")
THROUGHPUT = Empty("a rate between two passes; a replayed machine's clock (its proc/uptime) never moves")

# (file, panel title, refId) -> the fixture machines whose instance the query returns.
N, F = FILES
EXPECTED = {
    (N, "Node verdict", "A"): EVERY,
    (N, "Current findings by severity", "A"): AGGREGATE,
    (N, "Collectors failing", "A"): Empty("every fixture machine's supported collectors succeed"),
    (N, "Findings", "A"): UNHEALTHY,
    (N, "Agent workers down", "A"): Empty("every fixture daemon's workers run"),
    (N, "GPU Xid events (per hour)", "A"): {"h100-8x-cx7", "nvml-h100-xid79-lost"},
    (N, "Kernel events (per hour)", "A"): KMSG,
    (N, "Hardware errors in the kernel log (per hour)", "A"): KMSG,
    (N, "Kernel crashes, stalls and NIC faults (per hour)", "A"): KMSG,
    (N, "Storage errors in the kernel log (per hour)", "A"): KMSG,
    (N, "Kernel log records lost to ring-buffer overrun (per hour)", "A"): KMSG,
    (N, "GPUs lost (NVML: fell off the bus)", "A"): {"nvml-h100-xid79-lost"},
    (N, "Volatile ECC errors (since the driver loaded)", "A"): GPU_NODES,
    (N, "Remapped rows", "A"): GPU_NODES,
    (N, "Row remaps pending (reset the GPU) or failed (RMA candidate)", "A"):
        Empty("nvml-a100-remap-pending is not among the daemons; its failure twin is"),
    (N, "Row remaps pending (reset the GPU) or failed (RMA candidate)", "B"): {"nvml-a100-remap-failure"},
    (N, "NVLink links down", "A"): {"nvml-h100-nvlink-down"},
    (N, "Active NVLink links per GPU", "A"): GPU_NODES,
    (N, "NVLink errors per second, by type", "A"): GPU_NODES,
    (N, "NVLink throughput per GPU (sum of its links, by direction)", "A"): THROUGHPUT,
    (N, "GPU PCIe generation and width (current and max)", "A"): GPU_NODES,
    (N, "GPU PCIe generation and width (current and max)", "B"): GPU_NODES,
    (N, "GPU PCIe links narrower than their max", "A"): {"nvml-h100-pcie-downtrained"},
    (N, "GPU PCIe replays per second", "A"): GPU_NODES,
    (N, "PCIe throughput per GPU (NVML)", "A"): GPU_NODES,
    (N, "PCIe throughput per GPU (NVML)", "B"): GPU_NODES,
    (N, "Clock event reasons active", "A"): GPU_NODES - {"nvml-a100-remap-failure"},  # its GPUs: none
    (N, "Share of time in each slowdown", "A"): GPU_NODES - {"nvml-a100-remap-failure"},  # no fields 269-271
    (N, "GPU temperature", "A"): GPU_NODES,
    (N, "GPU power draw and limit", "A"): GPU_NODES,
    (N, "GPU power draw and limit", "B"): GPU_NODES,
    (N, "InfiniBand port rate", "A"): {"h100-8x-cx7"},
    (N, "InfiniBand traffic", "A"): {"h100-8x-cx7"},
    (N, "InfiniBand traffic", "B"): {"h100-8x-cx7"},
    (N, "InfiniBand errors (per second)", "A"): {"h100-8x-cx7"},
    (N, "InfiniBand errors (per second)", "B"): {"h100-8x-cx7"},
    (N, "InfiniBand errors (per second)", "C"): {"h100-8x-cx7"},
    (N, "InfiniBand port throughput", "A"): THROUGHPUT,
    (N, "InfiniBand port throughput as a fraction of its trained rate", "A"): THROUGHPUT,
    (N, "GPU to nearest RDMA NIC", "A"):
        Empty("the PCIe trees with GPUs and NICs are in tests/fixtures/topology, not in a whole fixture machine"),
    (N, "RDMA memlock (smallest limit among RDMA processes)", "A"): {"h100-8x-cx7"},
    (N, "RDMA WRITE bandwidth per rail and peer (the daemon's periodic tests)", "A"): RDMA,
    (N, "RDMA tests whose last run failed", "A"): RDMA,
    (N, "PCIe links below their width", "A"): Empty("no fixture machine has a sysfs link narrower than its max"),
    (N, "Memory: unusable free space at 2 MiB (Normal zones)", "A"): BUDDY,
    (N, "Memory errors by DIMM (EDAC, since boot)", "A"): {"host-faults"},
    (N, "Pingmesh: lost fraction by leaf and peer group", "A"): AGGREGATE,
    (N, "Pingmesh: p99 round trip by leaf and peer group (TCP connect)", "A"): AGGREGATE,
    (N, "Pingmesh: worst peers of the selected nodes (last closed window)", "A"): PINGMESH,
    (N, "Pingmesh: worst peers of the selected nodes (last closed window)", "B"): PINGMESH,
    (N, "Pingmesh verdicts (controller)", "A"): Empty("the controller (tests/test_controller.py) is not scraped here"),
    (N, "Pingmesh: lost fraction of the selected nodes' probes by peer group", "A"): PINGMESH,
    (F, "Nodes by status", "A"): AGGREGATE,
    (F, "Nodes by status", "B"): AGGREGATE,
    (F, "Nodes by status", "C"): AGGREGATE,
    (F, "Nodes that are not healthy", "A"): UNHEALTHY,
    (F, "Nodes by finding", "A"): AGGREGATE,
    (F, "Fatal and degraded findings by node", "A"): UNHEALTHY,
    (F, "Tainted nodes (nodehealth taints on the Node)", "A"): {"nvml-h100-xid79-lost"},
    (F, "Taints the circuit breaker withholds", "A"): {"nvml-h100-nvlink-down"},
    (F, "Circuit breaker", "A"): AGGREGATE,
    (F, "Quarantined nodes and the cap", "A"): AGGREGATE,
    (F, "Quarantined nodes and the cap", "B"): AGGREGATE,
    (F, "Nodes in dry run or under an operator's hold", "A"): Empty("the --kube daemons write (no --dry-run)"),
    (F, "Nodes in dry run or under an operator's hold", "B"): Empty("no hold annotation on their Nodes"),
    (F, "Slurm: nodes drained by nodehealth or by someone else (daemon --slurm)", "A"): SLURM,
    (F, "Slurm: nodes drained by nodehealth or by someone else (daemon --slurm)", "B"): SLURM,
    (F, "Slurm: scontrol failing (daemon --slurm)", "A"): SLURM,
    (F, "Top Xid codes across the fleet (nodes that logged each this boot)", "A"): AGGREGATE,
    (F, "GPUs with the most Xid errors this boot", "A"): {"h100-8x-cx7", "nvml-h100-xid79-lost"},
    (F, "GPU faults by node", "A"): {"nvml-h100-xid79-lost"},
    (F, "GPU faults by node", "B"): {"nvml-h100-nvlink-down"},
    (F, "GPU faults by node", "C"): {"nvml-h100-volatile-dbe"},
    (F, "GPU faults by node", "D"): {"nvml-a100-remap-failure"},
    (F, "GPU faults by node", "E"): {"nvml-h100-hw-slowdown"},
    (F, "Worst InfiniBand ports (symbol errors, link recoveries and downs per second)", "A"): {"h100-8x-cx7"},
    (F, "InfiniBand ports not ACTIVE", "A"): Empty("every InfiniBand port of h100-8x-cx7 is ACTIVE"),
    (F, "PCIe downtrained links", "A"): Empty("no fixture machine has a sysfs link narrower than its max"),
    (F, "PCIe downtrained links", "B"): {"nvml-h100-pcie-downtrained"},
    (F, "Slowest RDMA rails (average WRITE bandwidth of the last test)", "A"): RDMA,
    (F, "RDMA tests whose last run failed", "A"): RDMA,
    (F, "Pingmesh verdicts (controller)", "A"): Empty("the controller (tests/test_controller.py) is not scraped here"),
    (F, "Pingmesh: lost fraction per node", "A"): PINGMESH,
    (F, "Memory fragmentation outliers (unusable free space at 2 MiB, Normal zones)", "A"): BUDDY,
    (F, "Hung training jobs and stragglers", "A"): {"fragmented"},
    (F, "Hung training jobs and stragglers", "B"): {"fragmented"},
}


def substitute(expr: str, instances: list[str]) -> str:
    """The dashboards as Grafana runs them with every node selected: `All` nodes are the values as a regex
    alternation; `All` clusters the variable's `.*` (the fixture series carry no cluster label, as in a
    Prometheus of one cluster); $__rate_interval 5 minutes (Grafana derives it from the step and the
    scrape interval; any window of a few scrapes serves here)."""
    alternation = "(" + "|".join(re.escape(i) for i in instances) + ")"
    return (expr.replace("$node", alternation.replace("\\", "\\\\")).replace("$cluster", ".*")
            .replace("$__rate_interval", "5m"))


def query(base: str, expr: str) -> dict:
    code, body = http_get(f"{base}/api/v1/query?query={urllib.parse.quote(expr)}", timeout=5.0)
    return json.loads(body) if body else {"status": "error", "error": f"HTTP {code}"}


def wait_until(fn, what: str, deadline: float, procs=()):
    while time.monotonic() < deadline:
        for name, p in procs:
            if p.poll() is not None:
                pytest.fail(f"{name} exited")
        value = fn()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    prometheus = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("fleet")
    api = FakeApiServer().start()
    for node in ("gpu-lost", "gpu-nvlink"):
        api.add_node(node, labels={"nvidia.com/gpu.present": "true"})
    sleepers = [subprocess.Popen([sys.executable, "-c", SLEEPER]) for _ in range(5)]
    daemons, prom = {}, None
    try:
        kube_cfg = tmp / "kube.json"
        kube_cfg.write_text(json.dumps({"kube": {
            "kubeconfig": api.kubeconfig(str(tmp / "kubeconfig")), "retry_initial_seconds": 0.1,
            "retry_max_seconds": 0.5}}))  # the default cap: 10 % of 2 GPU nodes, so one node
        # Two jobs on the fragmented host: "stuck" waits 10 s in an all_reduce (over the 1 s floor),
        # "slow" has a rank whose collectives finish far sooner than its peers' (it arrives last).
        hang_dir = tmp / "hang"
        hang_dir.mkdir()
        time.sleep(0.3)  # the sleepers' start times are readable
        stuck = [make_record(r, p.pid, start_ticks(p.pid), 5, 4, job="stuck") for r, p in enumerate(sleepers[:2])]
        slow = [make_record(r, p.pid, start_ticks(p.pid), 60, 60, world=3, job="slow")
                for r, p in enumerate(sleepers[2:])]
        uneven = lockstep(4, lambda step, r: 0.3 if r == 1 else 0.1, ranks=3)  # rank 1 computes 3x as long
        for r, rec in enumerate(slow):
            rec["host"] = "fragmented"
            rec["groups"]["0"] = uneven[str(r)]["groups"]["0"]
        publish(hang_dir, stuck + slow)
        hang_cfg = tmp / "hang.json"
        hang_cfg.write_text(json.dumps({"hang": {
            "floor_seconds": 1.0, "native_stacks": False, "straggler_scans": 2, "scan_interval_seconds": 0.5,
            "heartbeat_timeout_seconds": HANG_DEFAULTS["heartbeat_timeout_seconds"] * 10,
            "bundle_dir": str(tmp / "bundles")}}))
        # Two pingmesh agents on one leaf probe each other (one port pair for the mesh, on their own
        # loopback addresses) and a node on another leaf with no agent: its Pings are lost.
        mesh_port, tcp_port = free_port(), free_port()
        inventory = tmp / "inventory.json"
        inventory.write_text(json.dumps({"nodes": [
            {"name": "gpu-a", "leaf": "leaf-1", "address": "127.0.0.2"},
            {"name": "gpu-b", "leaf": "leaf-1", "address": "127.0.0.3"},
            {"name": "gpu-gone", "leaf": "leaf-2", "address": "127.0.0.4"}]}))
        mesh_cfg = tmp / "mesh.json"
        mesh_cfg.write_text(json.dumps({"pingmesh": {
            "window_seconds": 2.0, "port": mesh_port, "tcp_port": tcp_port, "refresh_seconds": 1.0,
            "probe_interval_seconds": 0.5, "ping_interval_seconds": 0.5, "timeout_seconds": 0.5,
            # every answered peer gets its p99 series, not only a slow one: loopback is never slow
            "peer_series_p99_seconds": 1e-9}}))
        extra = {
            "nvml-h100-xid79-lost": ("--kube", "--config", str(kube_cfg), "--node-name", "gpu-lost"),
            "nvml-h100-nvlink-down": ("--kube", "--config", str(kube_cfg), "--node-name", "gpu-nvlink"),
            "fragmented": ("--hang-dir", str(hang_dir), "--config", str(hang_cfg)),
            "nvml-h100-healthy": ("--node-name", "gpu-a", "--config", str(mesh_cfg), "--probe-inventory",
                                  str(inventory), "--probe-listen", f"127.0.0.2:{mesh_port}"),
            "nvml-h100-hw-slowdown": ("--node-name", "gpu-b", "--config", str(mesh_cfg), "--probe-inventory",
                                      str(inventory), "--probe-listen", f"127.0.0.3:{mesh_port}"),
        }
        def start(name: str) -> None:
            daemons[name] = DaemonProcess(machine(name), str(tmp / name), *extra.get(name, ()), interval=2.0)
        for name in sorted(EVERY - {"nvml-h100-nvlink-down"}):
            start(name)
        # The lost GPU's node takes the one quarantine slot; then the NVLink-down node asks for one,
        # trips the circuit breaker and has its taint withheld.
        wait_until(lambda: any(t["key"] == "nodehealth.io/gpu" for t in api.node("gpu-lost")["spec"].get("taints", [])),
                   "the lost GPU's Node tainted", time.monotonic() + 30, [(n, d.proc) for n, d in daemons.items()])
        start("nvml-h100-nvlink-down")
        instance = {name: f"127.0.0.1:{d.port}" for name, d in daemons.items()}
        port = free_port()
        (tmp / "prometheus.yml").write_text(json.dumps({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": "nodehealth",
                                "static_configs": [{"targets": sorted(instance.values())}]}]}))
        log = open(tmp / "prometheus.log", "wb")
        prom = subprocess.Popen([prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT)
        log.close()
        base = f"http://127.0.0.1:{port}"
        for d in daemons.values():
            d.wait_ready(30.0)
        procs = [("prometheus", prom)] + [(n, d.proc) for n, d in daemons.items()]
        deadline = time.monotonic() + 60

        def ready(expr: str, count: int = 1):
            def check():
                try:
                    result = query(base, expr)
                except OSError:
                    return False
                return len(result.get("data", {}).get("result", [])) >= count
            return check
        # Three scrapes of every daemon, so that rate() and increase() have two samples in any window.
        wait_until(ready("count_over_time(nodehealth_health_status[1m]) >= 3", len(daemons)),
                   "three scrapes of every daemon", deadline, procs)
        wait_until(ready("nodehealth_kube_taint_applied == 1"), "the taint on the lost GPU's Node", deadline, procs)
        wait_until(ready("nodehealth_kube_taint_withheld == 1"), "the NVLink-down node's taint withheld", deadline,
                   procs)
        wait_until(ready("nodehealth_kube_breaker_tripped == 1"), "the breaker tripped", deadline, procs)
        wait_until(ready("nodehealth_hang_detected == 1"), "the hung job", deadline, procs)
        wait_until(ready("nodehealth_hang_straggler == 1"), "the straggler", deadline, procs)
        wait_until(ready("nodehealth_pingmesh_peer_rtt_p99_seconds", 2), "a closed pingmesh window on both agents",
                   deadline, procs)
        wait_until(ready("count_over_time(nodehealth_pingmesh_lost_total[1m]) >= 2", 2), "two scrapes of the mesh",
                   deadline, procs)
        yield base, instance
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(10)
        for d in daemons.values():
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
        for p in sleepers:
            p.kill()
            p.wait()
        api.close()


def test_every_query_has_an_expectation():
    keys = {(f, title, ref) for f, title, ref, _ in targets()}
    assert keys == set(EXPECTED), (sorted(keys - set(EXPECTED)), sorted(set(EXPECTED) - keys))


@pytest.mark.parametrize("file,title,ref,expr", targets(), ids=[f"{f[11:-5]}:{t}:{r}" for f, t, r, _ in targets()])
def test_panel_query_returns_the_machines_it_should(fleet, file, title, ref, expr):
    base, instance = fleet
    body = query(base, substitute(expr, sorted(instance.values())))
    assert body["status"] == "success", body
    series = body["data"]["result"]
    expected = EXPECTED[(file, title, ref)]
    if isinstance(expected, Empty):
        assert series == [], f"{expected.why}, yet: {series[:3]}"
        return
    assert series, "no series"
    if expected == AGGREGATE:
        assert all("instance" not in s["metric"] for s in series), series[:3]
        assert file == N or link_of(title).endswith("var-node=$__all"), "a count over nodes opens them all"
        return
    assert file == N or not link_of(title).endswith("var-node=$__all"), "a node's series opens its node"
    by_instance = {v: k for k, v in instance.items()}
    got = {by_instance.get(s["metric"].get("instance"), s["metric"].get("instance")) for s in series}
    assert got == expected, (sorted(got - expected), sorted(expected - got))


def test_hang_series_keep_their_training_job_label_after_the_scrape(fleet):
    """Prometheus renames a target's own `job` label to `exported_job` (its `job` is the scrape job)."""
    base, _ = fleet
    series = query(base, "nodehealth_hang_detected")["data"]["result"]
    assert series and all(s["metric"].get("training_job") and "exported_job" not in s["metric"] for s in series), series


def test_the_annotation_queries_run_and_mark_the_tainted_node(fleet):
    base, instance = fleet
    by_instance = {v: k for k, v in instance.items()}
    for name in FILES:
        with open(os.path.join(DASHBOARDS, name)) as f:
            annotations = {a["name"]: a["expr"] for a in json.load(f)["annotations"]["list"]}
        for title, expr in annotations.items():
            body = query(base, substitute(expr, sorted(instance.values())))
            assert body["status"] == "success", (name, title, body)
        tainted = query(base, substitute(annotations["nodehealth taints"], sorted(instance.values())))
        assert {by_instance[s["metric"]["instance"]] for s in tainted["data"]["result"]} == {"nvml-h100-xid79-lost"}
