"""`nodehealth rdma-bw`: RDMA WRITE bandwidth between two hosts, the way perftest's ib_write_bw measures it.

Long on purpose: perftest's method end to end (out-of-band exchange, verbs set-up, the timed loop,
teardown on every path) in the one module that imports pyverbs.

The only module that imports pyverbs, and only when a test runs. The method is perftest's: the two
sides exchange LID, GID, QPN, PSN, rkey and buffer address over TCP, connect an RC queue pair, and
the client writes `size`-byte messages into the server's registered buffer, at most `tx_depth`
outstanding, posted in linked lists of `cq_mod`, the last of each signalled. Average Gb/s = size x
iterations / (last completion - first post); peak = the best rate from a post to a later
completion (Meter); MsgRate = iterations / that time. A preflight runs before any verbs call, and
every verbs object is closed on every path (ExitStack), including a timeout and a peer that vanishes.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import json
import os
import random
import resource
import select
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Callable

from nodehealth.host import HostPaths, read_attr

# perftest's defaults (ib_write_bw), so that results compare with it.
DEFAULT_SIZE = 65536
DEFAULT_ITERATIONS = 5000
DEFAULT_TX_DEPTH = 128
DEFAULT_PORT = 18515
DEFAULT_IB_PORT = 1
QP_TIMEOUT, RETRY_CNT, RNR_RETRY, MIN_RNR_TIMER = 14, 7, 7, 12
OOB_TIMEOUT = 30.0  # seconds the out-of-band exchange waits for each of the peer's answers
OOB_MAX = 512  # an out-of-band message is one line this long at most
REFUSED = b"refused:"  # the line a server answers a client it does not admit with
# An RC write to a vanished peer errors after timeout x retries (~0.5 s); a soft device may never
# complete it: no completion for this long ends the test.
STALL_SECONDS = 10.0
STOP_POLL_SECONDS = 0.5  # how soon a wait for a client or a peer's bytes sees a stop request
# What a test's writes may take, per message: 10 ms, or its size at 10 Mbit/s (the slowest link
# a test waits for; the VM tier's tbf-limited cable runs at 10 Mbit/s, rxe under QEMU at 40-150)
SECONDS_PER_MESSAGE = 0.01
FLOOR_BITS_PER_SECOND = 10e6
CANCELLED = "the test was cancelled (the daemon is stopping)"
CAP_IPC_LOCK = 14
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class RdmaError(Exception):
    """A clear, one-line reason the test could not run or finish, and the client's stage it failed in:
    "preflight" (checked before any verbs call), "setup" (this host's verbs objects), "peer" (the
    server or the out-of-band exchange), "transfer" (connecting the queue pairs, the writes and their
    verification: the RDMA path itself) or "cancelled"; a server's outcome may also be "refused"."""

    def __init__(self, message: str, stage: str | None = None):
        super().__init__(message)
        self.stage = stage


