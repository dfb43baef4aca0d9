"""Kernel events from kernel log records: Xid, SXid, GPU off the bus, hung tasks, lockups, links.

Real lines from tests/fixtures/kmsg/ (see SOURCES.md there), plus the odd Xid layouts quoted
in docs/domain/xid.md section 4.2.
"""
from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.collectors import kmsg
from nodehealth.collectors.kernel_events import (
    GPU_FALLEN_OFF_BUS,
    HARD_LOCKUP,
    HUNG_TASK,
    KINDS,
    LINK_DOWN,
    LINK_UP,
    SOFT_LOCKUP,
    SXID,
    XID,
    EventParser,
    KernelRecord,
    canonical_pci,
    events_from_records,
)

KMSG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "kmsg")


def events_of_file(name: str):
    return list(kmsg.collect(None, {"files": [os.path.join(KMSG, name)]}).events)


def events_of_lines(*lines: str):
    reader = kmsg.LogLines(now=1.8e9)
    records = [r for line in lines for r in reader.feed(line)] + reader.flush()
    return list(events_from_records(records))


def kinds(events) -> Counter:
    return Counter(e.kind for e in events)


@pytest.mark.parametrize("address, expected", [
    ("0000:3b:00", "0000:3b:00.0"),
    ("0000:CB:00", "0000:cb:00.0"),
    ("0:3b:00", "0000:3b:00.0"),
    ("3b:00", "0000:3b:00.0"),
    ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML's 8-digit domain
    ("0019:01:00", "0019:01:00.0"),
    ("0000:01:00.1", "0000:01:00.1"),
    ("...", ""),
    ("", ""),
    ("0000:3b", ""),
    ("zz:00:00", ""),
])
def test_canonical_pci(address, expected):
    assert canonical_pci(address) == expected


# The odd Xid layouts of xid.md 4.2, each with its framing as quoted there.
XID_CASES = [
    # (line, device, xid, pid, name, text starts with)
    ("[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, "
     "errorString CTX SWITCH TIMEOUT, Info 0x58005",
     "0000:cb:00.0", 109, 1797828, "pt_main_thread", "Ch 00000008, errorString CTX SWITCH TIMEOUT"),
    ("Jan 17 11:33:15 EVE kernel: NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, "
     "GPU has fallen off the bus.",
     "0000:01:00.0", 79, None, None, "GPU has fallen off the bus."),
    ("Apr 29 19:24:11 EVE kernel: NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
     "0000:01:00.0", 79, None, None, "GPU has fallen off the bus."),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
     "0000:10:1c.0", 63, 1896, None, "Row Remapper: New row marked"),
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
     "0000:01:00.0", 94, 7194, None, "Contained: CE User Channel (0x9)."),
    ("kernel: NVRM: Xid (PCI:...): 137, RLW_RXPIPE interrupt hit on link 11 on GPU0: PRIV Error",
     "", 137, None, None, "RLW_RXPIPE interrupt hit on link 11"),
    ("May 10 22:25:01 jambi kernel: [176830.774761] NVRM: Xid (0000:03:00): 13, 0003 00000000 00008297 00001098 "
     "00000000 00000044",
     "0000:03:00.0", 13, None, None, "0003 00000000 00008297"),
    ("Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', "
     "name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
     "0x7fffa8860 partition 7, subpartition 1.",
     "0000:07:00.0", 48, None, None, "An uncorrectable double bit error (DBE)"),
    ("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 "
     "0x00000000 0x00000000)",
     "0019:01:00.0", 149, None, None, "NETIR Fatal XC0 i0 Link -1"),
    ("[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 "
     "0x00000000 0x00000000 0x00000000 0x00000000)",
     "0009:01:00.0", 149, None, None, "NETIR_LINK_EVT  Fatal   XC0 i0 Link 01"),
    ("kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
     "0000:dc:00.0", 45, 1818990, "python3", "Ch 00000001 caused by previous Xid 149"),
    ("[449410.332316] NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected "
     "on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
     "0003:00:00.0", 74, None, None, "NVLink: fatal error detected on link 14(0x0"),
    ("[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 "
     "(Drain and Reset)",
     "0009:01:00.0", 154, None, None, "GPU recovery action changed from 0x0 (None) to 0x4"),
    # the unquoted form one document shows
    ("NVRM: Xid (PCI:0000:3b:00): 31, pid=<unknown>, name=<unknown>, Ch 0000000a, intr 00000000. MMU Fault",
     "0000:3b:00.0", 31, None, None, "Ch 0000000a, intr 00000000. MMU Fault"),
    # cut short: no text after the number
    ("NVRM: Xid (PCI:0000:3b:00): 8", "0000:3b:00.0", 8, None, None, ""),
]


