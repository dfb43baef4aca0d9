"""One run of the hook: a command with the event on its stdin, or a POST of the event; each bounded.

A command runs from an argv list (no shell ever sees the finding), in a session of its own so that the
whole process group is killed at its deadline or at shutdown; its output is read as it comes and only
the first OUTPUT_KEPT bytes are kept for the log. A POST's whole exchange (connect, send, the answer's
status, headers and body) ends at its deadline: a timer cuts the socket, so a receiver that answers a
byte at a time cannot hold a worker.
"""
from __future__ import annotations

import http.client
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from dataclasses import dataclass

OUTPUT_KEPT = 4096  # of a command's output or a receiver's answer, for the log and the Event
KILL_GRACE_SECONDS = 1.0  # SIGTERM, then SIGKILL this much later
OUTCOMES = ("ok", "failed", "timeout", "error")


@dataclass(frozen=True)
class Outcome:
    result: str  # ok, failed (exit status or HTTP status), timeout, error (could not run or connect)
    detail: str  # what a person reads: "exit 0", "HTTP 503 Service Unavailable", "no answer in 30 s"
    seconds: float
    output: str = ""  # the first OUTPUT_KEPT bytes of what the command printed or the receiver answered


def run_command(argv: list[str], data: bytes, timeout: float, stop: threading.Event) -> Outcome:
    """Run `argv` with `data` on stdin until it exits, `timeout` passes or `stop` is set."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    except OSError as e:
        return Outcome("error", f"cannot run {argv[0]}: {e.strerror or e}", time.monotonic() - started)
    deadline = started + timeout
    kept = bytearray()
    sel = selectors.DefaultSelector()
    for f in (proc.stdin, proc.stdout):
        os.set_blocking(f.fileno(), False)
    sel.register(proc.stdout, selectors.EVENT_READ)
    pending = memoryview(data)
    if pending:
        sel.register(proc.stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    try:
        while sel.get_map() and time.monotonic() < deadline and not stop.is_set():
            for key, _ in sel.select(min(0.1, max(0.0, deadline - time.monotonic()))):
                if key.fileobj is proc.stdin:
                    try:
                        pending = pending[os.write(proc.stdin.fileno(), pending[:65536]):]
                    except (BrokenPipeError, BlockingIOError) as e:
                        pending = pending[:0] if isinstance(e, BrokenPipeError) else pending
                    if not pending:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                else:
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    if not chunk:
                        sel.unregister(proc.stdout)
                    elif len(kept) < OUTPUT_KEPT:
                        kept += chunk[:OUTPUT_KEPT - len(kept)]
        code = _wait(proc, deadline, stop)
    finally:
        sel.close()
        for f in (proc.stdin, proc.stdout):
            if not f.closed:
                f.close()
    seconds = time.monotonic() - started
    output = kept.decode(errors="replace")
    if code is None:
        why = "stopped at shutdown" if stop.is_set() else f"no exit in {timeout:g} s"
        return Outcome("timeout", f"{why}; killed", seconds, output)
    if code == 0:
        return Outcome("ok", "exit 0", seconds, output)
    detail = f"killed by signal {-code}" if code < 0 else f"exit {code}"
    return Outcome("failed", detail, seconds, output)


def _wait(proc: subprocess.Popen, deadline: float, stop: threading.Event) -> int | None:
    """The exit status once it exits by the deadline; None after killing its whole group (it did not)."""
    while time.monotonic() < deadline and not stop.is_set():
        try:
            return proc.wait(min(0.1, max(0.01, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            continue
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(KILL_GRACE_SECONDS)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()
    return None


def post(url: str, data: bytes, timeout: float) -> Outcome:
    """POST `data` as JSON to `url`; the whole exchange within `timeout` seconds."""
    started = time.monotonic()
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    cut = threading.Event()
    conn = None
    timer = None
    try:
        conn = connection(parts.hostname or "", parts.port, timeout=timeout)
        conn.connect()
        timer = threading.Timer(max(0.0, timeout - (time.monotonic() - started)), _cut, (conn.sock, cut))
        timer.start()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json",
                                                        "User-Agent": "nodehealth-hook"})
        response = conn.getresponse()
        answer = response.read(OUTPUT_KEPT)
        seconds = time.monotonic() - started
        detail = f"HTTP {response.status} {response.reason}".strip()
        if cut.is_set():
            return Outcome("timeout", f"no whole answer in {timeout:g} s", seconds)
        return Outcome("ok" if 200 <= response.status < 300 else "failed", detail, seconds,
                       answer.decode(errors="replace"))
    except (OSError, http.client.HTTPException, ValueError) as e:  # ValueError: a port that is no number
        seconds = time.monotonic() - started
        if cut.is_set() or isinstance(e, (TimeoutError, socket.timeout)):
            return Outcome("timeout", f"no whole answer in {timeout:g} s", seconds)
        return Outcome("error", f"{type(e).__name__}: {e}", seconds)
    finally:
        if timer is not None:
            timer.cancel()
        if conn is not None:
            conn.close()


def _cut(sock: socket.socket | None, cut: threading.Event) -> None:
    """The deadline: shut the socket down, which ends any read or write blocked on it at once."""
    cut.set()
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
