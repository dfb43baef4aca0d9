"""Where the host's files are, and how to read them without hanging or reading forever.

Every path a collector opens goes through HostPaths, so `--root DIR` replays a whole machine
from a fixture folder (like node_exporter's --path.procfs / --path.sysfs).
"""
from __future__ import annotations

import errno
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator

DEFAULT_READ_LIMIT = 4 << 20  # no procfs/sysfs file we parse is anywhere near 4 MiB
# Descriptors a KeptFiles holds at most: a quarter of the open-file limit, never more than this. Only
# the infiniband collector keeps files (one KeptFiles a host), and the daemon leaves that budget out of
# what its listeners share, so that the reserve for its own work stays whole (Daemon._fit_descriptors).
KEPT_FILES_MAX = 1024
# A directory modified this shortly before it was listed may change again without its modification
# time changing (the kernel's file times come from a clock that ticks every few milliseconds): it is
# listed again at the next read (KeptFiles).
SETTLED_SECONDS = 1.0
SYSFS_RECHECK_SECONDS = 60.0  # how long a look at the mount table for the host's sysfs holds


def kept_files_budget(open_files_limit: int) -> int:
    """Descriptors a KeptFiles may hold under this open-file limit."""
    if open_files_limit == resource.RLIM_INFINITY:
        return KEPT_FILES_MAX
    return min(KEPT_FILES_MAX, open_files_limit // 4)


class HostPaths:
    """Roots of procfs, sysfs, /dev and the root filesystem.

    With root="/" these are the live host. With a fixture folder, `proc/`, `sys/` and `dev/`
    inside it stand in for the real ones.
    """

    def __init__(self, root: str = "/", procfs: str | None = None, sysfs: str | None = None,
                 devfs: str | None = None):
        self.root = os.path.abspath(root)
        self.procfs = procfs or os.path.join(self.root, "proc")
        self.sysfs = sysfs or os.path.join(self.root, "sys")
        self.devfs = devfs or os.path.join(self.root, "dev")
        self._live: bool | None = None
        self._sysfs_checked: tuple[float, bool] | None = None  # (monotonic time, mounted) of the last look
        self._kept: dict[str, KeptFiles] = {}

    def kept(self, owner: str) -> KeptFiles:
        """The files `owner` (a collector) reads pass after pass through descriptors kept open."""
        kept = self._kept.get(owner)
        if kept is None:
            kept = self._kept.setdefault(owner, KeptFiles())
        return kept

    @property
    def is_live(self) -> bool:
        """A running host: "/" itself, or the host's filesystems mounted under a root (the DaemonSet
        mounts them at /host), told apart from a fixture folder by a real procfs at root/proc."""
        if self._live is None:
            self._live = self.root == "/" or _is_mount(self.procfs, "proc")
        return self._live

    def sysfs_missing(self) -> str | None:
        """Why a live host's sysfs is not at `sysfs`, or None. Every running Linux host has a sysfs, so
        on a live host a missing one is a missing mount (the DaemonSet without /host/sys), and the
        collectors that read it cannot judge: unknown, never "this host has no PCI devices". A fixture
        folder without sys/ is a machine recorded without it."""
        if not self.is_live:
            return None
        checked = self._sysfs_checked  # every /sys collector asks, twice a pass: the mount table is read
        now = time.monotonic()         # once a SYSFS_RECHECK_SECONDS (hundreds of lines under Kubernetes)
        if checked is None or now - checked[0] >= SYSFS_RECHECK_SECONDS:
            checked = self._sysfs_checked = (now, _is_mount(self.sysfs, "sysfs"))
        if checked[1]:
            return None
        return (f"no sysfs mounted at {self.sysfs}, so this host's devices cannot be seen: mount the host's /sys "
                "there read-only")

    def proc(self, *parts: str) -> str:
        return os.path.join(self.procfs, *parts)

    def sys(self, *parts: str) -> str:
        return os.path.join(self.sysfs, *parts)

    def dev(self, *parts: str) -> str:
        return os.path.join(self.devfs, *parts)

    def rootfs(self, path: str) -> str:
        """A host path such as a mount point, relocated under the root."""
        return os.path.join(self.root, path.lstrip("/"))

    def now(self) -> float:
        """The machine's wall clock. A replayed machine's "now" is its own (btime + uptime from
        its proc/), so event windows and timestamps are those of the moment it was captured."""
        if self.is_live:
            return time.time()
        btime = uptime = None
        stat_text = read_attr(self.proc("stat")) or ""
        for line in stat_text.splitlines():
            if line.startswith("btime "):
                btime = _number(line[6:])
        uptime_text = (read_attr(self.proc("uptime")) or "").split()
        if uptime_text:
            uptime = _number(uptime_text[0])
        if btime is None or uptime is None:
            return time.time()
        return btime + uptime

    def __repr__(self) -> str:
        return f"HostPaths(root={self.root!r})"


def _is_mount(path: str, fstype: str) -> bool:
    """Whether a file system of `fstype` is mounted at `path` (this process's mount table says so)."""
    try:
        text = read_text("/proc/self/mountinfo")
    except OSError:
        return False
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) > 4 and fields[4] == path and f" - {fstype} " in line:
            return True
    return False


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def read_bytes(path: str, limit: int = DEFAULT_READ_LIMIT, single: bool = False) -> bytes:
    """Read a file with bounded, non-blocking reads.

    O_NONBLOCK keeps a FIFO with no writer (or a driver file that never answers) from blocking:
    it reads as empty or fails with EAGAIN. Reads stop at EOF or at `limit` bytes. `single` does
    one read, which is how sysfs attributes are meant to be read (and saves a syscall per file).
    Raises OSError with the path in it.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return read_fd(fd, limit, path, single)
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int, path: str, single: bool = False) -> bytes:
    """Read an open descriptor to EOF or `limit` bytes (one read with `single`); errors name `path`."""
    chunks = []
    total = 0
    while total < limit:
        try:
            chunk = os.read(fd, min(65536, limit - total))
        except BlockingIOError:
            raise OSError(errno.EAGAIN, "read would block", path) from None
        except OSError as e:
            raise OSError(e.errno, e.strerror, path) from None
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if single:
            break
    return b"".join(chunks)


def read_text(path: str, limit: int = DEFAULT_READ_LIMIT, single: bool = False) -> str:
    """read_bytes decoded leniently: kernel files are ASCII, but garbage must not raise."""
    return read_bytes(path, limit, single).decode("utf-8", "replace")


def read_attr(path: str) -> str | None:
    """One sysfs attribute, stripped; None when the file is absent or unreadable.

    Absent is not zero: callers keep None distinct from a value. Attributes that the driver
    refuses to produce (EINVAL, EOPNOTSUPP, EAGAIN, ...) also read as None.
    """
    opened = _open_attr(path)
    if opened is None:
        return None
    os.close(opened[0])
    return opened[1].decode("utf-8", "replace").strip()


def _open_attr(path: str, dir_fd: int | None = None) -> tuple[int, bytes] | None:
    """An attribute opened (relative to `dir_fd` if given) and read once (read_text(path, 65536,
    single=True) inlined: collectors read hundreds of these a pass): its descriptor, still open, and what
    it read; None when either failed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return fd, os.read(fd, 65536)
    except OSError:
        os.close(fd)
        return None


