"""netcheck's agent on every node, its pair tests, and the coordinator that runs the rounds.

The agent (`nodehealth netcheck serve`, or inside `netcheck job`) answers one JSON line per connection on its port:
- `{"op": "hello"}`: its name and the data address its peers stream to;
- `{"op": "send", "to": "ADDR:PORT", "seconds": S}`: stream to that peer's agent for S seconds and
  answer the Gb/s the peer acknowledged (or the error);
- `{"op": "sink"}`: count what arrives until the sender closes, then answer the byte count;
- `{"op": "send", ..., "method": "rdma"}` and `{"op": "rdma-serve", "seconds": S}`: the same test
  with rdma-bw (RDMA WRITE between the agents' verbs devices, nodehealth/rdma/pair.py) when the
  agent has a device (its hello lists the methods it offers);
- `{"op": "join", "name": N, "agent": "ADDR:PORT"}`, on the node that coordinates a `netcheck job`
  only: the node is taken into the job (Rendezvous) and answered with the verdict at the end.
Requests come from the network, so a line is bounded (MAX_LINE), the duration is capped, at most
MAX_STREAMS tests run at once and a rendezvous takes no more nodes than the job has. The
coordinator (`netcheck run`, or the first node of a `netcheck job`) plans the rounds with
nodehealth.netcheck.rounds and runs each round's pairs concurrently.

Every result says which test made it: TCP measures the hosts' TCP path, not RDMA.
"""
from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nodehealth.netcheck import stream
from nodehealth.netcheck.rounds import TEST_NAMES, Netcheck, PairResult, waves
from nodehealth.netcheck.wire import (CONNECT_TIMEOUT, MAX_LINE, StreamError, read_line, request, send_line,
                                      split_endpoint)

if TYPE_CHECKING:
    from nodehealth.rdma.pair import Setup

MAX_SECONDS = 60.0
MAX_STREAMS = 8


class _Own(Exception):
    """A failure of the sending node's own device, told as such."""


TCP, RDMA = "tcp", "rdma"


@dataclass
class AgentConfig:
    name: str
    data_address: str  # ADDR:PORT peers stream to
    rdma: Setup | None = None  # the verbs device this agent tests with; None: TCP only

    def methods(self) -> list[str]:
        return [TCP, RDMA] if self.rdma else [TCP]


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: Agent = self.server  # type: ignore[assignment]
        sock: socket.socket = self.request
        try:
            msg, _ = read_line(sock, time.monotonic() + CONNECT_TIMEOUT)
            op = msg.get("op")
            if op == "hello":
                cfg = server.cfg
                send_line(sock, {"name": cfg.name, "data": cfg.data_address, "methods": cfg.methods(),
                                 "rdma": cfg.rdma.describe() if cfg.rdma else None})
            elif op == "sink":
                seconds = msg.get("seconds")
                if not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_SECONDS:
                    send_line(sock, {"error": f"a sink needs 0 < seconds <= {MAX_SECONDS:g}"})
                else:
                    stream.sink(sock, float(seconds))
            elif op == "send":
                send_line(sock, server.send(msg))
            elif op == "rdma-serve":
                send_line(sock, server.rdma_serve(msg))
            elif op == "join" and server.rendezvous is not None:
                send_line(sock, server.rendezvous.join(msg))
            else:
                send_line(sock, {"error": f"unknown op {str(op)[:40]!r}"})
        except (StreamError, OSError) as e:
            try:
                send_line(sock, {"error": str(e)[:200]})
            except OSError:
                pass


