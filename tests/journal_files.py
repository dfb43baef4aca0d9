"""Real journal files for the tests, written by systemd's own tools: entries in the journal export format
(what journald stores for a /dev/kmsg record, field by field) fed to `systemd-journal-remote --output=FILE`,
which appends them to FILE as journald would to its own. A kmsg fixture file becomes the journal of the
same records, so one machine can be read both ways and compared."""
from __future__ import annotations

import os
import re
import struct
import subprocess

from conftest import unavailable

JOURNAL_REMOTE = ("/usr/lib/systemd/systemd-journal-remote", "/lib/systemd/systemd-journal-remote")
MACHINE_ID = "3d1219c7c4c5404aaa1f6d2a48adfda4"
_KMSG = re.compile(r"(\d+),(\d+),(\d+),[^;]*;(.*)")


def journal_remote() -> str:
    for path in JOURNAL_REMOTE:
        if os.access(path, os.X_OK):
            return path
    unavailable("systemd-journal-remote is not installed (.ci/run installs systemd-journal-remote)")
    raise AssertionError("unreachable")


def kernel_entry(message: str, us: int, boot: str, priority: int = 6, facility: int = 0, btime: float = 1.7e9,
                 device: str | None = None, subsystem: str | None = None) -> dict[str, str]:
    """What journald writes for one /dev/kmsg record (journald-kmsg.c): the unescaped text, its level and
    facility, the kmsg stamp as _SOURCE_MONOTONIC_TIMESTAMP, and the record's device dictionary."""
    entry = {"__REALTIME_TIMESTAMP": str(int(btime * 1e6) + us), "__MONOTONIC_TIMESTAMP": str(us + 150),
             "_BOOT_ID": boot.replace("-", ""), "_MACHINE_ID": MACHINE_ID, "_HOSTNAME": "gpu-node",
             "_TRANSPORT": "kernel", "PRIORITY": str(priority), "SYSLOG_FACILITY": str(facility),
             "SYSLOG_IDENTIFIER": "kernel", "_SOURCE_MONOTONIC_TIMESTAMP": str(us), "MESSAGE": message}
    if subsystem:
        entry["_KERNEL_SUBSYSTEM"] = subsystem
    if device:
        entry["_KERNEL_DEVICE"] = device
    return entry


def missed_entry(count: int, us: int, boot: str, btime: float = 1.7e9) -> dict[str, str]:
    """journald's own note of a gap in /dev/kmsg's sequence numbers (a driver message, not the kernel's)."""
    return {"__REALTIME_TIMESTAMP": str(int(btime * 1e6) + us), "__MONOTONIC_TIMESTAMP": str(us),
            "_BOOT_ID": boot.replace("-", ""), "_MACHINE_ID": MACHINE_ID, "_HOSTNAME": "gpu-node",
            "_TRANSPORT": "driver", "PRIORITY": "6", "MESSAGE_ID": "e9bf28e6e834481bb6f48f548ad13606",
            "MESSAGE": f"Missed {count} kernel messages"}


def kmsg_entries(path: str, boot: str, btime: float) -> list[dict[str, str]]:
    """The journal entries journald would have written for the records of a /dev/kmsg-format file."""
    entries: list[dict[str, str]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith(" ") and entries and "=" in line:
                key, _, value = line.strip().partition("=")
                entries[-1]["_KERNEL_" + key] = value
                continue
            m = _KMSG.fullmatch(line)
            if m:
                prio = int(m.group(1))
                text = re.sub(r"\\x([0-9a-f]{2})", lambda e: chr(int(e.group(1), 16)), m.group(4))
                entries.append(kernel_entry(text, int(m.group(3)), boot, prio & 7, prio >> 3, btime))
    return entries


def export(entries: list[dict[str, str]]) -> bytes:
    """The journal export format: FIELD=value lines, binary-safe for a value with a newline."""
    out = []
    for entry in entries:
        for key, value in entry.items():
            data = value.encode()
            out.append(key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n" if b"\n" in data
                       else key.encode() + b"=" + data + b"\n")
        out.append(b"\n")
    return b"".join(out)


def write_journal(file: str, entries: list[dict[str, str]]) -> str:
    """Append `entries` to the journal file `file` (created with its directory when absent)."""
    os.makedirs(os.path.dirname(file), exist_ok=True)
    done = subprocess.run([journal_remote(), f"--output={file}", "-"], input=export(entries),
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return file


def machine_journal(root: str, name: str = "system.journal", volatile: bool = False) -> str:
    """The path of a journal file under a machine root, where journald keeps it."""
    base = os.path.join(root, "run/log/journal" if volatile else "var/log/journal", MACHINE_ID)
    return os.path.join(base, name)
