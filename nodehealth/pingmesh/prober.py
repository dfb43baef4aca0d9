"""The prober: times a gRPC Ping and a TCP connect to every peer of the pinglist, on one thread.

Probes of a peer are spread over the interval by a per-peer phase, so load is even. The loop wakes
once a tick: it takes what finished since the last one (connects, peers' probes to accept) and starts
the probes due within the tick together, so it wakes twice a second at the default 10 s interval
rather than once per probe, its completions and its peers' connects. On a VM a wake-up costs more
than the work it then does: 30 connects a second cost 6-7 ms/s of CPU in 0.1 s ticks and 2.5-3 in
0.5 s ones (benchmarks/RESULTS.md). The tick is a twentieth of the interval, at most MAX_TICK_SECONDS,
so a probe starts at most 5 % of its interval early. Timing does not suffer: the TCP round trip is
the kernel's (below) and the Ping's is taken in gRPC's callback; a peer's connect is answered by the
kernel's handshake, and a probe reset at once never reaches accept() (agent.listen_tcp). A token
bucket caps probes per second and a counter caps probes in flight; a probe that cannot start is
skipped and counted, never queued (a backlog would only measure ourselves). Nothing here blocks:
gRPC calls are futures and TCP connects are non-blocking sockets under one selector.

- Ping: a Ping RPC over a long-lived HTTP/2 channel to the peer. Its round trip is the
  application's view; a lost packet shows as a TCP retransmission (>= 200 ms), a dead path as a
  timeout (lost), a reply from another node as lost. By default only on the first rail the two
  nodes share (`ping_all_rails` pings every rail): each channel costs about 47 KiB and each call
  a few hundred microseconds of CPU in gRPC Python, which at 8 rails would put the agent over
  its budget (benchmarks/RESULTS.md), while the rails' paths are what the TCP probes measure. For
  the same reason a peer is pinged every `ping_interval_seconds` (30 s), with every third of its
  TCP probes: the verdicts rest on the TCP probes, and the Ping adds the application's round trip
  and whether the peer's agent answers. With `tcp_probe` off, every probe is a Ping.
- TCP: a fresh connect per probe to the peer's TCP probe port (`tcp_port`), from a fresh source
  port (ECMP spreads them over paths), timed
  SYN to SYN-ACK and reset at once. Linux retransmits a SYN after 1 s and again after 3 s, so a
  connect that needed a second SYN saw its SYN or SYN-ACK dropped (Pingmesh infers drops this
  way); past the timeout it is lost. A refused connect (RST) crossed the network and counts as
  answered: the Ping shows whether the agent is there. The round trip and the retransmission are
  the kernel's own (TCP_INFO: its RTT sample of the handshake, its count of SYNs sent again), not
  the time this loop noticed the connect: a CPU-starved agent must not report its own delay as a
  slow or lossy network.
"""
from __future__ import annotations

import errno
import hashlib
import heapq
import logging
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from nodehealth.logs import RateLimitedLog
from nodehealth.pingmesh import ping_wire
from nodehealth.pingmesh.pinglist import Target

log = logging.getLogger("nodehealth.probe")

SYN_RETRANSMIT_SECONDS = 0.9  # Linux's initial RTO is 1 s: a connect this slow retransmitted (without TCP_INFO)
# struct tcp_info (linux/tcp.h), stable since 2.6: tcpi_rtt (us) at byte 68, tcpi_total_retrans at byte 100.
TCP_INFO_BYTES, TCPI_RTT, TCPI_TOTAL_RETRANS = 104, 68, 100
MAX_WAIT_SECONDS = 0.5  # with nothing to probe or answer, the loop still looks for a new pinglist this often
MAX_TICK_SECONDS = 0.5  # otherwise it wakes once a tick: probes start up to a tick early, finished ones are seen late
TICKS_PER_INTERVAL = 20
MAX_ACCEPTS_PER_WAKE = 64  # peers' TCP probes answered per turn of the loop (330 peers send 33 a second)
ACCEPT_PAUSE_SECONDS = 1.0  # out of descriptors, peers' probes wait in the kernel's backlog this long
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

# record(target, probe, sent_at_wall, rtt_seconds_or_None, retransmitted)
Record = Callable[[Target, str, float, "float | None", bool], None]


