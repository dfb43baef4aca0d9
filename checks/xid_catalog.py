"""The Xid and SXid catalogs as data: what each code means and what nodehealth does about it.

Long on purpose: it is data, one entry per Xid and SXid code as NVIDIA lists them.

NVIDIA's tables are copied whole (every code, its name, NVIDIA's immediate action); nodehealth's
severity and action follow from NVIDIA's action by one rule per bucket, and the few codes where we
deliberately rate otherwise are listed with the reason. tests/test_xid_catalog.py checks all of it
against tests/fixtures/xid-catalog/nvidia-xid-codes.tsv. Operators adjust single codes with
checks.xid.overrides.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from nodehealth.model import Action, Severity

# Named after NVIDIA's documents: the Xid Catalog spreadsheet (Xid-Catalog.xlsx, last modified
# 2025-09-30, SHA-256 7f70ce96...) and the Fabric Manager User Guide DU-09883-001 v1.3 (SXids);
# "+nodehealth-2" is the revision of our rating rules and deliberate differences below.
XID_DOCUMENT = "NVIDIA Xid Catalog (Xid-Catalog.xlsx, 2025-09-30)"
SXID_DOCUMENT = "NVIDIA Fabric Manager User Guide DU-09883-001 v1.3"
CATALOG_VERSION = "nvidia-xid-catalog-2025-09-30+nodehealth-2"
SXID_CATALOG_VERSION = "nvidia-fm-guide-DU-09883-001-v1.3+nodehealth-2"

_I, _W, _D, _F = Severity.INFO, Severity.WARNING, Severity.DEGRADED, Severity.FATAL
_NONE, _APP, _RESET, _REBOOT, _HW, _CONFIG = (Action.NONE, Action.RESTART_APP, Action.RESET_GPU,
                                              Action.REBOOT, Action.HW_INSPECTION, Action.FIX_CONFIG)


@dataclass(frozen=True)
class XidInfo:
    code: int
    mnemonic: str  # NVIDIA's symbol for the code, verbatim
    reason: str  # the finding's stable CamelCase reason
    severity: Severity
    action: Action
    nvidia_action: str  # NVIDIA's immediate-action bucket ("" where the catalog gives none)
    meaning: str  # what it means for the operator, in a few words
    name: str = ""  # NVIDIA's short description ("Unused" for codes it no longer uses)
    unused: bool = False


# Sympathetic codes follow another error (an application fault, an earlier Xid on the same GPU);
# they never make a GPU unhealthy on their own, so repeats of them do not escalate either.
SYMPATHETIC = frozenset({43, 45, 94})

# Xid 144-150 print a Fatal/Nonfatal word; Xid 154 carries a new recovery action. checks/xid.py
# decodes those lines; the rows below are what applies when the line cannot be decoded.
NVLINK5_CODES = frozenset(range(144, 151))
RECOVERY_ACTION_CODE = 154

# NVIDIA's Xid table, every code 1-172: (code, mnemonic, description, immediate action, unused).
# Immediate action is blank for 162-172, where NVIDIA gives guidance only in prose.
_NVIDIA_XIDS = (
    (1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "Unused", "CONTACT_SUPPORT", True),
    (2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", True),
    (3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "Unused", "CONTACT_SUPPORT", True),
    (4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "Unused", "CONTACT_SUPPORT", True),
    (5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "Unused", "CONTACT_SUPPORT", True),
    (6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "Unused", "CONTACT_SUPPORT", True),
    (7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "Unused", "CONTACT_SUPPORT", True),
    (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "RESTART_APP", False),
    (9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "Unused", "CONTACT_SUPPORT", True),
    (10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "Unused", "CONTACT_SUPPORT", True),
    (11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "Invalid or corrupted push buffer stream", "RESTART_APP", False),
    (12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", True),
    (13, "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY",
     "Graphics Engine Exception", "RESTART_APP", False),
    (14, "ROBUST_CHANNEL_FAKE_ERROR", "Unused", "IGNORE", True),
    (15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "Unused", "CONTACT_SUPPORT", True),
    (16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "Unused", "CONTACT_SUPPORT", True),
    (17, "ROBUST_CHANNEL_PARAMETER_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "Unused", "CONTACT_SUPPORT", True),
    (20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", True),
    (21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", True),
    (22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", True),
    (23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "Unused", "CONTACT_SUPPORT", True),
    (24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "Unused", "CONTACT_SUPPORT", True),
    (25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "Invalid or illegal push buffer stream", "RESTART_APP", False),
    (26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "Unused", "CONTACT_SUPPORT", True),
    (27, "ROBUST_CHANNEL_VP_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (28, "ROBUST_CHANNEL_VP2_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (29, "ROBUST_CHANNEL_BSP_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "Unused", "CONTACT_SUPPORT", True),
    (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP", False),
    (32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", "RESTART_APP", False),
    (33, "ROBUST_CHANNEL_SEC_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (34, "ROBUST_CHANNEL_MSVLD_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (35, "ROBUST_CHANNEL_MSPDEC_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (36, "ROBUST_CHANNEL_MSPPP_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "Driver firmware error", "IGNORE", False),
    (38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", "IGNORE", False),
    (39, "ROBUST_CHANNEL_CE0_ERROR", "Copy Engine Exception", "RESTART_APP", False),
    (40, "ROBUST_CHANNEL_CE1_ERROR", "Copy Engine Exception", "RESTART_APP", False),
    (41, "ROBUST_CHANNEL_CE2_ERROR", "Copy Engine Exception", "RESTART_APP", False),
    (42, "ROBUST_CHANNEL_VIC_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE", False),
    (44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics Engine fault during context switch", "IGNORE", False),
    (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45", False),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "RESET_GPU", False),
    (47, "ROBUST_CHANNEL_NVENC0_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48", False),
    (49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "Unused", "CONTACT_SUPPORT", True),
    (50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "Unused", "CONTACT_SUPPORT", True),
    (52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "Unused", "CONTACT_SUPPORT", True),
    (53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "Unused", "CONTACT_SUPPORT", True),
    (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
     "Auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS", False),
    (55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (56, "DISPLAY_CHANNEL_EXCEPTION", "Unused", "CONTACT_SUPPORT", True),
    (57, "FB_LINK_TRAINING_FAILURE_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (58, "FB_MEMORY_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (59, "PMU_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (60, "ROBUST_CHANNEL_SEC2_ERROR", "Video processor exception", "RESTART_APP", False),
    (61, "PMU_BREAKPOINT", "Unused", "CONTACT_SUPPORT", True),
    (62, "PMU_HALT_ERROR", "Internal micro-controller halt (newer drivers)", "RESET_GPU", False),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE", False),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU", False),
    (65, "ROBUST_CHANNEL_NVENC1_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "Illegal access by driver", "IGNORE", False),
    (67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Illegal access by driver", "IGNORE", False),
    (68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 Exception", "RESTART_APP", False),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics Engine class error", "RESTART_APP", False),
    (70, "ROBUST_CHANNEL_CE3_ERROR", "CE3: Unknown Error", "RESTART_APP", False),
    (71, "ROBUST_CHANNEL_CE4_ERROR", "CE4: Unknown Error", "RESTART_APP", False),
    (72, "ROBUST_CHANNEL_CE5_ERROR", "CE5: Unknown Error", "RESTART_APP", False),
    (73, "ROBUST_CHANNEL_NVENC2_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR", False),
    (75, "ROBUST_CHANNEL_CE6_ERROR", "CE6: Unknown Error", "RESTART_APP", False),
    (76, "ROBUST_CHANNEL_CE7_ERROR", "CE7: Unknown Error", "RESTART_APP", False),
    (77, "ROBUST_CHANNEL_CE8_ERROR", "CE8: Unknown Error", "RESTART_APP", False),
    (78, "VGPU_START_ERROR", "vGPU Start Error", "UPDATE_SWFW", False),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM", False),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "Corrupted data sent to GPU", "RESTART_APP", False),
    (81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (82, "ROBUST_CHANNEL_NVJPG0_ERROR", "NVJPG0 Error", "RESTART_APP", False),
    (83, "ROBUST_CHANNEL_NVDEC1_ERROR", "NVDEC1 Error", "RESTART_APP", False),
    (84, "ROBUST_CHANNEL_NVDEC2_ERROR", "NVDEC2 Error", "RESTART_APP", False),
    (85, "ROBUST_CHANNEL_CE9_ERROR", "CE9: Unknown Error", "RESTART_APP", False),
    (86, "ROBUST_CHANNEL_OFA0_ERROR", "OFA Exception", "RESTART_APP", False),
    (87, "NVTELEMETRY_DRIVER_REPORT", "Unused", "CONTACT_SUPPORT", True),
    (88, "ROBUST_CHANNEL_NVDEC3_ERROR", "NVDEC3 Error", "RESTART_APP", False),
    (89, "ROBUST_CHANNEL_NVDEC4_ERROR", "NVDEC4 Error", "RESTART_APP", False),
    (90, "LTC_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (91, "RESERVED_XID", "Unused", "CONTACT_SUPPORT", True),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE", False),
    (93, "INFOROM_ERASE_LIMIT_EXCEEDED", "Non-fatal violation of provisioned InfoROM wear limit", "IGNORE", False),
    (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP", False),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU", False),
    (96, "ROBUST_CHANNEL_NVDEC5_ERROR", "NVDEC5 Error", "RESTART_APP", False),
    (97, "ROBUST_CHANNEL_NVDEC6_ERROR", "NVDEC6 Error", "RESTART_APP", False),
    (98, "ROBUST_CHANNEL_NVDEC7_ERROR", "NVDEC7 Error", "RESTART_APP", False),
    (99, "ROBUST_CHANNEL_NVJPG1_ERROR", "NVJPG1 Error", "RESTART_APP", False),
    (100, "ROBUST_CHANNEL_NVJPG2_ERROR", "NVJPG2 Error", "RESTART_APP", False),
    (101, "ROBUST_CHANNEL_NVJPG3_ERROR", "NVJPG3 Error", "RESTART_APP", False),
    (102, "ROBUST_CHANNEL_NVJPG4_ERROR", "NVJPG4 Error", "RESTART_APP", False),
    (103, "ROBUST_CHANNEL_NVJPG5_ERROR", "NVJPG5 Error", "RESTART_APP", False),
    (104, "ROBUST_CHANNEL_NVJPG6_ERROR", "NVJPG6 Error", "RESTART_APP", False),
    (105, "ROBUST_CHANNEL_NVJPG7_ERROR", "NVJPG7 Error", "RESTART_APP", False),
    (106, "SMBPBI_TEST_MESSAGE", "SMBPBI Test Message", "IGNORE", False),
    (107, "SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI Test Message Silent", "IGNORE", False),
    (108, "NVLINK_REMOTE_TRANSLATION_ERROR", "Unused", "IGNORE", True),
    (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", "RESET_GPU", False),
    (110, "SEC_FAULT_ERROR", "Security Fault Error", "RESET_GPU", False),
    (111, "BUNDLE_ERROR_EVENT", "Unused", "CONTACT_SUPPORT", True),
    (112, "DISP_SUPERVISOR_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (113, "DP_LT_FAILURE", "Unused", "CONTACT_SUPPORT", True),
    (114, "HEAD_RG_UNDERFLOW", "Unused", "CONTACT_SUPPORT", True),
    (115, "CORE_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", True),
    (116, "WINDOW_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", True),
    (117, "CURSOR_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", True),
    (118, "HEAD_REGS", "Unused", "CONTACT_SUPPORT", True),
    (119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU", False),
    (120, "GSP_ERROR", "GSP Error", "RESET_GPU", False),
    (121, "C2C_ERROR", "C2C Error", "IGNORE", False),
    (122, "SPI_PMU_RPC_READ_FAIL", "Unused", "CONTACT_SUPPORT", True),
    (123, "SPI_PMU_RPC_WRITE_FAIL", "Unused", "CONTACT_SUPPORT", True),
    (124, "SPI_PMU_RPC_ERASE_FAIL", "Unused", "CONTACT_SUPPORT", True),
    (125, "INFOROM_FS_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (126, "ROBUST_CHANNEL_CE10_ERROR", "CE10: Unknown Error", "RESTART_APP", False),
    (127, "ROBUST_CHANNEL_CE11_ERROR", "CE11: Unknown Error", "RESTART_APP", False),
    (128, "ROBUST_CHANNEL_CE12_ERROR", "CE12: Unknown Error", "RESTART_APP", False),
    (129, "ROBUST_CHANNEL_CE13_ERROR", "CE13: Unknown Error", "RESTART_APP", False),
    (130, "ROBUST_CHANNEL_CE14_ERROR", "CE14: Unknown Error", "RESTART_APP", False),
    (131, "ROBUST_CHANNEL_CE15_ERROR", "CE15: Unknown Error", "RESTART_APP", False),
    (132, "ROBUST_CHANNEL_CE16_ERROR", "CE16: Unknown Error", "RESTART_APP", False),
    (133, "ROBUST_CHANNEL_CE17_ERROR", "CE17: Unknown Error", "RESTART_APP", False),
    (134, "ROBUST_CHANNEL_CE18_ERROR", "CE18: Unknown Error", "RESTART_APP", False),
    (135, "ROBUST_CHANNEL_CE19_ERROR", "CE19: Unknown Error", "RESTART_APP", False),
    (136, "ALI_TRAINING_FAIL", "Link Training Failed", "RESET_GPU", False),
    (137, "NVLINK_PRIV_ERR", "NVLink Privilege Error", "IGNORE", False),
    (138, "ROBUST_CHANNEL_DLA_ERROR", "Unused", "CONTACT_SUPPORT", True),
    (139, "ROBUST_CHANNEL_OFA1_ERROR", "OFA1 Error", "RESTART_APP", False),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", "RESET_GPU", False),
    (141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA Fast Path Error", "IGNORE", False),
    (142, "ROBUST_CHANNEL_NVENC3_ERROR", "NVENC3 Error", "CONTACT_SUPPORT", False),
    (143, "GPU_INIT_ERROR", "GPU Initialization Error", "RESET_GPU", False),
    (144, "NVLINK_SAW_ERROR", "NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR", False),
    (145, "NVLINK_RLW_ERROR", "NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR", False),
    (146, "NVLINK_TLW_ERROR", "NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR", False),
    (147, "NVLINK_TREX_ERROR", "NVLINK: TREX Error", "WORKFLOW_NVLINK5_ERR", False),
    (148, "NVLINK_NVLPW_CTRL_ERROR", "NVLINK: NVLPW_CTRL Error", "WORKFLOW_NVLINK5_ERR", False),
    (149, "NVLINK_NETIR_ERROR", "NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR", False),
    (150, "NVLINK_MSE_ERROR", "NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR", False),
    (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation Error", "RESTART_VM", False),
    (152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "DLA SMMU Error", "IGNORE", False),
    (153, "ROBUST_CHANNEL_DLA_TIMEOUT", "DLA timeout Error", "IGNORE", False),
    (154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154", False),
    (155, "NVLINK_SW_DEFINED_ERROR", "NVLINK: SW Defined Error", "RESET_GPU", False),
    (156, "RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", "RESET_GPU", False),
    (157, "RESOURCE_RETIREMENT_FAILURE", "Resource Retirement Failure", "IGNORE", False),
    (158, "GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", "RESET_GPU", False),
    (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI Non-Data Error", "CHECK_UVM", False),
    (160, "CHANNEL_RETIREMENT_EVENT", "Channel Retirement Event", "IGNORE", False),
    (161, "CHANNEL_RETIREMENT_FAILURE", "Channel Retirement Failure", "IGNORE", False),
    (162, "PSHC_REENGAGED", "Power Smoothing HW Circuitry capability reengaged", "", False),
    (163, "PSHC_DISENGAGED", "Power Smoothing HW Circuitry capability disengaged", "", False),
    (164, "PSHC_LOW_LIFETIME", "Power Smoothing HW Circuitry low lifetime reached", "", False),
    (165, "PSHC_ZERO_LIFETIME", "Power Smoothing HW Circuitry lifetime exhausted", "", False),
    (166, "NVLINK_SECURE_CRYPTO_ERR",
     "NVLink CC crypto error: CC traffic before link set up for encryption", "", False),
    (167, "PCIE_FATAL_TIMEOUT", "PCIE_FATAL_TIMEOUT", "", False),
    (168, "REDUCED_GPU_MEMORY_CAPACITY", "Errors found in WPR (write protected region)", "", False),
    (169, "SEC2_HALT_ERROR", "Internal micro-controller halt", "", False),
    (170, "NVLINK_SECURE_OTHER", "Interrupt seen in CC mode", "", False),
    (171, "UNCORRECTABLE_DRAM_ERROR", "Uncorrectable DRAM error (qualifier for Xid 48)", "", False),
    (172, "UNCORRECTABLE_SRAM_ERROR", "Uncorrectable SRAM error (qualifier for Xid 48)", "", False),
)

# nodehealth's rating of each NVIDIA immediate-action bucket (docs/sources.md, "NVIDIA's action buckets").
_BUCKET_POLICY: dict[str, tuple[Severity, Action]] = {
    "RESTART_APP": (_W, _APP),  # the GPU is fine; the application must be rerun
    "IGNORE": (_I, _NONE),  # informational
    "RESET_GPU": (_F, _RESET),  # stop the GPU's processes and reset it
    "RESTART_BM": (_F, _REBOOT),  # the GPU is unreachable; only a power cycle helps
    "RESTART_VM": (_F, _REBOOT),  # restart the VM or instance
    "WORKFLOW_XID_48": (_F, _RESET),  # reset, then read the SRAM threshold flag
    "WORKFLOW_XID_45": (_I, _NONE),  # follows another Xid: act on that one
    "WORKFLOW_NVLINK_ERR": (_F, _RESET),  # Xid 74: the link is broken until a reset
    "WORKFLOW_NVLINK5_ERR": (_W, _NONE),  # Xid 144-150: the Fatal/Nonfatal word in the line decides
    "XID_154": (_W, _NONE),  # the recovery action in the line decides
    "CHECK_MECHANICALS": (_F, _HW),  # cabling or auxiliary power
    "UPDATE_SWFW": (_D, _NONE),  # vGPU start error: update the driver or firmware
    "CHECK_UVM": (_D, _NONE),
    "CONTACT_SUPPORT": (_F, _HW),  # NVIDIA offers no automated recovery
    "": (_W, _NONE),  # no guidance yet: seen, not acted on; operators override per code
}
# A code NVIDIA marks "Unused" (deprecated, or V100 and older) with CONTACT_SUPPORT is unexpected
# on a current GPU but not proof of a broken one: degraded (no new work at idle), inspect.
_UNUSED_POLICY = (_D, _HW)

# Where nodehealth deliberately rates a code otherwise than its bucket: (severity, action, why).
DELIBERATE_XID_DIFFERENCES: dict[int, tuple[Severity, Action, str]] = {
    56: (_W, _NONE, "DCGM and aznhc still read 56-58 as display clock changes, which harm nothing"),
    57: (_W, _NONE, "as 56"),
    58: (_W, _NONE, "as 56"),
    63: (_D, _RESET, "IGNORE in the catalog, but the row remap takes effect only at the next GPU reset: "
                     "reset at idle (docs/sources.md, Xid recovery actions)"),
    64: (_F, _HW, "the GPU could not record a retirement, so bad memory stays in use: a replacement candidate"),
    65: (_D, _REBOOT, "gpud reboots on the first occurrences (gpud PR #1165)"),
    73: (_W, _NONE, "DCGM counts it as an NVLink warning only"),
    81: (_F, _HW, "gpud sends the node to hardware inspection at once"),
    92: (_W, _NONE, "IGNORE in the catalog, but a sustained high SBE rate calls for field diagnostics, "
                    "so it is seen and repeats escalate"),
    121: (_W, _NONE, "IGNORE in the catalog; DCGM warns on C2C link errors"),
    137: (_W, _NONE, "IGNORE in the catalog; DCGM warns, and XID_137_FLOW asks for investigation"),
    142: (_W, _APP, "CONTACT_SUPPORT in the catalog, but NVIDIA asks to restart the application for every other "
                    "video engine exception (NVDEC, NVJPG, OFA: RESTART_APP, then CONTACT_SUPPORT to investigate), "
                    "and this row alone has no investigatory action, as if its columns had shifted; NVIDIA's older "
                    "list and the EKS agent's fatal set used 142 for an unrecovered ECC error, which the current "
                    "catalog does not: an encoder (NVENC3) exception is rated as its siblings, and repeats on one GPU "
                    "still escalate"),
    143: (_F, _HW, "a GPU that fails to initialize rarely survives a reset; gpud inspects at once"),
    157: (_W, _NONE, "IGNORE in the catalog, but a failed retirement leaves a bad resource in use"),
    160: (_W, _NONE, "IGNORE in this revision, RESTART_BM in NVSentinel's older one: seen, not acted on"),
    161: (_W, _NONE, "IGNORE in the catalog, but a failed retirement leaves a bad channel in use"),
    171: (_F, _RESET, "no bucket yet; it qualifies an Xid 48, so it is rated as 48"),
    172: (_F, _RESET, "as 171"),
}

# nodehealth's own reason and words for the codes operators meet most; other codes get a reason
# built from NVIDIA's description and a meaning from NVIDIA's words.
_OUR_WORDS: dict[int, tuple[str, str]] = {
    8: ("Xid8IdleTimeout", "the GPU stopped processing work (idle timeout), usually an application or driver problem"),
    13: ("Xid13GraphicsException",
          "the compute engine hit an exception, most often an application bug such as an illegal access"),
    31: ("Xid31MmuFault", "a GPU memory page fault, most often an application using an invalid address"),
    32: ("Xid32PushBufferError", "the GPU read a corrupted command buffer (driver, system memory, PCIe or heat)"),
    38: ("Xid38FecsWatchdogTimeout", "a GPU firmware watchdog fired; informational"),
    43: ("Xid43ChannelReset",
          "the driver stopped one application's GPU channel, normally after that application faulted"),
    44: ("Xid44ContextSwitchFault", "a graphics fault during a context switch; informational"),
    45: ("Xid45PreemptiveCleanup", "the driver cleaned up GPU channels after an earlier error or an application exit"),
    46: ("Xid46GpuTimeout", "the GPU stopped processing and timed out"),
    48: ("Xid48DoubleBitEcc",
          "an uncorrectable double-bit ECC error in GPU memory; results of running work may be wrong"),
    54: ("Xid54AuxPowerNotConnected", "the GPU's auxiliary power is not connected; check its power cables"),
    56: ("Xid56Unused", "a code NVIDIA lists as unused (older tables call it a display clock change)"),
    57: ("Xid57Unused", "a code NVIDIA lists as unused (older tables call it a display clock change)"),
    58: ("Xid58Unused", "a code NVIDIA lists as unused (older tables call it a display clock change)"),
    60: ("Xid60Sec2Error", "the video/security processor (SEC2) raised an exception"),
    61: ("Xid61PmuBreakpoint", "an internal micro-controller hit a breakpoint; NVIDIA offers no automated recovery"),
    62: ("Xid62PmuHalt", "an internal micro-controller halted (hardware, driver or thermal cause)"),
    63: ("Xid63MemoryRetirementRecorded",
          "a GPU memory row was marked for remapping (a page retired before Ampere); it takes effect at "
          "the next GPU reset and work may continue until then"),
    64: ("Xid64MemoryRetirementFailed",
          "the GPU could not record a memory row remap or page retirement, so bad memory stays in use; a "
          "candidate for replacement"),
    65: ("Xid65Unused", "a code NVIDIA lists as unused, with no automated recovery; peers reboot on it"),
    68: ("Xid68VideoDecoderError", "the video decoder engine raised an exception"),
    69: ("Xid69GraphicsClassError", "the graphics engine rejected a command"),
    73: ("Xid73Unused", "a code NVIDIA lists as unused (DCGM counts it as an NVLink warning)"),
    74: ("Xid74NvlinkError", "an NVLink error; traffic between GPUs over that link is broken"),
    79: ("Xid79FallenOffBus", "the GPU no longer answers on PCIe and only a full power cycle brings it back"),
    81: ("Xid81Unused", "a code NVIDIA lists as unused, with no automated recovery; treated as a hardware fault"),
    92: ("Xid92HighSingleBitEccRate",
          "a high rate of corrected single-bit ECC errors; run field diagnostics if it keeps up"),
    93: ("Xid93InforomEraseLimit", "the InfoROM reached its erase limit; informational"),
    94: ("Xid94ContainedMemoryError",
          "an uncorrectable memory error was contained to one application; others continue, and a later "
          "GPU reset applies the row remap"),
    95: ("Xid95UncontainedMemoryError",
          "an uncorrectable memory error that could not be contained; all work on the GPU is affected"),
    109: ("Xid109ContextSwitchTimeout", "a context switch timed out (application, driver or hardware)"),
    110: ("Xid110SecurityFault", "the GPU raised a security fault"),
    119: ("Xid119GspRpcTimeout", "the driver timed out waiting for the GPU System Processor (GSP), often a driver bug"),
    120: ("Xid120GspError", "the GPU System Processor (GSP) reported an error"),
    121: ("Xid121C2cError", "an error on the Grace chip-to-chip (C2C) link"),
    136: ("Xid136LinkTrainingFailed", "NVLink training failed, so the GPU lacks some of its links"),
    137: ("Xid137NvlinkPrivError", "an NVLink privileged register access failed"),
    140: ("Xid140UnrecoverableEccEscape", "an uncorrectable ECC error escaped containment"),
    141: ("Xid141FastPathError", "a fast-path error; informational"),
    142: ("Xid142Nvenc3Error", "the video encoder engine (NVENC3) raised an exception; NVIDIA's action for the video "
                               "engines: restart the application"),
    143: ("Xid143GpuInitError", "the GPU failed to initialize"),
    144: ("Xid144NvlinkSaw", "an NVLink5 error reported by the SAW unit"),
    145: ("Xid145NvlinkRlw", "an NVLink5 error reported by the RLW unit"),
    146: ("Xid146NvlinkTlw", "an NVLink5 error reported by the TLW unit"),
    147: ("Xid147NvlinkTrex", "an NVLink5 error reported by the TREX unit"),
    148: ("Xid148NvlinkPowerControl", "an NVLink5 error reported by the link power control unit (NVLPW_CTRL)"),
    149: ("Xid149NvlinkNetir", "an NVLink5 error reported by the NETIR unit (link events such as a link going down)"),
    150: ("Xid150NvlinkMse", "an NVLink5 error reported by the MSE unit"),
    151: ("Xid151KeyRotationError",
          "a confidential-computing key rotation failed; the VM or instance must be restarted"),
    154: ("Xid154RecoveryActionChanged", "the driver changed the recovery action it asks for on this GPU"),
    155: ("Xid155NvlinkSoftwareDefinedError", "a software-defined NVLink error"),
    156: ("Xid156ResourceRetirementEvent", "a GPU resource was retired; a reset applies the retirement"),
    157: ("Xid157ResourceRetirementFailure", "retiring a GPU resource failed"),
    158: ("Xid158GpuFatalTimeout", "the GPU hit a fatal timeout"),
    159: ("Xid159ChiNonDataError",
          "a coherent interconnect (CHI) error outside the data path; NVIDIA advises checking UVM"),
    160: ("Xid160ChannelRetirementEvent",
          "a GPU channel was retired (catalog revisions disagree: one asks for a power cycle)"),
    161: ("Xid161ChannelRetirementFailure", "retiring a GPU channel failed"),
    162: ("Xid162PowerSmoothingError", "an error in the power-smoothing circuitry; NVIDIA gives no guidance yet"),
    163: ("Xid163PowerSmoothingError", "an error in the power-smoothing circuitry; NVIDIA gives no guidance yet"),
    164: ("Xid164PowerSmoothingError", "an error in the power-smoothing circuitry; NVIDIA gives no guidance yet"),
    165: ("Xid165PowerSmoothingError", "an error in the power-smoothing circuitry; NVIDIA gives no guidance yet"),
    166: ("Xid166NvlinkSecureCryptoError", "an NVLink encryption error; NVIDIA gives no guidance yet"),
    167: ("Xid167PcieFatalTimeout", "a fatal PCIe timeout; NVIDIA gives no guidance yet"),
    168: ("Xid168ReducedMemoryCapacity", "the GPU runs with less memory than it should; NVIDIA gives no guidance yet"),
    169: ("Xid169Sec2Halt", "the security processor (SEC2) halted; NVIDIA gives no guidance yet"),
    170: ("Xid170NvlinkSecureOther", "an NVLink security error; NVIDIA gives no guidance yet"),
    171: ("Xid171UncorrectableDramError", "an uncorrectable error in GPU DRAM (detail to an Xid 48)"),
    172: ("Xid172UncorrectableSramError", "an uncorrectable error in on-chip GPU SRAM (detail to an Xid 48)"),
}

_BUCKET_WORDS = {
    "RESTART_APP": "NVIDIA's action: restart the application",
    "IGNORE": "informational (NVIDIA's action: none)",
    "RESET_GPU": "NVIDIA's action: reset the GPU",
    "UPDATE_SWFW": "NVIDIA's action: update the driver and firmware",
    "CONTACT_SUPPORT": "NVIDIA offers no automated recovery",
    "": "NVIDIA gives no action yet",
}


def rated(nvidia_action: str, unused: bool) -> tuple[Severity, Action]:
    """nodehealth's severity and action for an NVIDIA bucket, before deliberate differences."""
    if unused and nvidia_action == "CONTACT_SUPPORT":
        return _UNUSED_POLICY
    return _BUCKET_POLICY.get(nvidia_action, (_W, _NONE))


