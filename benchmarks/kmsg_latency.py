"""Kernel-log latency: from a record appended to the followed log to its effect in /metrics.

1. Fixture file: the daemon follows a copy of the H100 machine's dev/kmsg; each sample appends an
   Xid record and polls /metrics until nodehealth_kernel_events_total{kind="xid"} has grown.
2. Real /dev/kmsg (when writable, i.e. root): each sample writes a marker line and waits for
   nodehealth_kernel_log_records_total to grow. (A line written from userspace never becomes an
   event: only kernel-facility records do, so no process can fake an Xid.)
Target: p99 under 50 ms.
Usage: python benchmarks/kmsg_latency.py [--samples 200]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from common import free_port, get, machine, metric_value, percentile, wait_http

XID = "NVRM: Xid (PCI:0000:1b:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 1, TPC 2, SM 0)"
MARKER = "nodehealth latency benchmark marker"


def run(root: str, write, metric: tuple, samples: int) -> list:
    """Latencies from write(i) to the metric (name, labels) growing in /metrics."""
    name, labels = metric
    port = free_port()
    with tempfile.TemporaryDirectory() as state:
        proc = subprocess.Popen([sys.executable, "-m", "nodehealth.cli", "daemon", "--root", root, "--state-dir",
                                 state, "--listen", f"127.0.0.1:{port}", "--interval", "60"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            wait_http(url)
            time.sleep(0.5)
            out = []
            for i in range(samples):
                before = metric_value(get(url).decode(), name, **labels) or 0
                t0 = time.perf_counter()
                write(i)
                while (metric_value(get(url).decode(), name, **labels) or 0) <= before:
                    if time.perf_counter() - t0 > 5:
                        raise RuntimeError("record never showed in /metrics")
                out.append(time.perf_counter() - t0)
            return out
        finally:
            proc.terminate()
            proc.wait(10)


def report(name: str, latencies: list) -> None:
    ms = [x * 1000 for x in latencies]
    print(f"{name}: n={len(ms)} p50 {percentile(ms, 50):.1f} ms  p99 {percentile(ms, 99):.1f} ms  "
          f"max {max(ms):.1f} ms (target p99 < 50 ms)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=200)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "machine")
        shutil.copytree(machine("h100-8x-cx7"), root, symlinks=True)
        kmsg = os.path.join(root, "dev", "kmsg")
        seq = [10**6]

        def append(i: int) -> None:
            seq[0] += 1
            with open(kmsg, "a") as f:
                f.write(f"4,{seq[0]},{6781000000000 + i},-;{XID}\n")
        report("fixture dev/kmsg file", run(root, append, ("nodehealth_kernel_events_total", {"kind": "xid"}),
                                            args.samples))
    if os.access("/dev/kmsg", os.W_OK):
        def write_kmsg(i: int) -> None:
            with open("/dev/kmsg", "w") as f:
                f.write(f"{MARKER} {i}\n")
        report("real /dev/kmsg", run("/", write_kmsg, ("nodehealth_kernel_log_records_total", {}), args.samples))
    else:
        print("real /dev/kmsg: not writable here (needs root); skipped")


if __name__ == "__main__":
    main()
