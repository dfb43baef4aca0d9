"""Host hardware and kernel faults (issue 13): real kernel lines in several framings (dmesg, dmesg -T,
journal, syslog, bare messages) from tests/fixtures/kmsg/host/ (sources in its README) through the
saved-log collector, the parser and the five new checks; fuzzed parser; a healthy node's full boot
log raises nothing new."""
from __future__ import annotations

import os

import pytest
from conftest import HERE, KmsgFacts
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.checks import crashes, memory_errors, nic_health, storage_errors
from nodehealth.collectors import kmsg
from nodehealth.collectors.kernel_events import (
    HOST_KINDS,
    KERNEL_CRASH,
    EventParser,
    KernelRecord,
    events_from_records,
)
from nodehealth.model import Action, Observed, Severity

HOST = os.path.join(HERE, "fixtures", "kmsg", "host")
CHECKS = (memory_errors, crashes, storage_errors, nic_health)


def judge_file(name: str):
    log = kmsg._collect_files([os.path.join(HOST, name)])
    obs = Observed({"kmsg": log}, now=1e10)  # a saved log: judged as of its last record
    return [f for c in CHECKS for f in c.judge(obs, dict(c.DEFAULTS))], log


@pytest.mark.parametrize("name,check,reason,severity,action,device", [
    ("radiasoft-134.journal.mce-edac-ce.txt", "memory_errors", "MemoryCorrected", Severity.WARNING, Action.NONE,
     "mc1/CPU_SrcID#1_Ha#0_Chan#0_DIMM#0"),
    ("machine-shop-66.dmesg-T.edac-ce-overflow.txt", "memory_errors", "MemoryCorrected", Severity.DEGRADED,
     Action.HW_INSPECTION, "mc1/CPU_SrcID#0_Ha#0_Chan#1_DIMM#0"),  # 262 at once
    ("osm-ops-300.syslog.mce-edac-ce.txt", "memory_errors", "MemoryCorrected", Severity.DEGRADED,
     Action.HW_INSPECTION, "mc0/CPU#0Channel#2_DIMM#0"),  # 4 + 2 + 6 = 12 over three lines
    ("mcelog-70.syslog.mce-record.txt", "memory_errors", "MachineCheckFatal", Severity.FATAL,
     Action.HW_INSPECTION, "cpu0"),  # status a6...: UC and PCC set
    # old machine-check formats: the exception, its bank, then the panic are one fatal machine check of that CPU
    ("openvz-wiki.syslog.mce-exception-old.txt", "memory_errors", "MachineCheckFatal", Severity.FATAL,
     Action.HW_INSPECTION, "cpu0"),
    ("broadcom-kb-168056.console.mce-exception-no-status.txt", "memory_errors", "MachineCheckFatal", Severity.FATAL,
     Action.HW_INSPECTION, "cpu0"),
    ("redhat-18723.messages.mce-events-logged.txt", "memory_errors", "MachineCheckLogged", Severity.WARNING,
     Action.NONE, "cpu"),  # a bare notice, nothing decoded beside it
    ("node-exporter-3511.journal.cper-corrected.txt", "memory_errors", "HardwareErrorCorrected", Severity.WARNING,
     Action.NONE, "apei"),
    ("npd-pr-846.journal.cper-recoverable.txt", "memory_errors", "HardwareErrorRecoverable", Severity.FATAL,
     Action.HW_INSPECTION, "apei"),
    ("npd-hardware_error.txt", "memory_errors", "HardwareErrorFatal", Severity.FATAL, Action.HW_INSPECTION, "apei"),
    ("npd-null_pointer.txt", "crashes", "KernelCrash", Severity.FATAL, Action.REBOOT, "kernel"),
    ("npd-divide_zero.txt", "crashes", "KernelCrash", Severity.FATAL, Action.REBOOT, "dm_thin_pool"),
    ("npd-readonly_filesystem.txt", "storage_errors", "FilesystemReadOnly", Severity.FATAL, Action.REBOOT, "sda1"),
    # block-layer request errors (blk_print_req_error, and print_req_error/blk_update_request before it)
    ("sedutil-507.dmesg-reltime.critical-medium-error-read.txt", "storage_errors", "DiskReadError",
     Severity.WARNING, Action.NONE, "nvme0n1"),
    ("crucible-1239.dmesg.blk-update-request-write.txt", "storage_errors", "DiskWriteError", Severity.DEGRADED,
     Action.HW_INSPECTION, "nvme0n1"),
    ("fio-862.dmesg.print-req-error-flags-only.txt", "storage_errors", "DiskWriteError", Severity.DEGRADED,
     Action.HW_INSPECTION, "nvme0n1"),  # flags 104001: the low byte is the operation, 1 = WRITE
    ("xcat-core-1175.conserver.blk-update-request-no-op.txt", "storage_errors", "DiskIoError", Severity.WARNING,
     Action.NONE, "sda"),  # no operation in the line: rated as a read
    ("qubes-7795.dmesg.ext4-lost-write.txt", "storage_errors", "DataWriteLost", Severity.DEGRADED,
     Action.HW_INSPECTION, "dm-4"),
    ("raspberrypi-linux-703.journal.ext4-lost-write-old.txt", "storage_errors", "DataWriteLost", Severity.DEGRADED,
     Action.HW_INSPECTION, "dm-1"),
    ("fedora-coreos-784.dmesg.xfs-metadata-io-error.txt", "storage_errors", "FilesystemMetadataIoError",
     Severity.DEGRADED, Action.HW_INSPECTION, "vda4"),
    ("kvdo-25.syslog.xfs-metadata-io-error-old.txt", "storage_errors", "FilesystemMetadataIoError",
     Severity.DEGRADED, Action.HW_INSPECTION, "dm-7"),
    ("npd-unregister_netdevice.txt", "nic_health", "NetdevUnregisterStuck", Severity.WARNING, Action.REBOOT, "lo"),
    ("mptcp-61.syslog.netdev-watchdog-old.txt", "nic_health", "NetdevTransmitTimeout", Severity.WARNING,
     Action.HW_INSPECTION, "eth2"),
    ("voidlinux-4804.syslog-iso.ext4-error.txt", "storage_errors", "FilesystemError", Severity.DEGRADED,
     Action.HW_INSPECTION, "sda1"),
    ("hostboot-150.dmesg.memory-failure-failed.txt", "memory_errors", "MemoryFailureUnrecovered", Severity.FATAL,
     Action.HW_INSPECTION, "memory"),  # two pages, one finding (a storm of pages must not be a storm of findings)
    ("triforce-2.dmesg.memory-failure-recovered-old.txt", "memory_errors", "MemoryFailureRecovered",
     Severity.WARNING, Action.NONE, "memory"),
    ("matrixone-20374.journal.cper-recoverable-multibit.txt", "memory_errors", "HardwareErrorRecoverable",
     Severity.FATAL, Action.HW_INSPECTION, "apei"),
    # ten lines, one per CPU, of one throttling episode: not a repeat
    ("throttled-186.dmesg.cpu-throttle.txt", "memory_errors", "CpuThermalThrottling", Severity.WARNING,
     Action.NONE, "cpu"),
    ("npd-pr-845.journal.xfs-shutdown.txt", "storage_errors", "FilesystemShutdown", Severity.FATAL, Action.REBOOT,
     "dm-4"),
    ("coreos-bugs-1396.journal.xfs-log-shutdown.txt", "storage_errors", "FilesystemShutdown", Severity.FATAL,
     Action.REBOOT, "xvdb"),
    ("tetragon-328.dmesg.rcu-stall.txt", "crashes", "RcuStall", Severity.DEGRADED, Action.REBOOT, "rcu_sched"),
    ("t113-2.dmesg.rcu-self-detected.txt", "crashes", "RcuStall", Severity.DEGRADED, Action.REBOOT, "rcu_sched"),
    ("openzfs-557.syslog.rcu-stall-old.txt", "crashes", "RcuStall", Severity.FATAL, Action.REBOOT,
     "rcu_sched_state"),  # three reports: persistent
])
def test_real_lines_become_one_finding(name, check, reason, severity, action, device):
    findings, _ = judge_file(name)
    assert len(findings) == 1, [(f.reason, f.device) for f in findings]
    f = findings[0]
    assert (f.check, f.reason, f.severity, f.action, f.device) == (check, reason, severity, action, device)


