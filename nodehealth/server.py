"""The shell of nodehealth's long-running processes (the daemon, the pingmesh controller): a bounded
HTTP server for their few GET routes, the file descriptors its listeners may hold, one log line per
cause of trouble at a time, and the stop on a signal that cannot hang.

The server's clients cannot hold it: every request has a total deadline, and only complete
requests reach the worker threads. http.server's per-read socket timeout does not bound a request:
a client that sends one byte a second never times out (slowloris), and sixteen of them hold every
worker. Here one thread accepts connections and collects their request heads without blocking, so
a slow or idle client costs a file descriptor, not a worker; it is dropped at its deadline, and past
MAX_PENDING the oldest waiting connection is dropped to make room. Workers parse the head from
memory (parse_head: a GET or HEAD line and a few headers, without http.server's handler and its
e-mail header parser) and write the whole answer at once under what is left of the same deadline.
Some workers are kept for the priority paths (/metrics, /healthz): clients hammering a heavy path
(/v1/pingmesh) take the others, never a scrape's or the kubelet's. A route that raises answers 500,
and what goes wrong is one counted log line per cause and minute, not a traceback per request.
Closing the server drops every connection, so a stop never waits on a client.

With `tls` (a function giving the current server context: certificates rotate), a connection is
wrapped as it is taken and its handshake is done by the same thread, without blocking and
under the same deadline, so a client that stalls its handshake costs no more than one that stalls
its head. `guard` decides from the path, the headers and the connection (its verified certificate)
whether a request is answered or refused with 401/403 (nodehealth/tls/access.py), before a route runs.

The daemon's own work (collectors, the state file, the kernel log, the prober's connections) needs
descriptors whatever its clients do: raise_descriptor_limit() lifts the soft limit to the hard one,
and share_descriptors() sizes the listeners' caps to leave RESERVED_DESCRIPTORS free.

A stop (SIGTERM, SIGINT or SIGHUP, whose default would kill the process without its clean-up) that
hangs anyway, in a thread or in the interpreter's teardown, prints every thread's stack and exits 1.
"""
from __future__ import annotations

import errno
import faulthandler
import json
import logging
import queue
import resource
import selectors
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from socketserver import TCPServer

from nodehealth.http_message import BadRequest, Reply, Request, parse_head, reply_bytes, request_path
from nodehealth.logs import RateLimitedLog
from nodehealth.model import Metric
from nodehealth.tls.nonblocking import handshake_step, receive

log = logging.getLogger("nodehealth.server")

MAX_HEAD_BYTES = 16384  # our requests are a GET line and a few headers
MAX_PENDING = 256  # connections still sending their request head; well under a default fd limit of 1024
MAX_CONCURRENT_REQUESTS = 16
PRIORITY_WORKERS = 4  # of those, kept for the priority paths: the scrape and the kubelet need one each
PRIORITY_PATHS = ("/metrics", "/healthz")
REQUEST_TIMEOUT_SECONDS = 5.0  # a request's whole time: reading its head and writing the answer
ACCEPT_PAUSE_SECONDS = 0.1  # out of descriptors, the listener stays readable: accept again after this
# Descriptors the listeners leave to the process's own work: ~60 collectors' files and pipes, the
# state file, the kernel log, NVML, the Kubernetes client, the HTTP workers' 16 connections and the
# pingmesh prober's (a channel per pinged peer, 50 at 10,000 nodes, and 16 connects in flight).
RESERVED_DESCRIPTORS = 256
# The soft limit is raised at most to this: subprocesses inherit it, and some close every possible
# descriptor at start.
MAX_DESCRIPTOR_LIMIT = 65536
# After the clean-up of a stop, the interpreter's teardown has this long before the stack dump and exit 1.
STUCK_EXIT_SECONDS = 1.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

Answer = tuple[int, bytes, str]  # status, body, content type
Routes = dict[str, Callable[[str], Answer]]  # path -> the answer to its query string
# (path, headers with lower-cased names, connection) -> the status to refuse with
Guard = Callable[[str, dict[str, str], socket.socket], "int | None"]
Respond = Callable[[Request], Reply]