@pytest.mark.parametrize("line, device, xid, pid, name, text", XID_CASES)
def test_xid_layouts(line, device, xid, pid, name, text):
    [event] = events_of_lines(line)
    assert (event.kind, event.device, event.code) == (XID, device, xid)
    assert event.detail["pid"] == pid
    assert event.detail["name"] == name
    assert event.text.startswith(text)


def test_mig_xid_keeps_the_gpu_instance():
    [event] = events_of_lines(XID_CASES[4][0])
    assert event.detail["gpu_instance"] == 5


def test_xid_time_comes_from_its_framing():
    [ctime] = events_of_lines(XID_CASES[0][0])
    assert ctime.wall_time == 1725018194.0  # 2024-08-30 11:43:14 UTC
    [stamped] = events_of_lines(XID_CASES[7][0])
    assert stamped.monotonic_us == 219470994


@pytest.mark.parametrize("name, xids", [
    ("gpud/dmesg-with-xid-119.log", {("0000:9b:00.0", 119): 5}),
    ("gpud/dmesg.decode.iso.log.0", {("0000:38:00.0", 13): 629, ("0000:38:00.0", 43): 7}),
    ("gpud/memory-xid13.dmesg.decode.iso.log", {("0000:38:00.0", 13): 16, ("0000:38:00.0", 43): 1}),
    ("gpud/peermem.dmesg.0.log", {("0000:19:00.0", 48): 1, ("0000:19:00.0", 63): 1, ("0000:19:00.0", 94): 9}),
    ("imbue-cluster-health/doctest-lines.xid94-xid64-sxid12028-mlx5-pcie-limited.txt",
     {("0000:0f:00.0", 94): 1, ("0000:0f:00.0", 64): 1}),
    ("issues/gpud-1160.xid-144-149-netir.lines.txt", {("0000:01:00.0", 144): 1, ("0000:00:00.0", 149): 2}),
    ("issues/gpud-1174.xid-149-145-94.kmsg-inputs.lines.txt",
     {("0019:01:00.0", 149): 1, ("0000:00:00.0", 149): 1, ("0018:01:00.0", 145): 1, ("0000:9b:00.0", 94): 1}),
    ("issues/open-gpu-kernel-modules-1150.xid45-caused-by-xid149-145.partial.txt",
     {("0000:dc:00.0", 45): 2, ("0000:ed:00.0", 45): 2, ("0000:ba:00.0", 45): 2, ("0000:97:00.0", 45): 1}),
    ("issues/nvsentinel-155.xid79-single-line.quoted.txt", {("0000:44:00.0", 79): 1}),
    ("ml-engineering/xid63-row-remapper.txt", {("0000:10:1c.0", 63): 1}),
])
def test_xids_in_real_logs(name, xids):
    events = events_of_file(name)
    assert Counter((e.device, e.code) for e in events if e.kind == XID) == xids


def test_xid_details_in_real_logs():
    events = events_of_file("gpud/dmesg-with-xid-119.log")
    assert [e.detail["pid"] for e in events] == [2024380, 2024380, 2024380, 1263500, 1240590]
    assert [e.detail["name"] for e in events] == ["nvidia-smi", "nvidia-smi", "nvidia-smi", "cache_mgr_main", "gpud"]
    assert events[0].text.startswith("Timeout after 6s of waiting for RPC response from GPU4 GSP!")
    peermem = events_of_file("gpud/peermem.dmesg.0.log")
    assert peermem[0].text.startswith("An uncorrectable double bit error (DBE)")
    assert [e.detail["pid"] for e in peermem if e.code == 94] == [None] + [1248209] * 8
    assert {e.detail["name"] for e in peermem if e.code == 94} == {None, "python3.10"}


