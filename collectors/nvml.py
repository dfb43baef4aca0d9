"""NVIDIA GPUs through NVML: identity, MIG devices, ECC, retired pages, row remapping, NVLink, PCIe, clocks.

Long on purpose: the only pynvml importer: every NVML query, its isolation per GPU and the facts
they make sit behind the one narrow backend interface.

The only module that imports pynvml (nvidia-ml-py), and only when a live host has NVIDIA GPUs.
Everything talks to one narrow backend: `call(fn, *args)` with an NVML function name and the GPU
index, and `fields(index, pairs)` for many nvmlDeviceGetFieldValues fields in one call (the per-link
facts, as DCGM reads them); NvmlBackend is the driver, fake_nvml.FakeNvmlBackend a fixture
machine's nvml.json.

Every call is isolated: NotSupported is an absent fact (None); FunctionNotFound (an older driver
without a newer symbol) is absent too, and named once; GpuIsLost marks the GPU lost; Timeout,
Unknown and the rest make that fact group unknown. NVML can block on a wedged GPU, so each GPU is
read in its own thread under a deadline: a GPU that does not answer is unknown, and is not asked
again while its thread is still stuck.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nodehealth.collectors import CollectError
from nodehealth.collectors.fake_nvml import FakeNvmlBackend, scenario_path
from nodehealth.collectors.gpu_facts import (
    ARCHITECTURES,
    CLOCK_REASON_NAMES,
    NVML_ERRORS,
    Clocks,
    EccCounts,
    Gpu,
    MigDevice,
    NvLink,
    NvmlError,
    NvmlFacts,
    Pcie,
    RemappedRows,
    RetiredPages,
    rate_key,
)
from nodehealth.host import HostPaths, list_dir, read_attr
from nodehealth.model import Metric

NAME = "nvml"
DEFAULTS: dict = {
    # A GPU whose NVML calls have not all answered after this long is reported unknown.
    "gpu_timeout_seconds": 5.0,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "gpu_timeout_seconds": ("a GPU whose NVML calls have not all answered after this long is `unknown` and is not "
                            "asked again while its call is stuck; must be below `daemon.collector_timeout_seconds`"),
}

NVIDIA_VENDOR = "0x10de"
BACKEND_ENV = "NODEHEALTH_NVML_BACKEND"
# Field ids (nvmlDeviceGetFieldValues).
FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_SPEED_MBPS = 164
FI_NVLINK_TX_KIB = 138
FI_NVLINK_RX_KIB = 139
FI_SW_THERMAL_NS = 269
FI_HW_THERMAL_NS = 270
FI_HW_POWER_BRAKE_NS = 271
FI_NVLINK_STATE = 165
FI_NVLINK_VERSION = 166
NVLINK_STATE_ACTIVE = 1  # the call's NVML_FEATURE_ENABLED and the field's NVML_NVLINK_STATE_ACTIVE (not sleep)
# Per-link error counter fields (links 0-11 only; NVML has no such field for links 12-17, which are
# read with nvmlDeviceGetNvLinkErrorCounter): the first id of links 0-5 and of links 6-11 per counter.
FI_NVLINK_ERRORS = {"crc_flit": (32, 96), "crc_data": (39, 102), "replay": (46, 108), "recovery": (53, 114)}
MAX_NVLINKS = 36  # NVML_NVLINK_MAX_LINKS (13.x); more links than this is a garbled answer
PROBED_NVLINKS = 18  # probed when the driver cannot say how many links there are (pre field 91)
MAX_GPUS = 64  # more GPUs than this in one node is a garbled answer, not a fact
MAX_MIG_DEVICES = 8  # a GPU splits into at most 7 MIG devices (NVIDIA's MIG user guide); more is garbled
NVLINK_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))
FABRIC_STATES = {0: None, 1: "not_started", 2: "in_progress", 3: "completed"}

ABSENT = {NVML_ERRORS[n] for n in ("NotSupported", "InvalidArgument", "NotFound", "FunctionNotFound")}
DRIVER_GONE = ("Uninitialized", "DriverNotLoaded", "LibRmVersionMismatch", "LibraryNotFound")


class GpuLost(Exception):
    """NVML answered GpuIsLost: stop asking this GPU anything this pass."""


# --- backends ----------------------------------------------------------------------------------

def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _pci(info: Any) -> dict[str, Any]:
    return {"busId": _text(info.busId), "pciDeviceId": int(info.pciDeviceId)}


class NvmlBackend:
    """The driver, through pynvml. Results become plain values (the same shapes as a scenario)."""

    name = "nvml"

    def __init__(self) -> None:
        import pynvml  # the only import of pynvml, paid for only on hosts with NVIDIA GPUs

        self.nvml = pynvml
        self._handles: dict[int, Any] = {}
        self._events: Any = None
        self._adapt: dict[str, Callable[..., Any]] = {
            "nvmlDeviceGetPciInfo": lambda h: _pci(pynvml.nvmlDeviceGetPciInfo(h)),
            "nvmlDeviceGetNvLinkRemotePciInfo": lambda h, link: _pci(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link)),
            "nvmlDeviceGetUtilizationRates": self._utilization,
            "nvmlDeviceGetGpuFabricInfo": self._fabric,
            "nvmlDeviceGetFieldValues": self._field,
            "nvmlDeviceGetMigDeviceHandleByIndex": self._mig_device,
        }

    def init(self) -> None:
        self._guard(self.nvml.nvmlInit)

    def shutdown(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass
        self._handles.clear()
        self._events = None

    def call(self, fn: str, *args: Any) -> Any:
        if fn.startswith("nvmlDevice") and fn != "nvmlDeviceGetCount":
            args = (self._handle(args[0]), *args[1:])
        func = self._adapt.get(fn) or getattr(self.nvml, fn, None)
        if func is None:  # bindings older than the function
            raise NvmlError.named("FunctionNotFound")
        result = self._guard(func, *args)
        if isinstance(result, (tuple, list)):
            return [_text(v) for v in result]
        return _text(result)

    def wait_events(self, timeout: float) -> list[dict[str, Any]]:
        """Xid and ECC events, waiting up to `timeout` seconds (nvmlEventSetWait)."""
        nvml = self.nvml
        if self._events is None:
            self._events = self._guard(nvml.nvmlEventSetCreate)
            mask = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
            for index in range(self._guard(nvml.nvmlDeviceGetCount)):
                try:
                    self._guard(nvml.nvmlDeviceRegisterEvents, self._handle(index), mask, self._events)
                except NvmlError:
                    continue  # a GPU without event support still leaves the others
        try:
            data = self._guard(nvml.nvmlEventSetWait, self._events, int(timeout * 1000))
        except NvmlError as e:
            if e.name == "Timeout":
                return []
            raise
        kind = "xid" if data.eventType == nvml.nvmlEventTypeXidCriticalError else "dbe"
        index = self._guard(nvml.nvmlDeviceGetIndex, data.device)
        return [{"gpu": index, "kind": kind, "data": int(data.eventData)}]

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._handles[index] = self._guard(self.nvml.nvmlDeviceGetHandleByIndex, index)
        return handle

    def _guard(self, func: Callable[..., Any], *args: Any) -> Any:
        try:
            return func(*args)
        except self.nvml.NVMLError as e:
            raise NvmlError(int(e.value)) from None

    def _utilization(self, h: Any) -> dict[str, int]:
        u = self.nvml.nvmlDeviceGetUtilizationRates(h)
        return {"gpu": int(u.gpu), "memory": int(u.memory)}

    def _mig_device(self, h: Any, index: int) -> dict[str, Any]:
        """A MIG device as the scenario shapes it: its UUID, and its GPU instance id where NVML gives it."""
        mig = self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, index)
        out: dict[str, Any] = {"uuid": _text(self.nvml.nvmlDeviceGetUUID(mig))}
        try:
            out["gpuInstanceId"] = int(self.nvml.nvmlDeviceGetGpuInstanceId(mig))
        except self.nvml.NVMLError:
            pass  # the device stands without it: a pod holding it is still placed on its GPU
        return out

    def _fabric(self, h: Any) -> dict[str, int]:
        info = self.nvml.c_nvmlGpuFabricInfo_t()
        self.nvml.nvmlDeviceGetGpuFabricInfo(h, self.nvml.byref(info))
        return {"state": int(info.state), "status": int(info.status)}

    def _field(self, h: Any, field: int, scope: int) -> float:
        answer = _field_value(self.nvml.nvmlDeviceGetFieldValues(h, [(field, scope)])[0])
        if isinstance(answer, NvmlError):
            raise answer
        return answer

    def fields(self, index: int, wanted: list[tuple[int, int]]) -> list[Any]:
        """Many (field id, scope) pairs in one nvmlDeviceGetFieldValues call, as DCGM reads them; each
        answer is its value or its own NvmlError."""
        values = self._guard(self.nvml.nvmlDeviceGetFieldValues, self._handle(index), list(wanted))
        return [_field_value(v) for v in values]


VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # by nvmlValueType_t


def _field_value(value: Any) -> Any:
    if value.nvmlReturn != 0:
        return NvmlError(int(value.nvmlReturn))
    kind = value.valueType
    return getattr(value.value, VALUE_MEMBERS[kind] if 0 <= kind < len(VALUE_MEMBERS) else "ullVal")


_lock = threading.Lock()
_backend: Any = None
_backend_key: str | None = None
_stuck: dict[int, threading.Thread] = {}


def backend_for(host: HostPaths) -> Any:
    """The backend of this host, started once; a failed start is tried again next time (the
    driver may come back after a reload)."""
    global _backend, _backend_key
    key = scenario_path(host.root) if os.path.exists(scenario_path(host.root)) else "driver"
    if os.environ.get(BACKEND_ENV) == "driver":
        key = "driver"  # the real pynvml even on a fixture machine: tests run it on a fake libnvidia-ml
    with _lock:
        if _backend is not None and _backend_key == key:
            return _backend
        backend = FakeNvmlBackend(key) if key != "driver" else NvmlBackend()
        backend.init()
        _backend, _backend_key = backend, key
        _stuck.clear()
        _known.clear()
        return backend


def reset_backend() -> None:
    """Forget the started backend (the daemon calls this when NVML says the driver went away)."""
    global _backend, _backend_key
    with _lock:
        if _backend is not None:
            _backend.shutdown()
        _backend, _backend_key = None, None


def sysfs_gpus(host: HostPaths) -> list[str]:
    """PCI addresses of NVIDIA display/3D controllers in sysfs."""
    root = host.sys("bus", "pci", "devices")
    out = []
    for address in list_dir(root):
        if read_attr(os.path.join(root, address, "vendor")) != NVIDIA_VENDOR:
            continue
        cls = read_attr(os.path.join(root, address, "class")) or ""
        if cls.startswith("0x0300") or cls.startswith("0x0302"):
            out.append(address)
    return out


def supported(host: HostPaths, cfg: dict) -> str | None:
    if os.path.exists(scenario_path(host.root)):
        return None
    if not host.is_live:
        return "no NVIDIA GPUs (no nvml.json in this machine)"
    if host.sysfs_missing():
        return None  # the GPUs cannot be counted in sysfs: ask NVML (unknown if it cannot answer)
    if not sysfs_gpus(host):
        return "no NVIDIA GPUs in /sys/bus/pci/devices"
    return None


# --- reading the GPUs -----------------------------------------------------------------------------

def canonical_bus_id(bus_id: Any) -> str | None:
    """NVML's 00000000:19:00.0 as sysfs writes it: 0000:19:00.0 (joins the kernel log and sysfs)."""
    if not isinstance(bus_id, str) or bus_id.count(":") != 2:
        return None
    domain, bus, rest = bus_id.split(":")
    return f"{domain[-4:].rjust(4, '0')}:{bus}:{rest}".lower()