def test_mlx5_health_lines_of_a_peer_and_access_reg_noise():
    findings, log = judge_file("nvsentinel-syslog-test.mlx5-health.txt")
    assert sorted((f.reason, f.severity, f.device) for f in findings) == [
        ("NetdevTransmitTimeout", Severity.WARNING, "eth0"),
        ("NicCommandTimeout", Severity.FATAL, "0000:03:00.0"),
        ("NicFirmwareFatal", Severity.FATAL, "0000:41:00.0"),
        ("NicFirmwareHeartbeatLost", Severity.FATAL, "0000:41:00.0")]
    assert not any(e.device == "0000:d2:00.0" for e in log.events)  # ACCESS_REG on a restricted PF is noise


def test_throttling_in_separate_episodes_escalates():
    lines = [f"CPU{c}: Package temperature above threshold, cpu clock throttled (total events = {n})"
             for n in (10, 11, 12) for c in range(4)]
    records = [KernelRecord(m, seq=i, monotonic_us=(i // 4) * 60_000_000, wall_time=1_700_000_000.0 + (i // 4) * 60)
               for i, m in enumerate(lines)]
    obs = Observed({"kmsg": KmsgFacts(tuple(events_from_records(records)))}, now=1_700_000_300.0)
    [f] = memory_errors.judge(obs, dict(memory_errors.DEFAULTS))
    assert (f.severity, f.action, f.evidence["count"], f.evidence["errors"]) == (
        Severity.DEGRADED, Action.HW_INSPECTION, 12, 3)
    [f] = memory_errors.judge(Observed({"kmsg": KmsgFacts(tuple(events_from_records(records[:8])))},
                                       now=1_700_000_300.0), dict(memory_errors.DEFAULTS))
    assert f.severity is Severity.WARNING  # two episodes


def test_block_layer_errors_are_rated_by_what_they_lost():
    """A failed write lost data the kernel had accepted; a failed read is retried by its reader, until it repeats."""
    findings, log = judge_file("crucible-1844.dmesg.block-io-read-and-write-errors.txt")
    assert sorted((f.reason, f.severity, f.device, f.evidence["count"]) for f in findings) == [
        ("BlockIoError", Severity.DEGRADED, "nvme0n1p1", 1),
        ("DiskReadError", Severity.WARNING, "nvme0n1", 1),
        ("DiskWriteError", Severity.DEGRADED, "nvme0n1", 3)]
    write = next(e for e in log.events if e.detail.get("op") == "WRITE")
    assert write.detail == {"layer": "block", "status": "I/O", "op": "WRITE", "sector": 167431176}
    reads = [f"I/O error, dev sdb, sector {i} op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0" for i in range(3)]
    events = list(events_from_records(_records(*reads)))
    [f] = storage_errors.judge(Observed({"kmsg": KmsgFacts(tuple(events))}, now=1_700_000_100.0),
                               dict(storage_errors.DEFAULTS))
    assert (f.reason, f.severity, f.action) == ("DiskReadError", Severity.DEGRADED, Action.HW_INSPECTION)


def test_post_mortem_of_a_saved_log_finds_the_storage_faults(capsys):
    """End to end: `nodehealth check --kernel-log FILE --json` on saved logs."""
    import json

    from nodehealth import cli

    paths = [os.path.join(HOST, n) for n in ("crucible-1844.dmesg.block-io-read-and-write-errors.txt",
                                             "qubes-7795.dmesg.ext4-lost-write.txt",
                                             "kvdo-25.syslog.xfs-metadata-io-error-old.txt")]
    code = cli.main(["check", "--kernel-log", *paths, "--only", "kmsg", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["status"] == "unhealthy"
    assert {(f["reason"], f["device"], f["severity"]) for f in doc["findings"]} >= {
        ("DiskWriteError", "nvme0n1", "degraded"), ("DiskReadError", "nvme0n1", "warning"),
        ("DataWriteLost", "dm-4", "degraded"), ("FilesystemMetadataIoError", "dm-7", "degraded")}


def test_a_buffer_io_error_and_its_block_request():
    findings, _ = judge_file("nvmecha-6.buffer-io-error.txt")
    assert sorted((f.reason, f.severity, f.device) for f in findings) == [
        ("BlockIoError", Severity.DEGRADED, "nvme0n1"), ("DiskReadError", Severity.WARNING, "nvme0n1")]


@pytest.mark.parametrize("message", [
    "Buffer I/O error on dev nvme0n1, logical block 0, async page read",  # the buffer layer's own line
    "blk_update_request: operation not supported error, dev sdc, sector 0 op 0x3:(DISCARD) flags 0x800 phys_seg 1",
    "critical space allocation error, dev dm-3, sector 8 op 0x1:(WRITE) flags 0x0 phys_seg 1 prio class 0",
    "EXT4-fs warning (device sda1): ext4_dx_add_entry:2364: Directory (ino: 2) index full, reach max htree level :2",
    "XFS (sdb1): Mounting V5 Filesystem",
    "audit: type=1400 msg='I/O error, dev sda, sector 1' from a user's text",
])
def test_storage_lines_that_are_no_disk_fault(message):
    events = [e for e in events_from_records(_records(message)) if e.detail.get("layer") == "block"
              or e.detail.get("lost_write") or e.detail.get("metadata_io")]
    assert events == []


def test_nvme_escalates_from_abort_to_reset_to_removal():
    findings, _ = judge_file("propolis-1156.dmesg.nvme-timeout-reset.txt")
    assert {(f.reason, f.severity) for f in findings} == {("NvmeIoTimeout", Severity.WARNING),
                                                         ("NvmeControllerReset", Severity.DEGRADED),
                                                         ("DiskReadError", Severity.WARNING)}  # the read it failed
    findings, _ = judge_file("nvme-cli-151.dmesg.nvme-removed.txt")
    assert ("NvmeControllerLost", Severity.FATAL, "nvme2") in {(f.reason, f.severity, f.device) for f in findings}


def test_crash_names_its_function_and_module_and_merges_its_headers():
    _, log = judge_file("npd-null_pointer.txt")
    [crash] = [e for e in log.events if e.kind == KERNEL_CRASH]
    assert crash.detail["function"] == "pick_next_task_fair" and crash.detail["module"] is None
    assert crash.detail["headers"] == ["BUG: unable to handle kernel NULL pointer dereference at 0000000000000078",
                                       "Oops: 0000 [#1] SMP"]
    findings, _ = judge_file("npd-divide_zero.txt")
    assert "pool_io_hints of module dm_thin_pool" in findings[0].message


def test_new_style_netdev_watchdog_names_driver_and_bus_id():
    _, log = judge_file("openwrt-drivers-11.dmesg.netdev-watchdog-new.txt")
    assert [(e.device, e.detail["driver"], e.detail["pci_bus_id"]) for e in log.events] == [
        ("eth4", "r8125", "0000:22:04.0"), ("eth1", "r8125", "0000:22:01.0")]


def _records(*messages):
    return [KernelRecord(m, seq=i, monotonic_us=i, wall_time=1_700_000_000.0 + i) for i, m in enumerate(messages)]


@pytest.mark.parametrize("message,reason,severity", [
    # mlx5 health.c / cmd.c formats (host-hardware.md section 5)
    ("mlx5_core 0000:0c:00.0: poll_health:800:(pid 0): device's health compromised - reached miss count",
     "NicFirmwareHeartbeatLost", Severity.FATAL),
    ("mlx5_core 0000:0c:00.0: print_health_info:424:(pid 0): synd 0x8: unrecoverable hardware error",
     "NicFirmwareFatal", Severity.FATAL),
    ("mlx5_core 0000:0c:00.0: print_health_info:386:(pid 0): PCI slot is unavailable", "NicOffPcie", Severity.FATAL),
    ("mlx5_core 0000:0c:00.0: wait_func:1031:(pid 12): QUERY_VPORT_COUNTER(0x770) timeout. Will cause a leak of a "
     "command resource", "NicCommandTimeout", Severity.FATAL),
])
def test_mlx5_health(message, reason, severity):
    events = list(events_from_records(_records(message)))
    obs = Observed({"kmsg": KmsgFacts(tuple(events))}, now=1_700_000_100.0)
    [f] = nic_health.judge(obs, dict(nic_health.DEFAULTS))
    assert (f.reason, f.severity, f.device) == (reason, severity, "0000:0c:00.0")


def test_eq_overrun_syndrome_is_not_fatal():
    events = list(events_from_records(_records("mlx5_core 0000:0c:00.0: print_health_info:424:(pid 0): "
                                               "synd 0xc: async EQ buffer overrun")))
    obs = Observed({"kmsg": KmsgFacts(tuple(events))}, now=1_700_000_100.0)
    assert nic_health.judge(obs, dict(nic_health.DEFAULTS)) == []


def test_user_space_traps_and_soft_lockups_are_not_kernel_crashes():
    events = list(events_from_records(_records(
        "traps: python3[4211] general protection fault ip:7f3c sp:7ffd error:0 in libc.so.6[7f3c+195000]",
        "watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [kworker/3:1:123]",
        "rcu: INFO: rcu_sched self-detected stall on CPU")))
    assert [e.kind for e in events] == ["soft_lockup", "rcu_stall"]


@pytest.mark.parametrize("path", [
    "gpud/full-boot-ctime.dmesg.0.log", "gpud/dmesg.decode.iso.log.1",
    "m4-logs/jean-zay-iam06.a100.dmesg-T.hung-tasks.txt",
])
def test_healthy_full_boot_logs_raise_nothing_new(path):
    log = kmsg._collect_files([os.path.join(HERE, "fixtures", "kmsg", path)])
    assert log.records > 800
    assert [e for e in log.events if e.kind in HOST_KINDS] == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.text(max_size=200),
    st.sampled_from(["BUG: kernel NULL pointer dereference, address: 0000000000000010", "RIP: 0010:",
                     "RIP: 0010:foo+0x1/0x2 [bar]", "{1}[Hardware Error]: event severity: ",
                     "mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 4: ", "EDAC MC0: 99999999999 CE on ",
                     "mlx5_core 0000:00:00.0: synd 0x", "nvme nvme0: I/O 1 QID 1 timeout, ",
                     "Memory failure: 0x1: recovery action for dirty LRU page: Failed",
                     "I/O error, dev sda, sector 99999999999999999999999 op 0x1:(WRITE)", "print_req_error: ",
                     "CPU 0: Machine Check Exception: 0000000000000004", "Bank 4: b604a00100000813 at 0",
                     "Kernel panic: CPU context corrupt", "Machine check events logged",
                     "mlx5_core 0000:3b:00.0 eth0: TX timeout detected", "r8169 0000:01:00.0 eth0: NETDEV WATCHDOG: "]),
    st.tuples(st.sampled_from(["mlx5_core 0000:0c:00.0: ", "EDAC MC1: 3 UE ", "XFS (sdb1): ", "NETDEV WATCHDOG: ",
                               "I/O error, dev sda, sector 1", "critical medium error, dev ",
                               "EXT4-fs warning (device sda1): ext4_end_bio:1: I/O error ",
                               "XFS (sdb1): metadata I/O error in \"", "XFS (sdb1): metadata I/O error: block 0x"]),
              st.text(max_size=120)).map("".join)), max_size=30))
def test_fuzzed_records_never_crash_the_parser_or_checks(messages):
    parser = EventParser()
    events = []
    for i, m in enumerate(messages):
        events.extend(parser.feed(KernelRecord(m, seq=i, wall_time=1_700_000_000.0)))
    events.extend(parser.flush())
    obs = Observed({"kmsg": KmsgFacts(tuple(events))}, now=1_700_000_100.0)
    for c in CHECKS:
        for f in c.judge(obs, dict(c.DEFAULTS)):
            assert f.severity in (Severity.INFO, Severity.WARNING, Severity.DEGRADED, Severity.FATAL)


@pytest.mark.parametrize("device,points", [
    ("nvme0", ["/data", "/scratch"]),  # a controller: all its namespaces' partitions
    ("nvme0n1p1", ["/data"]),
    ("sda1", ["/"]),
    ("sdb", []),
])
def test_storage_findings_name_the_mount_point(device, points):
    table = {"nvme0n1p1": "/data", "nvme0n2": "/scratch", "sda1": "/", "nvme1n1": "/other"}
    assert storage_errors.mount_points(device, table) == points


def test_mount_points_come_from_this_host_only_for_its_own_log():
    from nodehealth.collectors.mounts import Mounts

    events = list(events_from_records(_records("Buffer I/O error on dev nvme0n1p1, logical block 0, async page read")))
    live = KmsgFacts(tuple(events))
    mounts = Mounts((), block_devices=(("nvme0n1p1", "/data"),))
    [f] = storage_errors.judge(Observed({"kmsg": live, "mounts": mounts}, now=1_700_000_100.0),
                               dict(storage_errors.DEFAULTS))
    assert "(mounted on /data)" in f.message
    saved = KmsgFacts(tuple(events), boot_id=None)
    [f] = storage_errors.judge(Observed({"kmsg": saved, "mounts": mounts}, now=1_700_000_100.0),
                               dict(storage_errors.DEFAULTS))
    assert "mounted on" not in f.message


FRAMINGS = {
    "kmsg": lambda i, m: f"4,{100 + i},{(1000 + i) * 1_000_000},-;{m}",
    "dmesg": lambda i, m: f"[{1000 + i:>5}.000123] {m}",
    "dmesg -T": lambda i, m: f"[Mon Oct  3 13:52:{10 + i % 50:02d} 2022] {m}",
    "journal": lambda i, m: f"Oct 03 13:52:{10 + i % 50:02d} gpu-node-7 kernel: {m}",
    "syslog": lambda i, m: f"Oct  3 13:52:{10 + i % 50:02d} gpu-node-7 kernel: [{1000 + i:>5}.000123] {m}",
    "iso": lambda i, m: f"2022-10-03T13:52:{10 + i % 50:02d},000123+00:00 {m}",
    # prefixed by other tools and in other locales, as tests/fixtures/kmsg/saved/ shows each
    "pdsh": lambda i, m: f"gpu-node-7: [{1000 + i:>5}.000123] {m}",
    "clush dmesg -T": lambda i, m: f"gpu-node-7: [Mon Oct  3 13:52:{10 + i % 50:02d} 2022] {m}",
    "ts": lambda i, m: f"Oct 03 13:52:{10 + i % 50:02d} [{1000 + i:>5}.000123] {m}",
    "dmesg -T de_DE": lambda i, m: f"[Mo Okt  3 13:52:{10 + i % 50:02d} 2022] {m}",
    "dmesg -T ja_JP": lambda i, m: f"[月 10月  3 13:52:{10 + i % 50:02d} 2022] {m}",
    "journal ru_RU": lambda i, m: f"окт 03 13:52:{10 + i % 50:02d} gpu-node-7 kernel: {m}",
    "wall rsyslog": lambda i, m: f"\r\n\x07Message from syslogd@gpu-node-7 at Oct  3 13:52:{10 + i % 50:02d} ...\r\n"
                                 f" kernel:{m}\n\r",
    "wall sysklogd": lambda i, m: f"\r\n\x07Message from syslogd@gpu-node-7 at Mon Oct  3 13:52:{10 + i % 50:02d} 2022 "
                                  f"...\r\ngpu-node-7 kernel: [{1000 + i:>5}.000123] {m}\r",
}


def _fixture_messages(name):
    log_lines = kmsg.LogLines()
    out = []
    with open(os.path.join(HOST, name), encoding="utf-8") as f:
        for line in f:
            out.extend(log_lines.feed(line))
    out.extend(log_lines.flush())
    return [r.message for r in out if "\n" not in r.message]


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(HOST) if n.endswith(".txt")))
@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_every_fixture_gives_the_same_events_in_every_framing(name, framing, tmp_path):
    """Each fixture's real messages re-framed: the events (kind, device, detail) do not depend on the framing."""
    messages = _fixture_messages(name)
    path = tmp_path / "log"
    path.write_text("".join(FRAMINGS[framing](i, m) + "\n" for i, m in enumerate(messages)), encoding="utf-8")
    expected = [(e.kind, e.device, e.detail) for e in events_from_records(_records(*messages))]
    got = [(e.kind, e.device, e.detail) for e in kmsg._collect_files([str(path)]).events]
    assert got == expected and expected, name


