"""The kernel log as a stream, for the daemon: a follower thread reads new records as they come
(/dev/kmsg or the systemd journal, collectors/kmsg.py's open_follower), NVML's Xid events arrive on
another thread, and both land in one store of this boot's events (KernelEvents), where an Xid that
both sources report is kept once.

The store is saved with the state file, with its boot id and its position in the log (the last kmsg
sequence number or journal cursor, and the keys of collectors/kernel_position.py), so that a
restarted daemon, on the same source or the other, counts no record twice. The daemon judges the
kernel-log checks on the store's facts after every batch.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from nodehealth.collectors import CollectError, kmsg, nvml
from nodehealth.collectors.gpu_facts import NvmlError
from nodehealth.collectors.kernel_events import XID, KernelEvent
from nodehealth.collectors.kernel_position import MAX_RECENT, Position
from nodehealth.host import HostPaths
from nodehealth.policy import expect

log = logging.getLogger("nodehealth.daemon")

MAX_EVENTS = kmsg.MAX_EVENTS  # kernel events kept for the current boot; the oldest go first
XID_MERGE_SECONDS = 2.0  # an NVML Xid event and its kernel line are one Xid (docs/architecture.md, "The kernel stream")
NVML_EVENT_WAIT_SECONDS = 0.5
REOPEN_SECONDS = 5.0  # a reader that failed, or a source that cannot be opened, is tried again this often


@dataclass
class Batch:
    """What one read of the kernel log brought."""

    records: int
    overwritten: int
    position: Position | None  # where the log was read up to (None: NVML's events)
    events: list[KernelEvent]
    malformed: int = 0
    unframed: int = 0


class KernelEvents:
    """The current boot's kernel events and counters, restored from and saved to the state file with
    the position in the log, so that a restarted daemon counts no record twice."""

    def __init__(self, boot: str | None, source: str):
        self.boot_id = boot
        self.source = source
        self.events: list[KernelEvent] = []
        self.records = 0
        self.overwritten = 0
        self.malformed = 0
        self.unframed = 0
        self.position = Position()

    def restore(self, saved: dict[str, Any]) -> None:
        if not saved or saved.get("boot_id") != self.boot_id or self.boot_id is None:
            return
        self.records = int(saved.get("records", 0))
        self.overwritten = int(saved.get("overwritten", 0))
        self.malformed = int(saved.get("malformed", 0))
        self.unframed = int(saved.get("unframed", 0))
        self.position = Position.load(saved)
        fields = {f.name for f in dataclasses.fields(KernelEvent)}
        for d in saved.get("events", [])[-MAX_EVENTS:]:
            try:
                self.events.append(KernelEvent(**{k: v for k, v in d.items() if k in fields}))
            except TypeError:
                continue

    @staticmethod
    def validate(state: dict[str, Any]) -> None:
        """The `kmsg` section has the types restore() and the checks use, else ValueError (StateFile.load)."""
        saved = expect(state.get("kmsg", {}), dict, "kmsg")
        expect(saved.get("boot_id"), str, "kmsg.boot_id", optional=True)
        for name in ("records", "overwritten", "malformed", "unframed"):
            expect(saved.get(name, 0), int, f"kmsg.{name}")
        expect(saved.get("last_seq"), int, "kmsg.last_seq", optional=True)
        expect(saved.get("journal_cursor"), str, "kmsg.journal_cursor", optional=True)
        expect(saved.get("high_us"), int, "kmsg.high_us", optional=True)
        for i, pair in enumerate(expect(saved.get("recent", []), list, "kmsg.recent")[-MAX_RECENT:]):
            expect(pair, list, f"kmsg.recent[{i}]")
            if len(pair) != 2:
                raise ValueError(f"kmsg.recent[{i}] is not a [stamp, key] pair")
            expect(pair[0], int, f"kmsg.recent[{i}][0]")
            expect(pair[1], str, f"kmsg.recent[{i}][1]")
        for i, d in enumerate(expect(saved.get("events", []), list, "kmsg.events")[-MAX_EVENTS:]):
            where = f"kmsg.events[{i}]"
            expect(d, dict, where)
            for name in ("kind", "device", "text"):
                expect(d.get(name, ""), str, f"{where}.{name}")
            for name in ("code", "seq", "monotonic_us"):
                expect(d.get(name), int, f"{where}.{name}", optional=True)
            expect(d.get("wall_time"), (int, float), f"{where}.wall_time", optional=True)
            expect(d.get("detail", {}), dict, f"{where}.detail")

    def add(self, batch: Batch) -> None:
        self.records += batch.records
        self.overwritten += batch.overwritten
        self.malformed += batch.malformed
        self.unframed += batch.unframed
        if batch.position is not None:
            self.position = batch.position
        for event in batch.events:
            self._merge(event)
        if len(self.events) > MAX_EVENTS:
            del self.events[: len(self.events) - MAX_EVENTS]

    def _merge(self, event: KernelEvent) -> None:
        """Add an event, unless it is an Xid the other source already reported.

        NVML events and kernel lines report the same Xid: one is kept when the bus id (or an
        unknown one), the Xid and the time within XID_MERGE_SECONDS agree. The kernel line wins,
        since it carries the text, pid and process.
        """
        if event.kind == XID and event.wall_time is not None:
            source = event.detail.get("source", "kmsg")
            for i in range(len(self.events) - 1, max(-1, len(self.events) - 200), -1):
                old = self.events[i]
                if (old.kind == XID and old.code == event.code and old.wall_time is not None
                        and abs(old.wall_time - event.wall_time) <= XID_MERGE_SECONDS
                        and old.detail.get("source", "kmsg") != source
                        and (not old.device or not event.device or old.device == event.device)):
                    if source == "kmsg":
                        self.events[i] = event
                    return
        self.events.append(event)

    def clear(self) -> int:
        """An operator's clear: the events so far no longer count (counters restart from zero)."""
        cleared = len(self.events)
        self.events.clear()
        return cleared

    def facts(self) -> kmsg.KernelLog:
        return kmsg.KernelLog(source=self.source, boot_id=self.boot_id, records=self.records,
                              overwritten=self.overwritten, malformed=self.malformed,
                              last_seq=self.position.seq, events=tuple(self.events), unframed=self.unframed)

    def dump(self) -> dict[str, Any]:
        return {"boot_id": self.boot_id, "records": self.records, "overwritten": self.overwritten,
                "malformed": self.malformed, "unframed": self.unframed, **self.position.dump(),
                "events": [dataclasses.asdict(e) for e in self.events]}


