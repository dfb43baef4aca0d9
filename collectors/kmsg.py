"""The kernel log: /dev/kmsg, the systemd journal's copy of it (collectors/journal.py), or saved logs
from a dead node, read into records, then events.

Long on purpose: one reader for /dev/kmsg, its follower and every saved-log framing; they share the
record parser and its bounds, and the framings are told apart line by line.

/dev/kmsg hands out one record per read(2) and never blocks with O_NONBLOCK; EPIPE means the
ring buffer overwrote records before we read them, which is counted, never fatal. Saved logs
come in many framings (dmesg, dmesg -T, journalctl, syslog, Talos, pstore); each line is
recognised on its own, so a file that mixes them still reads.
"""
from __future__ import annotations

import calendar
import collections
import errno
import io
import os
import re
import select
import stat
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from nodehealth.collectors import CollectError, journal
from nodehealth.collectors.kernel_events import (
    KINDS,
    SXID,
    XID,
    EventParser,
    KernelEvent,
    KernelRecord,
)
from nodehealth.collectors.kernel_position import Position
from nodehealth.host import HostPaths, boot_id, parse_key_values, read_text
from nodehealth.model import Metric

NAME = "kmsg"
DEFAULTS: dict = {
    # Saved kernel logs to read instead of /dev/kmsg (CLI --kernel-log), e.g. from a sosreport.
    "files": [],
    # Where this boot's kernel log is read: auto (/dev/kmsg if it opens, else the systemd journal that
    # holds this boot's kernel records), kmsg, or journal.
    "source": "auto",
    # The journal directories, under --root, in order: the first that holds this boot is read.
    "journal_directories": ["/var/log/journal", "/run/log/journal"],
}
# When the kernel log cannot be read, its checks give one finding together (engine.py), not one each.
FAILED_REASON = "KernelLogUnreadable"
FIX = ("mount the host's /var/log and /run/log read-only under the root on a node that runs journald (the base "
       "DaemonSet does), or run the agent privileged (the kernel-log-privileged component); on a host, run it as "
       "root (deploy/README.md, \"The kernel log\")")

MEANINGS = {  # what each key means, in docs/configuration.md
    "files": "saved kernel logs to read instead of `/dev/kmsg` (flag `--kernel-log`)",
    "source": "where this boot's kernel log is read: `auto` (`/dev/kmsg` if it opens, else the systemd journal "
              "that holds this boot's kernel records), `kmsg` or `journal`; where none can be read, one "
              "`KernelLogUnreadable` finding ([deploy](../deploy/README.md#the-kernel-log))",
    "journal_directories": "the journal directories, under `--root`, in order: the first that holds kernel records "
                           "of this boot is read (needs python3-systemd)",
}

MAX_RECORDS_PER_READ = journal.MAX_RECORDS_PER_READ  # a flood of records cannot keep one read going forever
MAX_READS = 100  # reads of one `check`: a log that never stops growing is judged on what came first
MAX_EVENTS = 10000  # events kept of one boot (`check` and the daemon): the oldest go first
# A regular file without inotify is polled: every 10 ms while it grows, backing off to 1 s while idle.
FILE_POLL_SECONDS = (0.01, 1.0)
MAX_LINE_BYTES = 64 * 1024  # longer lines keep their head; the rest is skipped
MAX_HOSTS = 64  # node names kept from a saved log's prefixes: enough to name them, bounded for a hostile file
KMSG_READ_SIZE = 16384  # above the kernel's 8 KiB record limit; a smaller buffer gets EINVAL


@dataclass(frozen=True)
class KernelLog:
    source: str  # /dev/kmsg, the journal directory, or the saved log files read
    boot_id: str | None  # None for saved logs (their boot is not this one)
    records: int
    overwritten: int  # records the ring buffer overwrote before they were read
    malformed: int  # lines that were not text (binary, garbled) and were skipped
    last_seq: int | None  # highest kmsg sequence number read
    events: tuple[KernelEvent, ...]  # in log order
    unframed: int = 0  # lines in no known framing, kept as plain messages


def supported(host: HostPaths, cfg: dict) -> str | None:
    """A running host always has a kernel log: where it cannot be read, its checks say unknown. A
    fixture folder has one when it holds a dev/kmsg or a journal directory."""
    source = cfg.get("source", "auto")
    if cfg.get("files") or host.is_live:
        return None
    if source != "journal" and os.path.exists(host.dev("kmsg")):
        return None
    if source != "kmsg" and any(os.path.isdir(d) for d in journal.directories(host, cfg)):
        return None
    return "no kernel log: no /dev/kmsg, no journal directory, and no saved log was given"


def deadline(cfg: dict, default: float) -> float | None:
    """Saved logs (`check --kernel-log`) have none: their size is the user's, and a partial read
    would judge a log that is not the one given. /dev/kmsg keeps the engine's."""
    return None if cfg.get("files") else default


