"""Each part of the daemon's second on the H100 fixture, in one process: every collector, the pass's own
work, and a scrape's three parts, one of each every `--spacing` seconds (the daemon runs them once a
second, on cold caches: a part costs more than back to back). CPU is the calling thread's (thread_time);
the pass's collectors run in their worker thread, so "pass" is the pass thread's own part.

Run it with the Python of each install to compare before and after (each imports its own tree):
    python benchmarks/daemon_parts.py; /tmp/base/.venv/bin/python benchmarks/daemon_parts.py
Where the tree has host.KeptFiles, the InfiniBand collector is also timed with nothing kept, and a
directory of this host's real sysfs is read both ways (kept descriptors against open, read and close).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from common import machine

from nodehealth import config, exporter, node_pass
from nodehealth import host as hostpaths
from nodehealth.daemon import Daemon
from nodehealth.process_metrics import process_metrics

REAL_SYSFS_DIR = "/sys/class/net/lo/statistics"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--spacing", type=float, default=0.3, help="seconds between rounds")
    args = p.parse_args()
    cfg = config.load(None)
    cfg["daemon"]["state_dir"] = tempfile.mkdtemp()
    root = machine("h100-8x-cx7")
    engine = node_pass.build_engine(cfg, root, ["buddyinfo", "vm", "infiniband"], ())
    daemon = Daemon(engine, cfg, "bench")
    daemon.load_state()
    parts = {f"collect {m.NAME}": (lambda m=m: m.collect(engine.host, cfg["collectors"].get(m.NAME, {})))
             for m in engine.collectors}
    if hasattr(hostpaths, "KeptFiles"):
        unkept = hostpaths.HostPaths(root)
        unkept._kept["infiniband"] = hostpaths.KeptFiles(0)
        ib = next(m for m in engine.collectors if m.NAME == "infiniband")
        parts["collect infiniband, nothing kept"] = lambda: ib.collect(unkept, {})
    families: list = []  # the scrape's, for the render

    def every_family() -> None:
        families[:] = daemon.metrics()

    parts["pass (the pass thread's own part)"] = daemon.run_pass
    parts["families from the report"] = daemon.exporter.metrics
    parts["process_*"] = process_metrics
    parts["every family (the two above, the daemon's)"] = every_family
    parts["render of every family"] = lambda: exporter.render(exporter.shape(families, cfg["exporter"]))
    if hasattr(daemon, "exposition"):  # the report's text is written by the pass: a scrape adds the daemon's own
        parts["scrape: the /metrics body"] = daemon.exposition
    for _ in range(5):
        for part in parts.values():
            part()
    spent = dict.fromkeys(parts, 0.0)
    for _ in range(args.rounds):
        for name, part in parts.items():
            t0 = time.thread_time()
            part()
            spent[name] += time.thread_time() - t0
        time.sleep(args.spacing)
    print(f"{args.rounds} rounds, one every {args.spacing:g} s, thread CPU per part:")
    for name, seconds in spent.items():
        print(f"  {name:52s} {seconds / args.rounds * 1000:6.3f} ms")
    if hasattr(hostpaths, "KeptFiles") and os.path.isdir(REAL_SYSFS_DIR):
        real_sysfs(hostpaths.KeptFiles)


def real_sysfs(kept_files) -> None:
    """Per file of REAL_SYSFS_DIR, warm: read through kept descriptors and opened, read and closed."""
    files = len(os.listdir(REAL_SYSFS_DIR))
    for label, kept in (("kept descriptors", kept_files(1024)), ("open, read, close", kept_files(0))):
        kept.read_int_dir(REAL_SYSFS_DIR)
        t0 = time.process_time()
        for _ in range(2000):
            kept.read_int_dir(REAL_SYSFS_DIR)
        print(f"  {REAL_SYSFS_DIR} ({files} files), {label}: "
              f"{(time.process_time() - t0) / 2000 / files * 1e6:.2f} us a file")
        kept.close()


if __name__ == "__main__":
    main()
