"""Instructions each part of the daemon's second costs on the H100 fixture, counted by valgrind (callgrind):
the CPU of the Python-level work with no noise from the machine, where timing a part that takes a
millisecond on a shared machine varies by 10 % between runs. The kernel's part (the reads' syscalls) is
not counted: daemon_vs_node_exporter.py measures the whole process.

Each part runs `--count` times in a process and once with none; the difference over `--count` is one
part's. `--before PYTHON` counts the same parts with another install's Python (a venv, or a script that
sets PYTHONPATH and execs one: valgrind follows it), side by side:
    python benchmarks/daemon_instructions.py --before /tmp/base/.venv/bin/python
`--inside PART N` is what valgrind runs: the part N times, uncounted when run alone.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PARTS = ("collect infiniband", "collect buddyinfo", "collect vm", "metrics infiniband", "metrics buddyinfo",
         "metrics vm", "pass", "scrape of a new report", "scrape of the same report")


def inside(part: str, count: int) -> None:
    sys.path.insert(0, HERE)
    from common import machine

    from nodehealth import config, node_pass
    from nodehealth.daemon import Daemon
    cfg = config.load(None)
    cfg["daemon"]["state_dir"] = tempfile.mkdtemp()
    engine = node_pass.build_engine(cfg, machine("h100-8x-cx7"), ["buddyinfo", "vm", "infiniband"], ())
    daemon = Daemon(engine, cfg, "bench")
    daemon.load_state()
    modules = {m.NAME: m for m in engine.collectors}
    facts = {name: m.collect(engine.host, {}) for name, m in modules.items()}
    verb, _, name = part.partition(" ")

    def once() -> None:
        if verb == "collect":
            modules[name].collect(engine.host, {})
        elif verb == "metrics":
            modules[name].metrics(facts[name])
        elif part == "pass":
            daemon.run_pass()
        elif part == "scrape of a new report":
            daemon.exporter.publish(daemon.report)  # as a pass does: the next scrape writes the report
            daemon.exposition()
        elif part == "scrape of the same report":
            daemon.exposition()
        else:
            raise SystemExit(f"no part {part!r}; parts: {', '.join(PARTS)}")

    for _ in range(3):  # warm: descriptors kept, the render's texts made
        daemon.run_pass()
        daemon.exposition()
        once()
    for _ in range(count):
        once()


def counted(python: str, part: str, count: int) -> int:
    """Instructions of `count` runs of the part and the process around them."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    run = subprocess.run(["valgrind", "--tool=callgrind", "--trace-children=yes", "--callgrind-out-file=/dev/null",
                          python, "-P", os.path.abspath(__file__), "--inside", part, str(count)],
                         capture_output=True, text=True, env=env, cwd="/", check=True)
    return int(re.search(r"Collected : (\d+)", run.stderr).group(1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, default=20, help="runs of each part (and one process with none)")
    p.add_argument("--before", help="the Python of another install, counted side by side")
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated, of: " + ", ".join(PARTS))
    p.add_argument("--inside", nargs=2, metavar=("PART", "N"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inside:
        inside(args.inside[0], int(args.inside[1]))
        return
    installs = [("ours", sys.executable)] + ([("before", args.before)] if args.before else [])
    print(f"instructions a run of each part (valgrind callgrind, {args.count} runs less none), H100 fixture:")
    for part in args.parts.split(","):
        row = []
        for label, python in installs:
            each = (counted(python, part, args.count) - counted(python, part, 0)) / args.count
            row.append(f"{label} {each / 1e6:6.3f} M")
        print(f"  {part:26s} " + "  ".join(row))


if __name__ == "__main__":
    main()
