"""checks/xid_catalog.py against NVIDIA's own tables (tests/fixtures/xid-catalog/nvidia-xid-codes.tsv):
every code, its name and NVIDIA's action are there, and every rating that is not the bucket's rule
is a documented deliberate difference."""
from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from conftest import KmsgFacts

from nodehealth.checks import xid
from nodehealth.checks import xid_catalog as catalog
from nodehealth.collectors.kernel_events import XID, KernelEvent
from nodehealth.model import Action, Observed, Severity

TSV = Path(__file__).parent / "fixtures" / "xid-catalog" / "nvidia-xid-codes.tsv"
ROWS = list(csv.DictReader(TSV.open(encoding="utf-8"), delimiter="\t"))
XIDS = {int(r["code"]): r for r in ROWS if r["type"] == "XID"}
SXIDS = {int(r["code"]): r for r in ROWS if r["type"] == "SXID"}


def test_the_data_is_nvidias_whole_table():
    assert sorted(XIDS) == list(range(1, 173)) and len(SXIDS) == 92


def test_every_xid_of_nvidias_catalog_is_ours_with_its_name_and_action():
    assert sorted(catalog.XID_CATALOG) == sorted(XIDS)
    for code, row in XIDS.items():
        info = catalog.XID_CATALOG[code]
        assert (info.mnemonic, info.name, info.nvidia_action, info.unused) == (
            row["mnemonic"], row["description"], row["immediate_action"], row["unused"] == "yes"), code


def test_every_sxid_of_the_fabric_manager_guide_is_ours():
    extra = set(catalog.SXID_CATALOG) - set(SXIDS)
    assert extra == {20009, 26006, 26007, 26008, 28006}  # our documented additions, not in the guide
    for code, row in SXIDS.items():
        info = catalog.SXID_CATALOG[code]
        assert (info.name, info.nvidia_action, info.fatality) == (
            row["mnemonic"], row["immediate_action"], row["fatality"].split(" (")[0]), code


def test_xid_ratings_follow_the_bucket_rule_except_documented_differences():
    for code, info in catalog.XID_CATALOG.items():
        rule = catalog.rated(info.nvidia_action, info.unused)
        if code in catalog.DELIBERATE_XID_DIFFERENCES:
            severity, action, why = catalog.DELIBERATE_XID_DIFFERENCES[code]
            assert (info.severity, info.action) == (severity, action) != rule, code  # not a stale entry
            assert why
        else:
            assert (info.severity, info.action) == rule, code


def test_sxid_ratings_follow_the_guide_except_documented_differences():
    for code, info in catalog.SXID_CATALOG.items():
        if code not in SXIDS:
            continue
        rule = catalog.rated_sxid(info.fatality, info.nvidia_action)
        if code in catalog.DELIBERATE_SXID_DIFFERENCES:
            assert (info.severity, info.action) == catalog.DELIBERATE_SXID_DIFFERENCES[code][:2] != rule, code
        else:
            assert (info.severity, info.action) == rule, code
    for code in catalog.SXID_CATALOG:  # always-fatal rows ask for a host restart
        if catalog.SXID_CATALOG[code].fatality == "always-fatal":
            assert catalog.SXID_CATALOG[code].action is Action.REBOOT


def test_codes_nvidia_says_to_ignore_are_info_unless_we_say_why():
    ignored = [c for c, r in XIDS.items() if r["immediate_action"] == "IGNORE"]
    assert len(ignored) == 21
    for code in ignored:
        info = catalog.XID_CATALOG[code]
        assert info.severity is Severity.INFO or code in catalog.DELIBERATE_XID_DIFFERENCES, code


def test_versions_name_nvidias_documents():
    assert catalog.CATALOG_VERSION.startswith("nvidia-xid-catalog-2025-09-30")
    assert "2025-09-30" in catalog.XID_DOCUMENT and "DU-09883-001 v1.3" in catalog.SXID_DOCUMENT
    assert catalog.SXID_CATALOG_VERSION.startswith("nvidia-fm-guide-DU-09883-001-v1.3")


@pytest.mark.parametrize("code", sorted(XIDS))
def test_no_catalog_code_falls_to_the_generic_warning(code):
    event = KernelEvent(XID, "0000:3b:00.0", code, "a line", wall_time=1_700_000_000.0 - 60)
    [f] = xid.judge(Observed({"kmsg": KmsgFacts((event,))}, now=1_700_000_000.0), dict(xid.DEFAULTS))
    assert "is not in" not in f.message and f.reason == catalog.XID_CATALOG[code].reason
    assert f.reason != f"Xid{code}"


def test_previously_missing_codes_nvidia_ignores_are_no_longer_warnings():
    for code in (37, 66, 67, 106, 107, 152, 153):
        event = KernelEvent(XID, "0000:3b:00.0", code, "a line", wall_time=1_700_000_000.0 - 60)
        [f] = xid.judge(Observed({"kmsg": KmsgFacts((event,))}, now=1_700_000_000.0), dict(xid.DEFAULTS))
        assert (f.severity, f.action) == (Severity.INFO, Action.NONE), code


def test_video_engine_exceptions_are_rated_alike():
    """NVIDIA asks to restart the application for every video decoder, JPEG and optical-flow engine exception; the
    encoder's (Xid 142, NVENC3) is rated as they are, not as an unrecoverable GPU fault."""
    engines = [c for c, r in XIDS.items() if r["unused"] == "no"
               and re.search(r"_(NVDEC|NVJPG|NVENC|OFA)\d_ERROR$", r["mnemonic"])]
    assert 142 in engines and len(engines) >= 18
    assert {(catalog.XID_CATALOG[c].severity, catalog.XID_CATALOG[c].action) for c in engines} == {
        (Severity.WARNING, Action.RESTART_APP)}
    assert "NVENC3" in catalog.XID_CATALOG[142].meaning


def test_switch_soe_errors_follow_nvidias_nvswitch_table():
    """SXid 26006-26008 (the switch's SOE micro-controller) are not in the Fabric Manager guide; NVIDIA's NVSwitch
    error table (NVSentinel's sxiderrorsmapping.csv) gives SOE_HALT and SOE_EXTERR RESET_FABRIC/FATAL, SOE_WATCHDOG
    IGNORE/NONFATAL."""
    rated = {c: (catalog.SXID_CATALOG[c].name, catalog.SXID_CATALOG[c].severity, catalog.SXID_CATALOG[c].action)
             for c in (26006, 26007, 26008)}
    assert rated == {26006: ("NVSWITCH_ERR_HW_SOE_HALT", Severity.FATAL, Action.RESET_GPU),
                     26007: ("NVSWITCH_ERR_HW_SOE_EXTERR", Severity.FATAL, Action.RESET_GPU),
                     26008: ("NVSWITCH_ERR_HW_SOE_WATCHDOG", Severity.INFO, Action.NONE)}
