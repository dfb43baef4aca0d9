"""Long work started as the session starts, run beside the other tests in a thread of its own, its
processes on the CPU time the tests leave idle (SCHED_IDLE: a test that wants a CPU takes it at once).
The VM tier's guest (tests/vm/tier.py) and the agent image's root filesystem (tests/image_rootfs.py) are
such work: the tests that read them wait for it instead of doing it in line."""
from __future__ import annotations

import os
import subprocess
import threading
from typing import Any


def idle_only() -> None:
    """A child's preexec_fn: the child runs on idle CPU time only."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


class Beside:
    """`work()` (a subclass's) run in a thread; `wait` gives what it returned or raises what it raised.
    The work hands each process it starts to `started`, so that `stop` kills it: an ended session leaves
    nothing running."""

    def __init__(self, name: str):
        self._result: Any = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def work(self) -> Any:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            self._result = self.work()
        except BaseException as e:  # handed to the tests' thread by wait()
            self._error = e

    def started(self, process: subprocess.Popen) -> None:
        with self._lock:
            self._process = process
            if self._stopping:  # the session ended while the work was between processes
                process.kill()

    def wait(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            if self._process is not None and self._process.poll() is None:
                self._process.kill()
        self._thread.join(timeout=30)
