"""Start-up of `nodehealth check` and `nodehealth rdma-bw`: two installs side by side, interleaved.

Each command runs as users run it, a whole new process: `check --root` on the plain-host fixture (one
pass included) and `rdma-bw 127.0.0.1` on a host without an RDMA device (it stops at its preflight,
before pyverbs). Per command and install: the median wall time, and from `python -X importtime` the
time spent importing (the sum of every module's own time) and the nodehealth modules loaded.

`-P` keeps the working directory off sys.path, so each Python imports its own install's tree.
Usage: python benchmarks/command_startup.py --before OLD_VENV/bin/python [--after NEW_VENV/bin/python]
       [--runs 20]   (each venv has its tree installed: pip install -e TREE)
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

from common import machine, median, timed_run

COMMANDS = {
    "check": ["check", "--root", machine("plain-host"), "--state-dir", "/nonexistent-state"],
    "rdma-bw": ["rdma-bw", "127.0.0.1"],
}


def imports(python: str, argv: list[str]) -> tuple[float, int]:
    """Seconds spent importing (every module's own time, summed) and nodehealth modules imported."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run([python, "-P", "-X", "importtime", "-m", "nodehealth.cli", *argv], capture_output=True,
                          text=True, env=env)
    own, ours = 0, 0
    for line in done.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|(\s*)(\S+)", line)
        if m:
            own += int(m.group(1))
            ours += m.group(3).startswith("nodehealth")
    return own / 1e6, ours


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--before", required=True, help="the Python of the venv with the old tree")
    p.add_argument("--after", default=sys.executable, help="the Python of the venv with the new tree")
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    installs = {"before": args.before, "after": args.after}
    for python in installs.values():  # warm the page cache and the bytecode once
        for argv in COMMANDS.values():
            timed_run([python, "-P", "-m", "nodehealth.cli", *argv])
    wall = {(c, i): [] for c in COMMANDS for i in installs}
    imported = {(c, i): [] for c in COMMANDS for i in installs}
    modules = {}
    for _ in range(args.runs):
        for command, argv in COMMANDS.items():
            for install, python in installs.items():
                wall[(command, install)].append(timed_run([python, "-P", "-m", "nodehealth.cli", *argv]))
                seconds, count = imports(python, argv)
                imported[(command, install)].append(seconds)
                modules[(command, install)] = count
    print(f"runs: {args.runs} per command and install, interleaved")
    print(f"{'command':<9} {'install':<7} {'wall median':>12} {'imports median':>15} {'nodehealth modules':>19}")
    for command in COMMANDS:
        for install in installs:
            key = (command, install)
            print(f"{command:<9} {install:<7} {median(wall[key]) * 1000:>9.1f} ms "
                  f"{median(imported[key]) * 1000:>12.1f} ms {modules[key]:>19}")
        # Each round ran both installs back to back: the median of the differences is steadier on a busy machine.
        walls = [a - b for a, b in zip(wall[(command, "after")], wall[(command, "before")])]
        spent = [a - b for a, b in zip(imported[(command, "after")], imported[(command, "before")])]
        print(f"{command:<9} after - before, median of the rounds: wall {median(walls) * 1000:+.1f} ms, "
              f"imports {median(spent) * 1000:+.1f} ms")


if __name__ == "__main__":
    main()
