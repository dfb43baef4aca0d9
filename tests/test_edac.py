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


EDAC_FIXTURES = os.path.join(os.path.dirname(MACHINES_DIR), "edac")


def test_legacy_csrow_tree_counts_a_rows_uncorrectable_errors():
    """A host with only csrowN/ (ras.rst): a UE is counted per row, not per channel, and must not read healthy."""
    facts = edac.collect(HostPaths(os.path.join(EDAC_FIXTURES, "legacy-csrow")), {})
    [mc0] = facts.controllers
    assert [(r.name, r.ce_count, r.ue_count, r.labels) for r in mc0.csrows] == [
        ("csrow0", 0, 0, ("DIMM_A0", "DIMM_B0")), ("csrow2", 3, 1, ("DIMM_A1", "DIMM_B1")),
        ("csrow3", 0, 0, ("DIMM_A1", "DIMM_B1"))]
    findings = judge(facts)
    assert [(f.device, f.severity, f.reason) for f in findings] == [
        ("mc0/csrow2/ch0", Severity.WARNING, "MemoryCorrectedErrors"),
        ("mc0/csrow2", Severity.FATAL, "MemoryUncorrectableErrors")]
    assert "DIMM_A1 or DIMM_B1" in findings[1].message and findings[1].evidence["uncorrected"] == 1


def test_the_controllers_counters_count_what_no_dimm_accounts_for(tmp_path):
    root = str(tmp_path)
    write(root, "mc0/ce_count", 0)
    write(root, "mc0/ue_count", 2)  # two UEs, but the DIMMs' counters say none
    write(root, "mc0/ue_noinfo_count", 0)
    write(root, "mc0/dimm0/dimm_label", "P1_DIMM_A1")
    write(root, "mc0/dimm0/dimm_ce_count", 0)
    write(root, "mc0/dimm0/dimm_ue_count", 0)
    write(root, "mc1/ce_count", 12)
    write(root, "mc1/ue_count", 1)
    write(root, "mc1/csrow0/ce_count", 12)
    write(root, "mc1/csrow0/ch0_ce_count", 12)  # the row's ue_count cannot be read: the controller's still counts
    findings = judge(edac.collect(HostPaths(root), {}))
    assert [(f.device, f.severity, f.evidence["uncorrected"], f.evidence["corrected"]) for f in findings] == [
        ("mc0", Severity.FATAL, 2, None),
        ("mc1/csrow0/ch0", Severity.DEGRADED, None, 12),
        ("mc1", Severity.FATAL, 1, None)]
    assert "not attributed to a DIMM" in findings[0].message


def test_unattributed_errors_are_not_counted_twice(tmp_path):
    root = str(tmp_path)
    write(root, "mc0/ce_count", 0)
    write(root, "mc0/ue_count", 1)
    write(root, "mc0/ue_noinfo_count", 1)  # the controller's one UE is the unattributed one
    write(root, "mc0/dimm0/dimm_ue_count", 0)
    write(root, "mc0/dimm0/dimm_ce_count", 0)
    assert [(f.device, f.evidence["uncorrected"]) for f in judge(edac.collect(HostPaths(root), {}))] == [
        ("mc0/unattributed", 1)]


def test_garbage_counters_are_absent_and_no_edac_is_unsupported(tmp_path):
    root = str(tmp_path)
    assert "no EDAC memory controllers" in edac.supported(HostPaths(root), {})
    write(root, "mc0/ce_count", "x" * 50)
    write(root, "mc0/ue_count", 99999999999999999999999)
    facts = edac.collect(HostPaths(root), {})
    assert (facts.controllers[0].ce_count, facts.controllers[0].ue_count) == (None, None)
    assert judge(facts) == []
    assert [m.samples for m in edac.metrics(facts)] == [[], []]  # absent counters export no sample, not 0
