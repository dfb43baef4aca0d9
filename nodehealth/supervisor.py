"""The daemon's worker threads, kept alive: a worker that raises (or returns before the stop) is
logged with its traceback and run again after a backoff, and one that is down shows in /healthz and
in nodehealth_worker_up.

Without this a thread that died took its work with it for the process's lifetime and nobody was
told: the pingmesh prober, killed by one EMFILE under a flood of connections, left every peer seeing
this node as unreachable while /healthz said ok. A worker runs again in the same thread, so
restarting needs nothing from it but that its function can be called again. The backoff (1 s,
doubling to 30 s, back to 1 s after a minute of running) keeps a worker that dies at once from
spinning; one that stays down fails /healthz until it runs again, and the kubelet's restart is the
next remedy.

Threads that another package starts (the RDMA tests') are only watched: one that ended before the
stop is reported dead.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from nodehealth.model import Metric

log = logging.getLogger("nodehealth.supervisor")

FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
# A worker that ran this long before dying starts its backoff afresh: it was not dying at once.
STEADY_SECONDS = 60.0


@dataclass
class Worker:
    name: str
    run: Callable[[], None] | None  # None: a thread started elsewhere, watched only
    thread: threading.Thread | None = None
    restarts: int = 0
    down_since: float | None = None  # when it died, while it waits for its restart
    why: str = ""  # what ended it last


class Supervisor:
    def __init__(self, stop: threading.Event):
        self.stop = stop
        self.workers: list[Worker] = []
        self.lock = threading.Lock()

    def add(self, name: str, run: Callable[[], None]) -> None:
        """A worker: `run()` works until the stop is set; it is started by start()."""
        self.workers.append(Worker(name, run))

    def watch(self, thread: threading.Thread) -> None:
        """A thread started elsewhere (by start(), or already): reported when it ends before the stop."""
        self.workers.append(Worker(thread.name, None, thread))

    def start(self) -> None:
        for w in self.workers:
            if w.thread is None:
                w.thread = threading.Thread(target=self._keep_running, args=(w,), name=w.name, daemon=True)
            if not w.thread.is_alive() and w.thread.ident is None:
                w.thread.start()

    def _keep_running(self, w: Worker) -> None:
        backoff = FIRST_BACKOFF_SECONDS
        while not self.stop.is_set():
            started = time.monotonic()
            error: Exception | None = None
            try:
                w.run()
            except Exception as e:  # noqa: BLE001 (any error: the worker is run again, and the log says why)
                error = e
            if self.stop.is_set():
                return  # ended by the stop, or failing because of it
            if time.monotonic() - started >= STEADY_SECONDS:
                backoff = FIRST_BACKOFF_SECONDS
            why = f"{type(error).__name__}: {error}" if error is not None else "returned before the stop"
            log.error("worker %s %s; running it again in %gs", w.name, "died" if error is not None else why, backoff,
                      exc_info=error)
            with self.lock:
                w.restarts += 1
                w.down_since, w.why = time.monotonic(), why
            self.stop.wait(backoff)
            backoff = min(MAX_BACKOFF_SECONDS, backoff * 2)
            with self.lock:
                w.down_since = None

    def problems(self) -> list[str]:
        """One line per worker that is not running now (none after the stop)."""
        if self.stop.is_set():
            return []
        out = []
        with self.lock:
            for w in self.workers:
                if w.thread is None or w.thread.ident is None:
                    continue  # not started yet
                if not w.thread.is_alive():
                    out.append(f"worker {w.name} is dead")
                elif w.down_since is not None:
                    out.append(f"worker {w.name} died ({w.why}) and is run again after a backoff "
                               f"({w.restarts} restart{'s' if w.restarts != 1 else ''} so far)")
        return out

    def metrics(self) -> list[Metric]:
        up = Metric("nodehealth_worker_up", "1 while the daemon's worker thread runs, 0 while it is dead or waits to "
                    "be restarted.", labels=("worker",))
        restarts = Metric("nodehealth_worker_restarts_total",
                          "Times the worker thread died (it is run again after a backoff).",
                          "counter", ("worker",))
        with self.lock:
            for w in self.workers:
                if w.thread is None or w.thread.ident is None:
                    continue
                running = w.thread.is_alive() and w.down_since is None
                up.add((w.name,), 1 if running or self.stop.is_set() else 0)
                if w.run is not None:
                    restarts.add((w.name,), w.restarts)
        return [up, restarts]

    def join(self, timeout: float) -> None:
        """Wait for every worker to end, `timeout` seconds in all (after the stop was set)."""
        deadline = time.monotonic() + timeout
        for w in self.workers:
            if w.thread is not None and w.thread.ident is not None:
                w.thread.join(max(0.0, deadline - time.monotonic()))
