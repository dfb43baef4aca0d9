"""The mounts check: table-driven, no files."""
from __future__ import annotations

import pytest

from nodehealth.checks import mounts as check
from nodehealth.collectors.mounts import Mount, Mounts
from nodehealth.model import Action, Observed, Severity


def mount(mountpoint="/mnt/home", fstype="nfs4", source="10.20.0.5:/export/home", mounted=True, configured=False,
          responsive=True, error=None, latency=0.003, reached=True):
    return Mount(mountpoint, fstype, source, mounted, configured, responsive, error, latency, reached)


def judge(*ms, unreachable=None):
    return check.judge(Observed({"mounts": Mounts(tuple(ms), unreachable=unreachable)}), dict(check.DEFAULTS))


DEGRADED, WARNING, UNKNOWN = Severity.DEGRADED, Severity.WARNING, Severity.UNKNOWN

CASES = [
    ("healthy", [mount()], []),
    ("no mounts", [], []),
    ("hanging", [mount(responsive=False, latency=12.0)], [(DEGRADED, "MountUnresponsive", "/mnt/home")]),
    ("not probed this pass: no judgement", [mount(responsive=None, latency=None)], []),
    ("stale handle", [mount(error="ESTALE")], [(DEGRADED, "MountBroken", "/mnt/home")]),
    ("dead FUSE daemon", [mount("/home/alice/remote", "fuse.sshfs", "alice@login01:/", error="ENOTCONN")],
     [(DEGRADED, "MountBroken", "/home/alice/remote")]),
    ("I/O error", [mount(error="EIO")], [(DEGRADED, "MountBroken", "/mnt/home")]),
    ("mount point gone from under a mounted entry", [mount(error="ENOENT")],
     [(DEGRADED, "MountBroken", "/mnt/home")]),
    ("permission denied is an answer", [mount("/run/user/1000/gvfs", "fuse.gvfsd-fuse", "gvfsd-fuse", error="EACCES")],
     []),
    ("EPERM is an answer", [mount(error="EPERM")], []),
    ("refused on the way: not an answer", [mount(error="EACCES", responsive=None, reached=False)],
     [(UNKNOWN, "MountNotReached", "/mnt/home")]),
    ("configured and mounted", [mount(configured=True)], []),
    ("configured, not mounted, does not exist",
     [mount("/datasets", "", "", mounted=False, configured=True, error="ENOENT")],
     [(WARNING, "MountMissing", "/datasets")]),
    ("configured, not mounted, directory exists", [mount("/datasets", "", "", mounted=False, configured=True)],
     [(WARNING, "MountMissing", "/datasets")]),
    ("configured, not mounted, and its parent hangs",
     [mount("/mnt/nfs/sub", "", "", mounted=False, configured=True, responsive=False, latency=5.0)],
     [(DEGRADED, "MountUnresponsive", "/mnt/nfs/sub")]),
    ("several at once",
     [mount("/a", responsive=False, latency=5.0), mount("/b", error="ESTALE"), mount("/c")],
     [(DEGRADED, "MountUnresponsive", "/a"), (DEGRADED, "MountBroken", "/b")]),
]


@pytest.mark.parametrize("name, ms, expected", CASES, ids=[c[0] for c in CASES])
def test_rules(name, ms, expected):
    assert [(f.severity, f.reason, f.device) for f in judge(*ms)] == expected


def test_unresponsive_message_names_mount_type_source_and_wait():
    (f,) = judge(mount(responsive=False, latency=12.04))
    for words in ("nfs4 mount /mnt/home", "10.20.0.5:/export/home", "12.0 s", "D state", "umount -l /mnt/home"):
        assert words in f.message
    assert f.action is Action.FIX_CONFIG
    assert f.evidence == {"fstype": "nfs4", "source": "10.20.0.5:/export/home", "waited_seconds": 12.04}


@pytest.mark.parametrize("error, words", [
    ("ESTALE", "Stale file handle"),
    ("ENOTCONN", "Transport endpoint is not connected"),
    ("EIO", "Input/output error"),
    ("ValueError", "ValueError"),  # not an errno: the name stands for itself
])
def test_broken_message_explains_the_error(error, words):
    (f,) = judge(mount(error=error))
    assert error in f.message and words in f.message
    assert f.evidence["error"] == error and f.action is Action.FIX_CONFIG


def test_missing_message_says_whether_the_path_exists():
    (gone,) = judge(mount("/datasets", "", "", mounted=False, configured=True, error="ENOENT"))
    (empty,) = judge(mount("/datasets", "", "", mounted=False, configured=True))
    assert "does not even exist" in gone.message and "is not mounted" in empty.message
    assert "mount /datasets" in gone.message and gone.action is Action.FIX_CONFIG


def test_unmounted_path_is_described_as_a_path():
    (f,) = judge(mount("/mnt/nfs/sub", "", "", mounted=False, configured=True, responsive=False, latency=5.0))
    assert "The path /mnt/nfs/sub has not answered" in f.message


def test_module_contract():
    assert check.NAME == "mounts" and check.NEEDS == ("mounts",) and check.DEBOUNCE is True


def test_skipped_mount_table_lines_are_named_and_the_rest_judged():
    hung = Mount("/mnt/home", "nfs4", "s:/h", True, False, False, None, 6.0)
    facts = Mounts((hung,), bad_lines=1, first_bad_line="/proc/self/mountinfo line 2: '413 29 0:59 /  rw'")
    findings = check.judge(Observed({"mounts": facts}), {})
    assert [(f.reason, f.severity) for f in findings] == [("MountUnresponsive", Severity.DEGRADED),
                                                          ("MountTableLinesSkipped", Severity.INFO)]
    assert "line 2" in findings[1].message


def test_a_host_root_refused_through_proc_1_root_is_one_unknown_naming_the_fix():
    [f] = judge(mount(responsive=None, latency=None), mount("/lustre", responsive=None, latency=None),
                unreachable="/host/proc/1/root: Permission denied")
    assert (f.severity, f.reason, f.device) == (UNKNOWN, "MountsUnreachable", "")
    assert "/host/proc/1/root: Permission denied" in f.message and "SYS_PTRACE" in f.message
    assert "2 network or FUSE mounts" in f.message


def test_a_mount_refused_on_the_way_names_the_directory_and_the_fix():
    [f] = judge(mount("/home/alice/remote", "fuse.sshfs", "alice@login01:/", error="EACCES", responsive=None,
                      reached=False))
    assert "/home/alice" in f.message and "DAC_READ_SEARCH" in f.message