def test_nic_faults_name_the_rdma_device_and_ports_of_their_rail(tmp_path):
    from nodehealth.collectors import infiniband
    from nodehealth.host import HostPaths

    dev = tmp_path / "sys" / "class" / "infiniband" / "mlx5_3"
    (dev / "ports" / "1").mkdir(parents=True)
    (dev / "ports" / "1" / "state").write_text("4: ACTIVE\n")
    os.symlink("../../../0000:0c:00.0", dev / "device")
    ib = infiniband.collect(HostPaths(str(tmp_path)), {})
    assert ib.devices[0].pci_bus_id == "0000:0c:00.0"
    events = list(events_from_records(_records(
        "mlx5_core 0000:0c:00.0: poll_health:800:(pid 0): device's health compromised - reached miss count",
        "mlx5_core 0000:0c:00.0 ens3np0: NETDEV WATCHDOG: CPU: 3: transmit queue 7 timed out 5120 ms")))
    live = Observed({"kmsg": KmsgFacts(tuple(events)), "infiniband": ib}, now=1_700_000_100.0)
    findings = nic_health.judge(live, dict(nic_health.DEFAULTS))
    assert [(f.reason, f.device) for f in findings] == [("NetdevTransmitTimeout", "ens3np0"),
                                                        ("NicFirmwareHeartbeatLost", "0000:0c:00.0")]
    assert all("which is RDMA device mlx5_3 (port 1)" in f.message for f in findings)
    saved = Observed({"kmsg": KmsgFacts(tuple(events), boot_id=None), "infiniband": ib}, now=1_700_000_100.0)
    assert not any("RDMA device" in f.message for f in nic_health.judge(saved, dict(nic_health.DEFAULTS)))


