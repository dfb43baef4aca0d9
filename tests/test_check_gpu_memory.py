from __future__ import annotations

import pytest

from nodehealth.checks import gpu_memory as check
from nodehealth.collectors.gpu_facts import EccCounts, Gpu, NvmlFacts, RemappedRows, RetiredPages
from nodehealth.model import Action, Observed, Severity

BUS = "0000:19:00.0"
UUID = "GPU-8f3c"
H100 = "NVIDIA H100 80GB HBM3"
FATAL, DEGRADED, WARNING, UNKNOWN = Severity.FATAL, Severity.DEGRADED, Severity.WARNING, Severity.UNKNOWN


def gpu(**fields) -> Gpu:
    base = dict(index=0, uuid=UUID, name=H100, pci_bus_id=BUS, ecc_enabled=True, ecc_pending=True,
                ecc=EccCounts(0, 0, 0, 0), remapped_rows=RemappedRows(0, 0, False, False))
    base.update(fields)
    return Gpu(**base)


def rows(correctable=0, uncorrectable=0, pending=False, failure=False) -> RemappedRows:
    return RemappedRows(correctable, uncorrectable, pending, failure)


def judge(*gpus, rates=None, **cfg):
    facts = NvmlFacts("test", "535.154.05", "12.2", len(gpus), tuple(gpus))
    obs = Observed({"nvml": facts}, {"nvml": rates} if rates is not None else {})
    return check.judge(obs, dict(check.DEFAULTS, **cfg))


def summary(findings):
    return [(f.reason, f.severity, f.action) for f in findings]


CORRECTED = f"{UUID}:ecc_volatile_corrected"

CASES = [
    # (name, gpu, rates, expected)
    ("healthy", gpu(), {}, []),
    ("nothing known", gpu(ecc=None, ecc_enabled=None, remapped_rows=None), None, []),
    ("an uncorrectable error since the last reset", gpu(ecc=EccCounts(5, 1, 5, 1)), None,
     [("EccUncorrectableErrors", FATAL, Action.RESET_GPU)]),
    ("lifetime uncorrectable errors alone are history", gpu(ecc=EccCounts(0, 0, 10, 3)), None, []),
    ("volatile uncorrected unknown", gpu(ecc=EccCounts(None, None, 10, 3)), None, []),
    ("corrected at the limit", gpu(), {CORRECTED: 10.0}, []),
    ("corrected above the limit", gpu(), {CORRECTED: 10.5},
     [("EccCorrectedErrorRateHigh", WARNING, Action.NONE)]),
    ("corrected, first pass: no rate", gpu(ecc=EccCounts(10**9, 0, 10**9, 0)), None, []),
    ("ECC off on a data-center GPU", gpu(ecc_enabled=False, ecc_pending=False), None,
     [("EccDisabled", WARNING, Action.FIX_CONFIG)]),
    ("ECC off on a GeForce card is its normal state", gpu(name="NVIDIA GeForce RTX 4090", ecc_enabled=False),
     None, []),
    ("ECC mode unknown (NotSupported)", gpu(ecc_enabled=None), None, []),
    ("row remap pending", gpu(remapped_rows=rows(1, 0, pending=True)), None,
     [("RowRemapPending", DEGRADED, Action.RESET_GPU)]),
    ("row remap failed", gpu(remapped_rows=rows(0, 8, failure=True)), None,
     [("RowRemapFailure", FATAL, Action.HW_INSPECTION)]),
    ("one row short of the spares limit", gpu(remapped_rows=rows(0, 511)), None, []),
    ("spare rows used up", gpu(remapped_rows=rows(0, 512)), None,
     [("RemappedRowsExhausted", DEGRADED, Action.HW_INSPECTION)]),
    ("used up and failed: the failure says it all", gpu(remapped_rows=rows(0, 512, failure=True)), None,
     [("RowRemapFailure", FATAL, Action.HW_INSPECTION)]),
    ("failed with a remap still pending", gpu(remapped_rows=rows(0, 3, pending=True, failure=True)), None,
     [("RowRemapFailure", FATAL, Action.HW_INSPECTION), ("RowRemapPending", DEGRADED, Action.RESET_GPU)]),
    ("retired pages below the limit", gpu(name="Tesla V100-SXM2-16GB", retired_pages=RetiredPages(40, 22, False)),
     None, []),
    ("retired pages at the limit", gpu(name="Tesla V100-SXM2-16GB", retired_pages=RetiredPages(40, 23, False)),
     None, [("RetiredPagesLimit", FATAL, Action.HW_INSPECTION)]),
    ("retired pages, one count unknown", gpu(retired_pages=RetiredPages(None, 63, None)), None,
     [("RetiredPagesLimit", FATAL, Action.HW_INSPECTION)]),
    ("retired pages unknown", gpu(retired_pages=RetiredPages(None, None, None)), None, []),
    ("retirement pending", gpu(retired_pages=RetiredPages(1, 0, True)), None,
     [("PageRetirementPending", DEGRADED, Action.RESET_GPU)]),
    ("remapped rows did not answer", gpu(remapped_rows=None, unknown={"remapped_rows": "Timeout"}), None,
     [("GpuFactsUnknown", UNKNOWN, Action.NONE)]),
    ("another check's group is not this check's business", gpu(unknown={"nvlink": "Timeout"}), None, []),
]


