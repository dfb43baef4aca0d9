"""The process's own `process_*` families, as every Prometheus exporter has them: the same names, units and
meaning as the Go and Python clients' process collectors, so the usual alerts and dashboards (CPU, memory,
file descriptors running out, restarts) work on the daemon and the pingmesh controller as on anything else.

For this process only (`--root` is about the machine judged, never about us), from what the kernel gives
a process about itself: times(2), /proc/self/statm, getrlimit(2), and its start time read once. psutil
read the same through /proc/self/stat, statm and prlimit(2) at nearly twice the cost (0.57 against 0.33 ms a
scrape spaced as the daemon's are, interleaved in one process; benchmarks/RESULTS.md).
"""
from __future__ import annotations

import functools
import logging
import os
import resource

from nodehealth.model import Metric

log = logging.getLogger(__name__)
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def process_metrics() -> list[Metric]:
    """The families at this moment; none if they cannot be read (logged), never an error for /metrics."""
    try:
        times = os.times()
        with open("/proc/self/statm", "rb") as f:  # sizes in pages: the whole mapping, then what is resident
            virtual, resident = (int(pages) * PAGE_SIZE for pages in f.read().split()[:2])
        fds = _open_fds()
        max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        started = _start_time(os.getpid())
    except (OSError, ValueError) as e:
        log.warning("cannot read this process's own figures: %s", e)
        return []
    families = [
        ("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "counter",
         times.user + times.system),
        ("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge", resident),
        ("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge", virtual),
        ("process_open_fds", "Number of open file descriptors.", "gauge", fds),
        ("process_max_fds", "Maximum number of open file descriptors.", "gauge",
         None if max_fds == resource.RLIM_INFINITY else max_fds),
        ("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", "gauge", started),
    ]
    return [Metric.one(name, help_text, value, kind) for name, help_text, kind, value in families]


def _open_fds() -> int:
    """This process's open descriptors: /proc/self/fd's size where the kernel says it (6.2 and later),
    else its entries counted. Listing them costs ~0.3 ms a scrape with the ~500 counter
    files the infiniband collector keeps open on an 8-rail node (host.KeptFiles); the size costs 3 us."""
    count = os.stat("/proc/self/fd").st_size
    return count if count > 0 else len(os.listdir("/proc/self/fd"))


@functools.lru_cache(maxsize=1)
def _start_time(pid: int) -> float:
    """When this process started, in seconds since the epoch: the boot time (/proc/stat's btime) plus its
    start in clock ticks (/proc/self/stat's 22nd field). Read once a pid: a forked child has its own."""
    with open("/proc/self/stat", "rb") as f:
        ticks = int(f.read().rsplit(b")", 1)[1].split()[19])  # after the command's ")", field 3 is the state
    with open("/proc/stat", "rb") as f:
        boot = next((int(line.split()[1]) for line in f if line.startswith(b"btime ")), None)
    if boot is None:
        raise ValueError("/proc/stat has no btime line")
    return boot + ticks / os.sysconf("SC_CLK_TCK")
