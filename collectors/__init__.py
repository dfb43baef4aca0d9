"""Collectors: one module per source. They read and parse; they never judge.

Each module provides:
    NAME: str                                   the collector's name (metric label, --only/--skip)
    DEFAULTS: dict                              its settings (config section collectors.<NAME>)
    supported(host: HostPaths, cfg: dict) -> str | None
                                                None when supported, else the reason it is not
    collect(host: HostPaths, cfg: dict) -> facts
        frozen dataclasses; an absent file is None, never 0. Raise CollectError (or OSError)
        with a clear message when the source exists but cannot be read or parsed.
    metrics(facts) -> list[Metric]              how the facts become metric families
    counters(facts) -> dict[str, float]         optional: monotonic counters the engine turns
                                                into per-second rates for checks
    rate_metrics(facts, rates) -> list[Metric]  optional: families of those rates (bandwidth), from
                                                the second pass on (a rate needs two samples)
"""


class CollectError(Exception):
    """The source exists but could not be read or parsed; the message says which file and why."""
