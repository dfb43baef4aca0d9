"""The daemon: passes on an interval, the streams between them, and the faces that show the verdict.

Long on purpose: every part the daemon runs (passes, streams, sources, faces) starts, meets and stops here.

Threads: the main thread waits for a signal (nodehealth/server.py); the workers below run under a
supervisor that runs one again when it dies and shows it in /healthz (nodehealth/supervisor.py). A
pass thread runs the collectors every interval; the kernel stream (nodehealth/kernel_stream.py)
brings kernel records and NVML Xids as they come, and the daemon judges the kernel-log checks again
at once (a new Xid reaches /metrics in milliseconds, not at the next pass); so do a bandwidth test's
end (nodehealth/rdma/periodic.py) and the pingmesh controller's verdicts
(nodehealth/pingmesh/verdicts.py). Every judgement goes through the same pass
(nodehealth/node_pass.py) and policy, and each full report goes to every face. All shared state
changes under one lock and is saved atomically after each change. Its listeners hold at most what
leaves descriptors for this work (serve()).
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import threading
import time
from typing import Any

from nodehealth import exporter, logs, node_pass, server
from nodehealth import report as render
from nodehealth.collectors import kmsg, nvml
from nodehealth.collectors import pingmesh as pingmesh_facts
from nodehealth.collectors import rdma_bw as rdma_facts
from nodehealth.config import ConfigError
from nodehealth.engine import Engine, failed
from nodehealth.faces import Face
from nodehealth.host import boot_id, kept_files_budget
from nodehealth.kernel_stream import Batch, KernelEvents, KernelStream
from nodehealth.model import CollectorResult, Finding, Metric, Report, Severity, Status, sort_findings, verdict
from nodehealth.policy import Policy, StateFile, take_clear_request
from nodehealth.process_metrics import process_metrics
from nodehealth.silences.tracker import Silences
from nodehealth.supervisor import Supervisor
from nodehealth.tls.identity import load_identity

log = logging.getLogger("nodehealth.daemon")

STOP_GRACE_SECONDS = 1.5
# A stop that hangs anyway (a thread or the interpreter's teardown stuck) prints every thread's stack
# and exits 1: before the state is written within the DaemonSet's grace period of 10 s, after it at
# once (server.STUCK_EXIT_SECONDS).
STUCK_STOP_SECONDS = 8.0


class Daemon:
    def __init__(self, engine: Engine, cfg: dict[str, Any], node: str):
        self.cfg = cfg
        self.node = node
        self.interval = float(cfg["daemon"]["interval_seconds"])
        self.host = engine.host
        self.boot_id = boot_id(self.host)
        self.state = StateFile(cfg["daemon"]["state_dir"])
        self.silences = Silences(cfg["daemon"]["state_dir"], cfg["silences"])
        self.kmsg_module = next((m for m in engine.collectors if m.NAME == kmsg.NAME), None)
        self.nvml_supported = any(m is nvml for m in engine.collectors) and nvml.supported(self.host, {}) is None
        # Passes poll every collector but the kernel log, which the kernel stream follows.
        self.engine = Engine([m for m in engine.collectors if m is not self.kmsg_module], engine.checks,
                             engine.host, cfg, engine.timeout, engine.clock)
        self.kernel_checks = self._checks_of(kmsg.NAME)
        self.rdma_checks = self._checks_of(rdma_facts.NAME)
        self.pingmesh_checks = self._checks_of(pingmesh_facts.NAME)
        self.policy = Policy(cfg["policy"], [c.NAME for c in engine.checks if getattr(c, "DEBOUNCE", False)],
                             self.boot_id, event_reasons=[(c.NAME, r) for c in engine.checks
                                                          for r in getattr(c, "EVENT_REASONS", ())])
        self.kernel = KernelEvents(self.boot_id, self.host.dev("kmsg"))
        self.stream = KernelStream(self.host, cfg["collectors"].get(kmsg.NAME, {}), self.kernel, self.on_kernel,
                                   self.engine.clock)
        self.kernel_supported: str | None = None
        self.lock = threading.Lock()
        self.save_lock = threading.Lock()
        self.stop = threading.Event()
        self.results: dict[str, CollectorResult] = {}
        self.rates: dict[str, dict[str, float]] = {}
        self.current: dict[str, list[Finding]] = {}  # non-sticky findings per check
        self.report: Report | None = None  # the latest judged
        self.judged = 0  # reports judged so far: the newest's number
        self.send_lock = threading.Lock()
        self.sent = 0  # the number of the report the faces have
        self.shown: Report | None = None  # that report: what /v1/report answers, as /metrics does
        self.passes = 0
        self.last_pass: float | None = None
        self.pass_duration = 0.0
        self.workers = Supervisor(self.stop)
        self.http: server.BoundedHTTPServer | None = None  # serve() makes it
        self.tls: Any = None  # nodehealth.tls.identity.Identity when tls.enabled; serve() loads it
        # Connections each listener may hold: serve() fits them to the descriptor limit.
        self.caps = {"http": server.MAX_PENDING}
        self.save_errors = 0
        self.save_error: str | None = None  # why the last save failed; None once one succeeds
        self.exporter = exporter.Exporter(self._modules, cfg["exporter"])
        self.faces: list[Face] = [self.exporter]  # and, when enabled, Kubernetes and Slurm (start())
        self.hang: Any = None  # nodehealth.hang.detector.Detector when hang.enabled
        self.pingmesh: Any = None  # nodehealth.pingmesh.mesh.Pingmesh when pingmesh.enabled
        self.pingmesh_verdicts: pingmesh_facts.Verdicts | None = None  # as last read, when Kubernetes is on
        self.rdma: Any = None  # nodehealth.rdma.periodic.RdmaPeriodic when rdma_bw.enabled
        self.attributor: Any = None  # nodehealth.attribution.attributor.Attributor when attribution.enabled
        self.pass_idle = threading.Event()  # set between passes: the RDMA tests start only then

    def _checks_of(self, source: str) -> list[Any]:
        return [c for c in self.engine.checks if source in c.NEEDS]

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
        if self.stream.error is not None:
            return failed(kmsg, self.stream.error)
        return CollectorResult(kmsg.NAME, True, True, facts=self.kernel.facts())

    def _streamed(self) -> dict[str, CollectorResult]:
        """What arrives between passes, as results: the kernel log, the bandwidth tests, the verdicts."""
        out = {}
        kernel = self._kernel_result()
        if kernel is not None:
            out[kmsg.NAME] = kernel
        if self.rdma is not None:
            out[rdma_facts.NAME] = CollectorResult(rdma_facts.NAME, True, True, facts=self.rdma.facts())
        if self.pingmesh_verdicts is not None:
            out[pingmesh_facts.NAME] = CollectorResult(pingmesh_facts.NAME, True, True, facts=self.pingmesh_verdicts)
        return out

    def _judge(self, results: dict[str, CollectorResult], checks: list[Any], now: float) -> None:
        """Judge `checks` on `results` and rebuild the report. Caller holds the lock."""
        results = dict(results, **self._streamed())
        findings = node_pass.judge(self.engine, results, self.rates, now, checks)
        # NothingChecked is judged every time; a failed source's one finding with the checks that read it
        names = [c.NAME for c in checks] + sorted({n for c in checks for n in c.NEEDS}) + ["nodehealth"]
        current = self.policy.apply(findings, now, judged_checks=names)
        for name in names:
            self.current[name] = []
        for f in current:
            self.current.setdefault(f.check, []).append(f)
        shown = [f for fs in self.current.values() for f in fs] + self.policy.sticky_findings()
        for source in (self.hang, self.pingmesh):  # their own trouble: a hung job, an inventory not read
            if source is not None:
                shown += source.findings()
        shown = self.silences.apply(shown)
        ordered = [results[m.NAME] for m in self._modules() if m.NAME in results]
        previous = self.report
        self.report = Report(self.node, verdict(shown), sort_findings(shown), ordered, now, self.rates)
        self.judged += 1
        log_change(previous, self.report)

    def _modules(self) -> list[Any]:
        """The collectors whose results the report lists, and whose families /metrics shows."""
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
            judged = self._rejudge(self.kernel_checks)
        log.warning("cleared by operator (%s): %d sticky finding(s) (%s) and %d kernel event(s)", reason,
                    len(sticky), ", ".join(sorted(f.reason for f in sticky)) or "none", events)
        self._save_and_send(judged)

    def on_silences(self, annotation: str | None) -> None:
        """The Node's silences annotation as the Kubernetes face just read it: judged now if it changed."""
        if not self.silences.set_annotation(annotation):
            return
        with self.lock:
            judged = self._rejudge([])
        self._save_and_send(judged)

    def _rejudge(self, checks: list[Any]) -> tuple[Report, int] | None:
        """Judge `checks` again on news between passes (kernel records, a bandwidth test, the pingmesh
        verdicts, a clear); the report to send and its number, or None before the first full pass.
        Caller holds the lock."""
        if self.report is not None:
            self._judge(self.results, checks, self.engine.clock())
        return (self.report, self.judged) if self.passes else None

    def _send(self, report: Report, number: int, attributed: bool = False) -> None:
        """Hand a report to every face, never one older than what they have: threads judge at once
        (a pass, the kernel stream), and each sends only after it saved the state. A report judged
        between passes gets the attribution the findings had (node_pass.attribute, not asking)."""
        with self.send_lock:
            if number <= self.sent:
                return
            if not attributed:
                report = node_pass.attribute(self.attributor, report, ask=False)
            self.sent, self.shown = number, report
            for face in self.faces:
                face.publish(report)

    def run_pass(self) -> None:
        self.pass_idle.clear()
        try:
            self._run_pass()
        finally:
            self.pass_idle.set()

    def _run_pass(self) -> None:
        request = take_clear_request(self.state.directory)
        if request is not None:
            self.clear(request)
        self.silences.reload()
        start = time.monotonic()
        results = self.engine.collect()
        now = self.engine.clock()
        with self.lock:
            self.rates = self.engine.rates(results, now)
            self.results = results
            self._judge(results, self.engine.checks, now)
            self.passes += 1
            self.last_pass = now
            self.pass_duration = time.monotonic() - start
            report, number = self.report, self.judged
        self.save_state()
        self._send(node_pass.attribute(self.attributor, report), number, attributed=True)  # asks outside the locks

    def on_kernel(self, batch: Batch) -> None:
        with self.lock:
            self.kernel.add(batch)
            judged = self._rejudge(self.kernel_checks)
        self._save_and_send(judged)

    def on_rdma(self) -> None:
        """A bandwidth test ended: judge it now rather than at the next pass."""
        with self.lock:
            judged = self._rejudge(self.rdma_checks)
        self._save_and_send(judged)

    def on_pingmesh_verdicts(self, doc: dict[str, Any] | None, read_at: float) -> None:
        """The controller's verdicts, as just read: judged now, so that a verdict reaches the taint
        within a read, not a pass later."""
        leaf = self.pingmesh.leaf() if self.pingmesh is not None else ""
        with self.lock:
            self.pingmesh_verdicts = pingmesh_facts.Verdicts(self.node, leaf, doc, read_at)
            judged = self._rejudge(self.pingmesh_checks)
        self._save_and_send(judged)

    def _save_and_send(self, judged: tuple[Report, int] | None) -> None:
        """News judged between passes is saved first (a sticky fault it raised survives a restart)."""
        self.save_state()
        if judged is not None:
            self._send(*judged)

    def _pass_loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.run_pass()
            except Exception:
                log.exception("pass failed")
            self.stop.wait(self.interval)

    # -- what it shows -------------------------------------------------------------------------
    def metrics(self) -> list[Metric]:
        """Every family /metrics shows: the report's, then the daemon's own."""
        out = self.exporter.metrics()
        return out + self.own_metrics() if out else []  # nothing before the first pass

    def exposition(self) -> bytes:
        """/metrics: the report's families as the exporter wrote them for the report's first scrape, and the
        daemon's own, which change between passes (process_*, the listeners, the workers), in one name order."""
        report = self.exporter.written()
        if not report:  # no pass yet
            return b""
        return exporter.join(report, exporter.written(exporter.shape(self.own_metrics(), self.cfg["exporter"])))

    def own_metrics(self) -> list[Metric]:
        """The daemon's own families: its passes, its process, each part's (faces, workers, listeners)."""
        with self.lock:
            passes, last, duration = self.passes, self.last_pass, self.pass_duration
        out = [Metric.one("nodehealth_daemon_passes_total", "Passes the daemon has run since it started.", passes,
                          "counter"),
               Metric.one("nodehealth_daemon_last_pass_timestamp_seconds", "Unix time of the last completed pass.",
                          last),
               Metric.one("nodehealth_daemon_pass_duration_seconds", "Wall time of the last pass.", duration),
               Metric.one("nodehealth_state_save_errors_total", "Times the state file could not be written (sticky "
                          "faults would not survive a restart).", self.save_errors, "counter"),
               *process_metrics()]
        if self.kmsg_module is not None and self.kernel_supported is None:
            out.append(Metric.one("nodehealth_kernel_log_follower_up",
                                  "1 while the kernel log follower is reading, else 0.", 1 if self.stream.alive else 0))
        for part in [*self.faces[1:], self.silences, self.hang, self.pingmesh, self.attributor, self.workers,
                     self.http]:
            if part is not None:
                out.extend(part.metrics())
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
        # and the follower-up metric 0; only a worker thread that is down makes the daemon unhealthy.
        problems = self.workers.problems()
        if problems:
            return False, "; ".join(problems)
        if self.save_error is not None:
            # Still 200: a restart cannot fix a full or read-only disk and would lose what only memory holds.
            return True, f"degraded: {self.save_error}"
        return True, "ok" if self.stream.alive or not self._follows_kernel() else f"ok ({self.stream.error})"

    def _follows_kernel(self) -> bool:
        return self.kmsg_module is not None and self.kernel_supported is None

    def routes(self) -> server.Routes:
        routes = {"/metrics": lambda _: (200, self.exposition(), exporter.CONTENT_TYPE),
                  "/healthz": self._healthz, "/v1/report": self._report}
        if self.pingmesh is not None:
            routes["/v1/pingmesh"] = self._pingmesh
        return routes

    def _healthz(self, query: str) -> server.Answer:
        ok, why = self.health()
        return 200 if ok else 503, (why + "\n").encode(), "text/plain"

    def _report(self, query: str) -> server.Answer:
        report = self.shown
        if report is None:
            return 503, b'{"error": "no pass has completed yet"}\n', "application/json"
        return 200, render.to_json(report).encode(), "application/json"

    def _pingmesh(self, query: str) -> server.Answer:
        from nodehealth.pingmesh import packed  # imported with the probe agent already

        windows, since = _windows_param(query), _since_param(query)
        if packed.QUERY in query.split("&"):  # a controller that reads the packed form (packed.py)
            return 200, self.pingmesh.packed_summary(windows, since), packed.CONTENT_TYPE
        summary = self.pingmesh.summary(windows, since)
        return 200, json.dumps(summary, separators=(",", ":")).encode(), "application/json"

    # -- lifecycle -----------------------------------------------------------------------------
    def serve(self) -> int:
        """Run until SIGTERM/SIGINT/SIGHUP: check what the enabled faces need, listen, start, and at
        the end stop and save the state."""
        self._check_faces()
        self._fit_descriptors()
        share_malloc_arenas()
        listen = self.cfg["daemon"]["listen"]
        self.tls = load_identity(self.cfg, self.node)  # a ConfigError names what is wrong with its files
        try:
            http = self.http = make_server(self, listen)
        except (OSError, ValueError, OverflowError) as e:  # port in use, no such address, not ADDR:PORT
            raise ConfigError(f"cannot listen on {listen}: {getattr(e, 'strerror', None) or e}") from None
        try:
            self.open()
        except ConfigError:
            http.server_close()
            raise

        def start() -> None:
            self.start()
            host, port = http.server_address[:2]
            log.info("nodehealth daemon on %s:%s, pass every %gs, state in %s", host, port, self.interval,
                     self.state.path)

        return server.serve_until_signal(http, self.stop, start, self.shutdown, STUCK_STOP_SECONDS)

    def _fit_descriptors(self) -> None:
        """Listeners' caps that leave descriptors for the daemon's own work, whatever its clients do."""
        wants = {"http": server.MAX_PENDING}
        if self.cfg["pingmesh"]["enabled"]:
            from nodehealth.pingmesh import agent

            wants["pingmesh"] = agent.MAX_CONNECTIONS
        limit = server.raise_descriptor_limit()
        # the infiniband collector's kept counter files (host.KeptFiles) come out of the listeners' share
        self.caps = server.share_descriptors(limit - kept_files_budget(limit), wants)
        if self.caps != wants:
            log.warning("the open-file limit is %d: connections capped at %s to keep %d for the daemon's own "
                        "work (raise LimitNOFILE or the container's nofile limit)", limit,
                        ", ".join(f"{self.caps[k]} on {k}" for k in wants), server.RESERVED_DESCRIPTORS)

    def _check_faces(self) -> None:
        """What an enabled face needs, said once at start instead of at every retry."""
        if self.cfg["kube"]["enabled"]:
            from nodehealth.kube.api import KubeError, require_config

            try:
                require_config(self.cfg["kube"]["kubeconfig"])
            except KubeError as e:
                raise ConfigError(f"--kube: {e}") from None
        if self.cfg["slurm"]["enabled"] and shutil.which(self.cfg["slurm"]["scontrol"]) is None:
            raise ConfigError(f"--slurm: {self.cfg['slurm']['scontrol']} not found: install slurm-client or set "
                              "slurm.scontrol")
        attribution = self.cfg["attribution"]
        if attribution["enabled"] and "slurm" in attribution["sources"] and not self.cfg["slurm"]["enabled"]:
            raise ConfigError("attribution.sources has slurm: the daemon asks scontrol through its Slurm face; "
                              "run it with --slurm")

    def open(self) -> None:
        """Bind the probe ports and find the rails to test, so that a port in use or a missing extra is
        a one-line ConfigError before anything runs; then read the saved state."""
        if self.cfg["pingmesh"]["enabled"]:
            self._open_pingmesh()
        if self.cfg["rdma_bw"]["enabled"]:
            self._open_rdma()
        self.load_state()
        if self.kmsg_module is not None:
            self.kernel_supported = self.kmsg_module.supported(self.host, self.cfg["collectors"].get(kmsg.NAME, {}))

    def _open_pingmesh(self) -> None:
        from nodehealth.pingmesh.agent import MAX_CONNECTIONS, ProbeError
        from nodehealth.pingmesh.mesh import Pingmesh  # grpc only where probes run
        from nodehealth.pingmesh.verdicts import inventory_source

        try:
            self.pingmesh = Pingmesh(self.node, self.cfg["pingmesh"], inventory_source(self.cfg["pingmesh"],
                                                                                        self.cfg["kube"]),
                                     tls=self.tls)
            for name, run in self.pingmesh.start(self.stop, self.caps.get("pingmesh", MAX_CONNECTIONS)).items():
                self.workers.add(name, run)
            self.workers.watch(self.pingmesh.agent.thread)
            # The agent runs: the `pingmesh` check has its source, with no verdict until the controller writes one.
            self.pingmesh_verdicts = pingmesh_facts.Verdicts(self.node, "", None, time.time())
        except ImportError as e:
            raise ConfigError(f"--probe-listen needs grpcio: pip install 'nodehealth[probes]' ({e})") from None
        except ProbeError as e:
            raise ConfigError(str(e)) from None

    def _open_rdma(self) -> None:
        from nodehealth.inventory import InventoryError
        from nodehealth.rdma.periodic import RdmaPeriodic, daemon_peers  # only a daemon that tests pays

        cfg = self.cfg["rdma_bw"]
        try:
            peers = daemon_peers(cfg, self.cfg["pingmesh"]["inventory_file"], self.node)
        except InventoryError as e:
            raise ConfigError(f"rdma_bw: cannot take peers from the pingmesh inventory: {e}") from None
        self.rdma = RdmaPeriodic(cfg, self.host, self.node, self.on_rdma, self.engine.clock, peers=peers)
        for thread in self.rdma.start(self.stop, self.pass_idle):
            self.workers.watch(thread)  # started with the workers; the RDMA tests keep their own threads alive

    def start(self) -> None:
        """Start the passes, the streams, the sources and the faces (after open())."""
        self.workers.add("passes", self._pass_loop)
        if self._follows_kernel():
            self.workers.add("kmsg", lambda: self.stream.follow(self.stop))
        if self.nvml_supported:
            self.workers.add("nvml-events", lambda: self.stream.nvml_events(self.stop))
        if self.cfg["hang"]["enabled"]:
            from nodehealth.hang.detector import Detector  # only a daemon watching training pays for it

            hang = self.cfg["hang"]
            bundles = hang["bundle_dir"] or os.path.join(self.state.directory, "hang")
            self.hang = Detector(hang["directory"], bundles, hang, node=self.node)
            self.workers.add("hang", lambda: self.hang.run(self.stop))
        if self.pingmesh is not None and self.cfg["kube"]["enabled"]:
            from nodehealth.kube.api import ClientApi
            from nodehealth.pingmesh.verdicts import follow_verdicts

            api = ClientApi(self.cfg["kube"]["kubeconfig"], self.cfg["kube"]["request_timeout_seconds"])
            self.workers.add("pingmesh-verdicts", lambda: follow_verdicts(api, self.cfg["pingmesh"],
                                                                          self.on_pingmesh_verdicts, self.stop))
        publisher = None
        if self.cfg["kube"]["enabled"]:
            from nodehealth.kube.publisher import Publisher  # only the daemon with kube.enabled pays for it

            publisher = Publisher(self.node, self.cfg["kube"], on_clear=self.clear, on_silences=self.on_silences)
            self.faces.append(publisher)
        if self.cfg["slurm"]["enabled"]:
            from nodehealth.slurm.drainer import Drainer
            from nodehealth.slurm.scontrol import slurm_node_name

            self.faces.append(Drainer(slurm_node_name(self.cfg["slurm"]["node_name"]), self.cfg["slurm"]))
        self.attributor = node_pass.attributor(self.cfg, self.host)
        if self.cfg["hooks"]["enabled"]:
            from nodehealth.hooks.hook import Hook

            self.faces.append(Hook(self.node, self.cfg["hooks"], notify=publisher.note if publisher else None))
        for face in self.faces:
            for thread in face.start():
                self.workers.watch(thread)  # a face's thread that ends early fails /healthz
        self.workers.start()

    def shutdown(self) -> None:
        """Stop what start() started, within STOP_GRACE_SECONDS for the threads, and save the state."""
        self.stop.set()
        for face in self.faces:
            face.stop(0.5)
        if self.nvml_supported:
            nvml.reset_backend()  # wakes the event waiter
        if self.pingmesh is not None:
            self.pingmesh.stop()
        self.workers.join(STOP_GRACE_SECONDS)
        self.save_state()