def _camel(text: str) -> str:
    return "".join(w[:1].upper() + w[1:].lower() for w in re.findall(r"[A-Za-z0-9]+", text))


def _xid_info(code: int, mnemonic: str, name: str, nvidia_action: str, unused: bool) -> XidInfo:
    severity, action = rated(nvidia_action, unused)
    if code in DELIBERATE_XID_DIFFERENCES:
        severity, action, _ = DELIBERATE_XID_DIFFERENCES[code]
    if code in _OUR_WORDS:
        reason, meaning = _OUR_WORDS[code]
    elif unused:
        reason = f"Xid{code}Unused"
        meaning = f"a code NVIDIA lists as unused on current GPUs; {_BUCKET_WORDS[nvidia_action]}"
    else:
        reason = f"Xid{code}{_camel(name)}"
        meaning = f"{name}; {_BUCKET_WORDS[nvidia_action]}"
    return XidInfo(code, mnemonic, reason, severity, action, nvidia_action, meaning, name, unused)


XID_CATALOG: dict[int, XidInfo] = {row[0]: _xid_info(*row) for row in _NVIDIA_XIDS}


@dataclass(frozen=True)
class SxidInfo:
    code: int
    name: str  # the NVSwitch driver's enum name
    reason: str
    severity: Severity
    action: Action
    nvidia_action: str  # our token for the Fabric Manager guide's recovery text
    meaning: str
    fatality: str = ""  # the guide's table: non-fatal, fatal, always-fatal ("" for codes not in it)


