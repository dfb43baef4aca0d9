"""The mounts collector: mountinfo parsing, selection, and the bounded stat probe.

The probe's stat is a seam: FakeStat stands in for a dead NFS server (a stat that blocks until
released) or a broken mount (a stat that fails with ESTALE/ENOTCONN), with no root and no server.
"""
from __future__ import annotations

import errno
import json
import os
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.collectors import CollectError, mounts
from nodehealth.host import HostPaths

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLES = os.path.join(HERE, "fixtures", "mounts")
MACHINES = os.path.join(HERE, "fixtures", "machines")
TIMEOUT = 0.2
MARGIN = 0.5

# Crafted lines in the proc_pid_mountinfo(5) format: id parent major:minor root mountpoint options
# [optional fields] - fstype source super-options.
NFS4 = ("412 29 0:58 / /mnt/home rw,relatime shared:231 - nfs4 10.20.0.5:/export/home rw,vers=4.2,"
        "rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,"
        "clientaddr=10.20.1.17,local_lock=none,addr=10.20.0.5")
SSHFS = ("530 29 0:61 / /home/alice/remote rw,nosuid,nodev,relatime shared:290 - fuse.sshfs "
         "alice@login01:/scratch/alice rw,user_id=1000,group_id=1000")
LUSTRE = ("498 29 0:62 / /lustre/scratch rw,relatime shared:270 - lustre 10.21.0.11@o2ib:10.21.0.12@o2ib:/scratch "
          "rw,flock,lazystatfs")
CIFS_ESCAPED = (r"601 29 0:70 / /mnt/team\040data rw,relatime shared:300 - cifs //files.example.org/team\040share "
                "rw,vers=3.1.1,cache=strict")
NFS3_TWO_OPTIONAL = "77 29 0:45 / /mnt/nfs3 rw,relatime shared:40 master:12 - nfs 10.0.0.1:/vol rw,vers=3"
EXT4_NO_OPTIONAL = "36 35 259:2 / /data rw,noatime - ext4 /dev/nvme0n1p2 rw,errors=remount-ro"
ODD_ESCAPES = r"602 29 0:71 / /mnt/a\134b\011c\012d rw - 9p share rw,trans=virtio"
ROOT = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw"


def sample(name: str) -> str:
    with open(os.path.join(SAMPLES, name), encoding="utf-8") as f:
        return f.read()


def machine_root(tmp_path, *lines: str) -> HostPaths:
    path = tmp_path / "proc" / "self" / "mountinfo"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return HostPaths(str(tmp_path))


class FakeStat:
    """A stat that succeeds, fails with an errno, or blocks until released, per mount point suffix."""

    def __init__(self, hang=(), errors=None):
        self.hang = tuple(hang)
        self.errors = dict(errors or {})
        self.release = threading.Event()
        self.calls: dict = {}
        self.in_flight = 0
        self._lock = threading.Lock()

    def __call__(self, path: str) -> None:
        with self._lock:
            self.calls[path] = self.calls.get(path, 0) + 1
            self.in_flight += 1
        try:
            if path.endswith(self.hang) and self.hang:
                self.release.wait(30)
            for suffix, number in self.errors.items():
                if path.endswith(suffix):
                    raise OSError(number, os.strerror(number), path)
        finally:
            with self._lock:
                self.in_flight -= 1

    def total_calls(self) -> int:
        return sum(self.calls.values())


@pytest.fixture
def fake_stat():
    """Makes FakeStats and, after the test, releases their hung stats so no probe slot stays taken."""
    made = []

    def make(**kwargs) -> FakeStat:
        fake = FakeStat(**kwargs)
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.release.set()
    for thread in threading.enumerate():
        if thread.name.startswith("mount-probe"):
            thread.join(5)


def by_mountpoint(facts):
    return {m.mountpoint: m for m in facts.mounts}


# --- parsing ----------------------------------------------------------------------------------

def test_parse_this_machines_real_mountinfo():
    entries = mounts.parse_mountinfo(sample("self-vm-6.18.mountinfo"), "x")[0]
    assert len(entries) == 20
    assert mounts.MountEntry("/", "ext4", "/dev/vda") in entries
    assert [e.mountpoint for e in entries].count("/dev/pts") == 2  # over-mounted: both lines are kept here
    assert not any(mounts.is_watched(e.fstype, set()) for e in entries)


