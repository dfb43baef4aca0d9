"""Attribution added to GPU findings: `evidence["pods"]` and `evidence["slurm_jobs"]`, pure.

Absent is not empty: `"pods": []` means the kubelet was asked and no container held that GPU; no
`pods` key means nobody knows (not asked, no answer, or device ids that could not be placed). An event
finding (an Xid) is attributed only while it is fresh: the GPU's users may have changed since an old
event. When a source fails, one `info` finding says attribution is unavailable and why. It is `info`
on purpose: attribution decorates a verdict, it is no part of one, so it must never make a node
unhealthy, nor `unknown` (which would fail `check` with exit code 2 and mark the node in Kubernetes).
`pods_inferred: true` says the GPU's holders were found by elimination (gpus.assign): NVML gave no UUID
for it, as for a GPU that fell off the bus.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Union

from nodehealth.attribution.gpus import Assignment, GpuRef, PodRef, gpu_of
from nodehealth.attribution.slurm_jobs import JobAssignment
from nodehealth.model import Action, Finding, Reason, Severity

CHECK = "attribution"
UNAVAILABLE = "AttributionUnavailable"
# Its one finding, under the check name `attribution` (docs/checks.md).
REASONS = {
    UNAVAILABLE: Reason(Severity.INFO, Action.NONE,
                        "the pods or Slurm jobs that used a faulty GPU could not be told, or not all of them: the "
                        "kubelet or Slurm did not answer, or named GPUs this node does not have"),
}
MAX_SHOWN = 5  # unresolved ids named in a message

# A source's answer: the assignment, an error sentence, or None when it was not asked.
Answer = Union[Assignment, JobAssignment, str, None]

_MIG_LEGACY_GI = re.compile(r"MIG-GPU-[0-9a-fA-F-]{36}/(\d{1,3})/\d{1,3}")


@dataclass(frozen=True)
class Lookup:
    """What one lookup round found."""

    pods: Assignment | str | None = None
    jobs: JobAssignment | str | None = None
    pid_jobs: dict[int, str] = field(default_factory=dict)  # an Xid's pid -> its Slurm job


def wants_attribution(finding: Finding) -> bool:
    """A problem someone's work may have hit: warning and worse (not info, not unknown)."""
    return finding.severity in (Severity.WARNING, Severity.DEGRADED, Severity.FATAL)


def is_fresh(finding: Finding, now: float, max_age: float) -> bool:
    """A state (no time of its own) is always current; an event only while younger than max_age."""
    return finding.last_seen is None or now - finding.last_seen <= max_age


def attribute(findings: Sequence[Finding], gpus: Sequence[GpuRef], lookup: Lookup, now: float,
              max_age: float) -> list[Finding]:
    """The findings with their GPUs' holders in the evidence, plus one info finding per failed source."""
    out: list[Finding] = []
    needed: dict[str, list[str]] = {"kubelet": [], "slurm": []}  # source -> GPUs it could not place
    for f in findings:
        gpu = gpu_of(f, gpus) if wants_attribution(f) else None
        if gpu is None or not is_fresh(f, now, max_age):
            out.append(f)
            continue
        evidence = dict(f.evidence)
        label = gpu.bus_id or gpu.uuid or f"GPU {gpu.index}"
        if isinstance(lookup.pods, Assignment):
            pods = [p for p in lookup.pods.by_gpu.get(gpu.index, ()) if _on_instances(p, gpu, f)]
            if pods or not lookup.pods.unresolved:
                evidence["pods"] = [p.to_dict() for p in pods]
            if gpu.index in lookup.pods.inferred:
                evidence["pods_inferred"] = True  # NVML had no UUID for this GPU: placed by elimination
        if lookup.pods is not None and (isinstance(lookup.pods, str) or lookup.pods.unresolved):
            needed["kubelet"].append(label)
        jobs = _jobs(f, gpu, lookup)
        if jobs is not None:
            evidence["slurm_jobs"] = jobs
        if lookup.jobs is not None and (isinstance(lookup.jobs, str) or lookup.jobs.unresolved):
            needed["slurm"].append(label)
        out.append(replace(f, evidence=evidence))
    for source, answer in (("kubelet", lookup.pods), ("slurm", lookup.jobs)):
        if needed[source]:
            out.append(unavailable(source, answer, sorted(set(needed[source]))))
    return out


def _on_instances(pod: PodRef, gpu: GpuRef, finding: Finding) -> bool:
    """A finding that names GPU instances (an Xid on a MIG GPU) concerns only the MIG devices in them;
    a device whose instance is not known is kept: better one Event too many than a hit job untold."""
    instances = finding.evidence.get("gpu_instances") or []
    if not instances:
        return True
    legacy = _MIG_LEGACY_GI.fullmatch(pod.device.split("::")[0])
    gi = int(legacy.group(1)) if legacy else next(
        (m.gpu_instance for m in gpu.migs if m.uuid.lower() == pod.device.split("::")[0].lower()), None)
    return gi is None or gi in instances


def _jobs(f: Finding, gpu: GpuRef, lookup: Lookup) -> list[dict[str, Any]] | None:
    by_id: dict[str, dict[str, Any]] = {}
    if isinstance(lookup.jobs, JobAssignment):
        for job in lookup.jobs.by_gpu.get(gpu.index, ()):
            by_id[job.job_id] = dict(job.to_dict(), via=["gres"])
    for pid in f.evidence.get("pids") or []:
        job_id = lookup.pid_jobs.get(pid) if isinstance(pid, int) else None
        if job_id is not None:
            entry = by_id.setdefault(job_id, {"job_id": job_id, "user": None, "via": []})
            if "pid" not in entry["via"]:
                entry["via"].append("pid")
    asked = isinstance(lookup.jobs, JobAssignment) and not lookup.jobs.unresolved
    if not by_id and not asked:
        return None
    return [by_id[k] for k in sorted(by_id, key=lambda j: (len(j), j))]


def unavailable(source: str, answer: Answer, gpus: list[str]) -> Finding:
    """The info finding that says whose work a GPU fault hit could not be told (fully), and why."""
    whose = "pods" if source == "kubelet" else "Slurm jobs"
    if isinstance(answer, str):
        message = f"Which {whose} used GPU {', '.join(gpus)} is not known: {answer}."
        evidence: dict[str, Any] = {"error": answer}
    else:
        missing = list(answer.unresolved) if answer is not None else []
        shown = ", ".join(missing[:MAX_SHOWN]) + (f" and {len(missing) - MAX_SHOWN} more" if len(missing) > MAX_SHOWN
                                                   else "")
        what = "device ids" if source == "kubelet" else "GPU numbers"
        message = (f"The {whose} named for GPU {', '.join(gpus)} may not be all of them: the {source} names {what} "
                   f"no GPU of this node matches ({shown}).")
        evidence = {"unresolved": missing[:50]}
    return Finding(CHECK, Severity.INFO, UNAVAILABLE, message, device=source,
                   evidence=dict(evidence, source=source, gpus=gpus))
