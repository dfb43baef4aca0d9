"""Exit statuses of training ranks, from the kernel's process events connector.

A rank that dies by SIGKILL, os._exit or a crash writes nothing, and it is not the daemon's child,
so only its parent could reap its status. The kernel's proc connector (netlink) announces every
process exit with its wait status to a listener with CAP_NET_ADMIN in the host's PID and network
namespaces (the DaemonSet's hostPID and hostNetwork): the detector listens on one thread and keeps
the status of the processes it watches, and says "exit code not known" where it could not listen.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import struct
import threading

log = logging.getLogger(__name__)

NETLINK_CONNECTOR = 11
CN_IDX_PROC = CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN, PROC_CN_MCAST_IGNORE = 1, 2
PROC_EVENT_EXIT = 0x80000000
NLMSG_DONE = 3
SO_RCVBUFFORCE = 33
NL_HEADER, CN_HEADER, EVENT_HEADER = 16, 20, 16  # nlmsghdr, cn_msg, proc_event before its union
RCVBUF = 4 << 20  # a busy node ends thousands of processes a second; the thread must not fall behind
# The kernel reports process events only to listeners in its initial PID and user namespaces, whose
# inode numbers are fixed (include/linux/proc_ns.h); it ignores a request from any other.
INIT_NAMESPACES = {"pid": 0xEFFFFFFC, "user": 0xEFFFFFFD}
CAP_NET_ADMIN = 12
KEPT = 4096  # statuses kept, oldest dropped: only watched processes are kept at all


class ExitWatcher:
    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.thread: threading.Thread | None = None
        self.watched: frozenset[int] = frozenset()
        self.statuses: dict[int, int] = {}  # host pid -> wait status, first exit after it was watched
        self.error: str | None = None  # why statuses are not known, once start failed
        self.lost = False  # the socket overflowed once: some exits were missed (said once in the log)

    def start(self) -> bool:
        """Subscribe to exit events; False (and `error` says why) when this host or we may not."""
        if self.sock is not None:
            return True
        foreign = [ns for ns, inode in INIT_NAMESPACES.items() if _namespace(ns) not in (inode, None)]
        if foreign:  # the kernel would accept the request and silently send nothing
            self.error = f"not in the host's {' and '.join(foreign)} namespace (hostPID in a pod)"
            return False
        caps = _capabilities()
        if caps is not None and not caps & (1 << CAP_NET_ADMIN):  # refused, and silently too
            self.error = "without the NET_ADMIN capability"
            return False
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_CONNECTOR)
        except OSError as e:  # no CONFIG_CONNECTOR, or not Linux
            self.error = f"the kernel's process events connector is not available: {e.strerror or e}"
            return False
        try:
            with contextlib.suppress(OSError):  # needs CAP_NET_ADMIN; the default buffer is only smaller
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
            sock.bind((0, CN_IDX_PROC))
            sock.send(_control(PROC_CN_MCAST_LISTEN))
        except OSError as e:
            sock.close()
            self.error = f"cannot listen to process exits (root in the host's PID and network namespaces): " \
                         f"{e.strerror or e}"
            return False
        sock.settimeout(0.5)
        self.sock = sock
        self.thread = threading.Thread(target=self._read, name="nodehealth-exits", daemon=True)
        self.thread.start()
        return True

    def watch(self, pids: set[int]) -> None:
        """The host pids whose exits to keep from now on (each scan's live ranks)."""
        self.watched = frozenset(pids)

    def status(self, pid: int | None) -> str | None:
        """How process `pid` ended, in words, or None when not known."""
        status = self.statuses.get(pid) if pid else None
        return None if status is None else describe(status)

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.send(_control(PROC_CN_MCAST_IGNORE))
        if self.thread is not None:
            self.thread.join(2)
        sock.close()

    def _read(self) -> None:
        while True:
            sock = self.sock
            if sock is None:
                return
            try:
                data = sock.recv(65536)
            except socket.timeout:
                continue
            except OSError as e:
                if e.errno == errno.ENOBUFS:  # we fell behind and the kernel dropped events
                    if not self.lost:
                        self.lost = True
                        log.warning("hang: process exits came faster than read; some exit codes will be missing")
                    continue
                if self.sock is not None:
                    self.error = f"reading process exits failed: {e.strerror or e}"
                    log.warning("hang: %s", self.error)
                return
            for pid, status in exits(data):
                if pid in self.watched and pid not in self.statuses:
                    if len(self.statuses) >= KEPT:
                        self.statuses.pop(next(iter(self.statuses)))
                    self.statuses[pid] = status


def exits(data: bytes) -> list[tuple[int, int]]:
    """(pid, wait status) of every process (thread-group leader) exit in one netlink datagram."""
    out = []
    offset = 0
    while offset + NL_HEADER <= len(data):
        length = struct.unpack_from("=I", data, offset)[0]
        if length < NL_HEADER or offset + length > len(data):
            break
        body = offset + NL_HEADER + CN_HEADER
        if length >= NL_HEADER + CN_HEADER + EVENT_HEADER + 16:
            what = struct.unpack_from("=I", data, body)[0]
            if what == PROC_EVENT_EXIT:
                pid, tgid, status, _ = struct.unpack_from("=IIII", data, body + EVENT_HEADER)
                if pid == tgid:  # a thread's own end is not the process's
                    out.append((tgid, status))
        offset += (length + 3) & ~3
    return out


def describe(status: int) -> str:
    """A wait status in words: "exit code 3", "killed by SIGKILL"."""
    if os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)}"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}" + (" (core dumped)" if os.WCOREDUMP(status) else "")
    return f"wait status {status:#x}"


def _control(op: int) -> bytes:
    payload = struct.pack("=I", op)
    cn = struct.pack("=IIIIHH", CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(payload), 0) + payload
    return struct.pack("=IHHII", NL_HEADER + len(cn), NLMSG_DONE, 0, 0, os.getpid()) + cn


def _namespace(kind: str) -> int | None:
    try:
        return os.stat(f"/proc/self/ns/{kind}").st_ino
    except OSError:
        return None


def _capabilities() -> int | None:
    """This process's effective capabilities, None when /proc does not say."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            return next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