@pytest.mark.parametrize("line, expected", [
    (NFS4, mounts.MountEntry("/mnt/home", "nfs4", "10.20.0.5:/export/home")),
    (SSHFS, mounts.MountEntry("/home/alice/remote", "fuse.sshfs", "alice@login01:/scratch/alice")),
    (LUSTRE, mounts.MountEntry("/lustre/scratch", "lustre", "10.21.0.11@o2ib:10.21.0.12@o2ib:/scratch")),
    (CIFS_ESCAPED, mounts.MountEntry("/mnt/team data", "cifs", "//files.example.org/team share")),
    (NFS3_TWO_OPTIONAL, mounts.MountEntry("/mnt/nfs3", "nfs", "10.0.0.1:/vol")),
    (EXT4_NO_OPTIONAL, mounts.MountEntry("/data", "ext4", "/dev/nvme0n1p2")),
    (ODD_ESCAPES, mounts.MountEntry("/mnt/a\\b\tc\nd", "9p", "share")),
])
def test_parse_lines(line, expected):
    assert mounts.parse_mountinfo(line + "\n", "x")[0] == (expected,)


def test_only_newline_ends_a_line():
    odd = "540 29 0:63 / /home/bob/a\u2028b\x0cc rw - fuse.sshfs bob@h:/ rw"
    (entry,) = mounts.parse_mountinfo(odd + "\n", "x")[0]
    assert entry.mountpoint == "/home/bob/a\u2028b\x0cc"


def test_blank_lines_and_no_final_newline_are_fine():
    assert len(mounts.parse_mountinfo(ROOT + "\n\n" + NFS4, "x")[0]) == 2


@pytest.mark.parametrize("line", [
    "412 29 0:58 / /mnt/home rw,relatime shared:231 nfs4 10.20.0.5:/export/home rw",  # no separator
    "412 29 0:58 / /mnt/home rw,relatime - nfs4",  # no source
    "412 29 0:58 / /mnt - nfs4 s rw",  # no mount options before the separator
    "abc 29 0:58 / /mnt rw - nfs4 s rw",
    "412 29 058 / /mnt rw - nfs4 s rw",
    "412 29 0:58 / mnt rw - nfs4 s rw",  # relative mount point
    "412 29 0:58 / /mnt rw -  s rw",  # empty fstype
    "garbage",
])
def test_a_malformed_line_is_skipped_and_counted_and_the_rest_parsed(line):
    entries, bad = mounts.parse_mountinfo(ROOT + "\n" + line + "\n" + NFS4 + "\n", "/proc/self/mountinfo")
    assert [e.mountpoint for e in entries] == [mounts.parse_mountinfo(ROOT, "x")[0][0].mountpoint, "/mnt/home"]
    assert bad == [f"line 2: {line!r}"]


def test_an_empty_mount_point_costs_only_its_line(tmp_path):
    """Peers' data: one line whose mount point the kernel printed empty; the NFS mount after it is still judged."""
    empty = "413 29 0:59 /  rw,relatime - nfs4 10.20.0.6:/export/x rw"
    host = machine_root(tmp_path, ROOT, empty, NFS4)
    facts = mounts.collect(host, {"timeout_seconds": TIMEOUT}, stat=lambda path: None)
    assert [m.mountpoint for m in facts.mounts] == ["/mnt/home"]
    assert (facts.bad_lines, facts.first_bad_line) == (1, f"{host.proc('self', 'mountinfo')} line 2: {empty!r}")
    assert {m.name: m.samples for m in mounts.metrics(facts)}["nodehealth_mount_table_unparsed_lines"] == [((), 1.0)]


# --- selection --------------------------------------------------------------------------------

@pytest.mark.parametrize("fstype, watched", [
    ("nfs", True), ("nfs4", True), ("cifs", True), ("smb3", True), ("lustre", True), ("gpfs", True),
    ("beegfs", True), ("ceph", True), ("glusterfs", True), ("wekafs", True), ("9p", True),
    ("fuse", True), ("fuse.sshfs", True), ("fuse.s3fs", True), ("fuseblk", True),
    ("fusectl", False), ("ext4", False), ("xfs", False), ("tmpfs", False), ("overlay", False), ("nfsd", False),
    ("panfs", False),
])
def test_watched_fstypes(fstype, watched):
    assert mounts.is_watched(fstype, set()) is watched


def test_extra_fstypes_from_config():
    assert mounts.is_watched("panfs", {"panfs"})


