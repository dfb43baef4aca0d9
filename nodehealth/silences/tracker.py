"""The daemon's silences: the file, read at every pass, and the Node's annotation, read by the Kubernetes
face; applied to every report; each one logged when it comes into force and when it ends, and counted."""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable

from nodehealth.model import Finding, Metric
from nodehealth.silences import store
from nodehealth.silences.silence import Silence, apply, parse_list

log = logging.getLogger("nodehealth.silences")


class Silences:
    def __init__(self, state_dir: str, cfg: dict[str, Any], clock: Callable[[], float] = time.time):
        self.state_dir = state_dir
        self.cfg = cfg
        self.clock = clock  # silences end on the operator's clock, even on a replayed machine
        self._lock = threading.Lock()
        self._by_source: dict[str, list[Silence]] = {"file": [], "annotation": []}
        self._problems: dict[str, list[str]] = {"file": [], "annotation": []}
        self._file_seen: tuple[int, int, int, int] | None = None  # (inode, size, mtime, ctime) last read
        self._annotation: str | None = None
        self._in_force: dict[tuple[str, str], Silence] = {}  # (source, id) -> silence, as last applied
        self._refused_said: set[tuple[str, str, tuple[str, str, str]]] = set()
        self.started: dict[str, int] = {"file": 0, "annotation": 0}  # silences that came into force

    # -- reading -----------------------------------------------------------------------------
    def reload(self) -> None:
        """Read the file again if it changed (at every pass: an added silence counts from the next one)."""
        try:
            st = os.stat(store.path(self.state_dir))
            seen: tuple[int, int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            seen = None
        with self._lock:
            if seen is not None and seen == self._file_seen:
                return
        silences, problems = store.load(self.state_dir, self.cfg["max_silences"], self.clock(),
                                        self.cfg["max_seconds"])
        self._set("file", silences, problems)
        with self._lock:
            self._file_seen = seen

    def set_annotation(self, text: str | None) -> bool:
        """The Node's silences annotation as just read (None: none); True when it changed."""
        with self._lock:
            if text == self._annotation:
                return False
            self._annotation = text
        silences, problems = ([], []) if text is None else parse_list(
            text, "annotation", self.cfg["max_silences"], self.clock(), self.cfg["max_seconds"])
        self._set("annotation", silences, problems)
        return True

    def _set(self, source: str, silences: list[Silence], problems: list[str]) -> None:
        with self._lock:
            new = [p for p in problems if p not in self._problems[source]]
            self._by_source[source], self._problems[source] = silences, problems
        for problem in new:
            log.error("silence refused: %s", problem)

    # -- applying ----------------------------------------------------------------------------
    def apply(self, findings: Sequence[Finding]) -> list[Finding]:
        """The findings with the silenced ones marked; logs each silence that came into force or ended,
        and each fatal finding a silence covers without allowing it (once)."""
        now = self.clock()
        with self._lock:
            every = self._by_source["file"] + self._by_source["annotation"]
            in_force = {(s.source, s.id): s for s in every if now < s.expires}
            started = [s for k, s in in_force.items() if k not in self._in_force]
            ended = [(s, now >= s.expires) for k, s in self._in_force.items() if k not in in_force]
            for s in started:
                self.started[s.source] += 1
            self._in_force = in_force
        out, refused = apply(findings, list(in_force.values()), now)
        for s in started:
            log.warning("%s: in force", s.describe())
        for s, expired in ended:
            log.info("silence %s (%s) ended: %s", s.id, s.source, "expired" if expired else "removed")
        for s, f in refused:
            said = (s.source, s.id, f.key)
            if said not in self._refused_said:
                self._refused_said.add(said)
                log.warning("silence %s covers %s on %s, which is fatal, but was not set with --allow-fatal "
                            "(allow_fatal): the finding stays loud", s.id, f.reason, f.device or "the node")
        return out

    # -- what /metrics shows -------------------------------------------------------------------
    def metrics(self) -> list[Metric]:
        with self._lock:
            in_force = list(self._in_force.values())
            problems = {k: len(v) for k, v in self._problems.items()}
            started = dict(self.started)
        active = Metric("nodehealth_silences_active", "Silences in force now, by where they were set (the state "
                        "directory's file or the Node's annotation).", labels=("source",))
        total = Metric("nodehealth_silences_started_total", "Silences that came into force since the daemon "
                       "started, by where they were set.", "counter", ("source",))
        refused = Metric("nodehealth_silences_refused", "Silences refused as last read (malformed, too long, too "
                         "many, or the file unreadable), by where they were set.", labels=("source",))
        for source in ("file", "annotation"):
            active.add((source,), sum(1 for s in in_force if s.source == source))
            total.add((source,), started[source])
            refused.add((source,), problems[source])
        return [active, total, refused]
