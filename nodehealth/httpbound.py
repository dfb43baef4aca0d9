"""An HTTP server whose clients cannot hold it: every request has a total deadline, and only complete
requests reach the worker threads.

http.server's per-read socket timeout does not bound a request: a client that sends one byte a
second never times out (slowloris), and sixteen of them hold every worker. Here one reader thread
collects each connection's request head without blocking, so a slow or idle client costs a file
descriptor, not a worker; it is dropped at its deadline, and past MAX_PENDING the oldest waiting
connection is dropped to make room. Workers get the head from memory and write the answer under
what is left of the same deadline. Closing the server drops every connection, so a stop never
waits on a client.
"""
from __future__ import annotations

import io
import selectors
import socket
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer

MAX_HEAD_BYTES = 16384  # our requests are a GET line and a few headers
MAX_PENDING = 256  # connections still sending their request head; well under a default fd limit of 1024


class BoundedHTTPServer(HTTPServer):
    """Bounded workers (past the bound a complete request is refused at once, not queued), bounded
    waiting connections, and a total deadline of `request_seconds` per request."""

    def __init__(self, address, handler, workers: int, request_seconds: float):
        self.request_seconds = request_seconds
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="http")
        self.slots = threading.BoundedSemaphore(workers)
        self.heads: dict[socket.socket, tuple[bytes, float]] = {}  # handed to the handler's setup()
        self._active: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._incoming: deque = deque()
        self._closing = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._reader = threading.Thread(target=self._read_heads, name="http-read", daemon=True)
        super().__init__(address, handler)  # a failed bind calls server_close(), which must find the above
        self._reader.start()

    def process_request(self, request, client_address) -> None:
        request.setblocking(False)
        with self._lock:
            self._incoming.append((request, client_address, time.monotonic() + self.request_seconds))
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # the reader already has a wake-up pending

    def _read_heads(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        pending: dict[socket.socket, tuple[object, float, bytearray]] = {}  # oldest first
        while not self._closing:
            timeout = min(d for _, d, _ in pending.values()) - time.monotonic() if pending else None
            for key, _ in selector.select(None if timeout is None else max(0.0, timeout)):
                sock = key.fileobj
                if sock is self._wake_r:
                    self._take_incoming(selector, pending)
                    continue
                try:
                    data = sock.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                client, deadline, head = pending[sock]
                head += data
                done = b"\r\n\r\n" in head or b"\n\n" in head
                if not data or done or len(head) > MAX_HEAD_BYTES:
                    selector.unregister(sock)
                    del pending[sock]
                    if done:
                        self._dispatch(sock, client, bytes(head), deadline)
                    else:
                        self.shutdown_request(sock)
            now = time.monotonic()
            for sock in [s for s, (_, d, _) in pending.items() if d <= now]:
                selector.unregister(sock)
                del pending[sock]
                self.shutdown_request(sock)
        for sock in pending:
            self.shutdown_request(sock)
        selector.close()

    def _take_incoming(self, selector, pending: dict) -> None:
        try:
            self._wake_r.recv(4096)
        except OSError:
            pass
        with self._lock:
            incoming, self._incoming = self._incoming, deque()
        for sock, client, deadline in incoming:
            selector.register(sock, selectors.EVENT_READ)
            pending[sock] = (client, deadline, bytearray())
        while len(pending) > MAX_PENDING:
            oldest = next(iter(pending))
            selector.unregister(oldest)
            del pending[oldest]
            self.shutdown_request(oldest)

    def _dispatch(self, sock: socket.socket, client, head: bytes, deadline: float) -> None:
        if self._closing or not self.slots.acquire(blocking=False):
            self.shutdown_request(sock)
            return
        sock.setblocking(True)
        with self._lock:
            self.heads[sock] = (head, deadline)
            self._active.add(sock)
        self.pool.submit(self._handle, sock, client)

    def _handle(self, sock: socket.socket, client) -> None:
        try:
            self.finish_request(sock, client)
        except Exception:
            self.handle_error(sock, client)
        finally:
            with self._lock:
                self._active.discard(sock)
                self.heads.pop(sock, None)
            self.shutdown_request(sock)
            self.slots.release()

    def server_close(self) -> None:
        self._closing = True
        self._wake()
        if self._reader.is_alive():
            self._reader.join(1.0)
        with self._lock:
            active = list(self._active)
        for sock in active:  # a worker writing to a client that does not read stops now
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        super().server_close()
        self.pool.shutdown(wait=False)
        self._wake_r.close()
        self._wake_w.close()


class _Writer(io.BufferedIOBase):
    """The answer goes out with sendall, under the socket's timeout (a total since Python 3.5)."""

    def __init__(self, sock: socket.socket):
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._sock.sendall(data)
        return len(data)


class BoundedHandler(BaseHTTPRequestHandler):
    """Reads the request head the server already collected; writes under the request's deadline."""

    def setup(self) -> None:
        head, deadline = self.server.heads.pop(self.request, (b"", time.monotonic()))
        self.connection = self.request
        self.connection.settimeout(max(0.05, deadline - time.monotonic()))
        self.rfile = io.BytesIO(head)
        self.wfile = _Writer(self.connection)
