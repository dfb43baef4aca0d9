"""`nodehealth check` cold start on this host vs `python3 -c "import psutil"`, interleaved.

Target: the median wall time of `nodehealth check` is at most 3x that of importing psutil.
Usage: python benchmarks/check_startup.py [--runs 30]
"""
from __future__ import annotations

import argparse
import shutil
import sys

from common import median, timed_run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=30)
    args = p.parse_args()
    check = [shutil.which("nodehealth") or sys.exit("install nodehealth first (pip install -e .)"), "check"]
    baseline = [sys.executable, "-c", "import psutil"]
    for cmd in (check, baseline):  # warm the page cache once; "cold" means a new process
        timed_run(cmd)
    ours, theirs = [], []
    for _ in range(args.runs):
        ours.append(timed_run(check))
        theirs.append(timed_run(baseline))
    m_ours, m_theirs = median(ours), median(theirs)
    print(f"runs: {args.runs} each, interleaved")
    print(f"nodehealth check      median {m_ours * 1000:7.1f} ms")
    print(f"python3 -c 'import psutil' median {m_theirs * 1000:7.1f} ms")
    print(f"ratio {m_ours / m_theirs:.2f}x (target <= 3.0x)")


if __name__ == "__main__":
    main()
