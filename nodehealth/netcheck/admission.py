"""Who may ask a netcheck agent what: by the address a connection comes from, and the job.

An agent takes one job at a time: a coordinator claims it (`claim`, with the job's id and its
members' addresses, for a lease), and until the job is released or the lease runs out:
- only the claiming coordinator (the same address, the same job id) may make it `send`, and only
  towards a member of the job;
- only a member of the job may `sink` into it or have it start an rdma-bw server.
So an agent streams to nothing but an agent of its own job that agreed to take the stream, and a
stranger's few bytes of requests can make no agent send anything (before this, 440 bytes made one
send 62 GB).

Who may claim: the addresses given (`netcheck serve --coordinator`, the job's coordinator in
`netcheck job`), by default this host's own addresses. Where the job's hosts are known, the
listener closes a connection from any other address unread (`admits`).

Addresses are what TCP says the connection came from: an identity check (mutual TLS, tokens) is
to slot in beside them here, in `claim` and `member`, not to replace them.
"""
from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterable

MAX_LEASE = 3600.0  # a job's longest claim: 10 rounds of 60 s tests with their slack fit
MAX_MEMBERS = 100_000  # as discovery.MAX_HOSTS
CLAIM_LINE = 2 << 20  # a claim names every member's addresses: ~20 bytes each


class Admission:
    def __init__(self, coordinators: Iterable[str] | None = None, hosts: Iterable[str] | None = None):
        """`coordinators`: addresses or networks (10.0.0.0/24) that may claim; None: this host's own.
        `hosts`: the addresses of the job's nodes where they are known (`netcheck job`); then only
        they, the coordinators and the members of a claim may connect at all."""
        self._coordinators = None if coordinators is None else [ipaddress.ip_network(c, strict=False)
                                                                  for c in coordinators]
        self.describe = "this host's own addresses" if self._coordinators is None else \
            ", ".join(str(n).removesuffix("/32").removesuffix("/128") for n in self._coordinators) or "nowhere"
        self._hosts = set(hosts) if hosts is not None else None
        self._lock = threading.Lock()
        self._job: str | None = None
        self._claimant = ""
        self._members: frozenset[str] = frozenset()
        self._until = 0.0
        self._local: dict[str, bool] = {}

    # -- who may connect, and how long a line it may send --------------------------------------
    def admits(self, source: str) -> bool:
        if self._hosts is None:
            return True
        source = _plain(source)
        with self._lock:
            members = self._members if self._live() else frozenset()
        return source in self._hosts or source in members or self.may_claim(source)

    def line_limit(self, source: str, default: int) -> int:
        return CLAIM_LINE if self.may_claim(_plain(source)) else default

    def may_claim(self, source: str) -> bool:
        if self._coordinators is None:
            return self._is_local(source)
        try:
            address = ipaddress.ip_address(source)
        except ValueError:
            return False
        return any(address in n for n in self._coordinators)

    # -- the job -------------------------------------------------------------------------------
    def claim(self, source: str, msg: dict) -> dict:
        source = _plain(source)
        job, members, seconds = msg.get("job"), msg.get("members"), msg.get("seconds")
        if not self.may_claim(source):
            return {"error": f"this agent takes jobs from {self.describe} only, not from {source}"}
        if (not isinstance(job, str) or not 0 < len(job) <= 64 or not isinstance(members, list)
                or len(members) > MAX_MEMBERS or not all(isinstance(m, str) for m in members)
                or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_LEASE):
            return {"error": f"a claim needs a job id, its members' addresses and 0 < seconds <= {MAX_LEASE:g}"}
        with self._lock:
            if self._live() and self._claimant != source:
                return {"error": f"busy: in a job of the coordinator at {self._claimant} for "
                                 f"{self._until - time.monotonic():.0f} s more"}
            self._job, self._claimant = job, source
            self._members = frozenset(_plain(m) for m in members)
            self._until = time.monotonic() + seconds
        return {"ok": True}

    def release(self, source: str, msg: dict) -> dict:
        with self._lock:
            if not self._live() or self._claimant != _plain(source) or msg.get("job") != self._job:
                return {"error": "no job of this coordinator to release"}
            self._job, self._until = None, 0.0
        return {"ok": True}

    def may_send(self, source: str, msg: dict, to_host: str) -> str | None:
        """Why the coordinator at `source` may not make this agent send to `to_host`; None: it may."""
        with self._lock:
            if not self._live():
                return "no job: a coordinator claims this agent first"
            if _plain(source) != self._claimant or msg.get("job") != self._job:
                return f"{_plain(source)} is not the coordinator of this agent's job"
            if _plain(to_host) not in self._members:
                return f"{to_host} is not an agent of this job"
        return None

    def member(self, source: str, msg: dict) -> str | None:
        """Why the agent at `source` may not stream into this one; None: it may."""
        with self._lock:
            if not self._live() or msg.get("job") != self._job:
                return "not in this agent's job"
            if _plain(source) not in self._members:
                return f"{_plain(source)} is not an agent of this job"
        return None

    def _live(self) -> bool:
        return self._job is not None and time.monotonic() < self._until

    def _is_local(self, source: str) -> bool:
        """Whether `source` is an address of this host (one it can bind to); remembered."""
        if source not in self._local:
            if len(self._local) >= 1024:  # strangers' addresses are many
                self._local.clear()
            try:
                family = socket.AF_INET6 if ":" in source else socket.AF_INET
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    s.bind((source, 0))
                self._local[source] = not ipaddress.ip_address(source).is_unspecified
            except (OSError, ValueError):
                self._local[source] = False
        return self._local[source]


def _plain(address: str) -> str:
    """An IPv4 address as itself, also when it came as an IPv4-mapped IPv6 one."""
    return address.removeprefix("::ffff:") if address.startswith("::ffff:") and "." in address else address
