"""The thp check (settings known to stall, compaction stall rate, fault fallback): table-driven, no files."""
from __future__ import annotations

import pytest

from nodehealth.checks import thp
from nodehealth.collectors.vm import Meminfo, ThpSettings, Vm
from nodehealth.engine import run_check
from nodehealth.model import Action, CollectorResult, Observed, Severity


def judge(enabled=None, defrag=None, rates=None, **cfg):
    facts = Vm(ThpSettings(enabled=enabled, defrag=defrag), {}, Meminfo())
    obs = Observed({"vm": facts}, {"vm": rates} if rates is not None else {})
    return thp.judge(obs, {**thp.DEFAULTS, **cfg})


SETTINGS_CASES = [
    # enabled, defrag, compact_stall per second (None: no rate yet), expected
    ("always", "always", None, ("ThpDefragAlways", Severity.WARNING)),
    ("always", "always", 0.0, ("ThpDefragAlways", Severity.WARNING)),
    ("always", "always", 1.0, ("ThpDefragAlways", Severity.WARNING)),  # at the threshold, not over it
    ("always", "always", 1.01, ("ThpCompactionStalls", Severity.DEGRADED)),
    ("always", "always", 250.0, ("ThpCompactionStalls", Severity.DEGRADED)),
    ("always", "defer+madvise", 250.0, None),
    ("always", "madvise", 250.0, None),
    ("always", "defer", None, None),
    ("always", "never", None, None),
    ("madvise", "always", 250.0, None),
    ("never", "always", 250.0, None),
    ("defer", "always", 250.0, None),  # a future enabled mode is not the known-bad pairing
    ("always", None, 250.0, None),  # defrag file absent
    (None, None, 250.0, None),  # kernel without THP
]


@pytest.mark.parametrize("enabled, defrag, stalls, expected", SETTINGS_CASES)
def test_settings_and_stall_rate(enabled, defrag, stalls, expected):
    rates = None if stalls is None else {"compact_stall": stalls}
    findings = judge(enabled, defrag, rates)
    assert [(f.reason, f.severity) for f in findings] == ([expected] if expected else [])
    for f in findings:
        assert f.check == "thp" and f.action is Action.FIX_CONFIG
        assert "defer+madvise" in f.message and "/sys/kernel/mm/transparent_hugepage/defrag" in f.message


def test_stall_message_has_the_rate():
    [f] = judge("always", "always", {"compact_stall": 12.34})
    assert "12.3 times per second (threshold 1)" in f.message
    assert f.evidence == {"enabled": "always", "defrag": "always", "compact_stall_per_second": 12.34}


def test_stall_threshold_from_config():
    [f] = judge("always", "always", {"compact_stall": 12.0}, compact_stall_per_second=20.0)
    assert f.reason == "ThpDefragAlways"


FALLBACK_CASES = [
    # thp_fault_alloc/s, thp_fault_fallback/s, expected
    (None, None, None),
    (5.0, None, None),  # a kernel without the counter: absent, not 0
    (None, 5.0, None),
    (0.2, 0.5, None),  # fewer than 1 THP fault per second: too few to judge
    (0.0, 0.0, None),
    (1.0, 1.0, None),  # ratio exactly 0.5 is not over it
    (1.0, 1.5, ("ThpFaultFallbackHigh", Severity.INFO)),
    (0.0, 3.0, ("ThpFaultFallbackHigh", Severity.INFO)),
    (10.0, 0.0, None),
]


@pytest.mark.parametrize("allocated, fell_back, expected", FALLBACK_CASES)
def test_fault_fallback(allocated, fell_back, expected):
    rates = {k: v for k, v in (("thp_fault_alloc", allocated), ("thp_fault_fallback", fell_back)) if v is not None}
    findings = judge("madvise", "madvise", rates)
    assert [(f.reason, f.severity) for f in findings] == ([expected] if expected else [])


def test_fallback_message_and_evidence():
    [f] = judge("madvise", "madvise", {"thp_fault_alloc": 1.0, "thp_fault_fallback": 3.0})
    assert f.message.startswith("75% of transparent huge page faults fell back to 4 KiB pages (3.0 of 4.0 per second)")
    assert "compact_memory" in f.message
    assert f.evidence == {"fallback_ratio": 0.75, "thp_faults_per_second": 4.0}
    assert f.action is Action.NONE


@pytest.mark.parametrize("cfg, expected", [
    ({"fallback_ratio": 0.8}, []),
    ({"min_thp_faults_per_second": 5.0}, []),
    ({}, ["ThpFaultFallbackHigh"]),
])
def test_fallback_thresholds_from_config(cfg, expected):
    rates = {"thp_fault_alloc": 1.0, "thp_fault_fallback": 3.0}
    assert [f.reason for f in judge("madvise", "madvise", rates, **cfg)] == expected


def test_both_findings_at_once():
    rates = {"compact_stall": 40.0, "thp_fault_alloc": 2.0, "thp_fault_fallback": 8.0}
    assert [f.reason for f in judge("always", "always", rates)] == ["ThpCompactionStalls", "ThpFaultFallbackHigh"]


def test_declarations():
    assert thp.NEEDS == ("vm",) and thp.DEBOUNCE is True
    assert set(thp.DEFAULTS) == {"compact_stall_per_second", "fallback_ratio", "min_thp_faults_per_second"}


def test_failed_collector_makes_the_check_unknown():
    results = {"vm": CollectorResult("vm", supported=True, success=False, error="bad line")}
    [f] = run_check(thp, results, Observed({}), dict(thp.DEFAULTS))
    assert (f.severity, f.reason) == (Severity.UNKNOWN, "CollectorFailed")