class Workers:
    """Threads for the answers, started as needed (the server's slots bound how many): an idle thread
    waits for its own next job, and the one idle last takes the next. With one request at a time a
    single thread answers them all with its caches warm; ThreadPoolExecutor's threads wait on one queue
    and take turns, so once a burst had started a second one, each request ran on a colder thread.
    A job is a function that handles its own errors (BoundedHTTPServer._handle)."""

    def __init__(self, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue] = []  # each idle thread's inbox, the one idle last at the end
        self._started = 0
        self._closed = False

    def submit(self, job: Callable[..., None], *args, then: Callable[[], None] | None = None) -> None:
        """Run job(*args) on an idle thread, or a new one; then `then()`, once the thread is idle again (the
        server gives a slot back there, so that no request finds its slot free and no thread idle)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the workers are closed")
            inbox, number = (self._idle.pop(), None) if self._idle else (queue.SimpleQueue(), self._started)
            if number is not None:
                self._started += 1
        inbox.put((job, args, then))
        if number is not None:
            threading.Thread(target=self._run, args=(inbox,), name=f"{self.name}_{number}", daemon=True).start()

    def _run(self, inbox: queue.SimpleQueue) -> None:
        while (work := inbox.get()) is not None:
            job, args, then = work
            try:
                job(*args)
            except Exception:  # a job handles its own; this is a bug, and the thread goes on
                log.exception("an HTTP worker's job failed")
            with self._lock:
                closed = self._closed
                if not closed:
                    self._idle.append(inbox)
            if then is not None:
                then()
            if closed:
                return

    def close(self) -> None:
        """Idle threads end now, busy ones after their job."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for inbox in idle:
            inbox.put(None)


