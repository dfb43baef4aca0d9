"""`nodehealth controller`: the cluster-wide pingmesh analysis, done by one leader at a time.

The replicas of a Deployment elect a leader through a Lease (nodehealth/kube/election.py). Every
window the leader lists the managed Nodes, builds the inventory, fetches each agent's `/v1/pingmesh`
(fetch.py; bounded in concurrency, time and size: the agents are untrusted; only the windows it does
not keep yet, see KeptWindows), localizes faults (analysis.py, judging again only the windows that
changed) and writes the verdicts to one ConfigMap, read by every agent every window, and the
inventory, when it changed, to another one, read every pingmesh.refresh_seconds (verdicts.py). It
writes nothing else: each agent turns a verdict about its own node into a finding, so every Node
keeps one writer (docs/architecture.md). It serves /metrics and /healthz (nodehealth/server.py).
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import queue
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from nodehealth import __version__, exporter, inventory, logs, server
from nodehealth.kube.api import ClientApi, KubeApi, KubeError
from nodehealth.kube.defaults import DEFAULTS as KUBE_DEFAULTS
from nodehealth.kube.election import LEASE_SECONDS, RENEW_SECONDS, LeaderElector
from nodehealth.model import Metric
from nodehealth.pingmesh import analysis as pingmesh
from nodehealth.pingmesh import folded, packed, stats, verdicts
from nodehealth.pingmesh.fetch import FetchError, fetch_parsed
from nodehealth.process_metrics import process_metrics
from nodehealth.tls.access import Access, http_options
from nodehealth.tls.identity import load_identity

log = logging.getLogger("nodehealth.controller")

# Fetching stops this far into the window (what is left unfetched is "deadline"), so one slow
# analysis never runs into the next; the next one starts where this one stopped.
FETCH_BUDGET_FRACTION = 0.6
MAX_VERDICT_SERIES = 50  # nodehealth_pingmesh_verdict series; nodehealth_pingmesh_verdicts counts them all
KIND_ORDER = {"node": 0, "leaf": 1, "path": 2, "inconclusive": 3}  # what the cap keeps first: taints
FAILURE_EXAMPLES = 5  # failed agents named in the analysis's log line
# How long the analysis waits for one more answer to check with those it has (packed.check_each): a
# fetch is a few milliseconds, and while the analysis is busy the answers wait in the queue anyway.
CHECK_WAIT_SECONDS = 0.02
# What survives an analysis is hidden from Python's cyclic collector (freeze_survivors); every this many
# analyses it is walked once again, so that a reference cycle that became garbage while hidden is freed.
THAW_EVERY_CYCLES = 10
# A stop that hangs anyway prints every thread's stack and exits 1: within the Deployment's grace
# period of 10 s, and once the Lease is given up, at once (server.STUCK_EXIT_SECONDS).
STUCK_STOP_SECONDS = 9.0


@dataclass
class KeptWindows:
    """What the controller has of one agent's windows: those the analysis adds up (closed, by now), made
    ready once. Only the windows of the agent's last answer are kept: at most fetch_windows."""

    window_seconds: float
    windows: dict[float, folded.PreparedWindow]  # start -> window

    def since(self) -> float | None:
        return max(self.windows) if self.windows else None


def keep_windows(kept: KeptWindows | None, summary: stats.Summary,
                 now: float) -> tuple[folded.Prepared, KeptWindows, int]:
    """An answer to `?since=` made whole from what was kept, the windows to keep, and how many were parsed.

    An open window sent by its start alone is listed without peers (the analysis checks its start, and
    adds up closed windows only). Raises FetchError("incomplete") for a closed one that is not kept
    (kept under another window length, or never): the caller asks for everything then."""
    have = kept.windows if kept is not None and kept.window_seconds == summary.window_seconds else {}
    buckets = tuple(summary.buckets)
    out, keep, parsed = [], {}, 0
    for w in summary.windows:
        if w.peers is None and w.ready is None and not w.closed:
            ready = folded.PreparedWindow(w.start, False, 0, 0, None)
        elif w.peers is None and w.ready is None:
            ready = have.get(w.start)
            if ready is None:
                raise FetchError("incomplete", f"window {w.start:.3f} came by its start alone, and is not kept")
        else:
            ready = folded.prepare_window(w, summary.window_seconds, buckets, now)
            parsed += 1
            if ready.folded is not None and keep:
                ready.folded.share(keep[max(keep)].folded)
        if ready.folded is not None:
            keep[w.start] = ready
        out.append(ready)
    prepared = folded.Prepared(summary.node, summary.leaf, summary.window_seconds, buckets, out)
    return prepared, KeptWindows(summary.window_seconds, keep), parsed


