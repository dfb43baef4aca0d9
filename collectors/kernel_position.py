"""Where this boot's kernel log was read up to, so that no record is counted twice, whatever the source.

/dev/kmsg numbers its records (a sequence number); the systemd journal does not keep that number but
gives each entry a cursor. Each is a position only for the source that wrote it last: after a switch
(the daemon restarted on the other source, or a journal cursor that was vacuumed away), the records
are keyed instead by (microseconds since boot, hash of the text), which both sources carry for every
kernel record: journald stores the kmsg stamp as _SOURCE_MONOTONIC_TIMESTAMP and the text unescaped.
The highest stamp read is kept, with the keys of the records in the last second below it: a record
below that window, or with a key in it, was read before. (The window, not the highest stamp alone,
because records of two CPUs can reach the log with stamps a little out of order.)

The state file keeps a Position per boot (nodehealth/kernel_stream.py).
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

RECENT_US = 1_000_000  # keys kept below the highest stamp: records this far out of order are still told apart
MAX_RECENT = 512  # and at most this many of them (a flood's second): the window then starts at the oldest kept

_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


def text_key(text: str, kmsg_escaped: bool = False) -> str:
    """A short hash of a record's text as journald stores it. /dev/kmsg escapes every byte that is not
    printable ASCII, and the backslash, as \\xNN; journald undoes that, so kmsg text is unescaped first."""
    data = text.encode("utf-8", "surrogateescape")
    if kmsg_escaped and b"\\x" in data:
        data = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), data)
        data = data.decode("utf-8", "replace").encode("utf-8")
    return hashlib.blake2b(data, digest_size=8).hexdigest()


@dataclass
class Position:
    seq: int | None = None  # the last /dev/kmsg sequence number read; None once the journal was read after it
    cursor: str | None = None  # the journal cursor of the last entry read; None once /dev/kmsg was read after it
    high_us: int | None = None  # the highest stamp (microseconds since boot) read, from either source
    recent: list[tuple[int, str]] = field(default_factory=list)  # (stamp, text_key) of the records near it

    def seen(self, us: int | None, text: str, kmsg_escaped: bool = False) -> bool:
        """Whether a record was read before, by its key (for a source whose own position is lost). A
        record without a stamp cannot be told apart: it counts. The text is hashed only when the stamp
        falls in the window."""
        if us is None or not self.recent or us > self.recent[-1][0]:
            return False
        return us < self.recent[0][0] or (us, text_key(text, kmsg_escaped)) in self.recent

    def read(self, records: Sequence[tuple[int | None, str]], kmsg_escaped: bool = False) -> None:
        """Records were read (counted), (stamp, text) in the order read: keep the keys of those in the
        window below the highest stamp; only those are hashed."""
        stamped = [(us, text) for us, text in records if us is not None]
        if not stamped:
            return
        high = max(us for us, _ in stamped)
        self.high_us = high if self.high_us is None else max(self.high_us, high)
        floor = self.high_us - RECENT_US
        near = [(us, text_key(text, kmsg_escaped)) for us, text in stamped[-MAX_RECENT:] if us >= floor]
        self.recent = sorted([r for r in self.recent if r[0] >= floor] + near)[-MAX_RECENT:]

    def copy(self) -> Position:
        return Position(self.seq, self.cursor, self.high_us, list(self.recent))

    def dump(self) -> dict[str, Any]:
        return {"last_seq": self.seq, "journal_cursor": self.cursor, "high_us": self.high_us,
                "recent": [[us, key] for us, key in self.recent]}

    @classmethod
    def load(cls, saved: dict[str, Any]) -> Position:
        """From a state file's `kmsg` section (its types checked by kernel_stream.KernelEvents.validate)."""
        recent = [(int(us), str(key)) for us, key in saved.get("recent", [])[-MAX_RECENT:]]
        return cls(saved.get("last_seq"), saved.get("journal_cursor"), saved.get("high_us"), sorted(recent))