class _Reader:
    """One GPU's calls: absent facts become None, trouble is recorded by fact group."""

    def __init__(self, backend: Any, index: int, missing: set[str]):
        self.backend = backend
        self.index = index
        self.missing = missing
        self.unknown: dict[str, str] = {}
        self.reset_required = False

    def ask(self, group: str, fn: str, *args: Any) -> Any:
        try:
            return self.backend.call(fn, self.index, *args)
        except NvmlError as e:
            return self._judge(group, fn, e)
        except Exception as e:  # a broken scenario or binding: this group is unknown, nothing more
            self.unknown.setdefault(group, f"{type(e).__name__}: {e}")
            return None

    def _judge(self, group: str, fn: str, e: NvmlError) -> None:
        if e.name == "GpuIsLost":
            raise GpuLost() from None
        if e.name == "FunctionNotFound":
            self.missing.add(fn)
        elif e.name == "ResetRequired":
            self.reset_required = True
            self.unknown.setdefault(group, e.name)
        elif e.code not in ABSENT:
            self.unknown.setdefault(group, e.name)

    def fields(self, wanted: list[tuple[str, int, int]]) -> dict[tuple[int, int], Any]:
        """(group, field id, scope) triples in one call; each answer a value or an NvmlError, judged
        later by `field` (an answer the caller replaces with another call is not judged at all)."""
        fn = "nvmlDeviceGetFieldValues"
        try:
            answers = self.backend.fields(self.index, [(f, scope) for _, f, scope in wanted])
        except NvmlError as e:
            if e.name == "GpuIsLost":
                raise GpuLost() from None
            answers = [e] * len(wanted)
        except Exception as e:
            for group, _, _ in wanted:
                self.unknown.setdefault(group, f"{type(e).__name__}: {e}")
            return {}
        if not isinstance(answers, list) or len(answers) != len(wanted):
            for group, _, _ in wanted:
                self.unknown.setdefault(group, f"{fn} answered {len(answers) if isinstance(answers, list) else 0} "
                                        f"of {len(wanted)} fields")
            return {}
        return {(f, scope): a for (_, f, scope), a in zip(wanted, answers)}

    def field(self, answers: dict[tuple[int, int], Any], field: int, scope: int, group: str) -> Any:
        """A number from a batch; an error is judged as if the field had been its own call."""
        answer = answers.get((field, scope))
        if isinstance(answer, NvmlError):
            return self._judge(group, "nvmlDeviceGetFieldValues", answer)
        return answer if isinstance(answer, (int, float)) and not isinstance(answer, bool) else None

    def field_or_call(self, answers: dict[tuple[int, int], Any], field: int, scope: int, group: str, fn: str,
                      *args: Any) -> Any:
        """A batched field where the driver has it, else (absent, or no answer) its own call."""
        if field is not None and (field, scope) in answers:
            answer = answers[(field, scope)]
            if not (isinstance(answer, NvmlError) and answer.code in ABSENT):
                return self.field(answers, field, scope, group)
        return self.number(group, fn, *args)

    def number(self, group: str, fn: str, *args: Any) -> Any:
        value = self.ask(group, fn, *args)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def pair(self, group: str, fn: str) -> tuple[bool | None, bool | None]:
        value = self.ask(group, fn)
        if isinstance(value, (list, tuple)) and len(value) == 2:
            return _flag(value[0]), _flag(value[1])
        return None, None