class Agent(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, listen: tuple[str, int], cfg: AgentConfig):
        super().__init__(listen, _Handler)
        self.cfg = cfg
        self._slots = threading.BoundedSemaphore(MAX_STREAMS)
        self.rendezvous: Rendezvous | None = None  # set on the node that coordinates a `netcheck job`
        self._rdma_server = None
        if cfg.rdma is not None:
            from nodehealth.rdma import pair

            self._rdma_server = pair.Server(cfg.rdma, split_endpoint(cfg.data_address)[0])

    def send(self, msg: dict) -> dict:
        seconds, to, method = msg.get("seconds"), msg.get("to"), msg.get("method", TCP)
        if not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_SECONDS or not isinstance(to, str):
            return {"error": f"a send needs 'to' (ADDR:PORT) and 0 < seconds <= {MAX_SECONDS:g}"}
        if method not in self.cfg.methods():
            return {"error": f"this agent has no {str(method)[:20]!r} test (it offers {', '.join(self.cfg.methods())})"}
        if not self._slots.acquire(blocking=False):
            return {"error": "busy: too many tests at once"}
        try:
            if method == RDMA:
                return {"gbps": self._rdma_send(to, float(seconds)), "method": RDMA}
            measured = stream.stream_to(to, float(seconds), self._source())
            return {"gbps": measured.gbps, "retransmitted": measured.retransmitted, "method": TCP}
        except _Own as e:
            return {"error": str(e), "own": True}
        except (StreamError, OSError, ValueError) as e:
            return {"error": str(getattr(e, 'strerror', None) or e)[:300]}
        except Exception as e:  # noqa: BLE001 - bw.RdmaError, imported lazily: one line back to the coordinator
            return {"error": str(e)[:300]}
        finally:
            self._slots.release()

    def _source(self) -> str:
        """This agent's data address: its tests leave from it (peers admit them by it)."""
        return split_endpoint(self.cfg.data_address)[0]

    def _rdma_send(self, to: str, seconds: float) -> float:
        from nodehealth.rdma import bw
        from nodehealth.rdma import pair

        try:  # a fault of this node's own device is told before the peer waits for it
            pair.preflight(self.cfg.rdma)
        except bw.RdmaError as e:
            raise _Own(f"{self.cfg.name}: {e}") from None
        answer = request(to, {"op": "rdma-serve", "seconds": seconds}, CONNECT_TIMEOUT * 2, source=self._source())
        port = answer.get("port")
        if not isinstance(port, int) or not 0 < port < 65536:
            raise StreamError(f"the peer's rdma-bw server did not start: {str(answer.get('error'))[:200]}")
        return pair.client(self.cfg.rdma, split_endpoint(to)[0], port, seconds, timeout=CONNECT_TIMEOUT * 3)

    def rdma_serve(self, msg: dict) -> dict:
        """Start one rdma-bw server for a peer's test (the peer connects within a few seconds)."""
        seconds = msg.get("seconds")
        if self._rdma_server is None:
            return {"error": "this agent has no RDMA device"}
        if not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_SECONDS:
            return {"error": f"an rdma-serve needs 0 < seconds <= {MAX_SECONDS:g}"}
        return self._rdma_server.start(float(seconds))


MAX_VERDICT = 64 << 20  # the verdict a joined node reads back: every node's tests, ~200 B each


@dataclass(frozen=True)
class Member:
    name: str
    agent: str  # ADDR:PORT of its agent, as the node announced it


class Rendezvous:
    """The coordinating node's side of `netcheck job`: the others join, wait, and get the verdict.

    A join comes from the network: its name and address are bounded, and at most `capacity`
    nodes (the job's size) are taken; `accept` may refuse a node that is not one of the job's."""

    def __init__(self, capacity: int, answer_timeout: float, accept: Callable[[Member], str | None] | None = None):
        self.capacity = capacity
        self.answer_timeout = answer_timeout
        self.accept = accept
        self.members: dict[str, Member] = {}
        self.answered = 0
        self._cond = threading.Condition()
        self._verdict: dict | None = None

    def add(self, member: Member) -> str | None:
        """Take a member; the reason when it is refused."""
        why = self.accept(member) if self.accept else None
        with self._cond:
            if why is None and self._verdict is not None:
                why = "too late: the check is over"
            if why is None and member.name not in self.members and len(self.members) >= self.capacity:
                why = f"the job's {self.capacity} nodes have joined already"
            if why is None:
                self.members[member.name] = member
                self._cond.notify_all()
        return why

    def join(self, msg: dict) -> dict:
        name, address = msg.get("name"), msg.get("agent")
        if not isinstance(name, str) or not 0 < len(name) <= 200 or not isinstance(address, str):
            return {"error": "a join needs a name (at most 200 characters) and its agent's ADDR:PORT"}
        try:
            split_endpoint(address)
        except ValueError as e:
            return {"error": str(e)}
        why = self.add(Member(name, address))
        if why:
            return {"error": why}
        with self._cond:
            self._cond.wait_for(lambda: self._verdict is not None, self.answer_timeout)
            self.answered += 1
            self._cond.notify_all()
            return self._verdict or {"error": "the coordinator gave no verdict in time"}

    def wait(self, count: int, deadline: float) -> list[Member]:
        """The members once `count` have joined, or those there at the deadline."""
        with self._cond:
            self._cond.wait_for(lambda: len(self.members) >= count, max(0.0, deadline - time.monotonic()))
            return list(self.members.values())

    def finish(self, verdict: dict, linger: float) -> None:
        """Answer every waiting member, and give their answers up to `linger` seconds to go out."""
        with self._cond:
            self._verdict = verdict
            self._cond.notify_all()
            self._cond.wait_for(lambda: self.answered >= len(self.members) - 1, linger)


def join(coordinator: str, msg: dict, deadline: float, answer_timeout: float) -> dict:
    """Join the coordinator's rendezvous, retrying while it is not up yet; its verdict."""
    host, port = split_endpoint(coordinator)
    while True:
        try:
            s = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
        except OSError as e:
            if time.monotonic() > deadline:
                raise StreamError(f"the coordinator {coordinator} never answered: {e.strerror or e}") from None
            time.sleep(1.0)
            continue
        with s:
            try:
                send_line(s, msg)
                answer = read_line(s, time.monotonic() + answer_timeout, MAX_VERDICT)[0]
            except OSError as e:
                raise StreamError(f"the coordinator {coordinator} went away: {e.strerror or e}") from None
        if "error" in answer and "verdict" not in answer:
            raise StreamError(f"the coordinator {coordinator} refused this node: {str(answer['error'])[:200]}")
        return answer