def test_a_crash_dump_split_across_two_reads_is_one_crash():
    """The daemon flushes the parser after each read of /dev/kmsg: the dump's second half is not a new crash."""
    records = _records("BUG: kernel NULL pointer dereference, address: 0000000000000010",
                       "#PF: supervisor read access in kernel mode",
                       "Oops: 0000 [#1] PREEMPT SMP NOPTI",
                       "RIP: 0010:mlx5e_xmit+0x3c/0x5d0 [mlx5_core]")
    parser = EventParser()
    first = [e for r in records[:2] for e in parser.feed(r)] + parser.flush()
    second = [e for r in records[2:] for e in parser.feed(r)] + parser.flush()
    assert [e.kind for e in first] == [KERNEL_CRASH] and second == []
    later = KernelRecord("general protection fault, probably for non-canonical address 0xdead: 0000 [#2] SMP",
                         seq=500, wall_time=1_700_000_500.0)
    assert [e.kind for e in parser.feed(later) + parser.flush()] == [KERNEL_CRASH]  # a new crash much later
    whole = list(events_from_records(records))
    assert [(e.detail["function"], e.detail["module"]) for e in whole] == [("mlx5e_xmit", "mlx5_core")]


@pytest.mark.parametrize("setting", ["memory_errors: {corrected_limit: 0}", "edac: {corrected_limit: 0}",
                                     "crashes: {window_seconds: 0}", "nic_health: {watchdog_repeat: 0}"])
