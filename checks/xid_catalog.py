"""The Xid and SXid catalogs as data: what each code means and what nodehealth does about it.

Kept apart from checks/xid.py so that the table can be read, reviewed and updated on its own
when NVIDIA revises its catalog; operators adjust single codes with checks.xid.overrides.
"""
from __future__ import annotations

from dataclasses import dataclass

from nodehealth.model import Action, Severity

# The basis: NVIDIA's Xid catalog as copied in leptonai/gpud (generated 2025-10-29), plus
# nodehealth's proposed severity and action per code (docs/domain/xid.md, sections 1 and 2).
CATALOG_VERSION = "gpud-copy-2025-10-29+nodehealth-1"

_I, _W, _D, _F = Severity.INFO, Severity.WARNING, Severity.DEGRADED, Severity.FATAL
_NONE, _APP, _RESET, _REBOOT, _HW, _CONFIG = (Action.NONE, Action.RESTART_APP, Action.RESET_GPU,
                                              Action.REBOOT, Action.HW_INSPECTION, Action.FIX_CONFIG)


@dataclass(frozen=True)
class XidInfo:
    code: int
    mnemonic: str  # NVIDIA's name for the code ("" where the catalog gives none)
    reason: str  # the finding's stable CamelCase reason
    severity: Severity
    action: Action
    nvidia_action: str  # NVIDIA's immediate-action bucket ("" where the catalog is blank)
    meaning: str  # what it means for the operator, in a few words


# Sympathetic codes follow another error (an application fault, an earlier Xid on the same GPU);
# they never make a GPU unhealthy on their own, so repeats of them do not escalate either.
SYMPATHETIC = frozenset({43, 45, 94})

# Xid 144-150 print a Fatal/Nonfatal word; Xid 154 carries a new recovery action. checks/xid.py
# decodes those lines; the rows below are what applies when the line cannot be decoded.
NVLINK5_CODES = frozenset(range(144, 151))
RECOVERY_ACTION_CODE = 154