def test_sxid_takes_its_continuation_lines():
    # gpud sxid README, as quoted in xid.md 4.4: the continuation lines come from other switches
    events = events_of_lines(
        "[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
        "[6781753.404848] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 "
        "Sub-engine instance 00",
        "[6781753.406566] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000, "
        "0x10000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}",
    )
    assert [(e.kind, e.code) for e in events] == [(XID, 79), (SXID, 20034)]
    sxid = events[1]
    assert sxid.device == "0000:06:00.0"
    assert sxid.text == "LTSSM Fault Up"
    assert sxid.monotonic_us == 6781753400584
    assert sxid.detail["fatal"] is True
    assert sxid.detail["link"] == 48
    assert sxid.detail["nvswitch"] == "nvidia-nvswitch1"
    assert (sxid.detail["severity"], sxid.detail["engine_instance"], sxid.detail["sub_engine_instance"]) == (1, 60, 0)
    assert sxid.detail["data"].split()[:2] == ["0x10000000", "0x10000000"]


def test_sxid_in_real_logs():
    orphan, *events = events_of_file("issues/nvtrust-124.sxid-22013-minion-dlreq.h100-tdx.partial.txt")
    # The excerpt starts with the Data line of an SXid whose first line was cut off: still an SXid.
    assert (orphan.kind, orphan.device, orphan.code, orphan.detail["fatal"]) == (SXID, "0000:04:00.0", 22013, None)
    assert orphan.detail["data"].startswith("0x0000002b")
    assert [(e.kind, e.device, e.code, e.detail["link"]) for e in events] == [
        (SXID, "0000:04:00.0", 22013, 44), (SXID, "0000:04:00.0", 22013, 45), (SXID, "0000:04:00.0", 22013, 46)]
    assert all(e.detail["fatal"] is False for e in events)
    assert events[0].text == "Minion Link DLREQ interrupt"
    assert events[0].detail["engine_instance"] == 44
    assert events[0].detail["data"].startswith("0x0000002c")
    assert "severity" not in events[2].detail  # the excerpt ends at its header line
    [imbue] = [e for e in events_of_file(
        "imbue-cluster-health/doctest-lines.xid94-xid64-sxid12028-mlx5-pcie-limited.txt") if e.kind == SXID]
    assert (imbue.device, imbue.code, imbue.detail["link"], imbue.text) == (
        "0000:85:00.0", 12028, 61, "egress non-posted PRIV error (First)")


def test_sxid_without_link():
    [event] = events_of_lines("nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALT data[0] = 0x               0")
    assert (event.kind, event.device, event.code) == (SXID, "0004:00:00.0", 26006)
    assert event.detail["fatal"] is None and event.detail["link"] is None
    assert event.text.startswith("SOE HALT")


def test_sxid_held_for_continuations_is_flushed_at_the_end():
    parser = EventParser()
    assert parser.feed(KernelRecord("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 x")) == []
    [event] = parser.flush()
    assert event.code == 20034
    assert parser.flush() == []


def test_gpu_fallen_off_the_bus_over_three_lines():
    # dmesg prints the one multi-line record with indented continuation lines
    [event] = events_of_file("issues/nvsentinel-155.fallen-off-bus-multiline-no-xid.txt")
    assert (event.kind, event.device, event.code) == (GPU_FALLEN_OFF_BUS, "0000:b3:00.0", None)
    assert event.detail["pci_id"] == "10de:26b5"
    assert event.monotonic_us == 1843308145
    assert event.text == "fallen off the bus and is not responding to commands."


@pytest.mark.parametrize("lines", [
    # syslog: one line each
    ["Jun 18 10:00:00 gpu7 kernel: NVRM: The NVIDIA GPU 0000:b3:00.0",
     "Jun 18 10:00:00 gpu7 kernel: NVRM: (PCI ID: 10de:26b5) installed in this system has",
     "Jun 18 10:00:00 gpu7 kernel: NVRM: fallen off the bus and is not responding to commands."],
    # /dev/kmsg: one record, its newlines escaped
    ["4,901,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this system "
     "has\\x0aNVRM: fallen off the bus and is not responding to commands."],
])
def test_gpu_fallen_off_the_bus_in_other_framings(lines):
    [event] = events_of_lines(*lines)
    assert (event.kind, event.device, event.detail["pci_id"]) == (GPU_FALLEN_OFF_BUS, "0000:b3:00.0", "10de:26b5")


