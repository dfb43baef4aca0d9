"""The daemon: passes on an interval, the kernel log followed as a stream, HTTP, signals.

Threads: the main thread waits for a signal; a pass thread runs collectors every interval; a
follower thread reads new kernel records and re-judges the kernel-log checks at once (a new Xid
reaches /metrics in milliseconds, not at the next pass); the HTTP server answers from the last
snapshot. All shared state changes under one lock and is saved atomically after each change.
"""
from __future__ import annotations

import dataclasses
import faulthandler
import json
import logging
import math
import os
import shutil
import signal
import socket
import threading
import time
from dataclasses import dataclass
from http.server import HTTPServer
from typing import Any

from nodehealth import exporter
from nodehealth import report as render
from nodehealth.collectors import kmsg, nvml
from nodehealth.collectors import rdma_bw as rdma_facts
from nodehealth.collectors.gpu_facts import NvmlError
from nodehealth.collectors.kernel_events import XID, KernelEvent
from nodehealth.config import RDMA_BW_MAX_PEERS, ConfigError
from nodehealth.engine import Engine
from nodehealth.host import boot_id, write_atomic
from nodehealth.httpbound import BoundedHandler, BoundedHTTPServer
from nodehealth.model import CollectorResult, Finding, Metric, Report, Severity, Status, sort_findings, verdict
from nodehealth.policy import Policy, StateFile, expect, read_regular

log = logging.getLogger("nodehealth.daemon")

MAX_EVENTS = 10000  # kernel events kept for the current boot; the oldest go first
XID_MERGE_SECONDS = 2.0  # an NVML Xid event and its kernel line are one Xid (xid.md 4.5)
NVML_EVENT_WAIT_SECONDS = 0.5
MAX_CONCURRENT_REQUESTS = 16
REQUEST_TIMEOUT_SECONDS = 5.0  # a request's whole time: reading its head and writing the answer
STOP_GRACE_SECONDS = 1.5
# A stop that hangs anyway (a thread or the interpreter's teardown stuck) prints every thread's stack
# and exits 1: before the state is written within the DaemonSet's grace period of 10 s, after it at once.
STUCK_STOP_SECONDS = 8.0
STUCK_EXIT_SECONDS = 1.0


@dataclass
class Batch:
    """What one read of the kernel log brought."""

    records: int
    overwritten: int
    last_seq: int | None
    events: list[KernelEvent]
    malformed: int = 0
    unframed: int = 0