def freeze_survivors(cycles: int) -> None:
    """Collect an analysis's garbage, then hide what survives from the cyclic collector (gc.freeze).

    Each of the collector's full collections walks every object the controller keeps (the windows of
    10,000 agents: ~620,000): 0.5 s of a 3.5 s analysis, halved this way (benchmarks/RESULTS.md). The
    kept windows hold no reference cycles, so reference counting alone frees them when they are
    replaced. Every THAW_EVERY_CYCLES (`cycles` counts the analyses) all is walked once, so that a
    cycle of objects that became garbage while hidden lives at most that long. Run after the
    verdicts are written: it costs ~0.15 s at 10,000 agents.
    """
    if cycles % THAW_EVERY_CYCLES == 0:
        gc.unfreeze()
    gc.collect()
    gc.freeze()


def internal_ip(node: dict[str, Any]) -> str:
    """A Node's first InternalIP (where a hostNetwork agent listens), or ""."""
    for address in (node.get("status") or {}).get("addresses") or []:
        if isinstance(address, dict) and address.get("type") == "InternalIP":
            return str(address.get("address") or "")
    return ""


class Controller:
    """The elector and analysis threads, the two ConfigMaps and the metrics; `cfg` is the whole config."""

    def __init__(self, cfg: dict[str, Any], identity: str, lease_seconds: float = LEASE_SECONDS,
                 renew_seconds: float = RENEW_SECONDS):
        self.cfg = cfg
        self.pm = cfg["pingmesh"]
        self.kube_cfg = dict(KUBE_DEFAULTS, **cfg["kube"])
        self.window = float(self.pm["window_seconds"])
        self.agent_port = server.listen_address(cfg["daemon"]["listen"])[1]
        self.tls = load_identity(cfg, cfg["tls"]["controller_name"])  # it opens the agents' /v1/pingmesh
        self.access = Access(cfg["daemon"]["token_file"])  # without TLS, the agents' token opens it
        self.namespace = self.pm["controller_namespace"]
        self._api: KubeApi | None = None
        self.elector = LeaderElector(self._client, self.namespace, self.pm["controller_lease"], identity,
                                     "the pingmesh controller", lease_seconds, renew_seconds)
        self.configmaps = verdicts.ConfigMapWriter(self._client, self.namespace,
                                                   [self.pm["configmap"], self.pm["inventory_configmap"]],
                                                   self.kube_cfg["conflict_retries"], self.elector.is_leader)
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._rotation = 0  # where in the (name-ordered) agents the next fetch starts
        self._beats = {"elector": time.monotonic(), "analysis": time.monotonic()}
        # What the metrics show.
        self.errors: dict[str, int] = {}
        self.last: dict[str, Any] = {}  # the last analysis written: time, duration, counts, verdicts
        # Kept between analyses, so that each fetches, parses and judges about one new window.
        self.analyzer = pingmesh.Analyzer(self.pm["analysis"], self.pm["probe_interval_seconds"])
        self.kept: dict[str, KeptWindows] = {}  # node name -> its agent's windows
        self.parsed = 0  # windows parsed in the last analysis

    def _client(self) -> KubeApi:
        if self._api is None:
            self._api = ClientApi(self.kube_cfg["kubeconfig"], self.kube_cfg["request_timeout_seconds"])
        return self._api

    def _error(self, kind: str) -> None:
        with self._lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1

    # -- one analysis --------------------------------------------------------------------------
    def cycle(self, now: float | None = None) -> bool:
        """List, fetch, analyze, write; True once the verdict ConfigMap holds this window's verdicts.

        Never raises: API trouble is logged, counted and retried by the caller. The inventory is
        written after the verdicts, and its trouble never holds them back (see _publish_inventory).
        """
        now = time.time() if now is None else now
        started = time.monotonic()
        if not self.elector.is_leader():
            self._forget()
            return False
        try:
            doc, inv_value = self._analyze(now, started)
            if not self.elector.is_leader():
                log.info("lost the lead during the analysis; its verdicts are not written")
                return False
            text = _dumps(doc)
            verdicts.parse_verdicts(text)  # what the agents will accept, or a bug here: raises
            written = self.configmaps.write(self.pm["configmap"], {"data": {verdicts.VERDICTS_KEY: text}},
                                            "the agents drop the old verdicts once stale")
        except KubeError as e:
            self._error(e.kind)
            log.warning("pingmesh analysis: Kubernetes API call failed (%s): %s; retrying", e.kind, e)
            return False
        except Exception:  # a bug must not stop the controller; count it and try again
            log.exception("pingmesh analysis failed")
            self._error("internal")
            return False
        if not written:
            return False
        self._publish_inventory(inv_value)
        with self._lock:
            self.last = dict(doc["agents"], time=now, duration=time.monotonic() - started,
                             nodes=doc["inventory_nodes"], verdicts=doc["verdicts"])
        return True

    def _forget(self) -> None:
        """A standby keeps no windows (hundreds of MiB at 10,000 nodes): when it leads, it asks for all."""
        if self.kept:
            self.kept = {}
            self.analyzer = pingmesh.Analyzer(self.pm["analysis"], self.pm["probe_interval_seconds"])

    def _analyze(self, now: float, started: float) -> tuple[dict[str, Any], str]:
        api = self._client()
        nodes = api.list_nodes(self.kube_cfg["managed_node_selector"])
        inv = inventory.from_nodes(nodes, self.pm)
        for line in inv.problems[:3]:
            log.info("inventory: %s", line)
        targets = [(str(n["metadata"]["name"]), internal_ip(n)) for n in nodes if n["metadata"].get("name")]
        del nodes  # not needed while the summaries stream in
        if targets:  # where the last analysis ran out of time, this one starts: no agent is always last
            k = self._rotation % len(targets)
            targets = targets[k:] + targets[:k]
        failed: dict[str, list[str]] = {}
        self.parsed = 0
        stream = self._summaries(targets, started + FETCH_BUDGET_FRACTION * self.window, failed, now)
        try:
            analysis = self.analyzer.run(stream, now, inv)  # leaves and rails are the Nodes', never a summary's
        finally:  # the analysis may stop reading early (MAX_SUMMARIES): its fetchers stop before self.kept is read
            stream.close()
        listed = {name for name, _ in targets}
        for name in [n for n in self.kept if n not in listed]:  # Nodes gone, or no longer managed
            del self.kept[name]
        for name, why in analysis.rejected:
            failed.setdefault("rejected", []).append(name)
            log.debug("agent %s: the analysis did not use its summary: %s", name, why)
        for note in analysis.notes:
            log.warning("pingmesh analysis: %s", note)
        reporting = len(targets) - sum(map(len, failed.values()))
        self._rotation += len(targets) - len(failed.get("deadline", ()))
        doc = self._document(analysis.to_dict(), now, reporting, failed)
        doc["inventory_nodes"] = len(inv.nodes)
        log.info("pingmesh analysis: %d of %d agents reported%s; %d verdicts (%d windows parsed, %d of %d judged "
                 "again)", reporting, len(targets), _failures(failed), len(doc["verdicts"]), self.parsed,
                 self.analyzer.rebuilt, analysis.windows_seen)
        return doc, verdicts.encode_inventory(inv)

    def _summaries(self, targets: list[tuple[str, str]], deadline: float, failed: dict[str, list[str]],
                   now: float) -> Iterator[folded.Prepared]:
        """Every agent's summary, fetched `fetch_concurrency` at a time and handed on as it arrives.

        Each agent is asked only for the windows after those kept from its last answer (`since`), and
        the new ones are made ready (folded) by its fetcher, once. Their arrays are checked here, for all
        the answers that arrived while the analysis was busy at once (packed.check_each): only then are
        they kept and handed on. An agent that fails loses what was kept of it: its next answer comes
        whole. A short queue holds the fetchers back while the analysis is busy. `failed` gets reason ->
        node names.
        """
        timeout = float(self.pm["fetch_timeout_seconds"])
        windows = int(self.pm["fetch_windows"])
        workers = max(1, min(int(self.pm["fetch_concurrency"]), len(targets)))
        arrived: queue.Queue = queue.Queue(maxsize=2 * workers)
        done = threading.Event()  # the analysis stopped reading: fetchers drop what they hold

        def hand_on(item: tuple[str, Any]) -> None:
            while not done.is_set():
                try:
                    arrived.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue

        def fetch(name: str, address: str, since: float | None) -> tuple[stats.Summary, list[packed.Arrays]]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FetchError("deadline", "the analysis ran out of time before this agent")
            summary, arrays = fetch_parsed(address, self.agent_port, windows, min(timeout, left), since, self.tls,
                                           name, self.access.token() if self.tls is None else None, packed=True)
            if summary.node != name:
                raise FetchError("wrong_node", f"the agent at {address} says it is {summary.node!r}")
            return summary, arrays

        def one(name: str, address: str) -> None:
            try:
                if not address:
                    self.kept.pop(name, None)
                    raise FetchError("no_address", "the Node has no InternalIP")
                if deadline <= time.monotonic():  # not asked: what is kept of it stays
                    raise FetchError("deadline", "the analysis ran out of time before this agent")
                kept = self.kept.pop(name, None)
                try:
                    summary, arrays = fetch(name, address, kept and kept.since())
                    prepared, kept, parsed = keep_windows(kept, summary, now)
                except FetchError as e:
                    if e.reason != "incomplete":
                        raise
                    log.debug("agent %s: %s; asking for all of it", name, e)
                    summary, arrays = fetch(name, address, None)
                    prepared, kept, parsed = keep_windows(None, summary, now)
                hand_on((name, (prepared, kept, parsed, arrays)))
            except FetchError as e:
                hand_on((name, e))
            except Exception as e:  # one agent's answer must not stop the analysis of all the others
                log.exception("agent %s: its summary could not be handled", name)
                hand_on((name, FetchError("internal", str(e))))

        pool = ThreadPoolExecutor(workers, thread_name_prefix="fetch")
        try:
            for name, address in targets:
                pool.submit(one, name, address)
            left = len(targets)
            while left:  # answers are checked packed.CHECK_TOGETHER at a time, or as many as come
                batch = [arrived.get()]
                while len(batch) < min(left, packed.CHECK_TOGETHER):
                    try:
                        batch.append(arrived.get(timeout=CHECK_WAIT_SECONDS))
                    except queue.Empty:
                        break
                left -= len(batch)
                yield from self._checked(batch, failed)
        finally:
            done.set()
            pool.shutdown(wait=True, cancel_futures=True)

    def _checked(self, batch: list[tuple[str, Any]], failed: dict[str, list[str]]) -> Iterator[folded.Prepared]:
        """The answers of `batch` (name, and a FetchError or (prepared, kept, parsed, arrays)) whose arrays
        pass packed.check_each, checked together, kept and handed on; the others go into `failed`."""
        answers = [(name, got) for name, got in batch if not isinstance(got, FetchError)]
        try:
            errors = [e and FetchError("invalid", str(e)) for e in packed.check_each([got[3] for _, got in answers])]
        except Exception as e:  # as in a fetcher: a failure here must not stop the analysis of the others
            log.exception("the arrays of %d agents' answers could not be checked", len(answers))
            errors = [FetchError("internal", str(e))] * len(answers)
        outcomes = [(name, got) for name, got in batch if isinstance(got, FetchError)]
        outcomes += [(name, error or got) for (name, got), error in zip(answers, errors)]
        for name, got in outcomes:
            if isinstance(got, FetchError):
                failed.setdefault(got.reason, []).append(name)
                log.debug("agent %s: %s", name, got)
                continue
            prepared, self.kept[name], parsed = got[:3]
            with self._lock:
                self.parsed += parsed
            yield prepared

    def _document(self, analysis: dict[str, Any], now: float, reporting: int,
                  failed: dict[str, list[str]]) -> dict[str, Any]:
        """verdicts.json: the analysis in the agents' schema, actionable verdicts first, capped.

        `time` and `window_seconds` are this controller's: the agents judge staleness by how often
        it writes.
        """
        found = sorted(analysis.get("verdicts") or [], key=lambda v: (KIND_ORDER.get(v.get("kind"), 9),
                                                                      str(v.get("element"))))
        doc = dict(analysis, schema_version=verdicts.SCHEMA_VERSION, time=now, window_seconds=self.window,
                   verdicts=found[:verdicts.MAX_VERDICTS],
                   agents={"reporting": reporting, "failed": {k: len(v) for k, v in sorted(failed.items())}})
        while doc["verdicts"] and len(_dumps(doc).encode()) > verdicts.MAX_DOC_BYTES:
            doc["verdicts"] = doc["verdicts"][:len(doc["verdicts"]) * 9 // 10]  # what the agents accept
        if len(doc["verdicts"]) < len(found):
            doc["truncated"] = len(found) - len(doc["verdicts"])
            log.error("pingmesh analysis: %d verdicts, only the first %d fit the agents' bounds", len(found),
                      len(doc["verdicts"]))
        return doc

    def _publish_inventory(self, value: str) -> None:
        """Write the inventory's ConfigMap when it changed. Trouble is counted and logged, never
        raised: the verdicts are written, the agents keep the inventory they have, and the next
        window tries again."""
        try:
            self.configmaps.write_binary(self.pm["inventory_configmap"], verdicts.INVENTORY_KEY, value,
                                         "the agents keep the one they have")
        except KubeError as e:
            self._error(e.kind)
            log.warning("pingmesh inventory: Kubernetes API call failed (%s): %s; retrying next window", e.kind, e)
        except Exception:
            log.exception("writing the pingmesh inventory failed")
            self._error("internal")

    # -- the loops -----------------------------------------------------------------------------
    def next_cycle(self, t: float) -> float:
        """The next analysis time after `t`: just after the agents close a window (a probe sent at
        its end has answered or timed out), so that each analysis has one more closed window."""
        offset = min(float(self.pm["timeout_seconds"]) + 1.0, self.window / 2)
        at = math.floor(t / self.window) * self.window + offset
        return at if at > t else at + self.window

    def _elect_loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.elector.tick()
            except KubeError as e:
                self._error(e.kind)
                log.warning("leader election: Kubernetes API call failed (%s): %s", e.kind, e)
            except Exception:
                log.exception("leader election failed")
                self._error("internal")
            self._beats["elector"] = time.monotonic()
            self.stop.wait(self.elector.next_delay())

    def _analysis_loop(self) -> None:
        failures = cycles = 0
        at = self.next_cycle(time.time())
        try:
            while not self.stop.is_set():
                self._beats["analysis"] = time.monotonic()
                now = time.time()
                if now < at:
                    self.stop.wait(min(at - now, self.elector.renew_seconds))
                    continue
                if not self.elector.is_leader():
                    self._forget()
                    at = self.next_cycle(now)
                    continue
                if self.cycle(now):
                    failures = 0
                    at = self.next_cycle(time.time())
                else:
                    failures += 1
                    at = min(self.next_cycle(time.time()),
                             time.time() + min(self.window / 4, 2.0 ** (failures - 1)))
                cycles += 1
                freeze_survivors(cycles)
        finally:  # what was hidden from the collector is in its sight again (for a process that goes on)
            gc.unfreeze()

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._elect_loop, name="elector", daemon=True),
                   threading.Thread(target=self._analysis_loop, name="analysis", daemon=True)]
        for t in threads:
            t.start()
        return threads

    def serve(self) -> int:
        """Run until SIGTERM/SIGINT/SIGHUP: elect, analyze, serve /metrics and /healthz; give the Lease up."""
        http = make_server(self, self.pm["controller_listen"])
        threads: list[threading.Thread] = []

        def start() -> None:
            if self.pm["enabled"]:
                threads.extend(self.start())
                log.info("nodehealth controller %s on %s:%s; analysis every %gs", self.elector.identity,
                         *http.server_address[:2], self.window)
            else:
                log.info("pingmesh.enabled is false: the controller idles (serving /metrics and /healthz)")

        def clean_up() -> None:
            for t in threads:
                t.join(2.0)
            self.elector.release()

        return server.serve_until_signal(http, self.stop, start, clean_up, STUCK_STOP_SECONDS)

    def routes(self) -> server.Routes:
        return {"/metrics": lambda _: (200, exporter.render(self.metrics()), exporter.CONTENT_TYPE),
                "/healthz": lambda _: self._healthz()}

    def _healthz(self) -> server.Answer:
        ok, why = self.health()
        return 200 if ok else 503, (why + "\n").encode(), "text/plain"

    # -- faces ---------------------------------------------------------------------------------
    def health(self) -> tuple[bool, str]:
        """Unhealthy only when a loop is stuck; API trouble is the metrics' business, not a restart's."""
        if not self.pm["enabled"]:
            return True, "idle: pingmesh.enabled is false"
        now = time.monotonic()
        limits = {"elector": 3 * self.elector.lease_seconds, "analysis": 3 * self.window + 60}
        for loop, beat in self._beats.items():
            if now - beat > limits[loop]:
                return False, f"the {loop} loop has not run for {now - beat:.0f} s"
        return True, "ok: leading" if self.elector.is_leader() else "ok: standing by"

    def metrics(self) -> list[Metric]:
        leader = self.elector.is_leader()
        with self._lock:
            errors, last = dict(self.errors), dict(self.last)
        refused, stored = self.configmaps.counts()
        out = []
        m = Metric("nodehealth_build_info", "The nodehealth version; always 1.", labels=("version",))
        m.add((__version__,), 1)
        out.append(m)
        out += process_metrics()
        out.append(Metric.one("nodehealth_controller_leader", "1 on the replica that runs the pingmesh analysis.",
                          int(leader)))
        m = Metric("nodehealth_controller_errors_total", "Kubernetes API calls of the controller that failed, "
                   "by kind of error.", "counter", ("kind",))
        for kind in sorted(errors):
            m.add((kind,), errors[kind])
        out.append(m)
        m = Metric("nodehealth_controller_configmap_refused_total",
                   "Writes of the controller's ConfigMaps (verdicts, inventory) not made: over 1 MiB of data.",
                   "counter", ("configmap",))
        for name in sorted(refused):
            m.add((name,), refused[name])
        out.append(m)
        if not leader or not last:  # a standby shows no analysis: only the leader's is current
            return out
        out.append(Metric.one("nodehealth_controller_last_analysis_timestamp_seconds",
                          "Unix time of the last analysis whose verdicts were written.", last["time"]))
        out.append(Metric.one("nodehealth_controller_last_analysis_duration_seconds",
                          "How long the last written analysis took: listing, fetching, analyzing, writing.",
                          last["duration"]))
        m = Metric("nodehealth_controller_configmap_bytes", "Bytes of data in each of the controller's ConfigMaps "
                   "(verdicts, inventory) as last written or found (at most 1 MiB).", labels=("configmap",))
        for name in sorted(stored):
            m.add((name,), stored[name])
        out.append(m)
        out.append(Metric.one("nodehealth_pingmesh_inventory_nodes", "Nodes in the inventory last read.",
                          last["nodes"]))
        out.append(Metric.one("nodehealth_pingmesh_agents_reporting",
                          "Agents whose summary the last analysis used.", last["reporting"]))
        m = Metric("nodehealth_pingmesh_agents_failed",
                   "Agents whose summary the last analysis could not use, by reason.", labels=("reason",))
        for reason, count in sorted(last["failed"].items()):
            m.add((reason,), count)
        out.append(m)
        counts = Metric("nodehealth_pingmesh_verdicts", "Open pingmesh verdicts by kind.", labels=("kind",))
        for kind in KIND_ORDER:
            counts.add((kind,), sum(1 for v in last["verdicts"] if v.get("kind") == kind))
        out.append(counts)
        m = Metric("nodehealth_pingmesh_verdict",
                   f"1 for each open pingmesh verdict (the first {MAX_VERDICT_SERIES}, nodes and leaves first).",
                   labels=("kind", "element"))
        for v in last["verdicts"][:MAX_VERDICT_SERIES]:
            m.add((v.get("kind"), v.get("element")), 1)
        out.append(m)
        return out