class Follower(Protocol):
    """A reader of this boot's kernel log that the daemon follows (KmsgFollower, journal.JournalFollower)."""

    source: str  # what it reads, for messages
    position: Position  # how far it has read (the follower moves it)
    malformed: int
    unframed: int

    def read_new(self) -> tuple[int, int, int | None, list[KernelEvent]]:
        """(records, overwritten, last kmsg sequence number, events) of what came since the last call."""

    def wait(self, timeout: float) -> None:
        """Until a record may be there, or `timeout` seconds."""

    def close(self) -> None: ...


def open_follower(host: HostPaths, cfg: dict, position: Position | None = None) -> Follower:
    """This boot's kernel log, from the source `collectors.kmsg.source` names, read from `position` on.
    CollectError saying why none could be opened, and what fixes it."""
    source = cfg.get("source", "auto")
    position = Position() if position is None else position
    why = []
    if source in ("auto", "kmsg"):
        try:
            return KmsgFollower(host, cfg, position)
        except OSError as e:
            why.append(f"cannot read {host.dev('kmsg')}: {e.strerror or e}")
    if source in ("auto", "journal"):
        try:
            return journal.JournalFollower(host, cfg, position, boot_id(host), boot_time(host))
        except CollectError as e:
            why.append(str(e))
    raise CollectError(f"{'; and '.join(why)}. To fix: {FIX}")


def collect(host: HostPaths, cfg: dict) -> KernelLog:
    files = list(cfg.get("files") or [])
    if files:
        return _collect_files(files)
    follower = open_follower(host, cfg)
    records = overwritten = 0
    events: collections.deque[KernelEvent] = collections.deque(maxlen=MAX_EVENTS)
    try:
        for _ in range(MAX_READS):
            count, lost, _, new = follower.read_new()
            records, overwritten = records + count, overwritten + lost
            events.extend(new)
            if count < MAX_RECORDS_PER_READ:
                break
    except OSError as e:
        raise CollectError(f"cannot read {follower.source}: {e.strerror or e}") from None
    finally:
        follower.close()
    return KernelLog(source=follower.source, boot_id=boot_id(host), records=records, overwritten=overwritten,
                     malformed=follower.malformed, last_seq=follower.position.seq, events=tuple(events),
                     unframed=follower.unframed)


def metrics(facts: KernelLog) -> list[Metric]:
    records = Metric("nodehealth_kernel_log_records_total",
                     "Kernel log records read from the ring buffer, the systemd journal or the saved logs.", "counter")
    records.add((), facts.records)
    overwritten = Metric("nodehealth_kernel_log_overwritten_records_total",
                         "Kernel log records the ring buffer overwrote before they could be read "
                         "(by us, or by journald).",
                         "counter")
    overwritten.add((), facts.overwritten)
    malformed = Metric("nodehealth_kernel_log_malformed_lines_total",
                       "Kernel log lines skipped because they were not text.", "counter")
    malformed.add((), facts.malformed)
    unframed = Metric("nodehealth_kernel_log_unframed_lines_total",
                      "Saved kernel log lines in no known framing, read as plain messages.", "counter")
    unframed.add((), facts.unframed)
    by_kind = Metric("nodehealth_kernel_events_total", "Kernel log events found, by kind.", "counter",
                     labels=("kind",))
    counts = {kind: 0 for kind in KINDS}
    xids: dict[tuple[str, str], int] = {}
    sxids: dict[tuple[str, str], int] = {}
    for e in facts.events:
        counts[e.kind] = counts.get(e.kind, 0) + 1
        if e.kind == XID:
            key = (e.device, str(e.code))
            xids[key] = xids.get(key, 0) + 1
        elif e.kind == SXID:
            key = (e.device, str(e.code))
            sxids[key] = sxids.get(key, 0) + 1
    for kind in sorted(counts):
        by_kind.add((kind,), counts[kind])
    xid = Metric("nodehealth_gpu_xid_events_total",
                 "NVIDIA GPU Xid errors in the kernel log, by GPU PCI bus id and Xid code.", "counter",
                 labels=("pci_bus_id", "xid"))
    for key in sorted(xids, key=_code_order):
        xid.add(key, xids[key])
    sxid = Metric("nodehealth_nvswitch_sxid_events_total",
                  "NVSwitch SXid errors in the kernel log, by NVSwitch PCI bus id and SXid code.", "counter",
                  labels=("pci_bus_id", "sxid"))
    for key in sorted(sxids, key=_code_order):
        sxid.add(key, sxids[key])
    return [records, overwritten, malformed, unframed, by_kind, xid, sxid]


def _code_order(key: tuple[str, str]) -> tuple[str, int]:
    return key[0], int(key[1]) if key[1].isdigit() else -1


# Reading /dev/kmsg --------------------------------------------------------------------------

_SEQ = re.compile(rb"\d{1,10},(\d{1,20}),")


