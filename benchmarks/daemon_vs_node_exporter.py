"""The whole `nodehealth daemon` process against node_exporter, side by side on the H100 fixture.

Both serve the same sources from the same tree (tests/fixtures/machines/h100-8x-cx7): the daemon
with `--only buddyinfo,vm,infiniband --interval 1` (vm is vmstat + meminfo + THP), Debian's
prometheus-node-exporter with collectors buddyinfo, infiniband, vmstat and meminfo and
--path.procfs/--path.sysfs on the fixture. Both run the whole time and are scraped every second
(the order alternates each round); at each round's ends their CPU (utime + stime of the whole
process, /proc/PID/stat) and resident set (VmRSS) are read, so every round sees both under the
same machine load. `--before PYTHON` adds a third process, the daemon of another install (a venv
with the old tree installed), to compare before and after in the same run. Where py-spy is on PATH,
each daemon's CPU is also split by thread (each thread's run time and times it was run from
/proc/PID/task/TID/schedstat, named by `py-spy dump`): the profile of the whole process, not of a pass.
`--moving` serves a copy of the tree whose busy-node figures move every second (Mover), so that
nothing is measured on values that never change. `--node-exporter BINARY`, given once per release, runs
those node_exporters instead of the one on PATH, all side by side: from 1.7 its infiniband collector
reads the hw_counters/ of mlx5 ports (later releases: of more drivers' ports) as the daemon does, where 1.5
(Debian bookworm's) reads none of them; benchmarks/debian_node_exporter.sh unpacks another Debian suite's release.

Target: the daemon's CPU at most 1.0x node_exporter's; its RSS at most 60 MiB, flat.
Usage: python benchmarks/daemon_vs_node_exporter.py [--rounds 4] [--seconds 10] [--before OLD_VENV/bin/python]
       [--moving] [--node-exporter BINARY ...]
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from common import free_port, get, machine, median, metric_value, process_cpu_seconds, rss_bytes, wait_http

SOURCES = ("buddyinfo", "vm", "infiniband")
NODE_EXPORTER_COLLECTORS = ("buddyinfo", "infiniband", "vmstat", "meminfo")


class Mover:
    """A copy of the tree whose figures move as a busy node's do, written in place before each second's
    scrapes: the ports' traffic counters and vmstat's page counters grow, meminfo's free and cached
    figures and buddyinfo's free blocks wiggle. The error counters stay: no finding comes of it."""

    TRAFFIC = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "unicast_xmit_packets",
               "unicast_rcv_packets", "multicast_xmit_packets", "multicast_rcv_packets", "rx_write_requests",
               "rx_read_requests")
    MEMINFO = ("MemFree:", "MemAvailable:", "Cached:", "Active(file):", "Inactive(file):")

    def __init__(self, fixture: str, copy: str):
        shutil.copytree(fixture, copy, symlinks=True)
        self.root = copy
        self.n = 0  # ticks so far
        ports = os.path.join(copy, "sys", "class", "infiniband", "*", "ports", "*")
        self.counters = sorted(path for part in ("counters", "hw_counters")
                               for path in glob.glob(os.path.join(ports, part, "*"))
                               if os.path.basename(path) in self.TRAFFIC)
        self.texts = {path: _read(path) for path in self.counters}
        for name in ("vmstat", "meminfo", "buddyinfo"):
            path = os.path.join(copy, "proc", name)
            self.texts[path] = _read(path)

    def tick(self) -> None:
        self.n += 1
        n = self.n
        for path, text in self.texts.items():
            name = os.path.basename(path)
            if path in self.counters:
                moved = f"{int(text) + n * 1_000_003}\n"
            elif name == "vmstat":
                moved = "".join(f"{k} {int(v) + n * 997}\n" if k.startswith(("pg", "nr_")) else f"{k} {v}\n"
                                for k, v in (line.split() for line in text.splitlines()))
            elif name == "meminfo":
                moved = "".join(_shift(line, n % 7 * 4) if line.startswith(self.MEMINFO) else line + "\n"
                                for line in text.splitlines())
            else:  # buddyinfo
                moved = "".join(" ".join(f"{int(w) + n % 3}" if w.isdigit() and i > 3 else w
                                         for i, w in enumerate(line.split())) + "\n" for line in text.splitlines())
            with open(path, "w") as f:  # in place, as the kernel's files change
                f.write(moved)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _shift(line: str, by: int) -> str:
    key, value, *unit = line.split()
    return " ".join([key, str(int(value) + by), *unit]) + "\n"


