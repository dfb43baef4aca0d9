"""The daemon's periodic RDMA WRITE bandwidth tests (`rdma_bw: {enabled: true}`), client and server.

Every `interval_seconds` a round tests each rail once, one test at a time and only between the
daemon's passes, for `duration_seconds`, against the next peer in turn (rail i of this node writes
to rail i of the peer, whose daemon serves it on `port + i`), so that over rounds a rail meets
different peers; a peer that does not take the test passes the rail on to the next. Each outcome
becomes a Run (collectors/rdma_bw.py) that the `rdma_bw` check judges. Tests run on their own
threads, interrupted by the daemon's stop event. pyverbs is loaded by nodehealth.rdma.bw when the
first test or server starts, never here.
"""
from __future__ import annotations

import collections
import ipaddress
import logging
import os
import threading
import time
from typing import Any, Callable

from nodehealth.collectors.rdma_bw import OK, RdmaBw, Run
from nodehealth.host import HostPaths, addresses, read_attr
from nodehealth.rdma.defaults import MAX_PEERS

log = logging.getLogger("nodehealth.rdma")

SERVER_RETRY_SECONDS = 60.0  # a server whose rail could not be opened tries again this often
IDLE_POLL_SECONDS = 0.5
RESOLVE_SECONDS = 60.0  # how long the addresses of the names a server admits are trusted
REFUSED_LOG_SECONDS = 60.0  # refused clients are logged at most this often, with their count