def read_kmsg(read: Callable[[int], bytes], limit: int = MAX_RECORDS_PER_READ,
              last_seq: int | None = None) -> tuple[list[bytes], int]:
    """Raw records from /dev/kmsg until none is left (EAGAIN) or `limit` were read.

    `read` is os.read on the open descriptor (a seam for tests). Returns the records and how
    many were overwritten: after EPIPE the gap in sequence numbers, at least one per EPIPE.
    """
    records: list[bytes] = []
    overwritten = 0
    lost = False
    for _ in range(2 * limit + 1):  # EPIPE answers count too: a broken reader cannot spin forever
        if len(records) >= limit:
            break
        try:
            data = read(KMSG_READ_SIZE)
        except BlockingIOError:
            break
        except BrokenPipeError:
            if lost:
                overwritten += 1
            lost = True
            continue
        if not data:
            break
        m = _SEQ.match(data)
        seq = int(m.group(1)) if m else None
        if lost:
            gap = seq - last_seq - 1 if seq is not None and last_seq is not None else 0
            overwritten += max(gap, 1)
            lost = False
        if seq is not None:
            last_seq = seq
        records.append(data)
    if lost:
        overwritten += 1
    return records, overwritten


class KmsgFollower:
    """Reads what the kernel log gained since the last call; the daemon's stream.

    On /dev/kmsg it starts at the oldest record still in the ring; on a regular file (fixture
    machines) at its first byte, restarting at 0 when the file shrinks. Records at or below the
    position's sequence number are skipped, so a restarted daemon never counts a record twice; without
    one (the journal was read last), records the position's keys know are skipped.
    """

    source = ""

    def __init__(self, host: HostPaths, cfg: dict, position: Position | None = None):
        self.path = self.source = host.dev("kmsg")
        self.position = Position() if position is None else position
        self._after_seq = self.position.seq
        self._lines = LogLines(btime=boot_time(host))
        self._events = EventParser()
        self._device = stat.S_ISCHR(os.stat(self.path).st_mode)
        self._fd: int | None = None
        self._poll = None
        self._read_seq: int | None = None  # last sequence read from the device, skipped or not
        self._offset = 0
        self._watch: _FileWatch | None = None
        self._idle = FILE_POLL_SECONDS[0]
        if self._device:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self._poll = select.poll()
            self._poll.register(self._fd, select.POLLIN)
        else:
            _open_log(self.path).close()  # a file we may not read fails here, as the device does
            try:
                self._watch = _FileWatch(self.path)
            except (OSError, AttributeError):  # no inotify (instances used up, not Linux): poll with back-off
                self._watch = None

    @property
    def last_seq(self) -> int | None:
        return self.position.seq

    @property
    def malformed(self) -> int:
        return self._lines.malformed

    @property
    def unframed(self) -> int:
        return self._lines.unframed

    def wait(self, timeout: float) -> None:
        """Until a record may be there, or `timeout` seconds: poll on /dev/kmsg, inotify on a file,
        else a sleep that backs off while the file stays idle."""
        if self._poll is not None:
            self._poll.poll(max(0.0, timeout) * 1000)
        elif self._watch is not None:
            self._watch.wait(timeout)
        elif timeout > 0:
            time.sleep(min(timeout, self._idle))
            self._idle = min(FILE_POLL_SECONDS[1], self._idle * 2)

    def read_new(self) -> tuple[int, int, int | None, list[KernelEvent]]:
        """(records, overwritten, last_seq, events) for what arrived since the previous call."""
        if self._device:
            records, overwritten = self._device_records()
        else:
            records, overwritten = self._file_records(), 0
        position = self.position
        by_keys = self._after_seq is None  # no sequence number to go by (the journal was read last, or nothing)
        counted: list[tuple[int | None, str]] = []
        events: list[KernelEvent] = []
        for record in records:
            text = record.message if not record.facility else ""  # journald rewrites what userspace wrote
            if record.seq is not None:
                if self._after_seq is not None and record.seq <= self._after_seq:
                    continue
                position.seq = record.seq if position.seq is None else max(position.seq, record.seq)
            if by_keys and position.seen(record.monotonic_us, text, kmsg_escaped=True):
                continue
            counted.append((record.monotonic_us, text))
            events.extend(self._events.feed(record))
        events.extend(self._events.flush())
        if records:
            position.cursor = None  # the journal's cursor no longer says where we are
        position.read(counted, kmsg_escaped=True)
        count = len(counted)
        if position.seq is not None:
            self._after_seq = position.seq
        if records:
            self._idle = FILE_POLL_SECONDS[0]
        return count, overwritten, position.seq, events

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._poll = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def _device_records(self) -> tuple[list[KernelRecord], int]:
        fd = self._fd
        if fd is None:
            raise OSError(errno.EBADF, "kernel log follower is closed", self.path)
        raw, overwritten = read_kmsg(lambda n: os.read(fd, n), MAX_RECORDS_PER_READ, self._read_seq)
        records: list[KernelRecord] = []
        for data in raw:
            for line in data.decode("utf-8", "replace").split("\n"):
                records.extend(self._lines.feed(line))
            m = _SEQ.match(data)
            if m:
                self._read_seq = int(m.group(1))
        records.extend(self._lines.flush())
        return records, overwritten

    def _file_records(self) -> list[KernelRecord]:
        size = os.stat(self.path).st_size
        if size < self._offset:
            self._offset = 0  # truncated or replaced: read it again from the start
        if size == self._offset:
            return []
        records: list[KernelRecord] = []
        with _open_log(self.path) as f:
            f.seek(self._offset)
            for line, end in bounded_lines(f, final=False):
                records.extend(self._lines.feed(line.decode("utf-8", "replace")))
                self._offset = end
                if len(records) >= MAX_RECORDS_PER_READ:
                    break
        records.extend(self._lines.flush())
        return records


