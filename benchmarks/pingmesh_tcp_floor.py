"""The floor under the pingmesh agent's TCP probes on loopback: the kernel's work for the connects alone.

On loopback both ends of a connect (SYN, SYN-ACK, ACK, the RST that closes it) run in the connecting
thread, so benchmarks/pingmesh_agent.py charges the agent for its peers' half too. This does only that
work, at about the agent benchmark's rate (30 connects a second out and the same accepted, in ticks
as the prober's loop: 0.1 s before its tick followed the probe interval, 0.5 s now): connect, read
TCP_INFO, close with RST, accept and close; nothing else. With --defer-accept the listener is the
agent's (TCP_DEFER_ACCEPT): the resets end the connections in the kernel and there is nothing to accept.

    python benchmarks/pingmesh_tcp_floor.py [--seconds 40] [--rate 30] [--tick 0.1] [--defer-accept]
"""
from __future__ import annotations

import argparse
import selectors
import socket
import struct
import time

from common import cpu_seconds


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--rate", type=float, default=30.0, help="connects a second")
    p.add_argument("--tick", type=float, default=0.1, help="seconds between two turns of the loop")
    p.add_argument("--defer-accept", action="store_true", help="the listener as the agent's (TCP_DEFER_ACCEPT)")
    args = p.parse_args()
    listener = socket.socket()
    if args.defer_accept:
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 1)
    listener.bind(("127.0.0.5", 0))
    listener.listen(1024)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    start, cpu0, made, owed = time.monotonic(), cpu_seconds(), 0, 0.0
    while time.monotonic() - start < args.seconds:
        owed += args.rate * args.tick
        while owed >= 1:
            owed -= 1
            s = socket.socket()
            s.setblocking(False)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.connect_ex(listener.getsockname())
            sel.register(s, selectors.EVENT_WRITE)
            made += 1
        time.sleep(args.tick)
        for key, _ in sel.select(0):
            key.fileobj.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
            sel.unregister(key.fileobj)
            key.fileobj.close()
        while True:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                break
            conn.close()
    elapsed, cpu = time.monotonic() - start, cpu_seconds() - cpu0
    print(f"{'deferred ' if args.defer_accept else ''}{made / elapsed:.0f} connects/s on loopback in "
          f"{args.tick:g} s ticks: {cpu / elapsed * 1000:.2f} ms/s of CPU ({cpu / elapsed * 100:.2f} % of a core)")


if __name__ == "__main__":
    main()
