"""The kernel-log collector: framings of saved logs, /dev/kmsg reading, the follower, metrics.

Real logs from tests/fixtures/kmsg/ (see SOURCES.md there) and the fixture machines' dev/kmsg.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.collectors import CollectError, kmsg
from nodehealth.collectors.kernel_events import (
    GPU_FALLEN_OFF_BUS,
    HUNG_TASK,
    KERNEL_CRASH,
    KINDS,
    LINK_DOWN,
    LINK_UP,
    SXID,
    XID,
)
from nodehealth.collectors.kernel_position import Position
from nodehealth.host import HostPaths

HERE = os.path.dirname(os.path.abspath(__file__))
KMSG = os.path.join(HERE, "fixtures", "kmsg")
MACHINES = os.path.join(HERE, "fixtures", "machines")


def read_files(*names: str) -> kmsg.KernelLog:
    return kmsg.collect(None, {"files": [os.path.join(KMSG, n) for n in names]})


def records_of(*lines: str, now: float = 1.8e9, btime=None):
    reader = kmsg.LogLines(btime=btime, now=now)
    return [r for line in lines for r in reader.feed(line)] + reader.flush(), reader


# Every framing, from a real log: (file, records, unframed, events by kind).
FRAMINGS = [
    ("gpud/kmsg.1.log", 47, 0, {}),  # raw /dev/kmsg records
    ("gpud/kmsg.2.peermem.log", 8, 0, {}),
    ("gpud/dmesg-with-xid-119.log", 43, 0, {XID: 5}),  # dmesg -T
    ("m4-logs/jean-zay-iam06.a100.dmesg-T.hung-tasks.txt", 7218, 0, {HUNG_TASK: 10}),
    ("gpud/full-boot-ctime.dmesg.0.log", 902, 0, {LINK_UP: 1}),  # '#' command line, blank line
    ("gpud/dmesg.decode.iso.log.0", 636, 0, {XID: 636}),  # dmesg --decode --time-format iso
    ("gpud/dmesg.decode.iso.log.1", 2362, 0, {LINK_DOWN: 3, LINK_UP: 1}),
    ("gpud/peermem.dmesg.0.log", 41, 0, {XID: 11}),  # --time-format iso
    ("issues/returnn-1480.dmesg-reltime.hung-task-nvidia_uvm.partial.txt", 24, 0, {HUNG_TASK: 1}),  # --reltime
    ("gpud/dmesg-time-format-short-iso.log", 11, 0, {}),  # journalctl -o short-iso
    ("gpud/journalctl-time-format-short-iso-2.log", 47, 0, {}),
    ("issues/cubecos-733.journalctl.mlx5-eth-link-up-flap.txt", 7, 0, {LINK_UP: 4}),  # journalctl short
    ("issues/gpud-1209.journalctl.mlx5-port-link-init-active.partial.txt", 4, 0, {LINK_UP: 1}),  # + systemd lines
    ("issues/frigate-6360.syslog.soft-lockup.wrapped-modules-line.txt", 3, 1, {"soft_lockup": 1}),  # syslog
    ("issues/ollama-4342.syslog.nvidia-rm-stack.reversed.partial.txt", 14, 0, {}),  # /var/log/messages
    ("issues/ironfish-701.syslogd-wall.soft-and-hard-lockup.txt", 9, 0, {"soft_lockup": 6, "hard_lockup": 3}),
    ("issues/open-gpu-kernel-modules-1118.talos-kern-format.gsp-rpc-history.partial.txt", 6, 0, {}),  # Talos
    ("gpud/pstore/dmesg-erst.txt", 39, 0, {KERNEL_CRASH: 1}),  # pstore / ERST
    ("gpud/pstore/7530486857247/dmesg.txt", 415, 4, {LINK_UP: 1, KERNEL_CRASH: 1}),  # with per-part headers
    ("issues/open-gpu-kernel-modules-1150.xid45-caused-by-xid149-145.partial.txt", 7, 0, {XID: 7}),  # bare kernel:
    ("issues/sonic-17358.soft-lockup-panic.indented-elided.txt", 9, 0, {"soft_lockup": 1, KERNEL_CRASH: 1}),
    ("issues/nvsentinel-155.fallen-off-bus-multiline-no-xid.txt", 3, 0, {GPU_FALLEN_OFF_BUS: 1}),
    ("issues/gpud-1160.xid-144-149-netir.lines.txt", 3, 3, {XID: 3}),  # no framing at all
    ("issues/nvsentinel-155.xid79-single-line.quoted.txt", 1, 1, {XID: 1}),  # and no final newline
    ("npd/divide_zero", 20, 20, {KERNEL_CRASH: 1}),
    # lines another tool prefixed (saved/README.md): pdsh and clush, a console time column, other locales
    ("saved/pdsh-exec.dev-vm-6.18.dmesg.txt", 30, 0, {}),
    ("saved/clush-exec.dev-vm-6.18.dmesg-T.txt", 30, 0, {}),
    ("saved/ts.dev-vm-6.18.dmesg.txt", 20, 0, {}),
    ("saved/ts-iso.dev-vm-6.18.dmesg.txt", 20, 0, {}),
    ("saved/dmesg-T.de_DE.dev-vm-6.18.txt", 20, 0, {}),
    ("saved/dmesg-T.fr_FR.dev-vm-6.18.txt", 20, 0, {}),
    ("saved/dmesg-T.ja_JP.dev-vm-6.18.txt", 20, 0, {}),
    ("saved/dmesg-T.ru_RU.dev-vm-6.18.txt", 20, 0, {}),
    ("saved/ask-fedora-15757.journal.ru_RU.kernel-bug.txt", 7, 0, {KERNEL_CRASH: 1}),
    # wall messages as a terminal keeps them (bell, CR LF) and pasted on one line
    ("saved/wall.rsyslog.terminal-capture.txt", 2, 0, {"soft_lockup": 2}),
    ("saved/wall.sysklogd.terminal-capture.txt", 1, 0, {"soft_lockup": 1}),
    ("saved/wall.journald.terminal-capture.txt", 1, 0, {"soft_lockup": 1}),
    ("saved/wall.pasted-on-one-line.txt", 1, 0, {"soft_lockup": 1}),
]


@pytest.mark.parametrize("name, records, unframed, events", FRAMINGS)
def test_framings_of_real_logs(name, records, unframed, events):
    facts = read_files(name)
    assert (facts.records, facts.unframed, facts.malformed, facts.overwritten) == (records, unframed, 0, 0)
    assert Counter(e.kind for e in facts.events) == Counter(events)
    assert facts.source == os.path.join(KMSG, name)
    assert facts.boot_id is None


def test_raw_kmsg_records():
    records, reader = records_of(*open(os.path.join(KMSG, "gpud/kmsg.1.log")).read().splitlines())
    assert [r.seq for r in records] == list(range(3964, 4011))
    first = records[0]
    assert (first.message, first.monotonic_us, first.priority, first.wall_time) == (
        "nvidia-nvswitch2: open (major=510)", 206764307, 6, None)
    assert read_files("gpud/kmsg.1.log").last_seq == 4010


def test_raw_kmsg_dictionary_and_escapes_on_a_real_host():
    # plain-host: this project's own 6.18 VM, read from its /dev/kmsg
    lines = open(os.path.join(MACHINES, "plain-host", "dev", "kmsg")).read().splitlines()
    records, reader = records_of(*lines, btime=1795297965.0)
    assert len(records) == 320 and reader.malformed == reader.unframed == 0
    by_seq = {r.seq: r for r in records}
    assert by_seq[279].message == "virtio-pci 0000:00:01.0: enabling device (0000 -> 0002)"
    assert by_seq[279].dictionary == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:00:01.0"}
    assert by_seq[90].message == "rcu: \\x09RCU restricting CPUs from NR_CPUS=256 to nr_cpu_ids=2."
    assert by_seq[255].priority == 4
    assert by_seq[279].wall_time == pytest.approx(1795297965.134680, abs=1e-6)


def test_kmsg_caller_field_in_the_header():
    [record], _ = records_of("6,812,4711,-,caller=T1946;usb 1-2: new device")
    assert (record.seq, record.message) == (812, "usb 1-2: new device")


@pytest.mark.parametrize("line, message, monotonic_us, wall_time, priority", [
    ("[  123.456789] [ T1946] usb 1-2: new device", "usb 1-2: new device", 123456789, None, None),
    ("[  123.456789][    C3] usb 1-2: new device", "usb 1-2: new device", 123456789, None, None),
    ("<6>[  201.650687] sysrq: SysRq : Trigger a crash", "sysrq: SysRq : Trigger a crash", 201650687, None, 6),
    ("<30>[   13.235644] systemd[1]: Listening", "systemd[1]: Listening", 13235644, None, 6),
    ("kern  :warn  : 2025-01-21T04:41:44,283302+00:00 VFS: x", "VFS: x", None, 1737434504.283302, 4),
    ("kern  :err   : [Sun Feb 23 16:24:18 2025] oops", "oops", None, 1740327858.0, 3),
    ("2024-11-15T12:02:03,470068+00:00 NVRM: x", "NVRM: x", None, 1731672123.470068, None),
    ("2025-01-02T15:20:12+0800 host kernel: docker0: port 1", "docker0: port 1", None, 1735802412.0, None),
    ("2024-01-02T03:04:05.123456+00:00 host kernel: msg", "msg", None, 1704164645.123456, None),
    ("[Sat Apr  3 05:23:42 2021] watchdog: x", "watchdog: x", None, 1617427422.0, None),
    ("[  +0.000049] task:python3.11", "task:python3.11", None, None, None),
    ("[Sep26 00:30] python D", "python D", None, None, None),
    ("192.168.11.119: kern: warning: [2026-04-22T21:27:51.28885631Z]: NVRM: x", "NVRM: x", None,
     1776893271.28885631, 4),
    ("Jan  2 03:04:05 host kernel: [  219.470994] NVRM: x", "NVRM: x", 219470994, 1798859045.0, None),
    ("Jan  2 03:04:05.250000 host kernel: msg", "msg", None, 1798859045.25, None),
    ("Jan  2 03:04:05 kernel: mce: [Hardware Error]: x", "mce: [Hardware Error]: x", None, 1798859045.0,
     None),  # no host
    ("Jan  2 03:04:05  kernel: EDAC MC1: x", "EDAC MC1: x", None, 1798859045.0, None),  # an empty host
    # prefixed by pdsh/clush, a console server's or `ts`'s time column; dmesg -T and journalctl in other locales
    ("gpu-node-01: [  219.470994] NVRM: x", "NVRM: x", 219470994, None, None),
    ("gpu-node-01.cluster: Jan  2 03:04:05 host kernel: [  219.470994] NVRM: x", "NVRM: x", 219470994, 1798859045.0,
     None),
    ("gpu-node-01: [Sat Jan  2 03:04:05 2027] NVRM: x", "NVRM: x", None, 1798859045.0, None),
    ("gpu-node-01: <4>[  219.470994] NVRM: x", "NVRM: x", 219470994, None, 4),
    ("Jan  2 03:04:05 [  219.470994] NVRM: x", "NVRM: x", 219470994, 1798859045.0, None),
    ("2027-01-02 03:04:05 [  219.470994] NVRM: x", "NVRM: x", 219470994, 1798859045.0, None),
    ("[2027-01-02T04:04:05.500+01:00] [  219.470994] NVRM: x", "NVRM: x", 219470994, 1798859045.5, None),
    ("2027-01-02T03:04:05,000000+00:00 [  219.470994] NVRM: x", "NVRM: x", 219470994, 1798859045.0, None),
    ("[Sa Jan  2 03:04:05 2027] NVRM: x", "NVRM: x", None, 1798859045.0, None),
    ("[sam. janv.  2 03:04:05 2027] NVRM: x", "NVRM: x", None, 1798859045.0, None),
    ("[土  1月  2 03:04:05 2027] NVRM: x", "NVRM: x", None, 1798859045.0, None),
    ("[Сб янв  2 03:04:05 2027] NVRM: x", "NVRM: x", None, 1798859045.0, None),
    ("[xx yyy  2 03:04:05 2027] NVRM: x", "NVRM: x", None, None, None),  # a month no locale here names: no time
    ("Jän 02 03:04:05 host kernel: NVRM: x", "Jän 02 03:04:05 host kernel: NVRM: x", None, None, None),  # unknown
    ("янв 02 03:04:05 host kernel: NVRM: x", "NVRM: x", None, 1798859045.0, None),
    ("Dez 02 03:04:05 host kernel: NVRM: x", "NVRM: x", None, 1796180645.0, None),  # December: last year's
    ("Message from syslogd@h at Sat Jan  2 03:04:05 2027 ... h kernel: NVRM: x", "NVRM: x", None, 1798859045.0, None),
    ("Message from syslogd@h at Jan  2 03:04:05 ... kernel:[  219.470994] NVRM: x", "NVRM: x", 219470994,
     1798859045.0, None),
])
def test_framing_fields(line, message, monotonic_us, wall_time, priority):
    [record], _ = records_of(line, now=1.8e9)  # 2027-01-15: syslog's missing year is 2027
    assert record.message == message
    assert record.monotonic_us == monotonic_us
    assert record.wall_time == (pytest.approx(wall_time, abs=1e-6) if wall_time is not None else None)
    assert record.priority == priority


def test_syslog_year_is_never_in_the_future():
    now = 1767225600.0  # 2026-01-01 00:00 UTC: a December line is from 2025
    [record], _ = records_of("Dec 10 05:25:44 host kernel: x", now=now)
    assert record.wall_time == 1765344344.0  # 2025-12-10 05:25:44 UTC


def test_real_log_times():
    talos = read_files("issues/open-gpu-kernel-modules-1118.talos-kern-format.gsp-rpc-history.partial.txt")
    assert talos.events == ()
    [record], _ = records_of(open(os.path.join(
        KMSG, "issues/open-gpu-kernel-modules-1118.talos-kern-format.gsp-rpc-history.partial.txt")).readline())
    assert record.wall_time == pytest.approx(1776893271.288830314, abs=1e-6)
    assert record.message.startswith("NVRM:      0    76   GSP_RM_CONTROL")
    wall = read_files("issues/ironfish-701.syslogd-wall.soft-and-hard-lockup.txt").events[0]
    assert wall.monotonic_us == 55716328117
    assert time.gmtime(wall.wall_time)[1:6] == (12, 10, 5, 25, 44)
    short_iso = read_files("gpud/dmesg.decode.iso.log.1").events[0]
    assert short_iso.wall_time == pytest.approx(1737128248.650514, abs=1e-6)  # 2025-01-17T15:37:28,650514+00:00


def test_times_of_saved_logs_in_other_framings():
    """dmesg -T in four locales, `ts` columns and wall captures: the time is read, not just the text."""
    boot_line = (2026, 11, 26, 14, 10, 43)
    for locale in ("de_DE", "fr_FR", "ja_JP", "ru_RU"):
        [first, *_], _ = records_of(*open(os.path.join(KMSG, f"saved/dmesg-T.{locale}.dev-vm-6.18.txt"),
                                         encoding="utf-8").read().splitlines())
        assert time.gmtime(first.wall_time)[:6] == boot_line, locale
        assert first.message.startswith("Linux version 6.18.44"), locale
    for name in ("ts", "ts-iso"):
        first = records_of(open(os.path.join(KMSG, f"saved/{name}.dev-vm-6.18.dmesg.txt")).readline())[0][0]
        assert (first.monotonic_us, time.gmtime(first.wall_time)[1:6]) == (0, (11, 26, 14, 29, 41)), name
    pdsh = records_of(*open(os.path.join(KMSG, "saved/pdsh-exec.dev-vm-6.18.dmesg.txt")).read().splitlines())[0]
    assert pdsh[0].message.startswith("Linux version") and pdsh[0].monotonic_us == 0
    [sysklogd] = read_files("saved/wall.sysklogd.terminal-capture.txt").events
    assert (sysklogd.monotonic_us, time.gmtime(sysklogd.wall_time)[:6]) == (1044858108, (2015, 10, 3, 16, 41, 40))
    [journald] = read_files("saved/wall.journald.terminal-capture.txt").events
    assert time.gmtime(journald.wall_time)[:6] == (2023, 4, 15, 10, 22, 13)


@pytest.mark.parametrize("line", [
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "nvme0n1: p1 p2",
    "note: [1.5] is not a dmesg time stamp",
    "pci 0000:00:1f.0: [8086:a1c8] type 00 class 0x060100",
    "ACPI: [Firmware Bug]: BIOS _OSI(Linux) query ignored",
    "Foo 12 03:04:05 [  1.000000] x",  # no month of any locale: no console column
    "Smarch 1 12:00:00 host kernel: x",
    "gpu-node-01: #include <stdio.h>",
    "[Thursday is a nice day 12 03:04:05 2026] quoting",
])
def test_ordinary_text_is_not_taken_for_a_prefixed_log(line):
    [record], reader = records_of(line)
    assert (record.message, record.monotonic_us, record.wall_time, reader.unframed) == (line, None, None, 1)


_REAL_FRAMED_LINES = [line for name in ("gpud/dmesg-with-xid-119.log", "gpud/peermem.dmesg.0.log",
                                        "issues/ironfish-701.syslogd-wall.soft-and-hard-lockup.txt",
                                        "issues/cubecos-733.journalctl.mlx5-eth-link-up-flap.txt",
                                        "gpud/dmesg.decode.iso.log.0", "gpud/kmsg.1.log",
                                        "saved/ts.dev-vm-6.18.dmesg.txt",
                                        "saved/dmesg-T.ja_JP.dev-vm-6.18.txt")
                      for line in open(os.path.join(KMSG, name), encoding="utf-8").read().splitlines()[:40]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(_REAL_FRAMED_LINES), min_size=1, max_size=12),
       st.from_regex(r"[a-z][a-z0-9-]{0,15}(\.[a-z0-9]{1,8}){0,2}", fullmatch=True))
def test_a_host_prefix_changes_no_record(lines, host):
    """pdsh/clush output of real logs frames exactly as the logs do, whatever the host is called."""
    plain, plain_reader = records_of(*lines)
    prefixed, prefixed_reader = records_of(*(f"{host}: {line}" for line in lines))
    key = [(r.message, r.seq, r.monotonic_us, r.wall_time, r.priority) for r in plain]
    assert [(r.message, r.seq, r.monotonic_us, r.wall_time, r.priority) for r in prefixed] == key
    assert (prefixed_reader.unframed, prefixed_reader.malformed) == (plain_reader.unframed, plain_reader.malformed)


def test_post_mortem_of_pdsh_output_in_another_locale(tmp_path, capsys):
    """End to end: `nodehealth check --kernel-log` on pdsh-prefixed, German dmesg -T lines finds and dates them."""
    import json

    from nodehealth import cli

    path = tmp_path / "pdsh-dmesg-T.log"
    path.write_text(
        # gpu-operator#1146's Xid 48 and machine-shop-66's EDAC line (real messages), as pdsh and dmesg -T print them
        "gpu-node-07: [Mo Okt  3 13:52:10 2022] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An "
        "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 "
        "partition 7, subpartition 1.\n"
        "gpu-node-07: [Mo Okt  3 13:52:12 2022] EDAC MC1: 262 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 "
        "(channel:1 slot:0 page:0x2031c14 offset:0x940 grain:32 syndrome:0x0 -  OVERFLOW area:DRAM err_code:0001:0091 "
        "socket:0 ha:0 channel_mask:2 rank:1)\n", encoding="utf-8")
    code = cli.main(["check", "--kernel-log", str(path), "--only", "kmsg", "--json"])
    doc = json.loads(capsys.readouterr().out)
    found = {f["reason"]: f for f in doc["findings"]}
    assert code == 1 and set(found) == {"Xid48DoubleBitEcc", "MemoryCorrected"}
    assert time.gmtime(found["Xid48DoubleBitEcc"]["first_seen"])[:6] == (2022, 10, 3, 13, 52, 10)
    assert found["MemoryCorrected"]["severity"] == "degraded"


def test_a_log_of_several_nodes_is_refused_not_judged_as_one(tmp_path):
    """pdsh output of two nodes: adding up their errors (and merging GPUs that share a bus id) would be a false
    verdict about a node that does not exist."""
    with pytest.raises(CollectError, match=r"kernel log of 2 nodes \(gpu-node-01, gpu-node-02\) .* judges one node"):
        read_files("saved/pdsh-exec.two-nodes.dev-vm-6.18.dmesg.txt")
    one = tmp_path / "one-node.log"  # the same capture, one node's lines kept
    one.write_text("".join(line for line in open(os.path.join(KMSG, "saved/pdsh-exec.two-nodes.dev-vm-6.18.dmesg.txt"))
                           if line.startswith("gpu-node-01: ")))
    assert kmsg.collect(None, {"files": [str(one)]}).records == 5


def test_non_kernel_syslog_lines_are_skipped():
    facts = read_files("issues/gpud-1209.journalctl.mlx5-port-link-init-active.partial.txt")
    assert facts.records == 4  # of 9 lines, 5 are systemd's


def test_dmesg_continuation_lines_join_their_record():
    records, _ = records_of(*open(os.path.join(KMSG, "issues/nvsentinel-155.fallen-off-bus-multiline-no-xid.txt")))
    assert records[0].message == ("NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this "
                                  "system has\nNVRM: fallen off the bus and is not responding to commands.")


def write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_garbage_and_long_lines(tmp_path):
    long_line = b"[    1.000000] " + b"x" * (200 * 1024)
    path = write(str(tmp_path / "log"), b"\x00\x01\xff\xfe binary\n" + long_line + b"\n"
                 b"[    2.000000] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\nplain words")
    facts = kmsg.collect(None, {"files": [path]})
    assert (facts.records, facts.malformed, facts.unframed) == (3, 1, 1)
    assert [(e.code, e.monotonic_us) for e in facts.events] == [(79, 2000000)]


def test_files_are_read_in_order(tmp_path):
    a = write(str(tmp_path / "a"), b"4,1,10,-;NVRM: Xid (PCI:0000:3b:00): 48, DBE\n")
    b = write(str(tmp_path / "b"), b"4,2,20,-;NVRM: Xid (PCI:0000:3b:00): 63, Row Remapper\n")
    facts = kmsg.collect(None, {"files": [a, b]})
    assert [e.code for e in facts.events] == [48, 63]
    assert facts.last_seq == 2
    assert facts.source == f"{a}, {b}"


@pytest.mark.parametrize("make", ["missing", "directory", "fifo"])
def test_unreadable_file_is_a_collect_error_naming_it(tmp_path, make):
    path = str(tmp_path / make)
    if make == "directory":
        os.mkdir(path)
    elif make == "fifo":
        os.mkfifo(path)
    with pytest.raises(CollectError, match=make):
        kmsg.collect(None, {"files": [path]})


XID_LOG = (b"[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
           b"[Fri Aug 30 11:43:15 2024] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, An uncorrectable double bit error\n")


def compress(kind: str, data: bytes) -> bytes:
    if kind == "gz":
        import gzip
        return gzip.compress(data)
    if kind == "xz":
        import lzma
        return lzma.compress(data)
    zstandard = pytest.importorskip("zstandard")
    return zstandard.ZstdCompressor().compress(data)


@pytest.mark.parametrize("kind", ["gz", "xz", "zst"])
def test_rotated_compressed_logs_are_read(tmp_path, kind):
    path = write(str(tmp_path / f"kern.log.1.{kind}"), compress(kind, XID_LOG))
    facts = kmsg.collect(None, {"files": [path]})
    assert [(e.code, e.device) for e in facts.events] == [(79, "0000:3b:00.0"), (48, "0000:3b:00.0")]


def test_zstd_without_the_zstandard_package_is_a_clear_error(tmp_path, monkeypatch):
    path = write(str(tmp_path / "kern.log.zst"), b"\x28\xb5\x2f\xfd" + b"\x00" * 20)
    monkeypatch.setitem(__import__("sys").modules, "zstandard", None)  # import zstandard raises ImportError
    with pytest.raises(CollectError, match=r"kern.log.zst is zstd-compressed.*zstandard package"):
        kmsg.collect(None, {"files": [path]})


@pytest.mark.parametrize("kind", ["gz", "xz"])
def test_corrupt_compressed_log_is_a_collect_error_naming_it(tmp_path, kind):
    path = write(str(tmp_path / f"kern.{kind}"), compress(kind, XID_LOG * 50)[:40])
    with pytest.raises(CollectError, match=f"kern.{kind}"):
        kmsg.collect(None, {"files": [path]})


@pytest.mark.parametrize("data", [b"", b"\n\n", os.urandom(4096).replace(b"\n", b"") + b"\n" + bytes(range(256))])
def test_an_empty_or_binary_log_is_no_record_at_all(tmp_path, data):
    path = write(str(tmp_path / "kern.bin"), data)
    with pytest.raises(CollectError, match=r"0 records recognised in .*kern.bin"):
        kmsg.collect(None, {"files": [path, os.path.join(KMSG, "gpud", "kmsg.1.log")]})


def test_supported():
    assert kmsg.supported(HostPaths(os.path.join(MACHINES, "plain-host")), {"files": []}) is None
    empty = HostPaths(tempfile.gettempdir() + "/nodehealth-no-such-root")
    assert "dev/kmsg" in kmsg.supported(empty, {"files": []})
    assert kmsg.supported(empty, {"files": ["/var/log/kern.log"]}) is None


# /dev/kmsg reading: EPIPE and EAGAIN through a fake read ------------------------------------

def fake_read(*answers):
    """An os.read stand-in: bytes are records, exceptions are raised; then EAGAIN forever."""
    queue = list(answers)

    def read(size: int) -> bytes:
        assert size >= 8192
        if not queue:
            raise BlockingIOError(errno.EAGAIN, "no record")
        answer = queue.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer
    return read


def epipe() -> BrokenPipeError:
    return BrokenPipeError(errno.EPIPE, "overwritten")


def test_read_kmsg_counts_overwritten_records_and_goes_on():
    records, overwritten = kmsg.read_kmsg(fake_read(b"6,5,1,-;a\n", epipe(), b"6,9,2,-;b\n", b"6,10,3,-;c\n"))
    assert records == [b"6,5,1,-;a\n", b"6,9,2,-;b\n", b"6,10,3,-;c\n"]
    assert overwritten == 3  # 6, 7 and 8


def test_read_kmsg_epipe_without_a_known_sequence_counts_one():
    records, overwritten = kmsg.read_kmsg(fake_read(epipe(), b"6,70,1,-;a\n"))
    assert (len(records), overwritten) == (1, 1)
    assert kmsg.read_kmsg(fake_read(epipe(), b"6,70,1,-;a\n"), last_seq=66)[1] == 3


def test_read_kmsg_stops_at_its_limit_and_on_endless_epipe():
    many = [f"6,{i},{i},-;x\n".encode() for i in range(10)]
    records, _ = kmsg.read_kmsg(fake_read(*many), limit=4)
    assert len(records) == 4

    def broken(size: int) -> bytes:
        raise epipe()
    records, overwritten = kmsg.read_kmsg(broken, limit=5)
    assert records == [] and overwritten == 11


def test_read_kmsg_passes_other_errors_on():
    with pytest.raises(OSError):
        kmsg.read_kmsg(fake_read(OSError(errno.EINVAL, "buffer too small")))


# The follower on a regular file (fixture machines) --------------------------------------------

@pytest.fixture
def machine_root(tmp_path):
    root = tmp_path / "machine"
    shutil.copytree(os.path.join(MACHINES, "plain-host"), root)
    return root


def append(root, text: str) -> None:
    with open(root / "dev" / "kmsg", "a") as f:
        f.write(text)


def test_follower_on_a_file_returns_only_new_records(machine_root):
    follower = kmsg.KmsgFollower(HostPaths(str(machine_root)), {})
    count, overwritten, last_seq, events = follower.read_new()
    assert (count, overwritten, last_seq, events) == (320, 0, 321, [])
    assert follower.read_new() == (0, 0, 321, [])
    append(machine_root, "4,322,348000000,-;NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.\n"
                         "6,323,348000001,-;mlx5_core 0000:1b:00.1 enp27s0f1np1: Link d")
    count, _, last_seq, events = follower.read_new()
    assert (count, last_seq) == (1, 322)  # the half-written line waits for its newline
    assert [(e.kind, e.device, e.code, e.seq) for e in events] == [(XID, "0000:1b:00.0", 79, 322)]
    assert events[0].wall_time == pytest.approx(1795297965 + 348.0, abs=1e-6)  # proc/stat btime + usec
    append(machine_root, "own\n")
    count, _, last_seq, events = follower.read_new()
    assert (count, last_seq) == (1, 323)
    assert [(e.kind, e.device) for e in events] == [(LINK_DOWN, "enp27s0f1np1")]
    follower.close()
    follower.close()


def test_follower_restarts_at_zero_after_truncation_and_skips_what_it_saw(machine_root):
    follower = kmsg.KmsgFollower(HostPaths(str(machine_root)), {})
    follower.read_new()
    (machine_root / "dev" / "kmsg").write_text("6,300,1,-;old record\n6,400,2,-;NVRM: Xid (PCI:0000:3b:00): 48, x\n")
    count, _, last_seq, events = follower.read_new()
    assert (count, last_seq, [e.code for e in events]) == (1, 400, [48])
    follower.close()


def test_follower_skips_records_at_or_below_the_positions_sequence_number(machine_root):
    follower = kmsg.KmsgFollower(HostPaths(str(machine_root)), {}, Position(seq=300))
    count, _, last_seq, _ = follower.read_new()
    assert (count, last_seq) == (21, 321)  # 301 .. 321
    follower.close()
    assert kmsg.KmsgFollower(HostPaths(str(machine_root)), {}, Position(seq=999)).read_new() == (0, 0, 999, [])


def test_follower_holds_an_sxid_only_within_one_read(machine_root):
    follower = kmsg.KmsgFollower(HostPaths(str(machine_root)), {}, Position(seq=321))
    append(machine_root, "3,322,5,-;nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 22013, Non-fatal, Link 44 Minion\n")
    [event] = follower.read_new()[3]
    assert (event.kind, event.detail["link"]) == (SXID, 44)
    follower.close()


# Fixture machines -------------------------------------------------------------------------------

def test_h100_machine_kernel_log():
    host = HostPaths(os.path.join(MACHINES, "h100-8x-cx7"))
    facts = kmsg.collect(host, {"files": []})
    assert facts.source == host.dev("kmsg")
    assert facts.boot_id == open(host.proc("sys", "kernel", "random", "boot_id")).read().strip()
    assert (facts.records, facts.overwritten, facts.malformed, facts.last_seq) == (31, 0, 0, 1510)
    assert Counter(e.kind for e in facts.events) == Counter(
        {XID: 11, SXID: 2, LINK_DOWN: 3, LINK_UP: 2, HUNG_TASK: 1})
    assert Counter((e.device, e.code) for e in facts.events if e.kind == XID) == Counter({
        ("0000:19:00.0", 48): 1, ("0000:19:00.0", 63): 1, ("0000:19:00.0", 94): 2, ("0000:3b:00.0", 13): 3,
        ("0000:3b:00.0", 43): 1, ("0000:9b:00.0", 119): 2, ("0000:cb:00.0", 79): 1})
    sxid = [e for e in facts.events if e.kind == SXID]
    assert [(e.device, e.code, e.detail["link"]) for e in sxid] == [("0000:86:00.0", 22013, 44),
                                                                   ("0000:85:00.0", 12028, 61)]
    assert sxid[0].detail["engine_instance"] == 44
    assert all(e.wall_time is not None and e.wall_time > 1732000000 for e in facts.events)


def test_plain_host_has_no_events():
    facts = kmsg.collect(HostPaths(os.path.join(MACHINES, "plain-host")), {"files": []})
    assert (facts.records, facts.last_seq, facts.events) == (320, 321, ())


def test_metrics():
    facts = kmsg.collect(HostPaths(os.path.join(MACHINES, "h100-8x-cx7")), {"files": []})
    families = {m.name: m for m in kmsg.metrics(facts)}
    assert all(m.kind == "counter" and m.name.endswith("_total") for m in families.values())
    assert families["nodehealth_kernel_log_records_total"].samples == [((), 31.0)]
    kinds = dict(families["nodehealth_kernel_events_total"].samples)
    assert set(kinds) == {(k,) for k in KINDS}
    assert kinds[("xid",)] == 11 and kinds[("hard_lockup",)] == 0
    xids = families["nodehealth_gpu_xid_events_total"].samples
    assert xids[:3] == [(("0000:19:00.0", "48"), 1.0), (("0000:19:00.0", "63"), 1.0), (("0000:19:00.0", "94"), 2.0)]
    assert (("0000:9b:00.0", "119"), 2.0) in xids
    assert families["nodehealth_nvswitch_sxid_events_total"].samples == [
        (("0000:85:00.0", "12028"), 1.0), (("0000:86:00.0", "22013"), 1.0)]
    empty = kmsg.metrics(kmsg.KernelLog("x", None, 0, 0, 0, None, ()))
    assert [len(m.samples) for m in empty] == [1, 1, 1, 1, len(KINDS), 0, 0]


# The live /dev/kmsg of this machine ---------------------------------------------------------------

def live_kmsg_usable() -> bool:
    try:
        if not stat.S_ISCHR(os.stat("/dev/kmsg").st_mode):
            return False
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
        return os.access("/dev/kmsg", os.W_OK)
    except OSError:
        return False


@pytest.mark.skipif(not live_kmsg_usable(), reason="/dev/kmsg is not readable and writable here")
def test_live_kmsg_follower_sees_a_new_record():
    host = HostPaths("/")
    follower = kmsg.KmsgFollower(host, {})
    try:
        count, _, before, _ = follower.read_new()  # the whole ring first
        assert count > 0 and before is not None
        marker = f"nodehealth test marker {uuid.uuid4()}"  # harmless text: no event for anyone
        with open("/dev/kmsg", "w") as f:
            f.write(f"<6>{marker}\n")
        follower.wait(2.0)
        count, _, after, events = follower.read_new()
        assert count >= 1 and after > before
        assert not any(marker in e.text for e in events)
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        try:
            raw, _ = kmsg.read_kmsg(lambda n: os.read(fd, n))
        finally:
            os.close(fd)
        [line] = [r.decode() for r in raw if marker.encode() in r]
        seq = int(line.split(",")[1])
        assert before < seq <= after
        follower.wait(0.05)
        assert follower.read_new()[0] == 0 or follower.last_seq > after
    finally:
        follower.close()
    facts = kmsg.collect(host, {"files": []})
    assert facts.source == "/dev/kmsg" and facts.records > 0
    assert facts.boot_id == open("/proc/sys/kernel/random/boot_id").read().strip()


# Fuzzing ------------------------------------------------------------------------------------------

_LINE_PARTS = st.sampled_from([
    "6,", "12,", "99999999999999999999999,", "-;", "c;", ",caller=T1;", ";", " SUBSYSTEM=pci", " ", "[", "]",
    "[  12.345]", "[ T12]", "<6>", "kern  :warn  : ", "2024-01-02T03:04:05,123456+00:00 ", "2024-13-45T99:99:99Z",
    "Jan  2 03:04:05 host kernel: ", "Feb 30 25:61:61 h kernel: ", "x: kern: warning: [", "]: ", "Message from "
    "syslogd@h at Dec 10 05:25:44 ...", "[Fri Aug 30 11:43:14 2024] ", "[Fri Feb 31 11:43:14 0000] ", "#",
    "NVRM: Xid (PCI:0000:3b:00): 79, ", "\x00", "\xff", "\t", "\r", "\ufffd", "é",
    "gpu-node-01: ", "2024-06-11 10:22:33 ", "[2024-06-11T10:22:33+02:00] ", "Jun 11 10:22:33 ",
    "[Do Nov 26 14:10:43 2026] ", "[木  1月 26 14:10:43 2026] ", "янв 02 03:04:05 h kernel: ", "\x07",
    "Broadcast message from systemd-journald@h (Tue 2024-06-11 10:22:33 UTC):",
    "Message from syslogd@h at Sat Oct  3 16:41:40 2015 ...", " h kernel: ", "kernel:",
])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=120), st.lists(_LINE_PARTS, max_size=8).map("".join)), max_size=20))
def test_fuzz_log_lines(lines):
    reader = kmsg.LogLines(btime=1.7e9, now=1.8e9)
    records = [r for line in lines for r in reader.feed(line)] + reader.flush()
    lines_and_crs = sum(len(line.rstrip("\r\n").split("\r")) for line in lines)  # a CR ends a line too
    assert len(records) + reader.malformed <= lines_and_crs
    assert all(isinstance(r.message, str) for r in records)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=2000))
def test_fuzz_saved_log_bytes(data):
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        try:
            facts = kmsg.collect(None, {"files": [f.name]})
        except CollectError as e:  # the one clear error for bytes that hold no kernel log at all
            assert str(e).startswith(("0 records recognised in", "cannot read kernel log", "the kernel log of")), e
            return
    assert facts.records + facts.malformed <= data.count(b"\n") + data.count(b"\r") + 1
    assert all(e.kind in KINDS for e in facts.events)


def test_an_idle_follower_on_a_file_sleeps_until_the_file_changes(machine_root):
    """inotify: no wake-up every 10 ms while nothing happens, and a new line wakes it at once."""
    import threading

    follower = kmsg.KmsgFollower(HostPaths(str(machine_root)), {})
    follower.read_new()
    assert follower._watch is not None  # Linux has inotify
    t0 = time.monotonic()
    follower.wait(0.5)
    assert time.monotonic() - t0 >= 0.45  # slept the whole timeout: nothing changed
    threading.Timer(0.2, append, (machine_root, "3,999999,5,-;NVRM: Xid (PCI:0000:3b:00): 13, Graphics\n")).start()
    t0 = time.monotonic()
    follower.wait(5.0)
    assert time.monotonic() - t0 < 2.0
    assert [e.code for e in follower.read_new()[3]] == [13]
    follower.close()


def test_without_inotify_an_idle_follower_backs_off(machine_root, monkeypatch):
    def no_inotify(path):
        raise OSError(errno.EMFILE, "inotify instances used up")

    monkeypatch.setattr(kmsg, "_FileWatch", no_inotify)
    follower = kmsg.KmsgFollower(HostPaths(str(machine_root)), {})
    follower.read_new()
    sleeps = []
    monkeypatch.setattr(kmsg.time, "sleep", sleeps.append)
    for _ in range(10):
        follower.wait(5.0)
    assert sleeps[0] == kmsg.FILE_POLL_SECONDS[0] and sleeps[-1] == kmsg.FILE_POLL_SECONDS[1]
    append(machine_root, "3,999999,5,-;NVRM: Xid (PCI:0000:3b:00): 13, Graphics\n")
    follower.read_new()
    follower.wait(5.0)
    assert sleeps[-1] == kmsg.FILE_POLL_SECONDS[0]  # busy again: back to quick polls
    follower.close()