class BoundedHTTPServer(TCPServer):
    """Bounded workers (past the bound a complete request is refused at once, not queued), of which
    `reserved` only for `priority` paths; bounded waiting connections (`max_pending`), and a total
    deadline of `request_seconds` per request. serve_forever() is the one thread that accepts
    connections and collects their heads: a request read at once costs it one wake-up (an accept thread
    handing connections to a reader thread cost two more, and a write to wake it)."""

    DROPPED = ("waiting", "deadline", "too_large", "busy", "descriptors", "handshake")  # why a connection is dropped
    request_queue_size = 64  # the listen backlog: past socketserver's 5, a burst of connects waited 1 s (a SYN again)

    def __init__(self, address, respond: Respond, version: str, workers: int, request_seconds: float,
                 max_pending: int = MAX_PENDING, priority: tuple[str, ...] = (), reserved: int = 0,
                 tls: Callable[[], ssl.SSLContext] | None = None):
        self.respond = respond
        self.version = version  # the Server header
        self.request_seconds = request_seconds
        self.tls = tls
        self.refused: dict[int, int] = {401: 0, 403: 0}  # requests answered 401/403 by the guard
        self.max_pending = max_pending
        self.priority = priority
        self.pool = Workers("http")
        self.slots = threading.BoundedSemaphore(workers)
        self.shared_slots = threading.BoundedSemaphore(workers - reserved if priority else workers)
        self.dropped = dict.fromkeys(self.DROPPED, 0)
        self.errors = 0  # requests whose answer failed: a route raised, a handler error
        self.trouble = RateLimitedLog(log)
        self._active: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closing = False  # server_close(): no new request gets a worker
        self._stopping = False  # shutdown(): serve_forever() returns
        self._stopped = threading.Event()  # serve_forever() has returned
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        # The serving thread's own: connections still sending their head, oldest first, and which of them
        # are TLS connections still in their handshake.
        self._selector: selectors.BaseSelector | None = None
        self._pending: dict[socket.socket, tuple[object, float, bytearray]] = {}
        self._handshaking: set[socket.socket] = set()
        super().__init__(address, None)  # a failed bind calls server_close(), which must find the above
        self.socket.setblocking(False)

    def serve_forever(self) -> None:
        """Accept, read heads and hand complete ones to the workers until shutdown() (which wakes it: no poll)."""
        self._stopped.clear()
        selector = None
        try:
            if self._closing:
                return
            selector = self._selector = selectors.DefaultSelector()
            selector.register(self._wake_r, selectors.EVENT_READ)
            selector.register(self.socket, selectors.EVENT_READ)
            paused_until = None  # out of descriptors: the listener stays readable, so it is left alone a while
            while not (self._stopping or self._closing):
                waits = [d for _, d, _ in self._pending.values()] + ([paused_until] if paused_until else [])
                timeout = max(0.0, min(waits) - time.monotonic()) if waits else None
                for key, _ in selector.select(timeout):
                    try:
                        if self._serve_event(key.fileobj):
                            selector.unregister(self.socket)
                            paused_until = time.monotonic() + ACCEPT_PAUSE_SECONDS
                    except Exception as e:  # a bug: its connection goes, the others are served on
                        self.note_error("serving", f"HTTP: serving a connection failed: {type(e).__name__}: {e}")
                        self._forget(key.fileobj, None)
                now = time.monotonic()
                if paused_until is not None and now >= paused_until:
                    selector.register(self.socket, selectors.EVENT_READ)
                    paused_until = None
                for sock in [s for s, (_, d, _) in self._pending.items() if d <= now]:
                    self._forget(sock, "deadline")
        finally:
            for sock in list(self._pending):
                self._forget(sock, None)
            if selector is not None:
                selector.close()
            self._stopping = False  # serve_forever() may be called again, as socketserver's
            self._stopped.set()

    def _serve_event(self, sock) -> bool:
        """One ready socket served; True when the listener must pause (out of descriptors)."""
        if sock is self._wake_r:
            self._drain_wake()
        elif sock is self.socket:
            return not self._accept()
        elif sock in self._pending:  # else dropped past max_pending by this batch's accepts
            self._read_head(sock)
        return False

    def shutdown(self) -> None:
        """serve_forever() returns, at once; wait for it (as socketserver's, which must be serving)."""
        self._stopping = True
        self._wake()
        self._stopped.wait()

    def _accept(self) -> bool:
        """Take what the listener has, up to its backlog; False when out of descriptors."""
        for _ in range(self.request_queue_size):
            try:
                sock, client = self.socket.accept()
            except BlockingIOError:
                return True
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    self._drop("descriptors")
                    self.trouble.warning("descriptors", f"HTTP: cannot accept a connection: {e.strerror}")
                    return False
                return True  # the client gave up before it was taken (ECONNABORTED)
            sock.setblocking(False)
            if self.tls is not None:
                try:
                    sock = self.tls().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    self._drop("handshake")
                    self.shutdown_request(sock)
                    continue
            try:
                self._selector.register(sock, selectors.EVENT_READ)
            except (OSError, ValueError):  # epoll out of memory: drop it, serve on
                self._drop("descriptors")
                self.shutdown_request(sock)
                continue
            self._pending[sock] = (client, time.monotonic() + self.request_seconds, bytearray())
            if isinstance(sock, ssl.SSLSocket):
                self._handshaking.add(sock)
            if len(self._pending) > self.max_pending:
                self._forget(next(iter(self._pending)), "waiting")
            if sock in self._pending:
                self._read_head(sock)  # a client's request usually comes with its connection: no second wake-up
        return True

    def _read_head(self, sock: socket.socket) -> None:
        """What the connection has sent; a complete head goes to _dispatch."""
        if sock in self._handshaking:
            try:
                wait = handshake_step(sock)
            except OSError:
                self._forget(sock, "handshake")
                return
            if wait is not None:
                self._selector.modify(sock, wait)
                return
            self._handshaking.discard(sock)
            self._selector.modify(sock, selectors.EVENT_READ)
        data = receive(sock, MAX_HEAD_BYTES)
        if data is None:
            return
        client, deadline, head = self._pending[sock]
        head += data
        if b"\r\n\r\n" in head or b"\n\n" in head:
            self._forget(sock, None, close=False)
            self._dispatch(sock, client, bytes(head), deadline)
        elif not data:
            self._forget(sock, None)  # the client closed before its head was complete
        elif len(head) > MAX_HEAD_BYTES:
            self._forget(sock, "too_large")

    def _forget(self, sock, reason: str | None, close: bool = True) -> None:
        """A waiting connection leaves the serving thread, whatever state it is in: counted as dropped for
        `reason`, closed unless told. Nothing for another socket (the listener, the wake-up)."""
        if sock not in self._pending:
            return
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError, OSError):  # a socket closed under it
            pass
        del self._pending[sock]
        self._handshaking.discard(sock)
        if reason is not None:
            self._drop(reason)
        if close:
            self.shutdown_request(sock)

    def _drop(self, reason: str) -> None:
        with self._lock:
            self.dropped[reason] += 1

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # a wake-up is already pending, or the server is closed

    def _drain_wake(self) -> None:
        try:
            self._wake_r.recv(4096)
        except OSError:
            pass

    def _dispatch(self, sock: socket.socket, client, head: bytes, deadline: float) -> None:
        """A complete head gets a worker now or is refused: a priority path any free worker, any other
        path one of the shared workers."""
        shared = request_path(head) not in self.priority
        if shared and not self.shared_slots.acquire(blocking=False):
            self._refuse(sock)
            return
        if self._closing or not self.slots.acquire(blocking=False):
            if shared:
                self.shared_slots.release()
            self._refuse(sock)
            return
        sock.setblocking(True)
        with self._lock:
            self._active.add(sock)
        try:
            self.pool.submit(self._handle, sock, client, head, deadline, then=lambda: self._free(shared))
        except RuntimeError:  # closed meanwhile: what _handle would have let go
            with self._lock:
                self._active.discard(sock)
            self.shutdown_request(sock)
            self._free(shared)

    def _free(self, shared: bool) -> None:
        """A request's slots back, its thread idle again."""
        self.slots.release()
        if shared:
            self.shared_slots.release()

    def _refuse(self, sock: socket.socket) -> None:
        if not self._closing:
            self._drop("busy")
        self.shutdown_request(sock)

    def _handle(self, sock: socket.socket, client, head: bytes, deadline: float) -> None:
        try:
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                request = parse_head(head, sock)
            except BadRequest as e:
                reply: Reply = (e.status, f"{e}\n".encode(), "text/plain", {})
                head_only = head.startswith(b"HEAD ")
            else:
                reply, head_only = self._answer(request), request.method == "HEAD"
            sock.sendall(reply_bytes(reply, self.version, head_only))
        except (BrokenPipeError, ConnectionResetError, TimeoutError) as e:  # the client left or stalled: no bug of ours
            log.debug("%s: the answer was not taken (%s)", client[0] if client else "client", e)
        except Exception:
            self.handle_error(sock, client)
        finally:
            with self._lock:
                self._active.discard(sock)
            self.shutdown_request(sock)

    def _answer(self, request: Request) -> Reply:
        try:
            return self.respond(request)
        except Exception as e:  # a bug, or input no route should have let through: 500, counted
            self.note_error(request.path, f"HTTP: {request.path} failed: {type(e).__name__}: {e}")
            return 500, b'{"error": "internal error; the log says which"}\n', "application/json", {}

    def handle_error(self, request, client_address) -> None:
        """One counted line per minute, not socketserver's traceback per request."""
        error = sys.exc_info()[1]
        self.note_error("handler", f"HTTP: a request from {client_address[0]} failed: {type(error).__name__}: {error}")

    def note_error(self, cause: str, message: str) -> None:
        with self._lock:
            self.errors += 1
        self.trouble.warning(cause, message)

    def note_refused(self, code: int) -> None:
        with self._lock:
            self.refused[code] += 1

    def metrics(self) -> list[Metric]:
        dropped = Metric("nodehealth_http_connections_dropped_total",
                         "HTTP connections closed without an answer, by reason: waiting (past the cap of "
                         "connections waiting to send their request), deadline (the request not complete in "
                         "time), too_large (its head), busy (no worker free for its path), descriptors (none "
                         "left to accept with), handshake (TLS: no valid client certificate, a wrong CA, not "
                         "TLS).", "counter", ("reason",))
        refused = Metric("nodehealth_http_requests_refused_total",
                         "HTTP requests refused for their credentials, by code: 401 (none, or a wrong token), "
                         "403 (a certificate of another identity than the path needs).", "counter", ("code",))
        with self._lock:
            for reason, n in self.dropped.items():
                dropped.add((reason,), n)
            for code, n in self.refused.items():
                refused.add((str(code),), n)
            errors = self.errors
        errors_metric = Metric.one("nodehealth_http_errors_total", "HTTP requests whose answer failed (a bug or a "
                                   "client gone mid-answer); the log says why, once a minute.", errors, "counter")
        return [dropped, refused, errors_metric]

    def server_close(self) -> None:
        self._closing = True
        self._wake()
        # Serving: it closes its waiting connections as it returns. One that does not within a second keeps
        # its wake-up pair, so that a later shutdown() can still wake it.
        stopped = self._selector is None or self._stopped.wait(1.0)
        with self._lock:
            active = list(self._active)
        for sock in active:  # a worker writing to a client that does not read stops now
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        super().server_close()
        self.pool.close()
        if stopped:
            self._wake_r.close()
            self._wake_w.close()