def test_select_network_fuse_and_configured_paths():
    entries = mounts.parse_mountinfo("\n".join([ROOT, EXT4_NO_OPTIONAL, NFS4, SSHFS]), "x")[0]
    chosen = mounts.select(entries, ["/data/", "/scratch"], set())
    assert [(e.mountpoint, mounted, configured) for e, mounted, configured in chosen] == [
        ("/data", True, True),  # a local mount, probed because configured
        ("/home/alice/remote", True, False),
        ("/mnt/home", True, False),
        ("/scratch", False, True),  # configured but not in the table
    ]


def test_select_last_entry_of_a_mount_point_wins():
    over = "413 412 0:59 / /mnt/home rw - nfs4 10.20.0.6:/export/home2 rw"
    (chosen,) = mounts.select(mounts.parse_mountinfo(NFS4 + "\n" + over, "x")[0], [], set())
    assert chosen[0].source == "10.20.0.6:/export/home2"


# --- probing ----------------------------------------------------------------------------------

def test_responsive_mounts(tmp_path, fake_stat):
    host = machine_root(tmp_path, ROOT, NFS4, LUSTRE)
    fake = fake_stat()
    facts = mounts.collect(host, {"timeout_seconds": TIMEOUT}, stat=fake)
    assert [(m.mountpoint, m.responsive, m.error) for m in facts.mounts] == [
        ("/lustre/scratch", True, None), ("/mnt/home", True, None)]
    assert all(0 <= m.latency_seconds < TIMEOUT for m in facts.mounts)
    assert set(fake.calls) == {str(tmp_path / "lustre/scratch"), str(tmp_path / "mnt/home")}  # under the root


def test_hanging_stat_is_unresponsive_after_the_timeout(tmp_path, fake_stat):
    host = machine_root(tmp_path, ROOT, NFS4)
    fake = fake_stat(hang=("/mnt/home",))
    start = time.monotonic()
    (m,) = mounts.collect(host, {"timeout_seconds": TIMEOUT}, stat=fake).mounts
    elapsed = time.monotonic() - start
    assert TIMEOUT <= elapsed < TIMEOUT + MARGIN
    assert (m.responsive, m.error, m.fstype, m.source) == (False, None, "nfs4", "10.20.0.5:/export/home")
    assert m.latency_seconds >= TIMEOUT


def test_second_pass_reuses_the_stuck_probe(tmp_path, fake_stat):
    host = machine_root(tmp_path, ROOT, NFS4)
    fake = fake_stat(hang=("/mnt/home",))
    (first,) = mounts.collect(host, {"timeout_seconds": TIMEOUT}, stat=fake).mounts
    threads_before = threading.active_count()
    (second,) = mounts.collect(host, {"timeout_seconds": TIMEOUT}, stat=fake).mounts
    assert fake.total_calls() == 1  # no second thread stuck on the same mount
    assert threading.active_count() <= threads_before
    assert second.responsive is False
    assert second.latency_seconds > first.latency_seconds  # it has been hanging for both passes

    fake.release.set()  # the server comes back
    deadline = time.monotonic() + 2
    while fake.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    (third,) = mounts.collect(host, {"timeout_seconds": TIMEOUT}, stat=fake).mounts
    assert third.responsive is True and fake.total_calls() == 2  # a fresh probe


def test_a_stuck_probe_that_answers_during_the_pass_counts_as_responsive(tmp_path, fake_stat):
    host = machine_root(tmp_path, ROOT, NFS4)
    fake = fake_stat(hang=("/mnt/home",))
    mounts.collect(host, {"timeout_seconds": TIMEOUT}, stat=fake)
    threading.Timer(0.05, fake.release.set).start()
    (m,) = mounts.collect(host, {"timeout_seconds": 1.0}, stat=fake).mounts
    assert m.responsive is True and m.latency_seconds >= TIMEOUT
    assert fake.total_calls() == 1


@pytest.mark.parametrize("number, name", [
    (errno.ESTALE, "ESTALE"), (errno.ENOTCONN, "ENOTCONN"), (errno.EIO, "EIO"), (errno.EACCES, "EACCES")])
def test_stat_errors_are_facts(tmp_path, fake_stat, number, name):
    host = machine_root(tmp_path, ROOT, SSHFS)
    (m,) = mounts.collect(host, {"timeout_seconds": TIMEOUT}, stat=fake_stat(errors={"/remote": number})).mounts
    assert (m.responsive, m.error) == (True, name)