class Served:
    """One process serving /metrics, and what was read of it."""

    def __init__(self, name: str, argv: list[str], port: int, expect: str, cwd: str | None = None):
        self.name, self.expect = name, expect
        self.url = f"http://127.0.0.1:{port}/metrics"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd, env=env)
        self.cpu: list[float] = []  # seconds per round
        self.rss: list[int] = []  # bytes at each round's end
        self.threads: dict[str, str] = {}  # thread id -> name (the daemons, with py-spy)
        self.thread_ns: dict[str, list[int]] = {}  # thread id -> [run time (ns), times run] over the rounds

    def name_threads(self) -> None:
        """Each thread's name as Python knows it (the kernel's is the program's for all of them)."""
        if not shutil.which("py-spy"):
            return
        dump = subprocess.run(["py-spy", "dump", "-p", str(self.proc.pid)], capture_output=True, text=True).stdout
        self.threads = dict(re.findall(r'^Thread (\d+) \(\w+\): "([^"]*)"', dump, re.M))

    def thread_times(self) -> dict[str, tuple[int, int]]:
        out = {}
        for tid in self.threads:
            try:
                with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat") as f:
                    run_ns, _, runs = f.read().split()
                    out[tid] = int(run_ns), int(runs)
            except FileNotFoundError:  # gone: its time since the last read is lost, and said so below
                pass
        return out

    def ready(self) -> None:
        wait_http(self.url)
        deadline = time.monotonic() + 20
        while self.expect not in get(self.url).decode():  # the daemon's first pass, node_exporter's read
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} serves no {self.expect}")
            time.sleep(0.1)

    def scrape(self) -> bytes:
        return get(self.url)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def daemon(name: str, python: str, root: str, state: str, interval: float) -> Served:
    port = free_port()
    # -P: only this install's tree is imported, not the working directory's.
    argv = [python, "-P", "-m", "nodehealth.cli", "daemon", "--root", root, "--only", ",".join(SOURCES),
            "--state-dir", state, "--listen", f"127.0.0.1:{port}", "--interval", f"{interval:g}",
            "--node-name", "bench"]
    return Served(name, argv, port, "nodehealth_infiniband_", cwd="/")


def node_exporter(binary: str, root: str) -> Served:
    """Named by its version: releases read different files (from 1.7, procfs reads hw_counters/ too)."""
    port = free_port()
    argv = [binary, f"--path.procfs={root}/proc", f"--path.sysfs={root}/sys", "--collector.disable-defaults",
            *[f"--collector.{c}" for c in NODE_EXPORTER_COLLECTORS], f"--web.listen-address=127.0.0.1:{port}"]
    said = subprocess.run([binary, "--version"], capture_output=True, text=True)
    version = re.search(r"version (\S+)", said.stdout + said.stderr)
    return Served(f"node_exporter {version.group(1) if version else '?'}", argv, port, "node_infiniband_")