def _dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def _failures(failed: dict[str, list[str]]) -> str:
    if not failed:
        return ""
    counts = ", ".join(f"{reason} {len(names)}" for reason, names in sorted(failed.items()))
    examples = ", ".join(n for names in failed.values() for n in names[:FAILURE_EXAMPLES])
    return f", {sum(map(len, failed.values()))} failed ({counts}; e.g. {examples})"


def make_server(controller: Controller, listen: str) -> server.BoundedHTTPServer:
    """/metrics and /healthz: one Prometheus and the kubelet call here."""
    return server.make_server(listen, controller.routes, "nodehealth-controller",
                              **http_options(controller.cfg, controller.tls))


# -- the command -----------------------------------------------------------------------------------


def cmd_controller(args: argparse.Namespace) -> int:
    from nodehealth import config

    cfg = config.load(args.config)
    if args.listen:
        cfg["pingmesh"]["controller_listen"] = args.listen
    logs.setup(args.log_format, args.log_level, os.environ.get("NODE_NAME"))  # the node the replica runs on
    identity = args.identity or os.environ.get("POD_NAME") or socket.gethostname()
    if cfg["pingmesh"]["enabled"]:  # its Lease and ConfigMaps: without credentials it would retry for ever
        from nodehealth.kube.api import KubeError, require_config

        try:
            require_config(cfg["kube"]["kubeconfig"])
        except KubeError as e:
            raise config.ConfigError(f"controller: {e}") from None
    return Controller(cfg, identity).serve()
