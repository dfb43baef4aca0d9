"""Kernel-log throughput: lines per second through the whole follower (framing, records, event
parsing) on a mixed 1,000,000-line raw kmsg log, for this tree and for a base commit, in one run.

The log cycles real lines: a healthy node's full boot logs (gpud full-boot ctime dmesg, the m4-logs
A100 dmesg -T) as noise, and every 50th record an event line (Xids, SXids, hung tasks, link events
from the h100-8x-cx7 machine, and the host faults of tests/fixtures/kmsg/host/). Each tree runs in
its own interpreter; the base tree is `git archive`d into a temporary directory.
`--framing` writes the log as raw kmsg records (the daemon's stream), as dmesg prints it, or as pdsh
prints dmesg (`host: [uptime] message`, the saved-log fallback path).
Usage: python benchmarks/kmsg_throughput.py [--lines 1000000] [--base c368130] [--framing kmsg|dmesg|pdsh]
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

from common import ROOT, machine

MEASURE = r"""
import sys, time
import nodehealth
from nodehealth.collectors import kmsg
from nodehealth.host import HostPaths
if sys.argv[2:] == ["journal"]:  # the journal of the same records (journal_throughput.py; this tree only)
    follower = kmsg.open_follower(HostPaths(sys.argv[1]), dict(kmsg.DEFAULTS, source="journal"))
else:
    follower = kmsg.KmsgFollower(HostPaths(sys.argv[1]), {})
total, events, cpu, wall = 0, 0, time.process_time(), time.perf_counter()
while True:
    count, _, _, found = follower.read_new()
    if not count:
        break
    total += count
    events += len(found)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(f"{nodehealth.__file__}\t{total}\t{events}\t{cpu:.3f}\t{wall:.3f}")
"""


def messages() -> tuple[list[str], list[str]]:
    """(noise, events): first lines of real kernel messages."""
    sys.path.insert(0, ROOT)
    from nodehealth.collectors import kmsg

    def read(paths):
        log_lines = kmsg.LogLines()
        out = []
        for path in paths:
            with open(path, "rb") as f:
                for line in f:
                    out.extend(r.message.split("\n")[0] for r in log_lines.feed(line.decode("utf-8", "replace")))
        out.extend(r.message.split("\n")[0] for r in log_lines.flush())
        return [m for m in out if m.strip()]

    fixtures = os.path.join(ROOT, "tests", "fixtures", "kmsg")
    noise = read([os.path.join(fixtures, "gpud", "full-boot-ctime.dmesg.0.log"),
                  os.path.join(fixtures, "m4-logs", "jean-zay-iam06.a100.dmesg-T.hung-tasks.txt")])
    noise = [m for m in noise if "blocked for more than" not in m and "task:" not in m]
    events = read([os.path.join(machine("h100-8x-cx7"), "dev", "kmsg")]
                  + sorted(glob.glob(os.path.join(fixtures, "host", "*.txt"))))
    return noise, events


FRAMINGS = {
    "kmsg": lambda seq, message: f"4,{seq},{seq * 1000},-;{message}",
    "dmesg": lambda seq, message: f"[{seq // 1000:5d}.{seq % 1000:03d}000] {message}",
    "pdsh": lambda seq, message: f"gpu-node-{seq % 8:02d}: [{seq // 1000:5d}.{seq % 1000:03d}000] {message}",
}


def write_machine(root: str, lines: int, framing: str = "kmsg") -> None:
    noise, events = messages()
    os.makedirs(os.path.join(root, "dev"))
    os.makedirs(os.path.join(root, "proc"))
    with open(os.path.join(root, "proc", "stat"), "w") as f:
        f.write("btime 1700000000\n")
    with open(os.path.join(root, "proc", "uptime"), "w") as f:
        f.write(f"{lines / 1000:.2f} 0.00\n")
    with open(os.path.join(root, "dev", "kmsg"), "w") as f:
        n = e = 0
        for seq in range(lines):
            if seq % 50 == 49:
                message, e = events[e % len(events)], e + 1
            else:
                message, n = noise[n % len(noise)], n + 1
            f.write(FRAMINGS[framing](seq, message) + "\n")


def base_tree(commit: str, where: str) -> str:
    """The base commit's package laid out as it installs (collectors/ and checks/ inside nodehealth/)."""
    src = os.path.join(where, "src")
    os.makedirs(src)
    archive = subprocess.run(["git", "-C", ROOT, "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    pkg = os.path.join(where, "pkg")
    shutil.copytree(os.path.join(src, "nodehealth"), os.path.join(pkg, "nodehealth"))
    shutil.copytree(os.path.join(src, "collectors"), os.path.join(pkg, "nodehealth", "collectors"))
    shutil.copytree(os.path.join(src, "checks"), os.path.join(pkg, "nodehealth", "checks"))
    return pkg


def measure(root: str, pythonpath: str | None, source: str = "kmsg") -> tuple[str, int, int, float, float]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", MEASURE, root, source], env=env, check=True, capture_output=True,
                         text=True, cwd=tempfile.gettempdir()).stdout.strip().split("\t")
    return out[0], int(out[1]), int(out[2]), float(out[3]), float(out[4])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--base", default="c368130")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--framing", choices=sorted(FRAMINGS), default="kmsg")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "machine")
        t0 = time.perf_counter()
        write_machine(root, args.lines, args.framing)
        size = os.path.getsize(os.path.join(root, 'dev', 'kmsg')) >> 20
        print(f"log: {args.lines} {args.framing} lines, {size} MiB, "
              f"written in {time.perf_counter() - t0:.1f} s")
        base = base_tree(args.base, os.path.join(tmp, "base"))
        for _ in range(args.repeat):  # interleaved, so load on the machine hits both alike
            for name, path in ((f"base {args.base}", base), ("this tree", None)):
                module, total, events, cpu, wall = measure(root, path)
                print(f"{name:>16}: {total} lines, {events} events, CPU {cpu:.2f} s, wall {wall:.2f} s, "
                      f"{total / cpu / 1000:.0f}k lines per CPU second  ({os.path.dirname(module)})")


if __name__ == "__main__":
    main()