def _problems(report: Report | None) -> dict[tuple[str, str, str], Finding]:
    """The findings that decide the verdict: degraded, fatal, and unknown (could not judge), unless silenced."""
    if report is None:
        return {}
    return {f.key: f for f in report.findings if f.severity.rank >= Severity.UNKNOWN.rank and f.silenced is None}


def log_change(previous: Report | None, current: Report) -> None:
    """Log a change of the verdict or of what makes it: WARNING when it gets worse, INFO when better; then
    one line per finding that came (WARNING, with its message) or went (INFO), with its check, reason and
    device as fields of the line (nodehealth/logs.py)."""
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
    for key, f in after.items():
        if key not in before:
            log.warning("raised: %s %s%s (%s): %s", f.severity.value, f.reason, f" on {f.device}" if f.device else "",
                        f.check, f.message, extra=logs.finding_fields(f))
    for key, f in before.items():
        if key not in after:
            log.info("cleared: %s%s (%s)", f.reason, f" on {f.device}" if f.device else "", f.check,
                     extra=logs.finding_fields(f))


def _windows_param(query: str) -> int | None:
    """`?windows=N`: only the newest N windows (the controller asks for the few it has not seen)."""
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key == "windows" and value.isascii() and value.isdigit():  # "²" is a digit to isdigit(), not to int()
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


def make_server(daemon: Daemon, listen: str) -> server.BoundedHTTPServer:
    """/metrics, /healthz, /v1/report, and /v1/pingmesh when the probe agent runs."""
    from nodehealth.tls.access import http_options

    return server.make_server(listen, daemon.routes, "nodehealth", max_pending=daemon.caps["http"],
                              **http_options(daemon.cfg, daemon.tls))


MALLOC_ARENAS = 2  # the glibc malloc arenas the daemon's threads share
_M_ARENA_MAX = -8  # mallopt's parameter, from glibc's malloc.h


def share_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Have the daemon's threads share `arenas` glibc malloc arenas. glibc gives a thread that allocates
    an arena of its own, up to eight per core: the daemon's threads (gRPC's four with the probe agent)
    kept 1.1 MiB more resident for them, with no CPU to show for it (benchmarks/RESULTS.md). Called
    before any thread starts; left alone where MALLOC_ARENA_MAX is in the environment (the operator's
    word) or the C library is not glibc. True where it took."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # not glibc: musl's mallopt takes no arena count
        return False
    return libc.mallopt(_M_ARENA_MAX, arenas) == 1
