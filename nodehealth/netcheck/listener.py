"""The agent's listener: a connection is bounded before it costs a thread.

One thread accepts and reads each connection's request line without blocking, so an idle or
dripping client costs a file descriptor for at most LINE_SECONDS, never a thread; past MAX_PENDING
waiting connections the oldest is dropped to make room. A connection from an address the agent
does not admit is closed at once, unread. The connections held at once are capped below the
process's descriptor limit, with RESERVE_FDS kept for the agent's own work (its tests' connections,
the RDMA server, files). A complete request goes to `dispatch`, which starts its work on a thread
it bounds per kind of request, or answers busy. With `tls` (the mesh's identity), a connection's
handshake is stepped by the same thread under the same deadline, and one without a certificate of
the cluster CA is closed; the request carries the names its certificate proves.
"""
from __future__ import annotations

import logging
import os
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nodehealth.netcheck.wire import MAX_LINE, StreamError, parse
from nodehealth.tls.identity import peer_names
from nodehealth.tls.nonblocking import handshake_step, receive

log = logging.getLogger("nodehealth.netcheck")

LINE_SECONDS = 2.0  # a request line's whole time, from the connection's accept
MAX_PENDING = 128  # connections still sending their request line
MAX_CONNECTIONS = 512  # connections held at once (waiting or being answered), beyond a job's joins
RESERVE_FDS = 64
ACCEPTS_PER_TURN = 32  # then the waiting lines are read: a flood of connects cannot starve them
BACKLOG = 128


@dataclass
class Request:
    sock: socket.socket
    source: str  # the address the connection came from
    msg: dict
    rest: bytes  # what arrived after the line (a sink's first data)
    names: list[str] = field(default_factory=list)  # what its TLS certificate proves (none without TLS)
    _done: Callable[[socket.socket], None] = field(repr=False, default=lambda s: None)

    def close(self) -> None:
        self._done(self.sock)


