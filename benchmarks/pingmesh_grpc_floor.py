"""The floor under the pingmesh agent's gRPC Pings: gRPC Python's own work for them, and nothing of ours.

At the agent benchmark's load (benchmarks/pingmesh_agent.py: 41 peers, each pinged every 10 s on its
first shared rail, and as many Pings from them) an agent sends about four Pings a second and answers
as many. This process does only that: the agent's Ping service (nodehealth.pingmesh.agent, which does
nothing but echo) answers, and a channel per peer calls it at the same rate, spaced evenly, as the
prober does (a future and a callback); both ends are in this process, so its CPU is one Ping sent and
one answered, per Ping. With benchmarks/pingmesh_tcp_floor.py, what the agent cannot cost less than.

    python benchmarks/pingmesh_grpc_floor.py [--seconds 40] [--rate 4.1] [--peers 41]
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

from common import ROOT, cpu_seconds, free_port

sys.path.insert(0, ROOT)

from nodehealth.pingmesh import agent, ping_wire  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--rate", type=float, default=4.1, help="Pings a second (each sent and answered here)")
    p.add_argument("--peers", type=int, default=41, help="channels, one per peer, taken in turn")
    args = p.parse_args()
    import grpc

    address = f"127.0.0.6:{free_port()}"
    server = agent.Agent(address, "peer")
    server.start()
    # one connection per channel, as towards peers on other nodes (gRPC would share one between like channels)
    channels = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(args.peers)]
    calls = [c.unary_unary(ping_wire.METHOD, response_deserializer=ping_wire.decode_reply, _registered_method=True)
             for c in channels]
    for call in calls:  # every connection up before the count starts
        call(ping_wire.encode_request(1, 1, "prober"), timeout=10)
    answered, lock = [0], threading.Lock()

    def done(f) -> None:
        if f.exception() is None:
            with lock:
                answered[0] += 1
    count = int(args.seconds * args.rate)
    start, cpu0 = time.monotonic(), cpu_seconds()
    for i in range(count):
        calls[i % len(calls)].future(ping_wire.encode_request(i + 2, time.monotonic_ns(), "prober", b"\0" * 64),
                                     timeout=5).add_done_callback(done)
        time.sleep(max(0.0, start + (i + 1) / args.rate - time.monotonic()))
    while answered[0] < count and time.monotonic() - start < args.seconds + 5:
        time.sleep(0.01)
    elapsed, cpu = time.monotonic() - start, cpu_seconds() - cpu0
    for c in channels:
        c.close()
    server.stop(0)
    print(f"{answered[0]} of {count} Pings answered, {count / elapsed:.1f} a second, each sent and answered in this "
          f"process: {cpu / elapsed * 1000:.2f} ms/s of CPU ({cpu / elapsed * 100:.2f} % of a core), "
          f"{cpu / max(1, answered[0]) * 1e6:.0f} us a Ping")


if __name__ == "__main__":
    main()