def test_a_refusal_on_the_way_to_the_mount_is_not_an_answer_from_it(tmp_path, fake_stat):
    """EACCES from the mount itself (FUSE without allow_other) is its answer; EACCES from a directory on
    the way, which the agent may not search, never reached the mount: its parent's "." is refused too."""
    host = machine_root(tmp_path, ROOT, SSHFS, NFS4)
    fake = fake_stat(errors={"/home/alice/remote": errno.EACCES, "/home/alice/.": errno.EACCES,
                             "/mnt/home": errno.EACCES})
    found = by_mountpoint(mounts.collect(host, {"timeout_seconds": TIMEOUT}, stat=fake))
    fuse, nfs = found["/home/alice/remote"], found["/mnt/home"]
    assert (fuse.reached, fuse.responsive, fuse.error) == (False, None, "EACCES")
    assert (nfs.reached, nfs.responsive, nfs.error) == (True, True, "EACCES")
    assert os.path.join(str(tmp_path), "mnt", ".") in fake.calls  # its parent was searchable: the mount refused


def test_a_stat_that_raises_something_else_is_a_fact_too(tmp_path):
    host = machine_root(tmp_path, ROOT, NFS4)

    def bad_stat(path):
        raise ValueError("embedded null byte")

    (m,) = mounts.collect(host, {"timeout_seconds": TIMEOUT}, stat=bad_stat).mounts
    assert (m.responsive, m.error) == (True, "ValueError")


def test_many_hung_mounts_cost_one_timeout(tmp_path, fake_stat):
    lines = [f"{500 + n} 29 0:{80 + n} / /mnt/share{n} rw - nfs4 10.0.0.{n}:/export rw" for n in range(10)]
    host = machine_root(tmp_path, ROOT, *lines)
    fake = fake_stat(hang=tuple(f"/mnt/share{n}" for n in range(10)))
    start = time.monotonic()
    facts = mounts.collect(host, {"timeout_seconds": TIMEOUT}, stat=fake)
    assert time.monotonic() - start < TIMEOUT + MARGIN  # ten serial timeouts would be 2 s
    assert [m.responsive for m in facts.mounts] == [False] * 10


def test_probe_threads_are_bounded(tmp_path, fake_stat, monkeypatch):
    monkeypatch.setattr(mounts, "_SLOTS", threading.BoundedSemaphore(2))
    lines = [f"{500 + n} 29 0:{80 + n} / /mnt/share{n} rw - nfs4 10.0.0.{n}:/export rw" for n in range(3)]
    host = machine_root(tmp_path, ROOT, *lines)
    fake = fake_stat(hang=("/mnt/share0", "/mnt/share1", "/mnt/share2"))
    start = time.monotonic()
    facts = mounts.collect(host, {"timeout_seconds": TIMEOUT}, stat=fake)
    assert time.monotonic() - start < TIMEOUT + MARGIN
    assert [m.responsive for m in facts.mounts] == [False, False, None]  # the third never got a thread
    assert fake.total_calls() == 2
    samples = {m.name: m.samples for m in mounts.metrics(facts)}
    assert [labels[0] for labels, _ in samples["nodehealth_mount_responsive"]] == ["/mnt/share0", "/mnt/share1"]


def test_configured_paths_with_the_real_stat(tmp_path):
    host = machine_root(tmp_path, ROOT, NFS4, SSHFS)
    (tmp_path / "mnt" / "home").mkdir(parents=True)
    (tmp_path / "datasets").mkdir()
    facts = by_mountpoint(mounts.collect(host, {"timeout_seconds": 1.0, "paths": ["/datasets", "/checkpoints"]}))
    assert (facts["/mnt/home"].responsive, facts["/mnt/home"].error) == (True, None)
    assert facts["/home/alice/remote"].error == "ENOENT"  # in the table, but not in this fixture tree
    assert (facts["/datasets"].mounted, facts["/datasets"].configured, facts["/datasets"].error) == (
        False, True, None)
    assert (facts["/checkpoints"].mounted, facts["/checkpoints"].error) == (False, "ENOENT")


def test_extra_fstypes_setting(tmp_path, fake_stat):
    host = machine_root(tmp_path, ROOT, "90 29 0:90 / /panfs rw - panfs panfs://10.0.0.9 rw")
    assert mounts.collect(host, {"timeout_seconds": TIMEOUT}, stat=fake_stat()).mounts == ()
    (m,) = mounts.collect(host, {"timeout_seconds": TIMEOUT, "fstypes": ["panfs"]}, stat=fake_stat()).mounts
    assert (m.mountpoint, m.fstype) == ("/panfs", "panfs")


@pytest.mark.parametrize("name", ["plain-host", "h100-8x-cx7", "fragmented", "small-memlock"])
def test_fixture_machines_have_no_network_mounts(name):
    host = HostPaths(os.path.join(MACHINES, name))
    assert mounts.supported(host, {}) is None
    assert mounts.collect(host, {"timeout_seconds": TIMEOUT}).mounts == ()


