"""The `pingmesh` section: the probe agent in the daemon, the pinglist, the analysis and the
controller. Off unless enabled."""
from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "listen": "0.0.0.0:9457",  # the gRPC Ping service; TCP probes on the same address at tcp_port
    # Static inventory (YAML or JSON: nodes with leaf, pod, addresses); empty: in Kubernetes, the
    # controller's inventory ConfigMap built from Node labels.
    "inventory_file": "",
    "labels": {"leaf": "nodehealth.io/leaf", "pod": "nodehealth.io/pod"},
    "addresses_annotation": "nodehealth.io/probe-addresses",  # "10.0.1.1,10.1.1.1": one per rail
    "port": 9457,  # the peers' Ping port
    "tcp_port": 9459,  # the peers' TCP probe port: the kernel's handshake answers, cheaper than gRPC's
    "probe_interval_seconds": 10.0,  # between two probes of the same peer (Pingmesh: >= 10 s)
    "timeout_seconds": 2.0,  # an unanswered probe is lost after this (kubeservice pingmesh-agent: 2 s)
    "tcp_probe": True,  # time a TCP connect to each peer on each rail (SYN round trip; retransmits infer drops)
    # The gRPC Ping goes to each peer on the first rail both share; every rail costs a channel and
    # calls per rail (at 8 rails over the agent's CPU and memory budget, benchmarks/RESULTS.md).
    "ping_all_rails": False,
    # A peer's Ping goes with every third of its TCP probes: the verdicts rest on those, and a Ping costs
    # gRPC Python milliseconds of CPU (benchmarks/RESULTS.md). With tcp_probe off, with every probe.
    "ping_interval_seconds": 30.0,
    "payload_bytes": 64,
    "max_concurrency": 64,  # probes in flight at once (from its start to the loop's next wake-up at least)
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
    # Localization over the agents' summaries (nodehealth/pingmesh/analysis.py), judged per closed window.
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
        # Reporters that may lie (or be broken) without changing a verdict: before an element is judged,
        # this many of the reporters that add most to its evidence are left out. One agent then frames no
        # node, leaf or path; more may, if they all report on it (docs/threat-model.md). Each one more
        # costs sensitivity where few reporters see a fault (a leaf pair has 2 per direction).
        "tolerated_liars": 1,
        # Newest windows analysed, all the agents keep (pingmesh.windows_kept): enough history to
        # open and to close a verdict without state of our own.
        "max_windows": 20,
    },
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "enabled": "run the probe agent in the daemon (also on with flag `--probe-listen`)",
    "listen": "address of the gRPC Ping service; TCP probes are accepted on the same address at `tcp_port`",
    "inventory_file": ("static inventory (YAML or JSON); empty: the controller's inventory ConfigMap (Kubernetes). "
                       "Flag `--probe-inventory`"),
    "labels.leaf": "Node label that names a node's leaf switch",
    "labels.pod": "Node label that names a node's pod (a group of leaves)",
    "addresses_annotation": ("Node annotation with one probe address per rail (`10.0.1.1,10.1.1.1`); else the "
                             "InternalIP as rail 0"),
    "port": "the peers' Ping port",
    "tcp_port": "the peers' TCP probe port (the kernel's handshake answers; a connection that stays is accepted "
                "and closed)",
    "probe_interval_seconds": "seconds between two probes of the same peer",
    "timeout_seconds": "a probe unanswered after this long is lost",
    "tcp_probe": "time a TCP connect to each peer on each rail",
    "ping_all_rails": ("send the gRPC Ping on every rail, not only the first both peers share (costs a channel per "
                       "rail)"),
    "ping_interval_seconds": ("seconds between two gRPC Pings of the same peer, in whole probe intervals (at most one "
                              "a probe); with `tcp_probe` off, every probe is a Ping"),
    "payload_bytes": "padding of a Ping",
    "max_concurrency": "probes in flight at once; a probe counts until the loop's next wake-up (up to 0.5 s) "
                       "at least, so keep it over `max_probes_per_second` / 2",
    "max_probes_per_second": "probes started per second, across all peers; past it probes are skipped and counted",
    "window_seconds": "length of a window, aligned to the wall clock",
    "windows_kept": "windows an agent keeps for `/v1/pingmesh`",
    "refresh_seconds": "the inventory is read again and the pinglist recomputed this often",
    "epoch_seconds": "inter-leaf representatives rotate every epoch",
    "inter_leaf_pairs": "representative pairs per leaf pair and rail",
    "max_peer_groups": "metric peer groups: each other leaf while there are at most this many, else pods",
    "unknown_leaf_group_size": "nodes without a leaf are meshed in groups of this many, in name order",
    "peer_series_loss_fraction": "per-peer series only for peers over this loss in the last closed window ...",
    "peer_series_p99_seconds": "... or this p99 ...",
    "max_peer_series": "... at most this many",
    "controller_namespace": "namespace of the controller's ConfigMaps and Lease",
    "configmap": "the controller's verdicts, read by every agent every window",
    "inventory_configmap": "the controller's inventory (must differ from `configmap`)",
    "controller_lease": "the Lease of the controller replicas' leader election",
    "controller_listen": "the controller's `/metrics` and `/healthz` (flag `controller --listen`)",
    "fetch_concurrency": "agents the leader fetches at once",
    "fetch_timeout_seconds": "one agent's fetch",
    "fetch_windows": "newest windows kept from each agent; at least `analysis.open_windows + close_windows + 1`",
    "analysis.loss_fraction": "a leaf-to-leaf edge is bad at this loss in a window",
    "analysis.node_loss_fraction": "a node is bad at this loss over its probes with its leaf-mates ...",
    "analysis.significance": "... and only if that loss is this unlikely at the median node's loss rate",
    "analysis.min_probes": "probes an aggregate needs before it is judged",
    "analysis.min_bad_probes": "lost (or slow) probes an aggregate needs to be bad",
    "analysis.p99_factor": "latency is bad when p99 is over this many times the baseline of comparable edges ...",
    "analysis.p99_floor_seconds": "... and over this floor",
    "analysis.open_windows": "bad windows in a row before a verdict opens",
    "analysis.close_windows": "good windows in a row before a verdict closes",
    "analysis.node_bad_peer_fraction": ("a node that answers none of the probes of this share of its probers is "
                                        "unreachable"),
    "analysis.leaf_fraction": ("a leaf is at fault when this share of its nodes, or of its edges to other leaves, "
                               "is bad"),
    "analysis.min_reporters": "independent reporters a verdict needs; fewer: inconclusive",
    "analysis.max_windows": "newest windows analysed",
    "analysis.tolerated_liars": "reporters that may lie without changing a verdict: no this many reporters (nor one "
                                "node of a leaf) count more than the next one ([threat model](threat-model.md))",
}
