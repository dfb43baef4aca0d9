"""Storage faults from the kernel log: ext4 errors and lost writes, XFS shutdowns and metadata I/O
errors, filesystems remounted read-only, failed block requests, Buffer I/O errors and NVMe timeouts,
resets and removals (docs/sources.md, "Host hardware severities")."""
from __future__ import annotations

from dataclasses import replace

from nodehealth.checks.host_log import Rating, judge_events
from nodehealth.checks.kernel_log import is_saved_log
from nodehealth.collectors.kernel_events import FS_ERROR, FS_READONLY, IO_ERROR, NVME_ERROR, KernelEvent
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "storage_errors"
NEEDS = ("kmsg",)
SUBSYSTEM = "storage"
DEBOUNCE = False
DEFAULTS: dict = {
    # Errors older than this no longer count; a read-only or shut-down filesystem and a lost write count all boot.
    "window_seconds": 86400.0,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "window_seconds": ("storage errors older than this no longer count; a read-only or shut-down filesystem counts "
                       "all boot"),
}
SOURCE = "kernel log"
FINDS = ("ext4 errors, XFS shutdowns, filesystems remounted read-only, `Buffer I/O error`, NVMe I/O timeouts, "
         "controller resets and removals, by device (with its mount points on this host)")
REASONS = {
    "FilesystemReadOnly": Reason(Severity.FATAL, Action.REBOOT,
                                 "a filesystem was remounted read-only after an error: writes fail; fsck and reboot"),
    "FilesystemShutdown": Reason(Severity.FATAL, Action.REBOOT,
                                 "an XFS filesystem shut itself down: every access fails; unmount, xfs_repair, reboot"),
    "FilesystemError": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                              "a filesystem reported an error: its metadata or the disk under it is damaged"),
    "BlockIoError": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                           "reads or writes to a block device failed (`Buffer I/O error`)"),
    "DataWriteLost": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                            "ext4 could not write files' data to the disk (`ext4_end_bio ... I/O error ... writing "
                            "to inode`): data applications wrote is lost, the inodes are in the evidence; counts "
                            "all boot"),
    "FilesystemMetadataIoError": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                                        "XFS could not read or write its metadata (`metadata I/O error`); run "
                                        "xfs_repair once unmounted"),
    "DiskWriteError": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                             "a write or flush request to a block device failed (`I/O error, dev ..., op "
                             "0x1:(WRITE)`): data the kernel had accepted did not reach the disk"),
    "DiskReadError": Reason((Severity.WARNING, Severity.DEGRADED), (Action.NONE, Action.HW_INSPECTION),
                            "a read request to a block device failed; degraded at 3 in 24 h on one disk"),
    "DiskIoError": Reason((Severity.WARNING, Severity.DEGRADED), (Action.NONE, Action.HW_INSPECTION),
                          "a request to a block device failed and the line does not say it was a write (discard, "
                          "or an old kernel's form); degraded at 3 in 24 h"),
    "NvmeControllerLost": Reason(Severity.FATAL, Action.HW_INSPECTION,
                                 "an NVMe controller was disabled or removed; its namespaces are gone until a reboot"),
    "NvmeControllerReset": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                                  "an NVMe controller was reset after an I/O timeout"),
    "NvmeIoTimeout": Reason((Severity.WARNING, Severity.DEGRADED), (Action.NONE, Action.HW_INSPECTION),
                            "NVMe I/O timed out and was aborted; degraded at 3"),
}

_INSPECT = "check the disk's SMART/NVMe health log and the cabling or slot, and replace it if it keeps failing"


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    cfg = dict(DEFAULTS, **cfg)
    mounts = obs.facts.get("mounts")
    # A saved log may come from another host: this host's mount table says nothing about it.
    table = dict(mounts.block_devices) if mounts is not None and not is_saved_log(obs) else {}
    return judge_events(NAME, obs, cfg, (FS_ERROR, FS_READONLY, IO_ERROR, NVME_ERROR),
                        lambda e: mounted(rate(e), e.device, table))


def mount_points(device: str, table: dict[str, str]) -> list[str]:
    """Where a device is mounted: the device itself, its partitions, or an NVMe controller's namespaces."""
    prefix = device + "n" if device.startswith("nvme") and "n" not in device[4:] else device
    return sorted({m for name, m in table.items() if name == device or name.startswith(prefix)})


