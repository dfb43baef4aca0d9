"""One attribution round per pass: the sources are asked only when a fresh GPU finding needs them (or
the info metric is on), once per round however many findings there are, and what a finding was
attributed while fresh stays with it (in memory) after it no longer is.

node_pass.attribute applies it after the policy, before the faces: to `nodehealth check`'s one pass,
and to every report of the daemon. Only the daemon's passes ask the sources; a report judged between
passes (a kernel record) gets what the findings were last given, without asking: a kubelet or a
slurmctld that hangs must never hold the kernel log's reader. It never raises: a bug here is an info
finding, never a failed pass.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from nodehealth.attribution.defaults import settings
from nodehealth.attribution.evidence import CHECK, UNAVAILABLE, Lookup, attribute, is_fresh, wants_attribution
from nodehealth.attribution.gpus import Assignment, GpuRef, assign, gpu_of, gpu_refs
from nodehealth.attribution.kubelet import KubeletError, PodResourcesClient
from nodehealth.attribution.notices import gpu_pod_info
from nodehealth.attribution.slurm_jobs import SlurmJobs, SlurmLookupError, assign_jobs
from nodehealth.collectors.gpu_facts import NvmlFacts
from nodehealth.host import HostPaths
from nodehealth.model import Finding, Metric, Severity

log = logging.getLogger(__name__)

MAX_REMEMBERED = 256  # findings whose attribution is kept; the oldest go first
KEPT = ("pods", "pods_inferred", "slurm_jobs")


class Attributor:
    def __init__(self, cfg: dict[str, Any] | None, host: HostPaths, node: str,
                 scontrol: Callable[..., str] | None = None):
        """`scontrol` is the Slurm face's runner (arguments in, output out, raises on failure)."""
        self.cfg = settings(cfg)
        if "slurm" in self.cfg["sources"] and scontrol is None:
            raise ValueError("attribution.sources has slurm, but no scontrol to ask: turn the Slurm face on")
        self.host = host
        self.node = node
        self.scontrol = scontrol
        self.client = PodResourcesClient(self.cfg["kubelet_socket"], float(self.cfg["kubelet_timeout_seconds"]),
                                         int(self.cfg["kubelet_max_answer_bytes"]))
        # The last placement and the GPUs it was made on, for the info metric (one value: read at a scrape).
        self._placed: tuple[Assignment, tuple[GpuRef, ...]] | None = None
        self._lock = threading.Lock()  # the remembered attributions: a pass and the kernel stream share them
        self._remembered: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()
        self._notes: list[Finding] = []  # the last round's AttributionUnavailable findings

    def annotate(self, findings: Sequence[Finding], facts: NvmlFacts | None, now: float,
                 ask: bool = True) -> list[Finding]:
        """The findings with pods and jobs in their GPU findings' evidence (see evidence.attribute);
        with `ask` off, what they were last given and the last round's notes, without asking anyone."""
        try:
            if not ask:
                with self._lock:
                    return self._remember(list(findings)) + self._notes
            return self._annotate(findings, facts, now)
        except Exception as e:  # decoration must never take a pass down; say so, and go on
            log.exception("attribution failed")
            return list(findings) + [Finding(CHECK, Severity.INFO, UNAVAILABLE,
                                             f"Attribution failed: {type(e).__name__}: {str(e)[:200]}.",
                                             device="nodehealth")]

    def metrics(self) -> list[Metric]:
        placed = self._placed
        if not self.cfg["metric_labels"] or placed is None:
            return []
        return [gpu_pod_info(*placed)]

    def _annotate(self, findings: Sequence[Finding], facts: NvmlFacts | None, now: float) -> list[Finding]:
        gpus = gpu_refs(facts)
        max_age = float(self.cfg["max_event_age_seconds"])
        fresh = [f for f in findings if wants_attribution(f) and is_fresh(f, now, max_age) and gpu_of(f, gpus)]
        lookup = Lookup()
        if "kubelet" in self.cfg["sources"] and (fresh or self.cfg["metric_labels"]):
            try:
                lookup = replace(lookup, pods=assign(self.client.list(), gpus))
            except KubeletError as e:
                lookup = replace(lookup, pods=str(e))
            self._placed = (lookup.pods, gpus) if isinstance(lookup.pods, Assignment) else None
        if "slurm" in self.cfg["sources"] and fresh and self.scontrol is not None:
            lookup = self._slurm(lookup, fresh, gpus)
        out = attribute(findings, gpus, lookup, now, max_age)
        with self._lock:
            self._notes = [f for f in out if f.check == CHECK]
            return self._remember(out)

    def _slurm(self, lookup: Lookup, fresh: list[Finding], gpus: tuple[GpuRef, ...]) -> Lookup:
        reader = SlurmJobs(self.host, self.scontrol, int(self.cfg["slurm_max_jobs"]))
        try:
            jobs = assign_jobs(reader.jobs(self.node), gpus)
            pid_jobs = {}
            for f in fresh:
                for pid in f.evidence.get("pids") or []:
                    if isinstance(pid, int) and pid not in pid_jobs:
                        job = reader.job_of_pid(pid, f.last_seen)
                        if job is not None:
                            pid_jobs[pid] = job
        except SlurmLookupError as e:
            return replace(lookup, jobs=str(e))
        return replace(lookup, jobs=jobs, pid_jobs=pid_jobs)

    def _remember(self, findings: list[Finding]) -> list[Finding]:
        """Keep what fresh findings were given; give it back to the same findings once they are not.
        Caller holds the lock."""
        out = []
        for f in findings:
            key = (f.check, f.reason, f.device, f.first_seen)
            found = {k: f.evidence[k] for k in KEPT if k in f.evidence}
            if found:
                self._remembered[key] = found
                self._remembered.move_to_end(key)
            elif key in self._remembered:
                f = replace(f, evidence=dict(f.evidence, **self._remembered[key]))
            out.append(f)
        while len(self._remembered) > MAX_REMEMBERED:
            self._remembered.popitem(last=False)
        return out
