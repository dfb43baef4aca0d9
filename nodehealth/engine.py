"""One pass: run every collector (isolated, timed, under a deadline), then every check.

Collectors run in their own threads so that a read stuck in the kernel (a wedged mount, a
driver that never answers) costs that collector its result, not the pass. A thread still stuck
from an earlier pass is not started again: the collector reports that it is stuck.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, Callable

from nodehealth.host import HostPaths
from nodehealth.model import CollectorResult, Finding, Observed, Severity


class _Run(threading.Thread):
    def __init__(self, module: Any, host: HostPaths, cfg: dict[str, Any]):
        super().__init__(name=f"collector-{module.NAME}", daemon=True)
        self.module = module
        self.host = host
        self.cfg = cfg
        self.facts: Any = None
        self.error: str | None = None
        self.duration = 0.0

    def run(self) -> None:
        start = time.perf_counter()
        try:
            self.facts = self.module.collect(self.host, self.cfg)
        except Exception as e:  # isolation: any failure is this collector's, never the pass's
            self.error = _describe(e)
        self.duration = time.perf_counter() - start


def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    text = str(e) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


class Engine:
    """Runs collectors and checks; keeps what must outlive a pass (stuck threads, last counters)."""

    def __init__(self, collectors: Sequence[Any], checks: Sequence[Any], host: HostPaths,
                 config: dict[str, Any], timeout: float = 10.0, clock: Callable[[], float] = time.time):
        self.collectors = list(collectors)
        self.checks = list(checks)
        self.host = host
        self.config = config
        self.timeout = timeout
        self.clock = clock
        self._stuck: dict[str, _Run] = {}
        self._last_counters: dict[str, dict[str, float]] = {}
        self._last_time: float | None = None

    def collect(self) -> dict[str, CollectorResult]:
        results: dict[str, CollectorResult] = {}
        runs: list[_Run] = []
        for module in self.collectors:
            cfg = self.config["collectors"].get(module.NAME, {})
            reason = _supported(module, self.host, cfg)
            if reason is not None:
                results[module.NAME] = CollectorResult(module.NAME, supported=False, success=False, error=reason)
                continue
            stuck = self._stuck.get(module.NAME)
            if stuck is not None and stuck.is_alive():
                results[module.NAME] = CollectorResult(
                    module.NAME, supported=True, success=False,
                    error="still stuck in a read from an earlier pass")
                continue
            self._stuck.pop(module.NAME, None)
            run = _Run(module, self.host, cfg)
            run.start()
            runs.append(run)
        deadline = time.monotonic() + self.timeout
        for run in runs:
            run.join(max(0.0, deadline - time.monotonic()))
            name = run.module.NAME
            if run.is_alive():
                self._stuck[name] = run
                results[name] = CollectorResult(name, True, False, self.timeout,
                                                f"timed out after {self.timeout:g}s")
            elif run.error is not None:
                results[name] = CollectorResult(name, True, False, run.duration, run.error)
            else:
                results[name] = CollectorResult(name, True, True, run.duration, None, run.facts)
        return {m.NAME: results[m.NAME] for m in self.collectors}

    def rates(self, results: dict[str, CollectorResult], now: float) -> dict[str, dict[str, float]]:
        """Per-second rates of every collector's counters since the previous call."""
        current: dict[str, dict[str, float]] = {}
        for module in self.collectors:
            result = results.get(module.NAME)
            fn = getattr(module, "counters", None)
            if fn is None or result is None or not result.success:
                continue
            current[module.NAME] = fn(result.facts)
        out: dict[str, dict[str, float]] = {}
        if self._last_time is not None and now > self._last_time:
            dt = now - self._last_time
            for name, values in current.items():
                previous = self._last_counters.get(name, {})
                out[name] = {k: (v - previous[k]) / dt for k, v in values.items()
                             if k in previous and v >= previous[k]}
        for name, values in current.items():
            self._last_counters[name] = values
        self._last_time = now
        return out

    def judge(self, results: dict[str, CollectorResult], rates: dict[str, dict[str, float]],
              now: float, checks: Sequence[Any] | None = None) -> list[Finding]:
        """Run `checks` (default: all of this engine's) on collected results."""
        obs = Observed({n: r.facts for n, r in results.items() if r.success}, rates, now)
        findings: list[Finding] = []
        for check in self.checks if checks is None else checks:
            findings.extend(run_check(check, results, obs, self.config["checks"].get(check.NAME, {})))
        return findings

    def run(self) -> tuple[dict[str, CollectorResult], list[Finding]]:
        results = self.collect()
        now = self.clock()
        return results, self.judge(results, self.rates(results, now), now)


def _supported(module: Any, host: HostPaths, cfg: dict[str, Any]) -> str | None:
    try:
        return module.supported(host, cfg)
    except Exception as e:
        return f"support probe failed: {_describe(e)}"


def run_check(check: Any, results: dict[str, CollectorResult], obs: Observed,
              cfg: dict[str, Any]) -> list[Finding]:
    """One check, isolated: a failed input or a crash is an `unknown` finding, never an exception."""
    needed = [results.get(name) for name in check.NEEDS]
    if any(r is None or not r.supported for r in needed):
        return []
    failed = [r for r in needed if not r.success]
    if failed:
        r = failed[0]
        return [Finding(check.NAME, Severity.UNKNOWN, "CollectorFailed",
                        f"Could not judge: collector {r.name} failed: {r.error}.", device="")]
    try:
        return list(check.judge(obs, cfg))
    except Exception as e:
        return [Finding(check.NAME, Severity.UNKNOWN, "CheckFailed",
                        f"Could not judge: the check failed: {_describe(e)}.")]
