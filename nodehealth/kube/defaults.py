"""The `kube` section: the Kubernetes face's settings and their defaults (documented in the README)."""
from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "domain": "nodehealth.io/",
    "kubeconfig": "",  # empty: in-cluster config, else ~/.kube/config
    "dry_run": False,
    # Subsystems whose fatal findings evict untolerated pods (NoExecute) instead of NoSchedule.
    # NoExecute deletes pods without honouring PodDisruptionBudgets: leave draining to a remediator.
    "noexecute_subsystems": [],
    "heartbeat_seconds": 300.0,  # conditions' lastHeartbeatTime refresh (node-problem-detector: 5 min)
    "resync_seconds": 60.0,  # re-read the node: hold/clear annotations, taints someone removed
    "request_timeout_seconds": 10.0,
    "retry_initial_seconds": 1.0,
    "retry_max_seconds": 300.0,
    "conflict_retries": 5,  # 409s answered at once by a fresh read, before backing off
    "event_namespace": "default",  # where the kubelet records node events
    "breaker_enabled": True,
    "breaker_namespace": "nodehealth",
    "breaker_name": "nodehealth-quarantine",
    "max_quarantined_fraction": 0.1,  # of the managed nodes; the cap is at least 1 node
    "managed_node_selector": "nvidia.com/gpu.present=true",
    "managed_nodes_refresh_seconds": 300.0,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "enabled": "publish the verdict on this node's Node object (flag `--kube`)",
    "domain": ("prefix of every taint, annotation and label nodehealth writes or reads; change the admission policy "
               "with it"),
    "kubeconfig": "kubeconfig file; empty: the in-cluster config, else `~/.kube/config`",
    "dry_run": ("compute and export what would be written (`nodehealth_kube_taint_desired`), write nothing (flag "
                "`--dry-run`)"),
    "noexecute_subsystems": ("subsystems whose fatal findings taint `NoExecute` (evicting pods without honouring "
                             "PodDisruptionBudgets) instead of `NoSchedule`"),
    "heartbeat_seconds": "conditions' `lastHeartbeatTime` is refreshed this often",
    "resync_seconds": "the Node is read again this often (hold and clear annotations, taints someone removed)",
    "request_timeout_seconds": "one API request",
    "retry_initial_seconds": "first backoff after a failed write",
    "retry_max_seconds": "longest backoff",
    "conflict_retries": "409 Conflicts answered at once by a fresh read, before backing off",
    "event_namespace": "namespace of the Node's Events (where the kubelet records them)",
    "breaker_enabled": "cap the nodes quarantined at once with the circuit breaker",
    "breaker_namespace": "namespace of the breaker's Lease",
    "breaker_name": "name of the breaker's Lease",
    "max_quarantined_fraction": ("share of the managed nodes that may carry a `NoSchedule`/`NoExecute` taint from "
                                 "nodehealth at once (at least 1 node)"),
    "managed_node_selector": ("label selector of the nodes the cap is a share of (keep it the same as the "
                              "DaemonSet's `nodeSelector`)"),
    "managed_nodes_refresh_seconds": "the managed nodes are counted this often",
}