def listen_address(listen: str) -> tuple[str, int]:
    """ADDR:PORT (an IPv6 address in brackets or not) as (host, port); ValueError when it is not one."""
    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"a listen address must be ADDR:PORT, not {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def make_server(listen: str, routes: Callable[[], Routes], version: str,
                workers: int = MAX_CONCURRENT_REQUESTS, request_seconds: float = REQUEST_TIMEOUT_SECONDS,
                max_pending: int = MAX_PENDING, tls: Callable[[], ssl.SSLContext] | None = None,
                guard: Guard | None = None) -> BoundedHTTPServer:
    """GET and HEAD on the paths `routes()` lists now (read at each request: a route may come later);
    any other path is a 404 that lists them; PRIORITY_PATHS keep PRIORITY_WORKERS of the workers.
    `tls`: HTTPS with the context it gives; `guard`: who may read what (see BoundedHTTPServer).
    Raises OSError or ValueError when it cannot listen."""
    host, port = listen_address(listen)

    def respond(request: Request) -> Reply:
        refuse = guard(request.path, request.headers, request.connection) if guard is not None else None
        if refuse is not None:
            server.note_refused(refuse)
            return (refuse, b'{"error": "not allowed"}\n', "application/json",
                    {"WWW-Authenticate": "Bearer"} if refuse == 401 else {})
        known = routes()
        route = known.get(request.path)
        if route is None:
            body = json.dumps({"error": "not found", "paths": list(known)}).encode() + b"\n"
            return 404, body, "application/json", {}
        return (*route(request.query), {})

    class Server(BoundedHTTPServer):
        allow_reuse_address = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = Server((host, port), respond, version, workers, request_seconds, max_pending, PRIORITY_PATHS,
                    min(PRIORITY_WORKERS, workers - 1), tls)
    return server