def _flag(value: Any) -> bool | None:
    return bool(value) if isinstance(value, (int, bool)) else None


_known: dict[int, dict[str, Any]] = {}  # identity of each GPU from its last good read


def known_bus_id(index: Any) -> str | None:
    """The bus id a GPU index had at its last good read (NVML events name the GPU by handle)."""
    return _known.get(index, {}).get("pci_bus_id") if isinstance(index, int) else None


def read_gpu(backend: Any, index: int, missing: set[str]) -> Gpu:
    """One GPU's facts. A lost GPU answers nothing, so it keeps the identity of its last good read
    (in the daemon), and its findings still name its bus id next to the kernel log's Xid 79."""
    r = _Reader(backend, index, missing)
    try:
        gpu = _read(r)
    except GpuLost:
        return Gpu(index=index, lost=True, unknown=dict(r.unknown), **_known.get(index, {}))
    _known[index] = {"uuid": gpu.uuid, "name": gpu.name, "serial": gpu.serial, "pci_bus_id": gpu.pci_bus_id,
                     "architecture": gpu.architecture, "mig_devices": gpu.mig_devices}
    return gpu


def _read(r: _Reader) -> Gpu:
    pci = r.ask("identity", "nvmlDeviceGetPciInfo")
    pci = pci if isinstance(pci, dict) else {}
    arch = r.number("identity", "nvmlDeviceGetArchitecture")
    mig, _ = r.pair("identity", "nvmlDeviceGetMigMode")
    ecc_on, ecc_pending = r.pair("ecc", "nvmlDeviceGetEccMode")
    persistence = r.number("identity", "nvmlDeviceGetPersistenceMode")
    utilization = r.ask("utilization", "nvmlDeviceGetUtilizationRates")
    utilization = utilization if isinstance(utilization, dict) else {}
    fabric = r.ask("fabric", "nvmlDeviceGetGpuFabricInfo")
    fabric = fabric if isinstance(fabric, dict) else {}
    power = r.number("power", "nvmlDeviceGetPowerUsage")
    limit = r.number("power", "nvmlDeviceGetEnforcedPowerLimit")
    device_id = pci.get("pciDeviceId")
    head = r.fields([("nvlink", FI_NVLINK_LINK_COUNT, 0), ("clocks", FI_SW_THERMAL_NS, 0),
                     ("clocks", FI_HW_THERMAL_NS, 0), ("clocks", FI_HW_POWER_BRAKE_NS, 0)])
    gpu = Gpu(
        index=r.index,
        uuid=_str(r.ask("identity", "nvmlDeviceGetUUID")),
        name=_str(r.ask("identity", "nvmlDeviceGetName")),
        serial=_str(r.ask("identity", "nvmlDeviceGetSerial")),
        pci_bus_id=canonical_bus_id(pci.get("busId")),
        pci_device_id=device_id if isinstance(device_id, int) else None,
        vbios=_str(r.ask("identity", "nvmlDeviceGetVbiosVersion")),
        architecture=ARCHITECTURES.get(arch) if arch is not None else None,
        mig_enabled=mig,
        mig_devices=_mig_devices(r) if mig else (),
        persistence_mode=None if persistence is None else bool(persistence),
        ecc_enabled=ecc_on,
        ecc_pending=ecc_pending,
        ecc=_ecc(r),
        retired_pages=_retired_pages(r, arch),
        remapped_rows=_remapped_rows(r),
        nvlinks=_nvlinks(r, head),
        pcie=_pcie(r),
        clocks=_clocks(r, head),
        temperature_c=r.number("thermal", "nvmlDeviceGetTemperature", 0),
        power_w=None if power is None else power / 1000.0,
        power_limit_w=None if limit is None else limit / 1000.0,
        utilization_gpu_percent=_num(utilization.get("gpu")),
        utilization_memory_percent=_num(utilization.get("memory")),
        fabric_state=FABRIC_STATES.get(fabric.get("state")),
        fabric_status=_fabric_status(fabric.get("status")),
        reset_required=r.reset_required,
        unknown=dict(r.unknown),
    )
    return gpu