class KernelStream:
    """The two readers of kernel events: the kernel log's follower and NVML's event waiter. Each
    hands its news to `on_batch` (the daemon adds it to the store and judges again); each survives
    its source's failures, trying again every REOPEN_SECONDS."""

    def __init__(self, host: HostPaths, cfg: dict[str, Any], store: KernelEvents,
                 on_batch: Callable[[Batch], None], clock: Callable[[], float]):
        self.host = host
        self.cfg = cfg  # the kmsg collector's settings
        self.store = store
        self.on_batch = on_batch
        self.clock = clock
        self.error: str | None = None  # why the kernel log cannot be read now
        self.alive = False  # the follower is reading

    def follow(self, stop: threading.Event) -> None:
        """Follow the kernel log; reopen it, at most every REOPEN_SECONDS, if the reader fails
        (docs/architecture.md, "The kernel stream")."""
        while not stop.is_set():
            try:
                follower = kmsg.open_follower(self.host, self.cfg, self.store.position.copy())
            except CollectError as e:
                self.error = str(e)
                self.alive = False
                stop.wait(REOPEN_SECONDS)
                continue
            self.store.source = follower.source
            self.error = None
            self.alive = True
            malformed, unframed = 0, 0
            try:
                while not stop.is_set():
                    before = follower.position.copy()
                    records, overwritten, _, events = follower.read_new()
                    if (records or overwritten or follower.malformed > malformed or follower.unframed > unframed
                            or follower.position != before):
                        self.on_batch(Batch(records, overwritten, follower.position.copy(), list(events),
                                            follower.malformed - malformed, follower.unframed - unframed))
                        malformed, unframed = follower.malformed, follower.unframed
                    follower.wait(1.0)  # wakes at once for a record; idle, once a second
            except Exception as e:
                log.exception("kernel log follower failed; restarting in 5 s")
                self.error = f"kernel log reader failed: {e}"
            finally:
                self.alive = False
                follower.close()
            stop.wait(REOPEN_SECONDS)

    def nvml_events(self, stop: threading.Event) -> None:
        """Xids from NVML's event set as they happen; the kernel log gives their text."""
        while not stop.is_set():
            try:
                raw = nvml.backend_for(self.host).wait_events(NVML_EVENT_WAIT_SECONDS)
            except (NvmlError, OSError, ValueError) as e:
                log.info("NVML events unavailable (%s); trying again in 5 s", e)
                stop.wait(REOPEN_SECONDS)
                continue
            except Exception:  # a binding's own error (a TypeError) must not end Xid events for good
                log.exception("NVML event wait failed; trying again in 5 s")
                stop.wait(REOPEN_SECONDS)
                continue
            events = [self._gpu_event(e) for e in raw if e.get("kind") == "xid" and isinstance(e.get("data"), int)]
            if events:
                self.on_batch(Batch(0, 0, None, events))

    def _gpu_event(self, raw: dict[str, Any]) -> KernelEvent:
        bus_id = nvml.known_bus_id(raw.get("gpu"))
        return KernelEvent(XID, bus_id or "", raw["data"], "(reported by NVML; see the kernel log for the text)",
                           wall_time=self.clock(), detail={"source": "nvml", "gpu": raw.get("gpu")})