class Prober:
    def __init__(self, node: str, cfg: dict[str, Any], record: Record, tls: Any = None):
        self.node = node
        self.tls = tls  # the mesh identity (nodehealth.tls.identity.Identity) when tls.enabled
        self.cfg = cfg
        self.record = record
        self.interval = float(cfg["probe_interval_seconds"])
        self.tick = min(MAX_TICK_SECONDS, self.interval / TICKS_PER_INTERVAL)
        # A pinged peer gets its Ping with every `ping_every`-th probe (ping_interval_seconds); with no TCP
        # probes the Pings are the evidence, and go with every probe.
        self.ping_every = max(1, round(float(cfg["ping_interval_seconds"]) / self.interval)) if cfg["tcp_probe"] else 1
        self.timeout = float(cfg["timeout_seconds"])
        self.max_in_flight = int(cfg["max_concurrency"])
        self.rate = float(cfg["max_probes_per_second"])
        self.padding = b"\0" * int(cfg["payload_bytes"])
        self.sources: dict[int, str] = {}  # rail -> this node's address on it (TCP probes bind to it)
        self.pinged: set[tuple[str, int]] = set()  # (peer, rail) that also get a gRPC Ping
        self.lock = threading.Lock()
        self.targets: list[Target] = []
        self.changed = threading.Event()
        self.in_flight = 0
        self.skipped = 0  # probes not started: rate or concurrency cap
        self.started = 0
        # "addr:port" -> (channel, stub, (TLS generation, the node its certificate must name))
        self.channels: dict[str, tuple[Any, Any, tuple[int, str]]] = {}
        self.seq = 0
        self.tokens = self.rate
        self.refilled = time.monotonic()
        self.listener: socket.socket | None = None  # peers' TCP probes that stay land here: accepted, closed
        self.accept_paused_until: float | None = None  # out of descriptors: not accepting until then
        self.trouble = RateLimitedLog(log)

    def accept_probes(self, listener: socket.socket) -> None:
        """Answer peers' TCP probes on this listening socket from the probing loop (no thread)."""
        self.listener = listener

    def set_targets(self, targets: Sequence[Target], sources: dict[int, str] | None = None) -> None:
        first: dict[str, int] = {}
        for t in targets:
            first[t.node] = min(first.get(t.node, t.rail), t.rail)
        pinged = {(t.node, t.rail) for t in targets if self.cfg["ping_all_rails"] or first[t.node] == t.rail}
        with self.lock:
            self.targets = list(targets)
            self.sources = {rail: address for rail, address in (sources or {}).items() if address}
            self.pinged = pinged
        self.changed.set()

    # -- the loop ------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        sel = selectors.DefaultSelector()
        if self.listener is not None:
            sel.register(self.listener, selectors.EVENT_READ, None)
        self.accept_paused_until = None
        heap: list[tuple[float, int, Target]] = []
        rounds: list[int] = []  # probes of each target so far, by its index in the heap's entries
        try:
            while not stop.is_set():
                if self.accept_paused_until is not None and time.monotonic() >= self.accept_paused_until:
                    self.accept_paused_until = None
                    sel.register(self.listener, selectors.EVENT_READ, None)
                if self.changed.is_set():
                    self.changed.clear()
                    heap = self._schedule()
                    rounds = [0] * len(heap)
                    self._drop_channels({_endpoint(t, self.cfg) for _, _, t in heap})
                self._poll_connects(sel, 0.0)  # first: what finished is no longer in flight
                now = time.monotonic()
                while heap and heap[0][0] <= now + self.tick:
                    due, n, target = heapq.heappop(heap)
                    self._probe(target, sel, ping=(rounds[n] + n) % self.ping_every == 0)  # Pings spread out too
                    rounds[n] += 1
                    heapq.heappush(heap, (max(due + self.interval, now), n, target))
                if heap or sel.get_map():
                    stop.wait(self.tick)
                else:
                    self.changed.wait(MAX_WAIT_SECONDS)  # nothing to probe or answer: a new pinglist wakes it
        finally:
            self._poll_connects(sel, 0.0)  # what finished since the last tick counts
            for key in list(sel.get_map().values()):
                if key.data is not None:  # cut short by our own stop: not measured, so skipped, never lost
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                    self._skipped_after_admission()
            sel.close()
            self._drop_channels(set())

    def _schedule(self) -> list[tuple[float, int, Target]]:
        """Each peer's first probe at a stable phase within the interval, so probes spread evenly."""
        now = time.monotonic()
        with self.lock:
            targets = list(self.targets)
        heap = []
        for n, t in enumerate(targets):
            digest = hashlib.blake2b(f"{self.node}|{t.node}|{t.rail}".encode(), digest_size=8).digest()
            phase = int.from_bytes(digest, "big") / 2**64 * self.interval
            heap.append((now + phase, n, t))
        heapq.heapify(heap)
        return heap

    def _admit(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.refilled) * self.rate)
        self.refilled = now
        with self.lock:
            if self.tokens < 1 or self.in_flight >= self.max_in_flight:
                self.skipped += 1
                return False
            self.tokens -= 1
            self.in_flight += 1
            self.started += 1
        return True

    def _done(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def _skipped_after_admission(self) -> None:
        """An admitted probe this process did not measure: skipped, never lost (the network did not lose it)."""
        with self.lock:
            self.in_flight -= 1
            self.started -= 1
            self.skipped += 1

    def _not_started(self, target: Target, error: OSError) -> None:
        """A probe admitted but not sent for want of this process's own resources."""
        self._skipped_after_admission()
        self.trouble.warning("resources", f"pingmesh: cannot probe {target.address}: {error.strerror or error}; "
                                          "skipped and counted")

    def _probe(self, target: Target, sel: selectors.BaseSelector, ping: bool) -> None:
        if ping and (target.node, target.rail) in self.pinged and self._admit():
            self._ping(target)
        if self.cfg["tcp_probe"] and self._admit():
            self._connect(target, sel)

    # -- gRPC Ping -----------------------------------------------------------------------------
    def _ping(self, target: Target) -> None:
        sent_wall = time.time()
        self.seq += 1
        seq = self.seq
        try:
            endpoint, entry = self._ping_call(target)
            start = time.monotonic_ns()
            call = entry[1].future(ping_wire.encode_request(seq, start, self.node, self.padding), timeout=self.timeout)
        except Exception as e:  # a malformed address must cost one probe, not the loop
            log.debug("ping %s: %s", target.address, e)
            self.record(target, "ping", sent_wall, None, False)
            self._done()
            return

        def done(f: Any) -> None:
            rtt = (time.monotonic_ns() - start) / 1e9
            try:
                reply = f.result()
                ok = reply.seq == seq and reply.node == target.node
            except Exception:  # deadline, unavailable, a garbled peer: the probe is lost
                if self.channels.get(endpoint) is not entry:  # we closed its channel (our stop, a new pinglist)
                    self._skipped_after_admission()
                    return
                ok = False
            self.record(target, "ping", sent_wall, rtt if ok else None, False)
            self._done()

        call.add_done_callback(done)

    def _ping_call(self, target: Target) -> tuple[str, tuple[Any, Any, tuple[int, str]]]:
        """The target's endpoint and channel entry (made here once): (channel, the Ping method, what it was
        made for); the method takes the request's bytes and gives the reply read by ping_wire."""
        import grpc

        endpoint = _endpoint(target, self.cfg)
        entry = self.channels.get(endpoint)
        generation, credentials = self.tls.grpc_channel_credentials() if self.tls is not None else (0, None)
        made_for = (generation, target.node)
        if entry is not None and entry[2] != made_for:  # rotated certificates, or another node at the address
            self.channels.pop(endpoint)[0].close()
            entry = None
        if entry is None:
            # With TLS the peer's certificate must name the node this target is (its address alone proves nothing).
            secure = [("grpc.ssl_target_name_override", target.node)] if credentials is not None else []
            channel = _channel(grpc, endpoint, credentials, secure + [
                ("grpc.max_receive_message_length", 64 * 1024),
                ("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0),  # a probe is never proxied nor retried
                ("grpc.http2.bdp_probe", 0),  # Pings are small: no flow-control window to size by PING frames
                # A Ping to a peer whose connection is down fails at once (lost) until gRPC reconnects:
                # retry every second at most, so a repaired path stops counting as lossy within one.
                ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 1000)])
            ping = channel.unary_unary(ping_wire.METHOD, response_deserializer=ping_wire.decode_reply,
                                       _registered_method=True)  # as protoc's stubs: the path interned once
            entry = (channel, ping, made_for)
            self.channels[endpoint] = entry
        return endpoint, entry

    def _drop_channels(self, keep: set[str]) -> None:
        for endpoint in [e for e in self.channels if e not in keep]:
            self.channels.pop(endpoint)[0].close()

    # -- TCP connect ---------------------------------------------------------------------------
    def _connect(self, target: Target, sel: selectors.BaseSelector) -> None:
        sent_wall = time.time()
        family = socket.AF_INET6 if ":" in target.address else socket.AF_INET
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError as e:  # out of descriptors: this loop must live on (a dead prober made every peer lose us)
            self._not_started(target, e)
            return
        try:
            s.setblocking(False)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, no TIME_WAIT
            source = self.sources.get(target.rail)
            if source and (":" in source) == (family == socket.AF_INET6):
                try:
                    s.bind((source, 0))
                except OSError:
                    pass  # not an address of this host (a stale inventory): let routing choose
            start = time.monotonic()
            code = s.connect_ex((target.address, int(self.cfg["tcp_port"])))
        except OSError as e:
            log.debug("connect %s: %s", target.address, e)
            s.close()
            self.record(target, "tcp", sent_wall, None, False)
            self._done()
            return
        if code not in (0, errno.EINPROGRESS):
            s.close()
            self.record(target, "tcp", sent_wall, time.monotonic() - start if code == errno.ECONNREFUSED else None,
                        False)
            self._done()
            return
        sel.register(s, selectors.EVENT_WRITE, (target, sent_wall, start))

    def _poll_connects(self, sel: selectors.BaseSelector, wait: float) -> None:
        if not sel.get_map():
            self.changed.wait(wait)  # a new pinglist wakes the loop at once
            return
        for key, _ in sel.select(wait):
            if key.data is None:
                self._accept_all(sel)
                continue
            target, sent_wall, start = key.data
            seen = time.monotonic() - start  # includes however late this loop got here
            err = key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err not in (0, errno.ECONNREFUSED):
                self._finish_connect(sel, key.fileobj, key.data, None)
                continue
            rtt, retransmitted = handshake(key.fileobj)
            if retransmitted is None:
                retransmitted = seen >= SYN_RETRANSMIT_SECONDS
            # A retransmitted handshake's sample is the last SYN's alone: the probe's time is the one seen
            # (over a second, and late by up to a tick).
            self._finish_connect(sel, key.fileobj, key.data, seen if rtt is None or retransmitted else rtt,
                                 retransmitted)
        now = time.monotonic()
        for key in list(sel.get_map().values()):
            if key.data is not None and now - key.data[2] >= self.timeout:
                self._finish_connect(sel, key.fileobj, key.data, None)

    def _accept_all(self, sel: selectors.BaseSelector) -> None:
        """Accept and close the probe connections the kernel hands over (one that stayed open or closed with
        a FIN; a prober's reset one ends in the kernel): the handshake was the answer. At most
        MAX_ACCEPTS_PER_WAKE at a time, so a flood of connects from anyone delays our own probes by a
        bounded amount (the kernel's backlog drops the excess). Out of descriptors, the listener
        stays readable and this loop would spin: it rests for ACCEPT_PAUSE_SECONDS."""
        for _ in range(MAX_ACCEPTS_PER_WAKE):
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in OUT_OF_DESCRIPTORS:
                    sel.unregister(self.listener)
                    self.accept_paused_until = time.monotonic() + ACCEPT_PAUSE_SECONDS
                    self.trouble.warning("accept", f"pingmesh: cannot answer TCP probes: {e.strerror}")
                    return
                continue  # ECONNABORTED and the like: the prober gave up; nothing to answer
            conn.close()

    def _finish_connect(self, sel: selectors.BaseSelector, s: Any, data: tuple, rtt: float | None,
                        retransmitted: bool = False) -> None:
        target, sent_wall, _ = data
        sel.unregister(s)
        s.close()
        self.record(target, "tcp", sent_wall, rtt, rtt is not None and retransmitted)
        self._done()


def handshake(s: socket.socket) -> tuple[float | None, bool | None]:
    """The kernel's account of a finished connect: its RTT sample of the handshake (None when it took
    none, e.g. a refused connect) and whether it sent the SYN again (None without TCP_INFO)."""
    try:
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES)
    except OSError:
        return None, None
    if len(info) < TCP_INFO_BYTES:
        return None, None
    (rtt_us,) = struct.unpack_from("I", info, TCPI_RTT)
    (retrans,) = struct.unpack_from("I", info, TCPI_TOTAL_RETRANS)
    return (rtt_us / 1e6 if rtt_us else None), retrans > 0


def _channel(grpc: Any, endpoint: str, credentials: Any, options: list) -> Any:
    if credentials is None:
        return grpc.insecure_channel(endpoint, options=options)
    return grpc.secure_channel(endpoint, credentials, options=options)


def _endpoint(target: Target, cfg: dict[str, Any]) -> str:
    host = f"[{target.address}]" if ":" in target.address else target.address
    return f"{host}:{int(cfg['port'])}"
