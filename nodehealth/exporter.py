"""Prometheus exposition of a report: the only module that imports prometheus_client.

Families are emitted sorted by name and samples sorted by labels, so the text of a fixture
machine is byte-for-byte stable (golden files). A private registry, never the default one.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Callable

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest

from nodehealth import __version__
from nodehealth.model import Metric, Report, Severity

log = logging.getLogger(__name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def core_metrics(report: Report) -> list[Metric]:
    """The families that are always present, whatever the host has."""
    status = Metric("nodehealth_health_status",
                    "Node verdict: 0 healthy, 1 unhealthy (a degraded or fatal finding), 2 unknown (could not judge).")
    status.add((), report.status.code)
    build = Metric("nodehealth_build_info", "The nodehealth version; always 1.", labels=("version",))
    build.add((__version__,), 1)
    success = Metric("nodehealth_collector_success",
                     "1 if the collector's last run succeeded, 0 if it failed or is unsupported on this host.",
                     labels=("collector",))
    supported = Metric("nodehealth_collector_supported",
                       "1 if the collector's source exists on this host, 0 if not (e.g. no InfiniBand devices).",
                       labels=("collector",))
    duration = Metric("nodehealth_collector_duration_seconds", "How long the collector's last run took.",
                      labels=("collector",))
    for c in report.collectors:
        success.add((c.name,), 1 if c.success else 0)
        supported.add((c.name,), 1 if c.supported else 0)
        if c.supported:
            duration.add((c.name,), c.duration_seconds)
    finding = Metric("nodehealth_finding",
                     "1 for each current finding; the labels say which check found what on which device.",
                     labels=("check", "severity", "reason", "device"))
    for f in report.findings:
        finding.add((f.check, f.severity.value, f.reason, f.device), 1)
    counts = Metric("nodehealth_findings", "Number of current findings by severity.", labels=("severity",))
    for sev in Severity:
        if sev is not Severity.OK:
            counts.add((sev.value,), sum(1 for f in report.findings if f.severity is sev))
    return [status, build, success, supported, duration, finding, counts]


def report_metrics(report: Report, modules: Sequence[Any]) -> list[Metric]:
    """Core families plus every successful collector's own families."""
    out = core_metrics(report)
    by_name = {c.name: c for c in report.collectors}
    for module in modules:
        result = by_name.get(module.NAME)
        if result is None or not result.success:
            continue
        try:
            out.extend(module.metrics(result.facts))
        except Exception:  # one collector's bad facts must not take /metrics down
            log.exception("collector %s could not describe its metrics", module.NAME)
    return out


class _Families:
    """A prometheus_client collector over a callable that returns our Metric list."""

    def __init__(self, source: Callable[[], Iterable[Metric]]):
        self.source = source

    def collect(self):
        seen = set()
        for m in sorted(self.source(), key=lambda m: m.name):
            if m.name in seen:
                log.error("metric family %s emitted twice; keeping the first", m.name)
                continue
            seen.add(m.name)
            if m.kind == "counter":
                family = CounterMetricFamily(m.name, m.help, labels=m.labels)
            else:
                family = GaugeMetricFamily(m.name, m.help, labels=m.labels)
            for labels, value in sorted(m.samples):
                family.add_metric(list(labels), value)
            yield family


def registry_for(source: Callable[[], Iterable[Metric]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(source))
    return registry


def render(metrics: Iterable[Metric]) -> bytes:
    """Exposition text of a fixed list of families (used for golden files and one-shot output)."""
    items = list(metrics)
    return generate_latest(registry_for(lambda: items))
