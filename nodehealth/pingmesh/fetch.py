"""The one client of an agent's `/v1/pingmesh`, for the controller and for `pingmesh analyze`.

A summary comes from another node: at most stats.MAX_SUMMARY_BYTES of it are read, and the whole
exchange (connect, request, every read) fits in `timeout` seconds, so a slow drip is cut off too.
"""
from __future__ import annotations

import http.client
import time
import urllib.parse

from nodehealth.pingmesh import stats


class FetchError(Exception):
    """An agent whose summary could not be used; `reason` is a bounded metric label."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def fetch(url: str, timeout: float) -> bytes:
    """The body of `GET url` (http or https): at most stats.MAX_SUMMARY_BYTES, all of it within
    `timeout` seconds. Raises FetchError: http_error, too_large, timeout or unreachable."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    deadline = time.monotonic() + timeout
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn = connection(parts.hostname or "", parts.port, timeout=timeout)
        try:
            conn.request("GET", path, headers={"Accept": "application/json"})
            sock = conn.sock  # the response reads from it even once the connection lets go of it
            response = conn.getresponse()
            if response.status != 200:
                raise FetchError("http_error", f"HTTP {response.status} {response.reason}")
            length = response.getheader("Content-Length")
            if length and length.isdigit() and int(length) > stats.MAX_SUMMARY_BYTES:
                raise FetchError("too_large", f"a summary of {length} bytes, more than {stats.MAX_SUMMARY_BYTES}")
            chunks, size = [], 0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FetchError("timeout", f"no complete answer within {timeout:g} s")
                sock.settimeout(left)
                chunk = response.read1(64 * 1024)
                if not chunk:
                    break
                size += len(chunk)
                if size > stats.MAX_SUMMARY_BYTES:
                    raise FetchError("too_large", f"a summary of more than {stats.MAX_SUMMARY_BYTES} bytes")
                chunks.append(chunk)
        finally:
            conn.close()
    except TimeoutError:
        raise FetchError("timeout", f"no complete answer within {timeout:g} s") from None
    except (OSError, ValueError, http.client.HTTPException) as e:  # ValueError: a port that is no number
        raise FetchError("unreachable", f"{type(e).__name__}: {e}") from None
    return b"".join(chunks)


def summary_url(address: str, port: int, windows: int, since: float | None = None) -> str:
    """An agent's `/v1/pingmesh` asking for its newest `windows` windows, only those after `since`
    in full (see Pingmesh.summary)."""
    host = f"[{address}]" if ":" in address else address
    query = f"windows={windows}" if since is None else f"windows={windows}&since={since!r}"
    return f"http://{host}:{port}/v1/pingmesh?{query}"


def fetch_summary(address: str, port: int, windows: int, timeout: float, since: float | None = None) -> stats.Summary:
    """One agent's summary, validated by stats.loads_summary (FetchError "invalid" when it is not one).
    With `since`, the windows up to that start may come without their peers (see Pingmesh.summary)."""
    data = fetch(summary_url(address, port, windows, since), timeout)
    try:
        return stats.loads_summary(data, stubs=since is not None)
    except stats.SummaryError as e:
        raise FetchError("invalid", str(e)) from None