class KernelEvents:
    """The current boot's kernel events and counters, restored from and saved to the state file.

    Records are keyed by boot id and sequence number: a restarted daemon skips every record at or
    below the last sequence it saved, so no record is counted twice.
    """

    def __init__(self, boot: str | None, source: str):
        self.boot_id = boot
        self.source = source
        self.events: list[KernelEvent] = []
        self.records = 0
        self.overwritten = 0
        self.malformed = 0
        self.unframed = 0
        self.last_seq: int | None = None

    def restore(self, saved: dict[str, Any]) -> None:
        if not saved or saved.get("boot_id") != self.boot_id or self.boot_id is None:
            return
        self.records = int(saved.get("records", 0))
        self.overwritten = int(saved.get("overwritten", 0))
        self.malformed = int(saved.get("malformed", 0))
        self.unframed = int(saved.get("unframed", 0))
        self.last_seq = saved.get("last_seq")
        fields = {f.name for f in dataclasses.fields(KernelEvent)}
        for d in saved.get("events", [])[-MAX_EVENTS:]:
            try:
                self.events.append(KernelEvent(**{k: v for k, v in d.items() if k in fields}))
            except TypeError:
                continue

    @staticmethod
    def validate(state: dict[str, Any]) -> None:
        """The `kmsg` section has the types restore() and the checks use, else ValueError (StateFile.load)."""
        saved = expect(state.get("kmsg", {}), dict, "kmsg")
        expect(saved.get("boot_id"), str, "kmsg.boot_id", optional=True)
        for name in ("records", "overwritten", "malformed", "unframed"):
            expect(saved.get(name, 0), int, f"kmsg.{name}")
        expect(saved.get("last_seq"), int, "kmsg.last_seq", optional=True)
        for i, d in enumerate(expect(saved.get("events", []), list, "kmsg.events")[-MAX_EVENTS:]):
            where = f"kmsg.events[{i}]"
            expect(d, dict, where)
            for name in ("kind", "device", "text"):
                expect(d.get(name, ""), str, f"{where}.{name}")
            for name in ("code", "seq", "monotonic_us"):
                expect(d.get(name), int, f"{where}.{name}", optional=True)
            expect(d.get("wall_time"), (int, float), f"{where}.wall_time", optional=True)
            expect(d.get("detail", {}), dict, f"{where}.detail")

    def add(self, batch: Batch) -> None:
        records, overwritten, last_seq, events = batch.records, batch.overwritten, batch.last_seq, batch.events
        self.records += records
        self.overwritten += overwritten
        self.malformed += batch.malformed
        self.unframed += batch.unframed
        if last_seq is not None:
            self.last_seq = last_seq
        for event in events:
            self._merge(event)
        if len(self.events) > MAX_EVENTS:
            del self.events[: len(self.events) - MAX_EVENTS]

    def _merge(self, event: KernelEvent) -> None:
        """Add an event, unless it is an Xid the other source already reported.

        NVML events and kernel lines report the same Xid: one is kept when the bus id (or an
        unknown one), the Xid and the time within XID_MERGE_SECONDS agree. The kernel line wins,
        since it carries the text, pid and process.
        """
        if event.kind == XID and event.wall_time is not None:
            source = event.detail.get("source", "kmsg")
            for i in range(len(self.events) - 1, max(-1, len(self.events) - 200), -1):
                old = self.events[i]
                if (old.kind == XID and old.code == event.code and old.wall_time is not None
                        and abs(old.wall_time - event.wall_time) <= XID_MERGE_SECONDS
                        and old.detail.get("source", "kmsg") != source
                        and (not old.device or not event.device or old.device == event.device)):
                    if source == "kmsg":
                        self.events[i] = event
                    return
        self.events.append(event)

    def clear(self) -> int:
        """An operator's clear: the events so far no longer count (counters restart from zero)."""
        cleared = len(self.events)
        self.events.clear()
        return cleared

    def facts(self) -> kmsg.KernelLog:
        return kmsg.KernelLog(source=self.source, boot_id=self.boot_id, records=self.records,
                              overwritten=self.overwritten, malformed=self.malformed,
                              last_seq=self.last_seq, events=tuple(self.events), unframed=self.unframed)

    def dump(self) -> dict[str, Any]:
        return {"boot_id": self.boot_id, "records": self.records, "overwritten": self.overwritten,
                "malformed": self.malformed, "unframed": self.unframed, "last_seq": self.last_seq,
                "events": [dataclasses.asdict(e) for e in self.events]}