# The SXid tables of NVIDIA's Fabric Manager User Guide, every code: (code, driver enum name,
# the guide's error name, the guide's table, our token for its recovery text).
_FM_GUIDE_SXIDS = (
    (10001, "NVSWITCH_ERR_HW_HOST_PRIV_ERROR",
     "Host_priv_error", "non-fatal (other-notable)", "none (watch for a following fatal SXid)"),
    (10002, "NVSWITCH_ERR_HW_HOST_PRIV_TIMEOUT",
     "Host_priv_timeout", "non-fatal (other-notable)", "none (watch for a following fatal SXid)"),
    (10003, "NVSWITCH_ERR_HW_HOST_UNHANDLED_INTERRUPT",
     "Host_unhandled_interrupt", "fatal (other-notable)", "reset-all-gpus-and-nvswitches"),
    (10004, "NVSWITCH_ERR_HW_HOST_THERMAL_EVENT_START",
     "Host_thermal_event_start", "non-fatal (other-notable)", "check-cooling"),
    (10005, "NVSWITCH_ERR_HW_HOST_THERMAL_EVENT_END",
     "Host_thermal_event_end", "non-fatal (other-notable)", "check-cooling"),
    (11001, "NVSWITCH_ERR_HW_NPORT_INGRESS_CMDDECODEERR", "ingress invalid command", "fatal", "restart-guest-vm"),
    (11004, "NVSWITCH_ERR_HW_NPORT_INGRESS_ACLFAIL",
     "Ingress invalid ACL", "non-fatal", "validate-fabric-partition-routing; restart-guest-vm"),
    (11009, "NVSWITCH_ERR_HW_NPORT_INGRESS_INVALIDVCSET", "ingress invalid VCSet", "fatal", "restart-guest-vm"),
    (11012, "NVSWITCH_ERR_HW_NPORT_INGRESS_NCISOC_HDR_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (11013, "NVSWITCH_ERR_HW_NPORT_INGRESS_NCISOC_HDR_ECC_DBE_ERR", "ingress header DBE", "fatal", "restart-guest-vm"),
    (11018, "NVSWITCH_ERR_HW_NPORT_INGRESS_RIDTAB_ECC_DBE_ERR", "ingress RID DBE", "fatal", "restart-guest-vm"),
    (11019, "NVSWITCH_ERR_HW_NPORT_INGRESS_RLANTAB_ECC_DBE_ERR", "ingress RLAN DBE", "fatal", "restart-guest-vm"),
    (11020, "NVSWITCH_ERR_HW_NPORT_INGRESS_NCISOC_PARITY_ERR", "ingress control parity", "fatal", "restart-guest-vm"),
    (11021, "NVSWITCH_ERR_HW_NPORT_INGRESS_REMAPTAB_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (11022, "NVSWITCH_ERR_HW_NPORT_INGRESS_RIDTAB_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (11023, "NVSWITCH_ERR_HW_NPORT_INGRESS_RLANTAB_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (12001, "NVSWITCH_ERR_HW_NPORT_EGRESS_EGRESSBUFERR", "egress crossbar overflow", "fatal", "restart-guest-vm"),
    (12002, "NVSWITCH_ERR_HW_NPORT_EGRESS_PKTROUTEERR", "egress packet route", "fatal", "restart-guest-vm"),
    (12020, "NVSWITCH_ERR_HW_NPORT_EGRESS_SEQIDERR", "egress sequence ID error", "always-fatal", "restart-host"),
    (12021, "NVSWITCH_ERR_HW_NPORT_EGRESS_NXBAR_HDR_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (12022, "NVSWITCH_ERR_HW_NPORT_EGRESS_NXBAR_HDR_ECC_DBE_ERR",
     "egress input ECC DBE error", "fatal", "restart-guest-vm"),
    (12023, "NVSWITCH_ERR_HW_NPORT_EGRESS_RAM_OUT_HDR_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (12024, "NVSWITCH_ERR_HW_NPORT_EGRESS_RAM_OUT_HDR_ECC_DBE_ERR",
     "egress output ECC DBE error", "fatal", "restart-guest-vm"),
    (12025, "NVSWITCH_ERR_HW_NPORT_EGRESS_NCISOCCREDITOVFL", "egress credit overflow", "fatal", "restart-guest-vm"),
    (12026, "NVSWITCH_ERR_HW_NPORT_EGRESS_REQTGTIDMISMATCHERR",
     "egress destination request ID error", "fatal", "restart-guest-vm"),
    (12027, "NVSWITCH_ERR_HW_NPORT_EGRESS_RSPREQIDMISMATCHERR",
     "egress destination response ID error", "fatal", "restart-guest-vm"),
    (12028, "NVSWITCH_ERR_HW_NPORT_EGRESS_PRIVRSPERR", "egress nonposted PRIV error", "non-fatal", "restart-guest-vm"),
    (12030, "NVSWITCH_ERR_HW_NPORT_EGRESS_NXBAR_HDR_PARITY_ERR",
     "egress control parity error", "fatal", "restart-guest-vm"),
    (12031, "NVSWITCH_ERR_HW_NPORT_EGRESS_NCISOC_CREDIT_PARITY_ERR",
     "egress credit parity error", "fatal", "restart-guest-vm"),
    (12032, "NVSWITCH_ERR_HW_NPORT_EGRESS_NXBAR_FLITTYPE_MISMATCH_ERR",
     "egress flit type mismatch", "fatal", "restart-guest-vm"),
    (14017, "NVSWITCH_ERR_HW_NPORT_TSTATE_ATO_ERR", "TS ATO timeout", "fatal", "restart-guest-vm"),
    (15001, "NVSWITCH_ERR_HW_NPORT_ROUTE_ROUTEBUFERR", "route buffer over/underflow", "fatal", "restart-guest-vm"),
    (15006, "NVSWITCH_ERR_HW_NPORT_ROUTE_TRANSDONERESVERR",
     "route transdone over/underflow", "fatal", "restart-guest-vm"),
    (15008, "NVSWITCH_ERR_HW_NPORT_ROUTE_GLT_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (15009, "NVSWITCH_ERR_HW_NPORT_ROUTE_GLT_ECC_DBE_ERR", "route GLT DBE", "fatal", "restart-guest-vm"),
    (15010, "NVSWITCH_ERR_HW_NPORT_ROUTE_PDCTRLPARERR", "route parity", "fatal", "restart-guest-vm"),
    (15011, "NVSWITCH_ERR_HW_NPORT_ROUTE_NVS_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (15012, "NVSWITCH_ERR_HW_NPORT_ROUTE_NVS_ECC_DBE_ERR", "route incoming DBE", "fatal", "restart-guest-vm"),
    (15013, "NVSWITCH_ERR_HW_NPORT_ROUTE_CDTPARERR", "route credit parity", "fatal", "restart-guest-vm"),
    (19047, "NVSWITCH_ERR_HW_NVLTLC_TX_SYS_NCISOC_HDR_ECC_DBE_ERR",
     "NCISOC HDR ECC DBE Error", "fatal", "restart-guest-vm"),
    (19048, "NVSWITCH_ERR_HW_NVLTLC_TX_SYS_NCISOC_DAT_ECC_DBE_ERR",
     "NCISOC DAT ECC DBE Error", "fatal", "restart-guest-vm"),
    (19049, "NVSWITCH_ERR_HW_NVLTLC_TX_SYS_NCISOC_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (19054, "NVSWITCH_ERR_HW_NVLTLC_RX_SYS_HDR_RAM_ECC_DBE_ERR", "HDR RAM ECC DBE Error", "fatal", "restart-guest-vm"),
    (19055, "NVSWITCH_ERR_HW_NVLTLC_RX_SYS_HDR_RAM_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (19056, "NVSWITCH_ERR_HW_NVLTLC_RX_SYS_DAT0_RAM_ECC_DBE_ERR",
     "DAT0 RAM ECC DBE Error", "fatal", "restart-guest-vm"),
    (19057, "NVSWITCH_ERR_HW_NVLTLC_RX_SYS_DAT0_RAM_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (19058, "NVSWITCH_ERR_HW_NVLTLC_RX_SYS_DAT1_RAM_ECC_DBE_ERR",
     "DAT1 RAM ECC DBE Error", "fatal", "restart-guest-vm"),
    (19059, "NVSWITCH_ERR_HW_NVLTLC_RX_SYS_DAT1_RAM_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (19060, "NVSWITCH_ERR_HW_NVLTLC_TX_LNK_CREQ_RAM_HDR_ECC_DBE_ERR",
     "CREQ RAM HDR ECC DBE Error", "fatal", "restart-guest-vm"),
    (19061, "NVSWITCH_ERR_HW_NVLTLC_TX_LNK_CREQ_RAM_DAT_ECC_DBE_ERR",
     "CREQ RAM DAT ECC DBE Error", "fatal", "restart-guest-vm"),
    (19062, "NVSWITCH_ERR_HW_NVLTLC_TX_LNK_CREQ_RAM_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (19063, "NVSWITCH_ERR_HW_NVLTLC_TX_LNK_RSP_RAM_HDR_ECC_DBE_ERR",
     "Response RAM HDR ECC DBE Error", "fatal", "restart-guest-vm"),
    (19064, "NVSWITCH_ERR_HW_NVLTLC_TX_LNK_RSP_RAM_DAT_ECC_DBE_ERR",
     "Response RAM DAT ECC DBE Error", "fatal", "restart-guest-vm"),
    (19065, "NVSWITCH_ERR_HW_NVLTLC_TX_LNK_RSP_RAM_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (19066, "NVSWITCH_ERR_HW_NVLTLC_TX_LNK_COM_RAM_HDR_ECC_DBE_ERR",
     "COM RAM HDR ECC DBE Error", "fatal", "restart-guest-vm"),
    (19067, "NVSWITCH_ERR_HW_NVLTLC_TX_LNK_COM_RAM_DAT_ECC_DBE_ERR",
     "COM RAM DAT ECC DBE Error", "fatal", "restart-guest-vm"),
    (19068, "NVSWITCH_ERR_HW_NVLTLC_TX_LNK_COM_RAM_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (19069, "NVSWITCH_ERR_HW_NVLTLC_TX_LNK_RSP1_RAM_HDR_ECC_DBE_ERR",
     "RSP1 RAM HDR ECC DBE Error", "fatal", "restart-guest-vm"),
    (19070, "NVSWITCH_ERR_HW_NVLTLC_TX_LNK_RSP1_RAM_DAT_ECC_DBE_ERR",
     "RSP1 RAM DAT ECC DBE Error", "fatal", "restart-guest-vm"),
    (19071, "NVSWITCH_ERR_HW_NVLTLC_TX_LNK_RSP1_RAM_ECC_LIMIT_ERR", "Single bit ECC errors", "non-fatal", "none"),
    (19084, "NVSWITCH_ERR_HW_NVLTLC_RX_LNK_AN1_HEARTBEAT_TIMEOUT_ERR",
     "AN1 Heartbeat Timeout Error", "non-fatal", "reset-all-gpus-and-nvswitches"),
    (20001, "NVSWITCH_ERR_HW_DLPL_TX_REPLAY", "TX Replay Error", "non-fatal", "none"),
    (20012, "NVSWITCH_ERR_HW_DLPL_RX_CRC_COUNTER",
     "Broken/inconsistent connection", "non-fatal", "check-link-mechanicals (unless uncoordinated shutdown)"),
    (20034, "NVSWITCH_ERR_HW_DLPL_LTSSM_FAULT_UP", "LTSSM Fault Up", "fatal", "restart-guest-vm"),
    (22003, "NVSWITCH_ERR_HW_MINION_HALT", "Minion Halt", "always-fatal", "restart-host"),
    (22011, "NVSWITCH_ERR_HW_MINION_EXTERR", "Minion exterror", "always-fatal", "restart-host"),
    (22012, "NVSWITCH_ERR_HW_MINION_FATAL_LINK_INTR",
     "Minion Link NA interrupt", "fatal", "check-link-mechanicals (unless uncoordinated shutdown)"),
    (22013, "NVSWITCH_ERR_HW_MINION_NONFATAL", "Minion Link DLREQ interrupt", "non-fatal", "none"),
    (23001, "NVSWITCH_ERR_HW_NXBAR_TILE_INGRESS_BUFFER_OVERFLOW",
     "ingress SRC-VC buffer overflow", "always-fatal", "restart-host"),
    (23002, "NVSWITCH_ERR_HW_NXBAR_TILE_INGRESS_BUFFER_UNDERFLOW",
     "ingress SRC-VC buffer underflow", "always-fatal", "restart-host"),
    (23003, "NVSWITCH_ERR_HW_NXBAR_TILE_EGRESS_CREDIT_OVERFLOW",
     "egress DST-VC credit overflow", "always-fatal", "restart-host"),
    (23004, "NVSWITCH_ERR_HW_NXBAR_TILE_EGRESS_CREDIT_UNDERFLOW",
     "egress DST-VC credit underflow", "always-fatal", "restart-host"),
    (23005, "NVSWITCH_ERR_HW_NXBAR_TILE_INGRESS_NON_BURSTY_PKT",
     "ingress packet burst error", "always-fatal", "restart-host"),
    (23006, "NVSWITCH_ERR_HW_NXBAR_TILE_INGRESS_NON_STICKY_PKT",
     "ingress packet sticky error", "always-fatal", "restart-host"),
    (23007, "NVSWITCH_ERR_HW_NXBAR_TILE_INGRESS_BURST_GT_9_DATA_VC",
     "possible bubbles at ingress", "always-fatal", "restart-host"),
    (23008, "NVSWITCH_ERR_HW_NXBAR_TILE_INGRESS_PKT_INVALID_DST",
     "ingress packet invalid dst error", "always-fatal", "restart-host"),
    (23009, "NVSWITCH_ERR_HW_NXBAR_TILE_INGRESS_PKT_PARITY_ERROR",
     "ingress packet parity error", "always-fatal", "restart-host"),
    (23010, "NVSWITCH_ERR_HW_NXBAR_TILEOUT_INGRESS_BUFFER_OVERFLOW",
     "ingress SRC-VC buffer overflow", "always-fatal", "restart-host"),
    (23011, "NVSWITCH_ERR_HW_NXBAR_TILEOUT_INGRESS_BUFFER_UNDERFLOW",
     "ingress SRC-VC buffer underflow", "always-fatal", "restart-host"),
    (23012, "NVSWITCH_ERR_HW_NXBAR_TILEOUT_EGRESS_CREDIT_OVERFLOW",
     "egress DST-VC credit overflow", "always-fatal", "restart-host"),
    (23013, "NVSWITCH_ERR_HW_NXBAR_TILEOUT_EGRESS_CREDIT_UNDERFLOW",
     "egress DST-VC credit underflow", "always-fatal", "restart-host"),
    (23014, "NVSWITCH_ERR_HW_NXBAR_TILEOUT_INGRESS_NON_BURSTY_PKT",
     "ingress packet burst error", "always-fatal", "restart-host"),
    (23015, "NVSWITCH_ERR_HW_NXBAR_TILEOUT_INGRESS_NON_STICKY_PKT",
     "ingress packet sticky error", "always-fatal", "restart-host"),
    (23016, "NVSWITCH_ERR_HW_NXBAR_TILEOUT_INGRESS_BURST_GT_9_DATA_VC",
     "possible bubbles at ingress", "always-fatal", "restart-host"),
    (23017, "NVSWITCH_ERR_HW_NXBAR_TILEOUT_EGRESS_CDT_PARITY_ERROR",
     "ingress credit parity error", "always-fatal", "restart-host"),
    (24001, "NVSWITCH_ERR_HW_NPORT_SOURCETRACK_CREQ_TCEN0_CRUMBSTORE_ECC_LIMIT_ERR",
     "Single bit ECC errors", "non-fatal", "none"),
    (24002, "NVSWITCH_ERR_HW_NPORT_SOURCETRACK_CREQ_TCEN0_TD_CRUMBSTORE_ECC_LIMIT_ERR",
     "Single bit ECC errors", "non-fatal", "none"),
    (24003, "NVSWITCH_ERR_HW_NPORT_SOURCETRACK_CREQ_TCEN1_CRUMBSTORE_ECC_LIMIT_ERR",
     "Single bit ECC errors", "non-fatal", "none"),
    (24004, "NVSWITCH_ERR_HW_NPORT_SOURCETRACK_CREQ_TCEN0_CRUMBSTORE_ECC_DBE_ERR",
     "sourcetrack TCEN0 crubmstore DBE", "fatal", "restart-guest-vm"),
    (24005, "NVSWITCH_ERR_HW_NPORT_SOURCETRACK_CREQ_TCEN0_TD_CRUMBSTORE_ECC_DBE_ERR",
     "sourcetrack TCEN0 TD crubmstore DBE", "fatal", "restart-guest-vm"),
    (24006, "NVSWITCH_ERR_HW_NPORT_SOURCETRACK_CREQ_TCEN1_CRUMBSTORE_ECC_DBE_ERR",
     "sourcetrack TCEN1 crubmstore DBE", "fatal", "restart-guest-vm"),
    (24007, "NVSWITCH_ERR_HW_NPORT_SOURCETRACK_SOURCETRACK_TIME_OUT_ERR",
     "sourcetrack timeout error", "fatal", "restart-guest-vm"),
)


def rated_sxid(fatality: str, token: str) -> tuple[Severity, Action]:
    """nodehealth's rating of a Fabric Manager guide row, before deliberate differences."""
    if fatality == "always-fatal":
        return _F, _REBOOT  # the guide asks for a host restart
    fatal = fatality.startswith("fatal")
    if token.startswith(("check-link-mechanicals", "check-cooling")):
        return (_F if fatal else _D), _HW
    if token.startswith("validate-fabric-partition-routing"):
        return _D, _CONFIG
    if fatal:
        return _F, _RESET  # reset the GPUs and switches of the partition (or restart its VM)
    if token.startswith("reset-all"):
        return _D, _RESET
    return _W, _NONE


# Where nodehealth deliberately rates an SXid otherwise than the guide: (severity, action, why).
DELIBERATE_SXID_DIFFERENCES: dict[int, tuple[Severity, Action, str]] = {
    10005: (_I, _NONE, "the end of a thermal event: SXid 10004 already reported its start"),
    12028: (_F, _RESET, "non-fatal in the guide, but NVSentinel resets the fabric on it (RESET_FABRIC)"),
    19084: (_F, _RESET, "non-fatal in the guide, whose own recovery resets every GPU and switch"),
    22013: (_I, _NONE, "a non-fatal link controller interrupt with no action in the guide"),
}

# Our words for the SXids operators meet most.
_OUR_SXID_WORDS: dict[int, tuple[str, str]] = {
    10004: ("SXid10004Thermal", "the switch reported a thermal event; check its cooling"),
    11004: ("SXid11004AclError",
            "traffic broke the switch's access control rules, usually a Fabric Manager configuration problem"),
    12028: ("SXid12028PrivResponseError",
            "an egress non-posted PRIV response error; the fabric (GPUs and switches together) needs a reset"),
    19084: ("SXid19084An1Heartbeat",
            "the switch missed its heartbeat; the fabric (GPUs and switches together) needs a reset"),
    20034: ("SXid20034LtssmFaultUp",
            "a switch port's link left its active state, so the GPU behind it lost its fabric link"),
    22013: ("SXid22013MinionNonFatal", "a non-fatal interrupt from a link controller (MINION); informational"),
    24007: ("SXid24007SourceTrackTimeout", "a request through the switch timed out"),
}

_FATALITY_WORDS = {"non-fatal": "non-fatal", "fatal": "fatal to the partition", "always-fatal": "fatal to the host"}

# Codes not in the guide that nodehealth rates anyway (seen in the field and in gpud's table).
_EXTRA_SXIDS = (
    SxidInfo(20009, "RX_SHORT_ERROR_RATE", "SXid20009RxShortErrorRate", _D, _HW, "",
             "a switch link sees a high short-term receive error rate; check its mechanical connection"),
    SxidInfo(28006, "MC_TS_CRUMBSTORE_MCTO", "SXid28006CrumbstoreTimeout", _W, _NONE, "",
             "a non-fatal multicast crumbstore timeout"),
    # The switch's SOE micro-controller, rated by NVIDIA's NVSwitch error table (NVSentinel
    # sxiderrorsmapping.csv @6f8b0fcf): SOE_HALT and SOE_EXTERR RESET_FABRIC/FATAL, SOE_WATCHDOG IGNORE/NONFATAL.
    # Their lines carry no Fatal/Non-fatal word, so the table is all there is.
    SxidInfo(26006, "NVSWITCH_ERR_HW_SOE_HALT", "SXid26006SoeHalt", _F, _RESET, "",
             "the switch's SOE micro-controller halted; the fabric (GPUs and switches together) needs a reset"),
    SxidInfo(26007, "NVSWITCH_ERR_HW_SOE_EXTERR", "SXid26007SoeExternalError", _F, _RESET, "",
             "the switch's SOE micro-controller reported an external error; the fabric needs a reset"),
    SxidInfo(26008, "NVSWITCH_ERR_HW_SOE_WATCHDOG", "SXid26008SoeWatchdog", _I, _NONE, "",
             "the switch's SOE watchdog fired; informational in NVIDIA's table"),
)


def _sxid_info(code: int, enum: str, name: str, fatality: str, token: str) -> SxidInfo:
    table = fatality.split(" (")[0]
    severity, action = rated_sxid(table, token)
    if code in DELIBERATE_SXID_DIFFERENCES:
        severity, action, _ = DELIBERATE_SXID_DIFFERENCES[code]
    reason, meaning = _OUR_SXID_WORDS.get(code) or (
        f"SXid{code}{_camel(name)}", f"{name} ({_FATALITY_WORDS[table]} in the guide)")
    return SxidInfo(code, enum, reason, severity, action, token, meaning, table)


SXID_CATALOG: dict[int, SxidInfo] = {row[0]: _sxid_info(*row) for row in _FM_GUIDE_SXIDS}
SXID_CATALOG.update({info.code: info for info in _EXTRA_SXIDS})

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


# docs/sources.md, "Xid recovery actions": what Xid 154 asks for. DRAIN_AND_RESET is fatal rather than
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
