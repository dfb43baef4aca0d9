"""Daemon side: read the ranks' state records, decide what is a hang, collect the evidence.

A rank is hung when its oldest pending op is older than max(floor, factor x that op's p99 in
its group) or when its watchdog heartbeat has stopped. On the first poll that sees a job hung
(or hung at a new place), the detector writes one bundle for this node: every record of the job,
the Python stacks of every local rank (written at once), then the Flight Recorder dumps and the
native stacks (the slower pass, written over the same file when it is done).

The records directory is written by every user of the node and the detector runs as root, so a
record speaks only for its file's owner: it may name only processes of that user (root's records
excepted), never the daemon or a PID 1; a job's records all have one owner (the same job name from
two users is two jobs); the records read, jobs judged, dumps made and metric series shown per scan
are bounded, owners taking turns; and bundles go only into a directory we own, never through a link.
"""
from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from nodehealth.hang import flight_recorder, merge, record
from nodehealth.hang.bundles import BundleDir, BundleError
from nodehealth.hang.exits import ExitWatcher
from nodehealth.hang.oncelog import CAUSES, OncePerCause
from nodehealth.hang.rules import DEFAULTS, Rank, judge, stragglers
from nodehealth.hang.stacks import StackCollector
from nodehealth.host import HostPaths, list_dir, read_text
from nodehealth.model import Action, Finding, Metric, Reason, Severity

log = logging.getLogger(__name__)

# The findings of the daemon's hang detector, under the check name `hang` (docs/checks.md).
REASONS = {
    "TrainingHang": Reason(Severity.WARNING, Action.NONE,
                           "a local training job is hung; the message gives the verdict and the bundle's path"),
    "TrainingStraggler": Reason(Severity.WARNING, Action.NONE, "one rank makes its peers wait in every collective"),
}



@dataclass
class JobState:
    ranks: dict[int, Rank] = field(default_factory=dict)
    owner: int = 0  # the uid owning every record of the job
    hung: bool = False
    dumped_at: tuple | None = None  # the hang place we already wrote a bundle for
    bundle: str | None = None
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    stragglers: list[dict[str, Any]] = field(default_factory=list)  # seen straggler_scans scans in a row