def mounted(rating: Rating | None, device: str, table: dict[str, str]) -> Rating | None:
    points = mount_points(device, table) if rating is not None else []
    if not points:
        return rating
    return replace(rating, what=f"{rating.what} (mounted on {', '.join(points[:4])})")


# Block request operations whose failure loses data the kernel had already accepted (a flush loses
# what the device's cache held); a failed read or discard loses nothing written.
_WRITES = frozenset({"WRITE", "FLUSH", "WRITE_ZEROES", "WRITE_SAME", "ZONE_APPEND"})


def rate(e: KernelEvent) -> Rating | None:
    if e.kind == FS_READONLY:
        return Rating("FilesystemReadOnly", Severity.FATAL, Action.REBOOT,
                      f"The filesystem on {e.device} was remounted read-only after an error",
                      "writes to it fail: drain the node, run fsck on it and reboot", True)
    if e.kind == FS_ERROR and e.detail.get("shutdown"):
        return Rating("FilesystemShutdown", Severity.FATAL, Action.REBOOT,
                      f"The XFS filesystem on {e.device} shut itself down",
                      "every access to it fails: drain the node, unmount it, run xfs_repair and reboot", True)
    if e.kind == FS_ERROR and e.detail.get("lost_write"):
        return Rating("DataWriteLost", Severity.DEGRADED, Action.HW_INSPECTION,
                      f"Writing files' data to {e.device} failed, so data applications had written is lost",
                      "those files are damaged (their inodes are in the evidence); " + _INSPECT, True)
    if e.kind == FS_ERROR and e.detail.get("metadata_io"):
        return Rating("FilesystemMetadataIoError", Severity.DEGRADED, Action.HW_INSPECTION,
                      f"The XFS filesystem on {e.device} could not read or write its metadata "
                      f"(error {e.detail.get('error')})", "run xfs_repair once it is unmounted; " + _INSPECT)
    if e.kind == FS_ERROR:
        return Rating("FilesystemError", Severity.DEGRADED, Action.HW_INSPECTION,
                      f"The {e.detail.get('fs', '')} filesystem on {e.device} reported an error",
                      "its metadata or the disk under it is damaged; " + _INSPECT)
    if e.kind == IO_ERROR and e.detail.get("layer") == "block":
        return _block_request(e)
    if e.kind == IO_ERROR:
        return Rating("BlockIoError", Severity.DEGRADED, Action.HW_INSPECTION,
                      f"Reads or writes to {e.device} failed (Buffer I/O error)", "data may be lost; " + _INSPECT)
    if e.kind == NVME_ERROR:
        step = e.detail.get("step")
        if step in ("disable", "down", "removed"):
            return Rating("NvmeControllerLost", Severity.FATAL, Action.HW_INSPECTION,
                          f"NVMe controller {e.device} was disabled or removed after failing to respond",
                          "its namespaces are gone until a reboot; " + _INSPECT, True)
        if step == "reset":
            return Rating("NvmeControllerReset", Severity.DEGRADED, Action.HW_INSPECTION,
                          f"NVMe controller {e.device} was reset after an I/O timeout", _INSPECT)
        return Rating("NvmeIoTimeout", Severity.WARNING, Action.NONE,
                      f"NVMe controller {e.device} timed out on I/O and the command was aborted",
                      "a slow or failing device; it escalates to a reset if it keeps happening",
                      repeat=3, repeated=Severity.DEGRADED, repeated_action=Action.HW_INSPECTION)
    return None


def _block_request(e: KernelEvent) -> Rating:
    op = e.detail.get("op")
    failed = f"{e.detail.get('status', 'I/O')} error"
    if op in _WRITES:
        return Rating("DiskWriteError", Severity.DEGRADED, Action.HW_INSPECTION,
                      f"A {op.lower()} to {e.device} failed ({failed})",
                      "data the kernel had accepted did not reach the disk; " + _INSPECT)
    if op == "READ":
        reason, what = "DiskReadError", f"A read from {e.device} failed ({failed})"
    elif op:
        reason, what = "DiskIoError", f"A {op.lower()} request to {e.device} failed ({failed})"
    else:
        reason, what = "DiskIoError", f"A request to {e.device} failed ({failed}; the kernel did not say which kind)"
    return Rating(reason, Severity.WARNING, Action.NONE, what,
                  "its reader got an error and may retry; repeated failures mean a failing disk or path",
                  repeat=3, repeated=Severity.DEGRADED, repeated_action=Action.HW_INSPECTION)
