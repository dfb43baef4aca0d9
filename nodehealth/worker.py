"""The background thread of a face that writes to a scheduler (Kubernetes, Slurm): started once,
woken when there is news, stopped at shutdown without waiting out a slow API call's retries."""
from __future__ import annotations

import threading


class Worker:
    THREAD_NAME = "worker"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        raise NotImplementedError