# Section 2 of docs/domain/xid.md, one row per code (ranges expanded).
_XID_ROWS = (
    (8, "FIFO_ERROR_IDLE_TIMEOUT", "Xid8IdleTimeout", _W, _APP, "RESTART_APP",
     "the GPU stopped processing work (idle timeout), usually an application or driver problem"),
    (13, "GR_EXCEPTION", "Xid13GraphicsException", _W, _APP, "RESTART_APP",
     "the compute engine hit an exception, most often an application bug such as an illegal access"),
    (31, "FIFO_ERROR_MMU_ERR_FLT", "Xid31MmuFault", _W, _APP, "RESTART_APP",
     "a GPU memory page fault, most often an application using an invalid address"),
    (32, "PBDMA_ERROR", "Xid32PushBufferError", _W, _APP, "RESTART_APP",
     "the GPU read a corrupted command buffer (driver, system memory, PCIe or heat)"),
    (38, "FECS_ERR_WATCHDOG_TIMEOUT", "Xid38FecsWatchdogTimeout", _I, _NONE, "IGNORE",
     "a GPU firmware watchdog fired; informational"),
    (43, "RESETCHANNEL_VERIF_ERROR", "Xid43ChannelReset", _I, _NONE, "IGNORE",
     "the driver stopped one application's GPU channel, normally after that application faulted"),
    (44, "GR_FAULT_DURING_CTXSW", "Xid44ContextSwitchFault", _I, _NONE, "IGNORE",
     "a graphics fault during a context switch; informational"),
    (45, "PREEMPTIVE_REMOVAL", "Xid45PreemptiveCleanup", _I, _NONE, "WORKFLOW_XID_45",
     "the driver cleaned up GPU channels after an earlier error or an application exit"),
    (46, "GPU_TIMEOUT_ERROR", "Xid46GpuTimeout", _F, _RESET, "RESET_GPU",
     "the GPU stopped processing and timed out"),
    (48, "GPU_ECC_DBE", "Xid48DoubleBitEcc", _F, _RESET, "WORKFLOW_XID_48",
     "an uncorrectable double-bit ECC error in GPU memory; results of running work may be wrong"),
    (54, "", "Xid54AuxPowerNotConnected", _F, _HW, "CHECK_MECHANICALS",
     "the GPU's auxiliary power is not connected; check its power cables"),
    (56, "UNUSED", "Xid56Unused", _W, _NONE, "CONTACT_SUPPORT",
     "a code NVIDIA lists as unused (older tables call it a display clock change)"),
    (57, "UNUSED", "Xid57Unused", _W, _NONE, "CONTACT_SUPPORT",
     "a code NVIDIA lists as unused (older tables call it a display clock change)"),
    (58, "UNUSED", "Xid58Unused", _W, _NONE, "CONTACT_SUPPORT",
     "a code NVIDIA lists as unused (older tables call it a display clock change)"),
    (60, "SEC2_ERROR", "Xid60Sec2Error", _W, _APP, "RESTART_APP",
     "the video/security processor (SEC2) raised an exception"),
    (61, "PMU_BREAKPOINT", "Xid61PmuBreakpoint", _D, _HW, "CONTACT_SUPPORT",
     "an internal micro-controller hit a breakpoint; NVIDIA offers no automated recovery"),
    (62, "PMU_HALT_ERROR", "Xid62PmuHalt", _F, _RESET, "RESET_GPU",
     "an internal micro-controller halted (hardware, driver or thermal cause)"),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "Xid63MemoryRetirementRecorded", _D, _RESET, "IGNORE",
     "a GPU memory row was marked for remapping (a page retired before Ampere); it takes effect "
     "at the next GPU reset and work may continue until then"),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "Xid64MemoryRetirementFailed", _F, _HW, "RESET_GPU",
     "the GPU could not record a memory row remap or page retirement, so bad memory stays in use; "
     "a candidate for replacement"),
    (65, "UNUSED", "Xid65Unused", _D, _REBOOT, "CONTACT_SUPPORT",
     "a code NVIDIA lists as unused, with no automated recovery; peers reboot on it"),
    (68, "NVDEC0_ERROR", "Xid68VideoDecoderError", _W, _APP, "RESTART_APP",
     "the video decoder engine raised an exception"),
    (69, "GR_CLASS_ERROR", "Xid69GraphicsClassError", _W, _APP, "RESTART_APP",
     "the graphics engine rejected a command"),
    (73, "UNUSED", "Xid73Unused", _W, _NONE, "CONTACT_SUPPORT",
     "a code NVIDIA lists as unused (DCGM counts it as an NVLink warning)"),
    (74, "NVLINK_ERROR", "Xid74NvlinkError", _F, _RESET, "WORKFLOW_NVLINK_ERR",
     "an NVLink error; traffic between GPUs over that link is broken"),
    (79, "GPU_HAS_FALLEN_OFF_THE_BUS", "Xid79FallenOffBus", _F, _REBOOT, "RESTART_BM",
     "the GPU no longer answers on PCIe and only a full power cycle brings it back"),
    (81, "UNUSED", "Xid81Unused", _F, _HW, "CONTACT_SUPPORT",
     "a code NVIDIA lists as unused, with no automated recovery; treated as a hardware fault"),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "Xid92HighSingleBitEccRate", _W, _NONE, "IGNORE",
     "a high rate of corrected single-bit ECC errors; run field diagnostics if it keeps up"),
    (93, "INFOROM_ERASE_LIMIT_EXCEEDED", "Xid93InforomEraseLimit", _I, _NONE, "IGNORE",
     "the InfoROM reached its erase limit; informational"),
    (94, "CONTAINED_ERROR", "Xid94ContainedMemoryError", _W, _APP, "RESTART_APP",
     "an uncorrectable memory error was contained to one application; others continue, and a "
     "later GPU reset applies the row remap"),
    (95, "UNCONTAINED_ERROR", "Xid95UncontainedMemoryError", _F, _RESET, "RESET_GPU",
     "an uncorrectable memory error that could not be contained; all work on the GPU is affected"),
    (109, "CTXSW_TIMEOUT_ERROR", "Xid109ContextSwitchTimeout", _F, _RESET, "RESET_GPU",
     "a context switch timed out (application, driver or hardware)"),
    (110, "SEC_FAULT_ERROR", "Xid110SecurityFault", _F, _RESET, "RESET_GPU",
     "the GPU raised a security fault"),
    (119, "GSP_RPC_TIMEOUT", "Xid119GspRpcTimeout", _F, _RESET, "RESET_GPU",
     "the driver timed out waiting for the GPU System Processor (GSP), often a driver bug"),
    (120, "GSP_ERROR", "Xid120GspError", _F, _RESET, "RESET_GPU",
     "the GPU System Processor (GSP) reported an error"),
    (121, "C2C_ERROR", "Xid121C2cError", _W, _NONE, "IGNORE",
     "an error on the Grace chip-to-chip (C2C) link"),
    (136, "ALI_TRAINING_FAIL", "Xid136LinkTrainingFailed", _F, _RESET, "RESET_GPU",
     "NVLink training failed, so the GPU lacks some of its links"),
    (137, "NVLINK_PRIV_ERR", "Xid137NvlinkPrivError", _W, _NONE, "IGNORE",
     "an NVLink privileged register access failed"),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "Xid140UnrecoverableEccEscape", _F, _RESET, "RESET_GPU",
     "an uncorrectable ECC error escaped containment"),
    (141, "FAST_PATH_ERROR", "Xid141FastPathError", _I, _NONE, "IGNORE",
     "a fast-path error; informational"),
    (143, "GPU_INIT_ERROR", "Xid143GpuInitError", _F, _HW, "RESET_GPU",
     "the GPU failed to initialize"),
    (144, "SAW", "Xid144NvlinkSaw", _W, _NONE, "WORKFLOW_NVLINK5_ERR",
     "an NVLink5 error reported by the SAW unit"),
    (145, "RLW", "Xid145NvlinkRlw", _W, _NONE, "WORKFLOW_NVLINK5_ERR",
     "an NVLink5 error reported by the RLW unit"),
    (146, "TLW", "Xid146NvlinkTlw", _W, _NONE, "WORKFLOW_NVLINK5_ERR",
     "an NVLink5 error reported by the TLW unit"),
    (147, "TREX", "Xid147NvlinkTrex", _W, _NONE, "WORKFLOW_NVLINK5_ERR",
     "an NVLink5 error reported by the TREX unit"),
    (148, "NVLPW_CTRL", "Xid148NvlinkPowerControl", _W, _NONE, "WORKFLOW_NVLINK5_ERR",
     "an NVLink5 error reported by the link power control unit (NVLPW_CTRL)"),
    (149, "NETIR", "Xid149NvlinkNetir", _W, _NONE, "WORKFLOW_NVLINK5_ERR",
     "an NVLink5 error reported by the NETIR unit (link events such as a link going down)"),
    (150, "MSE", "Xid150NvlinkMse", _W, _NONE, "WORKFLOW_NVLINK5_ERR",
     "an NVLink5 error reported by the MSE unit"),
    (151, "KEY_ROTATION_ERROR", "Xid151KeyRotationError", _F, _REBOOT, "RESTART_VM",
     "a confidential-computing key rotation failed; the VM or instance must be restarted"),
    (154, "GPU_RECOVERY_ACTION_CHANGED", "Xid154RecoveryActionChanged", _W, _NONE, "XID_154",
     "the driver changed the recovery action it asks for on this GPU"),
    (155, "NVLINK_SW_DEFINED_ERROR", "Xid155NvlinkSoftwareDefinedError", _F, _RESET, "RESET_GPU",
     "a software-defined NVLink error"),
    (156, "RESOURCE_RETIREMENT_EVENT", "Xid156ResourceRetirementEvent", _F, _RESET, "RESET_GPU",
     "a GPU resource was retired; a reset applies the retirement"),
    (157, "RESOURCE_RETIREMENT_FAILURE", "Xid157ResourceRetirementFailure", _W, _NONE, "IGNORE",
     "retiring a GPU resource failed"),
    (158, "GPU_FATAL_TIMEOUT", "Xid158GpuFatalTimeout", _F, _RESET, "RESET_GPU",
     "the GPU hit a fatal timeout"),
    (159, "CHI_NON_DATA_ERROR", "Xid159ChiNonDataError", _D, _NONE, "CHECK_UVM",
     "a coherent interconnect (CHI) error outside the data path; NVIDIA advises checking UVM"),
    (160, "CHANNEL_RETIREMENT_EVENT", "Xid160ChannelRetirementEvent", _W, _NONE, "IGNORE",
     "a GPU channel was retired (catalog revisions disagree: one asks for a power cycle)"),
    (161, "CHANNEL_RETIREMENT_FAILURE", "Xid161ChannelRetirementFailure", _W, _NONE, "IGNORE",
     "retiring a GPU channel failed"),
    (162, "PSHC", "Xid162PowerSmoothingError", _W, _NONE, "",
     "an error in the power-smoothing circuitry; NVIDIA gives no guidance yet"),
    (163, "PSHC", "Xid163PowerSmoothingError", _W, _NONE, "",
     "an error in the power-smoothing circuitry; NVIDIA gives no guidance yet"),
    (164, "PSHC", "Xid164PowerSmoothingError", _W, _NONE, "",
     "an error in the power-smoothing circuitry; NVIDIA gives no guidance yet"),
    (165, "PSHC", "Xid165PowerSmoothingError", _W, _NONE, "",
     "an error in the power-smoothing circuitry; NVIDIA gives no guidance yet"),
    (166, "NVLINK_SECURE_CRYPTO_ERR", "Xid166NvlinkSecureCryptoError", _W, _NONE, "",
     "an NVLink encryption error; NVIDIA gives no guidance yet"),
    (167, "PCIE_FATAL_TIMEOUT", "Xid167PcieFatalTimeout", _W, _NONE, "",
     "a fatal PCIe timeout; NVIDIA gives no guidance yet"),
    (168, "REDUCED_GPU_MEMORY_CAPACITY", "Xid168ReducedMemoryCapacity", _W, _NONE, "",
     "the GPU runs with less memory than it should; NVIDIA gives no guidance yet"),
    (169, "SEC2_HALT_ERROR", "Xid169Sec2Halt", _W, _NONE, "",
     "the security processor (SEC2) halted; NVIDIA gives no guidance yet"),
    (170, "NVLINK_SECURE_OTHER", "Xid170NvlinkSecureOther", _W, _NONE, "",
     "an NVLink security error; NVIDIA gives no guidance yet"),
    (171, "UNCORRECTABLE_DRAM_ERROR", "Xid171UncorrectableDramError", _F, _RESET, "",
     "an uncorrectable error in GPU DRAM (detail to an Xid 48)"),
    (172, "UNCORRECTABLE_SRAM_ERROR", "Xid172UncorrectableSramError", _F, _RESET, "",
     "an uncorrectable error in on-chip GPU SRAM (detail to an Xid 48)"),
)

