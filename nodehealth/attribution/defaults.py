"""The `attribution` section: whose work a GPU fault hit (see the package), off by default, and the
checks of its values, which config.load() runs with the rest."""
from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    # Name the pods and Slurm jobs behind GPU findings: evidence, /v1/report, Events, drain reasons.
    "enabled": False,
    # Where to look: "kubelet" (PodResources) and/or "slurm" (scontrol, through the Slurm face).
    "sources": ["kubelet"],
    # The kubelet's PodResources socket, as the agent sees it (deploy/components/attribution mounts the
    # host's directory read-only at the same path).
    "kubelet_socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
    # One deadline for a whole List or Get call, connecting included.
    "kubelet_timeout_seconds": 5.0,
    # A bigger answer is refused (110 pods with a few devices each is far below 1 MiB).
    "kubelet_max_answer_bytes": 4 << 20,
    # At most this many local jobs are looked up with `scontrol show job -d` per round.
    "slurm_max_jobs": 64,
    # An event finding (an Xid) is attributed only while at most this old: later, the GPU's users may
    # have changed. What was found while it was fresh stays with it. States (a lost GPU) are current.
    "max_event_age_seconds": 300.0,
    # Export nodehealth_gpu_pod_info{gpu,uuid,pci_bus_id,namespace,pod,container}; asks the kubelet
    # every pass.
    "metric_labels": False,
}
SOURCES = ("kubelet", "slurm")
MEANINGS = {
    "enabled": "name the pods and Slurm jobs behind every GPU finding: evidence (`pods`, `slurm_jobs`), the "
               "table, `/v1/report`, an Event on each pod, the Slurm drain reason",
    "sources": "where to look: `kubelet` (its PodResources socket) and/or `slurm` (scontrol; the daemon needs "
               "`--slurm`)",
    "kubelet_socket": "the kubelet's PodResources socket as the agent sees it (`deploy/components/attribution` "
                      "mounts its directory read-only)",
    "kubelet_timeout_seconds": "one deadline for a whole PodResources call, connecting included",
    "kubelet_max_answer_bytes": "a bigger PodResources answer is refused (`AttributionUnavailable`)",
    "slurm_max_jobs": "at most this many local jobs are looked up with `scontrol show job -d` per round",
    "max_event_age_seconds": "an Xid is attributed only while at most this old (later, its GPU's users may have "
                             "changed); what it was given while fresh stays with it",
    "metric_labels": "export `nodehealth_gpu_pod_info` (which container holds which GPU, to join in PromQL); asks "
                     "the kubelet every pass",
}


def settings(cfg: dict[str, Any] | None) -> dict[str, Any]:
    """The defaults with `cfg` over them, checked; ValueError names the bad key."""
    merged = dict(DEFAULTS, **(cfg or {}))
    unknown = sorted(set(merged) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"attribution.{unknown[0]}: unknown setting (known here: {', '.join(sorted(DEFAULTS))})")
    sources = merged["sources"]
    if not isinstance(sources, list) or any(s not in SOURCES for s in sources):
        raise ValueError(f"attribution.sources: {sources!r} is not a list of {' and '.join(SOURCES)}")
    for key in ("kubelet_timeout_seconds", "kubelet_max_answer_bytes", "slurm_max_jobs", "max_event_age_seconds"):
        value = merged[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"attribution.{key}: {value!r} is not a positive number")
    for key in ("enabled", "metric_labels"):
        if not isinstance(merged[key], bool):
            raise ValueError(f"attribution.{key}: {merged[key]!r} is not true or false")
    if not isinstance(merged["kubelet_socket"], str) or not merged["kubelet_socket"].startswith("/"):
        raise ValueError(f"attribution.kubelet_socket: {merged['kubelet_socket']!r} is not an absolute path")
    return merged