def test_a_limit_that_would_fire_on_nothing_is_a_config_error(setting, tmp_path):
    from nodehealth import config

    path = tmp_path / "c.yaml"
    path.write_text(f"checks:\n  {setting}\n")
    with pytest.raises(config.ConfigError, match=setting.split(":")[0]):
        config.load(str(path))
    path.write_text("checks:\n  memory_errors: {corrected_limit: 25}\n")
    assert config.load(str(path))["checks"]["memory_errors"]["corrected_limit"] == 25


@pytest.mark.parametrize("message,reason,severity", [
    # formats from the kernel (drivers/edac/mce_amd.c, arch/x86/kernel/cpu/mce/core.c, drivers/acpi/apei/ghes.c)
    # as docs/domain/host-hardware.md sections 2 and 3 give them; no capture of these was found
    ("mce: [Hardware Error]: Corrected error, no action required.", "MachineCheckCorrected", Severity.WARNING),
    ("[Hardware Error]: Deferred error, no action required.", "MachineCheckCorrected", Severity.WARNING),
    ("mce: [Hardware Error]: Uncorrected, software containable error.", "MachineCheckUncorrected", Severity.FATAL),
    ("[Hardware Error]: System Fatal error.", "MachineCheckFatal", Severity.FATAL),
    ("Kernel panic - not syncing: Fatal machine check", "MachineCheckFatal", Severity.FATAL),
    ("mce: [Hardware Error]: Machine check: Processor context corrupt", "MachineCheckFatal", Severity.FATAL),
    ("mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 5: 9c00000000010090", "MachineCheckCorrected",
     Severity.WARNING),  # UC clear
    ("mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 5: b200000000070005", "MachineCheckFatal",
     Severity.FATAL),  # UC and PCC
    ("mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 5: bd80000000100134", "MachineCheckUncorrected",
     Severity.FATAL),  # UC without PCC (SRAR)
    ("Kernel panic - not syncing: Fatal hardware error!", "HardwareErrorFatal", Severity.FATAL),
    # old kernels: arch/i386/kernel/cpu/mcheck/p4.c and p6.c, arch/x86_64/kernel/mce.c (2.6), kernel/panic.c
    ("CPU 0: Machine Check Exception: 0000000000000004", "MachineCheckUncorrected", Severity.FATAL),  # #MC, no bank
    ("CPU 1: Machine Check Exception:                4 Bank 4: b200000000070f0f", "MachineCheckFatal",
     Severity.FATAL),
    ("Kernel panic - not syncing: CPU context corrupt", "MachineCheckFatal", Severity.FATAL),
    ("Kernel panic: CPU context corrupt", "MachineCheckFatal", Severity.FATAL),
    ("Machine check events logged", "MachineCheckLogged", Severity.WARNING),
    ("mce: [Hardware Error]: Machine check events logged", "MachineCheckLogged", Severity.WARNING),
    ("EDAC sbridge MC1: CPU 1: Machine Check Exception: 5 Bank 11: b200000000070f0f", None, None),  # EDAC's copy
    ("{9}[Hardware Error]: event severity: info", None, None),
])
def test_machine_check_and_firmware_severities(message, reason, severity):
    events = list(events_from_records(_records(message)))
    obs = Observed({"kmsg": KmsgFacts(tuple(events))}, now=1_700_000_100.0)
    findings = memory_errors.judge(obs, dict(memory_errors.DEFAULTS))
    assert [(f.reason, f.severity) for f in findings] == ([(reason, severity)] if reason else [])
    assert not crashes.judge(obs, dict(crashes.DEFAULTS))  # a machine-check panic is a hardware fault, not a bug


