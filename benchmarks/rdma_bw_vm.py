"""rdma-bw against ib_write_bw on Soft-RoCE, interleaved in one QEMU boot (the VM tier's guest).

Boots Debian's stock kernel as tests/test_vm_tier.py does (tests/vm/harness.py: the host's root over
9p, rdma_rxe on lo) and runs benchmarks/rdma_bw.sh there: per size and round, ib_write_bw, then
`nodehealth rdma-bw` (and each `--versions` one: nodehealth/rdma/bw.py at a git revision, or a file),
each writing 62.5 MiB, the order rotated every round. Prints, per size, each tool's median average
and peak Gb/s and the median of the rounds' ratios to ib_write_bw (same round, same boot).

Soft-RoCE under TCG is CPU-bound, and on a shared machine the guest's wall-clock time swings with
the other users' load (a round's ratio anywhere in 0.3-3x). `--icount` runs the guest on QEMU's
instruction counter instead (`-icount shift=0`: one virtual nanosecond per instruction, on one
vCPU, which the tests keep busy), so that its clock, and every rate measured by it, depends on the
instructions run only: rdma-bw and ib_write_bw are compared by what they cost the machine, not by
what the host's load let them have. Needs root, qemu-system-x86, perftest, python3-pyverbs and
busybox-static (as the VM tier). Usage:
  sudo python benchmarks/rdma_bw_vm.py [--reps 5] [--sizes 4096 65536 1048576] [--icount]
                                       [--versions REV|FILE ...] [--profile]
"""
from __future__ import annotations

import argparse
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile

from common import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests"))
from vm import harness  # noqa: E402

GUEST = """#!/bin/sh
set -u
. "$OUT/env.sh"
PY="$PWD/.venv/bin/python"
NH="$PY -m nodehealth.cli"
export PYTHONDONTWRITEBYTECODE=1
. tests/vm/rxe.sh
. benchmarks/rdma_bw.sh
exit 0
"""


def table(rows: list[list[str]], sizes: list[int]) -> str:
    tools = list(dict.fromkeys(r[0] for r in sorted(rows, key=lambda r: r[0] != "ib_write_bw")))
    lines = [f"{'size':>8} {'tool':<12} {'avg Gb/s':>9} {'peak Gb/s':>10} {'avg / ib_write_bw':>18}  (medians)"]
    for size in sizes:
        runs = {t: {int(r[2]): (float(r[3]), float(r[4])) for r in rows if r[0] == t and int(r[1]) == size}
                for t in tools}
        for tool in tools:
            values = list(runs[tool].values())
            ratios = [runs[tool][k][0] / runs["ib_write_bw"][k][0] for k in runs[tool]
                      if k in runs["ib_write_bw"] and runs["ib_write_bw"][k][0] > 0]
            ratio = f"{statistics.median(ratios):.2f}x" if tool != "ib_write_bw" and ratios else ""
            lines.append(f"{size:>8} {tool:<12} {statistics.median(v[0] for v in values):>9.3f} "
                         f"{statistics.median(v[1] for v in values):>10.3f} {ratio:>18}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 65536, 1048576])
    ap.add_argument("--versions", nargs="*", default=[], metavar="REV|FILE",
                    help="other versions of nodehealth/rdma/bw.py to run alongside: git revisions or files")
    ap.add_argument("--icount", action="store_true", help="time the guest by instructions, not the host's clock")
    ap.add_argument("--profile", action="store_true", help="one cProfile'd client run per size and version")
    ap.add_argument("--keep", help="a directory to keep the guest's files in")
    args = ap.parse_args()
    out = args.keep or tempfile.mkdtemp(prefix="nh-rdma-bw-")
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="nh-rdma-bw-work-")
    env = {"SIZES": " ".join(map(str, args.sizes)), "REPS": str(args.reps), "PROFILE": "1" if args.profile else ""}
    versions = []
    for version in args.versions:
        if os.path.isfile(version):
            name = os.path.basename(version)
            with open(version) as f:
                source = f.read()
        else:
            name = "bw-" + re.sub(r"[^A-Za-z0-9_.-]", "_", version) + ".py"
            source = subprocess.run(["git", "show", f"{version}:nodehealth/rdma/bw.py"], cwd=ROOT, check=True,
                                    capture_output=True, text=True).stdout
        with open(os.path.join(out, name), "w") as f:
            f.write(source)
        versions.append(f"/nh-out/{name}")
    env["VERSIONS"] = " ".join(versions)
    script = os.path.join(work, "guest.sh")
    with open(script, "w") as f:
        f.write(GUEST)
    rc, _, seconds = harness.run_batch(script, out, work, ROOT, timeout=5400, env=env, icount=args.icount)
    with open(os.path.join(out, "console.log"), errors="replace") as f:
        console = f.read()
    if rc != 0:
        print(console[-4000:])
        return 1
    with open(os.path.join(out, "bw.tsv")) as f:
        rows = [line.split() for line in f if line.strip()]
    clock = "the guest's instruction count (-icount shift=0)" if args.icount else "the host's clock"
    print(f"one boot, {args.reps} interleaved rounds per size, {seconds:.0f} s, timed by {clock}; files in {out}")
    print(table(rows, args.sizes))
    for name in sorted(os.listdir(out)):
        if name.startswith("prof-") and name.endswith(".out"):
            print(f"\n{name}:")
            pstats.Stats(os.path.join(out, name)).sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    sys.exit(main())
