"""The kernel log from the systemd journal, on real journal files written by systemd-journal-remote:
the same records as /dev/kmsg, read once each across a restart, a rejected cursor and a switch of
source; a corrupt file, another boot's journal, journald's note of lost records."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import live_root, machine
from journal_files import kernel_entry, kmsg_entries, machine_journal, missed_entry, write_journal

from nodehealth.collectors import CollectError, journal, kmsg
from nodehealth.collectors.kernel_position import Position
from nodehealth.host import HostPaths, boot_id

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2012, name=python3, GPU has fallen off the bus."


@pytest.fixture(autouse=True)
def systemd_journal():
    try:
        journal.journal_module()
    except CollectError as e:
        from conftest import unavailable
        unavailable(str(e))


def journal_machine(tmp_path, name: str = "h100-8x-cx7", keep_kmsg: bool = False, volatile: bool = False) -> str:
    """A fixture machine whose kernel log is (also) in a journal: the journal journald would have
    written from its dev/kmsg."""
    root = tmp_path / name
    shutil.copytree(machine(name), root, symlinks=True)
    host = HostPaths(str(root))
    write_journal(machine_journal(str(root), volatile=volatile),
                  kmsg_entries(str(root / "dev" / "kmsg"), boot_id(host), kmsg.boot_time(host)))
    if not keep_kmsg:
        (root / "dev" / "kmsg").unlink()
    return str(root)


def event_view(events) -> list[tuple]:
    return [(e.kind, e.device, e.code, e.text, e.monotonic_us, e.wall_time, e.detail) for e in events]


def test_the_journal_gives_the_same_events_as_dev_kmsg(tmp_path):
    root = journal_machine(tmp_path, keep_kmsg=True)
    host = HostPaths(root)
    by_kmsg = kmsg.collect(host, dict(kmsg.DEFAULTS, source="kmsg"))
    by_journal = kmsg.collect(host, dict(kmsg.DEFAULTS, source="journal"))
    assert by_journal.source == "the journal in " + os.path.join(root, "var/log/journal")
    assert (by_journal.records, by_journal.boot_id) == (by_kmsg.records, by_kmsg.boot_id) == (31, boot_id(host))
    assert event_view(by_journal.events) == event_view(by_kmsg.events)
    assert "xid" in {e.kind for e in by_journal.events}


def test_check_reads_the_xid_of_a_machine_whose_kernel_log_is_only_in_its_journal(tmp_path):
    root = journal_machine(tmp_path)
    done = subprocess.run([sys.executable, "-m", "nodehealth.cli", "check", "--root", root, "--state-dir",
                           str(tmp_path / "state"), "--json"], capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout)
    assert done.returncode == 1 and "Xid79FallenOffBus" in {f["reason"] for f in report["findings"]}
    [result] = [c for c in report["collectors"] if c["name"] == "kmsg"]
    assert result["success"] is True


def test_records_map_to_what_dev_kmsg_gave_journald(tmp_path):
    root = tmp_path / "m"
    shutil.copytree(machine("plain-host"), root, symlinks=True)
    (root / "dev" / "kmsg").unlink()
    boot = boot_id(HostPaths(str(root)))
    write_journal(machine_journal(str(root)), [
        kernel_entry(XID79, 5_000_000, boot, priority=3, device="+pci:0000:3b:00.0", subsystem="pci"),
        kernel_entry("NVRM: Xid (PCI:0000:3b:00): 31, a user wrote this to /dev/kmsg", 5_000_100, boot, facility=1),
        missed_entry(17, 5_000_200, boot),
        # a user's forgery of journald's note (`logger --journald`): its transport is "journal", not "driver"
        dict(missed_entry(999_999_999, 5_000_250, boot), _TRANSPORT="journal"),
        kernel_entry("nvme nvme0: I/O 12 QID 3 timeout, aborting\nsecond line", 5_000_300, boot, priority=4)])
    follower = journal.JournalFollower(HostPaths(str(root)), kmsg.DEFAULTS, Position(), boot, 1.7e9)
    count, overwritten, last_seq, events = follower.read_new()
    assert (count, overwritten, last_seq) == (3, 17, None)  # journald's note is a count, not a record
    assert [(e.kind, e.code, e.device) for e in events] == [("xid", 79, "0000:3b:00.0"), ("nvme_error", None, "nvme0")]
    assert events[0].monotonic_us == 5_000_000 and events[0].wall_time == 1.7e9 + 5.0
    follower.close()


def test_a_restart_mid_stream_counts_nothing_twice(tmp_path):
    root = journal_machine(tmp_path)
    host, cfg = HostPaths(root), dict(kmsg.DEFAULTS, source="journal")
    boot, file = boot_id(host), machine_journal(root)
    first = kmsg.open_follower(host, cfg)
    assert first.read_new()[0] == 31
    write_journal(file, [kernel_entry("eth0: link up", 900_000_000_000, boot)])
    assert first.read_new()[0] == 1
    saved = Position.load(json.loads(json.dumps(first.position.dump())))  # through the state file
    first.close()
    write_journal(file, [kernel_entry(XID79, 900_000_000_100, boot, priority=3)])
    second = kmsg.open_follower(host, cfg, saved)
    count, _, _, events = second.read_new()
    assert (count, [e.code for e in events]) == (1, [79])
    assert second.read_new()[0] == 0
    second.close()


def test_a_rejected_cursor_falls_back_to_the_record_keys(tmp_path):
    """A cursor whose entry is gone (vacuumed, or of a journal since replaced) is not trusted: the
    boot is read again and only records the keys do not know count."""
    root = journal_machine(tmp_path)
    host, cfg = HostPaths(root), dict(kmsg.DEFAULTS, source="journal")
    first = kmsg.open_follower(host, cfg)
    first.read_new()
    position = first.position.copy()
    first.close()
    position.cursor = position.cursor.replace("i=", "i=9")  # an entry this journal never had
    write_journal(machine_journal(root), [kernel_entry(XID79, 900_000_000_000, boot_id(host), priority=3)])
    again = kmsg.open_follower(host, cfg, position)
    count, _, _, events = again.read_new()
    assert (count, [e.code for e in events]) == (1, [79])
    again.close()


@pytest.mark.parametrize("before, after", [("kmsg", "journal"), ("journal", "kmsg")])
def test_a_switch_of_source_counts_nothing_twice(tmp_path, before, after):
    """The daemon restarted on the other source (the pod lost or gained /dev/kmsg): the records
    the first source read are known by their keys, and only the new ones count."""
    root = journal_machine(tmp_path, keep_kmsg=True)
    host = HostPaths(root)
    boot = boot_id(host)
    first = kmsg.open_follower(host, dict(kmsg.DEFAULTS, source=before))
    assert first.read_new()[0] == 31
    position = first.position.copy()
    first.close()
    usec = 900_000_000_000
    with open(os.path.join(root, "dev", "kmsg"), "a") as f:
        f.write(f"3,1600,{usec},-;{XID79}\n")
    write_journal(machine_journal(root), [kernel_entry(XID79, usec, boot, priority=3)])
    second = kmsg.open_follower(host, dict(kmsg.DEFAULTS, source=after), position)
    count, _, _, events = second.read_new()
    assert (count, [e.code for e in events]) == (1, [79])
    second.close()


def test_auto_reads_dev_kmsg_when_it_opens_and_the_journal_when_it_does_not(tmp_path):
    root = journal_machine(tmp_path, keep_kmsg=True)
    host = HostPaths(root)
    assert kmsg.open_follower(host, kmsg.DEFAULTS).source == os.path.join(root, "dev", "kmsg")
    os.unlink(os.path.join(root, "dev", "kmsg"))
    assert kmsg.open_follower(host, kmsg.DEFAULTS).source.startswith("the journal in ")


def test_the_volatile_journal_is_read_when_the_persistent_one_lacks_this_boot(tmp_path):
    root = journal_machine(tmp_path, volatile=True)
    os.makedirs(os.path.join(root, "var", "log", "journal"))  # exists, holds nothing of this boot
    follower = kmsg.open_follower(HostPaths(root), kmsg.DEFAULTS)
    assert follower.source == "the journal in " + os.path.join(root, "run/log/journal")
    assert follower.read_new()[0] == 31
    follower.close()


def test_a_corrupt_journal_file_is_skipped_and_the_good_ones_read(tmp_path):
    root = journal_machine(tmp_path)
    directory = os.path.dirname(machine_journal(root))
    with open(os.path.join(directory, "system@0000-garbage.journal"), "wb") as f:
        f.write(os.urandom(64 << 10))
    good = machine_journal(root)
    with open(good, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2:len(data) // 2 + 4096] = b"\xff" * 4096  # an archived copy damaged in its middle
    with open(os.path.join(directory, "system@0001-damaged.journal"), "wb") as f:
        f.write(bytes(data))
    facts = kmsg.collect(HostPaths(root), kmsg.DEFAULTS)
    assert facts.records == 31 and "xid" in {e.kind for e in facts.events}


def test_a_journal_of_another_boot_only_is_unreadable_and_says_why(tmp_path):
    root = tmp_path / "m"
    shutil.copytree(machine("plain-host"), root, symlinks=True)
    (root / "dev" / "kmsg").unlink()
    write_journal(machine_journal(str(root)), [kernel_entry(XID79, 5_000_000, "0" * 32, priority=3)])
    garbage = machine_journal(str(root), volatile=True)
    os.makedirs(os.path.dirname(garbage))
    with open(garbage, "wb") as f:
        f.write(os.urandom(4096))  # and only garbage in the volatile one
    with pytest.raises(CollectError) as e:
        kmsg.collect(HostPaths(str(root)), kmsg.DEFAULTS)
    text = str(e.value)
    assert "no journal holds kernel records of this boot" in text and "no kernel record of this boot" in text
    assert "cannot read " + os.path.join(str(root), "dev", "kmsg") in text and "To fix:" in text


def test_without_python3_systemd_the_journal_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "systemd", None)
    monkeypatch.setattr(journal, "_SYSTEM_PACKAGES", str(tmp_path))
    with pytest.raises(CollectError, match="needs python3-systemd"):
        journal.journal_module()


def test_on_a_live_host_the_journal_stands_in_for_an_unmounted_dev_kmsg(tmp_path):
    """A live root (a real procfs, this machine's boot id) without dev/kmsg: the kernel log is its
    journal; without the journal too, unknown rather than unsupported."""
    with live_root(tmp_path / "host") as root:
        host = HostPaths(root)
        assert kmsg.supported(host, kmsg.DEFAULTS) is None
        with pytest.raises(CollectError, match="no journal holds kernel records of this boot"):
            kmsg.collect(host, kmsg.DEFAULTS)
        write_journal(machine_journal(root), [kernel_entry(XID79, 7_000_000, boot_id(host), priority=3)])
        facts = kmsg.collect(host, kmsg.DEFAULTS)
        assert [e.code for e in facts.events] == [79]


# -- the daemon follows the journal as a stream ---------------------------------------------------------

def records_total(daemon) -> float | None:
    for line in daemon.get("/metrics")[1].decode().splitlines():
        if line.startswith("nodehealth_kernel_log_records_total "):
            return float(line.split()[1])
    return None


def wait_until(condition, timeout: float = 15.0):
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    return condition()


def test_the_daemon_follows_the_journal_across_restarts_and_a_switch_to_dev_kmsg(tmp_path, daemon_factory):
    """Each record is counted once: the journal read whole, then a record as it is appended, then a
    restart (the cursor), then a restart on /dev/kmsg once it is there (the keys)."""
    root = journal_machine(tmp_path)
    host, state = HostPaths(root), str(tmp_path / "state")
    boot, file = boot_id(host), machine_journal(root)
    new = [(900_000_000_000, "NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, Ch 00000001, intr 00000000"),
           (900_000_100_000, "NVRM: Xid (PCI:0000:19:00): 31, pid=2, name=b, Ch 00000002, intr 00000000"),
           (900_000_200_000, XID79)]

    d = daemon_factory(root, state, interval=0.5)
    d.wait_ready()
    assert wait_until(lambda: records_total(d) == 31), records_total(d)
    write_journal(file, [kernel_entry(new[0][1], new[0][0], boot, priority=3)])
    assert wait_until(lambda: records_total(d) == 32), records_total(d)  # followed, not polled per pass
    d.stop()

    write_journal(file, [kernel_entry(new[1][1], new[1][0], boot, priority=3)])
    d = daemon_factory(root, state, interval=0.5)
    d.wait_ready()
    assert wait_until(lambda: records_total(d) == 33), records_total(d)
    d.stop()

    shutil.copy(machine("h100-8x-cx7") + "/dev/kmsg", os.path.join(root, "dev", "kmsg"))  # the device is back
    with open(os.path.join(root, "dev", "kmsg"), "a") as f:
        for seq, (usec, text) in enumerate(new, 1600):
            f.write(f"3,{seq},{usec},-;{text}\n")
    d = daemon_factory(root, state, interval=0.5)
    report = d.wait_ready()
    assert wait_until(lambda: records_total(d) == 34), records_total(d)
    report = json.loads(d.get("/v1/report")[1])
    assert "Xid79FallenOffBus" in {f["reason"] for f in report["findings"]}
    d.stop()
    saved = json.loads((tmp_path / "state" / "state.json").read_text())["kmsg"]
    assert (saved["records"], saved["last_seq"], saved["journal_cursor"]) == (34, 1602, None)


def test_the_daemon_says_once_that_the_kernel_log_is_unreadable_until_the_journal_appears(tmp_path, daemon_factory):
    with live_root(tmp_path / "host") as root:
        d = daemon_factory(root, str(tmp_path / "state"), "--only", "kmsg", interval=0.5)
        d.wait_ready()

        def findings():
            return {f["reason"]: f for f in json.loads(d.get("/v1/report")[1])["findings"]}
        unreadable = wait_until(lambda: findings().get("KernelLogUnreadable"))
        assert unreadable and unreadable["check"] == "kmsg" and len(findings()) == 1
        assert "To fix:" in unreadable["message"]
        assert "nodehealth_kernel_log_follower_up 0" in d.get("/metrics")[1].decode()
        write_journal(machine_journal(root), [kernel_entry(XID79, 7_000_000, boot_id(HostPaths(root)), priority=3)])
        assert wait_until(lambda: set(findings()) == {"Xid79FallenOffBus"}, timeout=20.0), findings()
        assert "nodehealth_kernel_log_follower_up 1" in d.get("/metrics")[1].decode()
        d.stop()
