"""Small helpers shared by the benchmark scripts (run them from the repository root)."""
from __future__ import annotations

import os
import socket
import statistics
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MACHINES = os.path.join(ROOT, "tests", "fixtures", "machines")


def machine(name: str) -> str:
    return os.path.join(MACHINES, name)


def cpu_seconds() -> float:
    """This process's user and system CPU so far."""
    t = os.times()
    return t.user + t.system


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            get(url, 1.0)
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer")


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc/PID/stat (clock ticks -> seconds)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def anonymous_bytes(pid: int) -> int:
    """The part of a process's RSS that is its own memory (heap, stacks, arenas), not the file-backed pages
    of its libraries' code and data, which the kernel can drop and read again."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Anonymous in smaps_rollup")


def percentile(values, p: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def median(values) -> float:
    return statistics.median(values)


def metric_value(text: str, name: str, **labels):
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    return None


def timed_run(cmd) -> float:
    """Wall time of one run. Bytecode caching is allowed, as in any installed package (pip compiles
    it at install time); an environment with PYTHONDONTWRITEBYTECODE would recompile every module."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0