class _FileWatch:
    """inotify on a log file (through ctypes: no dependency), so an idle follower sleeps until the
    file changes instead of waking on a timer. The watch is renewed after each change: a file
    replaced by a rename is a new inode."""

    _MASK = 0x2 | 0x4 | 0x8 | 0x400 | 0x800  # IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_DELETE_SELF, IN_MOVE_SELF
    _FLAGS = os.O_NONBLOCK | os.O_CLOEXEC  # IN_NONBLOCK and IN_CLOEXEC have these values

    def __init__(self, path: str):
        import ctypes

        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.inotify_init1(self._FLAGS)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.fd, self.path = fd, os.fsencode(path)
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        if self._libc.inotify_add_watch(fd, self.path, self._MASK) < 0:
            errno_value = ctypes.get_errno()
            os.close(fd)
            raise OSError(errno_value, "inotify_add_watch failed", path)

    def wait(self, timeout: float) -> None:
        if self._poll.poll(max(0.0, timeout) * 1000):
            try:
                while os.read(self.fd, 4096):  # drain: the events only say "look again"
                    pass
            except BlockingIOError:
                pass
        # Renewed every time (the same inode keeps its one watch): a file deleted and created again
        # is watched again once it exists.
        self._libc.inotify_add_watch(self.fd, self.path, self._MASK)

    def close(self) -> None:
        os.close(self.fd)


def boot_time(host: HostPaths) -> float | None:
    """Boot time (epoch seconds) from /proc/stat `btime`; None when it cannot be read."""
    try:
        value = parse_key_values(read_text(host.proc("stat"))).get("btime")
    except OSError:
        return None
    return float(value) if value is not None else None


# Saved logs ----------------------------------------------------------------------------------

def _collect_files(paths: list[str]) -> KernelLog:
    lines = LogLines()
    parser = EventParser()
    events: list[KernelEvent] = []
    records = 0
    last_seq: int | None = None
    for path in paths:
        before, unframed, malformed = records, lines.unframed, lines.malformed
        for record in _saved_records(path, lines):
            records += 1
            if record.seq is not None:
                last_seq = record.seq if last_seq is None else max(last_seq, record.seq)
            events.extend(parser.feed(record))
        events.extend(parser.flush())
        framed = records - before - (lines.unframed - unframed)
        if framed == 0 and (records == before or lines.malformed > malformed):
            # An empty, binary or still-compressed file: judging it would say "healthy" about nothing.
            raise CollectError(f"0 records recognised in {path} ({lines.malformed - malformed} lines not text, "
                               f"{lines.unframed - unframed} in no kernel log framing)")
    if len(lines.hosts) > 1:
        # Judged together, two nodes' logs would add up their errors and merge GPUs that share a bus id.
        named = ", ".join(list(lines.hosts)[:3]) + (", ..." if len(lines.hosts) > 3 else "")
        raise CollectError(f"the kernel log of {len(lines.hosts)} nodes ({named}) in {', '.join(paths)}: a check "
                           "judges one node; give each node's lines on their own (dshbak, or grep '^NODE: ')")
    return KernelLog(source=", ".join(paths), boot_id=None, records=records, overwritten=0,
                     malformed=lines.malformed, last_seq=last_seq, events=tuple(events), unframed=lines.unframed)


def _saved_records(path: str, lines: LogLines) -> Iterator[KernelRecord]:
    """One saved log's records, streamed line by line (rotated logs may be gzip, xz or zstd)."""
    import lzma  # only saved logs pay for it

    try:
        with _open_log(path) as raw, _decompressed(raw, path) as f:
            for line, _ in bounded_lines(f, final=True):
                yield from lines.feed(line.decode("utf-8", "replace"))
    except (OSError, EOFError, lzma.LZMAError, *_zstd_errors()) as e:  # evaluated only when one is raised
        raise CollectError(f"cannot read kernel log {path}: {getattr(e, 'strerror', None) or e}") from None
    yield from lines.flush()


_GZIP_MAGIC, _XZ_MAGIC, _ZSTD_MAGIC = b"\x1f\x8b", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd"


def _decompressed(raw: BinaryIO, path: str) -> BinaryIO:
    """The file's text: told apart by its magic bytes, not its name (logrotate's .1.gz, a renamed copy)."""
    magic = raw.read(6)
    raw.seek(0)
    if magic.startswith(_GZIP_MAGIC):
        import gzip

        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if magic.startswith(_XZ_MAGIC):
        import lzma

        return lzma.LZMAFile(raw)  # type: ignore[return-value]
    if magic.startswith(_ZSTD_MAGIC):
        try:
            import zstandard
        except ImportError:
            raise CollectError(f"{path} is zstd-compressed; reading it needs the zstandard package "
                               "(pip install 'nodehealth[zstd]'), or decompress it first (zstd -d)") from None
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=False))  # type: ignore
    return raw


