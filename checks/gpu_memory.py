"""GPU memory health: ECC errors, row remapping (Ampere and later) and page retirement (Volta and older).

Verdicts follow docs/sources.md, "GPU memory verdicts": an uncorrectable error or a failed
repair takes the GPU out of service; a repair that waits for the next reset makes it degraded.
"""
from __future__ import annotations

from nodehealth.checks.gpu_sku import FACTS_UNKNOWN, device_of, match_sku, unknown_findings
from nodehealth.collectors.gpu_facts import Gpu, rate_key
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "gpu_memory"
NEEDS = ("nvml",)
SUBSYSTEM = "gpu"
DEBOUNCE = False
DEFAULTS: dict = {
    # Corrected (single-bit) ECC errors per second that make a warning. At 10 per second a GPU reaches
    # 20,000,000 corrected errors, where aznhc fails a GPU, in about 23 days; DCGM's SBE-rate limit
    # is also 10 (a placeholder there). A healthy GPU corrects close to none.
    "corrected_errors_per_second": 10.0,
    # Uncorrectable remapped rows at which the GPU has used up its spare rows: DCGM warns and aznhc fails
    # there, and NVML sets the remap-failure flag at the next remap attempt.
    "uncorrectable_remapped_rows": 512,
    # Pages retired (single- plus double-bit) at which the table is full: DCGM's MAX_RETIRED_PAGES.
    "retired_pages": 63,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "corrected_errors_per_second": "corrected ECC errors per second that make a warning",
    "uncorrectable_remapped_rows": ("remapped rows (for uncorrectable errors) at which the spare rows are used up "
                                    "(degraded)"),
    "retired_pages": "retired pages at which the retirement table is full (fatal; pre-Ampere GPUs)",
}
SOURCE = "NVML"
FINDS = ("volatile uncorrectable ECC errors (fatal, reset the GPU), a high corrected rate, ECC off, row remap "
         "pending (reset at idle) or failed (RMA candidate), remapped rows used up, retired pages at NVIDIA's limit "
         "(pre-Ampere)")
REASONS = {
    "EccUncorrectableErrors": Reason(Severity.FATAL, Action.RESET_GPU,
                                     "volatile uncorrectable ECC errors since the driver loaded: drain, then reset "
                                     "the GPU"),
    "EccCorrectedErrorRateHigh": Reason(Severity.WARNING, Action.NONE,
                                        "corrected ECC errors over `corrected_errors_per_second` (10)"),
    "EccDisabled": Reason(Severity.WARNING, Action.FIX_CONFIG,
                          "ECC is off on a data-center GPU: `nvidia-smi -e 1` and reboot"),
    "RowRemapFailure": Reason(Severity.FATAL, Action.HW_INSPECTION,
                              "a row remap failed: bad memory stays in use; RMA candidate"),
    "RowRemapPending": Reason(Severity.DEGRADED, Action.RESET_GPU,
                              "a row remap waits for the next GPU reset: reset it when idle"),
    "RemappedRowsExhausted": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                                    "`uncorrectable_remapped_rows` (512) rows remapped: no spare rows left"),
    "RetiredPagesLimit": Reason(Severity.FATAL, Action.HW_INSPECTION,
                                "`retired_pages` (63) pages retired (pre-Ampere): the table is full"),
    "PageRetirementPending": Reason(Severity.DEGRADED, Action.RESET_GPU,
                                    "a page retirement waits for the next GPU reset or driver reload"),
    "GpuFactsUnknown": FACTS_UNKNOWN,
}

# Fact groups (the collector's names in Gpu.unknown) this check reads; "all": the GPU did not answer at all.
GROUPS = ("all", "ecc", "remapped_rows", "retired_pages")


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    findings: list[Finding] = []
    for gpu in obs.facts["nvml"].gpus:
        findings += unknown_findings(NAME, gpu, GROUPS)
        findings += _ecc(gpu, obs, cfg)
        findings += _ecc_mode(gpu)
        findings += _remapped_rows(gpu, cfg)
        findings += _retired_pages(gpu, cfg)
    return findings


def _finding(gpu: Gpu, severity: Severity, reason: str, message: str, action: Action, **evidence) -> Finding:
    return Finding(NAME, severity, reason, message, device=device_of(gpu), action=action, evidence=evidence)


