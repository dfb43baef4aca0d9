"""What the faces show of an attribution: what each affected pod is told (the Kubernetes publisher posts
it as an Event, nodehealth/kube/events.py), the job ids a Slurm drain reason carries, the pods and jobs
line of the table, and the optional GPU-to-pod info metric. Pure: the faces post and write them."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nodehealth.attribution.evidence import wants_attribution
from nodehealth.attribution.gpus import Assignment, GpuRef, gpu_of
from nodehealth.model import Finding, Metric

DRAIN_JOBS_SHOWN = 5


@dataclass(frozen=True)
class PodNotice:
    """One Event for one pod about one finding; `key` is the same every pass, so it is posted once."""

    namespace: str
    pod: str
    reason: str
    message: str
    type: str
    key: tuple[Any, ...]


def pod_notices(findings: Sequence[Finding], gpus: Sequence[GpuRef]) -> list[PodNotice]:
    """An Event for every pod named in a GPU finding's evidence: what happened on which GPU it used."""
    out = []
    for f in findings:
        gpu = gpu_of(f, gpus) if wants_attribution(f) else None
        if gpu is None:
            continue
        by_pod: dict[tuple[str, str], list[str]] = {}
        for p in f.evidence.get("pods") or []:
            held = f"container {p['container']}" + (f", MIG device {p['device']}" if p["device"].upper().startswith(
                "MIG-") else "")
            by_pod.setdefault((p["namespace"], p["pod"]), []).append(held)
        code = f.evidence.get("code")
        what = f"Xid {code}" if f.check == "xid" and isinstance(code, int) else f.reason
        where = f"GPU {gpu.bus_id or gpu.index}" + (f" ({gpu.uuid})" if gpu.uuid else "")
        for (namespace, pod), held in sorted(by_pod.items()):
            message = f"{what} on {where} that this pod was using ({'; '.join(held)}): {f.message}"
            out.append(PodNotice(namespace, pod, f.reason, message, "Warning",
                                 (namespace, pod, f.check, f.reason, f.device, f.first_seen)))
    return out


def drain_detail(finding: Finding) -> str:
    """`job 42` or `jobs 41,42` (the first few, then +N) for a Slurm drain reason; "" when none is known."""
    ids = [str(j.get("job_id")) for j in finding.evidence.get("slurm_jobs") or [] if isinstance(j, dict)]
    if not ids:
        return ""
    more = len(ids) - DRAIN_JOBS_SHOWN
    shown = ",".join(ids[:DRAIN_JOBS_SHOWN]) + (f"+{more}" if more > 0 else "")
    return f"{'job' if len(ids) == 1 else 'jobs'} {shown}"


def holders(finding: Finding) -> str:
    """`pod research/llm-pretrain-worker-3; job 42`: whose work the finding hit, for the table; "" when
    none is known."""
    pods = sorted({f"{p.get('namespace')}/{p.get('pod')}" for p in finding.evidence.get("pods") or []
                   if isinstance(p, dict)})
    parts = [f"{'pod' if len(pods) == 1 else 'pods'} {', '.join(pods[:DRAIN_JOBS_SHOWN])}"
             + (f" and {len(pods) - DRAIN_JOBS_SHOWN} more" if len(pods) > DRAIN_JOBS_SHOWN else "")] if pods else []
    jobs = drain_detail(finding)
    return "; ".join(parts + ([jobs] if jobs else []))


def gpu_pod_info(pods: Assignment, gpus: Sequence[GpuRef]) -> Metric:
    """1 per GPU and container holding it, to join on `uuid` or `gpu` in PromQL (`* on(uuid)
    group_left(namespace, pod, container)`): the per-GPU series keep their few, stable labels."""
    m = Metric("nodehealth_gpu_pod_info",
               "1 for each GPU and the container the kubelet gave it to (attribution.metric_labels).",
               labels=("gpu", "uuid", "pci_bus_id", "namespace", "pod", "container"))
    by_index = {g.index: g for g in gpus}
    for index, refs in pods.by_gpu.items():
        gpu = by_index[index]
        for p in {(p.namespace, p.pod, p.container) for p in refs}:
            m.add((index, gpu.uuid or "", gpu.bus_id or "", *p), 1)
    return m
