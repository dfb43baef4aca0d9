"""The core/v1 Events the agent posts, about its own Node or about a Pod a GPU fault hit: one builder,
so every Event carries what deploy/components/attribution's admission policy checks (the reporting
node in `source.host` and `reportingInstance`, a Pod Event in the Pod's namespace). Pure.

A Pod Event carries no uid: the kubelet's PodResources answer has none, and reading Pods is not
granted. `kubectl events --for pod/NAME` and `kubectl get events` show it; `kubectl describe pod`
lists only Events that carry the Pod's uid, so it does not.
"""
from __future__ import annotations

import random
import time
from typing import Any

from nodehealth.kube.api import now_rfc3339

MAX_MESSAGE_CHARS = 1024  # events.k8s.io/v1 caps a note at 1 kB; core/v1 readers truncate about there


def node_event(node: str, uid: str, namespace: str, type_: str, reason: str, message: str,
               now: float | None = None) -> dict[str, Any]:
    """An Event about this node's own Node, in `namespace` (where the kubelet records node events)."""
    return _event(node, {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}, namespace, type_, reason,
                  message, now)


def pod_event(node: str, namespace: str, pod: str, type_: str, reason: str, message: str,
              now: float | None = None) -> dict[str, Any]:
    """An Event about a Pod on this node, in the Pod's own namespace, reported by this node's agent."""
    return _event(node, {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod}, namespace, type_,
                  reason, message, now)


def _event(node: str, involved: dict[str, str], namespace: str, type_: str, reason: str, message: str,
           now: float | None) -> dict[str, Any]:
    now = time.time() if now is None else now
    stamp = now_rfc3339(now)
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS - 3] + "..."
    return {
        "apiVersion": "v1", "kind": "Event",
        # Unique per post: an Event is created, never patched (the agent may only create Events).
        "metadata": {"name": f"{involved['name'][:200]}.{int(now * 1e9):x}{random.getrandbits(16):04x}",
                     "namespace": namespace},
        "involvedObject": involved,
        "reason": reason, "message": message, "type": type_,
        "source": {"component": "nodehealth", "host": node},
        "reportingComponent": "nodehealth", "reportingInstance": node,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }
