"""Series per metric family on every fixture machine, as the daemon serves them on /metrics: with the
defaults, and with `exporter.detail.nvlink_per_link: false` (the NVLink families per GPU). What an
operator weighs before choosing `exporter.exclude_families` (docs/metrics.md, "How many series").

A daemon per machine (a pass an hour: only its first counts), scraped until two scrapes agree.
Usage: python benchmarks/series_per_family.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from common import MACHINES, free_port, get, machine, wait_http


def scrape(root: str, config: str | None) -> dict[str, int]:
    """Series per family of one daemon's /metrics (a histogram's _bucket, _count and _sum lines count)."""
    port = free_port()
    with tempfile.TemporaryDirectory() as state:
        cmd = [sys.executable, "-m", "nodehealth.cli", "daemon", "--root", root, "--state-dir", state,
               "--listen", f"127.0.0.1:{port}", "--interval", "3600"] + (["--config", config] if config else [])
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_http(f"http://127.0.0.1:{port}/v1/report")
            counts, previous = {}, None
            for _ in range(50):  # until the kernel stream's first batch is in: two scrapes agree
                counts = families(get(f"http://127.0.0.1:{port}/metrics").decode())
                if counts == previous:
                    break
                previous = counts
                time.sleep(0.1)
            return counts
        finally:
            proc.terminate()
            proc.wait(10)


def families(text: str) -> dict[str, int]:
    types = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            for suffix in ("_bucket", "_count", "_sum"):
                base = name[:-len(suffix)]
                if name.endswith(suffix) and types.get(base) == "histogram":
                    name = base
            counts[name] = counts.get(name, 0) + 1
    return counts


def main() -> None:
    names = sorted(d for d in os.listdir(MACHINES) if os.path.isdir(machine(d)))
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write("exporter:\n  detail: {nvlink_per_link: false}\n")
        per_gpu = f.name
    try:
        full = {name: scrape(machine(name), None) for name in names}
        folded = {name: sum(scrape(machine(name), per_gpu).values()) for name in names
                  if any(k.startswith("nodehealth_gpu_nvlink_") for k in full[name])}
    finally:
        os.unlink(per_gpu)
    print("series on /metrics per fixture machine (total; with exporter.detail.nvlink_per_link: false)")
    for i, name in enumerate(names, 1):
        extra = f"; {folded[name]}" if name in folded else ""
        print(f"  m{i:<2} {name:<28} {sum(full[name].values()):>5}{extra}")
    print("\nseries per family (m1.. as above; blank: the family is absent there)")
    rows = sorted({family for counts in full.values() for family in counts})
    width = max(len(r) for r in rows)
    print(" " * width + "".join(f"{'m' + str(i):>6}" for i in range(1, len(names) + 1)))
    for family in rows:
        print(f"{family:<{width}}" + "".join(f"{full[n].get(family, ''):>6}" for n in names))


if __name__ == "__main__":
    main()
