"""The limits collector: memlock rows, CapEff, and the bounded scan for processes using RDMA."""
from __future__ import annotations

import errno
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.collectors import CollectError, limits
from nodehealth.host import HostPaths

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLES = os.path.join(HERE, "fixtures", "limits")
MACHINES = os.path.join(HERE, "fixtures", "machines")

HEADER = "Limit                     Soft Limit           Hard Limit           Units     \n"


def sample(name: str) -> str:
    with open(os.path.join(SAMPLES, name), encoding="utf-8") as f:
        return f.read()


def memlock_row(soft: str, hard: str) -> str:
    return f"{'Max locked memory':<25} {soft:<20} {hard:<20} {'bytes':<10}\n"


def status_text(cap_eff: str) -> str:
    return f"Name:\tpython3\nUid:\t0\t0\t0\t0\nCapPrm:\t{cap_eff}\nCapEff:\t{cap_eff}\nCapBnd:\t000001ffffffffff\n"


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def add_process(root, pid: int, comm: str = "python3", soft: str = "65536", hard: str = "65536",
                cap_eff: str = "0000000000000000", fds=None) -> str:
    """A /proc/<pid> directory under a fixture root; fd links dangle, as device links do off the host."""
    base = os.path.join(str(root), "proc", str(pid))
    write(os.path.join(base, "comm"), comm + "\n")
    write(os.path.join(base, "limits"), HEADER + memlock_row(soft, hard))
    write(os.path.join(base, "status"), status_text(cap_eff))
    os.makedirs(os.path.join(base, "fd"), exist_ok=True)
    for fd, target in (fds if fds is not None else {"0": "/dev/null"}).items():
        os.symlink(target, os.path.join(base, "fd", fd))
    return base


def make_root(tmp_path, uverbs=("uverbs0",), self_soft="65536", self_hard="65536"):
    write(str(tmp_path / "proc" / "self" / "limits"), HEADER + memlock_row(self_soft, self_hard))
    write(str(tmp_path / "proc" / "self" / "status"), status_text("000001fffeffffff"))
    for name in uverbs:
        write(str(tmp_path / "dev" / "infiniband" / name), "")
    return HostPaths(str(tmp_path))


# --- parsing real samples ---------------------------------------------------------------------

def test_memlock_from_this_machines_real_limits():
    assert limits.parse_memlock(sample("self-vm-6.18.limits"), "x") == limits.MemlockLimit(8388608, 8388608)


def test_memlock_from_client_python_sample_ignores_its_garbled_last_row():
    limit = limits.parse_memlock(sample("client_python-26231.limits"), "x")
    assert limit == limits.MemlockLimit(65536, 65536)
    assert not limit.soft_unlimited


def test_cap_ipc_lock_from_real_status_files():
    assert limits.parse_cap_ipc_lock(sample("self-vm-6.18.status"), "x") is True  # root, CapEff 000001fffeffffff
    assert limits.parse_cap_ipc_lock(sample("client_python-26231.status"), "x") is False  # vim as uid 1000


@pytest.mark.parametrize("soft, hard, expected", [
    ("unlimited", "unlimited", limits.MemlockLimit(None, None)),
    ("65536", "unlimited", limits.MemlockLimit(65536, None)),
    ("8388608", "8388608", limits.MemlockLimit(8388608, 8388608)),
    ("0", "0", limits.MemlockLimit(0, 0)),
])
def test_memlock_values(soft, hard, expected):
    assert limits.parse_memlock(HEADER + memlock_row(soft, hard), "x") == expected


def test_unlimited_is_infinite_and_zero_is_not_unlimited():
    assert limits.MemlockLimit(None, None).soft_bytes_or_inf == math.inf
    assert limits.MemlockLimit(None, None).soft_unlimited
    assert limits.MemlockLimit(0, 0).soft_bytes_or_inf == 0.0
    assert not limits.MemlockLimit(0, 0).soft_unlimited


