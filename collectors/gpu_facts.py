"""The facts the NVML collector hands to the GPU checks, and the NVML vocabulary they use.

Absent is not zero: a value NVML does not support on this GPU or driver (NotSupported,
FunctionNotFound) is None. A value NVML could not produce this pass (Timeout, Unknown, a call
that did not answer in time) is named in `Gpu.unknown`, so a check can say `unknown` instead of
judging a hole.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Clock event ("throttle") reason bits, nvmlClocksEventReason*.
CLOCKS_GPU_IDLE = 0x1
CLOCKS_APPLICATIONS_SETTING = 0x2
CLOCKS_SW_POWER_CAP = 0x4
CLOCKS_HW_SLOWDOWN = 0x8
CLOCKS_SYNC_BOOST = 0x10
CLOCKS_SW_THERMAL = 0x20
CLOCKS_HW_THERMAL = 0x40
CLOCKS_HW_POWER_BRAKE = 0x80
CLOCKS_DISPLAY_SETTING = 0x100
CLOCK_REASON_NAMES = {
    CLOCKS_GPU_IDLE: "gpu_idle",
    CLOCKS_APPLICATIONS_SETTING: "applications_clocks_setting",
    CLOCKS_SW_POWER_CAP: "sw_power_cap",
    CLOCKS_HW_SLOWDOWN: "hw_slowdown",
    CLOCKS_SYNC_BOOST: "sync_boost",
    CLOCKS_SW_THERMAL: "sw_thermal_slowdown",
    CLOCKS_HW_THERMAL: "hw_thermal_slowdown",
    CLOCKS_HW_POWER_BRAKE: "hw_power_brake_slowdown",
    CLOCKS_DISPLAY_SETTING: "display_clock_setting",
}

# nvmlDeviceGetArchitecture values.
ARCHITECTURES = {2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere", 8: "ada",
                 9: "hopper", 10: "blackwell", 11: "orin", 12: "rubin", 13: "rubin"}


@dataclass(frozen=True)
class EccCounts:
    volatile_corrected: int | None = None  # since the last driver load or GPU reset
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None  # lifetime, from the InfoROM
    aggregate_uncorrected: int | None = None


@dataclass(frozen=True)
class RetiredPages:
    """Pre-Ampere dynamic page retirement."""

    single_bit: int | None = None  # pages retired for multiple single-bit errors
    double_bit: int | None = None  # pages retired for a double-bit error
    pending: bool | None = None  # a retirement that takes effect at the next driver reload


@dataclass(frozen=True)
class RemappedRows:
    """Ampere and later row remapping (nvmlDeviceGetRemappedRows)."""

    correctable: int
    uncorrectable: int
    pending: bool  # a remap waits for the next GPU reset
    failure: bool  # a remap could not be done: RMA candidate


@dataclass(frozen=True)
class NvLink:
    link: int
    active: bool | None
    version: int | None = None  # nvmlDeviceGetNvLinkVersion enum (A100 reports 4 or 5), not the generation
    remote_pci_bus_id: str | None = None
    speed_mbps: float | None = None  # per-link speed in MB/s as `nvidia-smi nvlink -s` shows it
    crc_flit: int | None = None
    crc_data: int | None = None
    replay: int | None = None
    recovery: int | None = None
    tx_bytes: int | None = None  # cumulative data bytes
    rx_bytes: int | None = None


@dataclass(frozen=True)
class Pcie:
    current_gen: int | None = None
    max_gen: int | None = None  # the lower of the GPU's and the slot's
    current_width: int | None = None
    max_width: int | None = None
    replay: int | None = None  # replay counter since boot
    tx_bytes_per_second: float | None = None
    rx_bytes_per_second: float | None = None


@dataclass(frozen=True)
class Clocks:
    event_reasons: int | None = None  # bitmask of CLOCKS_* currently active
    sw_thermal_ns: int | None = None  # cumulative time spent in each slowdown, where the driver gives it
    hw_thermal_ns: int | None = None
    hw_power_brake_ns: int | None = None
    hw_slowdown_ns: int | None = None


@dataclass(frozen=True)
class MigDevice:
    """A MIG device of a GPU in MIG mode: what the kubelet's device plugin hands out by UUID."""

    uuid: str
    gpu_instance: int | None = None  # its GPU instance id, where NVML gave it (an Xid line names the GI)


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str | None = None
    name: str | None = None  # product name, e.g. "NVIDIA H100 80GB HBM3"
    serial: str | None = None
    pci_bus_id: str | None = None  # sysfs style, lower case: 0000:19:00.0 (joins the kernel log and sysfs)
    pci_device_id: int | None = None  # e.g. 0x233010DE
    vbios: str | None = None
    architecture: str | None = None  # "ampere", "hopper", ... (ARCHITECTURES)
    mig_enabled: bool | None = None
    mig_devices: tuple[MigDevice, ...] = ()  # in NVML's MIG device index order; () when MIG is off
    persistence_mode: bool | None = None
    ecc_enabled: bool | None = None
    ecc_pending: bool | None = None  # the mode after the next reboot
    ecc: EccCounts | None = None
    retired_pages: RetiredPages | None = None
    remapped_rows: RemappedRows | None = None
    nvlinks: tuple[NvLink, ...] = ()
    pcie: Pcie | None = None
    clocks: Clocks | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization_gpu_percent: float | None = None
    utilization_memory_percent: float | None = None
    fabric_state: str | None = None  # NVSwitch systems: not_started, in_progress, completed
    fabric_status: str | None = None  # "success" or the error NVML gave
    lost: bool = False  # NVML says GpuIsLost: the GPU fell off the bus
    reset_required: bool = False  # NVML says ResetRequired
    # Fact groups NVML could not produce this pass -> why (e.g. {"remapped_rows": "Timeout"}).
    unknown: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.pci_bus_id or self.uuid or 'unknown address'})"