class Daemon:
    def __init__(self, engine: Engine, cfg: dict[str, Any], node: str):
        self.cfg = cfg
        self.node = node
        self.interval = float(cfg["daemon"]["interval_seconds"])
        self.host = engine.host
        self.boot_id = boot_id(self.host)
        self.state = StateFile(cfg["daemon"]["state_dir"])
        self.kmsg_module = next((m for m in engine.collectors if m.NAME == kmsg.NAME), None)
        self.nvml_supported = any(m is nvml for m in engine.collectors) and nvml.supported(self.host, {}) is None
        # Passes poll every collector but the kernel log, which the follower streams.
        self.engine = Engine([m for m in engine.collectors if m is not self.kmsg_module], engine.checks,
                             engine.host, cfg, engine.timeout, engine.clock)
        self.kernel_checks = [c for c in engine.checks if kmsg.NAME in c.NEEDS]
        self.rdma_checks = [c for c in engine.checks if rdma_facts.NAME in c.NEEDS]
        self.policy = Policy(cfg["policy"], [c.NAME for c in engine.checks if getattr(c, "DEBOUNCE", False)],
                             self.boot_id, event_reasons=[(c.NAME, r) for c in engine.checks
                                                          for r in getattr(c, "EVENT_REASONS", ())])
        self.kernel = KernelEvents(self.boot_id, self.host.dev("kmsg"))
        self.kernel_error: str | None = None
        self.kernel_supported: str | None = None
        self.lock = threading.Lock()
        self.save_lock = threading.Lock()
        self.stop = threading.Event()
        self.results: dict[str, CollectorResult] = {}
        self.rates: dict[str, dict[str, float]] = {}
        self.current: dict[str, list[Finding]] = {}  # non-sticky findings per check
        self.report: Report | None = None
        self.passes = 0
        self.last_pass: float | None = None
        self.pass_duration = 0.0
        self.follower_alive = False
        self.follower_thread: threading.Thread | None = None
        self.save_errors = 0
        self.save_error: str | None = None  # why the last save failed; None once one succeeds
        self.publisher: Any = None  # nodehealth.kube.Publisher when kube.enabled
        self.drainer: Any = None  # nodehealth.slurm.Drainer when slurm.enabled
        self.hang: Any = None  # nodehealth.hang.detector.Detector when hang.enabled
        self.pingmesh: Any = None  # nodehealth.probe.mesh.Pingmesh when pingmesh.enabled
        self.rdma: Any = None  # nodehealth.rdma_periodic.RdmaPeriodic when rdma_bw.enabled
        self.pass_idle = threading.Event()  # set between passes: the RDMA tests start only then

    # -- state ---------------------------------------------------------------------------------
    def load_state(self) -> None:
        saved = self.state.load(validate=KernelEvents.validate)
        self.policy.restore(saved)
        self.kernel.restore(saved.get("kmsg", {}))

    def save_state(self) -> None:
        """Snapshot and write under one save lock: two threads saving at once must not let an older
        snapshot land last (a lower last_seq would count kernel records twice after a crash)."""
        with self.save_lock:
            with self.lock:
                data = self.policy.dump()
                data["kmsg"] = self.kernel.dump()
            try:
                self.state.save(data)
            except OSError as e:
                self.save_errors += 1
                if self.save_error is None:  # once per outage, not once per kernel record
                    log.error("cannot write state to %s: %s; sticky faults will not survive a restart",
                              self.state.path, e)
                self.save_error = f"cannot save state to {self.state.path}: {e.strerror or e}"
                return
            if self.save_error is not None:
                log.info("state saved to %s again", self.state.path)
                self.save_error = None

    # -- judging -------------------------------------------------------------------------------
    def _kernel_result(self) -> CollectorResult | None:
        if self.kmsg_module is None:
            return None
        if self.kernel_supported is not None:
            return CollectorResult(kmsg.NAME, False, False, error=self.kernel_supported)
        if self.kernel_error is not None:
            return CollectorResult(kmsg.NAME, True, False, error=self.kernel_error)
        return CollectorResult(kmsg.NAME, True, True, facts=self.kernel.facts())

    def _publish(self, results: dict[str, CollectorResult], checks: list[Any], now: float) -> None:
        """Judge `checks` on `results` and rebuild the report. Caller holds the lock."""
        kernel = self._kernel_result()
        if kernel is not None:
            results = dict(results, **{kmsg.NAME: kernel})
        if self.rdma is not None:
            results = dict(results, **{rdma_facts.NAME: CollectorResult(rdma_facts.NAME, True, True,
                                                                       facts=self.rdma.facts())})
        findings = self.engine.judge(results, self.rates, now, checks)
        names = [c.NAME for c in checks]
        current = self.policy.apply(findings, now, judged_checks=names)
        for name in names:
            self.current[name] = []
        for f in current:
            self.current.setdefault(f.check, []).append(f)
        shown = [f for fs in self.current.values() for f in fs] + self.policy.sticky_findings()
        if self.hang is not None:
            shown += self.hang.findings()
        if self.pingmesh is not None:
            shown += self.pingmesh.findings()
        ordered = [results[m.NAME] for m in self._modules() if m.NAME in results]
        previous = self.report
        self.report = Report(self.node, verdict(shown), sort_findings(shown), ordered, now)
        log_change(previous, self.report)

    def _modules(self) -> list[Any]:
        mods = list(self.engine.collectors)
        if self.kmsg_module is not None:
            mods.insert(0, self.kmsg_module)
        if self.rdma is not None:
            mods.append(rdma_facts)
        return mods

    def clear(self, reason: str) -> None:
        """Forget sticky faults and this boot's kernel events, as an operator asked after a repair.
        What is still wrong comes back at the next pass."""
        with self.lock:
            sticky = self.policy.clear_sticky()
            events = self.kernel.clear()
            report = self._rejudge(self.kernel_checks)
        log.warning("cleared by operator (%s): %d sticky finding(s) (%s) and %d kernel event(s)", reason,
                    len(sticky), ", ".join(sorted(f.reason for f in sticky)) or "none", events)
        self._save_and_send(report)

    def _rejudge(self, checks: list[Any]) -> Report | None:
        """Judge `checks` again on news between passes (kernel records, a bandwidth test, a clear);
        the report to send, or None before the first full pass. Caller holds the lock."""
        if self.report is not None:
            self._publish(self.results, checks, self.engine.clock())
        return self.report if self.passes else None

    def _send(self, report: Report) -> None:
        """Hand a full report to the faces that act on the scheduler: Kubernetes, Slurm."""
        for face in (self.publisher, self.drainer):
            if face is not None:
                face.publish(report)

    def _take_clear_request(self) -> None:
        request = take_clear_request(self.state.directory)
        if request is not None:
            self.clear(request)

    def run_pass(self) -> None:
        self.pass_idle.clear()
        try:
            self._run_pass()
        finally:
            self.pass_idle.set()

    def _run_pass(self) -> None:
        self._take_clear_request()
        start = time.monotonic()
        results = self.engine.collect()
        now = self.engine.clock()
        with self.lock:
            self.rates = self.engine.rates(results, now)
            self.results = results
            self._publish(results, self.engine.checks, now)
            self.passes += 1
            self.last_pass = now
            self.pass_duration = time.monotonic() - start
            report = self.report
        self.save_state()
        self._send(report)

    def on_kernel(self, batch: Batch) -> None:
        with self.lock:
            self.kernel.add(batch)
            report = self._rejudge(self.kernel_checks)
        self._save_and_send(report)

    def on_rdma(self) -> None:
        """A bandwidth test ended: judge it now rather than at the next pass."""
        with self.lock:
            report = self._rejudge(self.rdma_checks)
        self._save_and_send(report)

    def _save_and_send(self, report: Report | None) -> None:
        """News judged between passes is saved first (a sticky fault it raised survives a restart)."""
        self.save_state()
        if report is not None:
            self._send(report)

    # -- threads -------------------------------------------------------------------------------
    def _pass_loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.run_pass()
            except Exception:
                log.exception("pass failed")
            self.stop.wait(self.interval)

    def _follow(self) -> None:
        """Follow the kernel log; reopen with a rate limit if the reader dies (NPD#1168)."""
        while not self.stop.is_set():
            try:
                follower = kmsg.KmsgFollower(self.host, self.cfg["collectors"].get(kmsg.NAME, {}),
                                             after_seq=self.kernel.last_seq)
            except OSError as e:
                self.kernel_error = f"cannot open the kernel log: {e.strerror or e}"
                self.follower_alive = False
                self.stop.wait(5.0)
                continue
            self.kernel_error = None
            self.follower_alive = True
            malformed, unframed = 0, 0
            try:
                while not self.stop.is_set():
                    records, overwritten, last_seq, events = follower.read_new()
                    if records or overwritten or follower.malformed > malformed or follower.unframed > unframed:
                        self.on_kernel(Batch(records, overwritten, last_seq, list(events),
                                             follower.malformed - malformed, follower.unframed - unframed))
                        malformed, unframed = follower.malformed, follower.unframed
                    follower.wait(1.0)  # wakes at once for a record; idle, once a second
            except Exception as e:
                log.exception("kernel log follower failed; restarting in 5 s")
                self.kernel_error = f"kernel log reader failed: {e}"
            finally:
                self.follower_alive = False
                follower.close()
            self.stop.wait(5.0)

    def _nvml_events(self) -> None:
        """Xids from NVML's event set as they happen; the kernel log gives their text."""
        while not self.stop.is_set():
            try:
                raw = nvml.backend_for(self.host).wait_events(NVML_EVENT_WAIT_SECONDS)
            except (NvmlError, OSError, ValueError) as e:
                log.info("NVML events unavailable (%s); trying again in 5 s", e)
                self.stop.wait(5.0)
                continue
            except Exception:  # a binding's own error (a TypeError) must not end Xid events for good
                log.exception("NVML event wait failed; trying again in 5 s")
                self.stop.wait(5.0)
                continue
            events = [self._gpu_event(e) for e in raw if e.get("kind") == "xid" and isinstance(e.get("data"), int)]
            if events:
                self.on_kernel(Batch(0, 0, None, events))

    def _gpu_event(self, raw: dict[str, Any]) -> KernelEvent:
        bus_id = nvml.known_bus_id(raw.get("gpu"))
        return KernelEvent(XID, bus_id or "", raw["data"], "(reported by NVML; see the kernel log for the text)",
                           wall_time=self.engine.clock(), detail={"source": "nvml", "gpu": raw.get("gpu")})

    # -- faces ---------------------------------------------------------------------------------
    def metrics(self) -> list[Metric]:
        with self.lock:
            report = self.report
            passes, last, duration = self.passes, self.last_pass, self.pass_duration
            rates = self.rates
        if report is None:
            return []
        out = exporter.report_metrics(report, self._modules(), rates)
        m = Metric("nodehealth_daemon_passes_total", "Passes the daemon has run since it started.", "counter")
        m.add((), passes)
        out.append(m)
        m = Metric("nodehealth_daemon_last_pass_timestamp_seconds", "Unix time of the last completed pass.")
        m.add((), last)
        out.append(m)
        m = Metric("nodehealth_daemon_pass_duration_seconds", "Wall time of the last pass.")
        m.add((), duration)
        out.append(m)
        m = Metric("nodehealth_state_save_errors_total",
                   "Times the state file could not be written (sticky faults would not survive a restart).", "counter")
        m.add((), self.save_errors)
        out.append(m)
        if self.kmsg_module is not None and self.kernel_supported is None:
            m = Metric("nodehealth_kernel_log_follower_up", "1 while the kernel log follower is reading, else 0.")
            m.add((), 1 if self.follower_alive else 0)
            out.append(m)
        for face in (self.publisher, self.drainer, self.hang, self.pingmesh):
            if face is not None:
                out.extend(face.metrics())
        return out

    def health(self) -> tuple[bool, str]:
        with self.lock:
            last = self.last_pass
        if last is None:
            return False, "no pass has completed yet"
        age = self.engine.clock() - last
        if age > 3 * self.interval + self.engine.timeout:
            return False, f"last pass was {age:.0f}s ago"
        # A kernel log the daemon may not open (an unprivileged pod) makes the kernel checks unknown
        # and the follower-up metric 0; only a follower thread that died makes the daemon unhealthy.
        if self.follower_thread is not None and not self.follower_thread.is_alive():
            return False, "kernel log follower thread died"
        if self.save_error is not None:
            # Still 200: a restart cannot fix a full or read-only disk and would lose what only memory holds.
            return True, f"degraded: {self.save_error}"
        return True, "ok" if self.follower_alive or self.follower_thread is None else f"ok ({self.kernel_error})"

    def _start_pingmesh(self, server: Any) -> list[threading.Thread]:
        """Bind the probe ports now, so that a port in use or a missing extra is a one-line error."""
        from nodehealth.probe.agent import ProbeError
        from nodehealth.probe.mesh import Pingmesh  # grpc only where probes run

        try:
            self.pingmesh = Pingmesh(self.node, self.cfg["pingmesh"], self._inventory_loader())
            return self.pingmesh.start(self.stop)
        except ImportError as e:
            server.server_close()
            raise ConfigError(f"--probe-listen needs grpcio and protobuf: pip install 'nodehealth[probes]' ({e})") \
                from None
        except ProbeError as e:
            server.server_close()
            raise ConfigError(str(e)) from None

    def _start_rdma(self, server: Any) -> list[threading.Thread]:
        from nodehealth.rdma_periodic import RdmaPeriodic, inventory_peers  # only a daemon that tests pays

        cfg = self.cfg["rdma_bw"]
        peers = cfg["peers"]
        if not peers and self.cfg["pingmesh"]["inventory_file"]:
            from nodehealth.probe.inventory import InventoryError

            try:
                peers = inventory_peers(self.cfg["pingmesh"]["inventory_file"], self.node)[:RDMA_BW_MAX_PEERS]
            except InventoryError as e:
                server.server_close()
                raise ConfigError(f"rdma_bw: cannot take peers from the pingmesh inventory: {e}") from None
        if not peers:  # no finding says so: a rail never tested has none
            log.warning("rdma_bw: no peer to test against (no rdma_bw.peers, and no leaf-mates of %s in "
                        "pingmesh.inventory_file): this node's rails are not tested, only served", self.node)
        self.rdma = RdmaPeriodic(cfg, self.host, self.node, self.on_rdma, self.engine.clock, peers=peers)
        return self.rdma.start(self.stop, self.pass_idle)

    def _inventory_loader(self) -> Any:
        """The static inventory file, else (in Kubernetes) the one the controller publishes."""
        from nodehealth.probe import inventory

        path = self.cfg["pingmesh"]["inventory_file"]
        if path:
            return lambda: inventory.load_file(path)
        from nodehealth import kube

        api = kube.ClientApi(self.cfg["kube"]["kubeconfig"], self.cfg["kube"]["request_timeout_seconds"])

        def load() -> Any:
            try:
                inv = kube.read_inventory(api, self.cfg["pingmesh"])
            except kube.KubeError as e:
                raise inventory.InventoryError(f"cannot read the controller's inventory: {e}") from None
            if inv is None:
                raise inventory.InventoryError("the controller has not published an inventory yet")
            return inv
        return load

    def _pingmesh_verdicts(self) -> None:
        """Every window, the controller's verdicts about this node and its leaf become its findings.
        A failed read keeps the last document: its own age expires it (probe/verdicts.py)."""
        import random

        from nodehealth import kube
        from nodehealth.probe import verdicts

        cfg = self.cfg["pingmesh"]
        api = kube.ClientApi(self.cfg["kube"]["kubeconfig"], self.cfg["kube"]["request_timeout_seconds"])
        doc = None
        while not self.stop.is_set():
            try:
                doc = kube.read_verdicts(api, cfg)
            except kube.KubeError as e:
                log.warning("cannot read the pingmesh verdicts: %s", e)
            self.pingmesh.set_verdicts(verdicts.verdict_findings(doc, self.node, self.pingmesh.leaf(), time.time()))
            # Jittered, so that thousands of agents do not read the ConfigMap in the same second.
            self.stop.wait(cfg["window_seconds"] * (1 + 0.1 * random.random()))

    def pingmesh_json(self, windows: int | None, since: float | None = None) -> str | None:
        if self.pingmesh is None:
            return None
        return json.dumps(self.pingmesh.summary(windows, since), separators=(",", ":"))

    def report_json(self) -> str | None:
        with self.lock:
            report = self.report
        return render.to_json(report) if report is not None else None

    def serve(self) -> int:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if self.cfg["kube"]["enabled"]:
            from nodehealth.kube import KubeError, require_client

            try:
                require_client()
            except KubeError as e:  # said once, at start, instead of at every retry
                raise ConfigError(f"--kube: {e}") from None
        if self.cfg["slurm"]["enabled"] and shutil.which(self.cfg["slurm"]["scontrol"]) is None:
            raise ConfigError(f"--slurm: {self.cfg['slurm']['scontrol']} not found: install slurm-client or set "
                              "slurm.scontrol")
        listen = self.cfg["daemon"]["listen"]
        try:
            server = make_server(self, listen)
        except (OSError, ValueError, OverflowError) as e:  # port in use, no such address, not ADDR:PORT
            raise ConfigError(f"cannot listen on {listen}: {getattr(e, 'strerror', None) or e}") from None
        probe_threads = self._start_pingmesh(server) if self.cfg["pingmesh"]["enabled"] else []
        rdma_threads = self._start_rdma(server) if self.cfg["rdma_bw"]["enabled"] else []
        self.load_state()
        if self.kmsg_module is not None:
            self.kernel_supported = self.kmsg_module.supported(self.host, self.cfg["collectors"].get(kmsg.NAME, {}))
        # SIGHUP too: its default kills the process without saving the state.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: self.stop.set())
        threads = [threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                    name="http", daemon=True),
                   threading.Thread(target=self._pass_loop, name="passes", daemon=True)]
        if self.kmsg_module is not None and self.kernel_supported is None:
            self.follower_thread = threading.Thread(target=self._follow, name="kmsg", daemon=True)
            threads.append(self.follower_thread)
        if self.cfg["hang"]["enabled"]:
            from nodehealth.hang.detector import Detector  # only a daemon watching training pays for it

            hang = self.cfg["hang"]
            bundles = hang["bundle_dir"] or os.path.join(self.state.directory, "hang")
            self.hang = Detector(hang["directory"], bundles, hang, node=self.node)
            threads.append(threading.Thread(target=self.hang.run, args=(self.stop,), name="hang", daemon=True))
        if self.pingmesh is not None:
            threads.extend(probe_threads)
            if self.cfg["kube"]["enabled"]:
                threads.append(threading.Thread(target=self._pingmesh_verdicts, name="pingmesh-verdicts",
                                                daemon=True))
        if self.cfg["kube"]["enabled"]:
            from nodehealth.kube import Publisher  # only the daemon with kube.enabled pays for it

            self.publisher = Publisher(self.node, self.cfg["kube"], on_clear=self.clear)
            self.publisher.start()
        if self.cfg["slurm"]["enabled"]:
            from nodehealth.slurm import Drainer, slurm_node_name

            self.drainer = Drainer(slurm_node_name(self.cfg["slurm"]["node_name"]), self.cfg["slurm"])
            self.drainer.start()
        if self.nvml_supported:
            threads.append(threading.Thread(target=self._nvml_events, name="nvml-events", daemon=True))
        threads.extend(rdma_threads)
        for t in threads:
            t.start()
        host, port = server.server_address[:2]
        log.info("nodehealth daemon on %s:%s, pass every %gs, state in %s", host, port, self.interval,
                 self.state.path)
        self.stop.wait()
        log.info("stopping")
        faulthandler.dump_traceback_later(STUCK_STOP_SECONDS, exit=True)
        server.shutdown()
        for face in (self.publisher, self.drainer):
            if face is not None:
                face.stop(0.5)
        if self.nvml_supported:
            nvml.reset_backend()  # wakes the event waiter
        server.server_close()
        if self.pingmesh is not None:
            self.pingmesh.stop()
        for t in threads[1:]:
            t.join(STOP_GRACE_SECONDS / len(threads))
        self.save_state()
        faulthandler.dump_traceback_later(STUCK_EXIT_SECONDS, exit=True)
        return 0