@pytest.mark.parametrize("text", [
    "",
    HEADER,
    HEADER + "Max locked memory         65536\n",
    HEADER + memlock_row("-1", "-1"),
    HEADER + memlock_row("64k", "64k"),
    HEADER + memlock_row("infinity", "unlimited"),
])
def test_memlock_malformed_is_a_collect_error_naming_the_file(text):
    with pytest.raises(CollectError, match="/proc/9/limits"):
        limits.parse_memlock(text, "/proc/9/limits")


@pytest.mark.parametrize("cap_eff, expected", [
    ("0000000000004000", True),  # CAP_IPC_LOCK alone
    ("00000000a80425fb", False),  # Docker's default set for root in a container
    ("000001ffffffffff", True),
    ("0000000000000000", False),
    ("0000000000003fff", False),  # bits 0..13 only
])
def test_cap_ipc_lock_bit(cap_eff, expected):
    assert limits.parse_cap_ipc_lock(status_text(cap_eff), "x") is expected


def test_a_process_name_cannot_forge_a_capability_line():
    text = "Name:\tx\x0bCapEff:\t0000000000004000\n" + status_text("0000000000000000")
    assert limits.parse_cap_ipc_lock(text, "x") is False


@pytest.mark.parametrize("text", ["Name:\tx\n", "CapEff:\tzz\n", "CapEff:\n"])
def test_cap_eff_malformed_is_a_collect_error(text):
    with pytest.raises(CollectError, match="/proc/7/status"):
        limits.parse_cap_ipc_lock(text, "/proc/7/status")


# --- the process scan on a built tree ------------------------------------------------------------

def test_scan_finds_processes_holding_uverbs_open(tmp_path):
    host = make_root(tmp_path, uverbs=("uverbs0", "uverbs1"))
    write(str(tmp_path / "dev" / "infiniband" / "rdma_cm"), "")
    add_process(tmp_path, 3127, fds={"0": "/dev/null", "17": "/dev/infiniband/uverbs1",
                                     "18": "anon_inode:[infinibandevent]", "19": "/dev/infiniband/uverbs0"})
    add_process(tmp_path, 4000, comm="sshd", fds={"0": "/dev/null", "3": "socket:[1234]"})
    add_process(tmp_path, 5000, comm="ib_write_bw", soft="unlimited", hard="unlimited", cap_eff="0000000000004000",
                fds={"3": "/dev/infiniband/uverbs0"})
    facts = limits.collect(host, {})
    assert facts.rdma_devices == ("uverbs0", "uverbs1")
    assert facts.self_memlock == limits.MemlockLimit(65536, 65536)
    assert facts.self_cap_ipc_lock is True
    assert facts.rdma_processes == (
        limits.RdmaProcess(3127, "python3", limits.MemlockLimit(65536, 65536), False, ("uverbs0", "uverbs1")),
        limits.RdmaProcess(5000, "ib_write_bw", limits.MemlockLimit(None, None), True, ("uverbs0",)),
    )
    assert not facts.scan_truncated and facts.processes_unreadable == 0


def test_non_numeric_proc_entries_are_not_processes(tmp_path):
    host = make_root(tmp_path)
    os.makedirs(tmp_path / "proc" / "sys")
    write(str(tmp_path / "proc" / "uptime"), "1.0 1.0\n")
    assert limits.collect(host, {}).rdma_processes == ()


def test_process_that_vanished_mid_scan_is_dropped(tmp_path):
    host = make_root(tmp_path)
    base = add_process(tmp_path, 200, fds={"5": "/dev/infiniband/uverbs0"})
    os.remove(os.path.join(base, "limits"))  # exited after we read its fds
    os.remove(os.path.join(base, "status"))
    add_process(tmp_path, 300, fds={"5": "/dev/infiniband/uverbs0"})
    os.makedirs(tmp_path / "proc" / "400")  # exited before we listed its fds: no fd directory
    facts = limits.collect(host, {})
    assert [p.pid for p in facts.rdma_processes] == [300]
    assert facts.processes_unreadable == 0


