"""The process's own `process_*` families, as every Prometheus exporter has them: the same names, units and
meaning as the Go and Python clients' process collectors, so the usual alerts and dashboards (CPU, memory,
file descriptors running out, restarts) work on the daemon and the pingmesh controller as on anything else.

Read through psutil, for this process only: `--root` is about the machine judged, never about us.
"""
from __future__ import annotations

import functools
import logging
import os

from nodehealth.model import Metric

log = logging.getLogger(__name__)


def process_metrics() -> list[Metric]:
    """The families at this moment; none if they cannot be read (logged), never an error for /metrics."""
    import psutil  # the daemon's and the controller's /metrics only

    try:
        me = _process(os.getpid())
        with me.oneshot():
            cpu = me.cpu_times()
            memory = me.memory_info()
            fds = _open_fds()
            started = me.create_time()
            max_fds = me.rlimit(psutil.RLIMIT_NOFILE)[0]
    except (psutil.Error, OSError) as e:
        log.warning("cannot read this process's own figures: %s", e)
        return []
    families = [
        ("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "counter",
         cpu.user + cpu.system),
        ("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge", memory.rss),
        ("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge", memory.vms),
        ("process_open_fds", "Number of open file descriptors.", "gauge", fds),
        ("process_max_fds", "Maximum number of open file descriptors.", "gauge",
         None if max_fds == psutil.RLIM_INFINITY else max_fds),
        ("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", "gauge", started),
    ]
    return [Metric.one(name, help_text, value, kind) for name, help_text, kind, value in families]


def _open_fds() -> int:
    """This process's open descriptors: /proc/self/fd's size where the kernel says it (6.2 and later),
    else its entries as psutil counts them. Listing them costs ~0.3 ms a scrape with the ~500 counter
    files the infiniband collector keeps open on an 8-rail node (host.KeptFiles); the size costs 3 us."""
    count = os.stat("/proc/self/fd").st_size
    return count if count > 0 else len(os.listdir("/proc/self/fd"))


@functools.lru_cache(maxsize=1)
def _process(pid: int):
    """This process, kept between scrapes (by pid, so a forked child gets its own): psutil.Process() reads
    /proc/self/stat and /proc/stat's boot time each time, half the cost of these families."""
    import psutil

    return psutil.Process(pid)
