"""Configuration: defaults from every collector, check and feature, a file (YAML or JSON), then flags.

Validation is strict and its errors say where: an unknown key or a value of the wrong type is a
ConfigError naming the dotted path, never a crash later in a pass. Each feature keeps its section's
defaults in its own package (nodehealth/<feature>/defaults.py); they, and the registry of collectors
and checks, are imported when defaults() is first called, so importing this module costs nothing.
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any

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


class ConfigError(Exception):
    pass


class UsageError(Exception):
    """The command line asks for what cannot be: an unknown check, a root that is no machine (exit 2)."""


def defaults() -> dict[str, Any]:
    from nodehealth import registry
    from nodehealth.hang.defaults import DEFAULTS as HANG
    from nodehealth.kube.defaults import DEFAULTS as KUBE
    from nodehealth.netcheck.defaults import DEFAULTS as NETCHECK
    from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH
    from nodehealth.rdma.defaults import DEFAULTS as RDMA_BW
    from nodehealth.slurm.defaults import DEFAULTS as SLURM

    return {
        "collectors": {m.NAME: copy.deepcopy(m.DEFAULTS) for m in registry.COLLECTORS},
        "checks": {m.NAME: copy.deepcopy(m.DEFAULTS) for m in registry.CHECKS},
        "policy": copy.deepcopy(POLICY_DEFAULTS),
        "daemon": copy.deepcopy(DAEMON_DEFAULTS),
        "kube": copy.deepcopy(KUBE),
        "hang": copy.deepcopy(HANG),
        "pingmesh": copy.deepcopy(PINGMESH),
        "slurm": copy.deepcopy(SLURM),
        "rdma_bw": copy.deepcopy(RDMA_BW),
        "netcheck": copy.deepcopy(NETCHECK),
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
    # The host-fault checks: a window of 0 would count nothing, a limit below 1 would fire on no error.
    for name in ("memory_errors", "crashes", "storage_errors", "nic_health"):
        positive(f"checks.{name}.window_seconds", cfg["checks"][name]["window_seconds"])
    for name, key in (("memory_errors", "corrected_limit"), ("memory_errors", "throttle_repeat"),
                      ("crashes", "rcu_stall_repeat"), ("nic_health", "unregister_repeat"),
                      ("nic_health", "watchdog_repeat"), ("edac", "corrected_limit")):
        if not cfg["checks"][name][key] >= 1:
            raise ConfigError(f"checks.{name}.{key}: must be at least 1, not {cfg['checks'][name][key]!r}")
    for key in ("timeout_seconds", "retry_delay_seconds", "resync_seconds"):
        positive(f"slurm.{key}", cfg["slurm"][key])
    for key, least in (("attempts", 1), ("reason_max_chars", 20)):
        if not cfg["slurm"][key] >= least:
            raise ConfigError(f"slurm.{key}: must be at least {least}, not {cfg['slurm'][key]!r}")
    pm = cfg["pingmesh"]
    # A probe may outlive the interval (timeout_seconds >= probe_interval_seconds): it is not refused.
    for key in ("probe_interval_seconds", "timeout_seconds", "max_probes_per_second", "fetch_timeout_seconds"):
        positive(f"pingmesh.{key}", pm[key])
    for key in ("window_seconds", "windows_kept", "max_concurrency", "fetch_concurrency"):
        if not pm[key] >= 1:
            raise ConfigError(f"pingmesh.{key}: must be at least 1, not {pm[key]!r}")
    least = pm["analysis"]["open_windows"] + pm["analysis"]["close_windows"] + 1
    if pm["fetch_windows"] < least:
        raise ConfigError(f"pingmesh.fetch_windows ({pm['fetch_windows']}) must be at least "
                          f"pingmesh.analysis.open_windows + close_windows + 1 ({least}): the analysis keeps no state, "
                          "so it needs that many closed windows from each agent, and the newest one is still open")
    an = pm["analysis"]
    for key in ("loss_fraction", "node_loss_fraction", "significance", "node_bad_peer_fraction", "leaf_fraction"):
        if not 0 < an[key] <= 1:
            raise ConfigError(f"pingmesh.analysis.{key}: must be a fraction in (0, 1], not {an[key]!r}")
    for key in ("min_probes", "min_bad_probes", "open_windows", "close_windows", "min_reporters", "max_windows"):
        if not an[key] >= 1:
            raise ConfigError(f"pingmesh.analysis.{key}: must be at least 1, not {an[key]!r}")
    if not an["tolerated_liars"] >= 0:
        raise ConfigError(f"pingmesh.analysis.tolerated_liars: must be at least 0, not {an['tolerated_liars']!r}")
    positive("pingmesh.analysis.p99_factor", an["p99_factor"])
    positive("pingmesh.analysis.p99_floor_seconds", an["p99_floor_seconds"])
    nc = cfg["netcheck"]
    for key in ("seconds", "wait_seconds", "kube_poll_seconds"):
        positive(f"netcheck.{key}", nc[key])
    if not 0 < nc["slow_fraction"] <= 1:
        raise ConfigError(f"netcheck.slow_fraction: must be a fraction in (0, 1], not {nc['slow_fraction']!r}")
    if nc["method"] not in ("auto", "tcp", "rdma"):
        raise ConfigError(f"netcheck.method: must be auto, tcp or rdma, not {nc['method']!r}")
    for key in ("port", "rdma_port"):
        if not 0 < nc[key] < 65536:
            raise ConfigError(f"netcheck.{key}: must be a TCP port, not {nc[key]!r}")
    for key in ("max_rounds", "rdma_size"):
        if not nc[key] >= 1:
            raise ConfigError(f"netcheck.{key}: must be at least 1, not {nc[key]!r}")
    if pm["inventory_configmap"] == pm["configmap"]:
        raise ConfigError("pingmesh.inventory_configmap: must not be pingmesh.configmap (each write would drop "
                          "the other's data)")
    _check_rdma_bw(cfg)


def _check_rdma_bw(cfg: dict[str, Any]) -> None:
    from nodehealth.rdma.defaults import MAX_DURATION_SECONDS, MAX_PEERS, MAX_SERVE_TO

    rb, judged = cfg["rdma_bw"], cfg["checks"]["rdma_bw"]
    if not 0 < rb["duration_seconds"] <= MAX_DURATION_SECONDS:
        raise ConfigError(f"rdma_bw.duration_seconds: must be in (0, {MAX_DURATION_SECONDS:g}], "
                          f"not {rb['duration_seconds']!r}")
    if not rb["interval_seconds"] > rb["duration_seconds"] * 2:
        raise ConfigError(f"rdma_bw.interval_seconds ({rb['interval_seconds']:g}) must be more than twice "
                          f"rdma_bw.duration_seconds ({rb['duration_seconds']:g}): the tests would never rest")
    if not rb["timeout_seconds"] > 0:
        raise ConfigError(f"rdma_bw.timeout_seconds: must be greater than 0, not {rb['timeout_seconds']!r}")
    if not rb["start_delay_seconds"] >= 0:
        raise ConfigError(f"rdma_bw.start_delay_seconds: must be at least 0, not {rb['start_delay_seconds']!r}")
    if not 1 <= rb["size"] <= 1 << 30:
        raise ConfigError(f"rdma_bw.size: must be 1 B to 1 GiB, not {rb['size']!r}")
    if not 1 <= rb["port"] <= 65535 - max(len(rb["rails"]), 16):
        raise ConfigError(f"rdma_bw.port: must leave room for one port per rail, not {rb['port']!r}")
    if not rb["history"] >= max(judged["low_runs"], 1):
        raise ConfigError(f"rdma_bw.history ({rb['history']!r}) must be at least checks.rdma_bw.low_runs "
                          f"({judged['low_runs']!r})")
    if len(rb["peers"]) > MAX_PEERS or not all(isinstance(p, str) and p for p in rb["peers"]):
        raise ConfigError(f"rdma_bw.peers: at most {MAX_PEERS} non-empty names or addresses")
    if len(rb["serve_to"]) > MAX_SERVE_TO or not all(isinstance(p, str) and p for p in rb["serve_to"]):
        raise ConfigError(f"rdma_bw.serve_to: at most {MAX_SERVE_TO} non-empty names, addresses or "
                          "networks")
    for rail in rb["rails"]:
        device, _, port = rail.partition(":") if isinstance(rail, str) else ("", "", "")
        if not device or (port and not port.isdigit()):
            raise ConfigError(f"rdma_bw.rails: {rail!r} is not 'device' or 'device:port'")
    if not 0 < judged["min_fraction"] <= 1:
        raise ConfigError(f"checks.rdma_bw.min_fraction: must be a fraction in (0, 1], not {judged['min_fraction']!r}")
    for key in ("low_runs", "fatal_after_peers"):
        if not judged[key] >= 1:
            raise ConfigError(f"checks.rdma_bw.{key}: must be at least 1, not {judged[key]!r}")
    for name, rate in judged["expected_gbps"].items():
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0:
            raise ConfigError(f"checks.rdma_bw.expected_gbps.{name}: must be a number of Gb/s, not {rate!r}")


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