def rate_key(gpu: Gpu, name: str) -> str:
    """The key of one of a GPU's counters in obs.rate("nvml", key): `GPU-8f3c...:ecc_volatile_corrected`.
    The collector's counters() and the checks both build keys here."""
    return f"{gpu.uuid or gpu.index}:{name}"


@dataclass(frozen=True)
class NvmlFacts:
    backend: str  # "nvml" (the driver) or "fake:<scenario>" (a fixture machine)
    driver_version: str | None
    cuda_driver_version: str | None  # "12.2"
    device_count: int | None
    gpus: tuple[Gpu, ...]
    # Calls this driver lacks (FunctionNotFound), named once per pass so the report can say so.
    missing_functions: tuple[str, ...] = ()
    init_error: str | None = None  # NVML could not start (no driver loaded, library missing, ...)


# NVML return codes, by the names pynvml gives their exceptions (NVMLError_<Name>).
NVML_ERRORS = {
    "Uninitialized": 1, "InvalidArgument": 2, "NotSupported": 3, "NoPermission": 4, "AlreadyInitialized": 5,
    "NotFound": 6, "InsufficientSize": 7, "InsufficientPower": 8, "DriverNotLoaded": 9, "Timeout": 10,
    "IrqIssue": 11, "LibraryNotFound": 12, "FunctionNotFound": 13, "CorruptedInforom": 14, "GpuIsLost": 15,
    "ResetRequired": 16, "OperatingSystem": 17, "LibRmVersionMismatch": 18, "InUse": 19, "Memory": 20,
    "NoData": 21, "VgpuEccNotSupported": 22, "InsufficientResources": 23, "FreqNotSupported": 24,
    "ArgumentVersionMismatch": 25, "Deprecated": 26, "NotReady": 27, "GpuNotFound": 28, "InvalidState": 29,
    "Unknown": 999,
}
NVML_ERROR_NAMES = {code: name for name, code in NVML_ERRORS.items()}


class NvmlError(Exception):
    """An NVML call failed; `name` is NVML's (NotSupported, GpuIsLost, ...)."""

    def __init__(self, code: int):
        self.code = code
        self.name = NVML_ERROR_NAMES.get(code, f"Error{code}")
        super().__init__(self.name)

    @classmethod
    def named(cls, name: str) -> NvmlError:
        return cls(NVML_ERRORS[name])