def test_fd_closed_while_reading_links_is_skipped(tmp_path, monkeypatch):
    host = make_root(tmp_path)
    add_process(tmp_path, 200, fds={"4": "/dev/null", "5": "/dev/infiniband/uverbs0"})
    real_readlink = os.readlink

    def readlink(path, *args, **kwargs):
        if path.endswith(os.path.join("200", "fd", "4")):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return real_readlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "readlink", readlink)
    assert [p.devices for p in limits.collect(host, {}).rdma_processes] == [("uverbs0",)]


def test_unreadable_per_process_files_give_none_not_a_failure(tmp_path):
    host = make_root(tmp_path)
    base = add_process(tmp_path, 200, fds={"5": "/dev/infiniband/uverbs0"})
    for name in ("limits", "status"):  # a directory where a file should be: read refuses it (EINVAL)
        os.remove(os.path.join(base, name))
        os.makedirs(os.path.join(base, name))
    write(os.path.join(base, "comm"), "")
    (process,) = limits.collect(host, {}).rdma_processes
    assert process.memlock is None and process.cap_ipc_lock is None
    assert process.comm == "pid 200"


def test_malformed_per_process_limits_gives_none(tmp_path):
    host = make_root(tmp_path)
    base = add_process(tmp_path, 200, fds={"5": "/dev/infiniband/uverbs0"})
    write(os.path.join(base, "limits"), "garbage\n")
    (process,) = limits.collect(host, {}).rdma_processes
    assert process.memlock is None and process.cap_ipc_lock is False


def test_fd_table_we_may_not_read_is_counted_not_raised(tmp_path, monkeypatch):
    host = make_root(tmp_path)
    add_process(tmp_path, 1, comm="systemd", fds={"3": "/dev/infiniband/uverbs0"})
    add_process(tmp_path, 300, fds={"5": "/dev/infiniband/uverbs0"})
    real_readlink = os.readlink

    def readlink(path, *args, **kwargs):
        if os.sep + os.path.join("1", "fd") + os.sep in path:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_readlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "readlink", readlink)
    facts = limits.collect(host, {})
    assert [p.pid for p in facts.rdma_processes] == [300]
    assert facts.processes_unreadable == 1


def test_scan_is_bounded_by_process_count(tmp_path):
    host = make_root(tmp_path)
    for pid in (9, 10, 100):  # numeric order, not name order: 100 is the one left out
        add_process(tmp_path, pid, fds={"3": "/dev/infiniband/uverbs0"})
    facts = limits.collect(host, {"max_processes": 2})
    assert [p.pid for p in facts.rdma_processes] == [9, 10]
    assert facts.scan_truncated


def test_scan_is_bounded_by_fd_links_read(tmp_path):
    host = make_root(tmp_path)
    add_process(tmp_path, 10, fds={str(n): "/dev/null" for n in range(10)})
    add_process(tmp_path, 20, fds={"3": "/dev/infiniband/uverbs0"})
    facts = limits.collect(host, {"max_fds": 5})
    assert facts.rdma_processes == ()
    assert facts.scan_truncated
    assert limits.collect(host, {"max_fds": 11}).rdma_processes[0].pid == 20


def test_collect_without_self_status_keeps_capability_unknown(tmp_path):
    host = make_root(tmp_path, uverbs=())
    os.remove(tmp_path / "proc" / "self" / "status")
    facts = limits.collect(host, {})
    assert facts.self_cap_ipc_lock is None and facts.rdma_devices == ()


def test_malformed_own_limits_fails_the_collector(tmp_path):
    host = make_root(tmp_path)
    write(str(tmp_path / "proc" / "self" / "limits"), "nonsense\n")
    with pytest.raises(CollectError, match="limits"):
        limits.collect(host, {})


def test_supported_needs_self_limits(tmp_path):
    assert limits.supported(HostPaths(str(tmp_path)), {}) is not None
    assert limits.supported(make_root(tmp_path), {}) is None