class Detector:
    def __init__(self, directory: str, bundle_dir: str, cfg: dict[str, Any] | None = None,
                 node: str = "", host: HostPaths | None = None, clock: Any = time.time):
        self.cfg = {**DEFAULTS, **(cfg or {})}
        self.directory = directory
        self.bundles = BundleDir(bundle_dir, self.cfg["max_bundle_bytes"], self.cfg["max_bundle_dir_bytes"],
                                 self.cfg["max_bundles"])
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
        self.last_pids: dict[tuple, int] = {}  # the host pid a record's process had when last seen alive
        self.exits = ExitWatcher()  # their exit statuses, once watch_exits() started it
        self.nspids: dict[tuple[int, int], list[int]] | None = None  # this scan's, built on first need
        self.proc_state: dict[int, str] = {}  # pid -> state letter, from the stat read that checked it
        self.stop = threading.Event()  # set at shutdown: dumps in flight are interrupted
        self.collector.stop = self.stop
        self.skipped: dict[str, int] = {}  # records or jobs left out, by reason (counter)
        self.refused: dict[str, int] = {}  # dumps refused by a rate limit, by which (counter)
        self.bundle_times: deque = deque()  # when this node's recent bundles were written
        self.job_dumped: dict[str, float] = {}
        self.owner_dumped: dict[int, float] = {}
        self.pid_dumped: dict[int, float] = {}
        self.straggler_streak: dict[tuple[str, int], int] = {}
        self.unwritten: dict[str, str] = {}  # job -> why its bundle could not be written, in the last scan
        self.warnings = OncePerCause(log, clock)

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
            self._stragglers(jobs)
            self.durations = {k: v for k, v in self.durations.items() if k[0] in jobs and jobs[k[0]].hung}
        written, self.unwritten = [], {}
        due = []
        for job, state in jobs.items():
            if not state.hung:
                state.dumped_at = None
                continue
            place = tuple(sorted(p for r in state.ranks.values() for p in r.stuck_at))
            if place != state.dumped_at:
                due.append((job, state, place))
        # owners take turns, the one served least recently first: one user's flood cannot starve another's
        due = _fair(sorted(due, key=lambda d: d[0]), lambda d: d[1].owner)
        due.sort(key=lambda d: self.owner_dumped.get(d[1].owner, 0.0))
        for job, state, place in due:
            if self.stop.is_set():
                break
            if not self._may_dump(job, now):
                continue
            state.dumped_at = place
            path = self.collect(job, state, now)
            if path:
                written.append(path)
        return written

    def _stragglers(self, jobs: dict[str, JobState]) -> None:
        """Stragglers of running jobs, kept only once seen in straggler_scans scans in a row."""
        streak = {}
        for job, state in jobs.items():
            if state.hung or not all(r.host_pid for r in state.ranks.values()):
                continue
            found = stragglers({str(r): rank.rec for r, rank in state.ranks.items()}, self.cfg)
            for s in found:
                streak[(job, s["rank"])] = self.straggler_streak.get((job, s["rank"]), 0) + 1
            state.stragglers = [s for s in found if streak[(job, s["rank"])] >= self.cfg["straggler_scans"]]
        self.straggler_streak = streak

    def _may_dump(self, job: str, now: float) -> bool:
        """The node's and the job's rate limits; a refusal is counted, and tried again next scan."""
        while self.bundle_times and now - self.bundle_times[0] > 60:
            self.bundle_times.popleft()
        if len(self.bundle_times) >= self.cfg["dumps_per_minute"]:
            reason = "node_rate"
        elif now - self.job_dumped.get(job, -1e18) < self.cfg["job_dump_interval_seconds"]:
            reason = "job_rate"
        else:
            return True
        with self.lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1
        return False

    def _warn(self, cause: str, message: str, level: int = logging.WARNING) -> None:
        with self.lock:  # the counts are read by metrics() from another thread
            self.warnings.warn(cause, message, level)

    def _count(self, counter: dict[str, int], reason: str, n: int = 1) -> None:
        with self.lock:
            counter[reason] = counter.get(reason, 0) + n

    def scan(self, now: float) -> tuple[dict[str, JobState], list[str]]:
        jobs: dict[str, JobState] = {}
        by_owner: dict[tuple[int, str], JobState] = {}
        errors = []
        stale = self.cfg["stale_record_seconds"]
        self.nspids, seen = None, set()
        paths = self._fair_records()
        for path in paths:
            try:
                rec, owner = record.read_owned(path)
            except record.RecordError as e:
                errors.append(str(e))
                cause = "over_cap" if "over the cap" in str(e) else "bad_record"
                if cause == "over_cap":
                    self._count(self.skipped, "over_cap")
                self._warn(cause, str(e))
                continue
            if now - rec["heartbeat"] > stale:
                continue  # left behind by a job long gone: not worth a look in /proc
            key = _process_key(rec)
            seen.add(key)
            done = rec.get("exited") or rec.get("finished")
            rank = Rank(path, rec, None if done else self._host_pid(key))
            if not rank.host_pid:
                rank.exit_status = self.exits.status(self.last_pids.get(key))
            if done:
                rank.process = "finished" if rec.get("finished") else "gone"
            elif rank.host_pid is None:
                rank.process = "gone"
            else:
                why = self._refuse(rank.host_pid, rec["pid"], owner)
                if why:
                    errors.append(f"{path}: {why}; refused")
                    self._count(self.skipped, "foreign_process")
                    self._warn("foreign_process", errors[-1])
                    rank.host_pid, rank.process = None, "refused"
                    continue
                self.last_pids[key] = rank.host_pid
                if self.proc_state.get(rank.host_pid) in ("T", "t"):
                    rank.process = "stopped"
            judge(rank, now, self.cfg)
            state = by_owner.setdefault((owner, rec["job"]), JobState(owner=owner))
            state.ranks[rec["rank"]] = rank
        names: dict[str, int] = {}
        for _, name in by_owner:
            names[name] = names.get(name, 0) + 1
        considered = 0
        for (owner, name), state in _fair(by_owner.items(), lambda item: item[0][0]):
            if not any(r.host_pid for r in state.ranks.values()):
                continue  # every process of it is gone: an old job, not a hang
            if considered >= self.cfg["max_jobs_per_scan"]:
                self._count(self.skipped, "job_limit")
                continue
            considered += 1
            # the same job name from two users is two jobs, each speaking only for its own processes
            job = name if names[name] == 1 else f"{name}@uid{owner}"
            state.hung = any(r.hung for r in state.ranks.values() if r.host_pid)
            jobs[job] = state
        self.host_pids = {k: v for k, v in self.host_pids.items() if k in seen}
        self.last_pids = {k: v for k, v in self.last_pids.items() if k in seen}
        self.exits.watch(set(self.last_pids.values()))
        self.proc_state = {v: self.proc_state[v] for v in self.host_pids.values() if v in self.proc_state}
        return jobs, errors

    def _fair_records(self) -> list[str]:
        """Record paths to read this scan, owners taking turns, newest first: at most
        max_records_per_scan of them and max_scan_bytes together (the caps apply before reading)."""
        entries = []
        for path in record.list_records(self.directory):
            try:
                st = os.lstat(path)
            except OSError:
                continue
            entries.append((st.st_uid, -st.st_mtime, path, st.st_size))
        entries.sort()
        chosen, total = [], 0
        for entry in _fair(entries, lambda e: e[0]):
            size = min(entry[3], record.MAX_RECORD_BYTES + 1)
            if len(chosen) >= self.cfg["max_records_per_scan"] or total + size > self.cfg["max_scan_bytes"]:
                self._count(self.skipped, "record_limit")
                continue
            chosen.append(entry[2])
            total += size
        return chosen

    def _refuse(self, host_pid: int, pid: int, owner: int) -> str | None:
        """Why a record may not name this process, or None: only its owner's processes (any, when
        root wrote it), and never this daemon or a PID 1, whoever asks."""
        if host_pid in (os.getpid(), 1) or pid == 1:
            return f"the record names pid {pid}, the daemon itself or a PID 1"
        try:
            uid = os.stat(self.host.proc(str(host_pid))).st_uid  # its effective uid; root if not dumpable
        except OSError:
            return f"pid {host_pid} is gone"
        if owner != 0 and uid != owner:
            return f"the record is owned by uid {owner} but names pid {host_pid} of uid {uid}"
        return None

    def watch_exits(self) -> bool:
        """Listen for the exit statuses of ranks' processes (root in the host's namespaces), so a
        rank that is gone is said with its exit code or signal; False, logged once, where we cannot."""
        if self.exits.start():
            return True
        log.warning("hang: exit codes of dead ranks will not be known: %s", self.exits.error)
        return False

    def run(self, stop: threading.Event) -> None:
        """Poll until `stop` is set (the daemon's thread, or `hang watch`); setting it interrupts dumps."""
        self.stop = self.collector.stop = stop
        self.watch_exits()
        try:
            while not stop.is_set():
                try:
                    self.poll()
                except Exception:  # one bad scan must not end hang detection
                    log.exception("hang detector scan failed")
                stop.wait(self.cfg["scan_interval_seconds"])
        finally:
            self.exits.close()

    # -- evidence ----------------------------------------------------------------------------
    def collect(self, job: str, state: JobState, now: float) -> str | None:
        started = time.monotonic()
        ranks = state.ranks
        reasons = {r: rank.hung for r, rank in ranks.items() if rank.hung}
        log.warning("hang detected in job %s: %s", job, "; ".join(f"rank {r}: {w}" for r, w in sorted(reasons.items())))
        prefix = record.safe_name(job.split("@uid")[0]) + "."
        bundle: dict[str, Any] = {
            "version": 1, "kind": "nodehealth-hang-bundle", "node": self.node, "job": job, "detected_at": now,
            "owner": state.owner, "reasons": {str(r): w for r, w in sorted(reasons.items())},
            "records": {str(r): rank.rec for r, rank in sorted(ranks.items())},
            "pids": {str(r): rank.host_pid for r, rank in sorted(ranks.items())},
            "processes": {str(r): rank.process for r, rank in sorted(ranks.items())},
            "pods": {str(r): "/".join(filter(None, (rank.rec["pod"]["namespace"], rank.rec["pod"]["name"])))
                     for r, rank in sorted(ranks.items()) if rank.rec.get("pod")},
            "exit_statuses": {str(r): rank.exit_status for r, rank in sorted(ranks.items()) if rank.exit_status},
            "silent": {str(r): round(rank.heartbeat_age, 1) for r, rank in sorted(ranks.items()) if rank.silent},
            "errors": [e for e in self.record_errors if os.path.basename(e.split(":", 1)[0]).startswith(prefix)],
            "durations": {}}
        live: dict[int, int] = {}
        for r, rank in sorted(ranks.items()):
            if not rank.host_pid:
                continue
            last = self.pid_dumped.get(rank.host_pid)
            why = self._refuse(rank.host_pid, rank.rec["pid"], state.owner)  # again: it may have exec'd since
            if last is not None and now - last < self.cfg["process_dump_interval_seconds"]:
                why = f"pid {rank.host_pid} was dumped {now - last:.0f} s ago; not again so soon"
                self._count(self.refused, "process_rate")
            if why:
                bundle["errors"].append(f"rank {r}: stacks not collected: {why}")
            else:
                live[r] = rank.host_pid
        if not live:
            self.unwritten[job] = "no process of it may be dumped now"
            self._warn("no_dumpable_process", f"hang in job {job}: {self.unwritten[job]}; no bundle")
            return None
        for pid in live.values():
            self.pid_dumped[pid] = now
        self.pid_dumped = {p: t for p, t in self.pid_dumped.items()
                           if now - t < self.cfg["process_dump_interval_seconds"]}
        self.bundle_times.append(now)
        self.job_dumped[job] = self.owner_dumped[state.owner] = now
        fr_asked = flight_recorder.ask({r: ranks[r] for r in live}, self.directory, bundle["errors"])
        stacks = self.collector.collect(sorted(live.values()))
        bundle["stacks"] = {str(r): stacks[pid] for r, pid in sorted(live.items())}
        self._children(bundle["stacks"], live, state.owner)
        bundle["errors"] += [f"rank {r}: {s['error']}" for r, s in bundle["stacks"].items() if s.get("error")]
        bundle["durations"]["python_stacks"] = round(time.monotonic() - started, 4)
        state.verdicts = merge.verdicts(bundle)
        bundle["verdicts"] = state.verdicts
        try:
            path = self._write(job, now, bundle)
        except BundleError as e:
            self.unwritten[job] = str(e)
            self._warn("bundle_dir", str(e), logging.ERROR)
            return None
        state.bundle = path
        with self.lock:
            self.bundles_written += 1
            self.durations[(job, "python")] = bundle["durations"]["python_stacks"]
        log.warning("hang bundle for job %s written to %s in %.3f s", job, path, bundle["durations"]["python_stacks"])
        if not self.stop.is_set():
            self._slow_pass(bundle, live, fr_asked, path)
            state.verdicts = bundle["verdicts"]  # judged again from the Flight Recorder's dumps, if any
        return path

    def _children(self, stacks: dict[str, Any], live: dict[int, int], owner: int) -> None:
        """Python stacks of each rank's child processes (DataLoader workers), a few per rank, shown
        under it: the worker that hangs is where the rank's Queue.get waits."""
        limit = self.cfg["max_children_per_rank"]
        for r, pid in sorted(live.items()):
            kids = [k for k in _children(pid) if not self._refuse(k, k, owner)]
            if not kids or limit <= 0:
                continue
            if len(kids) > limit:
                stacks[str(r)]["children_left_out"] = len(kids) - limit
            dumps = self.collector.collect(kids[:limit])
            stacks[str(r)]["children"] = {str(k): dumps[k] for k in kids[:limit]}

    def _slow_pass(self, bundle: dict[str, Any], live: dict[int, int], fr_asked: dict[int, dict[str, Any]],
                   path: str) -> None:
        """Flight Recorder dumps and native stacks, then the bundle again with them."""
        started = time.monotonic()
        if fr_asked:
            bundle["flight_recorder"] = flight_recorder.read(fr_asked, self.cfg["flight_recorder_timeout_seconds"],
                                                             self.stop)
            bundle["errors"] += [f"rank {r} (Flight Recorder): {e['error']}"
                                 for r, e in bundle["flight_recorder"].items() if e.get("error")]
            bundle["durations"]["flight_recorder"] = round(time.monotonic() - started, 4)
            bundle["verdicts"] = merge.verdicts(bundle)
        if self.cfg["native_stacks"] and live and not self.stop.is_set():
            t0 = time.monotonic()
            native = self.collector.collect(sorted(live.values()), native=True)
            bundle["native_stacks"] = {str(r): native[pid] for r, pid in sorted(live.items())}
            bundle["errors"] += [f"rank {r} (native): {s['error']}" for r, s in bundle["native_stacks"].items()
                                 if s.get("error")]
            bundle["durations"]["native_stacks"] = round(time.monotonic() - t0, 4)
            with self.lock:
                self.durations[(bundle["job"], "native")] = bundle["durations"]["native_stacks"]
        if fr_asked or "native_stacks" in bundle:
            try:
                self._write(bundle["job"], bundle["detected_at"], bundle, os.path.basename(path))
            except BundleError as e:
                self._warn("bundle_dir", str(e), logging.ERROR)

    def _write(self, job: str, now: float, bundle: dict[str, Any], name: str | None = None) -> str:
        """Write a bundle into our bundle directory; its path, or BundleError saying why not."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        return self.bundles.write(name or f"hang-{record.safe_name(job)}-{record.safe_name(self.node)}-{stamp}.json",
                                  bundle)

    def _host_pid(self, key: tuple) -> int | None:
        """The pid of a record's process as we see it, matched by start time; None if gone.
        Remembered, misses included: a process found once is only checked to be alive."""
        namespace, pid, start = key
        if start is None:  # an old timer: no start time to match or to remember by
            return pid if os.path.exists(self.host.proc(str(pid))) else None
        if key in self.host_pids:
            known = self.host_pids[key]
            if known is not None and self._start_ticks(known) != start:
                known = self.host_pids[key] = None  # it exited
            return known
        found = pid if self._start_ticks(pid) == start else None
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
            start = self._start_ticks(int(name))
            if nspid.isdigit() and start is not None:
                self.nspids.setdefault((int(nspid), start), []).append(int(name))
        return self.nspids

    def _start_ticks(self, pid: int) -> int | None:
        """Start time of a process; its state letter is kept too (a stopped rank is told apart). None
        for a process that is gone, a zombie included: it died, only its parent has not reaped it."""
        try:
            fields = read_text(self.host.proc(str(pid), "stat"), 4096).rsplit(")", 1)[1].split()
            self.proc_state[pid] = fields[0]
            return None if fields[0] in ("Z", "X") else int(fields[19])
        except (OSError, IndexError, ValueError):
            return None

    # -- what the daemon shows ---------------------------------------------------------------
    def metrics(self) -> list[Metric]:
        # `training_job`, not `job`: Prometheus's own `job` label (the scrape job) would rename ours.
        detected = Metric("nodehealth_hang_detected", "1 if a local training job is hung now, else 0.",
                          labels=("training_job",))
        progress = Metric("nodehealth_hang_last_progress_age_seconds",
                          "Age of the rank's oldest pending collective or point-to-point op; 0 when none is pending.",
                          labels=("training_job", "rank"))
        heartbeat = Metric("nodehealth_hang_heartbeat_age_seconds",
                           "Seconds since the rank's timer thread last published its state record.",
                           labels=("training_job", "rank"))
        duration = Metric("nodehealth_hang_dump_duration_seconds",
                          "How long the last stack collection took, by stage (python or native).",
                          labels=("training_job", "stage"))
        bundles = Metric("nodehealth_hang_bundles_total", "Hang bundles written since the detector started.",
                         kind="counter")
        errors = Metric("nodehealth_hang_record_errors", "State records that could not be read in the last scan.")
        skipped = Metric("nodehealth_hang_skipped_total",
                         "Records or jobs left out: over a size/depth/world/group cap, past the per-scan limits, "
                         "or naming a process their owner may not name.", kind="counter", labels=("reason",))
        refused = Metric("nodehealth_hang_dumps_refused_total",
                         "Stack dumps refused by a rate limit (node, job or process).", kind="counter",
                         labels=("limit",))
        not_logged = Metric("nodehealth_hang_warnings_not_logged_total",
                            "Warnings not written to the log because one of the same cause was, within the hour: "
                            "bad or oversized records, records naming another user's process, a refused bundle "
                            "directory, a hang with no process that may be dumped.",
                            kind="counter", labels=("cause",))
        straggler = Metric("nodehealth_hang_straggler",
                           "1 for a rank the others keep waiting for in their collectives (a straggler).",
                           labels=("training_job", "rank", "host"))
        budget = self.cfg["max_metric_series"]
        with self.lock:
            # hung jobs first, so the series that matter survive the cap
            for job, state in sorted(self.jobs.items(), key=lambda j: (not j[1].hung, j[0])):
                live = [(r, rank) for r, rank in sorted(state.ranks.items()) if rank.host_pid]
                if budget < 1 + 2 * len(live):
                    break
                budget -= 1 + 2 * len(live)
                detected.add((job,), 1 if state.hung else 0)
                for r, rank in live:
                    progress.add((job, r), round(rank.pending_age, 3))
                    heartbeat.add((job, r), round(rank.heartbeat_age, 3))
                for s in state.stragglers[:4]:
                    straggler.add((job, s["rank"], s["host"] or ""), 1)
            for (job, stage), seconds in self.durations.items():
                if job in self.jobs and any(s[0] == (job,) for s in detected.samples):
                    duration.add((job, stage), seconds)
            bundles.add((), self.bundles_written)
            errors.add((), len(self.record_errors))
            for reason in ("over_cap", "record_limit", "job_limit", "foreign_process"):
                skipped.add((reason,), self.skipped.get(reason, 0))
            for limit in ("node_rate", "job_rate", "process_rate"):
                refused.add((limit,), self.refused.get(limit, 0))
            for cause in CAUSES:
                not_logged.add((cause,), self.warnings.not_logged[cause])
        return [detected, progress, heartbeat, duration, straggler, bundles, errors, skipped, refused, not_logged]

    def findings(self) -> list[Finding]:
        """One finding per hung job, with the verdict in words and where the bundle is."""
        out = []
        with self.lock:
            jobs = copy.copy(self.jobs)
        for job, state in sorted(jobs.items()):
            for s in state.stragglers:
                out.append(Finding("hang", Severity.WARNING, "TrainingStraggler",
                                   f"Training job {job}: {s['summary']}; the whole job runs at its pace.",
                                   device=f"job {job} rank {s['rank']}", action=Action.NONE, evidence=s))
            if not state.hung:
                continue
            said = "; ".join(v["summary"] for v in state.verdicts if v.get("summary")) or "ranks stopped progressing"
            where = f"; stacks in {state.bundle}" if state.bundle else ""
            out.append(Finding("hang", Severity.WARNING, "TrainingHang", f"Training job {job} is hung: {said}{where}.",
                               device=f"job {job}", action=Action.NONE,
                               evidence={"bundle": state.bundle, "verdicts": state.verdicts}))
        return out


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





def _fair(items: Any, owner: Any) -> list[Any]:
    """Items in turns by owner: each owner's first, then each owner's second, ...; in order otherwise."""
    queues: dict[Any, list[Any]] = {}
    for item in items:
        queues.setdefault(owner(item), []).append(item)
    out = []
    for i in range(max((len(q) for q in queues.values()), default=0)):
        out += [q[i] for q in queues.values() if i < len(q)]
    return out


def _children(pid: int) -> list[int]:
    """Child pids of a live process (a rank's DataLoader workers), of any of its threads. psutil finds them
    by each process's parent, which every kernel shows; /proc/PID/task/TID/children needs a kernel built
    with CONFIG_PROC_CHILDREN. Only a live process has children worth a stack, so no replayed root here."""
    import psutil  # the daemon's hang bundles only

    try:
        return sorted(c.pid for c in psutil.Process(pid).children())
    except psutil.Error:  # gone meanwhile, or not ours to see
        return []