XID_CATALOG: dict[int, XidInfo] = {row[0]: XidInfo(*row) for row in _XID_ROWS}


@dataclass(frozen=True)
class SxidInfo:
    code: int
    name: str
    reason: str
    severity: Severity
    action: Action
    nvidia_action: str
    meaning: str


# Section 4.4 of docs/domain/xid.md. RESET_FABRIC has no action of its own here: resetting the
# fabric means resetting the GPUs and switches together, so it maps to reset-gpu.
_SXID_ROWS = (
    (20034, "LTSSM_FAULT_UP", "SXid20034LtssmFaultUp", _F, _RESET, "RESET_GPU",
     "a switch port's link left its active state, so the GPU behind it lost its fabric link"),
    (12028, "PRIVRSPERR", "SXid12028PrivResponseError", _F, _RESET, "RESET_FABRIC",
     "an egress non-posted PRIV response error; the fabric (GPUs and switches together) needs a reset"),
    (24007, "SOURCETRACK_TIMEOUT", "SXid24007SourceTrackTimeout", _F, _RESET, "RESET_GPU",
     "a request through the switch timed out"),
    (19084, "AN1_HEARTBEAT", "SXid19084An1Heartbeat", _F, _RESET, "RESET_FABRIC",
     "the switch missed its heartbeat; the fabric (GPUs and switches together) needs a reset"),
    (20009, "RX_SHORT_ERROR_RATE", "SXid20009RxShortErrorRate", _D, _HW, "CHECK_LINK_MECHANICAL_CONNECTIONS",
     "a switch link sees a high short-term receive error rate; check its mechanical connection"),
    (11004, "ACL", "SXid11004AclError", _D, _CONFIG, "CHECK_FM_CONFIG",
     "traffic broke the switch's access control rules, usually a Fabric Manager configuration problem"),
    (10004, "THERMAL", "SXid10004Thermal", _D, _HW, "CHECK_THERMALS",
     "the switch reported a thermal event; check its cooling"),
    (22013, "MINION_NONFATAL", "SXid22013MinionNonFatal", _I, _NONE, "IGNORE",
     "a non-fatal interrupt from a link controller (MINION); informational"),
    (28006, "MC_TS_CRUMBSTORE_MCTO", "SXid28006CrumbstoreTimeout", _W, _NONE, "",
     "a non-fatal multicast crumbstore timeout"),
)

