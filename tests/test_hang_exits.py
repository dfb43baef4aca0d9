"""Exit statuses of ranks from the kernel's process events connector (nodehealth.hang.exits)."""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import time

import pytest
from conftest import IN_CI

from nodehealth.hang import exits


def event(pid: int, tgid: int, status: int, what: int = exits.PROC_EVENT_EXIT) -> bytes:
    """One netlink datagram as the kernel sends it for a process event."""
    body = struct.pack("=IIQ", what, 0, 0) + struct.pack("=IIIIII", pid, tgid, status, 17, 1, 1)
    cn = struct.pack("=IIIIHH", exits.CN_IDX_PROC, exits.CN_VAL_PROC, 0, 0, len(body), 0) + body
    return struct.pack("=IHHII", 16 + len(cn), exits.NLMSG_DONE, 0, 0, 0) + cn


@pytest.mark.parametrize("status,said", [
    (3 << 8, "exit code 3"),
    (0, "exit code 0"),
    (signal.SIGKILL, "killed by SIGKILL"),
    (signal.SIGSEGV | 0x80, "killed by SIGSEGV (core dumped)"),
    (0x7f, "wait status 0x7f"),  # stopped: not an end, said as it is
])
def test_a_wait_status_in_words(status, said):
    assert exits.describe(status) == said


def test_exits_are_parsed_from_datagrams_and_thread_ends_are_not_process_ends():
    assert exits.exits(event(42, 42, 3 << 8)) == [(42, 3 << 8)]
    assert exits.exits(event(43, 42, 0)) == [], "a thread of 42 ending is not 42 ending"
    assert exits.exits(event(42, 42, 0, what=0x00000001)) == [], "a fork is no exit"
    assert exits.exits(event(42, 42, 9) + event(7, 7, 3 << 8)) == [(42, 9), (7, 3 << 8)]
    assert exits.exits(event(42, 42, 9)[:30]) == [], "a truncated datagram is ignored"
    assert exits.exits(b"\xff" * 8) == []


def test_watcher_keeps_the_status_of_watched_processes_only():
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("CI runs as root: the process events connector must be reachable")
        pytest.skip("needs root (CAP_NET_ADMIN) for the process events connector")
    watcher = exits.ExitWatcher()
    assert watcher.start(), watcher.error
    try:
        procs = [subprocess.Popen(["sh", "-c", "read x; exit 3"], stdin=subprocess.PIPE) for _ in range(3)]
        watcher.watch({procs[0].pid, procs[1].pid})
        procs[0].stdin.close()  # exits 3
        procs[1].kill()
        procs[2].stdin.close()  # exits 3, but nobody asked
        for p in procs:
            p.wait()
        deadline = time.monotonic() + 5
        while len(watcher.statuses) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watcher.status(procs[0].pid) == "exit code 3"
        assert watcher.status(procs[1].pid) == "killed by SIGKILL"
        assert watcher.status(procs[2].pid) is None and procs[2].pid not in watcher.statuses
        assert watcher.status(None) is None
    finally:
        watcher.close()
    assert not watcher.thread.is_alive()


def test_watcher_that_may_not_listen_says_why(monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(exits.socket, "socket", refuse)
    monkeypatch.setattr(exits, "_namespace", lambda kind: None)  # not known: the socket decides
    monkeypatch.setattr(exits, "_capabilities", lambda: None)
    watcher = exits.ExitWatcher()
    assert watcher.start() is False
    assert watcher.error == "the kernel's process events connector is not available: Operation not permitted"
    assert watcher.status(1234) is None


def test_watcher_outside_the_hosts_pid_namespace_says_so(monkeypatch):
    """There the kernel accepts the request and sends nothing: better say it than wait forever."""
    monkeypatch.setattr(exits, "_namespace", lambda kind: 4026532000 if kind == "pid" else None)
    watcher = exits.ExitWatcher()
    assert watcher.start() is False and watcher.sock is None
    assert watcher.error == "not in the host's pid namespace (hostPID in a pod)"


def test_watcher_without_net_admin_says_so(monkeypatch):
    monkeypatch.setattr(exits, "_namespace", lambda kind: None)
    monkeypatch.setattr(exits, "_capabilities", lambda: 0x1fffeffffff & ~(1 << exits.CAP_NET_ADMIN))
    watcher = exits.ExitWatcher()
    assert watcher.start() is False and watcher.sock is None
    assert watcher.error == "without the NET_ADMIN capability"
