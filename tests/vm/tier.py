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

import pytest
from beside import Beside

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


class Boot(Beside):
    """One guest running tests/vm/batch.sh in a thread of its own; `wait` gives what it left: (rc, serial
    log, seconds) once the guest has powered off, or raises what the boot raised."""

    def __init__(self, out: str, work: str):
        self.out, self.work_dir = out, work
        super().__init__("vm-tier")

    def work(self) -> tuple[int, str, float]:
        why = missing()
        if why:
            raise harness.Unavailable(why)
        harness.build_module(harness.kernel()[1], os.path.join(HERE, "printk"), self.out)
        return harness.run_batch(os.path.join(HERE, "batch.sh"), self.out, self.work_dir, REPO,
                                 timeout=TIMEOUT_SECONDS, icount=True, idle=True, started=self.started)
