"""The VM tier's one boot, started when the session starts and read when tests/test_vm_tier.py runs.

The guest keeps one core busy for about fourteen minutes, during which its tests could only wait:
booted first, it runs beside the rest of the suite on the CPU time they leave idle (QEMU under
SCHED_IDLE: a test that wants a CPU takes it at once). Its clock counts the guest's instructions
(`-icount`), so being starved slows the guest without changing what it measures: Soft-RoCE's bandwidth
there is the emulated CPU's, and a slow cable reads slow against its sound neighbours whatever else the
host runs.
"""
from __future__ import annotations

import os
import subprocess
import threading

import pytest

from vm import harness

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
REPO = os.path.dirname(TESTS)
NEEDED = ("/usr/bin/ib_write_bw", "/usr/lib/python3/dist-packages/pyverbs", "/usr/bin/rdma")
# Room for the guest waiting on the rest of the suite for CPU time; alone the batch takes about 14 minutes.
TIMEOUT_SECONDS = 2400.0
BOOT = pytest.StashKey["Boot"]()  # config.stash: the session's boot, where it has VM tests


def missing() -> str | None:
    """Why the guest cannot boot here, or None."""
    if os.geteuid() != 0:
        return "the VM tier shares the host's root over 9p: it needs root"
    absent = [p for p in NEEDED if not os.path.exists(p)]
    if absent:
        return f"missing {', '.join(absent)} (.ci/run installs perftest, python3-pyverbs, iproute2)"
    return None


class Boot:
    """One guest running tests/vm/batch.sh in a thread of its own; `wait` gives what it left."""

    def __init__(self, out: str, work: str):
        self.out, self.work = out, work
        self._result: tuple[int, str, float] | None = None
        self._error: BaseException | None = None
        self._process: subprocess.Popen | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="vm-tier", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            why = missing()
            if why:
                raise harness.Unavailable(why)
            harness.build_module(harness.kernel()[1], os.path.join(HERE, "printk"), self.out)
            self._result = harness.run_batch(os.path.join(HERE, "batch.sh"), self.out, self.work, REPO,
                                             timeout=TIMEOUT_SECONDS, icount=True, idle=True,
                                             started=self._started)
        except BaseException as e:  # handed to the tests' thread by wait()
            self._error = e

    def _started(self, process: subprocess.Popen) -> None:
        self._process = process
        if self._stopping:  # the session ended while the module was building
            process.kill()

    def wait(self) -> tuple[int, str, float]:
        """(rc, serial log, seconds), once the guest has powered off; raises what the boot raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def stop(self) -> None:
        """An ended session leaves no guest behind."""
        self._stopping = True
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
        self._thread.join(timeout=30)
