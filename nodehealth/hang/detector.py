"""Daemon side: read the ranks' state records, decide what is a hang, collect the evidence.

A rank is hung when its oldest pending op is older than max(floor, factor x that op's p99 in
its group) or when its watchdog heartbeat has stopped. On the first poll that sees a job hung
(or hung at a new place), the detector writes one bundle for this node: every record of the job,
the Python stacks of every local rank (written at once), then the Flight Recorder dumps and the
native stacks (the slower pass, written over the same file when it is done).
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from nodehealth.config import HANG_DEFAULTS
from nodehealth.hang import merge, record
from nodehealth.hang.stacks import StackCollector
from nodehealth.host import HostPaths, list_dir, read_text, write_atomic
from nodehealth.model import Action, Finding, Metric, Severity

log = logging.getLogger(__name__)

DEFAULTS = HANG_DEFAULTS  # kept in config.py with the other settings
FR_DUMP_LIMIT = 64 << 20


@dataclass
class Rank:
    """One record as the detector sees it now."""

    path: str
    rec: dict[str, Any]
    host_pid: int | None  # None: the process is gone
    hung: str | None = None  # why, in words
    stuck_at: tuple = ()  # (group, seq) pairs or ("heartbeat",): the place of the hang
    pending_age: float = 0.0
    heartbeat_age: float = 0.0


@dataclass
class JobState:
    ranks: dict[int, Rank] = field(default_factory=dict)
    hung: bool = False
    dumped_at: tuple | None = None  # the hang place we already wrote a bundle for
    bundle: str | None = None
    verdicts: list[dict[str, Any]] = field(default_factory=list)


class Detector:
    def __init__(self, directory: str, bundle_dir: str, cfg: dict[str, Any] | None = None,
                 node: str = "", host: HostPaths | None = None, clock: Any = time.time):
        self.cfg = {**DEFAULTS, **(cfg or {})}
        self.directory = directory
        self.bundle_dir = bundle_dir
        self.node = node or os.uname().nodename
        self.host = host or HostPaths()
        self.clock = clock
        self.collector = StackCollector(self.cfg["py_spy"], self.cfg["stack_timeout_seconds"],
                                        self.cfg["native_timeout_seconds"], self.cfg["parallel_dumps"], self.host)
        self.lock = threading.Lock()
        self.jobs: dict[str, JobState] = {}
        self.record_errors: list[str] = []
        self.bundles_written = 0
        self.durations: dict[tuple[str, str], float] = {}
        # (pid namespace, pid, start time) of a record -> host pid, None when gone: a scan of /proc
        # per record and poll is too much on a node with many processes and old records
        self.host_pids: dict[tuple, int | None] = {}
        self.nspids: dict[tuple[int, int], list[int]] | None = None  # this scan's, built on first need

    # -- one scan ----------------------------------------------------------------------------
    def poll(self) -> list[str]:
        """Scan the records once; collect a bundle for every newly hung job. Returns bundle paths."""
        now = self.clock()
        jobs, errors = self.scan(now)
        with self.lock:
            for job, state in jobs.items():
                old = self.jobs.get(job)
                if old is not None:
                    state.dumped_at, state.bundle = old.dumped_at, old.bundle
            self.jobs, self.record_errors = jobs, errors
            self.durations = {k: v for k, v in self.durations.items() if k[0] in jobs and jobs[k[0]].hung}
        written = []
        for job, state in sorted(jobs.items()):
            if not state.hung:
                state.dumped_at = None
                continue
            place = tuple(sorted(p for r in state.ranks.values() for p in r.stuck_at))
            if place == state.dumped_at:
                continue
            state.dumped_at = place
            path = self.collect(job, state, now)
            if path:
                written.append(path)
        return written

    def scan(self, now: float) -> tuple[dict[str, JobState], list[str]]:
        jobs: dict[str, JobState] = {}
        errors = []
        stale = self.cfg["stale_record_seconds"]
        self.nspids, seen = None, set()
        for path in record.list_records(self.directory):
            try:
                rec = record.read_record(path)
            except record.RecordError as e:
                errors.append(str(e))
                continue
            if now - rec["heartbeat"] > stale:
                continue  # left behind by a job long gone: not worth a look in /proc
            key = _process_key(rec)
            seen.add(key)
            rank = Rank(path, rec, None if rec.get("exited") else self._host_pid(key))
            judge(rank, now, self.cfg)
            jobs.setdefault(rec["job"], JobState()).ranks[rec["rank"]] = rank
        for job in list(jobs):
            state = jobs[job]
            if not any(r.host_pid for r in state.ranks.values()):
                del jobs[job]  # every process of it is gone: an old job, not a hang
                continue
            state.hung = any(r.hung for r in state.ranks.values() if r.host_pid)
        for e in errors:
            log.warning("hang: %s", e)
        self.host_pids = {k: v for k, v in self.host_pids.items() if k in seen}
        return jobs, errors

    def run(self, stop: threading.Event) -> None:
        """Poll until `stop` is set (the daemon's thread, or `hang watch`)."""
        while not stop.is_set():
            try:
                self.poll()
            except Exception:  # one bad scan must not end hang detection
                log.exception("hang detector scan failed")
            stop.wait(self.cfg["scan_interval_seconds"])

    # -- evidence ----------------------------------------------------------------------------
    def collect(self, job: str, state: JobState, now: float) -> str | None:
        started = time.monotonic()
        ranks = state.ranks
        reasons = {r: rank.hung for r, rank in ranks.items() if rank.hung}
        log.warning("hang detected in job %s: %s", job, "; ".join(f"rank {r}: {w}" for r, w in sorted(reasons.items())))
        prefix = record.safe_name(job) + "."
        bundle: dict[str, Any] = {
            "version": 1, "kind": "nodehealth-hang-bundle", "node": self.node, "job": job, "detected_at": now,
            "reasons": {str(r): w for r, w in sorted(reasons.items())},
            "records": {str(r): rank.rec for r, rank in sorted(ranks.items())},
            "pids": {str(r): rank.host_pid for r, rank in sorted(ranks.items())},
            "errors": [e for e in self.record_errors if os.path.basename(e.split(":", 1)[0]).startswith(prefix)],
            "durations": {}}
        fr_asked = self._ask_flight_recorder(ranks)
        live = {r: rank.host_pid for r, rank in ranks.items() if rank.host_pid}
        stacks = self.collector.collect(sorted(live.values()))
        bundle["stacks"] = {str(r): stacks[pid] for r, pid in sorted(live.items())}
        bundle["errors"] += [f"rank {r}: {s['error']}" for r, s in bundle["stacks"].items() if s.get("error")]
        bundle["durations"]["python_stacks"] = round(time.monotonic() - started, 4)
        state.verdicts = merge.verdicts(bundle)
        bundle["verdicts"] = state.verdicts
        path = self._bundle_path(job, now)
        if not self._write(path, bundle):
            return None
        state.bundle = path
        with self.lock:
            self.bundles_written += 1
            self.durations[(job, "python")] = bundle["durations"]["python_stacks"]
        log.warning("hang bundle for job %s written to %s in %.3f s", job, path, bundle["durations"]["python_stacks"])
        self._slow_pass(bundle, live, fr_asked, path)
        return path

    def _slow_pass(self, bundle: dict[str, Any], live: dict[int, int], fr_asked: dict[int, dict[str, Any]],
                   path: str) -> None:
        """Flight Recorder dumps and native stacks, then the bundle again with them."""
        started = time.monotonic()
        if fr_asked:
            bundle["flight_recorder"] = self._read_flight_recorder(fr_asked)
            bundle["durations"]["flight_recorder"] = round(time.monotonic() - started, 4)
            bundle["verdicts"] = merge.verdicts(bundle)
        if self.cfg["native_stacks"] and live:
            t0 = time.monotonic()
            native = self.collector.collect(sorted(live.values()), native=True)
            bundle["native_stacks"] = {str(r): native[pid] for r, pid in sorted(live.items())}
            bundle["errors"] += [f"rank {r} (native): {s['error']}" for r, s in bundle["native_stacks"].items()
                                 if s.get("error")]
            bundle["durations"]["native_stacks"] = round(time.monotonic() - t0, 4)
            with self.lock:
                self.durations[(bundle["job"], "native")] = bundle["durations"]["native_stacks"]
        if fr_asked or "native_stacks" in bundle:
            self._write(path, bundle)

    def _ask_flight_recorder(self, ranks: dict[int, Rank]) -> dict[int, dict[str, Any]]:
        """Ask every live rank that runs Flight Recorder for a dump: through the timer's request
        file (any backend) and, when the rank made it in our directory, PyTorch's NCCL debug-info
        pipe. Every path is ours, built from the record's own file name: records are written by
        the training pods, and we act on these files as root."""
        asked = {}
        for r, rank in ranks.items():
            fr = rank.rec.get("flight_recorder")
            if not rank.host_pid or not isinstance(fr, dict):
                continue
            request, dump = record.flight_recorder_paths(rank.path)
            info: dict[str, Any] = {"dump": dump, "nccl_pipe": None}
            with contextlib.suppress(OSError):
                os.unlink(dump)  # removes a planted link itself, never what it points at
            try:
                write_atomic(request, b"1\n")  # a rename: replaces a planted link, never writes through it
            except OSError as e:
                info["error"] = f"cannot write the Flight Recorder request file: {e.strerror or e}"
            info["nccl_pipe"] = self._poke_pipe(fr.get("nccl_pipe"))
            asked[r] = info
        return asked

    def _read_flight_recorder(self, asked: dict[int, dict[str, Any]]) -> dict[str, Any]:
        import json

        limit = self.cfg["flight_recorder_timeout_seconds"]
        deadline = time.monotonic() + limit
        out: dict[str, Any] = {}
        for r, info in sorted(asked.items()):
            entry: dict[str, Any] = {"nccl_pipe": info["nccl_pipe"]}
            while not os.path.lexists(info["dump"]) and time.monotonic() < deadline:
                time.sleep(0.05)
            try:
                entry["dump"] = json.loads(record.read_regular(info["dump"], FR_DUMP_LIMIT))
            except FileNotFoundError:
                entry["error"] = f"no Flight Recorder dump from rank {r} within {limit:g} s (is its process stopped?)"
            except OSError as e:
                entry["error"] = f"cannot read the Flight Recorder dump of rank {r}: {e.strerror or e}"
            except ValueError as e:
                entry["error"] = f"rank {r} wrote a Flight Recorder dump that is not JSON: {e}"
            out[str(r)] = entry
        return out

    def _poke_pipe(self, name: Any) -> str | None:
        """Write to PyTorch's NCCL debug-info FIFO, which makes the rank dump Flight Recorder. Only a
        FIFO named in the record that lies in our directory, opened without following links."""
        if not isinstance(name, str) or not name or name != record.safe_name(name) or name.startswith("."):
            return None
        pipe = os.path.join(self.directory, name)
        try:
            fd = record.open_plain(pipe, os.O_WRONLY | os.O_NONBLOCK, stat.S_ISFIFO)
            try:
                os.write(fd, b"1\n")
            finally:
                os.close(fd)
            return f"wrote to {pipe}; the dump goes to the rank's TORCH_FR_DUMP_TEMP_FILE prefix"
        except OSError as e:  # ENXIO: nobody reads it (not an NCCL process group, or FR off)
            return f"cannot trigger through {pipe}: {e.strerror or e}"

    def _bundle_path(self, job: str, now: float) -> str:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        return os.path.join(self.bundle_dir, f"hang-{record.safe_name(job)}-{record.safe_name(self.node)}-{stamp}.json")

    def _write(self, path: str, bundle: dict[str, Any]) -> bool:
        try:
            os.makedirs(self.bundle_dir, exist_ok=True)
            record.write_json(path, bundle)
            return True
        except OSError as e:
            log.error("cannot write hang bundle %s: %s", path, e.strerror or e)
            return False

    def _host_pid(self, key: tuple) -> int | None:
        """The pid of a record's process as we see it, matched by start time; None if gone.
        Remembered, misses included: a process found once is only checked to be alive."""
        namespace, pid, start = key
        if start is None:  # an old timer: no start time to match or to remember by
            return pid if os.path.exists(self.host.proc(str(pid))) else None
        if key in self.host_pids:
            known = self.host_pids[key]
            if known is not None and _start_ticks(self.host, known) != start:
                known = self.host_pids[key] = None  # it exited
            return known
        found = pid if _start_ticks(self.host, pid) == start else None
        if found is None:  # another PID namespace: find it by NSpid and start time (and namespace)
            for candidate in self._nspid_map().get((pid, start), []):
                if namespace is None or _pid_namespace(self.host, candidate) in (namespace, None):
                    found = candidate
                    break
        self.host_pids[key] = found
        return found

    def _nspid_map(self) -> dict[tuple[int, int], list[int]]:
        """(pid in its own namespace, start ticks) -> host pids, from one pass over /proc per scan."""
        if self.nspids is not None:
            return self.nspids
        self.nspids = {}
        for name in list_dir(self.host.proc()):
            if not name.isdigit():
                continue
            try:
                status = read_text(self.host.proc(name, "status"), 65536)
            except OSError:
                continue
            nspid = next((line.split()[-1] for line in status.splitlines() if line.startswith("NSpid:")), "")
            start = _start_ticks(self.host, int(name))
            if nspid.isdigit() and start is not None:
                self.nspids.setdefault((int(nspid), start), []).append(int(name))
        return self.nspids

    # -- what the daemon shows ---------------------------------------------------------------
    def metrics(self) -> list[Metric]:
        detected = Metric("nodehealth_hang_detected", "1 if a local training job is hung now, else 0.",
                          labels=("job",))
        progress = Metric("nodehealth_hang_last_progress_age_seconds",
                          "Age of the rank's oldest pending collective or point-to-point op; 0 when none is pending.",
                          labels=("job", "rank"))
        heartbeat = Metric("nodehealth_hang_heartbeat_age_seconds",
                           "Seconds since the rank's timer thread last published its state record.",
                           labels=("job", "rank"))
        duration = Metric("nodehealth_hang_dump_duration_seconds",
                          "How long the last stack collection took, by stage (python or native).",
                          labels=("job", "stage"))
        bundles = Metric("nodehealth_hang_bundles_total", "Hang bundles written since the detector started.",
                         kind="counter")
        errors = Metric("nodehealth_hang_record_errors", "State records that could not be read in the last scan.")
        with self.lock:
            for job, state in self.jobs.items():
                detected.add((job,), 1 if state.hung else 0)
                for r, rank in state.ranks.items():
                    if rank.host_pid:
                        progress.add((job, r), round(rank.pending_age, 3))
                        heartbeat.add((job, r), round(rank.heartbeat_age, 3))
            for (job, stage), seconds in self.durations.items():
                if job in self.jobs:
                    duration.add((job, stage), seconds)
            bundles.add((), self.bundles_written)
            errors.add((), len(self.record_errors))
        return [detected, progress, heartbeat, duration, bundles, errors]

    def findings(self) -> list[Finding]:
        """One finding per hung job, with the verdict in words and where the bundle is."""
        out = []
        with self.lock:
            jobs = copy.copy(self.jobs)
        for job, state in sorted(jobs.items()):
            if not state.hung:
                continue
            said = "; ".join(v["summary"] for v in state.verdicts if v.get("summary")) or "ranks stopped progressing"
            where = f"; stacks in {state.bundle}" if state.bundle else ""
            out.append(Finding("hang", Severity.WARNING, "TrainingHang", f"Training job {job} is hung: {said}{where}.",
                               device=f"job {job}", action=Action.NONE,
                               evidence={"bundle": state.bundle, "verdicts": state.verdicts}))
        return out


def judge(rank: Rank, now: float, cfg: dict[str, Any]) -> None:
    """Set rank.hung (why, or None), the place it is stuck at and its ages: a pure function of
    the record, the time and the thresholds."""
    rec = rank.rec
    rank.heartbeat_age = max(0.0, now - rec["heartbeat"])
    reasons, place, oldest = [], [], 0.0
    for name, group in sorted(rec["groups"].items()):
        pending = [op for op in group.get("pending", []) if isinstance(op.get("enqueued_at"), (int, float))]
        if not pending:
            continue
        op = min(pending, key=lambda o: o["seq"])
        age = max(0.0, now - op["enqueued_at"])
        oldest = max(oldest, age)
        limit = limit_for(group, op["op"], cfg)
        if age > limit:
            reasons.append(f"{op['op']} #{op['seq']} in group {name} pending for {age:.1f} s (limit {limit:.1f} s)")
            place.append((name, op["seq"]))
    rank.pending_age = oldest
    if rank.heartbeat_age > cfg["heartbeat_timeout_seconds"] and not rec.get("exited"):
        reasons.append(f"no heartbeat for {rank.heartbeat_age:.1f} s (limit {cfg['heartbeat_timeout_seconds']:.1f} s)")
        place.append(("heartbeat", 0))
    rank.hung = "; ".join(reasons) or None
    rank.stuck_at = tuple(place)


def limit_for(group: dict[str, Any], op: str, cfg: dict[str, Any]) -> float:
    stats = group.get("p99", {}).get(op)
    if isinstance(stats, dict) and isinstance(stats.get("seconds"), (int, float)) \
            and isinstance(stats.get("samples"), int) and stats["samples"] >= cfg["min_samples"]:
        return max(cfg["floor_seconds"], cfg["p99_factor"] * stats["seconds"])
    return cfg["floor_seconds"]


def _process_key(rec: dict[str, Any]) -> tuple[str | None, int, int | None]:
    """(pid namespace, pid, start ticks) of a record, each part None where the record has no usable one."""
    namespace, start = rec.get("pid_namespace"), rec.get("start_time")
    return (namespace if isinstance(namespace, str) else None, rec["pid"],
            start if isinstance(start, int) and not isinstance(start, bool) else None)


def _pid_namespace(host: HostPaths, pid: int) -> str | None:
    try:
        return os.readlink(host.proc(str(pid), "ns", "pid"))
    except OSError:
        return None


def _start_ticks(host: HostPaths, pid: int) -> int | None:
    try:
        text = read_text(host.proc(str(pid), "stat"), 4096)
        return int(text.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None

