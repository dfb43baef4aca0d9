"""collectors/edac.py and checks/edac.py on EDAC sysfs trees in both layouts (dimmN/ and the legacy
csrowN/chK_*), written in the kernel's layout (Documentation/admin-guide/ras.rst)."""
from __future__ import annotations

import os

from conftest import MACHINES_DIR

from nodehealth.checks import edac as edac_check
from nodehealth.collectors import edac
from nodehealth.host import HostPaths
from nodehealth.model import Action, Observed, Severity


def write(root, path, value):
    full = os.path.join(root, "sys", "devices", "system", "edac", "mc", path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(f"{value}\n")


def judge(facts, **cfg):
    return edac_check.judge(Observed({"edac": facts}), dict(edac_check.DEFAULTS, **cfg))


def test_fixture_machine_dimms_with_labels_and_an_absent_counter():
    host = HostPaths(os.path.join(MACHINES_DIR, "host-faults"))
    assert edac.supported(host, {}) is None
    facts = edac.collect(host, {})
    assert [c.name for c in facts.controllers] == ["mc0", "mc1"]
    mc0, mc1 = facts.controllers
    assert mc1.mc_name == "Intel_10nm Socket#0 IMC#1" and mc1.ce_count == 262
    assert mc0.dimms[1].ce_count is None and mc0.dimms[1].ue_count == 0  # unreadable is absent, not 0
    [f] = judge(facts)
    assert (f.severity, f.action, f.reason, f.device) == (Severity.DEGRADED, Action.HW_INSPECTION,
                                                          "MemoryCorrectedErrorsHigh", "mc1/dimm1")
    assert "CPU_SrcID#0_MC#1_Chan#1_DIMM#0" in f.message and f.evidence["corrected"] == 262


def test_uncorrected_is_fatal_and_few_corrected_a_warning(tmp_path):
    root = str(tmp_path)
    write(root, "mc0/ce_count", 3)
    write(root, "mc0/ue_count", 1)
    write(root, "mc0/dimm0/dimm_label", "P1_DIMM_A1")
    write(root, "mc0/dimm0/dimm_ce_count", 3)
    write(root, "mc0/dimm0/dimm_ue_count", 0)
    write(root, "mc0/dimm1/dimm_label", "P1_DIMM_B1")
    write(root, "mc0/dimm1/dimm_ce_count", 0)
    write(root, "mc0/dimm1/dimm_ue_count", 1)
    findings = judge(edac.collect(HostPaths(root), {}))
    assert [(f.device, f.severity, f.reason) for f in findings] == [
        ("mc0/dimm0", Severity.WARNING, "MemoryCorrectedErrors"),
        ("mc0/dimm1", Severity.FATAL, "MemoryUncorrectableErrors")]
    assert "P1_DIMM_B1" in findings[1].message
    assert judge(edac.collect(HostPaths(root), {}), corrected_limit=3)[0].severity is Severity.DEGRADED


def test_legacy_csrow_layout(tmp_path):
    root = str(tmp_path)
    write(root, "mc0/ce_count", 11)
    write(root, "mc0/ue_count", 0)
    write(root, "mc0/csrow0/ce_count", 11)
    write(root, "mc0/csrow0/ch0_ce_count", 11)
    write(root, "mc0/csrow0/ch0_dimm_label", "CPU#0Channel#0_DIMM#0")
    write(root, "mc0/csrow0/ch1_ce_count", 0)
    facts = edac.collect(HostPaths(root), {})
    assert [(d.name, d.label, d.ce_count) for d in facts.controllers[0].dimms] == [
        ("csrow0/ch0", "CPU#0Channel#0_DIMM#0", 11), ("csrow0/ch1", "", 0)]
    [f] = judge(facts)
    assert (f.device, f.severity) == ("mc0/csrow0/ch0", Severity.DEGRADED)


def test_garbage_counters_are_absent_and_no_edac_is_unsupported(tmp_path):
    root = str(tmp_path)
    assert "no EDAC memory controllers" in edac.supported(HostPaths(root), {})
    write(root, "mc0/ce_count", "x" * 50)
    write(root, "mc0/ue_count", 99999999999999999999999)
    facts = edac.collect(HostPaths(root), {})
    assert (facts.controllers[0].ce_count, facts.controllers[0].ue_count) == (None, None)
    assert judge(facts) == []
    assert [m.samples for m in edac.metrics(facts)] == [[], []]  # absent counters export no sample, not 0
