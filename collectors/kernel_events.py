"""Typed kernel-log events: the facts the kernel-log collector hands to checks.

Parsing a record into an event (which Xid, which GPU, which task) is reading, so it lives
here; what an event means for the node (severity, action) is judged in checks/.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

# Event kinds. Checks select on these.
XID = "xid"  # NVRM: Xid (PCI:...): N, ...
SXID = "sxid"  # nvidia-nvswitchN: SXid (PCI:...): N, ...
GPU_FALLEN_OFF_BUS = "gpu_fallen_off_bus"  # "fallen off the bus" without an Xid number
HUNG_TASK = "hung_task"  # INFO: task X:pid blocked for more than N seconds
SOFT_LOCKUP = "soft_lockup"  # watchdog: BUG: soft lockup - CPU#N stuck for Ns!
HARD_LOCKUP = "hard_lockup"  # NMI watchdog: Watchdog detected hard LOCKUP on cpu N
LINK_DOWN = "link_down"  # mlx5_core / IB port or netdev link down
LINK_UP = "link_up"  # the matching link up (to count flaps)

KINDS = (XID, SXID, GPU_FALLEN_OFF_BUS, HUNG_TASK, SOFT_LOCKUP, HARD_LOCKUP, LINK_DOWN, LINK_UP)


@dataclass(frozen=True)
class KernelRecord:
    """One kernel log record, whatever framing it came in (kmsg, dmesg, journal, syslog)."""

    message: str  # continuation lines joined with "\n"
    seq: Optional[int] = None  # kmsg sequence number (only raw kmsg records carry it)
    monotonic_us: Optional[int] = None  # microseconds since boot
    wall_time: Optional[float] = None  # epoch seconds, when known
    priority: Optional[int] = None  # syslog level 0 (emerg) .. 7 (debug)


@dataclass(frozen=True)
class KernelEvent:
    kind: str  # one of KINDS
    device: str  # GPU/NVSwitch PCI address "0000:3b:00.0", HCA/netdev name, or "cpu3" / "task:pid"
    code: Optional[int] = None  # Xid / SXid number
    text: str = ""  # the event's own words (after the code), for messages
    seq: Optional[int] = None
    monotonic_us: Optional[int] = None
    wall_time: Optional[float] = None
    detail: Dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> Tuple[object, ...]:
        """Identity used to never count a record twice (with the boot id, in the state file)."""
        if self.seq is not None:
            return (self.seq, self.kind, self.device, self.code)
        return (self.monotonic_us, self.wall_time, self.kind, self.device, self.code, self.text)
