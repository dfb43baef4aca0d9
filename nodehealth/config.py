"""Configuration: defaults from every collector and check, a file (YAML or JSON), then flags.

Validation is strict and its errors say where: an unknown key or a value of the wrong type is a
ConfigError naming the dotted path, never a crash later in a pass.
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any

from nodehealth import registry

POLICY_DEFAULTS: dict[str, Any] = {
    # A performance finding needs this many consecutive bad passes to be raised ...
    "raise_after_passes": 2,
    # ... and this many good passes, and at least this long, to clear.
    "clear_after_passes": 3,
    "clear_after_seconds": 300.0,
    # A counter-increase finding (an IB link went down once, a non-fatal PCIe error) stays this long
    # after the last increase, so that it is seen and alerted on (gpud holds link drops 10 min).
    "event_hold_seconds": 600.0,
}

DAEMON_DEFAULTS: dict[str, Any] = {
    "listen": "0.0.0.0:9456",
    "interval_seconds": 30.0,
    "state_dir": "/var/lib/nodehealth",
    "collector_timeout_seconds": 10.0,
}


# The Kubernetes face (nodehealth/kube.py).
KUBE_DEFAULTS: dict[str, Any] = {
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


# Hang detection for distributed training (nodehealth/hang/detector.py).
HANG_DEFAULTS: dict[str, Any] = {
    "enabled": False,  # the daemon watches `directory` for hung ranks
    # Where training processes publish their records ($NODEHEALTH_HANG_DIR of the ranks).
    "directory": "/run/nodehealth/hang",
    # Where bundles go; empty: <state_dir>/hang in the daemon, DIR/bundles for `hang watch DIR`.
    "bundle_dir": "",
    # A pending op is hung when older than max(floor, factor x its p99); below the PG timeout
    # (10 min NCCL, 30 min gloo) with room for the dumps.
    "floor_seconds": 180.0,
    "p99_factor": 10.0,
    "min_samples": 20,  # fewer completed ops than this: the floor alone decides
    "heartbeat_timeout_seconds": 60.0,
    "stale_record_seconds": 3600.0,  # records whose heartbeat is older than this belong to dead jobs
    "scan_interval_seconds": 1.0,
    "py_spy": "py-spy",
    "stack_timeout_seconds": 10.0,
    "native_stacks": True,
    "native_timeout_seconds": 30.0,
    "parallel_dumps": 8,
    "flight_recorder_timeout_seconds": 15.0,
}


class ConfigError(Exception):
    pass


def defaults() -> dict[str, Any]:
    return {
        "collectors": {m.NAME: copy.deepcopy(m.DEFAULTS) for m in registry.COLLECTORS},
        "checks": {m.NAME: copy.deepcopy(m.DEFAULTS) for m in registry.CHECKS},
        "policy": copy.deepcopy(POLICY_DEFAULTS),
        "daemon": copy.deepcopy(DAEMON_DEFAULTS),
        "kube": copy.deepcopy(KUBE_DEFAULTS),
        "hang": copy.deepcopy(HANG_DEFAULTS),
    }


def load(path: str | None) -> dict[str, Any]:
    """Defaults merged with the file at `path` (if any), validated."""
    cfg = defaults()
    if not path:
        return cfg
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror or e}") from None
    data = _parse(path, text)
    if data is None:
        return cfg
    merge(cfg, data, "")
    check_ranges(cfg)
    return cfg


def check_ranges(cfg: dict[str, Any]) -> None:
    """Values of the right type that would still misbehave at run time."""
    def positive(path: str, value: Any) -> None:
        if not value > 0:
            raise ConfigError(f"{path}: must be greater than 0, not {value!r}")
    daemon = cfg["daemon"]
    positive("daemon.interval_seconds", daemon["interval_seconds"])
    positive("daemon.collector_timeout_seconds", daemon["collector_timeout_seconds"])
    for name, key in (("mounts", "timeout_seconds"), ("nvml", "gpu_timeout_seconds")):
        value = cfg["collectors"][name][key]
        positive(f"collectors.{name}.{key}", value)
        if value >= daemon["collector_timeout_seconds"]:
            raise ConfigError(f"collectors.{name}.{key} ({value:g}) must be below daemon.collector_timeout_seconds "
                              f"({daemon['collector_timeout_seconds']:g}), or the collector times out first")
    for key in ("raise_after_passes", "clear_after_passes"):
        if cfg["policy"][key] < 1:
            raise ConfigError(f"policy.{key}: must be at least 1, not {cfg['policy'][key]!r}")
    for name, rate in cfg["checks"]["infiniband"]["expected_rate_gbps"].items():  # port, device or link layer
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0:
            raise ConfigError(f"checks.infiniband.expected_rate_gbps.{name}: must be a number of Gb/s, not {rate!r}")


def _parse(path: str, text: str) -> Any:
    if path.endswith(".json"):
        try:
            return json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{path}: not valid JSON: {e}") from None
    import yaml  # only paid for when a YAML config is given

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None


def merge(base: dict[str, Any], override: Any, where: str) -> None:
    """Merge `override` into `base` in place, checking keys and types against the defaults."""
    if not isinstance(override, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(override).__name__}")
    for key, value in override.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in base:
            known = ", ".join(sorted(map(str, base))) or "(none)"
            raise ConfigError(f"{path}: unknown setting (known here: {known})")
        current = base[key]
        if isinstance(current, dict) and not _is_free_mapping(current):
            merge(current, value, path)
        else:
            base[key] = _coerce(path, current, value)


def _is_free_mapping(value: dict[str, Any]) -> bool:
    """Mappings whose keys are data (e.g. per-code overrides), not settings; empty by default."""
    return not value


def _coerce(path: str, current: Any, value: Any) -> Any:
    if current is None:
        return value
    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(current, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(current, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(current, str):
        if isinstance(value, str):
            return value
    elif isinstance(current, list):
        if isinstance(value, list):
            return value
    elif isinstance(current, dict):
        if isinstance(value, dict):
            return value
    raise ConfigError(f"{path}: expected {type(current).__name__}, got {type(value).__name__} ({value!r})")


def state_dir(cfg: dict[str, Any], flag: str | None) -> str:
    return flag or os.environ.get("NODEHEALTH_STATE_DIR") or cfg["daemon"]["state_dir"]