SXID_CATALOG: dict[int, SxidInfo] = {row[0]: SxidInfo(*row) for row in _SXID_ROWS}

# A GPU that fell off the bus (Xid 79) together with an NVSwitch link fault (SXid 20034) on the
# same host means the node has to be restarted.
FALLEN_OFF_BUS_XID = 79
LINK_FAULT_SXID = 20034


@dataclass(frozen=True)
class RecoveryAction:
    value: int
    name: str  # NVML's name for the value
    severity: Severity
    action: Action
    advice: str


# Section 6 of docs/domain/xid.md: what Xid 154 asks for. DRAIN_AND_RESET is fatal rather than
# degraded: fatal stops new work landing on the node (NoSchedule) while running work drains.
_RECOVERY_ROWS = (
    (0, "NONE", _I, _NONE, "the GPU is usable again once a new process starts"),
    (1, "GPU_RESET", _F, _RESET, "stop the GPU's processes and reset it"),
    (2, "NODE_REBOOT", _F, _REBOOT, "the operating system may be inconsistent: drain and reboot the node"),
    (3, "DRAIN_P2P", _D, _APP, "stop the processes using peer-to-peer transfers, turn off UVM "
                               "persistence, then check the recovery action again"),
    (4, "DRAIN_AND_RESET", _F, _RESET, "let running work finish, then reset the GPU"),
    (5, "RECOVER_IMEX_DOMAIN", _F, _NONE, "recover the IMEX domain this GPU belongs to"),
    (6, "BUS_RESET", _F, _RESET, "reset the GPU's PCIe bus"),
    (7, "SYSTEM_REBOOT", _F, _REBOOT, "drain and reboot the system"),
)

RECOVERY_ACTIONS: dict[int, RecoveryAction] = {row[0]: RecoveryAction(*row) for row in _RECOVERY_ROWS}

# Words the driver prints after the value, for lines that give the words without the number.
RECOVERY_LABELS = {"none": 0, "gpu reset required": 1, "node reboot required": 2, "drain and reset": 4}
