"""Faces: what shows the node's verdict, each its own way. None judges; every one takes the same
report. The daemon holds a list of them: the exporter (/metrics, nodehealth/exporter.py), the
Kubernetes publisher (taints, conditions, events: nodehealth/kube/publisher.py) and the Slurm drainer
(nodehealth/slurm/drainer.py). A new face is one module with a class that has these four methods
and one line in Daemon.start() that adds it.
"""
from __future__ import annotations

import threading
from typing import Protocol, runtime_checkable

from nodehealth.model import Metric, Report


@runtime_checkable
class Face(Protocol):
    def start(self) -> list[threading.Thread]:
        """Start its own threads, if it has any, and return them; called once, before the first publish().
        The daemon watches them: one that ends before the stop fails /healthz and shows in
        nodehealth_worker_up, never dies silently."""

    def publish(self, report: Report) -> None:
        """Take the latest report, after every full pass and after news judged between passes (a
        kernel record, a bandwidth test, the pingmesh controller's verdicts). Never blocks: a face
        that writes somewhere slow records what to write and lets its own thread do it."""

    def metrics(self) -> list[Metric]:
        """Its own families for /metrics (how its writes fare), read at every scrape."""

    def stop(self, timeout: float) -> None:
        """Stop its thread within about `timeout` seconds, at shutdown."""


class Worker:
    """The background thread of a face that writes to a scheduler (Kubernetes, Slurm): started once,
    woken when there is news, stopped at shutdown without waiting out a slow API call's retries."""

    THREAD_NAME = "worker"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> list[threading.Thread]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)
            self._thread.start()
        return [self._thread]

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        raise NotImplementedError