def _ecc(gpu: Gpu, obs: Observed, cfg: dict) -> list[Finding]:
    out: list[Finding] = []
    ecc = gpu.ecc
    if ecc is not None and ecc.volatile_uncorrected is not None and ecc.volatile_uncorrected > 0:
        out.append(_finding(
            gpu, Severity.FATAL, "EccUncorrectableErrors",
            f"{gpu.label} had {ecc.volatile_uncorrected} uncorrectable ECC memory error(s) since the driver "
            "loaded or the GPU was last reset: data in GPU memory was lost and the work on it may be wrong; "
            "drain the GPU, record the counters, then reset it (nvidia-smi -r) so the driver can repair the memory.",
            Action.RESET_GPU, volatile_uncorrected=ecc.volatile_uncorrected,
            aggregate_uncorrected=ecc.aggregate_uncorrected))
    rate = obs.rate("nvml", rate_key(gpu, "ecc_volatile_corrected"))
    limit = cfg["corrected_errors_per_second"]
    if rate is not None and rate > limit:
        total = ecc.volatile_corrected if ecc is not None else None
        out.append(_finding(
            gpu, Severity.WARNING, "EccCorrectedErrorRateHigh",
            f"{gpu.label} corrects {rate:.3g} single-bit ECC memory errors per second (limit {limit:g}; "
            f"{_count(total)} since the driver loaded): the memory is wearing and uncorrectable errors "
            "often follow; watch its row remapping and plan a field diagnostic (dcgmi diag -r 3).",
            Action.NONE, per_second=rate, volatile_corrected=total))
    return out


def _ecc_mode(gpu: Gpu) -> list[Finding]:
    """ECC off on a data-center GPU (one in the SKU table): memory errors go unnoticed and corrupt results."""
    if gpu.ecc_enabled is not False or match_sku(gpu.name) is None:
        return []
    after_reboot = ("it is set to come on at the next reboot" if gpu.ecc_pending
                    else "turn it on with 'nvidia-smi -e 1' and reboot")
    return [_finding(
        gpu, Severity.WARNING, "EccDisabled",
        f"{gpu.label} ({gpu.name}) runs with ECC memory protection off: memory errors go undetected and silently "
        f"corrupt results; {after_reboot}.",
        Action.FIX_CONFIG, ecc_enabled=False, ecc_pending=gpu.ecc_pending)]


def _remapped_rows(gpu: Gpu, cfg: dict) -> list[Finding]:
    rows = gpu.remapped_rows
    if rows is None:
        return []
    evidence = {"correctable": rows.correctable, "uncorrectable": rows.uncorrectable, "pending": rows.pending,
                "failure": rows.failure}
    counts = f"{rows.uncorrectable} uncorrectable and {rows.correctable} correctable rows remapped"
    out: list[Finding] = []
    if rows.failure:
        out.append(_finding(
            gpu, Severity.FATAL, "RowRemapFailure",
            f"{gpu.label} could not remap a failing memory row ({counts}): the bad memory stays in use; "
            "drain the node and run the field diagnostic, the GPU is an RMA candidate.",
            Action.HW_INSPECTION, **evidence))
    if rows.pending:
        out.append(_finding(
            gpu, Severity.DEGRADED, "RowRemapPending",
            f"{gpu.label} has a memory row remap waiting for the next GPU reset ({counts}): running work may go on, "
            "but the failing row stays in use until then; reset the GPU (nvidia-smi -r) when it is idle.",
            Action.RESET_GPU, **evidence))
    limit = cfg["uncorrectable_remapped_rows"]
    if rows.uncorrectable >= limit and not rows.failure:
        out.append(_finding(
            gpu, Severity.DEGRADED, "RemappedRowsExhausted",
            f"{gpu.label} has remapped {rows.uncorrectable} rows for uncorrectable errors (limit {limit}): its "
            "spare rows are used up and the next failing row cannot be repaired; have it inspected and plan "
            "a replacement.",
            Action.HW_INSPECTION, limit=limit, **evidence))
    return out


def _retired_pages(gpu: Gpu, cfg: dict) -> list[Finding]:
    pages = gpu.retired_pages
    if pages is None:
        return []
    evidence = {"single_bit": pages.single_bit, "double_bit": pages.double_bit, "pending": pages.pending}
    out: list[Finding] = []
    known = [n for n in (pages.single_bit, pages.double_bit) if n is not None]
    limit = cfg["retired_pages"]
    if known and sum(known) >= limit:
        out.append(_finding(
            gpu, Severity.FATAL, "RetiredPagesLimit",
            f"{gpu.label} has retired {sum(known)} memory pages ({_count(pages.single_bit)} for repeated "
            f"single-bit and {_count(pages.double_bit)} for double-bit errors; limit {limit}): its retirement "
            "table is full and further bad pages stay in use; drain the node and have the GPU replaced.",
            Action.HW_INSPECTION, limit=limit, **evidence))
    if pages.pending:
        out.append(_finding(
            gpu, Severity.DEGRADED, "PageRetirementPending",
            f"{gpu.label} has a memory page retirement waiting for the next GPU reset or driver reload: the bad "
            "page stays in use until then; reset the GPU (nvidia-smi -r) or reboot when it is idle.",
            Action.RESET_GPU, **evidence))
    return out


def _count(n: int | None) -> str:
    return "an unknown number" if n is None else str(n)
