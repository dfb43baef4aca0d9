"""What `nodehealth check` spends importing, two installs side by side, robust to a loaded machine.

Each run is a whole `check --root` process on the plain-host fixture under `python -X importtime`;
runs of the two installs alternate. Every module's own import time is taken at its fastest over the
runs: load from other processes only ever adds time, so the fastest run of a module is its cost. The
sum over all modules, and over nodehealth's, is printed per install, with the modules that grew most.

Usage: python benchmarks/import_cost.py --before OLD_VENV/bin/python [--after NEW_VENV/bin/python]
       [--runs 25]   (each venv has its tree installed: pip install -e TREE)
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys

from common import machine

ARGV = ["-P", "-X", "importtime", "-m", "nodehealth.cli", "check", "--root", machine("plain-host"),
        "--state-dir", "/nonexistent-state"]


def fastest(pythons: dict[str, str], runs: int) -> dict[str, dict[str, int]]:
    """Per install, each module's fastest own import time in microseconds."""
    best: dict[str, dict[str, int]] = {name: {} for name in pythons}
    for _ in range(runs):
        for name, python in pythons.items():
            err = subprocess.run([python, *ARGV], capture_output=True, text=True).stderr
            for line in err.splitlines():
                m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
                if m:
                    best[name][m.group(2)] = min(best[name].get(m.group(2), 1 << 62), int(m.group(1)))
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="the Python of the venv with the old tree")
    p.add_argument("--after", default=sys.executable, help="the Python of the venv with the new tree")
    p.add_argument("--runs", type=int, default=25)
    args = p.parse_args()
    best = fastest({"before": args.before, "after": args.after}, args.runs)
    print(f"runs: {args.runs} per install, alternating; each module at its fastest")
    print(f"{'install':8} {'all modules':>12} {'nodehealth':>11} {'its modules':>12}")
    for name, times in best.items():
        ours = [t for m, t in times.items() if m.startswith("nodehealth")]
        print(f"{name:8} {sum(times.values()) / 1000:9.1f} ms {sum(ours) / 1000:8.1f} ms {len(ours):12d}")
    before, after = best["before"], best["after"]
    grew = sorted(set(before) | set(after), key=lambda m: after.get(m, 0) - before.get(m, 0), reverse=True)[:5]
    print("grew most: " + ", ".join(f"{m} {(after.get(m, 0) - before.get(m, 0)) / 1000:+.2f} ms" for m in grew))
    return 0


if __name__ == "__main__":
    sys.exit(main())
