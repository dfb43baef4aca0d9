"""The shell of nodehealth's long-running processes (the daemon, the pingmesh controller): a bounded
HTTP server for their few GET routes, and the stop on a signal that cannot hang.

The server's clients cannot hold it: every request has a total deadline, and only complete
requests reach the worker threads. http.server's per-read socket timeout does not bound a request:
a client that sends one byte a second never times out (slowloris), and sixteen of them hold every
worker. Here one reader thread collects each connection's request head without blocking, so a
slow or idle client costs a file descriptor, not a worker; it is dropped at its deadline, and past
MAX_PENDING the oldest waiting connection is dropped to make room. Workers get the head from
memory and write the answer under what is left of the same deadline. Closing the server drops
every connection, so a stop never waits on a client.

A stop (SIGTERM, SIGINT or SIGHUP, whose default would kill the process without its clean-up) that
hangs anyway, in a thread or in the interpreter's teardown, prints every thread's stack and exits 1.
"""
from __future__ import annotations

import faulthandler
import io
import json
import logging
import selectors
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer

log = logging.getLogger("nodehealth.server")

MAX_HEAD_BYTES = 16384  # our requests are a GET line and a few headers
MAX_PENDING = 256  # connections still sending their request head; well under a default fd limit of 1024
MAX_CONCURRENT_REQUESTS = 16
REQUEST_TIMEOUT_SECONDS = 5.0  # a request's whole time: reading its head and writing the answer
# After the clean-up of a stop, the interpreter's teardown has this long before the stack dump and exit 1.
STUCK_EXIT_SECONDS = 1.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

Answer = tuple[int, bytes, str]  # status, body, content type
Routes = dict[str, Callable[[str], Answer]]  # path -> the answer to its query string


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
        except (BrokenPipeError, ConnectionResetError, TimeoutError) as e:  # the client left or stalled: no bug of ours
            log.debug("%s: the answer was not taken (%s)", client[0] if client else "client", e)
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


def listen_address(listen: str) -> tuple[str, int]:
    """ADDR:PORT (an IPv6 address in brackets or not) as (host, port); ValueError when it is not one."""
    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"a listen address must be ADDR:PORT, not {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def make_server(listen: str, routes: Callable[[], Routes], version: str,
                workers: int = MAX_CONCURRENT_REQUESTS, request_seconds: float = REQUEST_TIMEOUT_SECONDS
                ) -> BoundedHTTPServer:
    """GET and HEAD on the paths `routes()` lists now (read at each request: a route may come later);
    any other path is a 404 that lists them. Raises OSError or ValueError when it cannot listen."""
    host, port = listen_address(listen)

    class Handler(BoundedHandler):
        server_version = version

        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            path, _, query = self.path.partition("?")
            known = routes()
            route = known.get(path)
            if route is None:
                body = json.dumps({"error": "not found", "paths": list(known)}).encode() + b"\n"
                self._send(404, body, "application/json")
            else:
                self._send(*route(query))

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, fmt: str, *args) -> None:
            log.debug("%s %s", self.address_string(), fmt % args)

    class Server(BoundedHTTPServer):
        allow_reuse_address = True
        request_queue_size = 64
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    return Server((host, port), Handler, workers, request_seconds)


def serve_until_signal(server: HTTPServer, stop: threading.Event, start: Callable[[], None],
                       clean_up: Callable[[], None], stuck_stop_seconds: float) -> int:
    """Serve, `start` the process's own threads, and wait until a stop signal sets `stop` (or someone
    else does); then close the server and run `clean_up`. Past `stuck_stop_seconds` from the signal, or
    STUCK_EXIT_SECONDS after the clean-up, every thread's stack is printed and the process exits 1: a
    supervisor's grace period is short, and a hung stop would otherwise end in a SIGKILL that says
    nothing. Returns 0."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="http", daemon=True).start()
    start()
    stop.wait()
    log.info("stopping")
    faulthandler.dump_traceback_later(stuck_stop_seconds, exit=True)
    server.shutdown()
    server.server_close()
    clean_up()
    faulthandler.dump_traceback_later(STUCK_EXIT_SECONDS, exit=True)
    return 0