@pytest.mark.parametrize("line", [
    "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
    "[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen off the bus.",
])
def test_gpu_fallen_off_the_bus_in_one_line(line):
    [event] = events_of_lines(line)
    assert (event.kind, event.device) == (GPU_FALLEN_OFF_BUS, "0000:01:00.0")


def test_off_the_bus_needs_its_own_three_lines():
    # another three-line NVRM message, then a stray line: too far from "The NVIDIA GPU" to count
    assert events_of_lines("NVRM: The NVIDIA GPU 0000:b3:00.0",
                           "NVRM: (PCI ID: 10de:1234) installed in this system is",
                           "NVRM: not supported by the 570.158.01 NVIDIA driver release.",
                           "NVRM: fallen off the bus and is not responding to commands.") == []


@pytest.mark.parametrize("name, tasks", [
    ("m4-logs/jean-zay-iam06.a100.dmesg-T.hung-tasks.txt",
     [("epilog.sh", 76609, 120)] + [("python", 280058, 120)] * 9),
    ("issues/k8s-device-plugin-77.hung-task-nvc-driver.nvidia_uvm.partial.txt", [("nvc:[driver]", 5403, 120)]),
    ("issues/rocm-tf-180.dmesg-T.hung-task-amdgpu.partial.txt", [("python", 19772, 120)]),
    # the excerpt starts inside a stack dump (task:... state:D), then the next report
    ("issues/rocm-amdgpu-150.hung-task-6.2-format.partial.txt",
     [("ipython3", 827200, None), ("ipython3", 827201, 120)]),
    # only the stack dump header, no INFO line
    ("issues/returnn-1480.dmesg-reltime.hung-task-nvidia_uvm.partial.txt", [("python3.11", 15277, None)]),
    # node-problem-detector's samples, without any framing
    ("npd/docker_hung", [("docker", 20744, 120)]),
    ("npd/aufs_umount_hung", [("umount.aufs", 21568, 120)]),
])
def test_hung_tasks_in_real_logs(name, tasks):
    events = events_of_file(name)
    hung = [e for e in events if e.kind == HUNG_TASK]
    assert [(e.device, e.detail["pid"], e.detail["seconds"]) for e in hung] == tasks
    assert len(hung) == len(events)


def test_hung_task_time():
    events = events_of_file("m4-logs/jean-zay-iam06.a100.dmesg-T.hung-tasks.txt")
    assert events[0].wall_time == 1677772796.0  # Thu Mar  2 15:59:56 2023 UTC
    assert events[0].text == "INFO: task epilog.sh:76609 blocked for more than 120 seconds."


@pytest.mark.parametrize("name, soft, hard", [
    ("issues/ironfish-701.syslogd-wall.soft-and-hard-lockup.txt",
     [("cpu0", 27, "node", 1984), ("cpu9", 27, "kworker/9:0", 24827), ("cpu1", 22, "node", 297680),
      ("cpu23", 22, "node", 297675), ("cpu20", 22, "SCTP timer", 2111), ("cpu21", 37, "node", 297692)],
     ["cpu3", "cpu10", "cpu8"]),
    ("issues/deepspeed-925.dmesg-T.soft-lockup.txt", [("cpu7", 23, "pytest", 25222)], []),
    ("issues/frigate-6360.syslog.soft-lockup.wrapped-modules-line.txt",
     [("cpu0", 23, "frigate.output", 1243199)], []),
    ("issues/sonic-17358.soft-lockup-panic.indented-elided.txt", [("cpu2", 23, "kworker/2:1", 25629)], []),
])
def test_lockups_in_real_logs(name, soft, hard):
    events = events_of_file(name)
    assert [(e.device, e.detail["seconds"], e.detail["comm"], e.detail["pid"])
            for e in events if e.kind == SOFT_LOCKUP] == soft
    assert [e.device for e in events if e.kind == HARD_LOCKUP] == hard


