"""netcheck's agent on every node: its pair tests, and the rendezvous of a `netcheck job`.

The agent (`nodehealth netcheck serve`, or inside `netcheck job`) answers one JSON line per connection on its port:
- `{"op": "hello"}`: its name and the data address its peers stream to;
- `{"op": "send", "to": "ADDR:PORT", "seconds": S}`: stream to that peer's sink for S seconds and
  answer the Gb/s the peer's TCP acknowledged (nodehealth/netcheck/stream.py), or the error;
- `{"op": "sink", "seconds": S}`: say ready, then take what arrives for at most S seconds (and a slack);
- `{"op": "send", ..., "method": "rdma"}` and `{"op": "rdma-serve", "seconds": S}`: the same test
  with rdma-bw (RDMA WRITE between the agents' verbs devices, nodehealth/rdma/pair.py) when the
  agent has a device (its hello lists the methods it offers);
- `{"op": "join", "name": N, "agent": "ADDR:PORT"}`, on the node that coordinates a `netcheck job`
  only: the node is taken into the job (Rendezvous) and answered with the verdict at the end.
Requests come from the network: the listener (nodehealth/netcheck/listener.py) bounds the
connections and each request line; here each kind of request has its own bound of threads (past
it the answer is busy), every exchange its deadline, and durations are capped.

With the mesh's identity (`tls`), every connection is mutual TLS from the cluster CA: a node joins
a job only under a name its certificate carries, and a `send` streams only to the agent whose
certificate names the node the coordinator named (`name`).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nodehealth.netcheck import stream
from nodehealth.netcheck.admission import Admission
from nodehealth.netcheck.listener import Listener, Request
from nodehealth.netcheck.wire import (
    CONNECT_TIMEOUT,
    MAX_LINE,
    StreamError,
    connect,
    endpoint,
    read_line,
    request,
    send_line,
    split_endpoint,
)

if TYPE_CHECKING:
    from nodehealth.rdma.pair import Setup

log = logging.getLogger("nodehealth.netcheck")

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


# Threads per kind of request: tests are few at once (a node is in one test a round), answers quick.
SLOTS = {"hello": 8, "claim": 4, "release": 4, "send": MAX_STREAMS, "sink": MAX_STREAMS, "rdma-serve": 4}
ANSWER_SECONDS = CONNECT_TIMEOUT  # the longest an answer may take to go out


class Agent:
    def __init__(self, listen: tuple[str, int], cfg: AgentConfig, rendezvous: Rendezvous | None = None,
                 admission: Admission | None = None, tls: Any = None):
        """`admission` says who may ask what (by default: jobs from this host only); the agents of
        one node (its control and its data address) share one. `tls`: the mesh's identity, or None."""
        self.cfg = cfg
        self.tls = tls
        self.rendezvous = rendezvous  # on the node that coordinates a `netcheck job`
        self.admission = admission or Admission()
        self._slots = {op: threading.BoundedSemaphore(n) for op, n in SLOTS.items()}
        if rendezvous is not None:  # every node of the job waits on its join for the verdict
            self._slots["join"] = threading.BoundedSemaphore(rendezvous.capacity + SLOTS["hello"])
        self._rdma_server = None
        if cfg.rdma is not None:
            from nodehealth.rdma import pair

            self._rdma_server = pair.Server(cfg.rdma, split_endpoint(cfg.data_address)[0])
        self.listener = Listener(listen, self._dispatch, self.admission.admits,
                                 lambda source: self.admission.line_limit(source, MAX_LINE),
                                 extra=rendezvous.capacity if rendezvous else 0, tls=tls)
        self.server_address = self.listener.address

    def start(self) -> None:
        self.listener.start()

    def close(self) -> None:
        self.listener.close()

    def _dispatch(self, req: Request) -> None:
        """On the listener's thread: start the request's work on a thread of its kind, or refuse it."""
        op = req.msg.get("op")
        slot = self._slots.get(op) if isinstance(op, str) else None
        if slot is None or not slot.acquire(blocking=False):
            why = f"unknown op {str(op)[:40]!r}" if slot is None else f"busy: too many {op} requests at once"
            try:
                req.sock.settimeout(0.0)
                send_line(req.sock, {"error": why})
            except OSError:
                pass
            req.close()
            return
        threading.Thread(target=self._serve, args=(req, op, slot), name=f"netcheck-{op}", daemon=True).start()

    def _serve(self, req: Request, op: str, slot: threading.BoundedSemaphore) -> None:
        try:
            answer = self._answer(req, op)
            if answer is not None:
                req.sock.settimeout(ANSWER_SECONDS)
                send_line(req.sock, answer)
        except (StreamError, OSError) as e:
            try:
                req.sock.settimeout(ANSWER_SECONDS)
                send_line(req.sock, {"error": str(getattr(e, "strerror", None) or e)[:200]})
            except OSError:
                pass
        except Exception:  # noqa: BLE001 - never a silent death: the request is dropped, the agent goes on
            log.exception("netcheck: the agent failed to answer a %s request", op)
        finally:
            slot.release()
            req.close()

    def _answer(self, req: Request, op: str) -> dict | None:
        msg = req.msg
        if op == "hello":
            cfg = self.cfg
            return {"name": cfg.name, "data": cfg.data_address, "methods": cfg.methods(),
                    "rdma": cfg.rdma.describe() if cfg.rdma else None}
        if op == "claim":
            return self.admission.claim(req.source, msg)
        if op == "release":
            return self.admission.release(req.source, msg)
        if op == "send":
            return self.send(msg, req.source)
        if op in ("sink", "rdma-serve"):
            if op == "rdma-serve" and self._rdma_server is None:
                return {"error": "this agent has no RDMA device"}
            if why := self.admission.member(req.source, msg):
                return {"error": why}
            if op == "rdma-serve":
                return self.rdma_serve(msg)
            seconds = msg.get("seconds")
            if not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_SECONDS:
                return {"error": f"a sink needs 0 < seconds <= {MAX_SECONDS:g}"}
            stream.sink(req.sock, float(seconds))
            return None
        assert self.rendezvous is not None  # join has a slot only then
        self.rendezvous.deliver(req.sock, self.rendezvous.join(msg, req.source,
                                                               req.names if self.tls is not None else None))
        return None

    def send(self, msg: dict, source: str) -> dict:
        """Test towards `to` on the coordinator's request: only the job's coordinator may ask, and
        only towards an agent of the job."""
        seconds, to, method = msg.get("seconds"), msg.get("to"), msg.get("method", TCP)
        if not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_SECONDS or not isinstance(to, str):
            return {"error": f"a send needs 'to' (ADDR:PORT) and 0 < seconds <= {MAX_SECONDS:g}"}
        if method not in self.cfg.methods():
            return {"error": f"this agent has no {str(method)[:20]!r} test (it offers {', '.join(self.cfg.methods())})"}
        try:
            to_host = split_endpoint(to)[0]
        except ValueError as e:
            return {"error": str(e)}
        if why := self.admission.may_send(source, msg, to_host):
            return {"error": why}
        name = msg.get("name")  # the node `to` is: with TLS its certificate must say so
        if self.tls is not None and not isinstance(name, str):
            return {"error": "with TLS a send names the node it streams to ('name')"}
        job = {"job": msg.get("job")}
        try:
            if method == RDMA:
                return {"gbps": self._rdma_send(to, float(seconds), job, name), "method": RDMA}
            measured = stream.stream_to(to, float(seconds), self._source(), job, self.tls, name)
            return {"gbps": measured.gbps, "retransmitted": measured.retransmitted, "method": TCP}
        except _Own as e:
            return {"error": str(e), "own": True}
        except (StreamError, OSError, ValueError) as e:
            return {"error": str(getattr(e, 'strerror', None) or e)[:300]}
        except Exception as e:  # noqa: BLE001 - bw.RdmaError, imported lazily: one line back to the coordinator
            return {"error": str(e)[:300]}

    def _source(self) -> str:
        """This agent's data address: its tests leave from it (peers admit them by it)."""
        return split_endpoint(self.cfg.data_address)[0]

    def _rdma_send(self, to: str, seconds: float, job: dict, name: str | None) -> float:
        from nodehealth.rdma import bw, pair

        try:  # a fault of this node's own device is told before the peer waits for it
            pair.preflight(self.cfg.rdma)
        except bw.RdmaError as e:
            raise _Own(f"{self.cfg.name}: {e}") from None
        answer = request(to, {**job, "op": "rdma-serve", "seconds": seconds}, CONNECT_TIMEOUT * 2,
                         source=self._source(), tls=self.tls, expect=name)
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
VERDICT_SECONDS = 30.0  # to send it


