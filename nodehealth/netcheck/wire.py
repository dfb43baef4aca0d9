"""netcheck's wire: one JSON object a line, between the coordinator and the agents and between agents.

Every read has a deadline for the whole line, not per recv, and a bound on its length: what
arrives comes from the network.

With the mesh's identity (`tls`, tls.enabled) every connection is mutual TLS from the cluster CA,
and where the caller knows whom it means to reach (`expect`: a node's name) the peer's certificate
must name it. A stream's bulk data then goes in the clear (`plain`): its request and the sink's
`ready` went under TLS, and encrypting the data would measure this node's CPU, not the link.
"""
from __future__ import annotations

import ipaddress
import json
import socket
import ssl
import time
from typing import Any

from nodehealth.tls.identity import peer_names

MAX_LINE = 4096
CONNECT_TIMEOUT = 3.0


class StreamError(Exception):
    pass


def read_line(sock: socket.socket, deadline: float, limit: int = MAX_LINE) -> tuple[dict, bytes]:
    """One JSON object line, and the bytes after it that arrived with it."""
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StreamError("timed out waiting for an answer")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:  # TimeoutError from Python 3.10
            raise StreamError("timed out waiting for an answer") from None
        if not chunk:
            raise StreamError("connection closed before a whole line")
        buf += chunk
        if len(buf) > limit and b"\n" not in buf[:limit]:
            raise StreamError(f"a line longer than {limit} bytes")
    line, rest = buf.split(b"\n", 1)
    return parse(line), rest


def parse(line: bytes) -> dict:
    try:
        msg = json.loads(line)
    except ValueError:
        raise StreamError("not a JSON line") from None
    if not isinstance(msg, dict):
        raise StreamError("not a JSON object")
    return msg


def send_line(sock: socket.socket, msg: dict) -> None:
    sock.sendall(json.dumps(msg).encode() + b"\n")


def connect(endpoint: str, timeout: float, source: str | None = None, tls: Any = None,
            expect: str | None = None) -> socket.socket:
    """A connection to HOST:PORT from the address `source` (when it is one: the peer admits by it);
    with `tls` (an Identity), mutual TLS to a peer whose certificate names `expect` (when given)."""
    host, port = split_endpoint(endpoint)
    bind = (source, 0) if source and is_address(source) and not ipaddress.ip_address(source).is_unspecified else None
    try:
        s = socket.create_connection((host, port), timeout=timeout, source_address=bind)
    except OSError as e:
        raise StreamError(f"connect to {endpoint}: {e.strerror or e}") from None
    if tls is None:
        return s
    try:
        s = tls.client_context(check_name=False).wrap_socket(s)
    except OSError as e:  # ssl.SSLError among them: no certificate of the CA
        s.close()
        raise StreamError(f"TLS to {endpoint}: {getattr(e, 'reason', None) or e}") from None
    if expect is not None and expect not in (names := peer_names(s)):
        s.close()
        raise StreamError(f"the agent at {endpoint} is not {expect}: its certificate names "
                          f"{', '.join(names) or 'nobody'}")
    return s


def plain(sock: socket.socket) -> socket.socket:
    """The connection without its TLS (both ends call this at the same point of their exchange)."""
    return sock.unwrap() if isinstance(sock, ssl.SSLSocket) else sock


def request(endpoint: str, msg: dict, timeout: float, limit: int = MAX_LINE, source: str | None = None,
            tls: Any = None, expect: str | None = None) -> dict:
    """One request to an agent at HOST:PORT and its answer, all within `timeout` (see connect())."""
    deadline = time.monotonic() + timeout
    with connect(endpoint, min(CONNECT_TIMEOUT, timeout), source, tls, expect) as s:
        try:
            s.settimeout(max(0.001, deadline - time.monotonic()))
            send_line(s, msg)
            return read_line(s, deadline, limit)[0]
        except OSError as e:
            raise StreamError(f"{endpoint}: {e.strerror or e}") from None


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not HOST:PORT: {endpoint!r}")
    return host.strip("[]"), int(port)


def endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
