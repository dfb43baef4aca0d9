"""Prometheus exposition of a report: which families a report becomes, and their text; the daemon's
/metrics face (Exporter), which writes out the latest report's families for the scrapes; and the
families an operator leaves out or folds (the `exporter` settings), so that a large node's series stay affordable."""
from __future__ import annotations

import fnmatch
import itertools
import logging
import math
import operator
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from nodehealth import __version__
from nodehealth.model import Metric, Report, Severity

log = logging.getLogger(__name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

DEFAULTS: dict[str, Any] = {
    # Families left out of /metrics: names or shell-style patterns (`nodehealth_infiniband_port_*_packets_total`).
    # benchmarks/RESULTS.md lists the series of every family on each fixture machine.
    "exclude_families": [],
    "detail": {
        # false: every nodehealth_gpu_nvlink_* family per GPU, summed over its links (the `link` label goes):
        # 8 series a family on an 8-GPU H100 node instead of 144 (18 links each).
        "nvlink_per_link": True,
    },
}
MEANINGS = {  # what each key means, in docs/configuration.md
    "exclude_families": "metric families left out of `/metrics`: names, or shell-style patterns such as "
                        "`nodehealth_infiniband_port_hw_events_total` or `nodehealth_infiniband_port_*_packets_total`. "
                        "Keep the families the alert rules and dashboards use (`nodehealth_finding`, "
                        "`nodehealth_health_status`, ...)",
    "detail.nvlink_per_link": "`false`: each `nodehealth_gpu_nvlink_*` family per GPU, summed over its links (no "
                              "`link` label): 8 series a family on an 8-GPU H100 node instead of 144. "
                              "`nodehealth_gpu_nvlink_active` then counts the GPU's links that are up",
}
NVLINK_FAMILIES = "nodehealth_gpu_nvlink_"


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
    # A silenced finding moves to a family of its own (and out of the counts): every rule and dashboard on
    # nodehealth_finding stops counting it, and the series of the others stay as they were.
    silenced = Metric("nodehealth_finding_silenced",
                      "1 for each current finding an operator's silence covers: still found, but no taint, drain, "
                      "alert or hook.", labels=("check", "severity", "reason", "device"))
    for f in report.findings:
        (finding if f.silenced is None else silenced).add((f.check, f.severity.value, f.reason, f.device), 1)
    counts = Metric("nodehealth_findings", "Number of current findings by severity.", labels=("severity",))
    for sev in Severity:
        if sev is not Severity.OK:
            counts.add((sev.value,), sum(1 for f in report.findings if f.severity is sev and f.silenced is None))
    return [status, build, success, supported, duration, finding, silenced, counts]


def report_metrics(report: Report, modules: Sequence[Any],
                   rates: dict[str, dict[str, float]] | None = None) -> list[Metric]:
    """Core families plus every successful collector's own families, and the families of its
    counters' per-second rates where the engine has them (`rates`, by collector)."""
    out = core_metrics(report)
    by_name = {c.name: c for c in report.collectors}
    for module in modules:
        result = by_name.get(module.NAME)
        if result is None or not result.success:
            continue
        try:
            out.extend(module.metrics(result.facts))
            rate_metrics = getattr(module, "rate_metrics", None)
            if rate_metrics is not None and rates and module.NAME in rates:
                out.extend(rate_metrics(result.facts, rates[module.NAME]))
        except Exception:  # one collector's bad facts must not take /metrics down
            log.exception("collector %s could not describe its metrics", module.NAME)
    return out


class Exporter:
    """The /metrics face: the latest report's families (core, and each collector's facts and rates),
    written out at the first scrape that reads the report and kept for the next ones: Prometheus scrapes
    at its own cadence, often more often than the daemon judges (15 s against the default 30 s pass), and
    a report's text does not change. A report no scrape reads (a burst of kernel records, a node nobody
    scrapes) is never written. `modules` gives the collectors whose families to describe (the daemon's
    change when a bandwidth test starts); `settings` are the `exporter` ones (shape())."""

    def __init__(self, modules: Callable[[], Sequence[Any]], settings: dict[str, Any]):
        self.modules = modules
        self.settings = settings
        self._lock = threading.Lock()
        self._report: Report | None = None
        self._written: Written | None = None  # the report's families as written(), once a scrape wrote them

    def start(self) -> list[threading.Thread]:
        return []  # no thread: a scrape reads the report

    def publish(self, report: Report) -> None:
        with self._lock:
            self._report, self._written = report, None

    def metrics(self) -> list[Metric]:
        with self._lock:
            report = self._report
        return [] if report is None else self._families(report)

    def written(self) -> Written:
        """The latest report's families as written() writes them (none before the first report)."""
        with self._lock:
            report, families = self._report, self._written
        if families is None and report is not None:
            families = written(shape(self._families(report), self.settings))
            with self._lock:
                if self._report is report:  # else a newer one came meanwhile: the next scrape writes that
                    self._written = families
        return families or []

    def _families(self, report: Report) -> list[Metric]:
        return report_metrics(report, self.modules(), report.rates)

    def stop(self, timeout: float) -> None:
        pass


def shape(metrics: Iterable[Metric], settings: dict[str, Any]) -> list[Metric]:
    """The families as the `exporter` settings want them: the excluded ones left out, the NVLink ones
    summed per GPU when their per-link detail is off."""
    excluded = list(settings["exclude_families"])
    per_link = settings["detail"]["nvlink_per_link"]
    out = []
    for m in metrics:
        if any(fnmatch.fnmatchcase(m.name, pattern) for pattern in excluded):
            continue
        if not per_link and m.name.startswith(NVLINK_FAMILIES) and "link" in m.labels and m.kind != "histogram":
            m = summed_over(m, "link", "Per GPU: summed over the GPU's links (exporter.detail.nvlink_per_link is "
                                       "false).")
        out.append(m)
    return out


def summed_over(m: Metric, label: str, note: str) -> Metric:
    """The family without `label`: the samples that differ only in it, added up."""
    i = m.labels.index(label)
    out = Metric(m.name, f"{m.help} {note}", m.kind, m.labels[:i] + m.labels[i + 1:])
    sums: dict[tuple[str, ...], float] = {}
    for labels, value in m.samples:
        key = labels[:i] + labels[i + 1:]
        sums[key] = sums.get(key, 0.0) + value
    out.samples = list(sums.items())
    return out


# Each family as the last render wrote it: its help, type and samples, its whole text, and its series'
# label values (kept: making them again from the samples costs a sixth of a moved family's render), texts
# up to the value (`name{a="x",b="y"} `) and lines, in the order of its samples, with the order they were
# written in (None: as they came). Passes change values, rarely which series exist, and many families not
# even their values (identity, state, error counters): a family whose help, type and samples are the last
# render's is its last text; one whose series are the last render's, in the same order, writes again only
# the lines whose value moved (the hw events family of a busy port: 2 of 25 series a port move, 84 against
# 285 us for its 225 series); any other is written anew. Writing the name and labels of every series was
# a third of a render (benchmarks/RESULTS.md). An entry holds one exposition of its family, never more.
# Two renders at once each build their own and the last one stays: both are right.
class _Rendered(NamedTuple):
    help: str
    kind: str
    samples: list  # a copy of the family's samples as rendered
    text: str
    labels: list  # each series' label values, in the order of the samples
    series: list[str]  # each series' text up to its value, in that order
    lines: list[str]  # each series' line, in that order
    order: list[int] | None  # the order the lines were written in; None: as they came


_RENDERED: dict[tuple[str, tuple[str, ...]], _Rendered] = {}


Written = list[tuple[str, str]]  # each family's exposition by name, in name order (written())


def render(metrics: Iterable[Metric]) -> bytes:
    """Prometheus text exposition (format 0.0.4) of our metric families.

    Written directly rather than through prometheus_client: its generic path cost as much CPU as
    the whole collect-and-judge pass on the H100 fixture (benchmarks/RESULTS.md). Families are
    sorted by name and samples by labels, so the text is byte-stable; tests parse it back with
    prometheus_client's parser and with promtool.
    """
    return join(written(metrics))


def join(*parts: Written) -> bytes:
    """The families of several written() parts as one exposition, in name order; a name in two parts
    is kept once, the first part's. sorted() is stable and merges the parts' sorted runs in C: 27 against
    heapq.merge's 67 us for the daemon's ~120 families a scrape."""
    out: list[str] = []
    last = None
    for name, text in sorted(itertools.chain(*parts), key=operator.itemgetter(0)):
        if name == last:
            log.error("metric family %s emitted twice; keeping the first", name)
            continue
        last = name
        out.append(text)
    return "".join(out).encode("utf-8")


def written(metrics: Iterable[Metric]) -> Written:
    """Each family's exposition, in name order; a family without samples is left out, as node_exporter
    does, and a name that comes twice is kept once, the first."""
    out: Written = []
    seen = set()
    for m in sorted(metrics, key=lambda m: m.name):
        if not m.samples:
            continue
        if m.name in seen:
            log.error("metric family %s emitted twice; keeping the first", m.name)
            continue
        seen.add(m.name)
        out.append((m.name, _family(m)))
    return out


def _family(m: Metric) -> str:
    """A family's exposition: a non-histogram's as the last render wrote it, with only its moved values
    written again, where it has the same series in the same order (_RENDERED); else written anew."""
    if m.kind == "histogram":
        return _header(m) + "".join(_histogram_lines(m))
    family = (m.name, m.labels)
    last = _RENDERED.get(family)
    last = last if last is not None and last.help == m.help and last.kind == m.kind else None
    if last is not None and last.samples == m.samples:
        return last.text
    labels = [series_labels for series_labels, _ in m.samples]
    if last is not None and labels == last.labels:
        lines = last.lines.copy()
        series = last.series
        for i, ((_, was), (_, value)) in enumerate(zip(last.samples, m.samples)):
            if was != value:  # equal floats write the same text (0.0 and -0.0 both `0`); a NaN is written again
                lines[i] = f"{series[i]}{_number(value)}\n"
        return _keep(m, family, labels, series, lines, last.order)
    series = [_series(m.name, m.labels, series_labels) for series_labels in labels]
    lines = [f"{text}{_number(value)}\n" for text, (_, value) in zip(series, m.samples)]
    order = sorted(range(len(labels)), key=labels.__getitem__)
    return _keep(m, family, labels, series, lines, None if order == list(range(len(labels))) else order)


def _keep(m: Metric, family: tuple[str, tuple[str, ...]], labels: list, series: list[str], lines: list[str],
          order: list[int] | None) -> str:
    """The family's text, its series in label order, kept in _RENDERED for the next render."""
    text = _header(m) + "".join(lines if order is None else [lines[i] for i in order])
    _RENDERED[family] = _Rendered(m.help, m.kind, list(m.samples), text, labels, series, lines, order)
    return text


def _header(m: Metric) -> str:
    return f"# HELP {m.name} {_escape_help(m.help)}\n# TYPE {m.name} {m.kind}\n"


def _series(name: str, label_names: tuple[str, ...], values: tuple[str, ...]) -> str:
    """A sample line up to its value: `name{a="x",b="y"} `, or `name ` without labels."""
    if not label_names:
        return name + " "
    return name + "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in zip(label_names, values)) + "} "


def _histogram_lines(m: Metric) -> list[str]:
    """`_bucket` lines in increasing `le` (the bucket index sorts them), then `_count` and `_sum`."""
    bounds = [_number(float(b)) for b in m.buckets] + ["+Inf"]
    lines = []
    for (*labels, part, index), value in sorted(m.samples):
        pairs = [f'{k}="{_escape_label(v)}"' for k, v in zip(m.labels, labels)]
        if part == "0":
            pairs.append(f'le="{bounds[int(index)]}"')
        suffix = ("_bucket", "_count", "_sum")[int(part)]
        lines.append(f"{m.name}{suffix}{{{','.join(pairs)}}} {_number(value)}\n" if pairs
                     else f"{m.name}{suffix} {_number(value)}\n")
    return lines


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if value.is_integer() and -1e15 < value < 1e15:
        return str(int(value))
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)
