"""`nodehealth check` cold start on this host vs `python3 -c "import psutil"`, interleaved.

Target: the median wall time of `nodehealth check` is at most 3x that of importing psutil (issue 11:
at most 5x from a plain `pip install .` venv, which is what a node runs). The `nodehealth` script
next to the Python that runs this is measured, so run it with the venv's Python:
Usage: VENV/bin/python benchmarks/check_startup.py [--runs 30]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

from common import median, timed_run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=30)
    args = p.parse_args()
    beside = os.path.join(os.path.dirname(sys.executable), "nodehealth")
    script = beside if os.path.exists(beside) else shutil.which("nodehealth")
    check = [script or sys.exit("install nodehealth first (pip install .)"), "check"]
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
    print(f"ratio {m_ours / m_theirs:.2f}x (target <= 3.0x editable, <= 5.0x from a plain pip install .)")


if __name__ == "__main__":
    main()