class KeptFiles:
    """Directories of integer attributes (IB counters/), and attributes read by name (a port's state and
    rate), read pass after pass through descriptors kept open between passes: a read at offset 0 runs a
    sysfs attribute's show() again, and costs a quarter to a third of open, read and close
    (benchmarks/RESULTS.md).

    read_texts gives the named files of a directory as read_attr does (stripped; None where absent or
    unreadable); a file whose kept descriptor fails to read is opened again, and one that cannot be
    read is not kept.

    read_int_dir gives every file of a directory, one read each: a file that does not hold a decimal
    number (`N/A (no PMA)`) or cannot be read is None; an absent or vanished directory is an empty dict.
    Files are opened relative to the directory's descriptor (no path walk per file), and:

    - the directory is listed again when its modification time is not the one of the last listing,
      or was within SETTLED_SECONDS before it (a coarse clock could give the next change the same
      time): a file that went is no longer read (its descriptor is closed), a new one is opened.
      sysfs keeps a counter directory's files for its device's life (and answers a read of one that
      went ENODEV, which lists it again), so a pass reads without listing: a third of the collector's
      cost on the H100 fixture (benchmarks/RESULTS.md);
    - a directory that is no longer the one its files were opened in (another inode: a device that
      went and came back, a folder replaced) has its files opened again;
    - a kept descriptor whose read fails (sysfs answers ENODEV once its device is gone) is closed and
      the file opened again; a file that cannot be read is not kept;
    - at most kept_files_budget() descriptors are kept; past it files are opened and closed at each
      read (a limit of 0 keeps nothing). sweep() closes the directories not read since the last sweep.
    """

    def __init__(self, limit: int | None = None):
        self._limit = limit  # None: set at the first read, from the open-file limit then (the daemon raises it)
        self._lock = threading.Lock()  # one collector's reads at a time, but a --root host may be shared
        self._dirs: dict[str, _KeptDir] = {}  # by path
        self._read: set[str] = set()  # directories read since the last sweep
        self.count = 0  # descriptors held

    def read_texts(self, directory: str, names: tuple[str, ...]) -> dict[str, str | None]:
        with self._lock:
            looked = self._look(directory)
            if looked is None:
                return dict.fromkeys(names)
            files = looked[0].files
            out: dict[str, str | None] = {}
            for name in names:
                fd = files.get(name)
                if fd is not None:
                    try:
                        out[name] = os.pread(fd, 65536, 0).decode("utf-8", "replace").strip()
                        continue
                    except OSError:
                        self._close_file(files, name)  # opened again below
                out[name] = self._open_text(directory + "/" + name, files, name)
            return out

    def _open_text(self, path: str, files: dict[str, int], name: str) -> str | None:
        opened = _open_attr(path)
        if opened is None:
            return None
        self._keep(files, name, opened[0])
        return opened[1].decode("utf-8", "replace").strip()

    def _keep(self, files: dict[str, int], name: str, fd: int) -> None:
        """A descriptor just opened and read: kept within the budget, else closed."""
        if self.count < self._limit:
            files[name] = fd
            self.count += 1
        else:
            os.close(fd)

    def _look(self, directory: str) -> tuple[_KeptDir, os.stat_result] | None:
        """The directory's kept files and its stat now (read: not swept); None, its files closed, when it is gone."""
        if self._limit is None:
            self._limit = kept_files_budget(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self._read.add(directory)
        try:
            st = os.stat(directory)
        except OSError:
            self._close(directory)
            return None
        return self._kept_dir(directory, st), st

    def read_int_dir(self, directory: str, skip: frozenset = frozenset()) -> dict[str, int | None]:
        with self._lock:
            looked = self._look(directory)
            if looked is None:
                return {}
            kept, st = looked
            if kept.whole and kept.settled and st.st_mtime_ns == kept.mtime_ns:  # no file came or went
                values = _read_whole(kept)
                if values is not None:
                    return values
            try:
                dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                self._close(directory)
                return {}
            try:
                return self._read_dir(directory, dir_fd, skip)
            finally:
                os.close(dir_fd)

    def _kept_dir(self, directory: str, st: os.stat_result) -> _KeptDir:
        """The directory's kept files; none yet where it is another inode than they were opened in."""
        kept = self._dirs.get(directory)
        if kept is not None and kept.identity != (st.st_dev, st.st_ino):
            self._close(directory)
            kept = None
        if kept is None:
            kept = self._dirs[directory] = _KeptDir((st.st_dev, st.st_ino))
        return kept

    def _read_dir(self, directory: str, dir_fd: int, skip: frozenset) -> dict[str, int | None]:
        st = os.fstat(dir_fd)  # the directory opened, which may be another than the one looked at
        kept = self._kept_dir(directory, st)
        listed_at = time.time()
        try:
            names = sorted(os.listdir(dir_fd))
        except OSError:
            self._close(directory)
            return {}
        kept.mtime_ns, kept.settled = st.st_mtime_ns, listed_at - st.st_mtime_ns / 1e9 > SETTLED_SECONDS
        if names == kept.listed and kept.whole:  # every file kept, as at the last read
            values = _read_whole(kept)
            if values is not None:
                return values
        files = kept.files
        for name in set(files).difference(names):
            self._close_file(files, name)
        out: dict[str, int | None] = {}
        for name in names:
            if name in skip:
                continue
            fd = files.get(name)
            if fd is not None:
                try:
                    data = os.pread(fd, 4096, 0)
                except OSError:
                    self._close_file(files, name)  # opened again below
                else:
                    out[name] = _int_or_none(data)
                    continue
            opened = _open_attr(name, dir_fd)
            out[name] = None if opened is None else _int_or_none(opened[1])
            if opened is not None:
                self._keep(files, name, opened[0])
        kept.listed, kept.whole = names, len(files) == len(out) and None not in out.values()
        return out

    def sweep(self) -> None:
        """Close the directories not read since the last sweep (a device that went)."""
        with self._lock:
            for directory in set(self._dirs).difference(self._read):
                self._close(directory)
            self._read.clear()

    def close(self) -> None:
        with self._lock:
            for directory in list(self._dirs):
                self._close(directory)

    def __del__(self) -> None:
        self.close()

    def _close(self, directory: str) -> None:
        kept = self._dirs.pop(directory, None)
        if kept is not None:
            for name in list(kept.files):
                self._close_file(kept.files, name)

    def _close_file(self, files: dict[str, int], name: str) -> None:
        os.close(files.pop(name))
        self.count -= 1


class _KeptDir:
    """One directory's kept files, and its listing when they were read."""

    __slots__ = ("identity", "files", "listed", "mtime_ns", "settled", "whole")

    def __init__(self, identity: tuple[int, int]):
        self.identity = identity  # (st_dev, st_ino): another inode is another directory
        self.files: dict[str, int] = {}  # name -> descriptor
        self.listed: list[str] = []  # the names at the last listing
        self.mtime_ns = -1  # the directory's modification time at the last listing
        self.settled = False  # that time was over SETTLED_SECONDS before the listing
        self.whole = False  # every file kept and a number: the next read of the same names is one loop


def _read_whole(kept: _KeptDir) -> dict[str, int] | None:
    """Every kept file of a directory whose files are all kept and numbers, in one tight loop; None when a
    read fails (a file went: sysfs answers ENODEV) or a value is no number: the caller reads file by file."""
    try:
        return {name: int(os.pread(fd, 4096, 0)) for name, fd in kept.files.items()}
    except (OSError, ValueError):
        return None


def _int_or_none(data: bytes) -> int | None:
    try:
        return int(data)
    except ValueError:
        return None


def list_dir(path: str) -> Iterator[str]:
    """Sorted names in a directory; nothing when it is absent (a vanished device is not an error)."""
    try:
        names = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return iter(())
    return iter(sorted(names))


def parse_key_values(text: str) -> dict[str, int]:
    """`name value` lines (vmstat, meminfo without units) to a dict; lines that do not parse are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            try:
                out[parts[0].rstrip(":")] = int(parts[1])
            except ValueError:
                continue
    return out


def write_atomic(path: str, data: bytes, durable: bool = False, mode: int = 0o644) -> None:
    """Write a file so that readers never see it torn: a temporary file in the same directory, then
    a rename. `durable` also fsyncs the file and its directory, for state that must survive a crash."""
    import tempfile  # only writers pay for it; `nodehealth check` writes nothing

    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        try:
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError:
            pass


def boot_id(host: HostPaths) -> str | None:
    return read_attr(host.proc("sys", "kernel", "random", "boot_id"))


def hostname(host: HostPaths) -> str:
    name = read_attr(host.proc("sys", "kernel", "hostname"))
    if name:
        return name
    return os.uname().nodename if host.is_live else os.path.basename(host.root)


def addresses(name: str) -> set[str]:
    """The addresses a name resolves to now; none when it does not (a name too long for DNS raises
    UnicodeError, not OSError)."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        return set()
