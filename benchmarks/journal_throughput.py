"""Kernel-log throughput from the systemd journal against /dev/kmsg's framing, in one run: the mixed log
of kmsg_throughput.py as raw kmsg records (the branch point and this tree) and as the journal journald
would have written for them (this tree, read through libsystemd), each in its own interpreter, interleaved.
The journal file is written by systemd-journal-remote (tests/journal_files.py).
Usage: python benchmarks/journal_throughput.py [--lines 100000] [--base 7af6880] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from common import ROOT
from kmsg_throughput import base_tree, measure, write_machine


def write_journal(root: str) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    sys.path.insert(0, ROOT)
    from journal_files import kmsg_entries, machine_journal
    from journal_files import write_journal as append

    boot = "0" * 31 + "1"
    os.makedirs(os.path.join(root, "proc", "sys", "kernel", "random"))
    with open(os.path.join(root, "proc", "sys", "kernel", "random", "boot_id"), "w") as f:
        f.write("00000000-0000-0000-0000-000000000001\n")
    entries = kmsg_entries(os.path.join(root, "dev", "kmsg"), boot, 1700000000.0)
    for start in range(0, len(entries), 50000):  # journal-remote rotates its output file as journald would
        append(machine_journal(root), entries[start:start + 50000])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--base", default="7af6880")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "machine")
        t0 = time.perf_counter()
        write_machine(root, args.lines)
        write_journal(root)
        print(f"log: {args.lines} records, as raw kmsg and as a journal, written in {time.perf_counter() - t0:.1f} s")
        base = base_tree(args.base, os.path.join(tmp, "base"))
        for _ in range(args.repeat):  # interleaved, so load on the machine hits all alike
            for name, source, path in ((f"kmsg, base {args.base}", "kmsg", base), ("kmsg, this tree", "kmsg", None),
                                       ("journal, this tree", "journal", None)):
                _, total, events, cpu, wall = measure(root, path, source)
                print(f"{name:>20}: {total} records, {events} events, CPU {cpu:.2f} s, wall {wall:.2f} s, "
                      f"{total / cpu / 1000:.0f}k records per CPU second")


if __name__ == "__main__":
    main()
