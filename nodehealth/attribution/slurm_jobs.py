"""Slurm jobs behind GPUs: which local job holds which GPU (`scontrol show job -d`), and which job a
process belongs to (its cgroup, else `scontrol listpids`).

Parsing is pure. The reader takes the Slurm face's scontrol runner (a callable of scontrol's arguments
that returns its output or raises), so scontrol keeps one caller with one retry policy, and it reads
/proc through HostPaths, so a fixture machine replays it. Slurm numbers a node's GPUs by sorting them
by PCI bus id (gres.conf(5), "Links"), which is how a job's GRES index finds its GPU; NVML's index is
not Slurm's, and without every GPU's bus id there is no order to trust.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from nodehealth.attribution.gpus import GpuRef
from nodehealth.host import HostPaths, read_attr, read_text

MAX_GPU_NUMBER = 1023  # a GRES index past this is garbage, not a GPU
MAX_LISTPIDS_LINES = 100_000
START_SLACK_SECONDS = 2.0  # btime has whole seconds; a process this much younger than the Xid is not its author

_JOB_ID = re.compile(r"^\s*JobId=(\d{1,12})\b")
_USER = re.compile(r"\bUserId=([^\s(]{1,64})\(")
_NODES = re.compile(r"(?:^|\s)Nodes=(\S{1,4096})")
_GRES = re.compile(r"(?:^|\s)GRES(?:_IDX)?=(\S{1,4096})")
_GRES_ENTRY = re.compile(r"(?P<name>[A-Za-z0-9_]+)(?::[^(,\s]*)?\(IDX:(?P<idx>[0-9,\-]*)\)")
_CGROUP_JOB = re.compile(r"(?:^|/)job_(\d{1,12})(?:/|$)")
_BRACKET = re.compile(r"([^\[\]]*)\[([^\]]*)\](.*)")


class SlurmLookupError(Exception):
    """scontrol could not say which jobs run here; the message says which call and why."""


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    user: str | None
    gpus: tuple[int, ...]  # Slurm's GPU numbers (GRES IDX) on this node

    def to_dict(self) -> dict[str, str | None]:
        return {"job_id": self.job_id, "user": self.user}


@dataclass(frozen=True)
class JobAssignment:
    by_gpu: dict[int, tuple[SlurmJob, ...]]  # NVML index -> jobs holding it
    unresolved: tuple[str, ...]  # "<job>: GPU <n>" for Slurm GPU numbers no GPU here matches


# -- parsing ----------------------------------------------------------------------------------------

def parse_jobs(text: str, node: str) -> tuple[SlurmJob, ...]:
    """`scontrol show job -d` records: each job's id, user and the GPUs it holds on `node`."""
    jobs = []
    for record in _records(text):
        head = _JOB_ID.match(record[0])
        if head is None:
            continue
        user = next((m.group(1) for m in map(_USER.search, record) if m), None)
        gpus: set[int] = set()
        for line in record:
            nodes, gres = _NODES.search(line), _GRES.search(line)
            if nodes and gres and in_hostlist(node, nodes.group(1)):
                gpus.update(_gres_gpus(gres.group(1)))
        jobs.append(SlurmJob(head.group(1), user, tuple(sorted(gpus))))
    return tuple(jobs)


def _records(text: str) -> list[list[str]]:
    records: list[list[str]] = []
    for line in text.splitlines():
        if _JOB_ID.match(line) or not records:
            records.append([])
        records[-1].append(line)
    return records


def _gres_gpus(value: str) -> set[int]:
    out: set[int] = set()
    for entry in _GRES_ENTRY.finditer(value):
        if entry.group("name") != "gpu":
            continue
        numbers = _numbers(entry.group("idx"))
        if numbers is None:
            return set()  # indices no node has: the whole field is garbage
        out.update(numbers)
    return out


def _numbers(text: str) -> set[int] | None:
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or not (hi or lo).isdigit():
            return None
        first, last = int(lo), int(hi or lo)
        if last > MAX_GPU_NUMBER or first > last:
            return None
        out.update(range(first, last + 1))
    return out


def in_hostlist(name: str, expr: str) -> bool:
    """Whether `name` is in a Slurm hostlist such as `gpu-[001-016,020],login1`, without expanding it."""
    pieces, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            pieces.append(expr[start:i])
            start = i + 1
    pieces.append(expr[start:])
    return any(_matches(name, piece) for piece in pieces)


