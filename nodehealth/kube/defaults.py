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
