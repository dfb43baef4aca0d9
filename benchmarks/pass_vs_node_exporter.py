"""CPU time of one daemon pass over the H100 fixture vs node_exporter scraping the same tree.

Ours: collectors buddyinfo, vm (vmstat + meminfo + THP) and infiniband, then the checks (a pass),
and separately a pass plus the /metrics text (like for like with a scrape), in-process, measured
with time.process_time() over N passes.
Theirs: Debian's prometheus-node-exporter with collectors buddyinfo, infiniband, vmstat and
meminfo, --path.procfs/--path.sysfs pointed at the same fixture, measured from its /proc/PID/stat
CPU ticks over N scrapes. Both run in the same invocation, interleaved in rounds.
Target: a pass <= 1.5x a scrape.
Usage: python benchmarks/pass_vs_node_exporter.py [--passes 300] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

from common import free_port, get, machine, median, process_cpu_seconds, wait_http

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nodehealth import config, exporter, registry  # noqa: E402
from nodehealth.engine import Engine  # noqa: E402
from nodehealth.host import HostPaths  # noqa: E402
from nodehealth.model import Report, verdict  # noqa: E402

COLLECTORS = ("buddyinfo", "vm", "infiniband")


def our_pass_cpu(root: str, passes: int) -> tuple[float, float]:
    """CPU per pass (collect + judge), and per pass plus rendering /metrics."""
    collectors = [m for m in registry.COLLECTORS if m.NAME in COLLECTORS]
    checks = [c for c in registry.CHECKS if set(c.NEEDS) <= set(COLLECTORS)]
    engine = Engine(collectors, checks, HostPaths(root), config.defaults())
    engine.run()
    t0 = time.process_time()
    for _ in range(passes):
        engine.run()
    pass_only = (time.process_time() - t0) / passes
    t0 = time.process_time()
    for _ in range(passes):
        results, findings = engine.run()
        report = Report("bench", verdict(findings), findings, list(results.values()))
        exporter.render(exporter.report_metrics(report, collectors))
    return pass_only, (time.process_time() - t0) / passes


def node_exporter_scrape_cpu(binary: str, root: str, scrapes: int) -> float:
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--path.procfs={root}/proc", f"--path.sysfs={root}/sys", "--collector.disable-defaults",
         "--collector.buddyinfo", "--collector.infiniband", "--collector.vmstat", "--collector.meminfo",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait_http(url)
        body = get(url).decode()
        assert "node_infiniband_" in body and "node_buddyinfo_blocks" in body, "node_exporter read nothing"
        for _ in range(20):
            get(url)
        before = process_cpu_seconds(proc.pid)
        for _ in range(scrapes):
            get(url)
        return (process_cpu_seconds(proc.pid) - before) / scrapes
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--passes", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if not binary:
        sys.exit("install Debian's prometheus-node-exporter first")
    root = machine("h100-8x-cx7")
    passes, rendered, theirs = [], [], []
    for _ in range(args.rounds):
        p, r = our_pass_cpu(root, args.passes)
        passes.append(p)
        rendered.append(r)
        theirs.append(node_exporter_scrape_cpu(binary, root, args.passes))
    print(f"rounds: {args.rounds} x {args.passes} passes/scrapes, interleaved")
    rows = (("nodehealth pass", passes), ("nodehealth pass + /metrics", rendered),
            ("node_exporter scrape", theirs))
    for name, values in rows:
        print(f"{name:28s} median CPU {median(values) * 1000:6.2f} ms  "
              f"rounds {[round(x * 1000, 2) for x in values]}")
    print(f"pass / scrape ratio {median(passes) / median(theirs):.2f}x (target <= 1.5x); "
          f"pass + /metrics / scrape {median(rendered) / median(theirs):.2f}x")

if __name__ == "__main__":
    main()
