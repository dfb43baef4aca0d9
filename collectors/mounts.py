"""Network and FUSE mounts, and whether each still answers a stat before a deadline.

A hung NFS server or a dead FUSE daemon leaves every process that touches the mount stuck in
uninterruptible sleep (D state); a training job stalls in its checkpoint or data loader and no
timeout of its own fires. We find such mounts in /proc/self/mountinfo and stat each mount point in
a thread of its own: a stat still running at the deadline means the mount is unresponsive. That
thread cannot be cancelled, so it is remembered and the next pass waits on it again instead of
piling a new stuck thread onto the same mount.
"""
from __future__ import annotations

import errno
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from nodehealth.collectors import CollectError
from nodehealth.host import HostPaths, read_text
from nodehealth.model import Metric

NAME = "mounts"
DEFAULTS: dict = {
    # Mount points that must be mounted (e.g. /home, /datasets); probed whatever their type.
    "paths": [],
    # A stat that has not returned after this long marks the mount unresponsive.
    "timeout_seconds": 5.0,
    # Filesystem types to probe besides NETWORK_FSTYPES and FUSE (e.g. "panfs", "orangefs").
    "fstypes": [],
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "paths": ("mount points that must be mounted (e.g. `/home`, `/datasets`); probed whatever their type. A missing "
              "one is `MountMissing`"),
    "timeout_seconds": ("a `stat` of a mount point that has not returned after this long makes it unresponsive; "
                        "must be below `daemon.collector_timeout_seconds`"),
    "fstypes": "filesystem types to probe besides the network ones and FUSE (e.g. `panfs`, `orangefs`)",
}

# Filesystems served over the network (or by another machine) whose stat blocks when the server
# does. 9p is here because its server is another process or host too (virtio-9p shares in VM and
# sandbox guests, 9p over TCP): when that side stops answering, a stat blocks just like on NFS.
NETWORK_FSTYPES = frozenset((
    "9p", "beegfs", "ceph", "cifs", "glusterfs", "gpfs", "lustre", "nfs", "nfs4", "smb3", "wekafs",
))
# FUSE: "fuse", "fuse.<subtype>" (fuse.sshfs, fuse.s3fs, fuse.glusterfs ...) and "fuseblk" (a FUSE
# daemon over a block device, e.g. ntfs-3g): each dies with its daemon (ENOTCONN), whatever it serves.
FUSE_FSTYPES = frozenset(("fuse", "fuseblk"))

MAX_PROBE_THREADS = 16  # probes in flight at once, stuck ones from earlier passes included

# The kernel writes space, tab, newline and backslash in paths as \040, \011, \012 and \134.
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")
_DEVICE_NUMBER = re.compile(r"\d+:\d+")


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/<pid>/mountinfo, the parts we use."""

    mountpoint: str
    fstype: str
    source: str


@dataclass(frozen=True)
class Mount:
    mountpoint: str
    fstype: str  # "" for a configured path that is not mounted
    source: str  # e.g. "10.0.0.5:/export/home", "user@host:/data"; "" when not mounted
    mounted: bool  # in the mount table (a configured path may not be)
    configured: bool  # named in the `paths` setting
    responsive: bool | None  # the stat returned in time; None when not probed (every probe slot stuck)
    error: str | None  # errno name when the stat failed: ESTALE, EIO, ENOTCONN, ENOENT, ...
    latency_seconds: float | None  # how long the stat took, or for an unresponsive mount how long it has waited
    # False when the stat was refused on the way, before it reached the mount (a directory the agent may not
    # search): no answer from the mount, so `responsive` is None
    reached: bool = True


@dataclass(frozen=True)
class Mounts:
    mounts: tuple[Mount, ...]  # sorted by mount point
    bad_lines: int = 0  # mount table lines that could not be parsed (their mounts are not probed)
    first_bad_line: str = ""  # the first of them, bounded, for the message
    # Local block devices and where they are mounted, (kernel name, mount point) such as ("nvme0n1p1", "/data"):
    # the storage check names the mount point of a disk the kernel log reports errors on.
    block_devices: tuple[tuple[str, str], ...] = ()
    # Why no mount point could be reached at all: the host's root, seen through /proc/1/root, refused us
    # (the kernel lets a process through only when it may ptrace the host's init). Nothing was probed.
    unreachable: str | None = None


def supported(host: HostPaths, cfg: dict):
    if not os.path.exists(host.proc("self", "mountinfo")):
        return "no /proc/self/mountinfo (procfs not mounted)"
    return None


def unescape(field: str) -> str:
    """Undo the kernel's octal escapes (`\\040` is a space)."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def _parse_line(line: str) -> MountEntry | None:
    """`id parent major:minor root mountpoint options [optional...] - fstype source superoptions`."""
    fields = line.split(" ")
    try:
        separator = fields.index("-", 6)
    except ValueError:
        return None
    if len(fields) < separator + 3:
        return None
    if not (fields[0].isdigit() and fields[1].isdigit() and _DEVICE_NUMBER.fullmatch(fields[2])):
        return None
    mountpoint = unescape(fields[4])
    fstype = unescape(fields[separator + 1])
    if not mountpoint.startswith("/") or not fstype:
        return None
    return MountEntry(mountpoint, fstype, unescape(fields[separator + 2]))