@dataclass(frozen=True)
class Host:
    endpoint: str  # where the coordinator reaches its agent
    name: str
    data: str  # where peers stream to
    methods: tuple[str, ...] = (TCP,)
    rdma: str = ""  # its verbs device, as the agent describes it


def hello(endpoints: Sequence[str], timeout: float) -> tuple[list[Host], list[tuple[str, str]]]:
    """Ask every agent who it is; the unreachable ones are returned with the reason."""
    hosts, problems = [], []
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(endpoints)))) as pool:
        for ep, answer in zip(endpoints, pool.map(lambda e: _try(request, e, {"op": "hello"}, timeout), endpoints)):
            if isinstance(answer, str):
                problems.append((ep, answer))
            elif isinstance(answer.get("name"), str) and isinstance(answer.get("data"), str):
                methods = answer.get("methods")
                methods = tuple(m for m in methods if m in (TCP, RDMA)) if isinstance(methods, list) else (TCP,)
                rdma = answer.get("rdma") if isinstance(answer.get("rdma"), str) else ""
                hosts.append(Host(ep, answer["name"][:200], answer["data"][:200], methods or (TCP,), rdma[:200]))
            else:
                problems.append((ep, "its hello has no name or data address"))
    return hosts, problems


def _try(fn: Callable, *args) -> dict | str:
    try:
        return fn(*args)
    except (StreamError, ValueError) as e:
        return str(e)


def choose_method(hosts: Sequence[Host], wanted: str) -> str:
    """`auto`: RDMA when every agent has a verbs device (bandwidths of two methods do not compare,
    so one TCP-only agent makes it TCP for all); `rdma` or `tcp` as asked. ValueError names the
    agents that cannot do the asked method."""
    if wanted == "auto":
        return RDMA if hosts and all(RDMA in h.methods for h in hosts) else TCP
    lacking = [h.name for h in hosts if wanted not in h.methods]
    if lacking:
        raise ValueError(f"no {wanted} test on {', '.join(sorted(lacking))} (no verbs device found by its agent)")
    return wanted


# Beyond the test itself: the peer's server start, connects, and an RDMA test's stall detection.
PAIR_SLACK = {TCP: 3 * CONNECT_TIMEOUT, RDMA: 3 * CONNECT_TIMEOUT + 20.0}


def run_pair(a: Host, b: Host, seconds: float, method: str = TCP) -> PairResult:
    """`a` sends to `b`; a failure says what was measured between which nodes, or that the
    coordinator could not ask `a` at all."""
    answer = _try(request, a.endpoint, {"op": "send", "to": b.data, "seconds": seconds, "method": method},
                  seconds + PAIR_SLACK[method])
    if isinstance(answer, str):
        return PairResult(0, a.name, b.name, False, None, f"the coordinator's request to {a.name}'s agent failed: "
                          f"{answer}"[:300], method=method)
    gbps = answer.get("gbps")
    retransmitted = answer.get("retransmitted")
    retransmitted = float(retransmitted) if isinstance(retransmitted, (int, float)) else None
    if isinstance(gbps, (int, float)) and gbps > 0:
        return PairResult(0, a.name, b.name, True, float(gbps), method=method, retransmitted=retransmitted)
    why = str(answer.get("error", "no bandwidth in the answer"))[:200]
    return PairResult(0, a.name, b.name, False, None, f"{TEST_NAMES[method]} {a.name} -> {b.name}: {why}",
                      method=method, retransmitted=retransmitted)


def run_rounds(nc: Netcheck, hosts: dict[str, Host], seconds: float, method: str = TCP) -> None:
    """Every round's pairs run at once (waves only where a node is in two tests). After a round,
    the agents of its failed tests are asked who they are: one that does not answer is unreachable,
    and its failed tests measured nothing."""
    with ThreadPoolExecutor(max_workers=min(256, max(1, len(hosts)))) as pool:
        while pairs := nc.next_round():
            results: list[PairResult] = []
            for wave in waves(pairs):
                results += pool.map(lambda p: run_pair(hosts[p[0]], hosts[p[1]], seconds, method), wave)
            failed = sorted({n for t in results if not t.ok for n in (t.a, t.b)})
            answers = pool.map(lambda n: _try(request, hosts[n].endpoint, {"op": "hello"}, CONNECT_TIMEOUT * 2), failed)
            nc.record(results, {n: f"its agent at {hosts[n].endpoint} does not answer: {a}"
                                for n, a in zip(failed, answers) if isinstance(a, str)})