class RdmaPeriodic:
    """Runs the rounds and the servers; `facts()` is what the check and /metrics see."""

    def __init__(self, cfg: dict[str, Any], host: HostPaths, node: str, on_run: Callable[[], None],
                 clock: Callable[[], float], backend: Any = None, peers: list[str] | None = None):
        self.cfg = cfg
        self.host = host
        self.node = node
        self.on_run = on_run
        self.clock = clock
        self.backend = backend  # nodehealth.rdma.bw, or a test's fake_rdma at the verbs boundary
        self.peers = list(cfg["peers"] if peers is None else peers)
        self.lock = threading.Lock()
        self.rails: list[tuple[str, int]] = []
        self.error: str | None = None
        self.history: dict[tuple[str, int], collections.deque] = {}
        self.newest: dict[tuple[str, int, str], Run] = {}
        self.counts: collections.Counter = collections.Counter()
        self.served: collections.Counter = collections.Counter()
        self.admission = Admission(cfg["serve_to"] or self.peers)
        self.refused_logged, self.refused_since_log = 0.0, 0

    def start(self, stop: threading.Event, idle: threading.Event) -> list[threading.Thread]:
        """The threads to start: the rounds, and a server per rail when `serve` is on."""
        if self.backend is None:
            from nodehealth.rdma import bw

            self.backend = bw
        self.rails = find_rails(self.host, self.cfg["rails"])
        if not self.rails:
            self.error = "no RDMA device with an ACTIVE port to test (/sys/class/infiniband)"
        self.history = {r: collections.deque(maxlen=self.cfg["history"]) for r in self.rails}
        threads = [threading.Thread(target=self.rounds, args=(stop, idle), name="rdma-bw", daemon=True)]
        if self.cfg["serve"]:
            if not self.admission.entries:
                log.warning("serving RDMA bandwidth tests to no one: no rdma_bw.peers, no leaf-mates in the "
                            "inventory and no rdma_bw.serve_to")
            threads += [threading.Thread(target=self.serve, args=(i, rail, stop), name=f"rdma-bw-server-{i}",
                                         daemon=True) for i, rail in enumerate(self.rails)]
        return threads

    def options(self, index: int, rail: tuple[str, int]) -> Any:
        device, port = rail
        gid = self.cfg["gid_index"]
        if gid < 0:
            gid = self.backend.pick_gid(self.host, device, port)
        return self.backend.Options(device=device, ib_port=port, gid_index=gid, size=self.cfg["size"],
                                    duration=self.cfg["duration_seconds"], port=self.cfg["port"] + index)

    # -- client --------------------------------------------------------------------------------
    def rounds(self, stop: threading.Event, idle: threading.Event) -> None:
        if stop.wait(self.cfg["start_delay_seconds"]):
            return
        number = 0
        while not stop.is_set():
            for index, rail in enumerate(self.rails):
                # A peer that does not take the test (busy with another node's, or down) hands the
                # rail to the next one, so that one busy peer does not leave the rail unjudged.
                for attempt in range(len(self.peers)):
                    if not _wait_idle(idle, stop):
                        return
                    peer = self.peers[(number + index + attempt) % len(self.peers)]
                    try:
                        run = self.test(index, rail, peer, stop)
                    except Exception:  # a bug must not end the tests for the daemon's lifetime
                        log.exception("RDMA bandwidth test of %s:%d against %s", rail[0], rail[1], peer)
                        break
                    if run is None:  # cancelled: the daemon is stopping
                        return
                    self.record(run)
                    self.on_run()
                    if run.stage != "peer":
                        break
            number += 1
            stop.wait(self.cfg["interval_seconds"])

    def test(self, index: int, rail: tuple[str, int], peer: str, stop: threading.Event) -> Run | None:
        """One test of `rail` against `peer`; None when the daemon stopped it."""
        device, port = rail
        try:
            opts = self.options(index, rail)
            result = self.backend.client(peer, opts, self.host, self.cfg["timeout_seconds"], cancel=stop)
        except self.backend.RdmaError as e:
            if e.stage == "cancelled" or stop.is_set():
                return None
            log.warning("RDMA bandwidth test of %s:%d against %s failed (%s): %s", device, port, peer, e.stage, e)
            return Run(device, port, peer, self.clock(), e.stage or "transfer", str(e), self.cfg["size"])
        return Run(device, port, peer, self.clock(), OK, None, result.size, result.seconds, result.bw_avg_gbps,
                   result.bw_peak_gbps, result.msg_rate_mpps)

    def record(self, run: Run) -> None:
        rail = (run.device, run.port)
        with self.lock:
            self.history.setdefault(rail, collections.deque(maxlen=self.cfg["history"])).append(run)
            self.newest[(run.device, run.port, run.peer)] = run
            for key in [k for k in self.newest if k[2] not in self.peers]:  # peers no longer configured
                del self.newest[key]
            self.counts[(run.device, run.port, run.stage)] += 1

    # -- server --------------------------------------------------------------------------------
    def serve(self, index: int, rail: tuple[str, int], stop: threading.Event) -> None:
        """Serve rail `index` to peers until stop; a rail that cannot be opened is retried."""
        while not stop.is_set():
            try:
                self.backend.serve(self.options(index, rail), stop, self._served, self.cfg["listen"], self.host,
                                   self.cfg["timeout_seconds"], admit=self.admission.admits)
            except self.backend.RdmaError as e:
                log.warning("cannot serve RDMA bandwidth tests on %s:%d: %s", rail[0], rail[1], e)
                stop.wait(SERVER_RETRY_SECONDS)

    def _served(self, outcome: Any) -> None:
        refused = isinstance(outcome, Exception) and getattr(outcome, "stage", None) == "refused"
        with self.lock:
            self.served["refused" if refused else "error" if isinstance(outcome, Exception) else "ok"] += 1
            if not refused:
                return
            self.refused_since_log += 1
            now = time.monotonic()
            if now - self.refused_logged < REFUSED_LOG_SECONDS:
                return
            count, self.refused_since_log, self.refused_logged = self.refused_since_log, 0, now
        log.warning("%s (%d refused since the last such line; rdma_bw.serve_to admits others)", outcome, count)

    # -- what the check and /metrics see -------------------------------------------------------
    def facts(self) -> RdmaBw:
        with self.lock:
            runs = {r for h in self.history.values() for r in h} | set(self.newest.values())
            return RdmaBw(rails=tuple(f"{d}:{p}" for d, p in self.rails),
                          runs=tuple(sorted(runs, key=lambda r: (r.time, r.rail, r.peer))),
                          counts=tuple((d, p, s, n) for (d, p, s), n in self.counts.items()),
                          served=tuple(self.served.items()), error=self.error)