@dataclass(frozen=True)
class Member:
    name: str
    agent: str  # ADDR:PORT of its agent: where it joined from, at the port it announced


class Rendezvous:
    """The coordinating node's side of `netcheck job`: the others join, wait, and get the verdict.

    A join comes from the network: its name is bounded, its agent is reached where the node came
    from (at the port it names), at most `capacity` nodes (the job's size) are taken, and `accept`
    (the member and the address it came from) may refuse a node that is not one of the job's."""

    def __init__(self, capacity: int, answer_timeout: float,
                 accept: Callable[[Member, str], str | None] | None = None):
        self.capacity = capacity
        self.answer_timeout = answer_timeout
        self.accept = accept
        self.members: dict[str, Member] = {}
        self.delivered = 0  # verdicts that went out to joined nodes
        self._cond = threading.Condition()
        self._verdict: dict | None = None

    def add(self, member: Member, source: str) -> str | None:
        """Take a member that came from the address `source`; the reason when it is refused."""
        why = self.accept(member, source) if self.accept else None
        with self._cond:
            if why is None and self._verdict is not None:
                why = "too late: the check is over"
            if why is None and member.name not in self.members and len(self.members) >= self.capacity:
                why = f"the job's {self.capacity} nodes have joined already"
            if why is None:
                self.members[member.name] = member
                self._cond.notify_all()
        return why

    def join(self, msg: dict, source: str, names: list[str] | None = None) -> dict:
        """`names`: with TLS, what the joining connection's certificate proves; the name must be one."""
        name, address = msg.get("name"), msg.get("agent")
        if not isinstance(name, str) or not 0 < len(name) <= 200 or not isinstance(address, str):
            return {"error": "a join needs a name (at most 200 characters) and its agent's ADDR:PORT"}
        if names is not None and name not in names:
            return {"error": f"{name[:200]} joins with a certificate of {', '.join(names)[:200] or 'nobody'}"}
        try:
            port = split_endpoint(address)[1]
        except ValueError as e:
            return {"error": str(e)}
        why = self.add(Member(name, endpoint(source, port)), source)
        if why:
            return {"error": why}
        with self._cond:
            self._cond.wait_for(lambda: self._verdict is not None, self.answer_timeout)
            return self._verdict or {"error": "the coordinator gave no verdict in time"}

    def deliver(self, sock, answer: dict) -> None:
        """Send a joined node its answer, and count it when it is the verdict."""
        sock.settimeout(VERDICT_SECONDS)
        send_line(sock, answer)
        if "verdict" in answer:
            with self._cond:
                self.delivered += 1
                self._cond.notify_all()

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
            self._cond.wait_for(lambda: self.delivered >= len(self.members) - 1, linger)


def join(coordinator: str, msg: dict, deadline: float, answer_timeout: float, source: str | None = None,
         tls: Any = None) -> dict:
    """Join the coordinator's rendezvous from the address `source` (the coordinator admits nodes by
    the address they come from), retrying while it is not up yet; its verdict."""
    while True:
        try:
            s = connect(coordinator, CONNECT_TIMEOUT, source, tls)
        except StreamError as e:
            if time.monotonic() > deadline:
                raise StreamError(f"the coordinator {coordinator} never answered: {e}") from None
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


