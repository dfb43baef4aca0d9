"""Loaded kernel modules from /proc/modules."""
from __future__ import annotations

import os
from dataclasses import dataclass

from nodehealth.collectors import CollectError
from nodehealth.host import HostPaths, read_text
from nodehealth.model import Metric

NAME = "modules"
DEFAULTS: dict = {}

# Modules whose presence matters to a GPU/RDMA node; exported one series each (a bounded label set).
WATCHED = (
    "gdrdrv", "ib_core", "ib_uverbs", "mlx5_core", "mlx5_ib", "nv_peer_mem", "nvidia", "nvidia_drm",
    "nvidia_fs", "nvidia_modeset", "nvidia_peermem", "nvidia_uvm", "rdma_ucm",
)


@dataclass(frozen=True)
class Modules:
    loaded: frozenset[str]


def supported(host: HostPaths, cfg: dict):
    if not os.path.exists(host.proc("modules")):
        return "no /proc/modules (a kernel built without loadable modules, or a sandbox)"
    return None


def parse(text: str) -> Modules:
    """`name size refcount deps state address` per line; only the name matters here."""
    names = set()
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 3 or not fields[1].isdigit():
            raise CollectError(f"/proc/modules line {number} is not 'name size refcount ...': {line[:80]!r}")
        names.add(fields[0])
    return Modules(frozenset(names))


def collect(host: HostPaths, cfg: dict) -> Modules:
    return parse(read_text(host.proc("modules")))


def metrics(facts: Modules) -> list[Metric]:
    m = Metric("nodehealth_kernel_module_loaded",
               "1 if the kernel module is loaded, 0 if not (watched modules only).", labels=("module",))
    for name in WATCHED:
        m.add((name,), 1 if name in facts.loaded else 0)
    return [m]
