"""HostPaths: which root is a running host, and the bounded readers."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from conftest import live_root, machine

from nodehealth import host as host_module
from nodehealth.host import HostPaths, KeptFiles, read_attr


def test_a_fixture_folder_is_not_live_and_keeps_its_own_clock():
    host = HostPaths(machine("h100-8x-cx7"))
    assert not host.is_live
    assert host.now() == 1732000000 + 241200.5


def test_the_host_mounted_under_a_root_is_live(tmp_path):
    """The DaemonSet mounts the host's /proc at /host/proc and runs with --root /host."""
    (tmp_path / "proc").mkdir()
    if subprocess.run(["mount", "-t", "proc", "proc", str(tmp_path / "proc")], capture_output=True).returncode:
        pytest.skip("cannot mount a procfs here (needs CAP_SYS_ADMIN)")
    try:
        assert HostPaths(str(tmp_path)).is_live and HostPaths("/").is_live
    finally:
        subprocess.run(["umount", str(tmp_path / "proc")])


def test_a_live_root_without_its_sysfs_says_so_and_a_fixture_folder_never_does(tmp_path):
    """On a live host every machine has a sysfs: a missing one is a missing mount, not missing hardware."""
    with live_root(tmp_path / "bare") as root:
        assert "no sysfs mounted at " + os.path.join(root, "sys") in HostPaths(root).sysfs_missing()
    with live_root(tmp_path / "full", sysfs=True) as root:
        assert HostPaths(root).sysfs_missing() is None
    assert HostPaths("/").sysfs_missing() is None
    assert HostPaths(machine("plain-host")).sysfs_missing() is None
    assert HostPaths(str(tmp_path / "empty")).sysfs_missing() is None  # a fixture without sys/


def test_the_sysfs_mount_is_looked_up_once_a_minute_not_by_every_collector(tmp_path, monkeypatch):
    """On a Kubernetes node the mount table has hundreds of lines: the /sys collectors' twice-a-pass
    question reads it once a SYSFS_RECHECK_SECONDS, and a mount that went is seen after that."""
    reads = []
    real = host_module.read_text
    monkeypatch.setattr(host_module, "read_text", lambda path, *a, **k: (reads.append(path), real(path, *a, **k))[1])
    clock = [1000.0]
    monkeypatch.setattr(host_module.time, "monotonic", lambda: clock[0])
    with live_root(tmp_path / "full", sysfs=True) as root:
        host = HostPaths(root)
        host.is_live  # noqa: B018 (its own look at the mount table, once)
        reads.clear()
        assert [host.sysfs_missing() for _ in range(10)] == [None] * 10
        assert reads == ["/proc/self/mountinfo"]
        subprocess.run(["umount", os.path.join(root, "sys")], check=True)
        assert host.sysfs_missing() is None  # within the minute: the last look holds
        clock[0] += host_module.SYSFS_RECHECK_SECONDS
        assert "no sysfs mounted at" in host.sysfs_missing() and len(reads) == 2


def test_bounded_readers(tmp_path):
    (tmp_path / "n").write_text("42\n")
    os.mkfifo(tmp_path / "fifo")  # no writer: must not block
    counters = tmp_path / "counters"
    counters.mkdir()
    (counters / "a").write_text("7")
    (counters / "b").write_text("N/A (no PMA)")
    assert read_attr(str(tmp_path / "n")) == "42" and read_attr(str(tmp_path / "absent")) is None
    assert read_attr(str(tmp_path / "fifo")) == ""
    assert KeptFiles(0).read_int_dir(str(counters)) == {"a": 7, "b": None}
    assert KeptFiles(0).read_int_dir(str(tmp_path / "gone")) == {}


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_kept_files_read_what_is_there_now_through_descriptors_kept_between_reads(tmp_path):
    counters = tmp_path / "counters"
    counters.mkdir()
    for name, value in (("a", "1"), ("b", "2"), ("c", "N/A (no PMA)"), ("lifespan", "10")):
        (counters / name).write_text(value + "\n")
    kept = KeptFiles(100)
    before = open_descriptors()
    assert kept.read_int_dir(str(counters), frozenset({"lifespan"})) == {"a": 1, "b": 2, "c": None}
    assert open_descriptors() == before + 3 == before + kept.count  # kept, the skipped one not opened
    (counters / "a").write_text("11\n")  # in place, as the kernel's attributes change
    (counters / "b").unlink()  # a file that went is not read, one that came is
    (counters / "d").write_text("4\n")
    os.mkfifo(counters / "e")  # read as None, never a wait
    assert kept.read_int_dir(str(counters)) == {"a": 11, "c": None, "d": 4, "e": None, "lifespan": 10}
    assert open_descriptors() == before + kept.count
    shutil.rmtree(counters)  # the device went and came back: other files under the same names
    counters.mkdir()
    (counters / "a").write_text("5\n")
    assert kept.read_int_dir(str(counters)) == {"a": 5}
    assert kept.count == 1 and open_descriptors() == before + 1
    (counters / "a").write_text("6\n")  # the same names again: read in one loop
    assert kept.read_int_dir(str(counters)) == {"a": 6}
    (counters / "a").write_text("N/A\n")
    assert kept.read_int_dir(str(counters)) == {"a": None}
    (counters / "a").write_text("7\n")
    assert kept.read_int_dir(str(counters)) == kept.read_int_dir(str(counters)) == {"a": 7}
    kept.sweep()  # read since the last sweep: kept
    assert kept.count == 1
    kept.sweep()  # not read since: closed
    assert kept.count == 0 and open_descriptors() == before


