"""Collectors: one module per source. They read and parse; they never judge.

A collector is a module that conforms to Collector below (its globals are the members). Optional,
where the collector has them:
    counters(facts) -> dict[str, float]         monotonic counters the engine turns into per-second
                                                rates for checks
    rate_metrics(facts, rates) -> list[Metric]  families of those rates (bandwidth), from the second
                                                pass on (a rate needs two samples)
    deadline(cfg, timeout) -> float | None      its own deadline instead of the engine's (a saved
                                                kernel log of a million lines is finite work: none)
Two modules here are not polled and only describe what the daemon gathers between passes:
rdma_bw (its bandwidth tests) and pingmesh (the controller's verdicts); they have NAME and metrics.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from nodehealth.host import HostPaths
    from nodehealth.model import Metric


class CollectError(Exception):
    """The source exists but could not be read or parsed; the message says which file and why."""


def require_sysfs(host: HostPaths) -> None:
    """CollectError when a live host's sysfs is not mounted where the collector reads it. The
    collectors of /sys call it in collect() and say supported in supported() meanwhile: on a live
    host the devices are there, only not seen, so their checks say unknown instead of being skipped."""
    missing = host.sysfs_missing()
    if missing is not None:
        raise CollectError(missing)


@runtime_checkable
class Collector(Protocol):
    NAME: str  # the collector's name (metric label, --only/--skip)
    DEFAULTS: dict[str, Any]  # its settings (config section collectors.<NAME>)

    def supported(self, host: HostPaths, cfg: dict[str, Any]) -> str | None:
        """None when its source is on this host, else the reason it is not."""

    def collect(self, host: HostPaths, cfg: dict[str, Any]) -> Any:
        """Frozen dataclasses; an absent file is None, never 0. Raises CollectError (or OSError)
        with a clear message when the source exists but cannot be read or parsed."""

    def metrics(self, facts: Any) -> list[Metric]:
        """How the facts become metric families."""