def _zstd_errors() -> tuple[type[BaseException], ...]:
    zstandard = sys.modules.get("zstandard")
    return (zstandard.ZstdError,) if zstandard is not None else ()


def _open_log(path: str) -> BinaryIO:
    """A regular file opened without blocking (a FIFO with no writer must not hang us)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return os.fdopen(fd, "rb")


def bounded_lines(f: BinaryIO, final: bool) -> Iterator[tuple[bytes, int]]:
    """Lines from the file's position, each at most MAX_LINE_BYTES, with the offset after each.

    Without `final`, a last line that lacks its newline is left for a later read (it may still
    be being written); with it, a file need not end in a newline.
    """
    offset = f.tell()
    while True:
        line = f.readline(MAX_LINE_BYTES)
        if not line:
            return
        if line.endswith(b"\n"):
            offset += len(line)
            yield line, offset
            continue
        if len(line) < MAX_LINE_BYTES:
            if final:
                yield line, offset + len(line)
            return
        offset += len(line)
        while True:  # an over-long line: skip its rest
            rest = f.readline(MAX_LINE_BYTES)
            offset += len(rest)
            if not rest or rest.endswith(b"\n"):
                break
        yield line, offset


# Framings ------------------------------------------------------------------------------------

# Month abbreviations: English (syslog, rsyslog, dmesg -T in the C locale) and those of other locales'
# LC_TIME (glibc's abmon, as journalctl and dmesg -T print them there), lowercase, without a final ".".
# No abbreviation names two months; an unknown one frames no time.
_MONTHS = {name: number for number, names in enumerate((
    "jan janv ene gen sty tammi led ian янв січ oca",
    "feb févr fev lut helmi úno febr фев лют şub",
    "mar mär mars mrt maalis bře márc мар бер",
    "apr avril abr kwi huhti dub ápr апр кві nis",
    "may mai mag mei maj touko kvě máj мая май тра",
    "jun juin juni giu cze kesä čen jún iun июн чер haz",
    "jul juil juli lug lip heinä čec júl iul июл лип tem",
    "aug août ago sie elo srp авг сер ağu",
    "sep sept set wrz syys zář szept сен вер eyl",
    "oct okt ott out paź loka říj окт жов eki",
    "nov lis marras ноя kas",
    "dec dez dic gru joulu pro des дек гру ara",
), 1) for name in names.split()}
_CJK_MONTH = re.compile(r"(\d{1,2})[月월]")
_MONTH = r"(?P<mon>[^\W\d_]{3,6}\.?|\d{1,2}[月월])"  # a word _month() knows, checked in code
_LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "error": 3, "warn": 4, "warning": 4, "notice": 5,
           "info": 6, "debug": 7}
_FACILITIES = ("kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|res[0-3]|local[0-7]")

# 6,3964,206764307,-;message  (flags, then optional ",caller=T12" style fields)
_KMSG = re.compile(r"(?P<prio>\d{1,10}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20}),[^;,]{0,8}(?:,[^;]{0,512})?;"
                   r"(?P<msg>.*)", re.S)
_DICTIONARY = re.compile(r"(?P<key>[A-Za-z0-9_]{1,64})=(?P<value>.*)", re.S)
# The first line of syslogd's wall message (then the message, on its own line or, pasted, on this one):
# Message from syslogd@host at Dec 10 05:25:44 ...   (rsyslog)
# Message from syslogd@host at Thu Dec 10 05:25:44 2020 ...   (sysklogd and BSD syslogd: ctime's first 24 chars)
_WALL = re.compile(r"Message from syslogd@\S{1,255} at (?:[A-Z][a-z]{2} )?(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) "
                   r"(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?: (?P<year>\d{4}))? \.\.\.(?P<rest>.*)", re.S)
# Broadcast message from systemd-journald@host (Tue 2024-06-11 10:22:33 UTC):   (journald's ForwardToWall=;
# shared/wall.c, its time as format_timestamp() writes it; the message follows after a blank line)
_JOURNALD_WALL = re.compile(r"Broadcast message from systemd-journald@\S{1,255}(?: on \S{1,64})? \((?:\S{1,12} )?"
                            r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?: \S{1,12})?\):")
# The wall message itself: " kernel:[ 123.4] text" (rsyslog), "host kernel: text" (sysklogd), "kernel: text" (journald)
_WALL_BODY = re.compile(r"(?:\S{1,255} )?kernel: ?(?P<msg>.*)", re.S)
# 192.168.11.119: kern: warning: [2026-04-22T21:27:51.288830314Z]: message   (talosctl dmesg)
_TALOS = re.compile(rf"(?P<node>\S+): (?P<fac>{_FACILITIES}): +(?P<lvl>[a-z]{{3,7}}): \[(?P<ts>[^\]]{{1,40}})\]: ?"
                    r"(?P<msg>.*)", re.S)
# kern  :warn  : rest   (dmesg --decode)
_DECODE = re.compile(rf"(?P<fac>{_FACILITIES}) *: *(?P<lvl>emerg|alert|crit|err|warn|notice|info|debug) *: ?"
                     r"(?P<rest>.*)", re.S)
_ISO_TIME = (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
_ZONE = r"(?:Z|[+-]\d\d:?\d\d)"
# 2024-11-15T05:39:15,491363+00:00 message   (dmesg --time-format iso: comma before the fraction)
_DMESG_ISO = re.compile(rf"(?P<ts>{_ISO_TIME},\d{{1,9}}{_ZONE}?) (?P<msg>.*)", re.S)
# Mon DD HH:MM:SS host tag[pid]: message   or   2025-01-02T15:20:12+0800 host tag: message; the host may be
# missing ("Feb 23 03:28:16 kernel: ...", or two spaces where it was empty), never ends in ":"
_SYSLOG = re.compile(rf"(?:(?P<iso>{_ISO_TIME}(?:\.\d{{1,9}})?{_ZONE}?)|{_MONTH} +(?P<day>\d{{1,2}}) "
                     r"(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?:\.(?P<frac>\d{1,9}))?)(?: \S{0,254}[^\s:])? +"
                     r"(?P<tag>[^\s:\[]{1,64})(?:\[\d{1,10}\])?:(?: |$)(?P<msg>.*)", re.S)
# kernel: message   (syslogd wall message's second line, or a log whose time and host were cut)
_KERNEL_TAG = re.compile(r"kernel: ?(?P<msg>.*)", re.S)
# <6>[  201.650687] message   (pstore / ERST / console)
_PSTORE = re.compile(r"<(?P<prio>\d{1,4})>\[ *(?P<sec>\d{1,12})\.(?P<frac>\d{1,9})\] ?(?P<msg>.*)", re.S)
# [  123.456789] message
_STAMP = re.compile(r"\[ *(?P<sec>\d{1,12})\.(?P<frac>\d{1,9})\] ?(?P<msg>.*)", re.S)
# [  +0.000049] message  /  [Sep26 00:30] message  /  [<    0.000045>] message   (--reltime, --delta)
_RELATIVE = re.compile(rf"\[(?: *[+-]?\d{{1,12}}\.\d{{1,9}}|{_MONTH}\d{{1,2}} \d\d:\d\d|< *\d{{1,12}}\.\d{{1,9}}>)\] ?"
                       r"(?P<msg>.*)", re.S)
# [Fri Aug 30 11:43:14 2024] message   (dmesg -T: "%a %b %e %H:%M:%S %Y", in any locale: [Fr Aug 30 ...],
# [ven. août 30 ...], [木  8月 30 ...])
_CTIME = re.compile(rf"\[[^\s\]]{{1,12}} +{_MONTH} +(?P<day>\d{{1,2}}) "
                    r"(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d) (?P<year>\d{4})\] ?(?P<msg>.*)", re.S)
# A line another tool prefixed. pdsh and clush put "host: " before each line of a node's output;
# a console server or `ts` a time column before the console's "[  123.456789]": "Jun 11 10:22:33 ",
# "2024-06-11 10:22:33 ", "[2024-06-11T10:22:33.123+02:00] ". A prefix counts only when what
# follows it is in a known framing, so ordinary "word: text" is never taken for a host.
_HOST_PREFIX = re.compile(r"(?P<host>[A-Za-z0-9][\w.-]{0,252}): (?P<rest>.*)", re.S)
# After a host prefix a bracket must be one dmesg prints (printk's "%5lu.%06lu", --reltime, -T): "name: [1.5] x"
# is a message of its own.
_DMESG_BRACKET = re.compile(r"(?:<\d{1,4}>)?\[(?:<? *[+-]?\d{1,12}\.\d{6}>?|[^\s\]]{1,12} +\S{1,12} +\d{1,2} "
                            r"\d\d:\d\d:\d\d \d{4}|[^\W\d_]{3,6}\d{1,2} \d\d:\d\d)\]")
_CONSOLE_TIME = re.compile(rf"\[?(?:(?P<iso>\d{{4}}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{{1,9}})?{_ZONE}?)|"
                           rf"{_MONTH} +(?P<day>\d{{1,2}}) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)"
                           r"(?:\.(?P<frac>\d{1,9}))?)"
                           r"\]? +(?P<rest>(?:<\d{1,4}>)?\[ *\d{1,12}\.\d{1,9}\].*)", re.S)
# [ T1946] or [    C3]: the printk caller id (CONFIG_PRINTK_CALLER)
_CALLER = re.compile(r"\[ *[TC]\d{1,10}\] ?")
_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)?")
_GARBAGE = re.compile("[\x00-\x08\x0a-\x1f\x7f\ufffd]")


@dataclass
class _Draft:
    """A record still open to continuation lines (dmesg's indented lines, kmsg's dictionary)."""

    parts: list[str]
    seq: int | None = None
    monotonic_us: int | None = None
    wall_time: float | None = None
    priority: int | None = None
    kmsg: bool = False
    dictionary: dict[str, str] = field(default_factory=dict)
    facility: int | None = None

    def record(self) -> KernelRecord:
        return KernelRecord("\n".join(self.parts), self.seq, self.monotonic_us, self.wall_time, self.priority,
                            self.dictionary, self.facility)


_SKIP = _Draft([])  # a line that starts no record: a comment, a wall header, a non-kernel syslog line, a continuation


class LogLines:
    """Lines of a kernel log in any framing, to KernelRecords; counts the lines it could not frame.

    A record is returned once the next one starts (or on flush()), because the lines after it
    may still belong to it. `btime` turns kmsg's microseconds since boot into wall time; `now`
    supplies the year that syslog time stamps leave out.
    """

    def __init__(self, btime: float | None = None, now: float | None = None):
        self.btime = btime
        self.now = time.time() if now is None else now
        self.unframed = 0
        self.malformed = 0
        self._draft: _Draft | None = None
        self._host: str | None = None  # the pdsh/clush host prefix of the open record, if it had one
        self.hosts: dict[str, None] = {}  # the nodes that pdsh/clush or talosctl prefixes named, in order (bounded)
        self._wall_time: float | None = None  # from a wall message's header, for the line after it

    def feed(self, line: str) -> list[KernelRecord]:
        line = line.rstrip("\r\n")
        if "\x07" in line:  # a wall message's bell, kept by a terminal capture
            line = line.replace("\x07", "")
        if "\r" in line:  # a terminal capture's lines end in CR LF, or LF CR (rsyslog's wall): CR ends a line too
            return [r for part in line.split("\r") for r in self.feed(part)]
        body = line.lstrip()
        if not body:
            return []
        indented = len(body) != len(line)
        wall, self._wall_time = self._wall_time, None
        draft, host = self._frame(body, wall), None
        if draft is None:
            draft, host = self._prefixed(body, wall)
        if draft is _SKIP:
            return []
        if draft is None:
            if _GARBAGE.search(line):
                self.malformed += 1
                return []
            if indented and self._draft is not None and self._host is None:
                self._continue(body)
                return []
            self.unframed += 1
            draft = _Draft([body])
        if host is not None and host not in self.hosts and len(self.hosts) < MAX_HOSTS:
            self.hosts[host] = None
        out = self.flush()
        self._draft, self._host = draft, host
        return out

    def flush(self) -> list[KernelRecord]:
        draft, self._draft, self._host = self._draft, None, None
        return [draft.record()] if draft is not None else []

    def _continue(self, body: str) -> None:
        draft = self._draft
        if draft is None:
            return
        m = _DICTIONARY.fullmatch(body) if draft.kmsg else None
        if m:
            draft.dictionary[m.group("key")] = m.group("value")
        else:
            draft.parts.append(body)

    def _prefixed(self, body: str, wall: float | None) -> tuple[_Draft | None, str | None]:
        """A line behind another tool's prefix (pdsh/clush host, console time column); (None, None) if none fits."""
        m = _HOST_PREFIX.fullmatch(body)
        if m:
            rest = m.group("rest")
            inner = rest.lstrip()
            if not inner:
                return _SKIP, None  # the tool's output of a blank line
            if not inner.startswith("#") and (inner[0] not in "[<" or _DMESG_BRACKET.match(inner)):
                draft = self._frame(inner, wall) or self._console(inner)
                if draft is not None:
                    return draft, m.group("host")
                if inner != rest and self._draft is not None and self._host == m.group("host"):
                    self._continue(inner)  # an indented continuation line of that host's record
                    return _SKIP, None
        return self._console(body), None

    def _console(self, body: str) -> _Draft | None:
        """A console capture's time column before dmesg's [uptime] (console server, `ts`)."""
        m = _CONSOLE_TIME.fullmatch(body)
        if m is None or (m.group("mon") is not None and _month(m.group("mon")) is None):
            return None
        draft = self._frame_time(m.group("rest"))
        if draft is not None:
            draft.wall_time = iso_time(m.group("iso")) if m.group("iso") else self._syslog_time(m)
        return draft

    def _frame(self, body: str, wall: float | None) -> _Draft | None:
        """The record a line starts, _SKIP for a line that is no record, None when no framing fits."""
        if body.startswith("#"):
            return _SKIP
        m = _KMSG.fullmatch(body)
        if m:
            usec = int(m.group("usec"))
            prio = int(m.group("prio"))
            return _Draft([m.group("msg")], seq=int(m.group("seq")), monotonic_us=usec, kmsg=True,
                          wall_time=self.btime + usec / 1e6 if self.btime is not None else None,
                          priority=prio & 7, facility=prio >> 3)
        if wall is not None:
            m = _WALL_BODY.fullmatch(body)
            if m:
                return _stamped(m.group("msg"), wall)
        m = _WALL.match(body)
        if m:
            month = _month(m.group("mon"))
            when = (_utc(int(m.group("year")), month, int(m.group("day")), m) if m.group("year") and month
                    else self._syslog_time(m))
            rest = m.group("rest").strip()
            if rest:  # the message on the header's line
                body_match = _WALL_BODY.fullmatch(rest)
                return _stamped(body_match.group("msg"), when) if body_match else _SKIP
            self._wall_time = when
            return _SKIP
        m = _JOURNALD_WALL.match(body)
        if m:
            self._wall_time = iso_time(m.group("ts"))
            return _SKIP
        m = _TALOS.fullmatch(body)
        if m:
            if m.group("node") not in self.hosts and len(self.hosts) < MAX_HOSTS:
                self.hosts[m.group("node")] = None
            if m.group("fac") != "kern":
                return _SKIP
            return _timed(m.group("msg"), wall_time=iso_time(m.group("ts")), priority=_LEVELS.get(m.group("lvl")))
        m = _DECODE.fullmatch(body)
        if m:
            draft = self._frame_time(m.group("rest"))
            if draft is None:
                draft = _timed(m.group("rest"))
            draft.priority = _LEVELS[m.group("lvl")]
            return draft
        m = _SYSLOG.fullmatch(body)
        if m and (m.group("iso") or _month(m.group("mon")) is not None):
            if m.group("tag") != "kernel":
                return _SKIP
            when = iso_time(m.group("iso")) if m.group("iso") else self._syslog_time(m)
            return _stamped(m.group("msg"), when)
        m = _KERNEL_TAG.fullmatch(body)
        if m:
            return _stamped(m.group("msg"), wall)
        return self._frame_time(body)

    def _frame_time(self, body: str) -> _Draft | None:
        """dmesg's own time framings: iso, [uptime], <level>[uptime], relative, ctime."""
        m = _DMESG_ISO.fullmatch(body)
        if m:
            return _stamped(m.group("msg"), iso_time(m.group("ts")))
        m = _PSTORE.fullmatch(body)
        if m:
            return _timed(m.group("msg"), monotonic_us=_micros(m.group("sec"), m.group("frac")),
                          priority=int(m.group("prio")) & 7)
        m = _STAMP.fullmatch(body)
        if m:
            return _timed(m.group("msg"), monotonic_us=_micros(m.group("sec"), m.group("frac")))
        m = _RELATIVE.fullmatch(body)
        if m:
            return _timed(m.group("msg"))
        m = _CTIME.fullmatch(body)
        if m:
            month = _month(m.group("mon"))
            return _timed(m.group("msg"), wall_time=_utc(int(m.group("year")), month, int(m.group("day")), m)
                          if month is not None else None)
        return None

    def _syslog_time(self, m: re.Match) -> float | None:
        """Syslog leaves out the year: take this year's date, or last year's if that is in the future."""
        month = _month(m.group("mon"))
        if month is None:
            return None
        year = time.gmtime(self.now).tm_year
        when = _utc(year, month, int(m.group("day")), m)
        if when is not None and when > self.now + 86400:
            when = _utc(year - 1, month, int(m.group("day")), m)
        fraction = m.groupdict().get("frac")
        return when + int(fraction) / 10 ** len(fraction) if when is not None and fraction else when