@pytest.mark.parametrize("panic,kind", [("Kernel panic - not syncing: Fatal hardware error!", "cper"),
                                        ("Kernel panic: CPU context corrupt", "mce")])
def test_a_hardware_panic_after_a_crash_header_is_the_hardware_fault(panic, kind):
    events = list(events_from_records(_records("BUG: kernel NULL pointer dereference, address: 0000000000000010",
                                               panic)))
    assert kind in {e.kind for e in events}
    [crash] = [e for e in events if e.kind == KERNEL_CRASH]
    assert crash.detail["headers"] == ["BUG: kernel NULL pointer dereference, address: 0000000000000010"]


def test_a_machine_check_notice_beside_decoded_records_adds_nothing():
    """`Machine check events logged` says only that records exist: when the log decodes them, they are the finding."""
    for name in ("radiasoft-134.journal.mce-edac-ce.txt", "osm-ops-300.syslog.mce-edac-ce.txt",
                 "mcelog-70.syslog.mce-record.txt"):
        findings, log = judge_file(name)
        assert any(e.detail.get("logged") for e in log.events), name
        assert "MachineCheckLogged" not in {f.reason for f in findings}, name
    days = [KernelRecord("mce: [Hardware Error]: Machine check events logged", seq=1, wall_time=1_700_000_000.0),
            KernelRecord("EDAC MC0: 1 CE memory read error on DIMM_A1 (channel:0 slot:0 page:0x1 offset:0x0 grain:32 "
                         "syndrome:0x0)", seq=2, wall_time=1_700_050_000.0)]  # half a day apart: unrelated
    obs = Observed({"kmsg": KmsgFacts(tuple(events_from_records(days)))}, now=1_700_050_100.0)
    assert {f.reason for f in memory_errors.judge(obs, dict(memory_errors.DEFAULTS))} == {
        "MachineCheckLogged", "MemoryCorrected"}


