"""netcheck's TCP stream test: an agent on every node, and the coordinator that runs the rounds.

The agent (`nodehealth netcheck serve`) answers one JSON line per connection on its port:
- `{"op": "hello"}`: its name and the data address its peers stream to;
- `{"op": "send", "to": "ADDR:PORT", "seconds": S}`: stream to that peer's agent for S seconds and
  answer the Gb/s the peer acknowledged (or the error);
- `{"op": "sink"}`: count what arrives until the sender closes, then answer the byte count.
Requests come from the network, so a line is bounded (MAX_LINE), the duration is capped, and at
most MAX_STREAMS tests run at once. The coordinator (`nodehealth netcheck --hosts ...`) plans the
rounds with nodehealth.net.netcheck and runs each round's pairs concurrently.

This is labelled TCP everywhere: it measures the hosts' TCP path, not RDMA.
"""
from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from nodehealth.net.netcheck import Netcheck, PairResult, waves

MAX_LINE = 4096
MAX_SECONDS = 60.0
MAX_STREAMS = 8
CHUNK = 1 << 20
CONNECT_TIMEOUT = 3.0


class StreamError(Exception):
    pass


def _read_line(sock: socket.socket, deadline: float) -> tuple[dict, int]:
    """One JSON object line, and how many bytes after it arrived with it (a sink's first data)."""
    buf = b""
    while b"\n" not in buf[:MAX_LINE]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StreamError("timed out waiting for an answer")
        sock.settimeout(left)
        chunk = sock.recv(CHUNK)
        if not chunk:
            raise StreamError("connection closed before a whole line")
        buf += chunk
        if len(buf) > MAX_LINE and b"\n" not in buf[:MAX_LINE]:
            raise StreamError(f"a line longer than {MAX_LINE} bytes")
    line, rest = buf.split(b"\n", 1)
    try:
        msg = json.loads(line)
    except ValueError:
        raise StreamError("not a JSON line") from None
    if not isinstance(msg, dict):
        raise StreamError("not a JSON object")
    return msg, len(rest)


def _send_line(sock: socket.socket, msg: dict) -> None:
    sock.sendall(json.dumps(msg).encode() + b"\n")


def request(endpoint: str, msg: dict, timeout: float) -> dict:
    """One request to an agent at HOST:PORT and its answer."""
    host, port = split_endpoint(endpoint)
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=min(CONNECT_TIMEOUT, timeout)) as s:
            _send_line(s, msg)
            return _read_line(s, deadline)[0]
    except OSError as e:
        raise StreamError(f"{endpoint}: {e.strerror or e}") from None


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not HOST:PORT: {endpoint!r}")
    return host.strip("[]"), int(port)


def stream_to(peer: str, seconds: float) -> float:
    """Stream to a peer agent's sink for `seconds`; the Gb/s it acknowledged receiving."""
    host, port = split_endpoint(peer)
    data = bytes(CHUNK)
    with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT) as s:
        _send_line(s, {"op": "sink"})
        s.settimeout(max(1.0, seconds))
        start = time.monotonic()
        end = start + seconds
        while time.monotonic() < end:
            s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        answer = _read_line(s, time.monotonic() + max(5.0, seconds))[0]
        elapsed = time.monotonic() - start
    received = answer.get("bytes")
    if not isinstance(received, int) or received < 0:
        raise StreamError(f"{peer}: the sink's answer has no byte count")
    return received * 8 / elapsed / 1e9


@dataclass
class AgentConfig:
    name: str
    data_address: str  # ADDR:PORT peers stream to


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: Agent = self.server  # type: ignore[assignment]
        sock: socket.socket = self.request
        try:
            msg, extra = _read_line(sock, time.monotonic() + CONNECT_TIMEOUT)
            op = msg.get("op")
            if op == "hello":
                _send_line(sock, {"name": server.cfg.name, "data": server.cfg.data_address, "method": "tcp"})
            elif op == "sink":
                _send_line(sock, {"bytes": extra + _drain(sock)})
            elif op == "send":
                _send_line(sock, server.send(msg))
            else:
                _send_line(sock, {"error": f"unknown op {str(op)[:40]!r}"})
        except (StreamError, OSError) as e:
            try:
                _send_line(sock, {"error": str(e)[:200]})
            except OSError:
                pass


def _drain(sock: socket.socket) -> int:
    total = 0
    sock.settimeout(MAX_SECONDS + CONNECT_TIMEOUT)  # a sender that stops sending is dropped
    while chunk := sock.recv(CHUNK):
        total += len(chunk)
    return total


class Agent(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, listen: tuple[str, int], cfg: AgentConfig):
        super().__init__(listen, _Handler)
        self.cfg = cfg
        self._slots = threading.BoundedSemaphore(MAX_STREAMS)

    def send(self, msg: dict) -> dict:
        seconds, to = msg.get("seconds"), msg.get("to")
        if not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_SECONDS or not isinstance(to, str):
            return {"error": f"a send needs 'to' (ADDR:PORT) and 0 < seconds <= {MAX_SECONDS:g}"}
        if not self._slots.acquire(blocking=False):
            return {"error": "busy: too many tests at once"}
        try:
            return {"gbps": stream_to(to, float(seconds))}
        except (StreamError, OSError, ValueError) as e:
            return {"error": f"{to}: {getattr(e, 'strerror', None) or e}"}
        finally:
            self._slots.release()


@dataclass(frozen=True)
class Host:
    endpoint: str  # where the coordinator reaches its agent
    name: str
    data: str  # where peers stream to


def hello(endpoints: Sequence[str], timeout: float) -> tuple[list[Host], list[tuple[str, str]]]:
    """Ask every agent who it is; the unreachable ones are returned with the reason."""
    hosts, problems = [], []
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(endpoints)))) as pool:
        for ep, answer in zip(endpoints, pool.map(lambda e: _try(request, e, {"op": "hello"}, timeout), endpoints)):
            if isinstance(answer, str):
                problems.append((ep, answer))
            elif isinstance(answer.get("name"), str) and isinstance(answer.get("data"), str):
                hosts.append(Host(ep, answer["name"][:200], answer["data"][:200]))
            else:
                problems.append((ep, "its hello has no name or data address"))
    return hosts, problems


def _try(fn: Callable, *args) -> dict | str:
    try:
        return fn(*args)
    except (StreamError, ValueError) as e:
        return str(e)


def run_pair(a: Host, b: Host, seconds: float) -> PairResult:
    answer = _try(request, a.endpoint, {"op": "send", "to": b.data, "seconds": seconds}, seconds + 3 * CONNECT_TIMEOUT)
    if isinstance(answer, str):
        return PairResult(0, a.name, b.name, False, None, answer)
    gbps = answer.get("gbps")
    if isinstance(gbps, (int, float)) and gbps > 0:
        return PairResult(0, a.name, b.name, True, float(gbps))
    return PairResult(0, a.name, b.name, False, None, str(answer.get("error", "no bandwidth in the answer"))[:200])


def run_rounds(nc: Netcheck, hosts: dict[str, Host], seconds: float, between: float = 0.0) -> None:
    """Every round's pairs run at once (waves only where a node is in two tests)."""
    with ThreadPoolExecutor(max_workers=min(256, max(1, len(hosts)))) as pool:
        while pairs := nc.next_round():
            results: list[PairResult] = []
            for wave in waves(pairs):
                results += pool.map(lambda p: run_pair(hosts[p[0]], hosts[p[1]], seconds), wave)
            nc.record(results)
            if between:
                time.sleep(between)
