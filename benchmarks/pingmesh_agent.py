"""Probe agent cost at the 10,000-node, 8-rail load: 330 peers (41 nodes x 8 rails), each probed every 10 s.

Two real daemons run side by side on the same fixture, one with the probe agent and one without.
The peers are a "farm" process: a Ping service on each peer address (127.0.1.1 ...), answering
with its node's name, which also probes the measured daemon the way those peers would (a TCP
connect per peer and rail, and a Ping per peer, every interval), so the agent serves what it
would serve in the mesh. CPU comes from /proc/PID/stat over the measurement, RSS from
/proc/PID/status at its end (and its anonymous part, from smaps_rollup: what is not the libraries'
file-backed pages). Targets: at most 1 % of one core and +20 MiB over the daemon
without probes. `--compare-python PY` runs a third daemon with probes, by another checkout's
interpreter (its .venv/bin/python), as one more node the farm probes, in the same run: a change
is measured against the code before it under the same load. `--fetch json|packed|both` also
fetches each daemon's summary every window as the controller does (`?windows=6`, then `&since=`
the newest closed window it has), in that form; with both, a second daemon with probes is asked for
the packed form while the first is asked for JSON, side by side. Usage: python
benchmarks/pingmesh_agent.py [--nodes 41] [--rails 8] [--seconds 120] [--ping-all-rails]
[--compare-python PY] [--fetch none|json|packed|both]
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

from common import (
    ROOT,
    anonymous_bytes,
    free_port,
    get,
    machine,
    metric_value,
    process_cpu_seconds,
    rss_bytes,
    wait_http,
)

sys.path.insert(0, ROOT)

from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH_DEFAULTS  # noqa: E402
from nodehealth.pingmesh.fetch import FetchError, fetch_summary  # noqa: E402


def peer_address(i: int) -> str:
    return f"127.0.{1 + (i + 1) // 256}.{(i + 1) % 256}"


def farm(nodes: int, rails: int, port: int, tcp_port: int, daemon_addresses: list[str], interval: float,
         pings: list[int]) -> None:
    """The peers: a Ping service per peer address; and, towards each measured daemon, what they would
    send it each interval: a TCP connect per peer and rail and `pings[i]` Pings towards the i-th daemon
    (the peers run its version, which pings each peer every probe or every few)."""
    import asyncio
    import socket
    import struct
    import threading

    import grpc

    from nodehealth.pingmesh import agent, ping_wire

    async def serve_all() -> list:  # every peer's Ping service on one loop, not a thread each
        return [await agent.start_server(f"{peer_address(n * rails + r)}:{port}", f"peer{n:04d}", lambda *_: None)
                for n in range(nodes) for r in range(rails)]
    loop = asyncio.new_event_loop()
    servers = loop.run_until_complete(serve_all())
    threading.Thread(target=loop.run_forever, daemon=True).start()
    calls = {a: grpc.insecure_channel(f"{a}:{port}").unary_unary(ping_wire.METHOD) for a in daemon_addresses}
    assert len(servers) == nodes * rails
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    work = [(kind, a) for a, n in zip(daemon_addresses, pings) for kind in ["tcp"] * (nodes * rails) + ["ping"] * n]
    seq = 0
    while True:
        for kind, address in work:
            seq += 1
            if kind == "ping":
                calls[address].future(ping_wire.encode_request(seq, 0, "peer", b"\0" * 64), timeout=2.0)
            else:
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.settimeout(2.0)
                    s.connect_ex((address, tcp_port))
            time.sleep(interval / len(work))


def start_daemon(state: str, port: int, extra: list[str], python: str = sys.executable) -> subprocess.Popen:
    """In the state directory: `-m` puts the working directory first on the path, and a checkout there
    would be imported instead of the interpreter's own."""
    os.makedirs(state)
    return subprocess.Popen([python, "-m", "nodehealth.cli", "daemon", "--root", machine("h100-8x-cx7"),
                             "--state-dir", state, "--listen", f"127.0.0.1:{port}", "--interval", "30", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=state)


def controller(ports: dict[str, tuple[int, bool]], window: float, stop: threading.Event,
               served: dict[str, int]) -> None:
    """The controller's fetches: every window, each daemon's newest 6 windows, those it has by their start
    alone (`since`), in the form asked for; `served` counts the answers."""
    since: dict[str, float] = {}
    while not stop.wait(window - time.time() % window + 3.0):  # 3 s into each window, as the controller
        for k, (port, packed) in ports.items():
            try:
                summary = fetch_summary("127.0.0.1", port, 6, 5.0, since.get(k), packed=packed)
            except FetchError as e:
                print(f"{k}: {e}", file=sys.stderr)
                continue
            closed = [w.start for w in summary.windows if w.closed]
            if closed:
                since[k] = max(closed)
            served[k] += 1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=41, help="peer nodes (x rails = peers)")
    p.add_argument("--rails", type=int, default=8)
    p.add_argument("--ping-all-rails", action="store_true", help="a gRPC Ping on every rail, not only the first")
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--interval", type=float, default=10.0, help="seconds between probes of one peer")
    p.add_argument("--compare-ping-interval", type=float, metavar="S",
                   help="the compared checkout's seconds between Pings of one peer (default: --interval, a Ping "
                        "with every probe, as before pingmesh.ping_interval_seconds)")
    p.add_argument("--compare-python", metavar="PY", help="also a daemon with probes run by this interpreter "
                                                            "(another checkout's venv), side by side")
    p.add_argument("--fetch", choices=("none", "json", "packed", "both"), default="none",
                   help="fetch the summaries every window as the controller does, in this form")
    p.add_argument("--farm", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--probe-port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--targets", default="127.0.0.1", help=argparse.SUPPRESS)
    p.add_argument("--target-pings", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.farm:
        farm(args.nodes, args.rails, args.probe_port, args.probe_port + 1, args.targets.split(","), args.interval,
             [int(n) for n in args.target_pings.split(",")])
        return
    # The measured node's rails (and the compared one's) sit on loopback addresses of their own.
    measured = {"measured": [f"127.0.0.{r + 1}" for r in range(args.rails)]}
    if args.compare_python:
        measured["compared"] = [f"127.0.0.{args.rails + r + 1}" for r in range(args.rails)]
    if args.fetch == "both":
        measured["packed"] = [f"127.0.0.{2 * args.rails + r + 1}" for r in range(args.rails)]
    probe_port = free_port()  # and probe_port + 1 for the TCP probes
    with tempfile.TemporaryDirectory() as tmp:
        inventory = os.path.join(tmp, "inventory.json")
        # Each measured daemon listens on its first address; its other rails are probed there in vain
        # (TCP refused: answered), as before.
        nodes = [{"name": k, "leaf": "leaf0", "addresses": a} for k, a in measured.items()]
        nodes += [{"name": f"peer{n:04d}", "leaf": "leaf0",
                   "addresses": [peer_address(n * args.rails + r) for r in range(args.rails)]}
                  for n in range(args.nodes)]
        with open(inventory, "w") as f:
            json.dump({"nodes": nodes}, f)
        config = os.path.join(tmp, "config.json")
        with open(config, "w") as f:
            json.dump({"pingmesh": {"port": probe_port, "tcp_port": probe_port + 1,
                                    "probe_interval_seconds": args.interval,
                                    "ping_all_rails": args.ping_all_rails}}, f)
        pinged = args.nodes * (args.rails if args.ping_all_rails else 1)

        def pings_towards(k: str) -> int:
            """The peers' Pings towards daemon k each interval: each pings it every ping interval of k's version."""
            if k == "compared":
                every = args.compare_ping_interval or args.interval
            else:
                every = PINGMESH_DEFAULTS["ping_interval_seconds"]
            return round(pinged * args.interval / max(every, args.interval))

        farm_proc = subprocess.Popen([sys.executable, __file__, "--farm", "--nodes", str(args.nodes),
                                      "--rails", str(args.rails), "--probe-port", str(probe_port),
                                      "--interval", str(args.interval),
                                      "--targets", ",".join(a[0] for a in measured.values()),
                                      "--target-pings", ",".join(str(pings_towards(k)) for k in measured)]
                                     + (["--ping-all-rails"] if args.ping_all_rails else []),
                                     stdout=subprocess.PIPE, text=True)
        assert farm_proc.stdout.readline().strip() == "ready", "the peer farm did not start"
        ports = {k: free_port() for k in [*measured, "without"]}
        procs = {k: start_daemon(os.path.join(tmp, k), ports[k],
                                 ["--config", config, "--node-name", k, "--probe-listen", f"{a[0]}:{probe_port}",
                                  "--probe-inventory", inventory],
                                 args.compare_python if k == "compared" else sys.executable)
                 for k, a in measured.items()}
        procs["without"] = start_daemon(os.path.join(tmp, "without"), ports["without"],
                                        ["--config", config, "--node-name", "without"])
        asked = {k: (ports[k], args.fetch == "packed" or k == "packed") for k in measured if args.fetch != "none"}
        served = dict.fromkeys(asked, 0)
        stop = threading.Event()
        fetcher = threading.Thread(target=controller, args=(asked, 30.0, stop, served), daemon=True)
        try:
            for port in ports.values():
                wait_http(f"http://127.0.0.1:{port}/v1/report")
            fetcher.start()
            time.sleep(2 * args.interval)  # every peer probed once: channels open, steady state
            cpu0 = {k: process_cpu_seconds(p.pid) for k, p in procs.items()}
            t0 = time.monotonic()
            time.sleep(args.seconds)
            elapsed = time.monotonic() - t0
            cpu = {k: process_cpu_seconds(p.pid) - cpu0[k] for k, p in procs.items()}
            rss = {k: rss_bytes(p.pid) / 2**20 for k, p in procs.items()}
            anon = {k: anonymous_bytes(p.pid) / 2**20 for k, p in procs.items()}
            text = get(f"http://127.0.0.1:{ports['measured']}/metrics").decode()
        finally:
            stop.set()
            for proc in (*procs.values(), farm_proc):
                proc.terminate()
                proc.wait(10)
    sent = {k: metric_value(text, "nodehealth_pingmesh_probes_total", peer_group="same-leaf", probe=k) or 0
            for k in ("ping", "tcp")}
    lost = {k: metric_value(text, "nodehealth_pingmesh_lost_total", peer_group="same-leaf", probe=k) or 0
            for k in ("ping", "tcp")}
    skipped = metric_value(text, "nodehealth_pingmesh_probes_skipped_total") or 0
    print(f"peers {args.nodes} nodes x {args.rails} rails; every {args.interval:g}s a TCP connect to each peer "
          f"address, and every {PINGMESH_DEFAULTS['ping_interval_seconds']:g}s a gRPC Ping to {pinged} of them (the "
          f"same towards this node; towards the compared one, {pings_towards('compared')} every {args.interval:g}s); "
          f"{elapsed:.0f}s, side by side")
    names = {"measured": "with probes", "compared": "compared", "packed": "packed", "without": "without probes"}
    if asked:
        print("the controller's fetches every 30 s: " + ", ".join(
            f"{names[k]} {'packed' if packed else 'json'} {served[k]}" for k, (_, packed) in asked.items()))
    for k in procs:
        print(f"daemon {names[k]:14s} CPU {cpu[k] / elapsed * 100:5.2f} % of a core   RSS {rss[k]:6.1f} MiB "
              f"(anonymous {anon[k]:5.1f} MiB)")
    for k in measured:
        print(f"probe agent{f' ({names[k]})' if k != 'measured' else ''}: "
              f"+{(cpu[k] - cpu['without']) / elapsed * 100:.2f} % of a core (target <= 1 %), "
              f"+{rss[k] - rss['without']:.1f} MiB (target <= 20 MiB; anonymous +{anon[k] - anon['without']:.1f} MiB)")
    print(f"sent ping {sent['ping']:.0f} (lost {lost['ping']:.0f}), tcp {sent['tcp']:.0f} (lost {lost['tcp']:.0f}), "
          f"skipped {skipped:.0f}")


if __name__ == "__main__":
    main()