# drivers/net/ethernet/mellanox/mlx5/core/en_main.c mlx5e_tx_timeout: netdev_err(dev, "TX timeout detected\n"), after
# net/sched/sch_generic.c dev_watchdog's NETDEV WATCHDOG line (a WARN_ONCE on older kernels: later timeouts print only
# the driver's line); the per-queue "TX timeout on queue: ..." lines that follow (en/reporter_tx.c) are its detail.
_MLX5E = "mlx5_core 0000:3b:00.0 enp59s0f0np0: "
_MLX5E_TIMEOUT = [
    _MLX5E + "NETDEV WATCHDOG: CPU: 12: transmit queue 5 timed out 8192 ms",
    _MLX5E + "TX timeout detected",
    _MLX5E + "TX timeout on queue: 5, SQ: 0x10f, CQ: 0x4b6, SQ Cons: 0x1a2 SQ Prod: 0x1a7, usecs since last trans: "
             "8192000",
]


def test_mlx5e_tx_timeouts_are_found_and_one_incident_counts_once():
    [event] = events_from_records(_records(*_MLX5E_TIMEOUT))  # the watchdog's line and the driver's: one incident
    assert (event.kind, event.device, event.detail["pci_bus_id"]) == ("netdev_watchdog", "enp59s0f0np0", "0000:3b:00.0")
    [alone] = events_from_records(_records(_MLX5E_TIMEOUT[1]))  # the driver's line alone (the WARN was printed once)
    assert (alone.kind, alone.device, alone.detail["driver"], alone.detail["pci_bus_id"]) == (
        "netdev_watchdog", "enp59s0f0np0", "mlx5_core", "0000:3b:00.0")
    events = list(events_from_records(_records(*_MLX5E_TIMEOUT, *["x"] * 80, _MLX5E_TIMEOUT[1], _MLX5E_TIMEOUT[1])))
    [f] = nic_health.judge(Observed({"kmsg": KmsgFacts(tuple(events))}, now=1_700_000_100.0),
                           dict(nic_health.DEFAULTS))
    assert (f.reason, f.device, f.evidence["count"], f.severity) == (
        "NetdevTransmitTimeout", "enp59s0f0np0", 3, Severity.DEGRADED)
    assert "TX timeout detected" in f.message


def test_old_mlx5_fatal_error_line_and_pci_slot_gone():
    events = list(events_from_records(_records("mlx5_core 0000:0c:00.0: poll_health:739:(pid 0): Fatal error 1 "
                                               "detected")))
    [f] = nic_health.judge(Observed({"kmsg": KmsgFacts(tuple(events))}, now=1_700_000_100.0),
                           dict(nic_health.DEFAULTS))
    assert (f.reason, f.severity, f.action) == ("NicFirmwareFatal", Severity.FATAL, Action.REBOOT)


def test_a_panic_after_a_soft_lockup_is_a_crash_the_lockup_is_not():
    """sonic-17358: the soft lockup stays the kernel check's; the panic it caused is a crash."""
    log = kmsg._collect_files([os.path.join(HERE, "fixtures", "kmsg", "issues",
                                            "sonic-17358.soft-lockup-panic.indented-elided.txt")])
    crash = [e for e in log.events if e.kind == KERNEL_CRASH]
    assert [e.detail["headers"][0] for e in crash] == ["Kernel panic - not syncing: softlockup: hung tasks"]
    assert crash[0].detail["panic"] is True
