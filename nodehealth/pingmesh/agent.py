"""What each node answers so that its peers can time the path to it: the gRPC Ping service, and
a plain TCP port for the connect probes (the prober's loop accepts and closes those at once;
through gRPC's server each connect would cost its HTTP/2 set-up, about 0.5 % of a core at 33
connects a second).

Every peer can reach this port, so its inputs are bounded: small messages only, a fixed pool
of handler threads and a cap on concurrent calls (past it gRPC answers RESOURCE_EXHAUSTED at
once). A Ping does no work beyond echoing: nothing a peer sends can make this node do more.
"""
from __future__ import annotations

import socket
from concurrent import futures
from typing import Any

MAX_MESSAGE_BYTES = 64 * 1024  # Pingmesh's 64 KB payload cap
HANDLER_THREADS = 2  # a Ping is an echo: two threads keep up with thousands a second
MAX_CONCURRENT_RPCS = 64


class ProbeError(Exception):
    pass


def serve(listen: str, node: str) -> Any:
    """Start the Ping service on `listen` (ADDR:PORT) and return the running grpc.Server."""
    import grpc

    from nodehealth.pingmesh import probe_pb2, probe_pb2_grpc

    class Servicer(probe_pb2_grpc.ProbeServicer):
        def Ping(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC method name)
            return probe_pb2.PingReply(seq=request.seq, send_time_ns=request.send_time_ns, node=node)

    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
               ("grpc.so_reuseport", 0)]
    server = grpc.server(futures.ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="probe-agent"),
                         options=options, maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)
    probe_pb2_grpc.add_ProbeServicer_to_server(Servicer(), server)
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ProbeError(f"pingmesh listen address must be ADDR:PORT, not {listen!r}")
    try:
        bound = server.add_insecure_port(listen)
    except RuntimeError as e:  # grpcio raises where older versions returned 0
        raise ProbeError(f"cannot listen on {listen} for pingmesh probes: {e}") from None
    if not bound:
        raise ProbeError(f"cannot listen on {listen} for pingmesh probes (address in use or not local?)")
    server.start()
    return server


def listen_tcp(host: str, port: int) -> socket.socket:
    """The non-blocking listening socket the TCP connect probes of peers reach."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host.strip("[]"), port))
        s.listen(1024)
        s.setblocking(False)
    except OSError as e:
        s.close()
        raise ProbeError(f"cannot listen on {host}:{port} for pingmesh TCP probes: {e.strerror or e}") from None
    return s
