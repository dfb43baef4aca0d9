"""Configuration: defaults from every collector and check, a file (YAML or JSON), then flags.

Validation is strict and its errors say where: an unknown key or a value of the wrong type is a
ConfigError naming the dotted path, never a crash later in a pass.
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any

from nodehealth import registry

POLICY_DEFAULTS: dict[str, Any] = {
    # A performance finding needs this many consecutive bad passes to be raised ...
    "raise_after_passes": 2,
    # ... and this many good passes, and at least this long, to clear.
    "clear_after_passes": 3,
    "clear_after_seconds": 300.0,
    # A counter-increase finding (an IB link went down once, a non-fatal PCIe error) stays this long
    # after the last increase, so that it is seen and alerted on (gpud holds link drops 10 min).
    "event_hold_seconds": 600.0,
}

DAEMON_DEFAULTS: dict[str, Any] = {
    "listen": "0.0.0.0:9456",
    "interval_seconds": 30.0,
    "state_dir": "/var/lib/nodehealth",
    "collector_timeout_seconds": 10.0,
}


# The Kubernetes face (nodehealth/kube.py).
KUBE_DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "domain": "nodehealth.io/",
    "kubeconfig": "",  # empty: in-cluster config, else ~/.kube/config
    "dry_run": False,
    # Subsystems whose fatal findings evict untolerated pods (NoExecute) instead of NoSchedule.
    # NoExecute deletes pods without honouring PodDisruptionBudgets: leave draining to a remediator.
    "noexecute_subsystems": [],
    "heartbeat_seconds": 300.0,  # conditions' lastHeartbeatTime refresh (node-problem-detector: 5 min)
    "resync_seconds": 60.0,  # re-read the node: hold/clear annotations, taints someone removed
    "request_timeout_seconds": 10.0,
    "retry_initial_seconds": 1.0,
    "retry_max_seconds": 300.0,
    "conflict_retries": 5,  # 409s answered at once by a fresh read, before backing off
    "event_namespace": "default",  # where the kubelet records node events
    "breaker_enabled": True,
    "breaker_namespace": "nodehealth",
    "breaker_name": "nodehealth-quarantine",
    "max_quarantined_fraction": 0.1,  # of the managed nodes; the cap is at least 1 node
    "managed_node_selector": "nvidia.com/gpu.present=true",
    "managed_nodes_refresh_seconds": 300.0,
}


# The Slurm face (nodehealth/slurm.py): `nodehealth slurm` as HealthCheckProgram or Prolog, or the
# daemon draining on its own passes (`daemon --slurm`) instead of Kubernetes taints.
SLURM_DEFAULTS: dict[str, Any] = {
    "enabled": False,  # the daemon drains and resumes this node in Slurm
    "node_name": "",  # Slurm's name for this node; empty: $SLURMD_NODENAME, else the short hostname
    # The daemon calls scontrol when the verdict changes, and this often besides to put back a drain that
    # was lifted while the fault stays: Slurm's own HealthCheckInterval is commonly 300 s, and a call per
    # pass from every node would load slurmctld for nothing.
    "resync_seconds": 300.0,
    "scontrol": "scontrol",  # found on PATH; slurm.conf's location comes from $SLURM_CONF as for scontrol
    # slurmctld may be restarting (upgrade, failover): try this many times, this far apart, before
    # giving up. Slurm runs HealthCheckProgram again at the next HealthCheckInterval anyway, so a few
    # seconds of patience is enough and keeps a Prolog from holding a job start for long.
    "attempts": 3,
    "retry_delay_seconds": 2.0,
    "timeout_seconds": 10.0,  # one scontrol call; slurm's own MessageTimeout defaults to 10 s
    # Slurm shows the reason in sinfo -R; nodehealth's are a few words, longer ones are cut here.
    "reason_max_chars": 120,
}


# Hang detection for distributed training (nodehealth/hang/detector.py).
HANG_DEFAULTS: dict[str, Any] = {
    "enabled": False,  # the daemon watches `directory` for hung ranks
    # Where training processes publish their records ($NODEHEALTH_HANG_DIR of the ranks).
    "directory": "/run/nodehealth/hang",
    # Where bundles go; empty: <state_dir>/hang in the daemon, DIR/bundles for `hang watch DIR`.
    "bundle_dir": "",
    # A pending op is hung when older than max(floor, factor x its p99); below the PG timeout
    # (10 min NCCL, 30 min gloo) with room for the dumps.
    "floor_seconds": 180.0,
    "p99_factor": 10.0,
    "min_samples": 20,  # fewer completed ops than this: the floor alone decides
    "heartbeat_timeout_seconds": 60.0,
    "stale_record_seconds": 3600.0,  # records whose heartbeat is older than this belong to dead jobs
    "scan_interval_seconds": 1.0,
    "py_spy": "py-spy",
    "stack_timeout_seconds": 10.0,
    "native_stacks": True,
    "native_timeout_seconds": 30.0,
    "parallel_dumps": 8,
    "flight_recorder_timeout_seconds": 15.0,
    # Any user of the node can write records, so the work a scan does for them is bounded; owners
    # take turns, so one user's flood cannot starve another's job. A node runs a few jobs of at most
    # a few hundred local ranks.
    "max_records_per_scan": 2048,
    "max_scan_bytes": 32 << 20,  # records read per scan, all together (each is at most 256 KiB)
    "max_jobs_per_scan": 64,
    # py-spy stops its target: a hang needs one bundle, not one per second of a moving stall point.
    "dumps_per_minute": 6,  # bundles on this node, all jobs together
    "job_dump_interval_seconds": 120.0,  # between two bundles of one job
    "process_dump_interval_seconds": 60.0,  # between two dumps of one process
    "max_children_per_rank": 8,  # DataLoader workers and other children dumped under their rank
    "max_metric_series": 512,  # per-rank series over all jobs; hung jobs come first
    # Bundles land in the daemon's state directory: bound each and all of them, oldest go first.
    "max_bundle_bytes": 8 << 20,
    "max_bundle_dir_bytes": 256 << 20,
    "max_bundles": 200,
    # A straggler: its collectives are this many times shorter than the median of the others'
    # (they wait for it), by at least min_wait, with enough samples, in this many scans in a row.
    # Medians (p50) over the timer's last 256 ops, so a slow step now and then is not a straggler;
    # a wait under 50 ms per collective is noise next to a training step.
    "straggler_ratio": 3.0,
    "straggler_min_wait_seconds": 0.05,
    "straggler_scans": 5,
}


# Pingmesh: the probe agent in the daemon, the pinglist, the analysis and the controller
# (nodehealth/probe, nodehealth/net, nodehealth/controller.py). Off unless enabled.
PINGMESH_DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "listen": "0.0.0.0:9457",  # the gRPC Ping service; TCP probes on the same address at tcp_port
    # Static inventory (YAML or JSON: nodes with leaf, pod, addresses); empty: in Kubernetes, the
    # controller's inventory ConfigMap built from Node labels.
    "inventory_file": "",
    "labels": {"leaf": "nodehealth.io/leaf", "pod": "nodehealth.io/pod"},
    "addresses_annotation": "nodehealth.io/probe-addresses",  # "10.0.1.1,10.1.1.1": one per rail
    "port": 9457,  # the peers' Ping port
    "tcp_port": 9459,  # the peers' TCP probe port: accepted and closed at once, cheaper than gRPC's
    "probe_interval_seconds": 10.0,  # between two probes of the same peer (Pingmesh: >= 10 s)
    "timeout_seconds": 2.0,  # an unanswered probe is lost after this (kubeservice pingmesh-agent: 2 s)
    "tcp_probe": True,  # time a TCP connect to each peer on each rail (SYN round trip; retransmits infer drops)
    # The gRPC Ping goes to each peer on the first rail both share; every rail costs a channel and
    # calls per rail (at 8 rails over the agent's CPU and memory budget, benchmarks/RESULTS.md).
    "ping_all_rails": False,
    "payload_bytes": 64,
    "max_concurrency": 16,  # probes in flight at once
    "max_probes_per_second": 100.0,  # across all peers; past it probes are skipped and counted
    "window_seconds": 30.0,  # R-Pingmesh's window; windows are aligned to the wall clock
    # Windows an agent keeps for /v1/pingmesh: the controller reads fetch_windows (6) of them; ten
    # keep five minutes for an operator's `pingmesh analyze` (each costs ~0.25 MiB at 330 peers).
    "windows_kept": 10,
    "refresh_seconds": 300.0,  # re-read the inventory and recompute the pinglist
    "epoch_seconds": 3600.0,  # inter-leaf representatives rotate every epoch
    "inter_leaf_pairs": 2,  # representative server pairs per leaf pair and rail
    "max_peer_groups": 16,  # metric peer groups: each other leaf while leaves are few, else pods
    # Nodes without a leaf are meshed in groups of this many, in name order (hostnames usually count along
    # racks): one leaf-sized group each keeps a cluster without leaf labels from becoming one full mesh.
    "unknown_leaf_group_size": 32,
    # Per-peer series only for peers over one of these in the last closed window, at most this many.
    "peer_series_loss_fraction": 0.01,
    "peer_series_p99_seconds": 0.01,
    "max_peer_series": 50,
    "controller_namespace": "nodehealth",
    "configmap": "nodehealth-pingmesh",  # the controller's verdicts, read by every agent every window
    # The controller's inventory, in a ConfigMap of its own: up to ~0.7 MiB (10,000 nodes x 8 rails,
    # gzipped, base64) that the agents need only every refresh_seconds and the controller rewrites only
    # when it changed. Beside the verdicts, 10,000 agents would pull it every window (~250 MB/s).
    "inventory_configmap": "nodehealth-pingmesh-inventory",
    "controller_lease": "nodehealth-controller",  # leader election of the controller replicas (that namespace)
    "controller_listen": "0.0.0.0:9458",  # the controller's /metrics and /healthz (9456 agents, 9457 Ping)
    # The leader fetches every agent's /v1/pingmesh (the daemon's listen port) this many at once,
    # which hides the network's round trips (decoding, below, is what bounds a cycle), each within
    # this time: a stalled agent costs one slot for 3 s, never the whole analysis.
    "fetch_concurrency": 64,
    "fetch_timeout_seconds": 3.0,
    # Newest windows kept from each agent, the newest still open; the closed ones must cover
    # analysis.open_windows + close_windows (2 + 3). The first cycle fetches them all; later cycles
    # only what closed since (?since=), each decoded once (~1 ms of CPU per agent and window at 330
    # peers) and kept folded (~30 bytes per peer node and window), so no more than needed.
    "fetch_windows": 6,
    # Localization over the agents' summaries (nodehealth/net/pingmesh.py), judged per closed window.
    "analysis": {
        # A leaf-to-leaf edge is bad at this loss: R-Pingmesh's SLA (loss > 0.02 in a 30 s window).
        "loss_fraction": 0.02,
        # A node is bad at this loss over its probes with its leaf-mates: pooled over a few hundred
        # peers, 1% loss on one link stands out, while normal drop is 1e-4 to 1e-5 (Pingmesh): 50x margin.
        "node_loss_fraction": 0.005,
        # ... and must be this unlikely (Poisson) at the median node's loss rate: where the whole mesh
        # loses a little more than usual, a node with a few losses more is not yet a faulty node.
        "significance": 0.0001,
        # An aggregate (a node's, a leaf edge's) needs this many probes before it is judged at all:
        # below it one lost probe is already 10%.
        "min_probes": 10,
        # ... and this many lost (or slow) probes before it counts as bad: at 1e-4 background loss,
        # 3 losses among a few hundred probes happen once in ~10^5 windows; one or two are noise.
        "min_bad_probes": 3,
        # Latency is bad when p99 exceeds this many times the baseline (the median p99 of comparable
        # edges: intra-leaf with intra-leaf, leaf-to-leaf with leaf-to-leaf; buckets are ~2.5x apart) ...
        "p99_factor": 3.0,
        # ... and this floor: gRPC Ping round trips go through two Python processes, and Pingmesh's
        # normal intra-DC p99 is a few milliseconds (R-Pingmesh's 500 us is for RDMA hardware stamps).
        "p99_floor_seconds": 0.005,
        # Hysteresis over windows (R-Pingmesh's localizer): a verdict opens after this many
        # consecutive bad windows, so one noisy window names nothing ...
        "open_windows": 2,
        # ... and closes after this many good ones, so a flapping element does not flap its verdict.
        "close_windows": 3,
        # A node that answers none of the probes of at least this fraction of its probers is unreachable
        # (most of them, not all: a peer on the same dead link segment may still reach it).
        "node_bad_peer_fraction": 0.8,
        # A leaf is at fault when this fraction of its nodes (inside) or of its edges to other leaves
        # (in or out) is bad: R-Pingmesh's inFrac/outFrac threshold.
        "leaf_fraction": 0.6,
        # Independent evidence a verdict needs: agents reporting on a node or a path, healthy
        # leaf-mates to compare a node with, other leaves seen from a leaf. Fewer: inconclusive.
        "min_reporters": 2,
        # Newest windows analysed, all the agents keep (pingmesh.windows_kept): enough history to
        # open and to close a verdict without state of our own.
        "max_windows": 20,
    },
}


# The daemon's periodic RDMA WRITE bandwidth tests (nodehealth/rdma_periodic.py); the `rdma_bw` check
# judges them. Off unless enabled: a test fills the rail for its duration, and a fleet chooses when.
RDMA_BW_DEFAULTS: dict[str, Any] = {
    "enabled": False,
    # Addresses or names of the peers whose daemons serve the test, taken in turn round after round so
    # that a rail meets different peers. Empty: this node's leaf-mates in pingmesh.inventory_file when
    # one is set, else no test is started and the daemon only serves its peers.
    "peers": [],
    "rails": [],  # "device:port" or "device" (port 1); empty: every ACTIVE port, sorted. Rail i serves on port + i
    "serve": True,  # serve the test to peers, one client at a time per rail
    # Whose clients the servers take: addresses, CIDR networks ("10.0.0.0/8"; "0.0.0.0/0" and "::/0"
    # for anyone) or names. Empty: the peers above (or the leaf-mates). Others are refused and counted.
    "serve_to": [],
    "listen": "0.0.0.0",
    "port": 18515,  # perftest's out-of-band port, for rail 0
    "interval_seconds": 3600.0,  # between rounds; a round tests every rail once, one test at a time
    "duration_seconds": 5.0,  # per test: perftest's -D default, long enough to leave its warm-up behind
    "size": 65536,  # perftest's default message size, which the check's line-rate fractions are measured at
    "gid_index": -1,  # RoCE; -1 picks a RoCE v2 GID with an IPv4 address per port; InfiniBand uses LIDs
    "timeout_seconds": 10.0,  # a peer that does not answer the out-of-band exchange in this time is unavailable
    # After start, before the first round: peers restarted in the same rollout need a moment to serve.
    "start_delay_seconds": 60.0,
    "history": 8,  # runs kept per rail (the check looks at the newest few in a row)
}
# The bounds a test may not exceed: a test holds its rail and a CPU core while it runs.
RDMA_BW_MAX_DURATION_SECONDS = 60.0
RDMA_BW_MAX_PEERS = 64  # per rail, the series of the newest run against each peer
RDMA_BW_MAX_SERVE_TO = 256  # its names are resolved again every minute, when a client comes

# `nodehealth netcheck` (nodehealth/net/netcheck.py, nodehealth/net/preflight.py): a job's network
# preflight, run by every node of the job before it starts. Flags override each key.
NETCHECK_DEFAULTS: dict[str, Any] = {
    "port": 9460,  # every node's agent (9456 daemon, 9457 Ping, 9458 controller, 9459 TCP probe)
    # auto: rdma-bw where every agent found a verbs device for its data address, else the TCP
    # stream test for all (two methods' bandwidths do not compare); tcp or rdma force one.
    "method": "auto",
    # One test's length. Two seconds of TCP or RDMA WRITE reach a steady rate on a real link and
    # keep a 1000-node job's preflight (at most ~4 rounds when up to half the nodes are bad) well
    # under a minute; perftest's default of 5000 x 64 KiB lasts well under a second on 100 Gb/s.
    "seconds": 2.0,
    # A test slower than this fraction of the median of the passed tests is slow. A link that
    # trained at half its rate, or a NIC on a x8 instead of a x16 slot, falls below it, while the run
    # to run spread of healthy pairs (a few percent on hardware, ~30 % on a loaded soft device) does not.
    "slow_fraction": 0.5,
    # The rounds stop here even if a node is still undecided; at most four suffice unless more than
    # half the nodes are faulty (tests/test_netcheck.py), and each round costs one test's time.
    "max_rounds": 10,
    "rdma_port": 18515,  # rdma-bw's out-of-band port on the data address (perftest's)
    "rdma_size": 65536,  # bytes per RDMA WRITE (perftest's default)
    # How long the first node waits for the others to join: pods of a job start over a minute or
    # two (image pulls), Slurm steps within seconds; a node that has not joined by then is named
    # missing and the job's verdict is unhealthy.
    "wait_seconds": 300.0,
    # Kubernetes: the pods of the job are those matching the label selector given with
    # --kube-selector; the first node (the coordinator) is the pod whose index label is 0 (an
    # Indexed Job's; JobSet and the training operator set it too), else the first pod by name.
    "kube_index_label": "batch.kubernetes.io/job-completion-index",
    "kube_poll_seconds": 2.0,  # between two lists of the job's pods while they start
}


class ConfigError(Exception):
    pass


def defaults() -> dict[str, Any]:
    return {
        "collectors": {m.NAME: copy.deepcopy(m.DEFAULTS) for m in registry.COLLECTORS},
        "checks": {m.NAME: copy.deepcopy(m.DEFAULTS) for m in registry.CHECKS},
        "policy": copy.deepcopy(POLICY_DEFAULTS),
        "daemon": copy.deepcopy(DAEMON_DEFAULTS),
        "kube": copy.deepcopy(KUBE_DEFAULTS),
        "hang": copy.deepcopy(HANG_DEFAULTS),
        "pingmesh": copy.deepcopy(PINGMESH_DEFAULTS),
        "slurm": copy.deepcopy(SLURM_DEFAULTS),
        "rdma_bw": copy.deepcopy(RDMA_BW_DEFAULTS),
        "netcheck": copy.deepcopy(NETCHECK_DEFAULTS),
    }


def load(path: str | None) -> dict[str, Any]:
    """Defaults merged with the file at `path` (if any), validated."""
    cfg = defaults()
    if not path:
        return cfg
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror or e}") from None
    data = _parse(path, text)
    if data is None:
        return cfg
    merge(cfg, data, "")
    check_ranges(cfg)
    return cfg


def check_ranges(cfg: dict[str, Any]) -> None:
    """Values of the right type that would still misbehave at run time."""
    def positive(path: str, value: Any) -> None:
        if not value > 0:
            raise ConfigError(f"{path}: must be greater than 0, not {value!r}")
    daemon = cfg["daemon"]
    positive("daemon.interval_seconds", daemon["interval_seconds"])
    positive("daemon.collector_timeout_seconds", daemon["collector_timeout_seconds"])
    for name, key in (("mounts", "timeout_seconds"), ("nvml", "gpu_timeout_seconds")):
        value = cfg["collectors"][name][key]
        positive(f"collectors.{name}.{key}", value)
        if value >= daemon["collector_timeout_seconds"]:
            raise ConfigError(f"collectors.{name}.{key} ({value:g}) must be below daemon.collector_timeout_seconds "
                              f"({daemon['collector_timeout_seconds']:g}), or the collector times out first")
    for key in ("raise_after_passes", "clear_after_passes"):
        if cfg["policy"][key] < 1:
            raise ConfigError(f"policy.{key}: must be at least 1, not {cfg['policy'][key]!r}")
    for name, rate in cfg["checks"]["infiniband"]["expected_rate_gbps"].items():  # port, device or link layer
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0:
            raise ConfigError(f"checks.infiniband.expected_rate_gbps.{name}: must be a number of Gb/s, not {rate!r}")
    # The host-fault checks: a window of 0 would count nothing, a limit below 1 would fire on no error.
    for name in ("memory_errors", "crashes", "storage_errors", "nic_health"):
        positive(f"checks.{name}.window_seconds", cfg["checks"][name]["window_seconds"])
    for name, key in (("memory_errors", "corrected_limit"), ("memory_errors", "throttle_repeat"),
                      ("crashes", "rcu_stall_repeat"), ("nic_health", "unregister_repeat"),
                      ("nic_health", "watchdog_repeat"), ("edac", "corrected_limit")):
        if not cfg["checks"][name][key] >= 1:
            raise ConfigError(f"checks.{name}.{key}: must be at least 1, not {cfg['checks'][name][key]!r}")
    for key in ("timeout_seconds", "retry_delay_seconds", "resync_seconds"):
        positive(f"slurm.{key}", cfg["slurm"][key])
    for key, least in (("attempts", 1), ("reason_max_chars", 20)):
        if not cfg["slurm"][key] >= least:
            raise ConfigError(f"slurm.{key}: must be at least {least}, not {cfg['slurm'][key]!r}")
    pm = cfg["pingmesh"]
    # A probe may outlive the interval (timeout_seconds >= probe_interval_seconds): it is not refused.
    for key in ("probe_interval_seconds", "timeout_seconds", "max_probes_per_second", "fetch_timeout_seconds"):
        positive(f"pingmesh.{key}", pm[key])
    for key in ("window_seconds", "windows_kept", "max_concurrency", "fetch_concurrency"):
        if not pm[key] >= 1:
            raise ConfigError(f"pingmesh.{key}: must be at least 1, not {pm[key]!r}")
    least = pm["analysis"]["open_windows"] + pm["analysis"]["close_windows"] + 1
    if pm["fetch_windows"] < least:
        raise ConfigError(f"pingmesh.fetch_windows ({pm['fetch_windows']}) must be at least "
                          f"pingmesh.analysis.open_windows + close_windows + 1 ({least}): the analysis keeps no state, "
                          "so it needs that many closed windows from each agent, and the newest one is still open")
    an = pm["analysis"]
    for key in ("loss_fraction", "node_loss_fraction", "significance", "node_bad_peer_fraction", "leaf_fraction"):
        if not 0 < an[key] <= 1:
            raise ConfigError(f"pingmesh.analysis.{key}: must be a fraction in (0, 1], not {an[key]!r}")
    for key in ("min_probes", "min_bad_probes", "open_windows", "close_windows", "min_reporters", "max_windows"):
        if not an[key] >= 1:
            raise ConfigError(f"pingmesh.analysis.{key}: must be at least 1, not {an[key]!r}")
    positive("pingmesh.analysis.p99_factor", an["p99_factor"])
    positive("pingmesh.analysis.p99_floor_seconds", an["p99_floor_seconds"])
    nc = cfg["netcheck"]
    for key in ("seconds", "wait_seconds", "kube_poll_seconds"):
        positive(f"netcheck.{key}", nc[key])
    if not 0 < nc["slow_fraction"] <= 1:
        raise ConfigError(f"netcheck.slow_fraction: must be a fraction in (0, 1], not {nc['slow_fraction']!r}")
    if nc["method"] not in ("auto", "tcp", "rdma"):
        raise ConfigError(f"netcheck.method: must be auto, tcp or rdma, not {nc['method']!r}")
    for key in ("port", "rdma_port"):
        if not 0 < nc[key] < 65536:
            raise ConfigError(f"netcheck.{key}: must be a TCP port, not {nc[key]!r}")
    for key in ("max_rounds", "rdma_size"):
        if not nc[key] >= 1:
            raise ConfigError(f"netcheck.{key}: must be at least 1, not {nc[key]!r}")
    if pm["inventory_configmap"] == pm["configmap"]:
        raise ConfigError("pingmesh.inventory_configmap: must not be pingmesh.configmap (each write would drop "
                          "the other's data)")


    _check_rdma_bw(cfg)


def _check_rdma_bw(cfg: dict[str, Any]) -> None:
    rb, judged = cfg["rdma_bw"], cfg["checks"]["rdma_bw"]
    if not 0 < rb["duration_seconds"] <= RDMA_BW_MAX_DURATION_SECONDS:
        raise ConfigError(f"rdma_bw.duration_seconds: must be in (0, {RDMA_BW_MAX_DURATION_SECONDS:g}], "
                          f"not {rb['duration_seconds']!r}")
    if not rb["interval_seconds"] > rb["duration_seconds"] * 2:
        raise ConfigError(f"rdma_bw.interval_seconds ({rb['interval_seconds']:g}) must be more than twice "
                          f"rdma_bw.duration_seconds ({rb['duration_seconds']:g}): the tests would never rest")
    if not rb["timeout_seconds"] > 0:
        raise ConfigError(f"rdma_bw.timeout_seconds: must be greater than 0, not {rb['timeout_seconds']!r}")
    if not rb["start_delay_seconds"] >= 0:
        raise ConfigError(f"rdma_bw.start_delay_seconds: must be at least 0, not {rb['start_delay_seconds']!r}")
    if not 1 <= rb["size"] <= 1 << 30:
        raise ConfigError(f"rdma_bw.size: must be 1 B to 1 GiB, not {rb['size']!r}")
    if not 1 <= rb["port"] <= 65535 - max(len(rb["rails"]), 16):
        raise ConfigError(f"rdma_bw.port: must leave room for one port per rail, not {rb['port']!r}")
    if not rb["history"] >= max(judged["low_runs"], 1):
        raise ConfigError(f"rdma_bw.history ({rb['history']!r}) must be at least checks.rdma_bw.low_runs "
                          f"({judged['low_runs']!r})")
    if len(rb["peers"]) > RDMA_BW_MAX_PEERS or not all(isinstance(p, str) and p for p in rb["peers"]):
        raise ConfigError(f"rdma_bw.peers: at most {RDMA_BW_MAX_PEERS} non-empty names or addresses")
    if len(rb["serve_to"]) > RDMA_BW_MAX_SERVE_TO or not all(isinstance(p, str) and p for p in rb["serve_to"]):
        raise ConfigError(f"rdma_bw.serve_to: at most {RDMA_BW_MAX_SERVE_TO} non-empty names, addresses or "
                          "networks")
    for rail in rb["rails"]:
        device, _, port = rail.partition(":") if isinstance(rail, str) else ("", "", "")
        if not device or (port and not port.isdigit()):
            raise ConfigError(f"rdma_bw.rails: {rail!r} is not 'device' or 'device:port'")
    if not 0 < judged["min_fraction"] <= 1:
        raise ConfigError(f"checks.rdma_bw.min_fraction: must be a fraction in (0, 1], not {judged['min_fraction']!r}")
    for key in ("low_runs", "fatal_after_peers"):
        if not judged[key] >= 1:
            raise ConfigError(f"checks.rdma_bw.{key}: must be at least 1, not {judged[key]!r}")
    for name, rate in judged["expected_gbps"].items():
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0:
            raise ConfigError(f"checks.rdma_bw.expected_gbps.{name}: must be a number of Gb/s, not {rate!r}")


def _parse(path: str, text: str) -> Any:
    if path.endswith(".json"):
        try:
            return json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{path}: not valid JSON: {e}") from None
    import yaml  # only paid for when a YAML config is given

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None


def merge(base: dict[str, Any], override: Any, where: str) -> None:
    """Merge `override` into `base` in place, checking keys and types against the defaults."""
    if not isinstance(override, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(override).__name__}")
    for key, value in override.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in base:
            known = ", ".join(sorted(map(str, base))) or "(none)"
            raise ConfigError(f"{path}: unknown setting (known here: {known})")
        current = base[key]
        if isinstance(current, dict) and not _is_free_mapping(current):
            merge(current, value, path)
        else:
            base[key] = _coerce(path, current, value)


def _is_free_mapping(value: dict[str, Any]) -> bool:
    """Mappings whose keys are data (e.g. per-code overrides), not settings; empty by default."""
    return not value


def _coerce(path: str, current: Any, value: Any) -> Any:
    if current is None:
        return value
    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(current, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(current, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(current, str):
        if isinstance(value, str):
            return value
    elif isinstance(current, list):
        if isinstance(value, list):
            return value
    elif isinstance(current, dict):
        if isinstance(value, dict):
            return value
    raise ConfigError(f"{path}: expected {type(current).__name__}, got {type(value).__name__} ({value!r})")


def state_dir(cfg: dict[str, Any], flag: str | None) -> str:
    return flag or os.environ.get("NODEHEALTH_STATE_DIR") or cfg["daemon"]["state_dir"]