class Admission:
    """Whose clients the servers take: addresses, networks (CIDR) and names, the names resolved again
    at most every RESOLVE_SECONDS, so that a stranger who reaches the port cannot hold a rail."""

    def __init__(self, entries: list[str], resolve: Callable[[str], set[str]] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.entries = list(entries)
        self.networks, self.names = [], []
        for entry in self.entries:
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self.names.append(entry)
        self.resolve = resolve or addresses
        self.clock = clock
        self.resolved: set = set()
        self.resolved_at: float | None = None
        self.lock = threading.Lock()

    def admits(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.partition("%")[0])
        except ValueError:
            return False
        if ip.version == 6 and ip.ipv4_mapped is not None:  # a dual-stack listener's view of an IPv4 peer
            ip = ip.ipv4_mapped
        if any(ip in net for net in self.networks):
            return True
        return ip in self._names_addresses()

    def _names_addresses(self) -> set:
        """Resolved outside the lock, so that a slow resolver holds up only the server that asked."""
        with self.lock:
            now = self.clock()
            if not self.names or (self.resolved_at is not None and now - self.resolved_at < RESOLVE_SECONDS):
                return self.resolved
            self.resolved_at = now  # the other rails' servers keep the old set meanwhile
        resolved = {ipaddress.ip_address(a.partition("%")[0]) for name in self.names for a in self.resolve(name)}
        with self.lock:
            self.resolved = resolved
        return resolved


def _wait_idle(idle: threading.Event, stop: threading.Event) -> bool:
    """Wait until no pass runs; False once the daemon stops."""
    while not idle.wait(IDLE_POLL_SECONDS):
        if stop.is_set():
            return False
    return not stop.is_set()


def find_rails(host: HostPaths, wanted: list[str]) -> list[tuple[str, int]]:
    """The configured rails ("device:port" or "device", port 1), else every ACTIVE port, sorted.
    A configured rail is kept even when absent: its test then says why it could not run."""
    if wanted:
        return [(name.partition(":")[0], int(name.partition(":")[2] or 1)) for name in wanted]
    base = host.sys("class", "infiniband")
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return []
    rails = []
    for device in devices:
        try:
            ports = sorted(int(p) for p in os.listdir(os.path.join(base, device, "ports")) if p.isdigit())
        except OSError:
            continue
        rails += [(device, p) for p in ports
                  if "ACTIVE" in (read_attr(os.path.join(base, device, "ports", str(p), "state")) or "")]
    return rails


def daemon_peers(cfg: dict[str, Any], inventory_file: str, node: str) -> list[str]:
    """Whom this node tests: rdma_bw.peers, else its leaf-mates in the pingmesh inventory file (at most
    MAX_PEERS). Raises InventoryError for a file that cannot be read."""
    peers = list(cfg["peers"]) if cfg["peers"] or not inventory_file else inventory_peers(inventory_file, node)
    if not peers:  # no finding says so: a rail never tested has none
        log.warning("rdma_bw: no peer to test against (no rdma_bw.peers, and no leaf-mates of %s in "
                    "pingmesh.inventory_file): this node's rails are not tested, only served", node)
    return peers[:MAX_PEERS]


def inventory_peers(path: str, node: str) -> list[str]:
    """The pingmesh inventory's nodes under this node's leaf (their first address, else their name)."""
    from nodehealth import inventory

    inv = inventory.load_file(path)
    me = inv.get(node)
    if me is None or not me.leaf:
        return []
    return [next((a for a in n.addresses if a), n.name) for n in inv.nodes if n.leaf == me.leaf and n.name != node]
