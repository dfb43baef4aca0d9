"""One pass: run every collector (isolated, timed, under a deadline), then every check.

Collectors run one after another in a worker thread, so that a read stuck in the kernel (a wedged
mount, a driver that never answers) costs that collector its result, not the pass: when one
overruns its deadline the worker is abandoned to it, and a fresh worker runs the rest (and the
passes after). A
collector still stuck from an earlier pass is not started again: it reports that it is stuck.
One worker rather than a thread per collector: concurrent readers fight over the GIL on every
read() and cost a third more CPU (benchmarks/RESULTS.md).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, Callable

from nodehealth.host import HostPaths
from nodehealth.model import Action, CollectorResult, Finding, Observed, Reason, Severity

# What run_check reports for any check that could not judge (docs/checks.md: "every check").
COLLECTOR_FAILED = "CollectorFailed"
REASONS = {
    COLLECTOR_FAILED: Reason(Severity.UNKNOWN, Action.NONE,
                             "a collector the check reads failed; the message gives its error"),
    "CheckFailed": Reason(Severity.UNKNOWN, Action.NONE, "the check itself raised an error"),
}


MAX_ERROR_CHARS = 1000  # a collector's error, bounded: room for what failed, why, and the fix (kmsg's)


class _Worker(threading.Thread):
    """Runs batches of collectors in order, pass after pass; retired once abandoned to a stuck one.

    One long-lived thread, not one per pass: a new thread per pass costs a thread start and, with
    glibc, slowly spreads the heap over more malloc arenas (resident memory creeps up).
    """

    def __init__(self, host: HostPaths, cfgs: dict[str, dict[str, Any]]):
        super().__init__(name="collectors", daemon=True)
        self.host = host
        self.cfgs = cfgs
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.finished = threading.Event()
        self.jobs: list = []
        self.done: dict[str, tuple[Any, str | None, float]] = {}
        self.current: Any = None
        self.started = 0.0
        self.abandoned = False

    def submit(self, jobs: list) -> None:
        with self.lock:
            self.jobs, self.done = list(jobs), {}
            self.finished.clear()
        self.ready.set()

    def run(self) -> None:
        while True:
            self.ready.wait()
            self.ready.clear()
            for module in self.jobs:
                with self.lock:
                    if self.abandoned:
                        return
                    self.current, self.started = module, time.monotonic()
                facts, error = None, None
                t0 = time.perf_counter()
                try:
                    facts = module.collect(self.host, self.cfgs[module.NAME])
                except Exception as e:  # isolation: any failure is this collector's, never the pass's
                    error = _describe(e)
                with self.lock:
                    self.done[module.NAME] = (facts, error, time.perf_counter() - t0)
                    self.current = None
            self.finished.set()


def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    text = str(e) or type(e).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."


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
        self._stuck: dict[str, _Worker] = {}
        self._worker: _Worker | None = None
        self._last_counters: dict[str, tuple[float, dict[str, float]]] = {}  # name -> (time, values)

    def collect(self) -> dict[str, CollectorResult]:
        results: dict[str, CollectorResult] = {}
        cfgs = {m.NAME: self.config["collectors"].get(m.NAME, {}) for m in self.collectors}
        queue = []
        for module in self.collectors:
            reason = _supported(module, self.host, cfgs[module.NAME])
            if reason is not None:
                results[module.NAME] = CollectorResult(module.NAME, supported=False, success=False, error=reason)
            elif self._stuck.get(module.NAME) is not None and self._stuck[module.NAME].is_alive():
                results[module.NAME] = failed(module, "still stuck in a read from an earlier pass")
            else:
                self._stuck.pop(module.NAME, None)
                queue.append(module)
        while queue:
            if self._worker is None:
                self._worker = _Worker(self.host, cfgs)
                self._worker.start()
            worker = self._worker
            worker.cfgs = cfgs
            worker.submit(queue)
            stuck = self._wait(worker)
            by_name = {m.NAME: m for m in queue}
            for name, (facts, error, duration) in worker.done.items():
                results[name] = (CollectorResult(name, True, True, duration, facts=facts) if error is None
                                 else failed(by_name[name], error, duration))
            if stuck is None:
                break
            self._stuck[stuck.NAME] = worker
            self._worker = None  # left to the stuck collector; the rest run on a fresh one
            results[stuck.NAME] = failed(stuck, f"timed out after {self.timeout:g}s", self.timeout)
            queue = queue[queue.index(stuck) + 1:]
        return {m.NAME: results[m.NAME] for m in self.collectors}

    def _deadline(self, module: Any) -> float | None:
        """A collector's deadline: the engine's, unless the collector sets its own from its config
        (a saved kernel log of a million lines is finite work the user asked for: no deadline)."""
        fn = getattr(module, "deadline", None)
        return fn(self.config["collectors"].get(module.NAME, {}), self.timeout) if fn is not None else self.timeout

    def _wait(self, worker: _Worker) -> Any:
        """Wait for the worker; return the collector that overran its deadline, if one did."""
        while not worker.finished.is_set():
            with worker.lock:
                current, started = worker.current, worker.started
            limit = self._deadline(current) if current is not None else self.timeout
            if limit is None:
                worker.finished.wait(0.1)  # until it is done, or the next collector (with a deadline) starts
                continue
            remaining = started + limit - time.monotonic() if current is not None else limit
            if current is not None and remaining <= 0:
                with worker.lock:
                    if worker.current is current:
                        worker.abandoned = True
                        return current
                continue
            worker.finished.wait(remaining)
        return None

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
        for name, values in current.items():
            # Each collector's own last sample: after a failed pass the delta spans more time.
            last = self._last_counters.get(name)
            if last is not None and now > last[0]:
                dt, previous = now - last[0], last[1]
                out[name] = {k: (v - previous[k]) / dt for k, v in values.items()
                             if k in previous and v >= previous[k]}
            self._last_counters[name] = (now, values)
        return out

    def judge(self, results: dict[str, CollectorResult], rates: dict[str, dict[str, float]],
              now: float, checks: Sequence[Any] | None = None) -> list[Finding]:
        """Run `checks` (default: all of this engine's) on collected results. The checks of a failed
        collector that names its failure (FAILED_REASON) give one finding together, not one each."""
        obs = Observed({n: r.facts for n, r in results.items() if r.success}, rates, now)
        findings: list[Finding] = []
        folded: dict[str, list[str]] = {}
        for check in self.checks if checks is None else checks:
            failure = _failed_input(check, results)
            if failure is not None and failure.failed_reason:
                folded.setdefault(failure.name, []).append(check.NAME)
                continue
            findings.extend(run_check(check, results, obs, self.config["checks"].get(check.NAME, {})))
        for name, names in folded.items():
            r = results[name]
            listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
            findings.append(Finding(name, Severity.UNKNOWN, str(r.failed_reason),
                                    f"Could not judge {listed}: collector {name} failed: {r.error}.",
                                    evidence={"checks": names, "error": r.error}))
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


def failed(module: Any, error: str, duration: float = 0.0) -> CollectorResult:
    """A supported collector's failure, with the reason its checks then give together, if it has one."""
    return CollectorResult(module.NAME, True, False, duration, error,
                           failed_reason=getattr(module, "FAILED_REASON", None))


def _failed_input(check: Any, results: dict[str, CollectorResult]) -> CollectorResult | None:
    """The first failed collector a check needs, when all it needs are supported."""
    needed = [results.get(name) for name in check.NEEDS]
    if any(r is None or not r.supported for r in needed):
        return None
    return next((r for r in needed if not r.success), None)


def run_check(check: Any, results: dict[str, CollectorResult], obs: Observed,
              cfg: dict[str, Any]) -> list[Finding]:
    """One check, isolated: a failed input or a crash is an `unknown` finding, never an exception."""
    needed = [results.get(name) for name in check.NEEDS]
    if any(r is None or not r.supported for r in needed):
        return []
    r = _failed_input(check, results)
    if r is not None:
        return [Finding(check.NAME, Severity.UNKNOWN, COLLECTOR_FAILED,
                        f"Could not judge: collector {r.name} failed: {r.error}.", device="")]
    try:
        return list(check.judge(obs, cfg))
    except Exception as e:
        return [Finding(check.NAME, Severity.UNKNOWN, "CheckFailed",
                        f"Could not judge: the check failed: {_describe(e)}.")]