@pytest.mark.parametrize("name, g, rates, expected", CASES, ids=[c[0] for c in CASES])
def test_rules(name, g, rates, expected):
    assert summary(judge(g, rates=rates)) == expected


def test_uncorrectable_message_names_the_gpu_the_count_and_the_fix():
    (f,) = judge(gpu(index=3, ecc=EccCounts(0, 2, 0, 7)))
    assert f.device == BUS
    assert f.message.startswith(f"GPU 3 ({BUS}) had 2 uncorrectable ECC memory error(s)")
    assert "nvidia-smi -r" in f.message
    assert f.evidence == {"volatile_uncorrected": 2, "aggregate_uncorrected": 7}


def test_corrected_rate_message_and_threshold_setting():
    (f,) = judge(gpu(ecc=EccCounts(3000, 0, 3000, 0)), rates={CORRECTED: 25.0})
    assert "25 single-bit ECC memory errors per second (limit 10; 3000 since the driver loaded)" in f.message
    assert judge(gpu(), rates={CORRECTED: 25.0}, corrected_errors_per_second=50.0) == []


def test_rate_key_falls_back_to_the_index_without_a_uuid():
    assert summary(judge(gpu(uuid=None, index=2), rates={"2:ecc_volatile_corrected": 100.0})) == [
        ("EccCorrectedErrorRateHigh", WARNING, Action.NONE)]


def test_ecc_message_says_whether_a_reboot_turns_it_on():
    (pending,) = judge(gpu(ecc_enabled=False, ecc_pending=True))
    (off,) = judge(gpu(ecc_enabled=False, ecc_pending=False))
    assert "come on at the next reboot" in pending.message
    assert "nvidia-smi -e 1" in off.message


def test_device_falls_back_to_the_uuid():
    (f,) = judge(gpu(pci_bus_id=None, remapped_rows=rows(pending=True)))
    assert f.device == UUID


def test_each_gpu_is_judged_on_its_own():
    bad = gpu(index=1, uuid="GPU-2", pci_bus_id="0000:2a:00.0", remapped_rows=rows(0, 1, pending=True))
    findings = judge(gpu(), bad)
    assert [(f.reason, f.device) for f in findings] == [("RowRemapPending", "0000:2a:00.0")]


def test_limits_are_settings():
    g = gpu(remapped_rows=rows(0, 100))
    assert judge(g) == []
    assert summary(judge(g, uncorrectable_remapped_rows=100)) == [
        ("RemappedRowsExhausted", DEGRADED, Action.HW_INSPECTION)]
    assert summary(judge(gpu(retired_pages=RetiredPages(5, 5, False)), retired_pages=10)) == [
        ("RetiredPagesLimit", FATAL, Action.HW_INSPECTION)]