def run_round(served: list[Served], seconds: int, mover: Mover | None = None) -> None:
    """`seconds` scrapes of each, one a second, every process's CPU read at both ends; with a mover,
    the tree moves before each second's scrapes."""
    before = [process_cpu_seconds(s.proc.pid) for s in served]
    threads_before = [s.thread_times() for s in served]
    start = time.monotonic()
    for tick in range(seconds):
        if mover is not None:
            mover.tick()
        for s in served:
            s.scrape()
        time.sleep(max(0.0, start + tick + 1 - time.monotonic()))
    for s, cpu, ns in zip(served, before, threads_before):
        s.cpu.append(process_cpu_seconds(s.proc.pid) - cpu)
        s.rss.append(rss_bytes(s.proc.pid))
        for tid, now in s.thread_times().items():
            then = ns.get(tid, now)
            total = s.thread_ns.setdefault(tid, [0, 0])
            total[0] += now[0] - then[0]
            total[1] += now[1] - then[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=int, default=10, help="seconds (scrapes) per round")
    p.add_argument("--warmup", type=int, default=5, help="seconds of scrapes before the first round")
    p.add_argument("--before", help="the Python of a venv with the old tree, run as a third process")
    p.add_argument("--moving", action="store_true", help="serve a copy of the tree whose figures move every second")
    p.add_argument("--interval", type=float, default=1.0,
                   help="the daemons' seconds between passes (all are scraped once a second whatever it is)")
    p.add_argument("--node-exporter", action="append", metavar="BINARY",
                   help="a node_exporter to run beside the daemons (again for another release; "
                        "default: the one on PATH)")
    args = p.parse_args()
    if args.node_exporter:
        binaries = args.node_exporter
        if not all(map(shutil.which, binaries)):
            sys.exit(f"not an executable: {', '.join(b for b in binaries if not shutil.which(b))}")
    else:
        binaries = [shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")]
        if not binaries[0]:
            sys.exit("install Debian's prometheus-node-exporter first")
    served: list[Served] = []
    with tempfile.TemporaryDirectory() as state:
        mover = Mover(machine("h100-8x-cx7"), os.path.join(state, "machine")) if args.moving else None
        root = mover.root if mover else machine("h100-8x-cx7")
        try:
            for binary in binaries:  # each in served as it starts: the finally stops every one started
                served.append(node_exporter(binary, root))
            theirs = served[:]
            served.append(daemon("nodehealth", sys.executable, root, os.path.join(state, "after"), args.interval))
            if args.before:
                served.append(daemon("nodehealth before", args.before, root, os.path.join(state, "before"),
                                     args.interval))
            for s in served:
                s.ready()
            run_round(served, args.warmup, mover)
            ours = served[len(theirs):]
            for s in ours:
                s.name_threads()  # after the warm-up: the pass, collector and request threads all exist
            for s in served:
                s.cpu.clear()
                s.rss.clear()
            for r in range(args.rounds):
                run_round(served if r % 2 == 0 else served[::-1], args.seconds, mover)
            passes = {s.name: metric_value(s.scrape().decode(), "nodehealth_daemon_passes_total") for s in ours}
        finally:
            for s in served:
                s.stop()
    total = args.rounds * args.seconds
    load = os.getloadavg()
    print(f"rounds: {args.rounds} x {args.seconds} s, one scrape of each per second, side by side"
          f"{f', the daemons judging every {args.interval:g} s' if args.interval != 1 else ''}"
          f"{', the tree moving every second' if mover else ''}; "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    for s in served:
        mib = [round(b / 2**20, 1) for b in s.rss]
        print(f"{s.name:20s} CPU {sum(s.cpu) / total * 1000:6.2f} ms/s  rounds (ms) "
              f"{[round(c * 1000) for c in s.cpu]}  RSS MiB {mib}"
              + (f"  passes {passes[s.name]:.0f}" if s.name in passes else ""))
    for s in ours:
        for peer in theirs:
            ratios = [mine / max(their, 1e-9) for mine, their in zip(s.cpu, peer.cpu)]
            print(f"{s.name} / {peer.name}: {sum(s.cpu) / max(sum(peer.cpu), 1e-9):.2f}x over {total} s "
                  f"(median round {median(ratios):.2f}x; target <= 1.0x)")
        growth = (s.rss[-1] - s.rss[0]) / 2**20
        print(f"{s.name} RSS {max(s.rss) / 2**20:.1f} MiB max, {growth:+.1f} MiB first to last round "
              "(target <= 60 MiB, flat)")
    for s in ours:
        if s.threads:
            named = ", ".join(f"{s.threads[tid]} {ns / 1e6 / total:.2f} ({runs / total:.1f})" for tid, (ns, runs) in
                              sorted(s.thread_ns.items(), key=lambda kv: -kv[1][0]))
            print(f"{s.name} by thread, ms/s (runs/s) from schedstat: {named}; together "
                  f"{sum(ns for ns, _ in s.thread_ns.values()) / 1e6 / total:.2f} ms/s (threads started later are "
                  "not counted)")


if __name__ == "__main__":
    main()