def _mig_devices(r: _Reader) -> tuple[MigDevice, ...]:
    """The MIG devices of a GPU in MIG mode, by NVML's MIG device index; an empty slot answers NotFound."""
    count = r.number("mig", "nvmlDeviceGetMaxMigDeviceCount")
    out = []
    for index in range(min(count or 0, MAX_MIG_DEVICES)):
        device = r.ask("mig", "nvmlDeviceGetMigDeviceHandleByIndex", index)
        uuid = _str(device.get("uuid")) if isinstance(device, dict) else None
        if uuid is not None:
            gi = device.get("gpuInstanceId")
            out.append(MigDevice(uuid, gi if isinstance(gi, int) and not isinstance(gi, bool) else None))
    return tuple(out)


def _str(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _fabric_status(status: Any) -> str | None:
    if not isinstance(status, int) or isinstance(status, bool):
        return None
    return "success" if status == 0 else NvmlError(status).name


def _ecc(r: _Reader) -> EccCounts | None:
    def total(error_type: int, counter_type: int) -> Any:
        return r.number("ecc", "nvmlDeviceGetTotalEccErrors", error_type, counter_type)
    counts = EccCounts(total(0, 0), total(1, 0), total(0, 1), total(1, 1))
    return None if counts == EccCounts() else counts


def _retired_pages(r: _Reader, arch: int | None) -> RetiredPages | None:
    if arch is not None and arch >= 7:
        return None  # Ampere and later remap rows instead (some GPUs answer zeros: gpud PR #351)
    sbe = r.ask("retired_pages", "nvmlDeviceGetRetiredPages", 0)
    dbe = r.ask("retired_pages", "nvmlDeviceGetRetiredPages", 1)
    pending = r.number("retired_pages", "nvmlDeviceGetRetiredPagesPendingStatus")
    pages = RetiredPages(len(sbe) if isinstance(sbe, list) else None, len(dbe) if isinstance(dbe, list) else None,
                         None if pending is None else bool(pending))
    return None if pages == RetiredPages() else pages


def _remapped_rows(r: _Reader) -> RemappedRows | None:
    value = r.ask("remapped_rows", "nvmlDeviceGetRemappedRows")
    if not isinstance(value, (list, tuple)) or len(value) != 4 or not all(isinstance(v, int) for v in value):
        return None
    return RemappedRows(int(value[0]), int(value[1]), bool(value[2]), bool(value[3]))


def _error_field(name: str, link: int) -> int | None:
    first = FI_NVLINK_ERRORS[name]
    return first[0] + link if link < 6 else first[1] + link - 6 if link < 12 else None


def _nvlinks(r: _Reader, head: dict[tuple[int, int], Any]) -> tuple[NvLink, ...]:
    """Every link's speed, traffic, state, version and error counters in one nvmlDeviceGetFieldValues
    call (a field the driver lacks is asked with its own call); the remote end, one call per link."""
    count = r.field(head, FI_NVLINK_LINK_COUNT, 0, "nvlink")
    if count is not None and not 0 <= count <= MAX_NVLINKS:
        r.unknown.setdefault("nvlink", f"NVML reported {count} NVLink links")
        return ()
    numbers = range(int(count) if count is not None else PROBED_NVLINKS)
    wanted = [("nvlink", f, link) for link in numbers
              for f in (FI_NVLINK_STATE, FI_NVLINK_VERSION, FI_NVLINK_SPEED_MBPS, FI_NVLINK_TX_KIB, FI_NVLINK_RX_KIB)]
    wanted += [("nvlink", f, 0) for link in numbers for name, _ in NVLINK_COUNTERS
               if (f := _error_field(name, link)) is not None]
    answers = r.fields(wanted) if wanted else {}
    links = []
    for link in numbers:
        state = r.field_or_call(answers, FI_NVLINK_STATE, link, "nvlink", "nvmlDeviceGetNvLinkState", link)
        if state is None and count is None:
            break  # probing: the first link that does not exist ends the list
        remote = r.ask("nvlink", "nvmlDeviceGetNvLinkRemotePciInfo", link)
        speed = r.field(answers, FI_NVLINK_SPEED_MBPS, link, "nvlink")
        tx = r.field(answers, FI_NVLINK_TX_KIB, link, "nvlink")
        rx = r.field(answers, FI_NVLINK_RX_KIB, link, "nvlink")
        errors = {name: r.field_or_call(answers, _error_field(name, link), 0, "nvlink",
                                        "nvmlDeviceGetNvLinkErrorCounter", link, k) for name, k in NVLINK_COUNTERS}
        version = r.field_or_call(answers, FI_NVLINK_VERSION, link, "nvlink", "nvmlDeviceGetNvLinkVersion", link)
        links.append(NvLink(
            link=link, active=None if state is None else state == NVLINK_STATE_ACTIVE, version=version,
            remote_pci_bus_id=canonical_bus_id(remote.get("busId")) if isinstance(remote, dict) else None,
            speed_mbps=_num(speed), tx_bytes=None if tx is None else int(tx) * 1024,
            rx_bytes=None if rx is None else int(rx) * 1024, **errors))
    return tuple(links)


def _pcie(r: _Reader) -> Pcie | None:
    tx = r.number("pcie", "nvmlDeviceGetPcieThroughput", 0)
    rx = r.number("pcie", "nvmlDeviceGetPcieThroughput", 1)
    pcie = Pcie(
        current_gen=r.number("pcie", "nvmlDeviceGetCurrPcieLinkGeneration"),
        max_gen=r.number("pcie", "nvmlDeviceGetMaxPcieLinkGeneration"),
        current_width=r.number("pcie", "nvmlDeviceGetCurrPcieLinkWidth"),
        max_width=r.number("pcie", "nvmlDeviceGetMaxPcieLinkWidth"),
        replay=r.number("pcie", "nvmlDeviceGetPcieReplayCounter"),
        tx_bytes_per_second=None if tx is None else tx * 1000.0,
        rx_bytes_per_second=None if rx is None else rx * 1000.0,
    )
    return None if pcie == Pcie() else pcie


def _clocks(r: _Reader, head: dict[tuple[int, int], Any]) -> Clocks | None:
    reasons = r.number("clocks", "nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None and "nvmlDeviceGetCurrentClocksEventReasons" in r.missing:
        reasons = r.number("clocks", "nvmlDeviceGetCurrentClocksThrottleReasons")  # before ~R535
    clocks = Clocks(
        event_reasons=reasons,
        sw_thermal_ns=r.field(head, FI_SW_THERMAL_NS, 0, "clocks"),
        hw_thermal_ns=r.field(head, FI_HW_THERMAL_NS, 0, "clocks"),
        hw_power_brake_ns=r.field(head, FI_HW_POWER_BRAKE_NS, 0, "clocks"),
    )
    return None if clocks == Clocks() else clocks


def _read_all(backend: Any, count: int, timeout: float) -> tuple[list[Gpu], set[str]]:
    """Every GPU in its own thread under one deadline; a stuck GPU is not asked again while stuck."""
    missing: set[str] = set()
    results: dict[int, Gpu] = {}
    threads: dict[int, threading.Thread] = {}
    for index in range(count):
        stuck = _stuck.get(index)
        if stuck is not None and stuck.is_alive():
            results[index] = Gpu(index=index, unknown={"all": "NVML has not answered since an earlier pass"})
            continue
        _stuck.pop(index, None)

        def run(i: int = index) -> None:
            results[i] = read_gpu(backend, i, missing)
        thread = threading.Thread(target=run, name=f"nvml-gpu{index}", daemon=True)
        thread.start()
        threads[index] = thread
    deadline = time.monotonic() + timeout
    for index, thread in threads.items():
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            _stuck[index] = thread
            results[index] = Gpu(index=index, unknown={"all": f"NVML did not answer within {timeout:g}s"})
    return [results[i] for i in range(count)], set(missing)


def collect(host: HostPaths, cfg: dict) -> NvmlFacts:
    settings = {**DEFAULTS, **cfg}
    try:
        backend = backend_for(host)
    except NvmlError as e:
        return NvmlFacts("nvml", None, None, None, (), init_error=e.name)
    except (OSError, ValueError) as e:
        raise CollectError(f"cannot load the NVML scenario {scenario_path(host.root)}: {e}") from None
    try:
        count = backend.call("nvmlDeviceGetCount")
    except NvmlError as e:
        if e.name in DRIVER_GONE:
            reset_backend()  # start NVML afresh next pass: the driver may come back
            return NvmlFacts(backend.name, None, None, None, (), init_error=e.name)
        count = None
    count = count if isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= MAX_GPUS else None
    driver = _system(backend, "nvmlSystemGetDriverVersion")
    cuda = _system(backend, "nvmlSystemGetCudaDriverVersion")
    gpus, missing = _read_all(backend, count or 0, float(settings["gpu_timeout_seconds"]))
    gpus = _name_by_elimination(gpus, host)
    return NvmlFacts(
        backend=backend.name,
        driver_version=driver if isinstance(driver, str) else None,
        cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
        device_count=count,
        gpus=tuple(gpus),
        missing_functions=tuple(sorted(missing)),
    )


def _name_by_elimination(gpus: list[Gpu], host: HostPaths) -> list[Gpu]:
    """Give GPUs NVML cannot name (lost ones) their PCI address: NVML numbers GPUs in PCI order, so
    when exactly as many NVIDIA GPUs in sysfs are unclaimed as there are unnamed GPUs, they are
    those, in order. Their findings then join the kernel log's Xid 79 for the same address."""
    unnamed = [g.index for g in gpus if g.pci_bus_id is None]
    if not unnamed:
        return gpus
    claimed = {g.pci_bus_id for g in gpus if g.pci_bus_id}
    spare = [a for a in sysfs_gpus(host) if a not in claimed]
    if len(spare) != len(unnamed):
        return gpus
    named = dict(zip(unnamed, spare))
    for index, address in named.items():
        _known.setdefault(index, {})["pci_bus_id"] = address
    return [replace(g, pci_bus_id=named[g.index]) if g.index in named else g for g in gpus]


def _system(backend: Any, fn: str) -> Any:
    try:
        return backend.call(fn)
    except NvmlError:
        return None


# --- metrics -------------------------------------------------------------------------------------

GPU_LABELS = ("gpu", "uuid", "pci_bus_id")


def _ids(g: Gpu) -> tuple[str, str, str]:
    return (str(g.index), g.uuid or "", g.pci_bus_id or "")


def metrics(facts: NvmlFacts) -> list[Metric]:
    """nodehealth_gpu_* families; the DCGM / dcgm-exporter field each matches is in the help text
    and in README.md ("GPU metrics"), for users moving from dcgm-exporter."""
    m: dict[str, Metric] = {}

    def family(name: str, help: str, labels: tuple[str, ...] = GPU_LABELS, kind: str = "gauge") -> Metric:
        if name not in m:
            m[name] = Metric(name, help, kind, labels)
        return m[name]

    driver = family("nodehealth_gpu_driver_info", "NVIDIA driver and CUDA driver versions; always 1.",
                    ("driver_version", "cuda_driver_version"))
    if facts.driver_version:
        driver.add((facts.driver_version, facts.cuda_driver_version or ""), 1)
    family("nodehealth_gpus", "GPUs NVML reports (DCGM: the GPU entities).", ()).add((), facts.device_count)
    for g in facts.gpus:
        ids = _ids(g)
        family("nodehealth_gpu_info", "GPU identity; always 1 (dcgm-exporter labels modelName, UUID, pci_bus_id).",
               GPU_LABELS + ("name", "serial", "vbios", "architecture")).add(
            ids + (g.name or "", g.serial or "", g.vbios or "", g.architecture or ""), 1)
        family("nodehealth_gpu_lost", "1 if NVML says the GPU is lost (fell off the bus), else 0.").add(
            ids, 1 if g.lost else 0)
        unknown = family("nodehealth_gpu_facts_unknown",
                         "1 for each group of facts NVML could not produce for the GPU this pass.",
                         GPU_LABELS + ("group",))
        for group in sorted(g.unknown):
            unknown.add(ids + (group,), 1)
        _bool(family("nodehealth_gpu_ecc_enabled", "1 if ECC is enabled on the GPU (nvidia-smi ECC Mode)."),
              ids, g.ecc_enabled)
        _bool(family("nodehealth_gpu_persistence_mode", "1 if persistence mode is on."), ids, g.persistence_mode)
        _bool(family("nodehealth_gpu_mig_enabled", "1 if MIG mode is enabled."), ids, g.mig_enabled)
        if g.ecc is not None:
            ecc = family("nodehealth_gpu_ecc_errors_total",
                         "ECC errors by type and scope (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, _DBE_VOL_TOTAL, "
                         "_SBE_AGG_TOTAL, _DBE_AGG_TOTAL).", GPU_LABELS + ("type", "scope"), "counter")
            ecc.add(ids + ("corrected", "volatile"), g.ecc.volatile_corrected)
            ecc.add(ids + ("uncorrected", "volatile"), g.ecc.volatile_uncorrected)
            ecc.add(ids + ("corrected", "aggregate"), g.ecc.aggregate_corrected)
            ecc.add(ids + ("uncorrected", "aggregate"), g.ecc.aggregate_uncorrected)
        if g.retired_pages is not None:
            pages = family("nodehealth_gpu_retired_pages",
                           "Retired framebuffer pages by cause (DCGM_FI_DEV_RETIRED_SBE, _RETIRED_DBE).",
                           GPU_LABELS + ("cause",))
            pages.add(ids + ("single_bit",), g.retired_pages.single_bit)
            pages.add(ids + ("double_bit",), g.retired_pages.double_bit)
            _bool(family("nodehealth_gpu_retired_pages_pending",
                         "1 if a page retirement waits for the next driver reload (DCGM_FI_DEV_RETIRED_PENDING)."),
                  ids, g.retired_pages.pending)
        if g.remapped_rows is not None:
            rows = family("nodehealth_gpu_remapped_rows",
                          "Rows remapped by error type (DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, "
                          "_UNCORRECTABLE_REMAPPED_ROWS).", GPU_LABELS + ("type",))
            rows.add(ids + ("correctable",), g.remapped_rows.correctable)
            rows.add(ids + ("uncorrectable",), g.remapped_rows.uncorrectable)
            family("nodehealth_gpu_remapped_rows_pending",
                   "1 if a row remap waits for the next GPU reset (DCGM_FI_DEV_ROW_REMAP_PENDING).").add(
                ids, 1 if g.remapped_rows.pending else 0)
            family("nodehealth_gpu_remapped_rows_failure",
                   "1 if a row remap failed: RMA candidate (DCGM_FI_DEV_ROW_REMAP_FAILURE).").add(
                ids, 1 if g.remapped_rows.failure else 0)
        _nvlink_metrics(family, g, ids)
        _pcie_metrics(family, g, ids)
        _clock_metrics(family, g, ids)
        family("nodehealth_gpu_temperature_celsius", "GPU temperature (DCGM_FI_DEV_GPU_TEMP).").add(
            ids, g.temperature_c)
        family("nodehealth_gpu_power_watts", "Power draw (DCGM_FI_DEV_POWER_USAGE).").add(ids, g.power_w)
        family("nodehealth_gpu_power_limit_watts", "Enforced power limit (DCGM_FI_DEV_ENFORCED_POWER_LIMIT).").add(
            ids, g.power_limit_w)
        util = family("nodehealth_gpu_utilization_ratio",
                      "GPU and memory utilization, 0-1 (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_MEM_COPY_UTIL).",
                      GPU_LABELS + ("resource",))
        util.add(ids + ("gpu",), None if g.utilization_gpu_percent is None else g.utilization_gpu_percent / 100)
        util.add(ids + ("memory",), None if g.utilization_memory_percent is None else
                 g.utilization_memory_percent / 100)
        if g.fabric_state is not None:
            state = {"not_started": 1, "in_progress": 2, "completed": 3}[g.fabric_state]
            family("nodehealth_gpu_fabric_state", "NVSwitch fabric state: 1 not started, 2 in progress, "
                   "3 completed (DCGM_FI_DEV_FABRIC_MANAGER_STATUS).").add(ids, state)
    return list(m.values())


def _bool(metric: Metric, ids: tuple[str, ...], value: bool | None) -> None:
    metric.add(ids, None if value is None else (1 if value else 0))


def _nvlink_metrics(family: Callable[..., Metric], g: Gpu, ids: tuple[str, ...]) -> None:
    if not g.nvlinks:
        return
    labels = GPU_LABELS + ("link",)
    active = family("nodehealth_gpu_nvlink_active", "1 if the NVLink link is up (nvidia-smi nvlink -s).", labels)
    speed = family("nodehealth_gpu_nvlink_speed_bytes_per_second", "NVLink link speed (NVML field 164).", labels)
    errors = family("nodehealth_gpu_nvlink_errors_total",
                    "NVLink errors by type (DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, _CRC_DATA_, _REPLAY_, "
                    "_RECOVERY_ERROR_COUNT_TOTAL).", labels + ("type",), "counter")
    tx = family("nodehealth_gpu_nvlink_transmitted_bytes_total", "NVLink data transmitted (NVML field 138).",
                labels, "counter")
    rx = family("nodehealth_gpu_nvlink_received_bytes_total", "NVLink data received (NVML field 139).",
                labels, "counter")
    for link in g.nvlinks:
        lids = ids + (str(link.link),)
        _bool(active, lids, link.active)
        speed.add(lids, None if link.speed_mbps is None else link.speed_mbps * 1e6)
        for name in ("crc_flit", "crc_data", "replay", "recovery"):
            errors.add(lids + (name,), getattr(link, name))
        tx.add(lids, link.tx_bytes)
        rx.add(lids, link.rx_bytes)


def _pcie_metrics(family: Callable[..., Metric], g: Gpu, ids: tuple[str, ...]) -> None:
    p = g.pcie
    if p is None:
        return
    labels = GPU_LABELS + ("bound",)
    gen = family("nodehealth_gpu_pcie_link_generation",
                 "PCIe link generation, current and max (DCGM_FI_DEV_PCIE_LINK_GEN, _MAX_LINK_GEN).", labels)
    gen.add(ids + ("current",), p.current_gen)
    gen.add(ids + ("max",), p.max_gen)
    width = family("nodehealth_gpu_pcie_link_width_lanes",
                   "PCIe link width, current and max (DCGM_FI_DEV_PCIE_LINK_WIDTH, _MAX_LINK_WIDTH).", labels)
    width.add(ids + ("current",), p.current_width)
    width.add(ids + ("max",), p.max_width)
    family("nodehealth_gpu_pcie_replays_total", "PCIe replays (DCGM_FI_DEV_PCIE_REPLAY_COUNTER).",
           kind="counter").add(ids, p.replay)
    family("nodehealth_gpu_pcie_transmit_bytes_per_second", "PCIe TX throughput (NVML, 20 ms sample).").add(
        ids, p.tx_bytes_per_second)
    family("nodehealth_gpu_pcie_receive_bytes_per_second", "PCIe RX throughput (NVML, 20 ms sample).").add(
        ids, p.rx_bytes_per_second)


def _clock_metrics(family: Callable[..., Metric], g: Gpu, ids: tuple[str, ...]) -> None:
    c = g.clocks
    if c is None:
        return
    if c.event_reasons is not None:
        active = family("nodehealth_gpu_clocks_event_active",
                        "1 for each clock event (throttle) reason now active (DCGM_FI_DEV_CLOCKS_EVENT_REASONS; "
                        "dcgm-exporter DCGM_EXP_CLOCK_EVENTS_COUNT).", GPU_LABELS + ("reason",))
        for bit, name in sorted(CLOCK_REASON_NAMES.items()):
            active.add(ids + (name,), 1 if c.event_reasons & bit else 0)
    durations = family("nodehealth_gpu_clocks_event_seconds_total",
                       "Time spent in each slowdown (NVML fields 269-271; DCGM_FI_DEV_THERMAL_VIOLATION, "
                       "_POWER_VIOLATION).", GPU_LABELS + ("reason",), "counter")
    for name, ns in (("sw_thermal_slowdown", c.sw_thermal_ns), ("hw_thermal_slowdown", c.hw_thermal_ns),
                     ("hw_power_brake_slowdown", c.hw_power_brake_ns), ("hw_slowdown", c.hw_slowdown_ns)):
        durations.add(ids + (name,), None if ns is None else ns / 1e9)


def rate_metrics(facts: NvmlFacts, rates: dict[str, float]) -> list[Metric]:
    """NVLink data throughput per link and direction, from the rates of fields 138/139."""
    throughput = Metric("nodehealth_gpu_nvlink_throughput_bytes_per_second",
                        "NVLink data throughput since the previous pass, without protocol overhead (NVML fields "
                        "138/139; DCGM_FI_PROF_NVLINK_L<n>_TX_BYTES, _RX_BYTES count headers too).",
                        labels=GPU_LABELS + ("link", "direction"))
    for g in facts.gpus:
        for link in g.nvlinks:
            for direction, name in (("transmit", "tx_bytes"), ("receive", "rx_bytes")):
                rate = rates.get(rate_key(g, f"nvlink{link.link}:{name}"))
                throughput.add(_ids(g) + (str(link.link), direction), rate)
    return [throughput]


def counters(facts: NvmlFacts) -> dict[str, float]:
    """Counters the checks judge as rates, keyed by gpu_facts.rate_key (the checks use the same)."""
    out: dict[str, float] = {}

    def put(g: Gpu, name: str, value: Any) -> None:
        if value is not None:
            out[rate_key(g, name)] = value
    for g in facts.gpus:
        if g.ecc is not None:
            put(g, "ecc_volatile_corrected", g.ecc.volatile_corrected)
            put(g, "ecc_volatile_uncorrected", g.ecc.volatile_uncorrected)
        for link in g.nvlinks:
            for name in ("crc_flit", "crc_data", "replay", "recovery", "tx_bytes", "rx_bytes"):
                put(g, f"nvlink{link.link}:{name}", getattr(link, name))
        if g.pcie is not None:
            put(g, "pcie_replay", g.pcie.replay)
        if g.clocks is not None:
            for name in ("sw_thermal_ns", "hw_thermal_ns", "hw_power_brake_ns", "hw_slowdown_ns"):
                put(g, "clocks_" + name, getattr(g.clocks, name))
    return out