def raise_descriptor_limit() -> int:
    """Lift the soft limit on open files to the hard one (at most MAX_DESCRIPTOR_LIMIT), as Go's
    runtime does: systemd's default soft limit is 1024 under a hard one of 524288. Returns the soft
    limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = MAX_DESCRIPTOR_LIMIT if hard == resource.RLIM_INFINITY else min(hard, MAX_DESCRIPTOR_LIMIT)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, want, e)
    return soft


def share_descriptors(limit: int, wants: dict[str, int]) -> dict[str, int]:
    """Caps for the listeners (name -> connections it may hold) that leave RESERVED_DESCRIPTORS of
    `limit` to the process's own work: what each wants, or where the limit is too low for that, its
    share of what is left (at least 8 each)."""
    room = max(0, limit - RESERVED_DESCRIPTORS)
    total = sum(wants.values())
    if total <= room:
        return dict(wants)
    return {name: max(8, want * room // total) for name, want in wants.items()}


def serve_until_signal(server: BoundedHTTPServer, stop: threading.Event, start: Callable[[], None],
                       clean_up: Callable[[], None], stuck_stop_seconds: float) -> int:
    """Serve, `start` the process's own threads, and wait until a stop signal sets `stop` (or someone
    else does); then close the server and run `clean_up`. Past `stuck_stop_seconds` from the signal, or
    STUCK_EXIT_SECONDS after the clean-up, every thread's stack is printed and the process exits 1: a
    supervisor's grace period is short, and a hung stop would otherwise end in a SIGKILL that says
    nothing. Returns 0."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    start()
    stop.wait()
    log.info("stopping")
    faulthandler.dump_traceback_later(stuck_stop_seconds, exit=True)
    server.shutdown()
    server.server_close()
    clean_up()
    faulthandler.dump_traceback_later(STUCK_EXIT_SECONDS, exit=True)
    return 0