def test_kept_files_list_a_directory_again_only_once_it_changed(tmp_path, monkeypatch):
    """A directory's files come and go with its device (sysfs counters are fixed while it lives): a
    directory whose modification time is what it was at the last listing, made well after that time,
    is read through its kept files without being listed; one that changed, or changed just before it
    was listed (a coarse clock could give the next change the same time), is listed again."""
    counters = tmp_path / "counters"
    counters.mkdir()
    for name, value in (("a", "1"), ("b", "2")):
        (counters / name).write_text(value + "\n")
    settled = time.time() - 10
    os.utime(counters, (settled, settled))
    listed = []
    real_listdir = os.listdir
    monkeypatch.setattr(host_module.os, "listdir", lambda path: listed.append(path) or real_listdir(path))
    kept = KeptFiles(100)
    assert kept.read_int_dir(str(counters)) == {"a": 1, "b": 2} and len(listed) == 1
    (counters / "a").write_text("11\n")  # in place, as the kernel's attributes change: not listed again
    assert kept.read_int_dir(str(counters)) == kept.read_int_dir(str(counters)) == {"a": 11, "b": 2}
    assert len(listed) == 1
    (counters / "c").write_text("3\n")  # a file came: the directory changed now
    assert kept.read_int_dir(str(counters)) == {"a": 11, "b": 2, "c": 3} and len(listed) == 2
    assert kept.read_int_dir(str(counters)) == {"a": 11, "b": 2, "c": 3} and len(listed) == 3  # changed just before
    os.utime(counters, (settled, settled))
    assert kept.read_int_dir(str(counters)) == {"a": 11, "b": 2, "c": 3} and len(listed) == 4
    assert kept.read_int_dir(str(counters)) == {"a": 11, "b": 2, "c": 3} and len(listed) == 4
    (counters / "b").write_text("N/A\n")  # a kept file that no longer reads as a number: file by file, listed
    assert kept.read_int_dir(str(counters)) == {"a": 11, "b": None, "c": 3} and len(listed) == 5


def test_kept_files_read_named_attributes_as_read_attr_does_through_kept_descriptors(tmp_path):
    port = tmp_path / "1"
    port.mkdir()
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    os.mkfifo(port / "fifo")  # read as empty, never a wait
    (port / "dir").mkdir()  # cannot be read: None
    names = ("state", "rate", "absent", "fifo", "dir")
    kept = KeptFiles(100)
    before = open_descriptors()
    want = {"state": "4: ACTIVE", "rate": "400 Gb/sec (4X NDR)", "absent": None, "fifo": "", "dir": None}
    assert kept.read_texts(str(port), names) == want == {n: read_attr(str(port / n)) for n in names}
    assert kept.count == 3 and open_descriptors() == before + 3  # what could be read is kept
    (port / "state").write_text("1: DOWN\n")  # in place, as the kernel's attributes change
    (port / "absent").write_text("here\n")  # a file that came is opened
    assert kept.read_texts(str(port), names) == dict(want, state="1: DOWN", absent="here")
    assert kept.count == 4 and open_descriptors() == before + 4
    shutil.rmtree(port)  # the device went: nothing read, every descriptor closed
    assert kept.read_texts(str(port), names) == dict.fromkeys(names)
    assert kept.count == 0 and open_descriptors() == before
    port.mkdir()  # and came back: its files are opened again
    (port / "state").write_text("4: ACTIVE\n")
    assert kept.read_texts(str(port), ("state",)) == {"state": "4: ACTIVE"} and kept.count == 1
    assert KeptFiles(0).read_texts(str(port), ("state",)) == {"state": "4: ACTIVE"}  # nothing kept
    assert open_descriptors() == before + 1


def test_kept_files_hold_at_most_their_limit_and_close_when_dropped(tmp_path):
    counters = tmp_path / "counters"
    counters.mkdir()
    for i in range(5):
        (counters / f"c{i}").write_text(f"{i}\n")
    before = open_descriptors()
    kept = KeptFiles(2)
    for value in (0, 100):
        for i in range(5):
            (counters / f"c{i}").write_text(f"{i + value}\n")
        assert kept.read_int_dir(str(counters)) == {f"c{i}": i + value for i in range(5)}
        assert kept.count == 2 and open_descriptors() == before + 2
    del kept
    assert open_descriptors() == before
    host = HostPaths(str(tmp_path))  # one per collector and host, pass after pass
    assert host.kept("infiniband") is host.kept("infiniband") is not host.kept("other")
