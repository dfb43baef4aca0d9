"""HostPaths: which root is a running host, and the bounded readers."""
from __future__ import annotations

import os
import subprocess

import pytest
from conftest import live_root, machine

from nodehealth.host import HostPaths, read_attr, read_int_dir


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


def test_bounded_readers(tmp_path):
    (tmp_path / "n").write_text("42\n")
    os.mkfifo(tmp_path / "fifo")  # no writer: must not block
    counters = tmp_path / "counters"
    counters.mkdir()
    (counters / "a").write_text("7")
    (counters / "b").write_text("N/A (no PMA)")
    assert read_attr(str(tmp_path / "n")) == "42" and read_attr(str(tmp_path / "absent")) is None
    assert read_attr(str(tmp_path / "fifo")) == ""
    assert read_int_dir(str(counters)) == {"a": 7, "b": None}
    assert read_int_dir(str(tmp_path / "gone")) == {}
