"""Configuration: defaults from every collector, check and feature, a file (YAML or JSON) or a directory of
them, then flags.

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

POLICY_MEANINGS = {  # what each key means, in docs/configuration.md
    "raise_after_passes": "bad passes in a row before a debounced (performance) finding is raised",
    "clear_after_passes": "good passes in a row before a debounced finding clears ...",
    "clear_after_seconds": "... and at least this long since it was last bad",
    "event_hold_seconds": ("how long a counter-increase finding (an InfiniBand link went down once, a non-fatal "
                           "PCIe error) stays after the last increase"),
}

DAEMON_DEFAULTS: dict[str, Any] = {
    "listen": "0.0.0.0:9456",
    "interval_seconds": 30.0,
    "state_dir": "/var/lib/nodehealth",
    "collector_timeout_seconds": 10.0,
    "token_file": "",
}

DAEMON_MEANINGS = {  # what each key means, in docs/configuration.md
    "listen": ("HTTP address of `/metrics`, `/healthz` and `/v1/report` (flag `--listen`). 9456 stays clear of "
               "node_exporter (9100), dcgm-exporter (9400), the OpenTelemetry exporter (9464) and gpud (15132)"),
    "interval_seconds": "seconds between two passes (flag `--interval`); the kernel log is followed between passes",
    "state_dir": ("where the state file (`state.json`) and hang bundles go (flag `--state-dir`, or "
                  "`$NODEHEALTH_STATE_DIR`)"),
    "collector_timeout_seconds": ("a collector still reading after this long is reported stuck (its checks say "
                                  "`unknown`), and is not started again while it stays stuck"),
    "token_file": ("a file holding a bearer token: when set, `/metrics` and `/v1/report` (and the controller's "
                   "`/metrics`) answer only requests that carry it (`Authorization: Bearer`, Prometheus's "
                   "`authorization.credentials_file`), or, with `tls.enabled`, a client certificate of the "
                   "cluster CA; so does `/v1/pingmesh` without `tls.enabled` (the controller sends it). "
                   "`/healthz` stays open. Read again when it changes"),
}


class ConfigError(Exception):
    pass


class UsageError(Exception):
    """The command line asks for what cannot be: an unknown check, a root that is no machine (exit 2)."""


def parts() -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """Every part of the configuration: (its dotted name, its defaults, what each key means), in the
    order docs/configuration.md lists them. defaults() builds the configuration from it, and
    docs/generate.py the reference, so that a key cannot be added to one and not the other."""
    from nodehealth import exporter, registry
    from nodehealth.attribution import defaults as attribution
    from nodehealth.hang import defaults as hang
    from nodehealth.hooks import defaults as hooks
    from nodehealth.kube import defaults as kube
    from nodehealth.netcheck import defaults as netcheck
    from nodehealth.pingmesh import defaults as pingmesh
    from nodehealth.rdma import defaults as rdma_bw
    from nodehealth.silences import defaults as silences
    from nodehealth.slurm import defaults as slurm
    from nodehealth.tls import defaults as tls

    # A collector or check without settings has an empty DEFAULTS and no MEANINGS.
    return [("daemon", DAEMON_DEFAULTS, DAEMON_MEANINGS), ("policy", POLICY_DEFAULTS, POLICY_MEANINGS),
            ("exporter", exporter.DEFAULTS, exporter.MEANINGS),
            *((f"collectors.{m.NAME}", m.DEFAULTS, getattr(m, "MEANINGS", {})) for m in registry.COLLECTORS),
            *((f"checks.{m.NAME}", m.DEFAULTS, getattr(m, "MEANINGS", {})) for m in registry.CHECKS),
            ("kube", kube.DEFAULTS, kube.MEANINGS), ("slurm", slurm.DEFAULTS, slurm.MEANINGS),
            ("hang", hang.DEFAULTS, hang.MEANINGS), ("pingmesh", pingmesh.DEFAULTS, pingmesh.MEANINGS),
            ("rdma_bw", rdma_bw.DEFAULTS, rdma_bw.MEANINGS), ("netcheck", netcheck.DEFAULTS, netcheck.MEANINGS),
            ("attribution", attribution.DEFAULTS, attribution.MEANINGS),
            ("silences", silences.DEFAULTS, silences.MEANINGS), ("hooks", hooks.DEFAULTS, hooks.MEANINGS),
            ("tls", tls.DEFAULTS, tls.MEANINGS)]


def defaults() -> dict[str, Any]:
    cfg: dict[str, Any] = {}
    for name, values, _ in parts():
        *outer, key = name.split(".")
        section = cfg
        for part in outer:
            section = section.setdefault(part, {})
        section[key] = copy.deepcopy(values)
    return cfg


def load(path: str | None) -> dict[str, Any]:
    """Defaults merged with the file at `path`, or with the config files of the directory at `path` in
    name order (mappings key by key; a later file's value or list replaces an earlier one's), validated."""
    cfg = defaults()
    if not path:
        return cfg
    combined: dict[str, Any] = {}
    for name in config_files(path):
        data = _parse(name, _read(name))
        if data is None:
            continue
        try:
            merge(defaults(), data, "")  # each file on its own, so that an error names its file
        except ConfigError as e:
            raise ConfigError(f"{name}: {e}" if name != path else str(e)) from None
        _deep_merge(combined, data)
    merge(cfg, combined, "")
    check_ranges(cfg)
    return cfg


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def config_files(path: str) -> list[str]:
    """`path` itself, or a directory's *.yaml, *.yml and *.json files in name order. Hidden names are
    skipped: a ConfigMap volume keeps its real files under `..data` and shows each as a link beside it."""
    if not os.path.isdir(path):
        return [path]
    try:
        names = sorted(n for n in os.listdir(path) if n.endswith(CONFIG_SUFFIXES) and not n.startswith("."))
    except OSError as e:
        raise ConfigError(f"cannot read config directory {path}: {e.strerror or e}") from None
    if not names:
        raise ConfigError(f"config directory {path}: no *.yaml, *.yml or *.json file in it")
    return [os.path.join(path, n) for n in names]


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(1 << 20)
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror or e}") from None


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
    if not all(isinstance(p, str) and p for p in cfg["exporter"]["exclude_families"]):
        raise ConfigError(f"exporter.exclude_families: family names or patterns, not "
                          f"{cfg['exporter']['exclude_families']!r}")
    kernel_log = cfg["collectors"]["kmsg"]
    if kernel_log["source"] not in ("auto", "kmsg", "journal"):
        raise ConfigError(f"collectors.kmsg.source: must be auto, kmsg or journal, not {kernel_log['source']!r}")
    if not all(isinstance(d, str) and d.startswith("/") for d in kernel_log["journal_directories"]):
        raise ConfigError("collectors.kmsg.journal_directories: absolute paths on the host (read under --root), not "
                          f"{kernel_log['journal_directories']!r}")
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
    for key in ("probe_interval_seconds", "ping_interval_seconds", "timeout_seconds", "max_probes_per_second",
                "fetch_timeout_seconds"):
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
    positive("silences.max_seconds", cfg["silences"]["max_seconds"])
    if not cfg["silences"]["max_silences"] >= 1:
        raise ConfigError(f"silences.max_silences: must be at least 1, not {cfg['silences']['max_silences']!r}")
    _check_rdma_bw(cfg)
    from nodehealth.attribution.defaults import settings as attribution

    try:
        attribution(cfg["attribution"])
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _check_hooks(cfg["hooks"])


def _check_hooks(hooks: dict[str, Any]) -> None:
    """The remediation hook runs what it is told as root: what it is told must be exactly that."""
    command, url = hooks["command"], hooks["url"]
    if command and not (all(isinstance(a, str) and a and "\0" not in a for a in command)
                        and os.path.isabs(command[0])):
        raise ConfigError(f"hooks.command: a list of arguments whose first is an absolute path, not {command!r}")
    if url:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"hooks.url: an http:// or https:// URL with a host, not {url!r}")
    if hooks["enabled"] and not (command or url):
        raise ConfigError("hooks.enabled: set hooks.command or hooks.url (or both): the hook has nothing to run")
    if hooks["min_severity"] not in ("warning", "unknown", "degraded", "fatal"):
        raise ConfigError(f"hooks.min_severity: warning, unknown, degraded or fatal, not {hooks['min_severity']!r}")
    for key in ("timeout_seconds", "max_per_minute"):
        if isinstance(hooks[key], bool) or not hooks[key] > 0:
            raise ConfigError(f"hooks.{key}: must be greater than 0, not {hooks[key]!r}")
    for key in ("max_concurrency", "max_queue"):
        if not hooks[key] >= 1:
            raise ConfigError(f"hooks.{key}: must be at least 1, not {hooks[key]!r}")


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


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value
    return base


def state_dir(cfg: dict[str, Any], flag: str | None) -> str:
    return flag or os.environ.get("NODEHEALTH_STATE_DIR") or cfg["daemon"]["state_dir"]
