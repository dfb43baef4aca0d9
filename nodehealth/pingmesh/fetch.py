"""The one client of an agent's `/v1/pingmesh`, for the controller and for `pingmesh analyze`.

A summary comes from another node: at most stats.MAX_SUMMARY_BYTES of it are read, and the whole
exchange (connect, request, status line, headers, body) fits in `timeout` seconds: every read waits
only for what is left of it, so an agent that drips its answer, its head included, is cut off too.
With the mesh's identity (tls.enabled), the connection presents its certificate and the agent's must
name the node asked for: an agent (or anything at its address) cannot answer for another node.
"""
from __future__ import annotations

import http.client
import io
import socket
import ssl
import time
import urllib.parse

from nodehealth.pingmesh import packed as packed_form
from nodehealth.pingmesh import stats
from nodehealth.tls.identity import Identity


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each allowed only what is left until `deadline` (http.client reads the status
    line and headers a line at a time, and a per-read timeout restarts with every byte)."""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class _DeadlineSocket:
    """What http.client.HTTPResponse needs of a socket: a file to read the answer from, under the deadline."""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self.sock, self.deadline))


class FetchError(Exception):
    """An agent whose summary could not be used; `reason` is a bounded metric label."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def fetch(url: str, timeout: float, tls: Identity | None = None, name: str = "", token: bytes | None = None) -> bytes:
    """The body of `GET url` (http or https): at most stats.MAX_SUMMARY_BYTES, all of it within
    `timeout` seconds; with `tls`, over mutual TLS to a server whose certificate names `name`; with
    `token`, carrying it as a bearer token (`daemon.token_file`, when the agents want one).
    Raises FetchError: http_error, too_large, timeout, unreachable or tls."""
    return fetch_typed(url, timeout, tls, name, token)[0]


def fetch_typed(url: str, timeout: float, tls: Identity | None = None, name: str = "",
                token: bytes | None = None) -> tuple[bytes, str]:
    """fetch(), and the answer's media type (its Content-Type without parameters, lowercase)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    deadline = time.monotonic() + timeout
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn = connection(parts.hostname or "", parts.port, timeout=timeout)
        response = None
        try:
            conn.connect()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            conn.sock.settimeout(left)
            if tls is not None:
                conn.sock = tls.client_context().wrap_socket(conn.sock, server_hostname=name)
            headers = {"Accept": "application/json"}
            if token:
                headers["Authorization"] = "Bearer " + token.decode("latin-1")
            conn.request("GET", path, headers=headers)
            response = http.client.HTTPResponse(_DeadlineSocket(conn.sock, deadline), method="GET")
            response.begin()
            if response.status != 200:
                raise FetchError("http_error", f"HTTP {response.status} {response.reason}")
            length = response.getheader("Content-Length")
            if length and length.isdigit() and int(length) > stats.MAX_SUMMARY_BYTES:
                raise FetchError("too_large", f"a summary of {length} bytes, more than {stats.MAX_SUMMARY_BYTES}")
            chunks, size = [], 0
            while True:
                chunk = response.read1(64 * 1024)
                if not chunk:
                    break
                size += len(chunk)
                if size > stats.MAX_SUMMARY_BYTES:
                    raise FetchError("too_large", f"a summary of more than {stats.MAX_SUMMARY_BYTES} bytes")
                chunks.append(chunk)
            media = (response.getheader("Content-Type") or "").partition(";")[0].strip().lower()
        finally:
            if response is not None:
                response.close()
            conn.close()
    except TimeoutError:
        raise FetchError("timeout", f"no complete answer within {timeout:g} s") from None
    except ssl.SSLError as e:  # no certificate of the CA, or not the node's: its answer is not the node's
        raise FetchError("tls", f"TLS: {e.reason or e}") from None
    except (OSError, ValueError, http.client.HTTPException) as e:  # ValueError: a port that is no number
        raise FetchError("unreachable", f"{type(e).__name__}: {e}") from None
    return b"".join(chunks), media


def summary_url(address: str, port: int, windows: int, since: float | None = None, packed: bool = False) -> str:
    """An agent's `/v1/pingmesh` asking for its newest `windows` windows, only those after `since`
    in full (see Pingmesh.summary); with `packed`, in the packed form (an older agent answers JSON)."""
    host = f"[{address}]" if ":" in address else address
    query = f"windows={windows}" if since is None else f"windows={windows}&since={since!r}"
    if packed:
        query = f"{packed_form.QUERY}&{query}"
    return f"http://{host}:{port}/v1/pingmesh?{query}"


def fetch_summary(address: str, port: int, windows: int, timeout: float, since: float | None = None,
                  tls: Identity | None = None, name: str = "", token: bytes | None = None,
                  packed: bool = False) -> stats.Summary:
    """One agent's summary, validated by stats.loads_summary or packed.loads, by the form it came in
    (FetchError "invalid" when it is not one). With `since`, the windows up to that start may come
    without their peers (see Pingmesh.summary); with `tls`, only from the agent whose certificate names
    `name`. With `packed`, the packed form is asked for: an agent that does not know it ignores the
    question and answers JSON, read as ever (a rolling upgrade)."""
    summary, arrays = fetch_parsed(address, port, windows, timeout, since, tls, name, token, packed)
    try:
        packed_form.check(arrays)
    except stats.SummaryError as e:
        raise FetchError("invalid", str(e)) from None
    return summary


def fetch_parsed(address: str, port: int, windows: int, timeout: float, since: float | None = None,
                 tls: Identity | None = None, name: str = "", token: bytes | None = None,
                 packed: bool = False) -> tuple[stats.Summary, list[packed_form.Arrays]]:
    """fetch_summary() without checking a packed answer's arrays: they come with it, for
    packed.check_each() on many answers at once (a JSON answer comes whole, with none)."""
    data, media = fetch_typed(summary_url(address, port, windows, since, packed), timeout, tls, name, token)
    try:
        if media == packed_form.CONTENT_TYPE:
            return packed_form.parse(data, stubs=since is not None)
        return stats.loads_summary(data, stubs=since is not None), []
    except stats.SummaryError as e:
        raise FetchError("invalid", str(e)) from None
