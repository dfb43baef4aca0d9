"""The hook face: each finding that appears or clears becomes an event, and every event a run of the
configured command and/or POST, from a few worker threads of its own.

A finding counts when its severity is at least `min_severity` and no silence covers it; a finding that
a silence comes to cover therefore clears (the event carries the silence). The daemon's first report
after a start sends every finding it has as appeared: a receiver acts idempotently on what it is told.
Events of one finding run in order (never two at once); a queue of at most `max_queue` events waits
for the rate limit and the workers, and when full drops its oldest, counted.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nodehealth.hooks.runner import OUTCOMES, Outcome, post, run_command
from nodehealth.model import Finding, Metric, Report, Severity

log = logging.getLogger("nodehealth.hooks")

SCHEMA_VERSION = 1
EVENTS = ("appeared", "cleared")
MAX_EVENT_MESSAGE = 1024
Notify = Callable[[str, str, str], None]  # (Event type, reason, message): an Event on the Node, on Kubernetes


@dataclass(frozen=True)
class Event:
    kind: str  # appeared or cleared
    finding: Finding
    node: str
    time: float

    @property
    def key(self) -> tuple[str, str, str]:
        return self.finding.key

    def body(self) -> bytes:
        """The JSON a command reads on stdin and a receiver gets as the POST body."""
        return json.dumps({"schema_version": SCHEMA_VERSION, "event": self.kind, "node": self.node,
                           "time": self.time, "finding": self.finding.to_dict()}, default=str,
                          separators=(",", ":")).encode("utf-8")


class Hook:
    """The face. `notify` records an Event on the Node (the Kubernetes face's), or is None."""

    def __init__(self, node: str, cfg: dict[str, Any], notify: Notify | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.node = node
        self.cfg = cfg
        self.notify = notify
        self.clock = clock
        self.least = Severity(cfg["min_severity"]).rank
        self.actions = ([("command", cfg["command"])] if cfg["command"] else []) + \
                       ([("url", cfg["url"])] if cfg["url"] else [])
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._queue: deque[Event] = deque()
        self._running: set[tuple[str, str, str]] = set()
        self._limited: set[int] = set()  # the events (by id) already counted as held by the rate limit
        self._known: dict[tuple[str, str, str], Finding] | None = None  # what counted in the last report
        self._tokens = float(cfg["max_per_minute"])
        self._refilled = clock()
        self._threads: list[threading.Thread] = []
        # What the metrics show.
        self.runs: dict[tuple[str, str, str], int] = {}  # (action, event, outcome) -> runs
        self.dropped = 0
        self.waited = 0  # runs that waited for the rate limit
        self.last: dict[str, tuple[float, float]] = {}  # action -> (wall time, seconds) of its last run

    # -- the daemon's side ---------------------------------------------------------------------
    def start(self) -> list[threading.Thread]:
        for i in range(max(1, int(self.cfg["max_concurrency"]))):
            t = threading.Thread(target=self._worker, name=f"hook-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return list(self._threads)

    def publish(self, report: Report) -> None:
        now = time.time()
        counted = {f.key: f for f in report.findings if f.severity.rank >= self.least and f.silenced is None}
        if self._known is None:
            previous: dict[tuple[str, str, str], Finding] = {}
        else:
            previous = self._known
        self._known = counted
        # a finding no longer counted is told as it is now (silenced, say) when it is still in the report
        shown = {f.key: f for f in report.findings}
        events = [Event("appeared", f, report.node, now) for k, f in counted.items() if k not in previous]
        events += [Event("cleared", shown.get(k, f), report.node, now) for k, f in previous.items()
                   if k not in counted]
        if not events:
            return
        with self._work:
            for event in events:
                if len(self._queue) >= self.cfg["max_queue"]:
                    lost = self._queue.popleft()
                    self._limited.discard(id(lost))
                    self.dropped += 1
                    log.warning("hook: queue full (%d); dropped the oldest event: %s %s on %s",
                                self.cfg["max_queue"], lost.kind, lost.finding.reason, lost.finding.device or "-")
                self._queue.append(event)
            self._work.notify_all()

    def stop(self, timeout: float) -> None:
        """Stop the workers; a run in flight is killed (a command) or cut (a POST ends at its own deadline)."""
        self._stop.set()
        with self._work:
            self._work.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    # -- the workers ---------------------------------------------------------------------------
    def _next(self) -> Event | None:
        """The oldest event whose finding has no run in flight, once the rate limit allows; None at stop."""
        with self._work:
            while not self._stop.is_set():
                event = next((e for e in self._queue if e.key not in self._running), None)
                wait = self._token_wait() if event is not None else None
                if event is not None and wait == 0.0:
                    self._queue.remove(event)
                    self._running.add(event.key)
                    self._tokens -= 1
                    self._limited.discard(id(event))
                    return event
                if event is not None and id(event) not in self._limited:
                    self._limited.add(id(event))  # counted once, when it first has to wait
                    self.waited += 1
                self._work.wait(wait)
        return None

    def _token_wait(self) -> float:
        """Seconds until a run may start (0.0: now). Caller holds the lock."""
        now = self.clock()
        rate = self.cfg["max_per_minute"] / 60.0
        self._tokens = min(float(self.cfg["max_per_minute"]), self._tokens + (now - self._refilled) * rate)
        self._refilled = now
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / rate

    def _worker(self) -> None:
        while True:
            event = self._next()
            if event is None:
                return
            try:
                for action, target in self.actions:
                    self._run(action, target, event)
            except Exception:  # a bug must not end the worker: the next event still runs
                log.exception("hook: running the %s event of %s failed", event.kind, event.finding.reason)
            finally:
                with self._work:
                    self._running.discard(event.key)
                    self._work.notify_all()

    def _run(self, action: str, target: Any, event: Event) -> None:
        timeout = self.cfg["timeout_seconds"]
        if action == "command":
            outcome = run_command(list(target), event.body(), timeout, self._stop)
        else:
            outcome = post(target, event.body(), timeout)
        with self._lock:
            key = (action, event.kind, outcome.result)
            self.runs[key] = self.runs.get(key, 0) + 1
            self.last[action] = (time.time(), outcome.seconds)
        self._report(action, event, outcome)

    def _report(self, action: str, event: Event, outcome: Outcome) -> None:
        f = event.finding
        what = f"{f.reason} on {f.device or 'the node'} {event.kind}"
        said = " ".join(outcome.output.split())[:300]
        line = (f"remediation hook ({action}) for {what}: {outcome.result}, {outcome.detail} in "
                f"{outcome.seconds:.1f} s" + (f"; it said: {said}" if said else ""))
        log.log(logging.INFO if outcome.result == "ok" else logging.WARNING, "%s", line)
        if self.notify is not None:
            ok = outcome.result == "ok"
            self.notify("Normal" if ok else "Warning", "NodeHealthHookSucceeded" if ok else "NodeHealthHookFailed",
                        line[:MAX_EVENT_MESSAGE])

    # -- /metrics ------------------------------------------------------------------------------
    def metrics(self) -> list[Metric]:
        with self._lock:
            runs, dropped, waited = dict(self.runs), self.dropped, self.waited
            queued, running, last = len(self._queue), len(self._running), dict(self.last)
        total = Metric("nodehealth_hook_runs_total", "Runs of the remediation hook, by action (command or url), "
                       "event (appeared or cleared) and outcome (ok, failed, timeout, error).", "counter",
                       ("action", "event", "outcome"))
        for action, _ in self.actions:
            for kind in EVENTS:
                for result in OUTCOMES:
                    total.add((action, kind, result), runs.get((action, kind, result), 0))
        out = [total]
        for name, help_text, kind, value in (
                ("nodehealth_hook_dropped_total", "Hook events dropped because the queue was full "
                 "(hooks.max_queue).", "counter", dropped),
                ("nodehealth_hook_rate_limited_total", "Hook events that waited for the rate limit "
                 "(hooks.max_per_minute).", "counter", waited),
                ("nodehealth_hook_queued", "Hook events waiting for a run.", "gauge", queued),
                ("nodehealth_hook_running", "Hook events being run now.", "gauge", running)):
            out.append(Metric.one(name, help_text, value, kind))
        stamp = Metric("nodehealth_hook_last_run_timestamp_seconds", "Unix time the hook's last run of this action "
                       "ended.", labels=("action",))
        took = Metric("nodehealth_hook_last_run_duration_seconds", "How long the hook's last run of this action took.",
                      labels=("action",))
        for action, (ended, seconds) in sorted(last.items()):
            stamp.add((action,), ended)
            took.add((action,), seconds)
        return [*out, stamp, took]