def _matches(name: str, pattern: str) -> bool:
    bracket = _BRACKET.fullmatch(pattern)
    if bracket is None:
        return "[" not in pattern and "]" not in pattern and name == pattern
    prefix, ranges, rest = bracket.groups()
    if not name.startswith(prefix):
        return False
    tail = name[len(prefix):]
    digits = len(tail) - len(tail.lstrip("0123456789"))
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or not (hi or lo).isdigit():
            return False
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        for n in range(1, digits + 1):
            number = tail[:n]
            padded_ok = len(number) == width if width else (number == "0" or not number.startswith("0"))
            if padded_ok and int(lo) <= int(number) <= int(hi or lo) and _matches(tail[n:], rest):
                return True
    return False


def parse_listpids(text: str) -> dict[int, str]:
    """`scontrol listpids` (PID JOBID STEPID LOCALID GLOBALID) as pid -> job id; other lines are skipped."""
    out: dict[int, str] = {}
    for line in text.splitlines()[:MAX_LISTPIDS_LINES]:
        fields = line.split()
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit() and len(fields[0]) <= 10:
            out[int(fields[0])] = fields[1]
    return out


def job_of_cgroup(text: str) -> str | None:
    """The job id in a /proc/<pid>/cgroup (`.../job_<id>/step_...`, cgroup v1 or v2), if Slurm put it in one."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _CGROUP_JOB.search(path)
        if m:
            return m.group(1)
    return None


def slurm_numbers(gpus: Sequence[GpuRef]) -> dict[int, int]:
    """Slurm's GPU number -> NVML index, by PCI bus id; empty when a GPU's bus id is unknown."""
    if any(g.bus_id is None for g in gpus):
        return {}
    return {rank: g.index for rank, g in enumerate(sorted(gpus, key=lambda g: g.bus_id or ""))}


def assign_jobs(jobs: Iterable[SlurmJob], gpus: Sequence[GpuRef]) -> JobAssignment:
    numbers = slurm_numbers(gpus)
    by_gpu: dict[int, list[SlurmJob]] = {}
    unresolved: list[str] = []
    for job in jobs:
        for number in job.gpus:
            index = numbers.get(number)
            if index is None:
                unresolved.append(f"{job.job_id}: GPU {number}")
            elif job not in by_gpu.setdefault(index, []):
                by_gpu[index].append(job)
    return JobAssignment({i: tuple(js) for i, js in by_gpu.items()}, tuple(unresolved))


# -- the reader ---------------------------------------------------------------------------------------

class SlurmJobs:
    """One lookup round on this node: `scontrol listpids` once, then `show job -d` per local job."""

    def __init__(self, host: HostPaths, run: Callable[..., str], max_jobs: int = 64):
        self.host = host
        self.run = run
        self.max_jobs = max_jobs
        self._pids: dict[int, str] | None = None

    def local_pids(self) -> dict[int, str]:
        if self._pids is None:
            self._pids = parse_listpids(self._scontrol("listpids"))
        return self._pids

    def jobs(self, node: str) -> tuple[SlurmJob, ...]:
        """The jobs with processes on this node and the GPUs each holds here (at most max_jobs)."""
        ids = sorted(set(self.local_pids().values()), key=int)[:self.max_jobs]
        out = []
        for job_id in ids:
            out += [j for j in parse_jobs(self._scontrol("show", "job", "-d", job_id), node) if j.job_id == job_id]
        return tuple(out)

    def job_of_pid(self, pid: int, at: float | None) -> str | None:
        """The job of the process `pid` (an Xid's); None when it is gone, not Slurm's, or started after `at`
        (the pid was reused)."""
        started = self._started_at(pid)
        if at is not None and started is not None and started > at + START_SLACK_SECONDS:
            return None
        try:
            job = job_of_cgroup(read_text(self.host.proc(str(pid), "cgroup"), 65536))
        except OSError:
            job = None
        return job or self.local_pids().get(pid)

    def _started_at(self, pid: int) -> float | None:
        stat = read_attr(self.host.proc(str(pid), "stat"))
        try:  # not read_attr: on a many-CPU host /proc/stat's intr line alone passes one read
            system = read_text(self.host.proc("stat"))
        except OSError:
            system = ""
        btime = next((line.split()[1] for line in system.splitlines() if line.startswith("btime ")), None)
        fields = stat.rpartition(")")[2].split() if stat else []
        if len(fields) < 20 or not fields[19].isdigit() or btime is None or not btime.isdigit():
            return None
        return int(btime) + int(fields[19]) / os.sysconf("SC_CLK_TCK")

    def _scontrol(self, *args: str) -> str:
        try:
            return self.run(*args)
        except Exception as e:  # the runner is the boundary: whatever it raises, this lookup is off
            raise SlurmLookupError(f"scontrol {' '.join(args)}: {e}") from None