# --- fixture machines -------------------------------------------------------------------------

def test_small_memlock_machine():
    facts = limits.collect(HostPaths(os.path.join(MACHINES, "small-memlock")), {})
    assert facts.self_memlock == limits.MemlockLimit(65536, 65536)
    assert facts.rdma_devices == ("uverbs0",)
    assert facts.rdma_processes == (
        limits.RdmaProcess(3127, "python3", limits.MemlockLimit(65536, 65536), False, ("uverbs0",)),)


def test_h100_machine_runs_rdma_processes_unlimited():
    facts = limits.collect(HostPaths(os.path.join(MACHINES, "h100-8x-cx7")), {})
    assert facts.self_memlock.soft_unlimited
    assert len(facts.rdma_devices) == 9
    assert [p.pid for p in facts.rdma_processes] == [48213, 48214]
    assert all(p.memlock.soft_unlimited and len(p.devices) == 9 for p in facts.rdma_processes)


@pytest.mark.parametrize("name", ["plain-host", "fragmented"])
def test_hosts_without_rdma(name):
    facts = limits.collect(HostPaths(os.path.join(MACHINES, name)), {})
    assert facts.rdma_devices == () and facts.rdma_processes == ()
    assert facts.self_memlock == limits.MemlockLimit(8388608, 8388608)  # this machine's real limit


# --- metrics ----------------------------------------------------------------------------------

def _samples(facts):
    return {m.name: m.samples for m in limits.metrics(facts)}


def test_metrics_unlimited_is_plus_inf_and_min_is_absent_without_processes():
    facts = limits.Limits(limits.MemlockLimit(None, None), True, ("uverbs0",), (), 0, False)
    samples = _samples(facts)
    assert samples["nodehealth_memlock_limit_bytes"] == [(("self",), math.inf)]
    assert samples["nodehealth_rdma_processes"] == [((), 0.0)]
    assert samples["nodehealth_rdma_process_memlock_min_bytes"] == []
    assert samples["nodehealth_rdma_devices"] == [((), 1.0)]


def test_metrics_min_over_rdma_processes():
    procs = (
        limits.RdmaProcess(1, "a", limits.MemlockLimit(None, None), False, ("uverbs0",)),
        limits.RdmaProcess(2, "b", limits.MemlockLimit(65536, 65536), False, ("uverbs0",)),
        limits.RdmaProcess(3, "c", None, None, ("uverbs0",)),
    )
    samples = _samples(limits.Limits(limits.MemlockLimit(8388608, 8388608), None, ("uverbs0",), procs, 0, False))
    assert samples["nodehealth_rdma_process_memlock_min_bytes"] == [((), 65536.0)]
    assert samples["nodehealth_rdma_processes"] == [((), 3.0)]
    all_unlimited = _samples(limits.Limits(limits.MemlockLimit(None, None), None, ("uverbs0",), procs[:1], 0, False))
    assert all_unlimited["nodehealth_rdma_process_memlock_min_bytes"] == [((), math.inf)]


# --- fuzz -------------------------------------------------------------------------------------

limit_words = st.one_of(st.just("unlimited"), st.integers(0, 2**64).map(str), st.text(max_size=8))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_fuzz_memlock_any_text(text):
    try:
        limit = limits.parse_memlock(text, "fuzz")
    except CollectError:
        return
    assert limit.soft is None or limit.soft >= 0


@settings(max_examples=200, deadline=None)
@given(limit_words, limit_words, st.text(max_size=40))
def test_fuzz_memlock_rows(soft, hard, noise):
    try:
        limit = limits.parse_memlock(noise + "\n" + HEADER + memlock_row(soft, hard), "fuzz")
    except CollectError:
        return
    assert isinstance(limit, limits.MemlockLimit)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_cap_eff(text):
    try:
        assert limits.parse_cap_ipc_lock("CapEff:" + text, "fuzz") in (True, False)
    except CollectError:
        pass
