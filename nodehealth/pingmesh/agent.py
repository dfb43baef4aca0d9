"""What each node answers so that its peers can time the path to it: the gRPC Ping service, and
a plain TCP port for the connect probes (the kernel's handshake answers them, and the prober's loop
accepts and closes only the rare one that stays; through gRPC's server each connect would cost its
HTTP/2 set-up, about 0.5 % of a core at 33 connects a second).

Every peer can reach this port, so everything on it is bounded. The service runs on gRPC's asyncio
server on a thread of its own: a call waiting for its request is a coroutine, not a thread, so
calls that send their headers and never their message cannot stop the answers (with a pool of
handler threads, two such calls stopped them all). Each call has CALL_SECONDS from its headers to
its message, whatever deadline the caller set; connections are capped at MAX_CONNECTIONS (one
past the cap is closed as it is accepted), must speak HTTP/2 within HANDSHAKE_SECONDS and are
closed after IDLE_SECONDS without a call; calls are capped in all and per connection (past the cap
gRPC answers RESOURCE_EXHAUSTED at once), messages at 64 KiB. A request that cannot be parsed or
never comes is refused, counted, and logged once a minute. A Ping does no work beyond echoing:
nothing a peer sends can make this node do more.

With the mesh's identity (tls.enabled), the port speaks mutual TLS: a caller without a certificate
of the cluster CA does not get past the handshake, and a call whose certificate names no member of
the inventory (`admit`) is refused as a stranger.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from nodehealth.logs import RateLimitedLog
from nodehealth.model import Metric
from nodehealth.pingmesh import ping_wire
from nodehealth.tls.identity import grpc_peer_names

log = logging.getLogger("nodehealth.probe")

MAX_MESSAGE_BYTES = 64 * 1024  # Pingmesh's 64 KB payload cap
MAX_CONNECTIONS = 256  # a prober keeps one channel to us: ~50 peers at 10,000 nodes, ~330 with every rail pinged
HANDSHAKE_SECONDS = 5.0  # from the connect to HTTP/2's preface and settings
IDLE_SECONDS = 120.0  # without a call; a prober calls each peer every 10 s
MAX_CALLS_PER_CONNECTION = 8  # a prober has one Ping at a time on its channel
MAX_CONCURRENT_CALLS = 256
CALL_SECONDS = 5.0  # from a call's headers to its request message
REFUSED = ("malformed", "deadline", "stranger")  # reasons a call is refused
DEFER_ACCEPT_SECONDS = 1  # a TCP probe connection that brings no data stays in the kernel this long (a SYN-ACK resent)


class ProbeError(Exception):
    pass


async def start_server(listen: str, node: str, refuse: Callable[[str, str], None],
                       max_connections: int = MAX_CONNECTIONS, tls: Any = None,
                       admit: Callable[[list[str]], bool] = lambda names: True) -> Any:
    """The Ping service, bound to `listen` (ADDR:PORT) and started on the running loop: a
    grpc.aio.Server. `refuse(reason, why)` hears of each call refused. With `tls` (an Identity), only
    calls whose certificate names someone `admit` admits are answered. ProbeError when it cannot
    listen."""
    import grpc

    async def ping(requests: Any, context: Any) -> bytes:
        """A unary call, read as a stream of its one message: so the wait for it has our deadline
        and the bytes are parsed here, where a bad message is counted instead of logged in full."""
        if tls is not None and not admit(names := grpc_peer_names(context)):
            refuse("stranger", f"a Ping from {context.peer()} ({', '.join(names) or 'no name'}) was refused: "
                               "not a member of the inventory")
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not a member of the inventory")
        try:
            raw = await asyncio.wait_for(context.read(), CALL_SECONDS)
        except asyncio.TimeoutError:
            refuse("deadline", f"a Ping from {context.peer()} sent no request within {CALL_SECONDS:g} s")
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"no request within {CALL_SECONDS:g} s")
        try:
            if not isinstance(raw, bytes):  # the caller closed its side without a message
                raise ValueError("no request message")
            request = ping_wire.decode_request(raw)
        except ValueError as e:  # the peer's fault: counted, answered INVALID_ARGUMENT
            refuse("malformed", f"a Ping from {context.peer()} was refused: {e}")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not a PingRequest")
        return ping_wire.encode_reply(request.seq, request.send_time_ns, node)

    service, _, method = ping_wire.METHOD[1:].partition("/")
    handler = grpc.method_handlers_generic_handler(service, {method: grpc.stream_unary_rpc_method_handler(ping)})
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_allowed_incoming_connections", max_connections),
               ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_SECONDS * 1000)),
               ("grpc.max_connection_idle_ms", int(IDLE_SECONDS * 1000)),
               ("grpc.max_concurrent_streams", MAX_CALLS_PER_CONNECTION),
               ("grpc.so_reuseport", 0), ("grpc.http2.bdp_probe", 0)]
    server = grpc.aio.server(options=options, maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS)
    server.add_generic_rpc_handlers((handler,))
    _bind(server, listen, tls)
    await server.start()
    return server


def _bind(server: Any, listen: str, tls: Any) -> None:
    host, _, port = listen.rpartition(":")
    if not host or not port.isascii() or not port.isdigit():
        raise ProbeError(f"pingmesh listen address must be ADDR:PORT, not {listen!r}")
    try:
        if tls is None:
            bound = server.add_insecure_port(listen)
        else:
            bound = server.add_secure_port(listen, tls.grpc_server_credentials())
    except RuntimeError as e:  # grpcio raises where older versions returned 0
        raise ProbeError(f"cannot listen on {listen} for pingmesh probes: {e}") from None
    if not bound:
        raise ProbeError(f"cannot listen on {listen} for pingmesh probes (address in use or not local?)")


class Agent:
    """The Ping service on its own thread and asyncio loop; start() returns once it listens."""

    def __init__(self, listen: str, node: str, max_connections: int = MAX_CONNECTIONS, tls: Any = None,
                 admit: Callable[[list[str]], bool] = lambda names: True):
        self.listen = listen
        self.node = node
        self.max_connections = max_connections
        self.tls, self.admit = tls, admit
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: Any = None
        self.refused = dict.fromkeys(REFUSED, 0)
        self.trouble = RateLimitedLog(log)

    def start(self) -> None:
        """Listen and answer; ProbeError when it cannot listen (a port in use fails the daemon's start)."""
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self.thread = threading.Thread(target=self._run, args=(ready,), name="pingmesh-agent", daemon=True)
        self.thread.start()
        ready.result()

    def _run(self, ready: concurrent.futures.Future) -> None:
        loop = asyncio.new_event_loop()
        try:
            self.server = loop.run_until_complete(start_server(self.listen, self.node, self._refuse,
                                                               self.max_connections, self.tls, self.admit))
        except BaseException as e:  # noqa: BLE001 (handed to start(), which raises it)
            loop.close()
            ready.set_exception(e)
            return
        self.loop = loop
        ready.set_result(None)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _refuse(self, reason: str, why: str) -> None:
        self.refused[reason] += 1  # only the loop's thread counts
        self.trouble.warning(reason, f"pingmesh agent: {why}")

    def stop(self, grace: float = 0.5) -> None:
        """Stop answering: calls in flight get `grace` seconds; then the loop ends."""
        loop = self.loop
        if loop is None or self.thread is None or not self.thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(grace), loop).result(grace + 2.0)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass  # the loop is stuck or already closing: end it anyway
        loop.call_soon_threadsafe(loop.stop)
        self.thread.join(2.0)

    def metrics(self) -> list[Metric]:
        refused = Metric("nodehealth_pingmesh_agent_refused_total",
                         "Pings this agent refused, by reason: malformed (not a PingRequest), deadline (no "
                         f"request within {CALL_SECONDS:g} s of the call's headers) or stranger (TLS: a "
                         "certificate that names no member of the inventory).", "counter", ("reason",))
        for reason, n in self.refused.items():
            refused.add((reason,), n)
        return [refused]


def listen_tcp(host: str, port: int) -> socket.socket:
    """The non-blocking listening socket the TCP connect probes of peers reach. The kernel's handshake
    answers a probe; with TCP_DEFER_ACCEPT the kernel keeps a connection that brings no data to itself,
    so a probe its prober resets at once ends there, and accept() (the prober's loop) sees only one
    that stays past DEFER_ACCEPT_SECONDS or closes with a FIN."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, DEFER_ACCEPT_SECONDS)
        s.bind((host.strip("[]"), port))
        s.listen(1024)
        s.setblocking(False)
    except OSError as e:
        s.close()
        raise ProbeError(f"cannot listen on {host}:{port} for pingmesh TCP probes: {e.strerror or e}") from None
    return s