def parse_mountinfo(text: str, path: str) -> tuple[tuple[MountEntry, ...], list[str]]:
    """Every mount, in table order, and the lines that could not be parsed ("line N: text").

    One odd line (a mount point the kernel printed empty) is skipped and counted, so the other
    mounts are still judged; the check names the skipped lines, since one could be the mount that
    hangs. A table where no line parses is no mount table: that fails the collector.
    """
    entries = []
    bad: list[str] = []
    # Only "\n" ends a line: the kernel escapes it in paths, but not other line breaks that
    # str.splitlines() would split on (a FUSE mount point may contain U+2028).
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        entry = _parse_line(line)
        if entry is None:
            bad.append(f"line {number}: {line[:100]!r}")
        else:
            entries.append(entry)
    if bad and not entries:
        raise CollectError(f"{path} has no mountinfo line ({len(bad)} unparsed, the first {bad[0]})")
    return tuple(entries), bad


def is_watched(fstype: str, extra_fstypes) -> bool:
    return (fstype in NETWORK_FSTYPES or fstype in FUSE_FSTYPES or fstype.startswith("fuse.")
            or fstype in extra_fstypes)


def select(entries: tuple[MountEntry, ...], paths, extra_fstypes) -> list[tuple[MountEntry, bool, bool]]:
    """(entry, mounted, configured) for each mount to probe, one per mount point.

    The last entry for a mount point wins: it is the one on top, the one a stat reaches.
    """
    table = {e.mountpoint: e for e in entries}
    wanted = {_normalize(p) for p in paths}
    chosen = [(e, True, e.mountpoint in wanted) for e in table.values()
              if is_watched(e.fstype, extra_fstypes) or e.mountpoint in wanted]
    chosen += [(MountEntry(p, "", ""), False, True) for p in sorted(wanted - set(table))]
    return sorted(chosen, key=lambda item: item[0].mountpoint)


def _normalize(path: str) -> str:
    return os.path.normpath("/" + str(path).lstrip("/"))


class _Probe:
    """One stat of one path in its own thread; the thread outlives the pass when the stat hangs."""

    def __init__(self, path: str, stat: Callable[[str], object], slots: threading.BoundedSemaphore):
        self.path = path
        self.started = time.monotonic()
        self.finished: float | None = None
        self.error: str | None = None
        self.reached = True
        self.done = threading.Event()
        self._stat = stat
        self._slots = slots  # the semaphore this probe holds a slot of, released when the stat returns
        self.thread = threading.Thread(target=self._run, name=f"mount-probe {path}", daemon=True)

    def _run(self) -> None:
        try:
            self._stat(self.path)
        except OSError as e:
            self.error = errno.errorcode.get(e.errno, f"errno {e.errno}") if e.errno else type(e).__name__
            if e.errno in REFUSED:
                self.reached = not _refused(self._stat, os.path.join(os.path.dirname(self.path), "."))
        except Exception as e:  # e.g. ValueError for a path with a NUL byte: a fact, not a crash
            self.error = type(e).__name__
        finally:
            self.finished = time.monotonic()
            self.done.set()
            self._slots.release()


REFUSED = (errno.EACCES, errno.EPERM)


def _refused(stat: Callable[[str], object], path: str) -> bool:
    """Whether a stat of `path` is refused. Used on `<parent of a mount point>/.` after the mount point's
    own stat was refused: looking up "." needs the same search permission on the parent as the mount
    point did, so a refused "." means the walk was stopped on the way, not by the mount."""
    try:
        stat(path)
    except OSError as e:
        return e.errno in REFUSED
    except Exception:
        return False
    return False


_SLOTS = threading.BoundedSemaphore(MAX_PROBE_THREADS)
_STUCK: dict[str, _Probe] = {}  # path -> probe still in its stat at the end of a pass
_LOCK = threading.Lock()


def _start(path: str, stat: Callable[[str], object], deadline: float) -> _Probe | None:
    """A probe of `path`: the one still stuck from an earlier pass, a new one, or None when no slot freed in time."""
    with _LOCK:
        stuck = _STUCK.get(path)
    if stuck is not None and not stuck.done.is_set():
        return stuck
    if not _SLOTS.acquire(timeout=max(0.0, deadline - time.monotonic())):
        return None
    probe = _Probe(path, stat, _SLOTS)
    try:
        probe.thread.start()
    except RuntimeError:  # the process is out of threads
        _SLOTS.release()
        return None
    return probe


