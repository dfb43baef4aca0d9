"""Daemon resident memory over 1,000 passes on the H100 fixture machine.

Runs the real daemon with a tiny interval and reads its VmRSS at pass 100 and pass 1,000.
Targets: at most 60 MiB after 1,000 passes, and flat (no growth between pass 100 and 1,000).
Usage: python benchmarks/daemon_memory.py [--passes 1000]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

from common import free_port, get, machine, metric_value, rss_bytes, wait_http


def passes(url: str) -> int:
    return int(metric_value(get(url).decode(), "nodehealth_daemon_passes_total") or 0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--passes", type=int, default=1000)
    args = p.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as state:
        proc = subprocess.Popen([sys.executable, "-m", "nodehealth.cli", "daemon", "--root", machine("h100-8x-cx7"),
                                 "--state-dir", state, "--listen", f"127.0.0.1:{port}", "--interval", "0.001"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            wait_http(url)
            samples = {}
            t0 = time.monotonic()
            for mark in sorted({100, args.passes // 4, args.passes // 2, 3 * args.passes // 4, args.passes}):
                while passes(url) < mark:
                    time.sleep(0.05)
                samples[mark] = rss_bytes(proc.pid)
            elapsed = time.monotonic() - t0
        finally:
            proc.terminate()
            proc.wait(10)
    mib = {k: v / 2**20 for k, v in samples.items()}
    print(f"passes: {args.passes} in {elapsed:.1f}s")
    for k, v in mib.items():
        print(f"RSS at pass {k:5d}: {v:6.1f} MiB")
    growth = mib[args.passes] - mib[100]
    print(f"growth pass 100 -> {args.passes}: {growth:+.2f} MiB (target: flat); "
          f"final {mib[args.passes]:.1f} MiB (target <= 60 MiB)")


if __name__ == "__main__":
    main()