def _problems(report: Report | None) -> dict[tuple[str, str, str], Finding]:
    """The findings that decide the verdict: degraded, fatal, and unknown (could not judge)."""
    if report is None:
        return {}
    return {f.key: f for f in report.findings if f.severity.rank >= Severity.UNKNOWN.rank}


def log_change(previous: Report | None, current: Report) -> None:
    """Log a change of the verdict or of what makes it: WARNING when it gets worse, INFO when better."""
    before, after = _problems(previous), _problems(current)
    old_status = previous.status.value if previous is not None else None
    if old_status == current.status.value and before.keys() == after.keys():
        return
    new = [f"{f.severity.value} {f.reason}" + (f" on {f.device}" if f.device else "") + f" ({f.check})"
           for k, f in after.items() if k not in before]
    gone = [f"{f.reason}" + (f" on {f.device}" if f.device else "") for k, f in before.items() if k not in after]
    worse = current.status is not Status.HEALTHY and (bool(new) or old_status in (None, Status.HEALTHY.value))
    log.log(logging.WARNING if worse else logging.INFO, "node %s: %s -> %s%s%s", current.node,
            old_status or "starting", current.status.value, "; new: " + ", ".join(new) if new else "",
            "; gone: " + ", ".join(gone) if gone else "")


CLEAR_REQUEST = "clear-request.json"
MAX_REASON = 500


