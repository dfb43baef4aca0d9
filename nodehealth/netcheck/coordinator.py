"""netcheck's coordinator (`netcheck run`, or the first node of a `netcheck job`): asks every agent
who it is, plans the rounds with nodehealth.netcheck.rounds and runs each round's pairs at once.

Every result says which test made it: TCP measures the hosts' TCP path, not RDMA.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from nodehealth.netcheck.agent import RDMA, TCP
from nodehealth.netcheck.rounds import TEST_NAMES, Netcheck, PairResult, waves
from nodehealth.netcheck.wire import CONNECT_TIMEOUT, StreamError, request


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