def test_old_soft_lockup_layout_without_task():
    [event] = events_of_lines("BUG: soft lockup - CPU#12 stuck for 67s!")
    assert (event.kind, event.device, event.detail["seconds"], event.detail["pid"]) == (SOFT_LOCKUP, "cpu12", 67, None)


@pytest.mark.parametrize("name, links", [
    ("issues/cubecos-733.journalctl.mlx5-eth-link-up-flap.txt", [(LINK_UP, "eth1", "0000:01:00.1", None)] * 4),
    ("gpud/dmesg.decode.iso.log.1", [(LINK_DOWN, "enp157s0f1np1", "0000:9d:00.1", None),
                                     (LINK_DOWN, "enp157s0f0np0", "0000:9d:00.0", None),
                                     (LINK_DOWN, "enp27s0f1np1", "0000:1b:00.1", None),
                                     (LINK_UP, "bootnet", "0000:1b:00.0", None)]),
    # an IB port: INIT is on its way up, ACTIVE is up
    ("issues/gpud-1209.journalctl.mlx5-port-link-init-active.partial.txt", [(LINK_UP, "mlx5_5", "0000:ab:00.0", 1)]),
    ("gpud/pstore/7530486857247/dmesg-erst-7530486857247752193", [(LINK_UP, "enp65s0f0np0", "0000:41:00.0", None)]),
    ("gpud/full-boot-ctime.dmesg.0.log", [(LINK_UP, "eno1", "0000:06:00.0", None)]),
    # cable and PCIe lines are no link state
    ("issues/arm-nas-16.dmesg-grep-mlx5.cx5-arm64-boot.partial.txt", []),
    ("imbue-cluster-health/doctest-lines.xid94-xid64-sxid12028-mlx5-pcie-limited.txt", []),
])
def test_links_in_real_logs(name, links):
    events = [e for e in events_of_file(name) if e.kind in (LINK_UP, LINK_DOWN)]
    assert [(e.kind, e.device, e.detail["pci_bus_id"], e.detail["port"]) for e in events] == links


def test_link_events_only_from_mellanox_drivers():
    # SATA links, IPv6 readiness and other NICs are no RDMA link flaps
    assert events_of_file("gpud/pstore/7530486857247/dmesg-erst-7530486857247752194") == []
    assert kinds(events_of_file("gpud/dmesg.decode.iso.log.1")) == Counter({LINK_DOWN: 3, LINK_UP: 1})


def test_link_without_a_name_uses_the_pci_address():
    [down, up] = events_of_lines("mlx5_core 0000:3c:00.0: Port: 1 Link DOWN", "mlx4_en: eth2: Link Up")
    assert (down.kind, down.device, down.detail["port"]) == (LINK_DOWN, "0000:3c:00.0", 1)
    assert (up.kind, up.device) == (LINK_UP, "eth2")


def test_quiet_logs_have_no_events():
    for name in ("gpud/kmsg.1.log", "gpud/kmsg.2.peermem.log", "gpud/dmesg-time-format-short-iso.log",
                 "gpud/journalctl-time-format-short-iso-2.log",
                 "issues/ollama-4342.syslog.nvidia-rm-stack.reversed.partial.txt",
                 "issues/open-gpu-kernel-modules-1118.talos-kern-format.gsp-rpc-history.partial.txt",
                 "npd/oom_kill"):  # OOM kills are out of scope
        assert events_of_file(name) == [], name


def test_crash_dumps_are_one_crash_each_with_their_rip_function():
    """The pstore (ERST) record of a sysrq-triggered crash and NPD's oops: one event, not one per header."""
    for name, function in (("gpud/pstore/dmesg-erst.txt", "sysrq_handle_crash"),
                           ("npd/null_pointer", "pick_next_task_fair")):
        [e] = events_of_file(name)
        assert (e.kind, e.detail["function"]) == ("kernel_crash", function), name


def test_events_carry_the_record_identity():
    [event] = events_from_records([KernelRecord("NVRM: Xid (PCI:0000:3b:00): 48, DBE", seq=7, monotonic_us=9,
                                                wall_time=10.0, priority=4)])
    assert (event.seq, event.monotonic_us, event.wall_time) == (7, 9, 10.0)
    assert event.key == (7, XID, "0000:3b:00.0", 48)


