"""Typed kernel-log events: the facts the kernel-log collector hands to checks.

Long on purpose: every kind of kernel-log event the checks read (Xid, SXid, link, MCE, EDAC,
storage, NIC, crashes) is parsed in one place, with the patterns side by side.

Parsing a record into an event (which Xid, which GPU, which task) is reading, so it lives
here; what an event means for the node (severity, action) is judged in checks/.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

# Event kinds. Checks select on these.
XID = "xid"  # NVRM: Xid (PCI:...): N, ...
SXID = "sxid"  # nvidia-nvswitchN: SXid (PCI:...): N, ...
GPU_FALLEN_OFF_BUS = "gpu_fallen_off_bus"  # "fallen off the bus" without an Xid number
HUNG_TASK = "hung_task"  # INFO: task X:pid blocked for more than N seconds
SOFT_LOCKUP = "soft_lockup"  # watchdog: BUG: soft lockup - CPU#N stuck for Ns!
HARD_LOCKUP = "hard_lockup"  # NMI watchdog: Watchdog detected hard LOCKUP on cpu N
LINK_DOWN = "link_down"  # mlx5_core / IB port or netdev link down
LINK_UP = "link_up"  # the matching link up (to count flaps)

# Host hardware and kernel (docs/sources.md, "Host hardware severities"); device names the CPU, memory controller,
# disk, NIC or netdev, detail carries what the check needs to rate it.
# mce: [Hardware Error]: CPU n: Machine Check: ... Bank b: <status>; machine-check panic; old kernels' CPU n: Machine
# Check Exception: <mcg> and its Bank lines; Machine check events logged (a notice without severity)
MCE = "mce"
CPER = "cper"  # {N}[Hardware Error]: event severity: corrected|recoverable|fatal|info
EDAC_ERROR = "edac_error"  # EDAC MCn: <count> CE|UE <message> on <label> (...)
MEMORY_FAILURE = "memory_failure"  # Memory failure: 0x<pfn>: recovery action for <type>: <result>
CPU_THROTTLE = "cpu_throttle"  # CPUn: Core|Package temperature [is] above threshold, cpu clock [is] throttled
KERNEL_CRASH = "kernel_crash"  # BUG: / Oops / general protection fault / kernel BUG at / Kernel panic
RCU_STALL = "rcu_stall"  # rcu: INFO: rcu_sched self-detected stall on CPU / detected stalls on CPUs/tasks
NETDEV_UNREGISTER = "netdev_unregister"  # unregister_netdevice: waiting for <dev> to become free
# NETDEV WATCHDOG: <if> (<driver>): transmit queue <q> timed out; mlx5e's TX timeout detected
NETDEV_WATCHDOG = "netdev_watchdog"
# EXT4-fs error (device <dev>) / XFS (<dev>): ... Shutting down filesystem / ext4_end_bio: I/O error ... writing
# to inode (a lost data write) / XFS (<dev>): metadata I/O error
FS_ERROR = "fs_error"
FS_READONLY = "fs_readonly"  # EXT4-fs (<dev>): Remounting filesystem read-only
IO_ERROR = "io_error"  # Buffer I/O error on dev <dev>, logical block <n> / I/O error, dev <disk>, sector <n> op ...
NVME_ERROR = "nvme_error"  # nvme nvmeN: I/O timeout, aborting / reset controller / removing / controller is down
MLX5_HEALTH = "mlx5_health"  # mlx5_core <bdf>: health compromised, fatal syndrome, command timeout

HOST_KINDS = (MCE, CPER, EDAC_ERROR, MEMORY_FAILURE, CPU_THROTTLE, KERNEL_CRASH, RCU_STALL, NETDEV_UNREGISTER,
              NETDEV_WATCHDOG, FS_ERROR, FS_READONLY, IO_ERROR, NVME_ERROR, MLX5_HEALTH)
KINDS = (XID, SXID, GPU_FALLEN_OFF_BUS, HUNG_TASK, SOFT_LOCKUP, HARD_LOCKUP, LINK_DOWN, LINK_UP) + HOST_KINDS


@dataclass(frozen=True)
class KernelRecord:
    """One kernel log record, whatever framing it came in (kmsg, dmesg, journal, syslog)."""

    message: str  # continuation lines joined with "\n"
    seq: int | None = None  # kmsg sequence number (only raw kmsg records carry it)
    monotonic_us: int | None = None  # microseconds since boot
    wall_time: float | None = None  # epoch seconds, when known
    priority: int | None = None  # syslog level 0 (emerg) .. 7 (debug)
    # kmsg dictionary lines (` SUBSYSTEM=pci`, ` DEVICE=+pci:0000:3b:00.0`), when the record has them
    dictionary: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    # syslog facility where the framing has it (raw kmsg): 0 is the kernel; userspace writes to
    # /dev/kmsg never get 0, so only facility 0 (or unknown) records become events.
    facility: int | None = None


@dataclass(frozen=True)
class KernelEvent:
    kind: str  # one of KINDS
    device: str  # GPU/NVSwitch PCI address "0000:3b:00.0", HCA/netdev name, "cpu3" or a task name
    code: int | None = None  # Xid / SXid number
    text: str = ""  # the event's own words (after the code), for messages
    seq: int | None = None
    monotonic_us: int | None = None
    wall_time: float | None = None
    detail: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> tuple[object, ...]:
        """Identity used to never count a record twice (with the boot id, in the state file)."""
        if self.seq is not None:
            return (self.seq, self.kind, self.device, self.code)
        return (self.monotonic_us, self.wall_time, self.kind, self.device, self.code, self.text)


# Classification. Every pattern is searched only after a cheap substring test, numbers are
# bounded (a 10,000-digit "pid" must not reach int()), and nothing here raises on odd text.

_HEX = "[0-9a-fA-F]"
_PCI = re.compile(rf"(?:({_HEX}{{1,8}}):)?({_HEX}{{1,2}}):({_HEX}{{1,2}})(?:\.([0-7]))?")

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<addr>[^)\s]*)(?:\s+GPU-I:(?P<gi>\d{1,4}))?[^)]*\):\s*"
                  r"(?P<code>\d{1,9})(?:,\s*(?P<rest>.*))?", re.S)
_PID = re.compile(r"pid=(?:'?<unknown>'?|(?P<pid>\d{1,10})|'[^']*'|[^,\s]*),\s*")
_NAME = re.compile(r"name=(?P<name>[^,]*)(?:,\s*|$)")

_SXID = re.compile(r"(?P<switch>nvidia-nvswitch\d{1,4}): SXid \((?:PCI:)?(?P<addr>[^)\s]*)\):\s*"
                   r"(?P<code>\d{1,9})(?:,\s*(?P<rest>.*))?", re.S)
_SXID_HEAD = re.compile(r"(?P<sev>Fatal|Non-fatal|Nonfatal),\s*(?:Link (?P<link>-?\d{1,4})\s*)?(?P<text>.*)",
                        re.S | re.I)
_SXID_SEVERITY = re.compile(r"Severity (\d{1,4}) Engine instance (\d{1,6}) Sub-engine instance (\d{1,6})")
_SXID_DATA = re.compile(r"Data \{(?P<words>[^}]*)\}?")

# The domain is optional: some drivers print `GPU 18:00.0` (canonical_pci adds 0000).
_ADDRESS = rf"(?:{_HEX}{{1,8}}:)?{_HEX}{{1,2}}:{_HEX}{{1,2}}(?:\.[0-7])?"
_FALLEN_ONE_LINE = re.compile(rf"NVRM: GPU (?:at )?(?:PCI:)?(?P<addr>{_ADDRESS}):? (?:GPU )?has fallen off the bus")
_FALLEN_START = re.compile(rf"NVRM: The NVIDIA GPU (?P<addr>{_ADDRESS})")
_PCI_ID = re.compile(r"\(PCI ID: (?P<id>[0-9a-fA-F]{4}:[0-9a-fA-F]{4})\)")
_FALLEN_TEXT = re.compile(r"fallen off the bus[^\n\\]*")

_HUNG = re.compile(r"INFO: task (?P<comm>.{1,64}?):(?P<pid>\d{1,10}) blocked for more than "
                   r"(?P<seconds>\d{1,10}) seconds")
# The newer stack-dump header, also printed alone (excerpts, sysrq-w): task:NAME state:D ... pid:N
_TASK_STATE_D = re.compile(r"^task:(?P<comm>.{1,64}?)\s+state:D\b.*?\bpid:\s*(?P<pid>\d{1,10})")
_SOFT = re.compile(r"BUG: soft lockup - CPU#(?P<cpu>\d{1,5}) stuck for (?P<seconds>\d{1,10})s!"
                   r"(?: \[(?P<comm>.{0,64}):(?P<pid>\d{1,10})\])?")
_HARD = re.compile(r"Watchdog detected hard LOCKUP on cpu (?P<cpu>\d{1,5})")

# mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down / mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE
_MLX_LINK = re.compile(rf"^(?:mlx[45]_core|mlx4_en) (?P<pci>{_HEX}{{4,8}}:{_HEX}{{2}}:{_HEX}{{2}}\.[0-7])"
                       r"(?: (?P<name>[^\s:]{1,64}))?: (?:Port: (?P<port>\d{1,3}) )?Link (?P<state>\w{1,16})")
# mlx4_en: eth2: Link Up
_MLX4_LINK = re.compile(r"^mlx4_en: (?P<name>[^\s:]{1,64}): Link (?P<state>Up|Down)\b")
_LINK_STATES = {"up": LINK_UP, "active": LINK_UP, "down": LINK_DOWN}

# The statuses of a failed block request that mean the device or its path failed (block/blk-core.c
# blk_errors); "operation not supported", "critical space allocation" (a thin pool full) and the
# resource and zone statuses are not disk faults.
_BLOCK_STATUSES = ("I/O error", "critical medium error", "critical target error", "critical nexus error",
                   "recoverable transport error", "timeout error", "protection error")

# Host hardware and kernel. Each of these messages starts with one of a few words, except the
# newer NETDEV WATCHDOG line (which starts with its driver's name), so one startswith() and one
# substring test decide whether a record can be any of them: most records pay only those.
_HOST_PREFIXES = ("mce:", "MCE 0x", "[Hardware Error]", "{", "GHES", "EDAC MC", "Memory failure", "CPU", "BUG:", "Oops",
                  "general protection", "Kernel panic", "divide error", "invalid opcode", "kernel BUG", "rcu:",
                  "INFO: rcu_", "unregister_netdevice", "NETDEV WATCHDOG", "EXT4-fs", "XFS (", "Buffer I/O error",
                  "nvme ", "mlx5_core", *_BLOCK_STATUSES, "blk_update_request:", "print_req_error:", "end_request:",
                  "Machine check")


def _may_be_host_fault(message: str) -> bool:
    if message.startswith(_HOST_PREFIXES) or "NETDEV WATCHDOG" in message:
        return True
    # A line no framing recognised ("Feb 23 03:28:16 kernel: [ 0.06] EDAC MC1: ...") is its own message.
    at = message.find("kernel: ")
    if at < 0:
        return False
    rest = message[at + 8:].lstrip()
    if rest.startswith("["):
        rest = rest[rest.find("]") + 1:].lstrip()
    return rest.startswith(_HOST_PREFIXES)


# The record after "[Hardware Error]: ", or at the start of the message on kernels before the prefix (2.6's
# x86_64 mce.c pads the MCG status to 16 columns). An EDAC driver's copy ("EDAC sbridge MC1: CPU 1: ...") is neither.
_MCE = re.compile(r"(?:\[Hardware Error\]: |^)CPU (?P<cpu>\d{1,5}): Machine Check(?: Exception)?: *"
                  r"(?P<mcg>[0-9a-fA-F]{1,16}) Bank (?P<bank>\d{1,4}): (?P<status>[0-9a-fA-F]{1,16})")
# i386 kernels (mcheck/p4.c, p6.c, k7.c): the exception on its own line, then a line per bank with its status,
# then "Kernel panic: CPU context corrupt" or "Attempting to continue."
_MCE_EXCEPTION = re.compile(r"CPU#? ?(?P<cpu>\d{1,5}): Machine Check Exception\b")
_MCE_BANK = re.compile(r"(?:CPU \d{1,5}: )?Bank (?P<bank>\d{1,4}): (?P<status>[0-9a-fA-F]{16})\b")
_MCE_TRAIL_RECORDS = 16  # how far an old exception's bank lines and panic may trail it
_MCE_HINTS = ("Hardware Error", "achine check", "Machine Check", "context corrupt")
# AMD's decoder states the severity in words on the record's first line.
_MCE_AMD = re.compile(r"\[Hardware Error\]: (?P<what>Corrected error, no action required|Deferred error, no action "
                      r"required|Uncorrected, software containable error|Uncorrected, software restartable error|"
                      r"System Fatal error)")
_MCE_PANIC = re.compile(r"Kernel panic - not syncing: Fatal [Mm]achine check|\[Hardware Error\]: Machine check: "
                        r"(?P<reason>[^\n]{1,120})|Kernel panic(?: - not syncing)?: CPU context corrupt")
_CPER = re.compile(r"\{(?P<record>\d{1,10})\}\[Hardware Error\]: event severity: (?P<severity>[a-z]{1,16})")
_GHES_FATAL = re.compile(r"Kernel panic - not syncing: Fatal hardware error|GHES: Fatal hardware error")
_EDAC = re.compile(r"EDAC (?P<mc>MC\d{1,4}): (?P<count>\d{1,10}) (?P<type>CE|UE) (?P<msg>.{0,80}?) ?on "
                   r"(?P<label>[^\s(]{1,120})")
_MEMORY_FAILURE = re.compile(r"(?:Memory failure:|MCE) (?P<pfn>0x[0-9a-fA-F]{1,16}): (?:recovery action for )?"
                             r"(?P<what>[^:]{1,80}): (?P<result>Recovered|Ignored|Failed|Delayed)")
_THROTTLE = re.compile(r"(?P<cpu>CPU\d{1,5}): (?P<scope>Core|Package) temperature (?:is )?above threshold, "
                       r"cpu clock (?:is )?throttled \(total events = (?P<total>\d{1,12})\)")
# A soft lockup and a workqueue lockup also print "BUG:": the kernel check reports lockups, and a
# panic they cause ("Kernel panic - not syncing: softlockup: hung tasks") is a crash.
_CRASH = re.compile(r"(?P<head>BUG: (?!soft lockup|workqueue lockup)[^\n]{1,160}|kernel BUG at [^\n]{1,160}|"
                    r"(?:Oops: )?(?:general protection fault|divide error|invalid opcode)[^\n]{0,120}\[#\d{1,4}\]|"
                    r"Oops: [0-9a-fA-F]{1,8} \[#\d{1,4}\][^\n]{0,80}|Kernel panic - not syncing: [^\n]{1,160})")
_RIP = re.compile(r"RIP: [0-9a-fA-F]{4}:(?:\[<[0-9a-fA-F]+>\]\s+\[<[0-9a-fA-F]+>\] )?(?P<fn>[\w.]{1,80})\+"
                  r"0x[0-9a-fA-F]{1,8}/0x[0-9a-fA-F]{1,8}(?: \[(?P<module>\w{1,64})\])?")
_RCU = re.compile(r"INFO: (?P<flavor>rcu_\w{1,16}) (?P<what>self-detected stall on CPU|detected (?:expedited )?"
                  r"stalls? on CPUs?(?:/tasks)?)")  # old kernels: "rcu_sched_state detected stall on CPU 0"
_UNREGISTER = re.compile(r"unregister_netdevice: waiting for (?P<dev>\S{1,64}) to become free\. "
                         r"Usage count = (?P<count>-?\d{1,10})")
_WATCHDOG_OLD = re.compile(r"NETDEV WATCHDOG: (?P<dev>\S{1,64}) \((?P<driver>[^)\s]{1,64})\): transmit queue "
                           r"(?:(?P<queue>\d{1,6}) )?timed out")
_WATCHDOG_NEW = re.compile(r"^(?P<driver>[\w-]{1,64}) (?P<bus>\S{1,64}) (?P<dev>[^\s:]{1,64}): NETDEV WATCHDOG: "
                           r"(?:CPU: \d{1,5}: )?transmit queue (?P<queue>\d{1,6}) timed out")
_EXT4_ERROR = re.compile(r"EXT4-fs error \(device (?P<dev>[^)\s]{1,64})\)")
_EXT4_RO = re.compile(r"EXT4-fs \((?P<dev>[^)\s]{1,64})\): Remounting filesystem read-only")
_XFS_SHUTDOWN = re.compile(r"XFS \((?P<dev>[^)\s]{1,64})\): (?:.{0,200}Shutting down filesystem|"
                           r"Filesystem has been shut down|.{0,40}xfs_do_force_shutdown)")
# A failed block request (block/blk-mq.c blk_print_req_error; before 5.16 "blk_update_request: " or
# "print_req_error: " in front, before 4.10 no operation or flags), with a status of _BLOCK_STATUSES.
_BLOCK_ERROR = re.compile(r"(?:^|: )(?P<status>I/O|critical medium|critical target|critical nexus|recoverable "
                          r"transport|timeout|protection) error, dev (?P<dev>[^,\s]{1,64}), sector (?P<sector>\d{1,20})"
                          r"(?: op 0x[0-9a-fA-F]{1,8}:\((?P<op>[A-Z_]{1,24})\)| flags (?P<flags>[0-9a-fA-F]{1,16}))?")
# The request operation in the low byte of the flags that 4.10-5.2 print instead of `op` (blk_types.h req_opf).
_REQ_OPS = {0: "READ", 1: "WRITE", 2: "FLUSH", 3: "DISCARD"}
# fs/ext4/page-io.c ext4_end_bio: writeback of a file's pages failed, so data the application wrote is lost.
_EXT4_LOST_WRITE = re.compile(r"EXT4-fs warning \(device (?P<dev>[^)\s]{1,64})\): ext4_end_bio:\d{1,6}: I/O error "
                              r"(?P<error>-?\d{1,6}) writing to inode (?P<inode>\d{1,20})")
# fs/xfs/xfs_buf.c xfs_buf_ioerror_alert: `in "<caller>" at daddr ... error N` (5.x) or `: block 0x.. ("<caller>")
# error N numblks N` (older).
_XFS_METADATA_IO = re.compile(r"XFS \((?P<dev>[^)\s]{1,64})\): metadata I/O error(?: in | ?: block "
                              r"0x[0-9a-fA-F]{1,16} \()\"(?P<function>[A-Za-z_][\w.]{0,63})[^\"]{0,80}\"\)?"
                              r"(?: at daddr 0x[0-9a-fA-F]{1,16} len \d{1,10})? error (?P<error>-?\d{1,6})")
_BUFFER_IO = re.compile(r"Buffer I/O error on dev(?:ice)? (?P<dev>[^,\s]{1,64}), logical block (?P<block>\d{1,20})")
_NVME = re.compile(r"nvme (?P<ctrl>nvme\d{1,4}): (?:I/O (?:tag )?\d{1,10} .{0,80}?QID \d{1,5} timeout, "
                   r"(?P<step>aborting|reset controller|disable controller)|(?P<down>controller is down; will reset)|"
                   r"(?P<removed>Removing after probe failure))")
# drivers/net/ethernet/mellanox/mlx5/core/en_main.c mlx5e_tx_timeout (netdev_err: driver, bus id, interface)
_MLX5E_TX_TIMEOUT = re.compile(r"mlx5_core (?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) "
                               r"(?P<dev>[^\s:]{1,64}): TX timeout detected")
# dev_watchdog prints its NETDEV WATCHDOG line (on old kernels with a WARN's stack dump) just before it calls the
# driver's ndo_tx_timeout, which prints mlx5e's line: within this many records the two are one timeout.
_WATCHDOG_TRAIL_RECORDS = 64
_MLX5 = re.compile(r"^mlx5_core (?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])")
_MLX5_HEALTH = re.compile(r"(?P<lost>health compromised)|(?P<slot>PCI slot is unavailable)|"
                          r"(?P<fatal>Fatal error \d{1,6} detected)|"
                          r"synd 0x(?P<synd>[0-9a-fA-F]{1,4}): (?P<text>[^\n]{0,80})|"
                          r"(?P<cmd>\w{1,48})\(0x(?P<op>[0-9a-fA-F]{1,4})\) timeout\. Will cause a leak")
_CRASH_TRAIL_RECORDS = 40  # a crash dump's RIP line may follow its header by a register dump and a module list

_FOLLOW_UP_RECORDS = 3  # how far a multi-line message or a stack-dump header may trail its first line


@functools.lru_cache(maxsize=1024)
def canonical_pci(address: str) -> str:
    """A bus id as sysfs spells it, `0000:3b:00.0`; "" when it is not one (redacted `...`).

    Xid lines carry domain:bus:device without the function; old drivers omit the domain.
    """
    m = _PCI.fullmatch(address.strip())
    if not m:
        return ""
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn or '0')}"


def _number(text: str | None) -> int | None:
    return int(text) if text else None


class EventParser:
    """Records in, events out, in log order; keeps what spans records.

    An SXid's `Severity ...` and `Data {...}` lines follow it as separate records, so an SXid is
    held until a record that is not one of its continuation lines arrives (or `flush()`). A GPU
    that fell off the bus is reported over three lines; a hung task's header may be followed by
    its `task:... state:D` line: both are remembered for a few records.
    """

    def __init__(self) -> None:
        self._sxid: tuple[KernelRecord, int, str, str, dict] | None = None  # record, code, device, text, detail
        self._fallen: tuple[KernelRecord, str, str | None, int] | None = None
        self._hung: tuple[int, int] | None = None  # pid, records left to see its task: line
        self._crash: tuple[KernelRecord, list[str], int] | None = None  # header record, headers, records left
        # Sequence number of the last crash reported: a batch may end inside a crash dump (the daemon
        # flushes after each read), and the rest of that dump must not become a second crash.
        self._crash_seq: int | None = None
        self._mce: tuple[KernelRecord, int, bool, int] | None = None  # old exception: record, cpu, banks seen, left
        self._watchdog: tuple[str, int] | None = None  # interface of the last NETDEV WATCHDOG, records left

    def feed(self, record: KernelRecord) -> list[KernelEvent]:
        if record.facility:  # written by a userspace process, not the kernel: it cannot fake an Xid
            return []
        if self._watchdog is not None:
            self._watchdog = (self._watchdog[0], self._watchdog[1] - 1) if self._watchdog[1] > 1 else None
        out: list[KernelEvent] = []
        message = record.message
        if self._sxid is not None and not self._sxid_continues(message):
            out.extend(self.flush())
        if "SXid" in message and self._sxid_record(record):
            return out
        event = (self._xid(record) or self._fallen_off_bus(record) or self._hung_task(record)
                 or self._lockup(record) or self._link(record))
        if event is not None:
            out.append(event)
        elif self._crash is not None or self._mce is not None or _may_be_host_fault(message):
            out.extend(self._host(record))
        return out

    def flush(self) -> list[KernelEvent]:
        """Events held for their continuation lines (an SXid, a crash's RIP line, an old machine check's banks);
        call at the end of a batch."""
        out = self._crash_event(None, None) if self._crash is not None else []
        out.extend(self._machine_check_exception())
        if self._sxid is None:
            return out
        record, code, device, text, detail = self._sxid
        self._sxid = None
        return [_event(SXID, device, record, code, text, detail)] + out

    # SXid ------------------------------------------------------------------------------------

    def _sxid_continues(self, message: str) -> bool:
        m = _SXID.search(message) if "SXid" in message else None
        if m is None or self._sxid is None or int(m.group("code")) != self._sxid[1]:
            return False
        rest = m.group("rest") or ""
        return bool(_SXID_SEVERITY.match(rest) or _SXID_DATA.match(rest))

    def _sxid_record(self, record: KernelRecord) -> bool:
        """Take an SXid line: hold a new SXid, or add a continuation line to the one held."""
        m = _SXID.search(record.message)
        if m is None:
            return False
        code = int(m.group("code"))
        rest = (m.group("rest") or "").strip()
        severity = _SXID_SEVERITY.match(rest)
        data = _SXID_DATA.match(rest)
        if severity or data:
            if self._sxid is None or self._sxid[1] != code:
                # Its headline is not in the log (the log starts mid-message, the ring lost it, or it
                # came in an earlier batch): still an SXid of this code, its Fatal/Non-fatal word unknown,
                # so the catalog rates it (a fatal 20034 must not vanish with its first line).
                self._sxid = (record, code, canonical_pci(m.group("addr")), "(its first line is not in the log)",
                              {"fatal": None, "link": None, "nvswitch": m.group("switch")})
            detail = self._sxid[4]
            if severity:
                detail["severity"], detail["engine_instance"], detail["sub_engine_instance"] = (
                    int(g) for g in severity.groups())
            else:
                detail["data"] = " ".join(data.group("words").replace(",", " ").split())
            return True
        head = _SXID_HEAD.match(rest)
        fatal: bool | None = None
        link: int | None = None
        text = rest
        if head:
            fatal = head.group("sev").lower() == "fatal"
            link = _number(head.group("link"))
            text = head.group("text").strip()
        detail = {"fatal": fatal, "link": link, "nvswitch": m.group("switch")}
        self._sxid = (record, code, canonical_pci(m.group("addr")), text, detail)
        return True

    # GPU -------------------------------------------------------------------------------------

    def _xid(self, record: KernelRecord) -> KernelEvent | None:
        if "Xid" not in record.message:
            return None
        m = _XID.search(record.message)
        if m is None:
            return None
        rest = (m.group("rest") or "").strip()
        pid: int | None = None
        name: str | None = None
        pm = _PID.match(rest)
        if pm:
            pid = _number(pm.group("pid"))
            rest = rest[pm.end():]
        nm = _NAME.match(rest)
        if nm:
            name = nm.group("name").strip()
            name = None if name in ("", "<unknown>") else name
            rest = rest[nm.end():]
        detail: dict[str, object] = {"pid": pid, "name": name}
        if m.group("gi") is not None:
            detail["gpu_instance"] = int(m.group("gi"))
        return _event(XID, canonical_pci(m.group("addr")), record, int(m.group("code")), rest.strip(), detail)

    def _fallen_off_bus(self, record: KernelRecord) -> KernelEvent | None:
        message = record.message
        if "NVRM" not in message and self._fallen is None:
            return None
        one = _FALLEN_ONE_LINE.search(message) if "fallen off the bus" in message else None
        if one:
            self._fallen = None
            return _event(GPU_FALLEN_OFF_BUS, canonical_pci(one.group("addr")), record, None,
                          "GPU has fallen off the bus", {})
        start = _FALLEN_START.search(message)
        if start:
            self._fallen = (record, canonical_pci(start.group("addr")), None, _FOLLOW_UP_RECORDS)
        if self._fallen is None:
            return None
        first, device, pci_id, left = self._fallen
        pm = _PCI_ID.search(message)
        if pm:
            pci_id = pm.group("id").lower()
        tail = _FALLEN_TEXT.search(message)
        if tail:
            self._fallen = None
            return _event(GPU_FALLEN_OFF_BUS, device, first, None, tail.group(0).strip(), {"pci_id": pci_id})
        self._fallen = (first, device, pci_id, left - 1) if left > 1 else None
        return None

    # Kernel ----------------------------------------------------------------------------------

    def _hung_task(self, record: KernelRecord) -> KernelEvent | None:
        message = record.message
        if "blocked for more than" in message:
            m = _HUNG.search(message)
            if m:
                pid = int(m.group("pid"))
                self._hung = (pid, _FOLLOW_UP_RECORDS + 1)
                return _event(HUNG_TASK, m.group("comm"), record, None, message.strip(),
                              {"pid": pid, "seconds": int(m.group("seconds"))})
        expected = self._hung
        if expected is not None:
            self._hung = (expected[0], expected[1] - 1) if expected[1] > 1 else None
        if message.startswith("task:"):
            m = _TASK_STATE_D.match(message)
            if m:
                pid = int(m.group("pid"))
                if expected is not None and expected[0] == pid:
                    self._hung = None
                    return None  # the stack dump of the hung task just reported
                return _event(HUNG_TASK, m.group("comm"), record, None, message.strip(),
                              {"pid": pid, "seconds": None})
        return None

    def _lockup(self, record: KernelRecord) -> KernelEvent | None:
        message = record.message
        if "soft lockup" in message:
            m = _SOFT.search(message)
            if m:
                return _event(SOFT_LOCKUP, f"cpu{int(m.group('cpu'))}", record, None, message[m.start():].strip(),
                              {"seconds": int(m.group("seconds")), "comm": m.group("comm"),
                               "pid": _number(m.group("pid"))})
        if "hard LOCKUP" in message:
            m = _HARD.search(message)
            if m:
                return _event(HARD_LOCKUP, f"cpu{int(m.group('cpu'))}", record, None, message[m.start():].strip(), {})
        return None

    # Network ---------------------------------------------------------------------------------

    def _link(self, record: KernelRecord) -> KernelEvent | None:
        message = record.message
        if "Link" not in message or not message.startswith("mlx"):
            return None
        m = _MLX_LINK.match(message) or _MLX4_LINK.match(message)
        if m is None:
            return None
        kind = _LINK_STATES.get(m.group("state").lower())
        if kind is None:
            return None  # INIT, ARMED: a port on its way up
        groups = m.groupdict()
        pci = canonical_pci(groups.get("pci") or "")
        detail: dict[str, object] = {"pci_bus_id": pci or None, "port": _number(groups.get("port")),
                                     "state": m.group("state")}
        return _event(kind, m.group("name") or pci, record, None, message.strip(), detail)


    # Host hardware and kernel -----------------------------------------------------------------

    def _host(self, record: KernelRecord) -> list[KernelEvent]:
        message = record.message
        out: list[KernelEvent] = []
        if self._crash is not None:
            rip = _RIP.search(message) if "RIP:" in message else None
            if rip:
                return self._crash_event(rip.group("fn"), rip.group("module"))
            first, headers, left = self._crash
            hardware = "hardware error" in message or any(h in message for h in _MCE_HINTS)  # a hardware panic
            crash = _CRASH.search(message) if not hardware else None
            if crash and len(headers) < 4:
                headers.append(crash.group("head").strip())  # the same crash's next header (Oops after BUG)
                return []
            if left <= 1:
                out = self._crash_event(None, None)
            else:
                self._crash = (first, headers, left - 1)
        if self._mce is not None:
            events, taken = self._held_machine_check(record, message)
            out.extend(events)
            if taken:
                return out
        if not _may_be_host_fault(message):
            return out
        event = self._host_event(record, message)
        return out + [event] if event is not None else out

    def _held_machine_check(self, record: KernelRecord, message: str) -> tuple[list[KernelEvent], bool]:
        """An old machine check exception is held for its bank lines (events of its CPU, with their status) and
        its panic (one fatal event of that CPU); (events, whether this record was one of those)."""
        first, cpu, banks, left = self._mce
        bank = _MCE_BANK.match(message)
        if bank:
            self._mce = (first, cpu, True, _MCE_TRAIL_RECORDS)
            return [_machine_check(record, cpu, int(bank.group("bank")), bank.group("status"), message)], True
        panic = _MCE_PANIC.search(message) if "panic" in message else None
        if panic:
            self._mce = None
            return [_event(MCE, f"cpu{cpu}", record, None, message[panic.start():].strip(),
                           {"uc": True, "pcc": True, "panic": True})], True
        if left <= 1 or _MCE_EXCEPTION.match(message):
            return self._machine_check_exception(), False
        self._mce = (first, cpu, banks, left - 1)
        return [], False

    def _machine_check_exception(self) -> list[KernelEvent]:
        """The held exception, when no bank line said more: an exception is raised for uncorrected errors only."""
        held, self._mce = self._mce, None
        if held is None or held[2]:
            return []
        first, cpu, _, _ = held
        return [_event(MCE, f"cpu{cpu}", first, None, first.message.strip(), {"uc": True, "exception": True})]

    def _crash_event(self, function: str | None, module: str | None) -> list[KernelEvent]:
        first, headers, _ = self._crash
        self._crash = None
        self._crash_seq = first.seq
        return [_event(KERNEL_CRASH, module or "kernel", first, None, headers[0],
                       {"headers": headers, "function": function, "module": module,
                        "panic": any(h.startswith("Kernel panic") for h in headers)})]

    def _host_event(self, record: KernelRecord, message: str) -> KernelEvent | None:
        """One record of a host hardware or kernel fault, or None; the cheap hint already matched."""
        if any(h in message for h in _MCE_HINTS):
            m = _CPER.search(message)
            if m:
                return _event(CPER, "apei", record, None, message[m.start():].strip(),
                              {"severity": m.group("severity"), "record": int(m.group("record"))})
            m = _MCE.search(message)
            if m:
                return _machine_check(record, int(m.group("cpu")), int(m.group("bank")), m.group("status"),
                                      message[m.start():])
            m = _MCE_EXCEPTION.match(message)
            if m:
                self._mce = (record, int(m.group("cpu")), False, _MCE_TRAIL_RECORDS)
                return None
            if "Machine check events logged" in message:
                return _event(MCE, "cpu", record, None, "Machine check events logged", {"logged": True})
            m = _MCE_AMD.search(message)
            if m:
                what = m.group("what")
                return _event(MCE, "cpu", record, None, what, {"uc": not what.endswith("no action required"),
                                                               "pcc": what.startswith("System Fatal")})
            m = _MCE_PANIC.search(message)
            if m:
                return _event(MCE, "cpu", record, None, message[m.start():].strip(),
                              {"uc": True, "pcc": True, "panic": True})
        if "Kernel panic" in message or "GHES" in message:
            m = _GHES_FATAL.search(message)
            if m:
                return _event(CPER, "apei", record, None, m.group(0), {"severity": "fatal"})
        if "EDAC MC" in message:
            m = _EDAC.search(message)
            if m:
                # One DIMM is the unit that fails and is replaced: events group by controller and label.
                return _event(EDAC_ERROR, f"{m.group('mc').lower()}/{m.group('label')}", record, None,
                              message[m.start():].strip(),
                              {"count": int(m.group("count")), "type": m.group("type"), "label": m.group("label"),
                               "controller": m.group("mc").lower()})
            return None
        if "recovery action" in message:  # "Memory failure: 0x..: ..." (old kernels: "MCE 0x..: ...")
            m = _MEMORY_FAILURE.search(message)
            if m:
                return _event(MEMORY_FAILURE, "memory", record, None, message[m.start():].strip(),
                              {"result": m.group("result"), "page": m.group("what").strip(),
                               "pfn": m.group("pfn").lower()})
        if "above threshold" in message:
            m = _THROTTLE.search(message)
            if m:
                return _event(CPU_THROTTLE, "cpu", record, None, message[m.start():].strip(),
                              {"cpu": m.group("cpu").lower(), "scope": m.group("scope").lower(),
                               "total": int(m.group("total"))})
        if "stall" in message:
            m = _RCU.search(message)
            if m:
                return _event(RCU_STALL, m.group("flavor"), record, None, message[m.start():].strip(),
                              {"self_detected": m.group("what").startswith("self")})
        if "unregister_netdevice" in message:
            m = _UNREGISTER.search(message)
            if m:
                return _event(NETDEV_UNREGISTER, m.group("dev"), record, None, message[m.start():].strip(),
                              {"usage_count": int(m.group("count"))})
        if "NETDEV WATCHDOG" in message:
            m = _WATCHDOG_NEW.search(message) or _WATCHDOG_OLD.search(message)
            if m:
                groups = m.groupdict()
                bus = canonical_pci(groups.get("bus") or "")
                self._watchdog = (m.group("dev"), _WATCHDOG_TRAIL_RECORDS)
                return _event(NETDEV_WATCHDOG, m.group("dev"), record, None, message.strip(),
                              {"driver": m.group("driver"), "queue": _number(m.group("queue")),
                               "pci_bus_id": bus or None})
        if "TX timeout detected" in message:
            m = _MLX5E_TX_TIMEOUT.match(message)
            if m and self._watchdog is not None and self._watchdog[0] == m.group("dev"):
                self._watchdog = None
                return None  # the driver's line of the timeout the watchdog just reported
            if m:
                return _event(NETDEV_WATCHDOG, m.group("dev"), record, None, message.strip(),
                              {"driver": "mlx5_core", "queue": None, "pci_bus_id": canonical_pci(m.group("pci")),
                               "reported_by": "mlx5e"})
        if "EXT4-fs" in message:
            m = _EXT4_LOST_WRITE.search(message) if "ext4_end_bio" in message else None
            if m:
                return _event(FS_ERROR, m.group("dev"), record, None, message[m.start():].strip(),
                              {"fs": "ext4", "lost_write": True, "inode": int(m.group("inode")),
                               "error": int(m.group("error"))})
            m = _EXT4_RO.search(message)
            if m:
                return _event(FS_READONLY, m.group("dev"), record, None, message[m.start():].strip(), {"fs": "ext4"})
            m = _EXT4_ERROR.search(message)
            if m:
                return _event(FS_ERROR, m.group("dev"), record, None, message[m.start():].strip(), {"fs": "ext4"})
        if "XFS (" in message:
            m = _XFS_SHUTDOWN.search(message)
            if m:
                return _event(FS_ERROR, m.group("dev"), record, None, message[m.start():].strip(),
                              {"fs": "xfs", "shutdown": True})
            m = _XFS_METADATA_IO.search(message) if "metadata I/O error" in message else None
            if m:
                return _event(FS_ERROR, m.group("dev"), record, None, message[m.start():].strip(),
                              {"fs": "xfs", "metadata_io": True, "function": m.group("function"),
                               "error": int(m.group("error"))})
        if "Buffer I/O error" in message:
            m = _BUFFER_IO.search(message)
            if m:
                return _event(IO_ERROR, m.group("dev"), record, None, message[m.start():].strip(),
                              {"block": int(m.group("block"))})
        if " error, dev " in message:
            m = _BLOCK_ERROR.search(message)
            if m:
                return self._block_error(record, message, m)
        if "nvme" in message:
            m = _NVME.search(message)
            if m:
                step = ("removed" if m.group("removed") else "down" if m.group("down")
                        else {"aborting": "abort", "reset controller": "reset",
                              "disable controller": "disable"}[m.group("step")])
                return _event(NVME_ERROR, m.group("ctrl"), record, None, message[m.start():].strip(), {"step": step})
        if message.startswith("mlx5_core"):
            return self._mlx5(record, message)
        if "BUG" in message or "Oops" in message or "[#" in message or "panic" in message:
            m = _CRASH.search(message)
            if m and not (record.seq is not None and self._crash_seq is not None
                          and 0 < record.seq - self._crash_seq <= _CRASH_TRAIL_RECORDS):
                self._crash = (record, [m.group("head").strip()], _CRASH_TRAIL_RECORDS)
        return None

    def _block_error(self, record: KernelRecord, message: str, m: re.Match) -> KernelEvent:
        op = m.group("op")
        if op is None and m.group("flags"):
            op = _REQ_OPS.get(int(m.group("flags"), 16) & 0xFF)
        return _event(IO_ERROR, m.group("dev"), record, None, message.strip(),
                      {"layer": "block", "status": m.group("status"), "op": op, "sector": int(m.group("sector"))})

    def _mlx5(self, record: KernelRecord, message: str) -> KernelEvent | None:
        device = _MLX5.match(message)
        m = _MLX5_HEALTH.search(message) if device else None
        if m is None:
            return None
        if m.group("lost"):
            problem, detail = "health_lost", {}
        elif m.group("slot"):
            problem, detail = "pci_slot_unavailable", {}
        elif m.group("fatal"):
            problem, detail = "fatal_error", {}
        elif m.group("synd"):
            problem = "syndrome"
            detail = {"syndrome": int(m.group("synd"), 16), "syndrome_text": m.group("text").strip()}
        else:
            problem, detail = "command_timeout", {"command": m.group("cmd"), "opcode": int(m.group("op"), 16)}
        return _event(MLX5_HEALTH, canonical_pci(device.group("pci")), record, None, message[device.end():].strip(": "),
                      dict(detail, problem=problem))


def _machine_check(record: KernelRecord, cpu: int, bank: int, status_hex: str, text: str) -> KernelEvent:
    """One bank's machine check record; MCi_STATUS bits 61 (UC), 57 (PCC) and 62 (overflow) rate it."""
    status = int(status_hex, 16)
    return _event(MCE, f"cpu{cpu}", record, None, text.strip(),
                  {"bank": bank, "status": status_hex.lower(), "uc": bool(status >> 61 & 1),
                   "pcc": bool(status >> 57 & 1), "overflow": bool(status >> 62 & 1)})


def _event(kind: str, device: str, record: KernelRecord, code: int | None, text: str,
           detail: dict[str, object]) -> KernelEvent:
    return KernelEvent(kind=kind, device=device, code=code, text=text, seq=record.seq,
                       monotonic_us=record.monotonic_us, wall_time=record.wall_time, detail=detail)


def events_from_records(records: Iterable[KernelRecord]) -> Iterator[KernelEvent]:
    """Classify records into events, in log order."""
    parser = EventParser()
    for record in records:
        yield from parser.feed(record)
    yield from parser.flush()
