"""The kernel log from the systemd journal: what /dev/kmsg said, where /dev/kmsg cannot be opened.

journald copies every /dev/kmsg record into the journal (`_TRANSPORT=kernel`, its default
`ReadKMsg=yes`), so an agent that may not open the device (runc's device cgroup refuses it to an
unprivileged container) reads the same records from the journal files, through read-only mounts of
the host's /var/log and /run/log. Only journald writes trusted fields (those that start with `_`):
no process can log a record that reads as the kernel's.

Read with libsystemd's sd-journal (python3-systemd): the journal's reference reader, which follows
its format across versions (compact files, zstd/lz4/xz data, files rotated while we read, files
written as we read, a corrupt file skipped) and wakes us through inotify when an entry is appended.
It costs the image about 0.2 MB (libsystemd0 is in every Debian image already); journalctl would
cost the whole systemd package (about 10 MB and its libraries) and a child process to watch; a
reader of our own would have to follow every format change of systemd's. This module is the only
importer of `systemd`.

One directory is read: the first of `collectors.kmsg.journal_directories` that holds kernel records
of this boot (journald keeps a boot in /run/log/journal until /var/log/journal can take it, then
moves it there). Position: the cursor of the last entry read, and the record keys of
collectors/kernel_position.py, so that a rejected cursor or a switch from /dev/kmsg counts nothing twice.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any

from nodehealth.collectors import CollectError
from nodehealth.collectors.kernel_events import EventParser, KernelEvent, KernelRecord
from nodehealth.collectors.kernel_position import Position
from nodehealth.host import HostPaths

# journald's own entry when it found a gap in /dev/kmsg's sequence numbers (SD_MESSAGE_JOURNAL_MISSED):
# "Missed N kernel messages", the records the ring buffer overwrote before journald read them.
MISSED_MESSAGE_ID = "e9bf28e6e834481bb6f48f548ad13606"
_MISSED = re.compile(r"Missed (\d{1,12}) kernel messages")
MAX_RECORDS_PER_READ = 100000  # as /dev/kmsg's: a long journal cannot keep one read going forever
_SYSTEM_PACKAGES = "/usr/lib/python3/dist-packages"


def journal_module() -> Any:
    """systemd.journal: the environment's, else the distribution's python3-systemd (the image's venv
    has none of its own); CollectError saying what to install when there is neither."""
    try:
        from systemd import journal
    except ImportError:
        if os.path.isdir(os.path.join(_SYSTEM_PACKAGES, "systemd")) and _SYSTEM_PACKAGES not in sys.path:
            sys.path.append(_SYSTEM_PACKAGES)  # last, so it shadows nothing the environment has
        try:
            from systemd import journal
        except ImportError as e:
            raise CollectError(f"reading the journal needs python3-systemd (libsystemd's sd-journal), which is "
                               f"not installed ({e}): apt-get install python3-systemd") from None
    return journal


def directories(host: HostPaths, cfg: dict[str, Any]) -> list[str]:
    """The journal directories to look in, under the root (the DaemonSet's /host)."""
    return [host.rootfs(str(d)) for d in cfg.get("journal_directories", ())]


class JournalFollower:
    """Reads this boot's kernel records from the journal, as KmsgFollower reads /dev/kmsg: the whole
    boot first (skipping what `position` says was read), then what is appended."""

    def __init__(self, host: HostPaths, cfg: dict[str, Any], position: Position, boot: str | None,
                 btime: float | None):
        if not boot:
            raise CollectError("the journal cannot be read without this boot's id (proc/sys/kernel/random/boot_id)")
        self.journal = journal_module()
        self.position = position
        self.boot = boot.replace("-", "").lower()
        self.btime = btime
        self.directories = directories(host, cfg)
        self.malformed = 0  # never: every journal entry is a record
        self.unframed = 0
        self._events = EventParser()
        self._reader: Any = None
        self.directory = ""
        self._open(self._holding_this_boot())

    @property
    def source(self) -> str:
        return f"the journal in {self.directory}"

    def _holding_this_boot(self) -> str:
        """The first configured directory whose journal has a kernel record of this boot."""
        looked = []
        for directory in self.directories:
            if not os.path.isdir(directory):
                looked.append(f"{directory}: no such directory")
                continue
            try:
                reader = self._reader_of(directory)
            except CollectError as e:
                looked.append(str(e))
                continue
            try:
                reader.seek_head()
                if reader._next():
                    return directory
            except OSError as e:
                looked.append(f"{directory}: {e.strerror or e}")
                continue
            finally:
                reader.close()
            looked.append(f"{directory}: no kernel record of this boot")
        raise CollectError(f"no journal holds kernel records of this boot ({'; '.join(looked) or 'no directory'})")

    def _reader_of(self, directory: str) -> Any:
        try:
            reader = self.journal.Reader(path=directory)
        except OSError as e:
            raise CollectError(f"cannot read the journal in {directory}: {e.strerror or e}") from None
        reader.add_match(_TRANSPORT="kernel", _BOOT_ID=self.boot)
        reader.add_disjunction()
        reader.add_match(MESSAGE_ID=MISSED_MESSAGE_ID, _TRANSPORT="driver", _BOOT_ID=self.boot)  # journald's own
        return reader

    def _open(self, directory: str) -> None:
        """Read `directory` from just after the position's cursor; from this boot's first record (each
        record then checked against the position's keys) when there is none or it is rejected (its entry
        vacuumed away, or a cursor of the other directory)."""
        reader = self._reader_of(directory)
        cursor = self.position.cursor
        self._trusted = False  # every entry read is new (a valid cursor), or only those the keys do not know
        if cursor:
            try:
                reader.seek_cursor(cursor)
                self._trusted = bool(reader._next()) and reader.test_cursor(cursor)
            except (OSError, ValueError):
                self._trusted = False
        if not self._trusted:
            reader.seek_head()
        if self._reader is not None:
            self._reader.close()
        self._reader, self.directory = reader, directory

    def wait(self, timeout: float) -> None:
        """Until the journal changed (inotify), or `timeout` seconds. Files added or removed (a
        rotation, a vacuum, journald moving this boot from /run to /var) may mean an earlier
        directory now holds the boot: then it is read from there on."""
        if self._reader.wait(max(0.0, timeout)) == self.journal.INVALIDATE:
            first = self._first_holding()
            if first is not None and first != self.directory:
                self._open(first)

    def _first_holding(self) -> str | None:
        try:
            return self._holding_this_boot()
        except CollectError:
            return None

    def read_new(self) -> tuple[int, int, int | None, list[KernelEvent]]:
        """(records, overwritten, None, events) for what the journal gained since the previous call."""
        reader, position = self._reader, self.position
        overwritten, read = 0, False
        counted: list[tuple[int | None, str]] = []
        events: list[KernelEvent] = []
        for _ in range(MAX_RECORDS_PER_READ):
            if not reader._next():
                break
            read = True
            fields = reader._get_all()  # one call for every field: cheaper than one per field
            transport = _text(fields, "_TRANSPORT")
            if transport != "kernel":  # journald's note of a gap; a user's look-alike has another transport
                missed = _MISSED.search(_text(fields, "MESSAGE") or "") if transport == "driver" else None
                overwritten += int(missed.group(1)) if missed else 0
                continue
            record = self._record(fields, reader)
            text = record.message if not record.facility else ""  # as the kmsg follower keys it
            if not self._trusted and position.seen(record.monotonic_us, text):
                continue
            counted.append((record.monotonic_us, text))
            events.extend(self._events.feed(record))
        events.extend(self._events.flush())
        if read:
            position.cursor, position.seq = reader._get_cursor(), None
        position.read(counted)
        return len(counted), overwritten, None, events

    def _record(self, fields: dict[str, Any], reader: Any) -> KernelRecord:
        """An entry's fields as the record /dev/kmsg gave journald: its text, level, facility, stamp (the
        kmsg microseconds, _SOURCE_MONOTONIC_TIMESTAMP) and the device dictionary."""
        us = _number(fields, "_SOURCE_MONOTONIC_TIMESTAMP")
        if us is not None and self.btime is not None:
            wall = self.btime + us / 1e6
        else:
            wall = reader._get_realtime() / 1e6
        dictionary = {name: value for name, field in (("SUBSYSTEM", "_KERNEL_SUBSYSTEM"), ("DEVICE", "_KERNEL_DEVICE"))
                      if (value := _text(fields, field)) is not None}
        priority = _number(fields, "PRIORITY")
        return KernelRecord(_text(fields, "MESSAGE") or "", None, us, wall,
                            priority if priority is not None and priority <= 7 else None, dictionary,
                            _number(fields, "SYSLOG_FACILITY"))

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _text(fields: dict[str, Any], name: str) -> str | None:
    value = fields.get(name)
    if isinstance(value, list):  # a field an entry holds twice: the first
        value = value[0] if value else None
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _number(fields: dict[str, Any], name: str) -> int | None:
    text = _text(fields, name)
    return int(text) if text is not None and text.isdigit() and len(text) <= 20 else None
