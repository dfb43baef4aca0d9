"""Round-trip accuracy: our probes against `ping` between the same two network namespaces, same run.

Builds two namespaces under one bridge (tests/netns/topology.py), runs the real agent in one
(a daemon with --probe-listen) and, in the other, our prober (recording every round trip, not the
bucketed histogram) while `ping` runs beside it over the same link. Needs root, iproute2, nftables
and iputils-ping. Usage: sudo python benchmarks/pingmesh_rtt.py [--seconds 20]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from common import ROOT, machine, percentile

sys.path.insert(0, os.path.join(ROOT, "tests"))


def probe_side(peer: str, address: str, port: int, tcp_port: int, seconds: float, interval: float) -> None:
    """Inside the probing namespace: every round trip of both probe kinds, as JSON on stdout."""
    from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH_DEFAULTS
    from nodehealth.pingmesh.pinglist import Target
    from nodehealth.pingmesh.prober import Prober

    rtts: dict[str, list[float]] = {"ping": [], "tcp": []}
    lost = {"ping": 0, "tcp": 0}

    def record(target, probe, sent_at, rtt, retransmitted):
        if rtt is None:
            lost[probe] += 1
        else:
            rtts[probe].append(rtt)
    cfg = dict(PINGMESH_DEFAULTS, port=port, tcp_port=tcp_port, probe_interval_seconds=interval,
               max_probes_per_second=1000.0)
    prober = Prober("a", cfg, record)
    prober.set_targets([Target(peer, address, 0, "leaf0", "same-leaf")])
    stop = threading.Event()
    thread = threading.Thread(target=prober.run, args=(stop,))
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join(5)
    json.dump({"rtts": rtts, "lost": lost}, sys.stdout)


def ping_rtts(output: str) -> tuple[list[float], int]:
    """Each reply's round trip in seconds, and how many requests got none (from ping's summary)."""
    rtts = [float(line.split("time=")[1].split()[0]) / 1000 for line in output.splitlines() if "time=" in line]
    summary = next((line for line in output.splitlines() if "packets transmitted" in line), "0 packets")
    return rtts, int(summary.split()[0]) - len(rtts)


def row(name: str, values: list[float], lost: int) -> str:
    us = [v * 1e6 for v in values]
    if not us:
        return f"{name:22s} no answer (lost {lost})"
    return (f"{name:22s} n={len(us):5d} lost={lost:3d}  p50 {percentile(us, 50):8.1f} us  "
            f"p90 {percentile(us, 90):8.1f} us  p99 {percentile(us, 99):8.1f} us  mean {sum(us) / len(us):8.1f} us")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--interval", type=float, default=0.05, help="seconds between probes of each kind")
    p.add_argument("--probe-side", nargs=5, metavar=("PEER", "ADDRESS", "PORT", "TCP_PORT", "SECONDS"),
                   help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.probe_side:
        peer, address, port, tcp_port, seconds = args.probe_side
        probe_side(peer, address, int(port), int(tcp_port), float(seconds), args.interval)
        return
    from netns.topology import Topology

    topo = Topology(leaves=1, per_leaf=2)
    daemon = None
    try:
        topo.build()
        a, b = topo.nodes
        with tempfile.TemporaryDirectory() as tmp:
            inventory = os.path.join(tmp, "inventory.json")
            with open(inventory, "w") as f:
                json.dump(topo.inventory(), f)
            daemon = subprocess.Popen(["ip", "netns", "exec", b.ns, sys.executable, "-m", "nodehealth.cli", "daemon",
                                       "--root", machine("plain-host"), "--only", "modules", "--state-dir", tmp,
                                       "--listen", f"{b.address}:9456", "--node-name", b.name,
                                       "--probe-listen", f"{b.address}:9457", "--probe-inventory", inventory],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(3)  # the agent is up; its own probes of a are few (every 10 s)
            ping = subprocess.Popen(["ip", "netns", "exec", a.ns, "ping", "-i", str(args.interval),
                                     "-w", str(int(args.seconds)), b.address], stdout=subprocess.PIPE, text=True)
            ours = subprocess.run(["ip", "netns", "exec", a.ns, sys.executable, __file__, "--interval",
                                   str(args.interval), "--probe-side", b.name, b.address, "9457", "9459",
                                   str(args.seconds)], capture_output=True, text=True, check=True)
            ping_out = ping.communicate()[0]
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(10)
        topo.close()
    result = json.loads(ours.stdout)
    icmp, icmp_lost = ping_rtts(ping_out)
    print(f"two namespaces on one bridge (veth), {args.seconds:g}s, one probe of each kind every {args.interval:g}s,"
          " side by side")
    print(row("ping (ICMP, kernel)", icmp, icmp_lost))
    print(row("TCP connect (ours)", result["rtts"]["tcp"], result["lost"]["tcp"]))
    print(row("gRPC Ping (ours)", result["rtts"]["ping"], result["lost"]["ping"]))
    tcp, grpc_ping = (percentile([v * 1e6 for v in result["rtts"][k]], 50) for k in ("tcp", "ping"))
    base = percentile([v * 1e6 for v in icmp], 50)
    print(f"median over ping: TCP connect {tcp - base:+.1f} us, gRPC Ping {grpc_ping - base:+.1f} us")


if __name__ == "__main__":
    main()