def _month(name: str) -> int | None:
    """A month's number from its abbreviation in a locale _MONTHS knows ("Dez", "févr.", "11月"); None if unknown."""
    m = _CJK_MONTH.fullmatch(name)
    if m:
        number = int(m.group(1))
        return number if 1 <= number <= 12 else None
    return _MONTHS.get(name.lower().rstrip("."))


def _timed(message: str, monotonic_us: int | None = None, wall_time: float | None = None,
           priority: int | None = None) -> _Draft:
    caller = _CALLER.match(message)
    return _Draft([message[caller.end():] if caller else message], monotonic_us=monotonic_us,
                  wall_time=wall_time, priority=priority)


def _stamped(message: str, wall_time: float | None) -> _Draft:
    """A syslog `kernel:` message, which may still carry dmesg's [uptime] stamp."""
    m = _STAMP.fullmatch(message)
    if m:
        return _timed(m.group("msg"), monotonic_us=_micros(m.group("sec"), m.group("frac")), wall_time=wall_time)
    return _timed(message, wall_time=wall_time)


def _micros(seconds: str, fraction: str) -> int:
    return int(seconds) * 1000000 + int((fraction + "000000")[:6])


def _utc(year: int, month: int, day: int, m: re.Match) -> float | None:
    """Epoch seconds of a date and the match's h/m/s groups, as UTC; None when it is no date."""
    try:
        return float(calendar.timegm((year, month, day, int(m.group("h")), int(m.group("m")), int(m.group("s")))))
    except (ValueError, OverflowError):
        return None


def iso_time(text: str) -> float | None:
    """Epoch seconds of an ISO 8601 time (`,` or `.` before the fraction, any zone; UTC if none)."""
    m = _ISO.match(text)
    if not m:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second <= 60):
        return None
    try:
        when = float(calendar.timegm((year, month, day, hour, minute, second)))
    except (ValueError, OverflowError):
        return None
    if m.group(7):
        when += int(m.group(7)) / 10 ** len(m.group(7))
    zone = m.group(8)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "+" else 1
        when += sign * (int(zone[1:3]) * 3600 + int(zone[-2:]) * 60)
    return when
