"""Storage faults from the kernel log: ext4 errors, XFS shutdowns, filesystems remounted read-only,
Buffer I/O errors and NVMe timeouts, resets and removals (host-hardware.md sections 6 and 9)."""
from __future__ import annotations

from dataclasses import replace

from nodehealth.checks.host_log import Rating, judge_events
from nodehealth.checks.kernel_log import is_saved_log
from nodehealth.collectors.kernel_events import FS_ERROR, FS_READONLY, IO_ERROR, NVME_ERROR, KernelEvent
from nodehealth.model import Action, Finding, Observed, Severity

NAME = "storage_errors"
NEEDS = ("kmsg",)
SUBSYSTEM = "storage"
DEBOUNCE = False
DEFAULTS: dict = {
    # Errors older than this no longer count; a read-only or shut-down filesystem counts all boot.
    "window_seconds": 86400.0,
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


def rate(e: KernelEvent) -> Rating | None:
    if e.kind == FS_READONLY:
        return Rating("FilesystemReadOnly", Severity.FATAL, Action.REBOOT,
                      f"The filesystem on {e.device} was remounted read-only after an error",
                      "writes to it fail: drain the node, run fsck on it and reboot", True)
    if e.kind == FS_ERROR and e.detail.get("shutdown"):
        return Rating("FilesystemShutdown", Severity.FATAL, Action.REBOOT,
                      f"The XFS filesystem on {e.device} shut itself down",
                      "every access to it fails: drain the node, unmount it, run xfs_repair and reboot", True)
    if e.kind == FS_ERROR:
        return Rating("FilesystemError", Severity.DEGRADED, Action.HW_INSPECTION,
                      f"The {e.detail.get('fs', '')} filesystem on {e.device} reported an error",
                      "its metadata or the disk under it is damaged; " + _INSPECT)
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
