"""Typed kernel-log events: the facts the kernel-log collector hands to checks.

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

KINDS = (XID, SXID, GPU_FALLEN_OFF_BUS, HUNG_TASK, SOFT_LOCKUP, HARD_LOCKUP, LINK_DOWN, LINK_UP)


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

    def feed(self, record: KernelRecord) -> list[KernelEvent]:
        if record.facility:  # written by a userspace process, not the kernel: it cannot fake an Xid
            return []
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
        return out

    def flush(self) -> list[KernelEvent]:
        """The SXid held for its continuation lines, if any (call at the end of a batch)."""
        if self._sxid is None:
            return []
        record, code, device, text, detail = self._sxid
        self._sxid = None
        return [_event(SXID, device, record, code, text, detail)]

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