def request_clear(state_dir: str, reason: str) -> str:
    """Ask the daemon to clear sticky faults (`nodehealth clear`); it acts at its next pass."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    path = os.path.join(state_dir, CLEAR_REQUEST)
    write_atomic(path, json.dumps({"reason": reason[:MAX_REASON], "time": time.time()}).encode(), mode=0o600)
    return path


def take_clear_request(state_dir: str) -> str | None:
    """The reason of a pending clear request, removing it; None when there is none (or it is garbage)."""
    path = os.path.join(state_dir, CLEAR_REQUEST)
    try:
        data = json.loads(read_regular(path, 4096))  # a FIFO put there must not block the passes
        os.unlink(path)
    except (OSError, ValueError):
        return None
    reason = data.get("reason") if isinstance(data, dict) else None
    return str(reason)[:MAX_REASON] if reason else "no reason given"


def _windows_param(query: str) -> int | None:
    """`?windows=N`: only the newest N windows (the controller asks for the few it has not seen)."""
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key == "windows" and value.isdigit():
            return min(int(value), 1000)
    return None


def _since_param(query: str) -> float | None:
    """`?since=START`: the newest window start the asker has (Pingmesh.summary); anything but a finite
    number of at most 32 characters is ignored (every window in full)."""
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key == "since" and 0 < len(value) <= 32:
            try:
                since = float(value)
            except ValueError:
                return None
            return since if math.isfinite(since) else None
    return None


def make_server(daemon: Daemon, listen: str) -> HTTPServer:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    if not port.isdigit():
        raise ValueError(f"--listen must be ADDR:PORT, not {listen!r}")

    class Handler(BoundedHandler):
        server_version = "nodehealth"

        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            path, _, query = self.path.partition("?")
            if path == "/metrics":
                body = exporter.render(daemon.metrics())
                self._send(200, body, exporter.CONTENT_TYPE)
            elif path == "/healthz":
                ok, why = daemon.health()
                self._send(200 if ok else 503, (why + "\n").encode(), "text/plain")
            elif path == "/v1/report":
                text = daemon.report_json()
                if text is None:
                    self._send(503, b'{"error": "no pass has completed yet"}\n', "application/json")
                else:
                    self._send(200, text.encode(), "application/json")
            elif path == "/v1/pingmesh" and daemon.pingmesh is not None:
                windows, since = _windows_param(query), _since_param(query)
                self._send(200, daemon.pingmesh_json(windows, since).encode(), "application/json")
            else:
                paths = ["/metrics", "/healthz", "/v1/report"] + (["/v1/pingmesh"] if daemon.pingmesh else [])
                self._send(404, json.dumps({"error": "not found", "paths": paths}).encode() + b"\n",
                           "application/json")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), fmt % args)

    class Server(BoundedHTTPServer):
        allow_reuse_address = True
        request_queue_size = 64
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    return Server((host, int(port)), Handler, MAX_CONCURRENT_REQUESTS, REQUEST_TIMEOUT_SECONDS)
