"""Pingmesh in the daemon: the Ping agent, the prober, the pinglist, and what they add up to.

The daemon owns one Pingmesh. It answers peers' Pings, probes its own pinglist (recomputed from
the inventory every refresh and at each new epoch), keeps per-peer window statistics for
`/v1/pingmesh`, and describes them as bounded metric families. It judges nothing about the
network: the analysis across nodes does (analysis.py, run by the controller), and its verdicts come
back through the controller's ConfigMap (verdicts.py) to the `pingmesh` check.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from nodehealth.inventory import Inventory, InventoryError
from nodehealth.model import Action, Finding, Metric, Severity
from nodehealth.pingmesh import agent, packed
from nodehealth.pingmesh.pinglist import Target, pinglist
from nodehealth.pingmesh.prober import Prober
from nodehealth.pingmesh.stats import (
    BUCKETS_SECONDS,
    SCHEMA_VERSION,
    PeerStats,
    Summary,
    Window,
    bucket_index,
    quantile,
)

log = logging.getLogger("nodehealth.probe")

CHECK = "pingmesh"


class Pingmesh:
    def __init__(self, node: str, cfg: dict[str, Any], load_inventory: Callable[[], Inventory],
                 clock: Callable[[], float] = time.time, tls: Any = None):
        self.node = node
        self.cfg = cfg
        self.load_inventory = load_inventory
        self.clock = clock
        self.window = float(cfg["window_seconds"])
        self.lock = threading.Lock()
        self.tls = tls  # the mesh identity when tls.enabled: Pings only between members of the inventory
        self.prober = Prober(node, cfg, self.record, tls)
        self.agent: agent.Agent | None = None
        self.inventory: Inventory | None = None
        self.inventory_error: str | None = None
        self.me = None  # this node's inventory entry
        self.targets: list[Target] = []
        self.epoch: int | None = None
        self.windows: dict[float, dict[tuple[str, int, str], PeerStats]] = {}
        # Cumulative per (peer group, probe): sent, lost, SYN retransmits, histogram, sum of RTTs.
        self.totals: dict[tuple[str, str], list[Any]] = {}

    # -- running -------------------------------------------------------------------------------
    def start(self, stop: threading.Event, max_connections: int = agent.MAX_CONNECTIONS
              ) -> dict[str, Callable[[], None]]:
        """Serve Pings now (a port in use fails the daemon's start, loudly; the agent's thread is
        `self.agent.thread`) and return the workers to run until `stop`, by name."""
        self.agent = agent.Agent(self.cfg["listen"], self.node, max_connections, self.tls, self.member)
        self.agent.start()
        host = self.cfg["listen"].rpartition(":")[0]
        try:
            self.prober.accept_probes(agent.listen_tcp(host, int(self.cfg["tcp_port"])))
        except agent.ProbeError:
            self.agent.stop(0)
            raise
        return {"pingmesh-prober": lambda: self.prober.run(stop), "pingmesh-pinglist": lambda: self._refresh_loop(stop)}

    def member(self, names: list[str]) -> bool:
        """Whether a verified peer certificate names a node of the inventory (who may Ping us)."""
        with self.lock:
            inv = self.inventory
        return inv is not None and any(inv.get(name) is not None for name in names)

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop(0.5)
        if self.prober.listener is not None:
            self.prober.listener.close()

    def _refresh_loop(self, stop: threading.Event) -> None:
        last = -math.inf
        while not stop.is_set():
            now = self.clock()
            epoch = int(now // float(self.cfg["epoch_seconds"]))
            if now - last >= float(self.cfg["refresh_seconds"]) or epoch != self.epoch:
                self.refresh(now)
                last = now
            stop.wait(min(5.0, float(self.cfg["refresh_seconds"])))

    def refresh(self, now: float) -> None:
        """Re-read the inventory and recompute this node's pinglist; a failed read keeps the last one."""
        try:
            inv = self.load_inventory()
        except (InventoryError, OSError) as e:
            with self.lock:
                self.inventory_error = str(e)
            log.error("pingmesh inventory: %s; probing the last pinglist", e)
            return
        epoch = int(now // float(self.cfg["epoch_seconds"]))
        targets = pinglist(inv, self.node, epoch, self.cfg)
        me = inv.get(self.node)
        with self.lock:
            self.inventory, self.inventory_error, self.me, self.epoch = inv, None, me, epoch
            self.targets = targets
        sources = dict(enumerate(me.addresses)) if me is not None else {}
        self.prober.set_targets(targets, sources)
        for problem in inv.problems[:10]:
            log.warning("pingmesh inventory: %s", problem)
        log.info("pingmesh: %d peers in epoch %d (%d nodes in the inventory)", len(targets), epoch, len(inv.nodes))

    def record(self, target: Target, probe: str, sent_at: float, rtt: float | None, retransmitted: bool) -> None:
        start = sent_at // self.window * self.window
        with self.lock:
            window = self.windows.get(start)
            if window is None:
                window = self.windows[start] = {}
                for old in sorted(self.windows)[:-int(self.cfg["windows_kept"])]:
                    del self.windows[old]
            key = (target.node, target.rail, probe)
            stats = window.get(key)
            if stats is None:
                stats = window[key] = PeerStats(target.node, target.leaf, target.rail, probe)
            stats.add(rtt, retransmitted)
            total = self.totals.get((target.group, probe))
            if total is None:
                total = self.totals[(target.group, probe)] = [0, 0, 0, {}, 0.0]
            total[0] += 1
            if rtt is None:
                total[1] += 1
            else:
                i = bucket_index(rtt)
                total[3][i] = total[3].get(i, 0) + 1
                total[4] += rtt
                total[2] += retransmitted

    # -- faces ---------------------------------------------------------------------------------
    def leaf(self) -> str:
        with self.lock:
            return self.me.leaf if self.me is not None else ""

    def summary(self, windows: int | None = None, since: float | None = None) -> dict[str, Any]:
        """The `/v1/pingmesh` document (nodehealth/pingmesh/stats.py describes and parses it).

        `since`: the start of the newest window the asker has. When this agent holds that window and
        it is closed, it and the older windows go by their start alone (closed windows never change):
        the controller parses only what is new. Any other value (a window this process never had, as
        after a restart) gives every closed window in full, so the asker's copy is never mixed with
        another's. With `since`, an open window goes by its start alone too: nobody analyses it yet.
        """
        s = self._summary(windows, since, lambda peers: [p.to_dict() for p in peers])
        return {"schema_version": SCHEMA_VERSION, "node": s.node, "leaf": s.leaf, "pod": s.pod, "time": s.time,
                "window_seconds": s.window_seconds, "buckets_seconds": list(s.buckets),
                "windows": [{"start": w.start, "closed": w.closed} if w.peers is None else
                            {"start": w.start, "closed": w.closed, "peers": w.peers} for w in s.windows]}

    def packed_summary(self, windows: int | None = None, since: float | None = None) -> bytes:
        """The same windows in the packed form the controller asks for (packed.py)."""
        return packed.dumps(self._summary(windows, since, lambda peers: [p.copy() for p in peers]))

    def _summary(self, windows: int | None, since: float | None, peers_of: Callable[[list[PeerStats]], Any]
                 ) -> Summary:
        """The windows asked for, each window's peers as `peers_of` gives them while the prober waits."""
        now = self.clock()
        timeout = float(self.cfg["timeout_seconds"])
        with self.lock:
            starts = sorted(self.windows)
            if windows is not None:
                starts = starts[-windows:] if windows > 0 else []
            known = since if since in self.windows and since + self.window + timeout <= now else -math.inf
            out = []
            for s in starts:
                closed = s + self.window + timeout <= now
                if s <= known or (since is not None and not closed):
                    out.append(Window(s, closed, None))
                else:
                    out.append(Window(s, closed, peers_of([p for _, p in sorted(self.windows[s].items())])))
            me = self.me
        return Summary(self.node, me.leaf if me else "", me.pod if me else "", now, self.window, BUCKETS_SECONDS, out)

    def findings(self) -> list[Finding]:
        """The agent's own trouble: no inventory, or this node missing from it (it probes nobody).
        The controller's verdicts are the `pingmesh` check's (checks/pingmesh.py)."""
        out = []
        with self.lock:
            error, inv = self.inventory_error, self.inventory
        if inv is None:
            why = error or "the inventory has not been read yet"
            out.append(Finding(CHECK, Severity.WARNING, "PingmeshNoInventory",
                               f"Pingmesh probes nobody: {why}.", action=Action.FIX_CONFIG))
        elif inv.get(self.node) is None:
            out.append(Finding(CHECK, Severity.WARNING, "PingmeshNotInInventory",
                               f"Pingmesh probes nobody: node {self.node} is not in the inventory "
                               f"({len(inv.nodes)} nodes).", action=Action.FIX_CONFIG))
        return out

    def metrics(self) -> list[Metric]:
        labels = ("peer_group", "probe")
        sent = Metric("nodehealth_pingmesh_probes_total", "Probes sent, by peer group and probe kind.",
                      "counter", labels)
        lost = Metric("nodehealth_pingmesh_lost_total", "Probes unanswered within the timeout.", "counter", labels)
        retrans = Metric("nodehealth_pingmesh_syn_retransmits_total",
                         "TCP probes whose connect time shows a dropped SYN or SYN-ACK (about 1 s).", "counter",
                         ("peer_group",))
        rtt = Metric("nodehealth_pingmesh_rtt_seconds", "Round-trip time of answered probes.", "histogram", labels)
        peers = Metric("nodehealth_pingmesh_peers", "Peers in this node's pinglist, by peer group.",
                       labels=("peer_group",))
        info = Metric("nodehealth_pingmesh_info", "This node's place in the topology; always 1.",
                      labels=("leaf", "pod"))
        skipped = Metric("nodehealth_pingmesh_probes_skipped_total",
                         "Probes not started: the rate or concurrency cap was reached, or this process had no "
                         "descriptor left for one.", "counter")
        inventory = Metric("nodehealth_pingmesh_inventory_nodes", "Nodes in the inventory last read.")
        with self.lock:
            for (group, probe), (n, n_lost, n_retrans, counts, total) in sorted(self.totals.items()):
                sent.add((group, probe), n)
                lost.add((group, probe), n_lost)
                rtt.add_histogram((group, probe), BUCKETS_SECONDS, counts, total)
                if probe == "tcp":
                    retrans.add((group,), n_retrans)
            groups: dict[str, int] = {}
            for t in self.targets:
                groups[t.group] = groups.get(t.group, 0) + 1
            for group, count in groups.items():
                peers.add((group,), count)
            if self.me is not None:
                info.add((self.me.leaf, self.me.pod), 1)
            if self.inventory is not None:
                inventory.add((), len(self.inventory.nodes))
            worst = self._worst_peers()
        skipped.add((), self.prober.skipped)
        agent_metrics = self.agent.metrics() if self.agent is not None else []
        return [sent, lost, retrans, rtt, peers, info, skipped, inventory, *worst, *agent_metrics]

    def _worst_peers(self) -> list[Metric]:
        """Per-peer series for the last closed window, only for peers over a threshold, worst first.
        Caller holds the lock."""
        loss = Metric("nodehealth_pingmesh_peer_loss_ratio",
                      "Lost fraction of probes to a peer in the last closed window (only peers over the threshold).",
                      labels=("peer", "rail", "probe"))
        p99 = Metric("nodehealth_pingmesh_peer_rtt_p99_seconds",
                     "p99 round trip to a peer in the last closed window (only peers over the threshold).",
                     labels=("peer", "rail", "probe"))
        closed = [s for s in self.windows if s + self.window + float(self.cfg["timeout_seconds"]) <= self.clock()]
        if not closed:
            return [loss, p99]
        bad = []
        for (node, rail, probe), stats in self.windows[max(closed)].items():
            ratio = stats.lost / stats.sent if stats.sent else 0.0
            q = quantile(stats.counts, 0.99)
            if ratio >= self.cfg["peer_series_loss_fraction"] or (q or 0) >= self.cfg["peer_series_p99_seconds"]:
                bad.append((-ratio, -(q or 0), node, rail, probe, ratio, q))
        for *_, node, rail, probe, ratio, q in sorted(bad)[:int(self.cfg["max_peer_series"])]:
            loss.add((node, rail, probe), ratio)
            p99.add((node, rail, probe), q)
        return [loss, p99]
