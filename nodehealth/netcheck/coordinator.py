"""netcheck's coordinator (`netcheck run`, or the first node of a `netcheck job`): asks every agent
who it is, claims them for one job, plans the rounds with nodehealth.netcheck.rounds, runs each
round's pairs at once, and releases the agents.

Every result says which test made it: TCP measures the hosts' TCP path, not RDMA.
"""
from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from nodehealth.host import addresses
from nodehealth.netcheck.admission import CLAIM_LINE, MAX_LEASE
from nodehealth.netcheck.agent import RDMA, TCP
from nodehealth.netcheck.rounds import TEST_NAMES, Netcheck, PairResult, waves
from nodehealth.netcheck.wire import (
    CONNECT_TIMEOUT,
    MAX_LINE,
    StreamError,
    endpoint,
    is_address,
    request,
    split_endpoint,
)


@dataclass(frozen=True)
class Host:
    endpoint: str  # where the coordinator reaches its agent
    name: str
    data: str  # where peers stream to: ADDR:PORT, an address (the agents admit each other by address)
    methods: tuple[str, ...] = (TCP,)
    rdma: str = ""  # its verbs device, as the agent describes it


@dataclass(frozen=True)
class Job:
    """With `tls` (the mesh's identity), every request goes under mutual TLS, to the agent whose
    certificate names the host asked (a hello's name is proved by the claim that follows it)."""
    id: str
    source: str | None = None  # the coordinator's address towards the agents (None: as routed)
    tls: Any = None

    @classmethod
    def new(cls, source: str | None = None, tls: Any = None) -> Job:
        return cls(secrets.token_hex(8), source, tls)

    def ask(self, host: Host, msg: dict, timeout: float, limit: int = MAX_LINE) -> dict | str:
        """The answer of `host`'s agent, or why there is none."""
        return _try(request, host.endpoint, msg, timeout, limit, self.source, self.tls, host.name)


def hello(endpoints: Sequence[str], timeout: float, source: str | None = None, tls: Any = None
          ) -> tuple[list[Host], list[tuple[str, str]]]:
    """Ask every agent who it is; the unreachable ones are returned with the reason."""
    hosts, problems = [], []
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(endpoints)))) as pool:
        answers = pool.map(lambda e: _try(request, e, {"op": "hello"}, timeout, MAX_LINE, source, tls), endpoints)
        for ep, answer in zip(endpoints, answers):
            if isinstance(answer, str):
                problems.append((ep, answer))
                continue
            data = _data_address(ep, answer.get("data"))
            if not isinstance(answer.get("name"), str) or data is None:
                problems.append((ep, "its hello has no name or no data address that resolves"))
                continue
            methods = answer.get("methods")
            methods = tuple(m for m in methods if m in (TCP, RDMA)) if isinstance(methods, list) else (TCP,)
            rdma = answer.get("rdma") if isinstance(answer.get("rdma"), str) else ""
            hosts.append(Host(ep, answer["name"][:200], data, methods or (TCP,), rdma[:200]))
    return hosts, problems


def _data_address(agent: str, data: object) -> str | None:
    """The agent's data address as an address: an unspecified one (it listens on all) is where the
    coordinator reached it; a name is resolved here, once, so that every agent gets the same."""
    if not isinstance(data, str):
        return None
    try:
        host, port = split_endpoint(data[:200])
    except ValueError:
        return None
    if host in ("", "0.0.0.0", "::"):
        host = split_endpoint(agent)[0]
    if not is_address(host):
        found = sorted(addresses(host))
        if not found:
            return None
        host = found[0]
    return endpoint(host, port)


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


def lease(seconds: float, max_rounds: int, method: str) -> float:
    """How long a job holds its agents at most: every round in two waves, and the checks after it."""
    return min(MAX_LEASE, max_rounds * (2 * (seconds + PAIR_SLACK[method]) + 2 * CONNECT_TIMEOUT) + 60.0)


def claim(hosts: Sequence[Host], job: Job, seconds: float) -> list[tuple[str, str]]:
    """Claim every agent for the job, its members being every host's addresses; the agents that
    refused, with the reason."""
    members = sorted({split_endpoint(h.data)[0] for h in hosts}
                     | {a for h in hosts for a in _addresses(split_endpoint(h.endpoint)[0])})
    msg = {"op": "claim", "job": job.id, "members": members, "seconds": seconds}
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        answers = pool.map(lambda h: job.ask(h, msg, CONNECT_TIMEOUT * 2, CLAIM_LINE), hosts)
        return [(h.endpoint, f"its agent did not take the job: {a if isinstance(a, str) else a.get('error')}"[:300])
                for h, a in zip(hosts, answers) if isinstance(a, str) or a.get("ok") is not True]


def release(hosts: Sequence[Host], job: Job) -> None:
    """Free the agents for the next job (an agent frees itself at the lease's end anyway)."""
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        list(pool.map(lambda h: job.ask(h, {"op": "release", "job": job.id}, CONNECT_TIMEOUT), hosts))


def _addresses(host: str) -> set[str]:
    return {host} if is_address(host) else addresses(host)


def run_pair(a: Host, b: Host, seconds: float, method: str, job: Job) -> PairResult:
    """`a` sends to `b`; a failure says what was measured between which nodes, or that the
    coordinator could not ask `a` at all."""
    answer = job.ask(a, {"op": "send", "job": job.id, "to": b.data, "name": b.name, "seconds": seconds,
                         "method": method}, seconds + PAIR_SLACK[method])
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


def run_rounds(nc: Netcheck, hosts: dict[str, Host], seconds: float, method: str, job: Job) -> None:
    """Every round's pairs run at once (waves only where a node is in two tests). After a round,
    the agents of its failed tests are asked who they are: one that does not answer is unreachable,
    and its failed tests measured nothing."""
    with ThreadPoolExecutor(max_workers=min(256, max(1, len(hosts)))) as pool:
        while pairs := nc.next_round():
            results: list[PairResult] = []
            for wave in waves(pairs):
                results += pool.map(lambda p: run_pair(hosts[p[0]], hosts[p[1]], seconds, method, job), wave)
            failed = sorted({n for t in results if not t.ok for n in (t.a, t.b)})
            answers = pool.map(lambda n: job.ask(hosts[n], {"op": "hello"}, CONNECT_TIMEOUT * 2), failed)
            nc.record(results, {n: f"its agent at {hosts[n].endpoint} does not answer: {a}"
                                for n, a in zip(failed, answers) if isinstance(a, str)})