GARBLED = [
    "NVRM: Xid (PCI:0000:3b:00",
    "NVRM: Xid (PCI:0000:3b:00): ",
    "NVRM: Xid (PCI:0000:3b:00): " + "9" * 5000,
    "NVRM: Xid (PCI:" + "0" * 5000 + "): 79, x",
    "INFO: task :" + "1" * 5000 + " blocked for more than 120 seconds.",
    "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Data {",
    "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Severity x",
    "NVRM: The NVIDIA GPU 0000:zz:00.0",
    "mlx5_core 0000:01:00.1 eth1: Link",
    "watchdog: BUG: soft lockup - CPU#",
    "task:\x00 state:D pid:",
]


def test_garbled_lines_never_raise():
    events = list(events_from_records(KernelRecord(m) for m in GARBLED))
    assert all(e.kind in KINDS for e in events)


_FRAGMENTS = st.sampled_from([
    "NVRM: Xid (PCI:", "0000:3b:00", " GPU-I:05", "): ", "79", ", ", "pid=", "'<unknown>'", "name=", "python3",
    "nvidia-nvswitch2: SXid (PCI:", "0000:85:00.0", "Fatal", "Non-fatal", "Link ", "-1",
    "Severity 1 Engine instance 6 Sub-engine instance 00", "Data {0x1, ", "}", "NVRM: The NVIDIA GPU ",
    "fallen off the bus", "(PCI ID: 10de:26b5)", "INFO: task ", ":", "123", " blocked for more than ", " seconds.",
    "task:", " state:D ", "pid:", "BUG: soft lockup - CPU#", " stuck for ", "s! [", "]",
    "Watchdog detected hard LOCKUP on cpu ", "mlx5_core ", "0000:01:00.1 ", "eth1: ", "Port: 1 ", "Link up",
    "Link DOWN", "\n", "\\x0a", " ", "\x00", "\ufffd",
])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=200), st.lists(_FRAGMENTS, max_size=12).map("".join)), max_size=12))
def test_fuzz_events_from_records(messages):
    events = list(events_from_records(KernelRecord(m, seq=i) for i, m in enumerate(messages)))
    assert len(events) <= len(messages)
    assert all(e.kind in KINDS and isinstance(e.device, str) for e in events)


def test_a_userspace_write_to_kmsg_cannot_fake_an_xid():
    """Anything root writes to /dev/kmsg gets facility user (1), never kernel (0)."""
    from nodehealth.collectors.kmsg import LogLines
    lines = LogLines()
    text = "NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    records = lines.feed(f"12,900,1000,-;{text}") + lines.feed(f"4,901,2000,-;{text}") + lines.flush()
    assert [r.facility for r in records] == [1, 0]
    events = list(events_from_records(records))
    assert [(e.kind, e.seq) for e in events] == [("xid", 901)]


def test_gpu_fallen_off_the_bus_without_a_pci_domain():
    [event] = events_of_lines("NVRM: GPU 18:00.0: GPU has fallen off the bus.")
    assert (event.kind, event.device) == (GPU_FALLEN_OFF_BUS, "0000:18:00.0")


def test_an_sxid_whose_headline_is_missing_is_still_found():
    """A log that starts mid-message: the Severity and Data lines of a fatal SXid 20034, no headline."""
    from conftest import KmsgFacts

    from nodehealth.checks import xid
    from nodehealth.model import Observed, Severity

    events = events_of_lines(
        "[6781753.404848] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 "
        "Sub-engine instance 00",
        "[6781753.406566] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Data {0x10000000, 0x10000000}")
    assert [(e.kind, e.code, e.device, e.detail["severity"]) for e in events] == [(SXID, 20034, "0000:07:00.0", 1)]
    [finding] = xid.judge(Observed({"kmsg": KmsgFacts(tuple(events))}, now=1e9), dict(xid.DEFAULTS))
    assert (finding.reason, finding.severity) == ("SXid20034LtssmFaultUp", Severity.FATAL)