@dataclass(frozen=True)
class Options:
    device: str | None = None
    ib_port: int = DEFAULT_IB_PORT
    gid_index: int | None = None  # None: LID only (InfiniBand); RoCE needs one
    size: int = DEFAULT_SIZE
    iterations: int = DEFAULT_ITERATIONS
    duration: float | None = None  # seconds; replaces iterations
    tx_depth: int = DEFAULT_TX_DEPTH
    cq_mod: int | None = None
    port: int = DEFAULT_PORT
    warmup: bool = True

    def moderation(self) -> int:
        """Writes per post call, the last one signalled: a quarter of the depth unless given, so
        that three lists stay in flight while one completes (perftest posts one at a time and
        signals every 100th, every one above 8 KiB: each call and completion costs Python more)."""
        if self.cq_mod is not None:
            return max(1, self.cq_mod)
        return max(1, self.depth() // 4)

    def depth(self) -> int:
        return max(1, min(self.tx_depth, self.iterations)) if self.duration is None else max(1, self.tx_depth)


@dataclass
class Result:
    size: int
    iterations: int
    seconds: float
    bw_avg_gbps: float
    bw_peak_gbps: float
    msg_rate_mpps: float
    device: str = ""
    verified: bool = False
    method: str = "rdma-write"


class Meter:
    """The clock of one timed run, as ib_write_bw keeps it (tposted/tcompleted): the time of each
    post, taken before the call, and of each poll that brought completions, taken after it returns.

    Average = messages x size / (last completion - first post). Peak = the best rate from a post to a
    later completion over the messages in between (perftest's peak, which it skips in duration mode
    and above 20,000 iterations for its quadratic cost; here it is kept online in O(log n) per poll).
    Both ends of every stretch are stamped on the safe side, so no stretch is shorter than the link
    took to move its messages: the peak never exceeds the line rate, however late the poller comes
    or however many completions one poll brings (a stretch between two completions stamped by polls
    back to back did: ~600 Gb/s on a 0.6 Gb/s link).

    The best stretch for a completion starts at a vertex of the lower convex hull of the posts
    (time, messages posted before): the tangent from the completion's point, found by bisection."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: tuple[float, int] | None = None  # (seconds after the first post, messages completed)
        self.best = 0.0  # messages per second
        self._waiting: collections.deque = collections.deque()  # posts none of whose messages completed yet
        self._hull: list[tuple[float, int]] = []

    def posted(self, now: float, before: int) -> None:
        """A post call about to be made at `now`, its first message numbered `before` (from 0)."""
        if self.first is None:
            self.first = now
        self._waiting.append((now - self.first, before))

    def completed(self, now: float, count: int) -> None:
        """A poll returned at `now`, `count` messages completed so far."""
        if self.first is None:
            return
        q = (now - self.first, count)
        while self._waiting and self._waiting[0][1] < count:  # posts whose first message is done
            p = self._waiting.popleft()
            while len(self._hull) >= 2 and _cross(self._hull[-2], self._hull[-1], p) <= 0:
                self._hull.pop()
            self._hull.append(p)
        hull, lo, hi = self._hull, 0, len(self._hull) - 1
        while lo < hi:  # the rate from vertex i rises while q lies above the edge from i to i+1
            mid = (lo + hi) // 2
            if _cross(hull[mid], hull[mid + 1], q) > 0:
                lo = mid + 1
            else:
                hi = mid
        if hull and q[0] > hull[lo][0]:
            self.best = max(self.best, (count - hull[lo][1]) / (q[0] - hull[lo][0]))
        self.last = q

    def result(self, size: int) -> tuple[float, float, float, float]:
        """(seconds, avg Gb/s, peak Gb/s, Mmsg/s) as ib_write_bw --report_gbits reports them."""
        if self.last is None or self.last[1] <= 0:
            raise RdmaError("no completion was seen, so there is no bandwidth to report")
        seconds, count = self.last
        if seconds <= 0:
            raise RdmaError("the clock did not advance during the test")
        return seconds, size * count * 8 / seconds / 1e9, size * self.best * 8 / 1e9, count / seconds / 1e6


def _cross(o: tuple[float, int], a: tuple[float, int], b: tuple[float, int]) -> float:
    """> 0 when b lies to the left of (above) the line from o through a."""
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


# -- preflight (no verbs call) ------------------------------------------------------------------

def _cap_ipc_lock(host: HostPaths) -> bool:
    try:
        with open(host.proc("self", "status")) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def memlock_problem(need: int, host: HostPaths) -> str | None:
    """Why registering `need` bytes would fail on the memlock limit, or None."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY or soft >= need or _cap_ipc_lock(host):
        return None
    return memlock_message(need, soft)


def memlock_message(need: int, soft: int | None = None) -> str:
    if soft is None:
        soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft // 1024} KiB"
    return (f"cannot lock {need // 1024} KiB of memory for RDMA: the memlock limit (ulimit -l) is {limit} and "
            "CAP_IPC_LOCK is not held; raise it (limits.conf 'memlock unlimited', systemd LimitMEMLOCK=infinity, "
            "docker --ulimit memlock=-1) or grant CAP_IPC_LOCK")


def devices(host: HostPaths) -> list[str]:
    try:
        return sorted(os.listdir(host.sys("class", "infiniband")))
    except OSError:
        return []


def preflight(opts: Options, host: HostPaths, need: int) -> str:
    """The device to use, after checking what can be checked without verbs; RdmaError otherwise."""
    found = devices(host)
    if not found:
        raise RdmaError("no RDMA device (/sys/class/infiniband is empty or absent)")
    device = opts.device or found[0]
    if device not in found:
        raise RdmaError(f"no RDMA device {device!r} (found: {', '.join(found)})")
    port_dir = host.sys("class", "infiniband", device, "ports", str(opts.ib_port))
    state = read_attr(os.path.join(port_dir, "state"))
    if state is None:
        raise RdmaError(f"{device} has no port {opts.ib_port}")
    if "ACTIVE" not in state:
        raise RdmaError(f"{device} port {opts.ib_port} is not ACTIVE ({state})")
    link = read_attr(os.path.join(port_dir, "link_layer")) or ""
    if opts.gid_index is None and link == "Ethernet":
        raise RdmaError(f"{device} port {opts.ib_port} is RoCE (Ethernet): give a GID index (-x)")
    if opts.gid_index is not None:
        gid = read_attr(os.path.join(port_dir, "gids", str(opts.gid_index)))
        if gid is None or gid.replace(":", "").strip("0") == "":
            raise RdmaError(f"{device} port {opts.ib_port} has no GID at index {opts.gid_index}")
    uverbs = [p for p in _uverbs(host)]
    if not uverbs:
        raise RdmaError(f"no {host.dev('infiniband')}/uverbs* device node (is ib_uverbs loaded? "
                        "in a container, mount /dev/infiniband)")
    if not any(os.access(p, os.R_OK | os.W_OK) for p in uverbs):
        raise RdmaError(f"no read-write access to {', '.join(uverbs)} (run as a user in the rdma group, "
                        "or give the container the device)")
    problem = memlock_problem(need, host)
    if problem:
        raise RdmaError(problem)
    return device


def pick_gid(host: HostPaths, device: str, ib_port: int) -> int | None:
    """The GID index a RoCE port should use, as an operator would pick it for `-x`: a RoCE v2 GID
    with an IPv4-mapped address (routable, the one NCCL picks by default), else any RoCE v2 GID,
    else any non-zero one. None on InfiniBand (LID routing) or when the port has no GID."""
    port_dir = host.sys("class", "infiniband", device, "ports", str(ib_port))
    if (read_attr(os.path.join(port_dir, "link_layer")) or "") != "Ethernet":
        return None
    try:
        indexes = sorted(int(n) for n in os.listdir(os.path.join(port_dir, "gids")) if n.isdigit())
    except OSError:
        return None
    ranked = []
    for i in indexes:
        gid = read_attr(os.path.join(port_dir, "gids", str(i))) or ""
        if gid.replace(":", "").strip("0") == "":
            continue
        v2 = (read_attr(os.path.join(port_dir, "gid_attrs", "types", str(i))) or "") == "RoCE v2"
        ipv4 = gid.startswith("0000:0000:0000:0000:0000:ffff:")
        ranked.append((not v2, not ipv4, i))
    return min(ranked)[2] if ranked else None


def _uverbs(host: HostPaths) -> Iterator[str]:
    try:
        names = sorted(os.listdir(host.dev("infiniband")))
    except OSError:
        return iter(())
    return (host.dev("infiniband", n) for n in names if n.startswith("uverbs"))


# -- pyverbs (loaded only here) ------------------------------------------------------------------

def _pyverbs():
    """Import pyverbs, the distribution's when the environment has none; RdmaError in one line."""
    try:
        import pyverbs  # noqa: F401
    except ImportError:
        system = "/usr/lib/python3/dist-packages"
        if os.path.isdir(os.path.join(system, "pyverbs")) and system not in sys.path:
            sys.path.append(system)  # last, so it shadows nothing the environment has
    try:
        from pyverbs import addr, cq, device, mr, pd, qp, wr
        from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
        try:
            from pyverbs import enums as e
        except ImportError:  # rdma-core >= 59: typed enums
            e = _TypedEnums()
    except ImportError as exc:
        text = str(exc)
        if "IBVERBS_PRIVATE" in text or "symbol" in text or "version" in text:
            raise RdmaError(f"pyverbs does not match this host's rdma-core ({text.splitlines()[0]}): install the "
                            "pyverbs built with it (python3-pyverbs of the same distribution, MOFED or DOCA)") from None
        raise RdmaError(f"pyverbs is not importable ({text.splitlines()[0]}): install python3-pyverbs from the "
                        "distribution, MOFED or DOCA that provides this host's rdma-core") from None
    return addr, cq, device, mr, pd, qp, wr, e, PyverbsError, PyverbsRDMAError


class _TypedEnums:
    """rdma-core >= 59 moved the enums into typed classes in pyverbs.libibverbs_enums."""

    def __getattr__(self, name: str):
        from pyverbs import libibverbs_enums as lib

        for cls in vars(lib).values():
            if hasattr(cls, name):
                return getattr(cls, name)
        raise AttributeError(name)


# -- out-of-band exchange ------------------------------------------------------------------------

@dataclass(frozen=True)
class Endpoint:
    lid: int
    qpn: int
    psn: int
    rkey: int
    addr: int
    gid: str  # 32 hex digits, zeros when LID-only
    size: int
    mtu: int

    def encode(self) -> bytes:
        return (f"NHRDMA1 {self.lid:04x} {self.qpn:06x} {self.psn:06x} {self.rkey:08x} {self.addr:016x} "
                f"{self.gid} {self.size:x} {self.mtu}\n").encode()

    @classmethod
    def decode(cls, line: bytes) -> Endpoint:
        parts = line.decode("ascii", "replace").split()
        if len(parts) != 9 or parts[0] != "NHRDMA1" or len(parts[6]) != 32:
            raise RdmaError(f"the peer's out-of-band message is not an rdma-bw endpoint: {line[:80]!r}")
        try:
            lid, qpn, psn, rkey, addr = (int(p, 16) for p in parts[1:6])
            int(parts[6], 16)
            size, mtu = int(parts[7], 16), int(parts[8])
        except ValueError:
            raise RdmaError(f"the peer's out-of-band message has a bad number: {line[:80]!r}") from None
        if lid >> 16 or qpn >> 24 or psn >> 24 or rkey >> 32 or addr >> 64 or not 0 < size <= 1 << 31:
            raise RdmaError(f"the peer's out-of-band message is out of range: {line[:80]!r}")
        return cls(lid, qpn, psn, rkey, addr, parts[6], size, mtu)


def exchange_seconds(opts: Options, timeout: float) -> float:
    """The longest one test may take from connection to verdict, on either side: `timeout` for the
    endpoints, the writes (the warm-up, the iterations or the duration and what is still in flight
    at its end), and `timeout` for the report and its verification."""
    messages = (opts.depth() if opts.warmup else 0) + (opts.iterations if opts.duration is None else opts.depth())
    per_message = max(SECONDS_PER_MESSAGE, opts.size * 8 / FLOOR_BITS_PER_SECOND)
    return 2 * timeout + (opts.duration or 0) + messages * per_message


class _Exchange:
    """One test's out-of-band connection under a deadline for the whole exchange, whose waits a
    stop request ends within STOP_POLL_SECONDS: a peer that drips its bytes, or never answers, holds
    this side no longer than the test may take, and never past a stop. RdmaError otherwise."""

    def __init__(self, sock: socket.socket | None, seconds: float, stop: threading.Event | None):
        self.sock, self.seconds, self.stop = sock, seconds, stop
        self.deadline = time.monotonic() + seconds

    @classmethod
    def connect(cls, host: str, port: int, seconds: float, stop: threading.Event | None) -> _Exchange:
        exchange = cls(None, seconds, stop)
        where = f"cannot reach the rdma-bw server at {host}:{port}"
        try:
            addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as err:  # UnicodeError: a name too long for DNS
            raise RdmaError(f"{where}: {getattr(err, 'strerror', None) or err}") from None
        code = errno.EHOSTUNREACH
        for family, kind, proto, _, address in addresses:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            code = sock.connect_ex(address)
            writable = select.poll()  # not select(): a daemon holding over 1,024 descriptors is no error
            writable.register(sock, select.POLLOUT)
            try:
                while code == errno.EINPROGRESS:
                    if writable.poll(exchange.wait("answer to the connection") * 1000):
                        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            except RdmaError as err:
                sock.close()
                if err.stage == "cancelled":
                    raise
                raise RdmaError(f"{where}: no answer within {seconds:g} s") from None
            if code == 0:
                exchange.sock = sock
                return exchange
            sock.close()
        raise RdmaError(f"{where}: {os.strerror(code)}")

    def wait(self, what: str) -> float:
        """How long the next wait for the peer's `what` may be; RdmaError at the deadline or a stop."""
        if self.stop is not None and self.stop.is_set():
            raise RdmaError(CANCELLED, "cancelled")
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RdmaError(f"the {what} did not come within the exchange's {self.seconds:g} s")
        return min(left, STOP_POLL_SECONDS)

    def recv_line(self, what: str) -> bytes:
        buf = b""
        while not buf.endswith(b"\n"):
            self.sock.settimeout(self.wait(what))
            try:
                chunk = self.sock.recv(1)
            except socket.timeout:
                continue
            if not chunk:
                raise RdmaError(f"the peer closed the connection before the {what}")
            buf += chunk
            if len(buf) > OOB_MAX:
                raise RdmaError(f"the {what} is longer than {OOB_MAX} bytes")
        return buf

    def send(self, line: bytes) -> None:
        """A line of at most OOB_MAX bytes, which the socket's buffer takes at once."""
        self.sock.settimeout(self.wait("peer's room for a line"))
        self.sock.sendall(line)


# -- the test ------------------------------------------------------------------------------------

def pattern(size: int) -> bytes:
    """What the client writes: position-dependent, so a short or misplaced write shows."""
    block = hashlib.sha256(str(size).encode()).digest()
    return (block * (size // len(block) + 1))[:size]


class _Verbs:
    """Context, PD, MR, CQ and RC QP for one side; closed in reverse order by the ExitStack."""

    def __init__(self, stack: contextlib.ExitStack, opts: Options, device_name: str):
        (self.addr, cq, device, mr, pd, qp, self.wr, self.e, self.Err, self.RdmaErr) = _pyverbs()
        self.opts = opts
        e = self.e
        try:
            self.ctx = stack.enter_context(_closing(device.Context(name=device_name)))
            self.port_attr = self.ctx.query_port(opts.ib_port)
            if self.port_attr.state != e.IBV_PORT_ACTIVE:
                raise RdmaError(f"{device_name} port {opts.ib_port} is not ACTIVE")
            gid = "0" * 32
            if opts.gid_index is not None:
                g = self.ctx.query_gid(opts.ib_port, opts.gid_index)
                gid = str(g).replace(":", "")
                if int(gid, 16) == 0:
                    raise RdmaError(f"{device_name} port {opts.ib_port} has no GID at index {opts.gid_index}")
            self.pd = stack.enter_context(_closing(pd.PD(self.ctx)))
            access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            length = max(opts.size, PAGE)
            try:
                self.mr = stack.enter_context(_closing(mr.MR(self.pd, length, access)))
            except self.RdmaErr as err:
                if getattr(err, "error_code", None) == errno.ENOMEM:
                    raise RdmaError(memlock_message(length)) from None
                raise
            depth = opts.depth()
            self.cq = stack.enter_context(_closing(cq.CQ(self.ctx, depth + 1)))
            cap = qp.QPCap(max_send_wr=depth, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
            init = qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0)
            self.qp = stack.enter_context(_closing(qp.QP(self.pd, init)))
            self.qpattr = qp.QPAttr
        except self.Err as err:
            raise RdmaError(f"{device_name}: {err}") from None
        self.psn = random.getrandbits(24)
        self.local = Endpoint(self.port_attr.lid, self.qp.qp_num, self.psn, self.mr.rkey, self.mr.buf, gid,
                              opts.size, int(self.port_attr.active_mtu))

    def connect(self, remote: Endpoint) -> None:
        e, opts = self.e, self.opts
        try:
            attr = self.qpattr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
            attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            attr.pkey_index = 0
            attr.port_num = opts.ib_port
            attr.path_mtu = min(self.local.mtu, remote.mtu)
            attr.dest_qp_num = remote.qpn
            attr.rq_psn = remote.psn
            attr.sq_psn = self.psn
            attr.max_dest_rd_atomic = 1
            attr.max_rd_atomic = 1
            attr.min_rnr_timer = MIN_RNR_TIMER
            attr.timeout = QP_TIMEOUT
            attr.retry_cnt = RETRY_CNT
            attr.rnr_retry = RNR_RETRY
            if opts.gid_index is not None:
                gr = self.addr.GlobalRoute(dgid=self.addr.GID(_gid_text(remote.gid)), sgid_index=opts.gid_index,
                                           hop_limit=255)
                ah = self.addr.AHAttr(gr=gr, is_global=1, port_num=opts.ib_port)
            else:
                ah = self.addr.AHAttr(dlid=remote.lid, is_global=0, port_num=opts.ib_port)
            attr.ah_attr = ah
            self.qp.to_rts(attr)
        except self.Err as err:
            raise RdmaError(f"cannot connect the queue pair: {err}") from None

    def write_all(self, remote: Endpoint, deadline: float, cancel: threading.Event | None = None) -> Meter:
        """Post the warm-up, then the timed writes; returns the timed run's Meter."""
        opts = self.opts
        chains: dict[int, list] = {}  # length -> the WRs of one list; they stay alive while it is posted

        def chain(length: int):
            if length not in chains:
                chains[length] = self._chain(remote, length)
            return chains[length][0]

        try:
            if opts.warmup:
                self._run(min(opts.depth(), opts.iterations), chain, None, deadline, cancel)
            end = time.monotonic() + opts.duration if opts.duration else None
            return self._run(opts.iterations, chain, end, deadline, cancel)
        except self.Err as err:  # a post or poll refused: the queue pair went to the error state
            raise RdmaError(f"an RDMA WRITE failed: {err}") from None

    def _chain(self, remote: Endpoint, length: int) -> list:
        """`length` RDMA WRITEs of the buffer, linked into one list that one post call hands to the
        device; only the last is signalled, and its wr_id says how many messages its completion ends."""
        e, opts = self.e, self.opts
        sge = self.wr.SGE(self.mr.buf, opts.size, self.mr.lkey)
        wrs = [self.wr.SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge], send_flags=0) for _ in range(length)]
        for w in wrs:
            w.set_wr_rdma(remote.rkey, remote.addr)
        for w, after in zip(wrs, wrs[1:]):
            w.next_wr = after
        wrs[-1].send_flags = e.IBV_SEND_SIGNALED
        wrs[-1].wr_id = length
        return wrs

    def _run(self, iterations: int, chain: Callable[[int], object], end: float | None, deadline: float,
             cancel: threading.Event | None) -> Meter:
        """Keep up to `depth` writes outstanding, posted in lists of `moderation`, until `iterations`
        were written (or `end`, a time) and all completed. The per-list work is all there is in
        Python: a post call, a clock read, and one completion to take."""
        opts, success = self.opts, self.e.IBV_WC_SUCCESS
        depth = opts.depth()
        length = min(opts.moderation(), depth)
        post, poll, clock = self.qp.post_send, self.cq.poll, time.perf_counter
        meter = Meter()
        posted = completed = 0
        stalled_since = time.monotonic()
        while True:
            more = posted < iterations if end is None else time.monotonic() < end
            while more:
                n = length if end is not None else min(length, iterations - posted)
                if posted + n > completed + depth:
                    break
                meter.posted(clock(), posted)
                post(chain(n))
                posted += n
                more = end is not None or posted < iterations
            if not more and completed == posted:
                return meter
            n, wcs = poll(num_entries=depth)
            if n:
                now = clock()
                for wc in wcs:
                    if wc.status != success:
                        raise RdmaError(f"an RDMA WRITE failed: completion status {wc.status} "
                                        f"({_wc_status(wc.status)}); the peer or the path is gone")
                    completed += wc.wr_id
                meter.completed(now, completed)
            if cancel is not None and cancel.is_set():
                raise RdmaError(CANCELLED, "cancelled")
            if n:
                stalled_since = time.monotonic()
            elif time.monotonic() - stalled_since > STALL_SECONDS or time.monotonic() > deadline:
                raise RdmaError(f"no RDMA WRITE completed for {time.monotonic() - stalled_since:.0f} s: "
                                "the peer or the path is gone")


def _wc_status(status: int) -> str:
    names = {5: "flushed", 12: "transport retry counter exceeded", 13: "RNR retry counter exceeded",
             10: "remote access error", 9: "remote invalid request"}
    return names.get(int(status), "see ibv_wc_status_str")


def _gid_text(hex32: str) -> str:
    return ":".join(hex32[i:i + 4] for i in range(0, 32, 4))


@contextlib.contextmanager
def _closing(obj):
    try:
        yield obj
    finally:
        obj.close()


def _check_opts(opts: Options) -> None:
    if not 1 <= opts.size <= 1 << 30:
        raise RdmaError("--size must be 1 B to 1 GiB")
    if opts.iterations < 5 and opts.duration is None:
        raise RdmaError("--iterations must be at least 5 (as perftest)")
    if opts.duration is not None and not 0 < opts.duration <= 3600:
        raise RdmaError("--duration must be in (0, 3600] seconds")
    if opts.tx_depth < 1:
        raise RdmaError("--tx-depth must be at least 1")


def server(opts: Options, listen: str = "0.0.0.0", host: HostPaths | None = None, timeout: float = OOB_TIMEOUT
           ) -> Result:
    """Wait for one client, expose the buffer, and return the client's report once it verified."""
    _check_opts(opts)
    host = host or HostPaths("/")
    device = preflight(opts, host, max(opts.size, PAGE))
    with contextlib.ExitStack() as stack:
        lsock = stack.enter_context(socket.create_server((listen, opts.port), reuse_port=False))
        lsock.settimeout(timeout)
        verbs = _Verbs(stack, opts, device)
        try:
            conn, _ = lsock.accept()
        except socket.timeout:
            raise RdmaError(f"no client connected to port {opts.port} within {timeout:g} s") from None
        exchange = _Exchange(stack.enter_context(conn), exchange_seconds(opts, timeout), None)
        return _session(exchange, verbs, opts, device)


def serve(opts: Options, stop: threading.Event, on_result: Callable[[Result | RdmaError], None],
          listen: str = "0.0.0.0", host: HostPaths | None = None, timeout: float = OOB_TIMEOUT,
          admit: Callable[[str], bool] = lambda address: True) -> None:
    """The daemon's server: one client at a time until `stop`, each with fresh verbs objects, each
    outcome handed to `on_result`. The preflight and the bind fail at once (RdmaError).

    A client whose address `admit` refuses is closed before any verbs object exists (outcome stage
    "refused"). A session ends at its deadline (exchange_seconds) or at `stop`, whatever the client
    sends. After each session the server rests as long as the session took, so admitted peers hold
    the rail and a core at most half the time."""
    _check_opts(opts)
    host = host or HostPaths("/")
    device = preflight(opts, host, max(opts.size, PAGE))
    try:
        lsock = socket.create_server((listen, opts.port), reuse_port=False)
    except OSError as err:
        raise RdmaError(f"cannot listen on {listen}:{opts.port}: {err.strerror or err}") from None
    with lsock:
        lsock.settimeout(STOP_POLL_SECONDS)  # so that `stop` is seen
        while not stop.is_set():
            try:
                conn, client = lsock.accept()
            except socket.timeout:
                continue
            if not admit(client[0]):
                _refuse(conn)
                on_result(RdmaError(f"refused a test for {client[0]}: not one of this node's peers", "refused"))
                continue
            started = time.monotonic()
            try:
                with contextlib.ExitStack() as stack:
                    exchange = _Exchange(stack.enter_context(conn), exchange_seconds(opts, timeout), stop)
                    outcome: Result | RdmaError = _session(exchange, _Verbs(stack, opts, device), opts, device)
            except RdmaError as err:
                outcome = err
            except OSError as err:  # the client reset the connection
                outcome = RdmaError(f"the client's connection failed: {err.strerror or err}")
            except Exception as err:  # one client's session, whatever went wrong, must not stop the server
                outcome = RdmaError(f"the test failed: {type(err).__name__}: {err}")
            if isinstance(outcome, RdmaError) and outcome.stage == "cancelled":
                return  # stopped: nothing was served
            on_result(outcome)
            stop.wait(time.monotonic() - started)  # the next client waits in the backlog meanwhile


def _refuse(conn: socket.socket) -> None:
    """Say why in one line and close, without waiting on the client: what it already sent is read
    first, so that the close does not reset the connection before the client reads the reason."""
    with conn:
        conn.setblocking(False)
        with contextlib.suppress(OSError):  # nothing sent yet
            conn.recv(OOB_MAX)
        with contextlib.suppress(OSError):  # gone already
            conn.send(REFUSED + b" this node is not one of the server's peers (rdma_bw.serve_to)\n")


def _session(exchange: _Exchange, verbs: _Verbs, opts: Options, device: str) -> Result:
    """One client on an accepted connection: exchange endpoints, take its report, verify the bytes."""
    remote = Endpoint.decode(exchange.recv_line("client's endpoint"))
    if remote.size != opts.size:
        raise RdmaError(f"the client writes {remote.size}-byte messages, this server expects {opts.size}")
    exchange.send(verbs.local.encode())
    verbs.connect(remote)
    report = exchange.recv_line("client's report")
    try:
        doc = json.loads(report)
        result = Result(**{k: doc[k] for k in Result.__dataclass_fields__ if k in doc})
    except (ValueError, TypeError, KeyError):
        raise RdmaError(f"the client's report is not a result: {report[:80]!r}") from None
    result.verified = verbs.mr.read(opts.size, 0) == pattern(opts.size)
    result.device = device
    exchange.send(b"OK\n" if result.verified else b"BAD\n")
    if not result.verified:
        raise RdmaError("the bytes written into this server's buffer are not the client's")
    return result


def client(server_host: str, opts: Options, host: HostPaths | None = None, timeout: float = OOB_TIMEOUT,
           cancel: threading.Event | None = None) -> Result:
    """Write to the server at `server_host` and return the result it verified; `cancel` ends the test
    early (the daemon's shutdown). The whole exchange has a deadline (exchange_seconds), whatever the
    server sends. An RdmaError carries the stage it failed in."""
    stage = "preflight"
    try:
        _check_opts(opts)
        host = host or HostPaths("/")
        device = preflight(opts, host, max(opts.size, PAGE))
        with contextlib.ExitStack() as stack:
            stage = "setup"
            verbs = _Verbs(stack, opts, device)
            verbs.mr.write(pattern(opts.size), opts.size)
            stage = "peer"
            exchange = _Exchange.connect(server_host, opts.port, exchange_seconds(opts, timeout), cancel)
            stack.enter_context(exchange.sock)
            exchange.send(verbs.local.encode())
            line = exchange.recv_line("server's endpoint")
            if line.startswith(REFUSED):
                raise RdmaError(f"the rdma-bw server at {server_host}:{opts.port} refused the test: "
                                f"{line[len(REFUSED):].decode(errors='replace').strip()[:200]}")
            remote = Endpoint.decode(line)
            if remote.size < opts.size:
                raise RdmaError(f"the server's buffer ({remote.size} B) is smaller than a message")
            stage = "transfer"
            verbs.connect(remote)
            meter = verbs.write_all(remote, exchange.deadline, cancel)
            seconds, avg, peak, rate = meter.result(opts.size)
            result = Result(opts.size, meter.last[1], seconds, avg, peak, rate, device)
            exchange.send(json.dumps(asdict(result)).encode() + b"\n")
            answer = exchange.recv_line("server's verification")
            result.verified = answer.strip() == b"OK"
            if not result.verified:
                raise RdmaError("the server found other bytes in its buffer than this client wrote")
            return result
    except RdmaError as err:
        if cancel is not None and cancel.is_set():
            stage = "cancelled"
        err.stage = err.stage or stage
        raise
    except OSError as err:  # the peer reset the out-of-band connection
        raise RdmaError(f"the connection to the rdma-bw server at {server_host}:{opts.port} failed: "
                        f"{err.strerror or err}", stage) from None