def probe_paths(paths: list[str], timeout: float,
                stat: Callable[[str], object] = os.stat) -> dict[str, _Probe | None]:
    """Stat every path in parallel; all of them together wait at most about `timeout` seconds."""
    deadline = time.monotonic() + timeout
    probes = {path: _start(path, stat, deadline) for path in paths}
    for probe in probes.values():
        if probe is not None:
            probe.done.wait(max(0.0, deadline - time.monotonic()))
    with _LOCK:
        for path, probe in probes.items():
            if probe is None:
                continue
            if probe.done.is_set():
                if _STUCK.get(path) is probe:
                    del _STUCK[path]
            else:
                _STUCK[path] = probe
    return probes


def _mount(entry: MountEntry, mounted: bool, configured: bool, probe: _Probe | None, now: float) -> Mount:
    if probe is None:
        return Mount(entry.mountpoint, entry.fstype, entry.source, mounted, configured, None, None, None)
    if probe.done.is_set():
        return Mount(entry.mountpoint, entry.fstype, entry.source, mounted, configured, True if probe.reached else None,
                     probe.error, probe.finished - probe.started, probe.reached)
    return Mount(entry.mountpoint, entry.fstype, entry.source, mounted, configured, False, None,
                 now - probe.started)


def mount_namespace(host: HostPaths) -> tuple[str, Callable[[str], str]]:
    """The mount table to read and where its mount points are reachable from here.

    On a host mounted under a root (the DaemonSet: --root /host with hostPID) our own table is the
    pod's; the host's is its init process's, and the host's files are seen through /proc/1/root.
    Elsewhere (the host itself, or a fixture folder): our own table, mount points under the root.
    """
    if host.is_live and host.root != "/":
        return host.proc("1", "mountinfo"), lambda mountpoint: host.proc("1", "root", mountpoint.lstrip("/"))
    return host.proc("self", "mountinfo"), host.rootfs


def collect(host: HostPaths, cfg: dict, stat: Callable[[str], object] = os.stat) -> Mounts:
    """`stat` is the probe; tests pass one that hangs or fails to stand in for a dead server."""
    settings = {**DEFAULTS, **cfg}
    path, locate = mount_namespace(host)
    entries, bad = parse_mountinfo(read_text(path), path)
    chosen = select(entries, settings["paths"], {str(t) for t in settings["fstypes"]})
    targets = [locate(entry.mountpoint) for entry, _, _ in chosen]
    unreachable = _host_root_refused(host, locate) if chosen else None
    if unreachable is not None:
        return Mounts(tuple(_mount(entry, mounted, configured, None, 0.0) for entry, mounted, configured in chosen),
                      len(bad), f"{path} {bad[0]}" if bad else "", block_devices(entries), unreachable)
    probes = probe_paths(targets, float(settings["timeout_seconds"]), stat)
    now = time.monotonic()
    return Mounts(tuple(_mount(entry, mounted, configured, probes[target], now)
                        for (entry, mounted, configured), target in zip(chosen, targets)),
                  len(bad), f"{path} {bad[0]}" if bad else "", block_devices(entries))


def _host_root_refused(host: HostPaths, locate: Callable[[str], str]) -> str | None:
    """Why the host's root cannot be entered where the mount points are reached from (through
    /proc/1/root in a pod), or None. /proc is no network file system: this stat cannot hang."""
    root = locate("/")
    if root == host.rootfs("/"):
        return None  # the mount points are plain paths here
    try:
        os.stat(root)
    except OSError as e:
        if e.errno in REFUSED:
            return f"{root}: {e.strerror}"
    return None


MAX_BLOCK_DEVICES = 256  # bounded: a node with thousands of loop mounts keeps the first ones


def block_devices(entries: tuple[MountEntry, ...]) -> tuple[tuple[str, str], ...]:
    """(kernel device name, mount point) of every mount of a /dev/ block device, first mount of each."""
    seen: dict[str, str] = {}
    for entry in entries:
        if entry.source.startswith("/dev/") and len(seen) < MAX_BLOCK_DEVICES:
            seen.setdefault(os.path.basename(entry.source), entry.mountpoint)
    return tuple(seen.items())


def metrics(facts: Mounts) -> list[Metric]:
    responsive = Metric("nodehealth_mount_responsive",
                        "1 if the mount point answered a stat before the deadline, 0 if the stat was still hanging.",
                        labels=("mountpoint", "fstype"))
    latency = Metric("nodehealth_mount_probe_seconds",
                     "Seconds the last stat of the mount point took, or has been hanging so far.",
                     labels=("mountpoint", "fstype"))
    for m in facts.mounts:
        if m.responsive is not None:
            responsive.add((m.mountpoint, m.fstype), 1 if m.responsive else 0)
        latency.add((m.mountpoint, m.fstype), m.latency_seconds)
    bad = Metric("nodehealth_mount_table_unparsed_lines",
                 "Lines of the mount table that could not be parsed in the last pass; their mounts were not probed.")
    bad.add((), facts.bad_lines)
    return [responsive, latency, bad]