def test_supported_needs_mountinfo(tmp_path):
    assert "mountinfo" in mounts.supported(HostPaths(str(tmp_path)), {})


def test_garbage_mountinfo_fails_the_collector(tmp_path):
    host = machine_root(tmp_path, "not a mount table")
    with pytest.raises(CollectError, match="line 1"):
        mounts.collect(host, {"timeout_seconds": TIMEOUT})


# --- metrics ----------------------------------------------------------------------------------

def test_metrics():
    facts = mounts.Mounts((
        mounts.Mount("/lustre/scratch", "lustre", "s", True, False, True, None, 0.002),
        mounts.Mount("/mnt/home", "nfs4", "s", True, False, False, None, 12.5),
        mounts.Mount("/mnt/x", "nfs4", "s", True, False, None, None, None),
    ))
    samples = {m.name: m.samples for m in mounts.metrics(facts)}
    assert samples["nodehealth_mount_responsive"] == [
        (("/lustre/scratch", "lustre"), 1.0), (("/mnt/home", "nfs4"), 0.0)]
    assert samples["nodehealth_mount_probe_seconds"] == [
        (("/lustre/scratch", "lustre"), 0.002), (("/mnt/home", "nfs4"), 12.5)]


# --- fuzz -------------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_fuzz_any_text(text):
    try:
        entries = mounts.parse_mountinfo(text, "fuzz")[0]
    except CollectError:
        return
    assert all(e.mountpoint.startswith("/") and e.fstype for e in entries)


token = st.one_of(
    st.sampled_from(["-", "/", "/mnt", "0:58", "412", "shared:1", "nfs4", "fuse.sshfs", "rw", r"\040", "\\", ""]),
    st.text(alphabet=st.characters(blacklist_characters=" \n\r"), max_size=10),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(token, max_size=14), max_size=5))
def test_fuzz_token_lines(lines):
    text = "\n".join(" ".join(tokens) for tokens in lines)
    try:
        entries = mounts.parse_mountinfo(text, "fuzz")[0]
    except CollectError:
        return
    assert len(entries) <= len(lines)


def test_a_host_root_the_agent_may_not_enter_makes_the_mounts_unknown_not_answered(tmp_path):
    """The DaemonSet without SYS_PTRACE: the host's mount points are reached through /host/proc/1/root,
    which the kernel refuses to a process that may not ptrace the host's init, before any mount is
    reached. Every stat would fail with EACCES, which is no answer from the mounts."""
    import shutil
    import subprocess
    import sys

    from conftest import live_root
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("drops capabilities through setpriv, which needs root")
    config = tmp_path / "config.yaml"
    config.write_text("collectors:\n  mounts:\n    paths: [/]\n")  # the host's root: always mounted
    with live_root(tmp_path / "host") as root:
        done = subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-m",
                               "nodehealth.cli", "check", "--root", root, "--only", "mounts", "--config",
                               str(config), "--state-dir", str(tmp_path / "state"), "--json"],
                              capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout)
    [finding] = report["findings"]
    assert (report["status"], finding["severity"], finding["reason"]) == ("unknown", "unknown", "MountsUnreachable")
    assert "/proc/1/root" in finding["message"] and "SYS_PTRACE" in finding["message"]


def test_in_a_pod_the_host_mount_table_and_files_come_through_its_init_process(tmp_path):
    """--root /host with hostPID: read /host/proc/1/mountinfo and probe /host/proc/1/root/<mount>."""
    import subprocess

    from nodehealth.collectors.mounts import mount_namespace
    (tmp_path / "proc").mkdir()
    if subprocess.run(["mount", "-t", "proc", "proc", str(tmp_path / "proc")], capture_output=True).returncode:
        pytest.skip("cannot mount a procfs here (needs CAP_SYS_ADMIN)")
    try:
        host = HostPaths(str(tmp_path))
        table, locate = mount_namespace(host)
        assert table == str(tmp_path / "proc" / "1" / "mountinfo")
        assert locate("/mnt/data") == str(tmp_path / "proc" / "1" / "root" / "mnt" / "data")
    finally:
        subprocess.run(["umount", str(tmp_path / "proc")])
    table, locate = mount_namespace(HostPaths(str(tmp_path)))  # unmounted: a plain folder, not a host
    assert table == str(tmp_path / "proc" / "self" / "mountinfo")
    assert locate("/mnt/data") == str(tmp_path / "mnt" / "data")
