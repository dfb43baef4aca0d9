"""RLIMIT_MEMLOCK of this process and of the processes that use RDMA, and the node's verbs devices.

RDMA memory registration pins pages, and pinned pages count against RLIMIT_MEMLOCK unless the
process holds CAP_IPC_LOCK. The limit that matters is the training processes', so besides our own
we find the processes holding /dev/infiniband/uverbs* open and read their limits and capabilities.
All sizes are bytes, as /proc/<pid>/limits shows them (`ulimit -l` prints KiB).
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from nodehealth.collectors import CollectError
from nodehealth.host import HostPaths, list_dir, read_text
from nodehealth.model import Metric

NAME = "limits"
DEFAULTS: dict = {
    # The process scan is bounded: at most this many /proc/<pid> directories ...
    "max_processes": 4096,
    # ... and at most this many fd links read in all (a busy node has a few hundred thousand).
    "max_fds": 200000,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "max_processes": "at most this many `/proc/<pid>` directories are read per pass (the memlock check's process scan)",
    "max_fds": "... and at most this many fd links in all",
}

MEMLOCK_ROW = "Max locked memory"
CAP_IPC_LOCK = 14  # bit in CapEff (include/uapi/linux/capability.h)
UVERBS_PREFIX = "uverbs"
UVERBS_PATH = "/dev/infiniband/uverbs"
# A process that exits mid-scan makes its files vanish (ENOENT) or its fd table unreadable (ESRCH).
GONE = (errno.ENOENT, errno.ESRCH)


@dataclass(frozen=True)
class MemlockLimit:
    """RLIMIT_MEMLOCK in bytes; None in `soft` or `hard` means the kernel shows `unlimited`.

    A limit that could not be read is no MemlockLimit at all (the holder's field is None), so
    "absent" never reads as "unlimited".
    """

    soft: int | None
    hard: int | None

    @property
    def soft_unlimited(self) -> bool:
        return self.soft is None

    @property
    def soft_bytes_or_inf(self) -> float:
        """The effective limit as a number: +Inf for unlimited (what metrics and comparisons want)."""
        return float("inf") if self.soft is None else float(self.soft)


@dataclass(frozen=True)
class RdmaProcess:
    pid: int
    comm: str
    memlock: MemlockLimit | None  # None when /proc/<pid>/limits could not be read
    cap_ipc_lock: bool | None  # None when /proc/<pid>/status could not be read
    devices: tuple[str, ...]  # the uverbs devices it holds open, e.g. ("uverbs0", "uverbs3")


@dataclass(frozen=True)
class Limits:
    self_memlock: MemlockLimit
    self_cap_ipc_lock: bool | None
    rdma_devices: tuple[str, ...]  # uverbs* under /dev/infiniband; empty on a node without verbs
    rdma_processes: tuple[RdmaProcess, ...]  # sorted by pid
    processes_unreadable: int  # processes whose fd table we could not read (another user's, without CAP_SYS_PTRACE)
    scan_truncated: bool  # the scan hit max_processes or max_fds: the list may miss some processes


def supported(host: HostPaths, cfg: dict):
    if not os.path.exists(host.proc("self", "limits")):
        return "no /proc/self/limits (procfs not mounted, or a kernel older than 2.6.24)"
    return None


def _limit_value(word: str) -> int | None:
    """`unlimited` -> None, digits -> int; anything else raises ValueError."""
    if word == "unlimited":
        return None
    if not word.isdigit():
        raise ValueError(word)
    return int(word)


def parse_memlock(text: str, path: str) -> MemlockLimit:
    """The `Max locked memory  <soft>  <hard>  bytes` row of a /proc/<pid>/limits file."""
    for line in text.split("\n"):
        if not line.startswith(MEMLOCK_ROW):
            continue
        words = line[len(MEMLOCK_ROW):].split()
        try:
            if len(words) < 2:
                raise ValueError(line)
            return MemlockLimit(_limit_value(words[0]), _limit_value(words[1]))
        except ValueError:
            raise CollectError(f"{path}: cannot read the locked-memory row {line[:100]!r}") from None
    raise CollectError(f"{path}: no '{MEMLOCK_ROW}' row")


def parse_cap_ipc_lock(text: str, path: str) -> bool:
    """Whether CAP_IPC_LOCK is in the effective set (`CapEff:` is a hex bit mask in /proc/<pid>/status).

    Only a newline ends a line: the `Name:` line carries the process's own name, which may contain
    other line breaks (a vertical tab, say) that must not start a line of their own.
    """
    for line in text.split("\n"):
        if line.startswith("CapEff:"):
            try:
                mask = int(line[len("CapEff:"):].strip(), 16)
            except ValueError:
                raise CollectError(f"{path}: CapEff is not a hex mask: {line[:100]!r}") from None
            return bool(mask >> CAP_IPC_LOCK & 1)
    raise CollectError(f"{path}: no CapEff line")


def rdma_devices(host: HostPaths) -> tuple[str, ...]:
    return tuple(n for n in list_dir(host.dev("infiniband")) if n.startswith(UVERBS_PREFIX))


class _Budget:
    """What is left of the fd-link budget for one scan."""

    def __init__(self, fds: int):
        self.fds = fds
        self.exhausted = False


def _uverbs_held(host: HostPaths, pid: str, budget: _Budget) -> tuple[str, ...]:
    """uverbs devices a process holds open, read from its fd links. Raises OSError (e.g. EACCES)."""
    held = set()
    for fd in sorted((n for n in list_dir(host.proc(pid, "fd")) if n.isdigit()), key=int):
        if budget.fds <= 0:
            budget.exhausted = True
            break
        budget.fds -= 1
        try:
            target = os.readlink(host.proc(pid, "fd", fd))
        except OSError as e:
            if e.errno in GONE:  # the fd was closed while we looked
                continue
            raise
        if target.startswith(UVERBS_PATH):
            held.add(os.path.basename(target))
    return tuple(sorted(held))


def _per_process(path: str, parse):
    """One per-process fact: None when unreadable or malformed; OSError (ENOENT/ESRCH) if the process is gone."""
    try:
        return parse(read_text(path, 65536), path)
    except OSError as e:
        if e.errno in GONE:
            raise
        return None
    except CollectError:
        return None


def _comm(text: str, path: str) -> str:
    return text.strip()


def _process(host: HostPaths, pid: str, devices: tuple[str, ...]) -> RdmaProcess:
    """The facts of one RDMA process. Raises OSError (ENOENT/ESRCH) when it exited meanwhile."""
    memlock = _per_process(host.proc(pid, "limits"), parse_memlock)
    cap = _per_process(host.proc(pid, "status"), parse_cap_ipc_lock)
    comm = _per_process(host.proc(pid, "comm"), _comm) or f"pid {pid}"
    return RdmaProcess(int(pid), comm, memlock, cap, devices)


def scan_rdma_processes(host: HostPaths, max_processes: int, max_fds: int) -> tuple[list[RdmaProcess], int, bool]:
    """(RDMA processes, processes we could not look into, whether a bound cut the scan short).

    Processes that exit mid-scan are skipped silently; so are those we may not look into
    (another user's fd table needs CAP_SYS_PTRACE), but those are counted.
    """
    pids = sorted((n for n in list_dir(host.proc()) if n.isdigit()), key=int)
    truncated = len(pids) > max_processes
    budget = _Budget(max_fds)
    found: list[RdmaProcess] = []
    unreadable = 0
    for pid in pids[:max_processes]:
        try:
            devices = _uverbs_held(host, pid, budget)
            if devices:
                found.append(_process(host, pid, devices))
        except OSError as e:
            if e.errno not in GONE:
                unreadable += 1
        if budget.exhausted:
            truncated = True
            break
    return found, unreadable, truncated


def _self_cap_ipc_lock(host: HostPaths) -> bool | None:
    path = host.proc("self", "status")
    try:
        return parse_cap_ipc_lock(read_text(path, 65536), path)
    except (OSError, CollectError):
        return None


def collect(host: HostPaths, cfg: dict) -> Limits:
    settings = {**DEFAULTS, **cfg}
    path = host.proc("self", "limits")
    self_memlock = parse_memlock(read_text(path, 65536), path)
    processes, unreadable, truncated = scan_rdma_processes(host, settings["max_processes"], settings["max_fds"])
    return Limits(self_memlock, _self_cap_ipc_lock(host), rdma_devices(host), tuple(processes), unreadable,
                  truncated)


def metrics(facts: Limits) -> list[Metric]:
    own = Metric("nodehealth_memlock_limit_bytes",
                 "Soft RLIMIT_MEMLOCK of the nodehealth process in bytes (+Inf when unlimited).",
                 labels=("scope",))
    own.add(("self",), facts.self_memlock.soft_bytes_or_inf)
    count = Metric("nodehealth_rdma_processes",
                   "Number of processes holding an RDMA verbs device (/dev/infiniband/uverbs*) open.")
    count.add((), len(facts.rdma_processes))
    smallest = Metric("nodehealth_rdma_process_memlock_min_bytes",
                      "Smallest soft RLIMIT_MEMLOCK among processes using RDMA in bytes (+Inf when all are unlimited).")
    known = [p.memlock.soft_bytes_or_inf for p in facts.rdma_processes if p.memlock is not None]
    smallest.add((), min(known) if known else None)
    devices = Metric("nodehealth_rdma_devices", "Number of RDMA verbs devices (/dev/infiniband/uverbs*) on the node.")
    devices.add((), len(facts.rdma_devices))
    return [own, count, smallest, devices]
