"""netcheck's TCP test: one agent streams to another's sink for a fixed time.

The sender measures what the receiver's TCP acknowledged within the test's time (the kernel's
tcp_info), then ends the connection with a reset: a slow link is measured as slow, not waited for.
Blocking on whole writes instead would let one 1 MiB write outlast the test on a 2 Mbit/s link
(4 s), and the data still queued at the end would take as long again to drain. tcp_info also tells
how many segments were sent again: loss that TCP recovered from, which is evidence in itself.

The sink answers `ready` before the stream starts (the sender sends nothing to an address that is
not a willing sink) and counts what arrives until the sender ends or its deadline passes.
"""
from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

from nodehealth.netcheck.wire import CONNECT_TIMEOUT, StreamError, connect, plain, read_line, send_line

CHUNK = 1 << 20
SINK_SLACK = CONNECT_TIMEOUT  # a sink outlives its test this long, then drops a sender that did not stop
# struct tcp_info (linux/tcp.h): tcpi_total_retrans, tcpi_bytes_acked (Linux 4.1) and tcpi_segs_out (4.2)
_TCP_INFO_LEN, _RETRANS, _ACKED, _SEGS_OUT = 144, 100, 120, 136


@dataclass(frozen=True)
class Measured:
    gbps: float
    retransmitted: float | None  # the fraction of segments sent again


def tcp_counts(sock: socket.socket) -> tuple[int, int, int]:
    """Bytes the peer acknowledged, segments sent, segments sent again, so far."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    if len(raw) < _SEGS_OUT + 4:
        raise StreamError("this kernel's TCP_INFO has no byte counts (Linux 4.2 or later)")
    return (struct.unpack_from("=Q", raw, _ACKED)[0], struct.unpack_from("=I", raw, _SEGS_OUT)[0],
            struct.unpack_from("=I", raw, _RETRANS)[0])


def stream_to(peer: str, seconds: float, source: str | None = None, request: dict | None = None,
              tls: Any = None, expect: str | None = None) -> Measured:
    """Stream to the sink at `peer` for `seconds`; what its TCP acknowledged in that time. With
    `tls`, the request and the sink's answer go under mutual TLS (to the node `expect`), the data not."""
    with connect(peer, CONNECT_TIMEOUT, source, tls, expect) as s:
        try:
            send_line(s, {**(request or {}), "op": "sink", "seconds": seconds})
            answer = read_line(s, time.monotonic() + CONNECT_TIMEOUT)[0]
            if answer.get("ready") is True:
                s = plain(s)
        except (StreamError, OSError) as e:
            raise StreamError(f"no sink at {peer}: {getattr(e, 'strerror', None) or e}") from None
        if answer.get("ready") is not True:
            raise StreamError(f"the sink at {peer} refused: {str(answer.get('error'))[:200]}")
        data = memoryview(bytes(CHUNK))
        acked0 = tcp_counts(s)[0]
        start = time.monotonic()
        end = start + seconds
        try:
            while (left := end - time.monotonic()) > 0:
                s.settimeout(left)
                try:
                    s.send(data)
                except socket.timeout:  # TimeoutError from Python 3.10
                    break
        except OSError as e:
            raise StreamError(f"the stream to {peer} broke after {time.monotonic() - start:.2g} s: "
                              f"{e.strerror or e}") from None
        acked, segs, retrans = tcp_counts(s)
        elapsed = time.monotonic() - start
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    if acked <= acked0:
        raise StreamError(f"{peer} acknowledged nothing in {seconds:g} s")
    # segments sent again over the whole connection: a lost handshake or `ready` is loss too
    return Measured((acked - acked0) * 8 / elapsed / 1e9, retrans / segs if segs > 0 else None)


def sink(sock: socket.socket, seconds: float, buf: bytearray | None = None) -> int:
    """Say ready, then count what arrives until the sender ends or `seconds` and the slack pass."""
    send_line(sock, {"ready": True})
    deadline = time.monotonic() + seconds + SINK_SLACK
    sock.settimeout(CONNECT_TIMEOUT)
    sock = plain(sock)
    buf = buf or bytearray(CHUNK)
    total = 0
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            n = sock.recv_into(buf)
        except (socket.timeout, ConnectionResetError):
            break
        if not n:
            break
        total += n
    return total