def descriptors(wanted: int) -> int:
    """How many connections this process can hold beside its reserve: the soft limit is raised
    toward the hard one when `wanted` needs it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 32
    need = in_use + RESERVE_FDS + wanted
    if soft != resource.RLIM_INFINITY and soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        except (ValueError, OSError):
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(8, min(wanted, soft - in_use - RESERVE_FDS))


class Listener:
    def __init__(self, address: tuple[str, int], dispatch: Callable[[Request], None],
                 admit: Callable[[str], bool] = lambda source: True,
                 line_limit: Callable[[str], int] = lambda source: MAX_LINE, extra: int = 0, tls: Any = None):
        """`extra`: connections held beyond MAX_CONNECTIONS (a coordinator's joined nodes wait on theirs);
        `tls`: the mesh's identity (nodehealth.tls.identity.Identity), or None for plain TCP."""
        self.dispatch, self.admit, self.line_limit, self.tls = dispatch, admit, line_limit, tls
        self._handshaking: set[socket.socket] = set()  # only the listener's thread uses it
        self.capacity = descriptors(MAX_CONNECTIONS + extra)
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.sock = socket.create_server(address, family=family, backlog=BACKLOG)
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()[:2]
        self.refused = 0  # connections closed unread: not admitted, or over a cap
        self._held: set[socket.socket] = set()  # accepted and not yet closed
        self._lock = threading.Lock()
        self._closing = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._thread = threading.Thread(target=self._run, name=f"netcheck-listen-{self.address[1]}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop accepting and drop every connection, also those being answered (their threads end)."""
        self._closing = True
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(2.0)
        with self._lock:
            held = list(self._held)
        for s in held:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.sock.close()
        self._wake_r.close()
        self._wake_w.close()

    def _release(self, s: socket.socket) -> None:
        with self._lock:
            self._held.discard(s)
        s.close()

    def _drop(self, s: socket.socket, selector, pending: dict) -> None:
        """Forget a waiting connection and close it (the listener's thread only)."""
        selector.unregister(s)
        del pending[s]
        self._handshaking.discard(s)
        self._release(s)

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        selector.register(self.sock, selectors.EVENT_READ)
        pending: dict[socket.socket, tuple[str, float, bytearray]] = {}  # oldest first
        paused = [0.0]  # until when the listening socket rests after the process ran out of descriptors
        try:
            while not self._closing:
                try:
                    self._turn(selector, pending, paused)
                except Exception:  # noqa: BLE001 - a dead listener makes a healthy node look unreachable
                    log.exception("netcheck: the agent's listener failed a turn; it goes on")
                    time.sleep(0.1)
        finally:
            for s in pending:
                self._release(s)
            selector.close()

    def _turn(self, selector, pending: dict, paused: list[float]) -> None:
        now = time.monotonic()
        if paused[0] and now >= paused[0]:
            selector.register(self.sock, selectors.EVENT_READ)
            paused[0] = 0.0
        timeouts = [d for _, d, _ in pending.values()] + ([paused[0]] if paused[0] else [])
        for key, _ in selector.select(max(0.0, min(timeouts) - now) if timeouts else None):
            if key.fileobj is self.sock:
                if not self._accept(selector, pending):
                    selector.unregister(self.sock)
                    paused[0] = time.monotonic() + 0.1
            elif key.fileobj in pending:  # not one this turn's accepts dropped already
                self._read(key.fileobj, selector, pending)
        now = time.monotonic()
        for s in [s for s, (_, d, _) in pending.items() if d <= now]:
            self._drop(s, selector, pending)

    def _accept(self, selector, pending: dict) -> bool:
        """Take what waits to be accepted (a turn's worth); False when out of descriptors."""
        for _ in range(ACCEPTS_PER_TURN):
            try:
                s, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as e:  # EMFILE, ENFILE, ENOBUFS: rest, then try again
                log.warning("netcheck: cannot accept a connection: %s", e.strerror or e)
                return False
            source = addr[0]
            if self._closing or not self.admit(source):
                self.refused += 1
                s.close()
                continue
            with self._lock:
                full = len(self._held) >= self.capacity
            if full or len(pending) >= MAX_PENDING:
                if not pending:  # every connection held is being answered: this one waits its turn elsewhere
                    self.refused += 1
                    s.close()
                    continue
                self.refused += 1
                self._drop(next(iter(pending)), selector, pending)
            s.setblocking(False)
            if self.tls is not None:
                try:
                    s = self.tls.server_context(require_client=True).wrap_socket(
                        s, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    self.refused += 1
                    s.close()
                    continue
                self._handshaking.add(s)
            with self._lock:
                self._held.add(s)
            pending[s] = (source, time.monotonic() + LINE_SECONDS, bytearray())
            selector.register(s, selectors.EVENT_READ)
            self._read(s, selector, pending)  # the line often came with the connection
        return True

    def _read(self, s: socket.socket, selector, pending: dict) -> None:
        source, deadline, buf = pending[s]
        limit = self.line_limit(source)
        if s in self._handshaking:
            try:
                wait = handshake_step(s)
            except OSError:  # no certificate of the CA, not TLS: closed unread
                self.refused += 1
                self._drop(s, selector, pending)
                return
            if wait is not None:
                selector.modify(s, wait)
                return
            self._handshaking.discard(s)
            selector.modify(s, selectors.EVENT_READ)
        chunk = receive(s, limit)
        if chunk is None:
            return
        buf += chunk
        newline = buf.find(b"\n")
        if chunk and newline < 0 and len(buf) <= limit:
            return
        selector.unregister(s)
        del pending[s]
        if newline < 0 or newline > limit:
            if chunk:
                _answer_nowait(s, b'{"error": "a request line longer than %d bytes"}\n' % limit)
            self._release(s)
            return
        try:
            msg = parse(bytes(buf[:newline]))
        except StreamError as e:
            _answer_nowait(s, b'{"error": "%s"}\n' % str(e).encode())
            self._release(s)
            return
        s.setblocking(True)
        self.dispatch(Request(s, source, msg, bytes(buf[newline + 1:]), peer_names(s), self._release))


def _answer_nowait(s: socket.socket, line: bytes) -> None:
    """A refusal in one line, if the socket takes it now; never waits."""
    try:
        s.setblocking(False)
        s.send(line)
    except OSError:
        pass
