"""The xid check and its catalog: table-driven, no files. Event texts are real kernel lines
(docs/domain/xid.md section 4 and /work/shared/fixtures/kmsg) as the collector hands them over."""
from __future__ import annotations

import re

import pytest
from conftest import KmsgFacts
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.checks import kernel, link_events, xid
from nodehealth.checks import xid_catalog as catalog
from nodehealth.collectors import kmsg
from nodehealth.collectors.kernel_events import (
    GPU_FALLEN_OFF_BUS,
    KINDS,
    SXID,
    XID,
    KernelEvent,
    events_from_records,
)
from nodehealth.model import Action, Observed, Severity

NOW = 1_700_000_000.0
HOUR = 3600.0
DAY = 86400.0
GPU = "0000:3b:00.0"
GPU2 = "0000:5d:00.0"
SWITCH = "0000:06:00.0"
CAMEL = re.compile(r"^[A-Z][a-z0-9]*(?:[A-Z][a-z0-9]*)*$")


def judge(events, now=NOW, **cfg):
    return xid.judge(Observed({"kmsg": KmsgFacts(tuple(events))}, now=now), dict(xid.DEFAULTS, **cfg))


def ev(code, text="", device=GPU, age=60.0, kind=XID, **detail):
    """An event `age` seconds before NOW (age None: no wall time, as in a replayed log)."""
    return KernelEvent(kind, device, code, text, wall_time=None if age is None else NOW - age, detail=detail)


def sxid(code, text, fatal, device=SWITCH, age=60.0, link=None):
    return ev(code, text, device, age, kind=SXID, fatal=fatal, link=link, nvswitch="nvidia-nvswitch1")


def one(findings):
    assert len(findings) == 1, [f.reason for f in findings]
    return findings[0]


# The catalog.

def test_every_section_2_row_is_in_the_catalog():
    section_2 = ([8, 13, 31, 32, 38, 43, 44, 45, 46, 48, 54, 56, 57, 58, 60, 61, 62, 63, 64, 65, 68, 69, 73, 74, 79,
                  81, 92, 93, 94, 95, 109, 110, 119, 120, 121, 136, 137, 140, 141, 143] + list(range(144, 173)))
    assert set(section_2) <= set(catalog.XID_CATALOG)
    assert {10004, 11004, 12028, 19084, 20009, 20034, 22013, 24007, 28006} <= set(catalog.SXID_CATALOG)


def test_every_reason_is_camel_case_unique_and_names_its_code():
    rows = list(catalog.XID_CATALOG.values()) + list(catalog.SXID_CATALOG.values())
    reasons = [r.reason for r in rows]
    assert len(set(reasons)) == len(reasons)
    for r in catalog.XID_CATALOG.values():
        assert CAMEL.match(r.reason) and r.reason.startswith(f"Xid{r.code}") and r.reason != f"Xid{r.code}", r
    for r in catalog.SXID_CATALOG.values():
        assert r.reason.startswith(f"SXid{r.code}") and CAMEL.match(r.reason[1:]) and r.reason != f"SXid{r.code}"


def test_every_row_is_complete():
    for r in list(catalog.XID_CATALOG.values()) + list(catalog.SXID_CATALOG.values()):
        assert isinstance(r.severity, Severity) and r.severity not in (Severity.OK, Severity.UNKNOWN)
        assert isinstance(r.action, Action)
        assert r.meaning and not r.meaning.endswith(".")


def test_sympathetic_codes_are_never_fatal_alone():
    assert catalog.SYMPATHETIC == {43, 45, 94}
    for code in catalog.SYMPATHETIC:
        assert catalog.XID_CATALOG[code].severity.rank < Severity.DEGRADED.rank


# One row per NVIDIA bucket (xid.md 1.1) and per special row of section 2.
@pytest.mark.parametrize("code,severity,action", [
    (8, Severity.WARNING, Action.RESTART_APP),  # RESTART_APP
    (38, Severity.INFO, Action.NONE),  # IGNORE
    (46, Severity.FATAL, Action.RESET_GPU),  # RESET_GPU
    (79, Severity.FATAL, Action.REBOOT),  # RESTART_BM
    (151, Severity.FATAL, Action.REBOOT),  # RESTART_VM
    (48, Severity.FATAL, Action.RESET_GPU),  # WORKFLOW_XID_48
    (45, Severity.INFO, Action.NONE),  # WORKFLOW_XID_45
    (74, Severity.FATAL, Action.RESET_GPU),  # WORKFLOW_NVLINK_ERR
    (54, Severity.FATAL, Action.HW_INSPECTION),  # CHECK_MECHANICALS
    (159, Severity.DEGRADED, Action.NONE),  # CHECK_UVM
    (142, Severity.WARNING, Action.RESTART_APP),  # CONTACT_SUPPORT, deliberately as the other video engines
    (1, Severity.DEGRADED, Action.HW_INSPECTION),  # CONTACT_SUPPORT, "Unused"
    (81, Severity.FATAL, Action.HW_INSPECTION),  # "Unused", deliberately fatal
    (56, Severity.WARNING, Action.NONE),  # "Unused", deliberately a warning
    (166, Severity.WARNING, Action.NONE),  # blank in the catalog copy
    (63, Severity.DEGRADED, Action.RESET_GPU),  # row remap pending: reset at idle
    (64, Severity.FATAL, Action.HW_INSPECTION),
    (65, Severity.DEGRADED, Action.REBOOT),
    (172, Severity.FATAL, Action.RESET_GPU),  # as 48
])
def test_buckets(code, severity, action):
    f = one(judge([ev(code, "some text")]))
    assert (f.severity, f.action, f.reason) == (severity, action, catalog.XID_CATALOG[code].reason)


def test_contact_support_is_fatal_for_a_code_in_use():
    """No code NVIDIA uses keeps CONTACT_SUPPORT unexplained now (142 is a documented difference); the rule stands."""
    assert catalog.rated("CONTACT_SUPPORT", False) == (Severity.FATAL, Action.HW_INSPECTION)


@pytest.mark.parametrize("code", sorted(catalog.XID_CATALOG))
def test_every_row_becomes_its_own_finding(code):
    info = catalog.XID_CATALOG[code]
    f = one(judge([ev(code, "a line the decoders cannot read", pid=7, name="python3")]))
    assert (f.check, f.reason, f.severity, f.action, f.device) == ("xid", info.reason, info.severity, info.action, GPU)
    assert f"GPU {GPU}" in f.message and f"Xid {code}" in f.message and info.meaning in f.message
    assert f.evidence["code"] == code and f.evidence["count"] == 1 and f.evidence["pids"] == [7]


# Messages and evidence.

def test_message_names_gpu_count_process_text_meaning_and_advice():
    text = ("An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
            "0x7fffa8860 partition 7, subpartition 1.")
    f = one(judge([ev(48, text, pid="<unknown>", name="<unknown>", age=120), ev(48, text, pid=1797828,
                                                                              name="pt_main_thread")]))
    assert f.reason == "Xid48DoubleBitEcc" and f.severity is Severity.FATAL
    assert "GPU 0000:3b:00.0 logged Xid 48 (Double Bit ECC Error) 2 times this boot" in f.message
    assert "pt_main_thread (pid 1797828)" in f.message and "physAddr 0x7fffa8860" in f.message
    assert "double-bit ECC" in f.message and "nvidia-smi -r" in f.message
    assert f.evidence["pids"] == [1797828] and f.evidence["processes"] == ["pt_main_thread"]
    assert (f.first_seen, f.last_seen) == (NOW - 120, NOW - 60)
    assert (f.evidence["first_time"], f.evidence["last_time"]) == (NOW - 120, NOW - 60)


def test_long_text_is_trimmed_and_pids_are_bounded():
    text = "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005 " * 10
    f = one(judge([ev(109, text, pid=1000 + i) for i in range(20)]))
    assert len(f.evidence["last_text"]) == 160 and f.evidence["last_text"].endswith("...")
    assert f.evidence["pids"] == list(range(1012, 1020))
    assert f.evidence["count"] == 20


def test_mig_instance_is_named():
    f = one(judge([ev(94, "Contained: CE User Channel (0x9). RST: No, D-RST: No", pid=7194, gpu_instance=5)]))
    assert "GPU 0000:3b:00.0 (GPU instance 5)" in f.message and f.evidence["gpu_instances"] == [5]


def test_one_finding_per_gpu_and_reason():
    findings = judge([ev(13, "a", GPU), ev(13, "b", GPU2), ev(31, "c", GPU), ev(13, "d", GPU)])
    assert sorted((f.device, f.reason, f.evidence["count"]) for f in findings) == [
        (GPU, "Xid13GraphicsException", 2), (GPU, "Xid31MmuFault", 1), (GPU2, "Xid13GraphicsException", 1)]


def test_no_events_and_other_kinds_give_no_findings():
    assert judge([]) == []
    assert judge([KernelEvent("hung_task", "python", None, "task python:1 blocked"),
                  KernelEvent("link_down", "mlx5_0", None, "Link down")]) == []


# Odd cases.

def test_fallen_off_the_bus_without_a_number_is_xid_79():
    off = ev(None, "The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the "
                   "bus and is not responding to commands.", "0000:b3:00.0", kind=GPU_FALLEN_OFF_BUS)
    f = one(judge([off]))
    assert (f.reason, f.severity, f.action) == ("Xid79FallenOffBus", Severity.FATAL, Action.REBOOT)
    assert "without an Xid number" in f.message and f.evidence["code"] == 79
    later = one(judge([ev(79, "GPU has fallen off the bus.", "0000:b3:00.0", age=3600.0), off]))
    assert later.evidence["count"] == 2  # an hour apart: the driver said it again, two reports


@pytest.mark.parametrize("order", ["xid first", "companion first"])
def test_an_xid_79_and_the_drivers_companion_line_are_one_event(order):
    """The driver prints `NVRM: GPU <bus id>: GPU has fallen off the bus.` beside the Xid 79 of that GPU
    (docs/domain/xid.md 4.3): one fault, one count, in whichever order the log has them."""
    lines = ["[ 6781741.548779] NVRM: Xid (PCI:0000:cb:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
             "the bus.", "[ 6781741.548781] NVRM: GPU 0000:cb:00.0: GPU has fallen off the bus."]
    if order != "xid first":
        lines.reverse()
    reader = kmsg.LogLines()
    events = list(events_from_records([r for line in lines for r in reader.feed(line)] + reader.flush()))
    assert sorted(e.kind for e in events) == [GPU_FALLEN_OFF_BUS, XID]  # the parser reports both lines
    f = one(xid.judge(Observed({"kmsg": KmsgFacts(tuple(events), boot_id=None)}, now=NOW), dict(xid.DEFAULTS)))
    assert (f.reason, f.device, f.evidence["count"]) == ("Xid79FallenOffBus", "0000:cb:00.0", 1)
    assert "once this boot" in f.message


def test_post_mortem_counts_an_xid_79_and_its_companion_once(tmp_path, capsys):
    import json

    from nodehealth import cli

    path = tmp_path / "kern.log"  # gpud's sxid README Xid 79 line and the driver's companion line (xid.md 4.3)
    path.write_text("[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen "
                    "off the bus.\n[6781741.548790] NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.\n")
    assert cli.main(["check", "--kernel-log", str(path), "--only", "kmsg", "--json"]) == 1
    [f] = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["check"] == "xid"]
    assert (f["reason"], f["device"], f["evidence"]["count"]) == ("Xid79FallenOffBus", "0000:91:00.0", 1)


def test_companion_lines_pair_only_with_their_own_xid():
    pairs = [ev(79, "GPU has fallen off the bus.", GPU, age=None), ev(None, "GPU has fallen off the bus", GPU,
                                                                      age=None, kind=GPU_FALLEN_OFF_BUS)]
    assert one(judge(pairs * 2)).evidence["count"] == 2  # two faults (replayed, no times): two Xids, two companions
    other = judge([ev(79, "GPU has fallen off the bus.", GPU),
                   ev(None, "GPU has fallen off the bus", GPU2, kind=GPU_FALLEN_OFF_BUS)])
    assert sorted((f.device, f.evidence["count"]) for f in other) == [(GPU, 1), (GPU2, 1)]  # another GPU's


def times_phrase(n):
    return "once this boot" if n == 1 else f"{n} times this boot"


@pytest.mark.parametrize("texts,severity,action,shown", [
    (["GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"],
     Severity.FATAL, Action.RESET_GPU, "0x4 (DRAIN_AND_RESET)"),
    (["GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
      "GPU recovery action changed from 0x4 (Drain and Reset) to 0x2 (Node Reboot Required)"],
     Severity.FATAL, Action.REBOOT, "0x2 (NODE_REBOOT)"),
    (["GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
      "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"],
     Severity.INFO, Action.NONE, "0x0 (NONE)"),
    (["GPU recovery action changed from 0x0 (None) to 0x3"], Severity.DEGRADED, Action.RESTART_APP, "DRAIN_P2P"),
    (["GPU recovery action changed to (Node Reboot Required)"], Severity.FATAL, Action.REBOOT, "NODE_REBOOT"),
    (["GPU recovery action changed from 0x0 (None) to 0x9 (Something New)"], Severity.WARNING, Action.NONE, "0x9"),
    (["GPU recovery action changed"], Severity.WARNING, Action.NONE, "could not be read"),
])
def test_xid_154_acts_on_the_latest_recovery_action(texts, severity, action, shown):
    f = one(judge([ev(154, t, age=600 - i) for i, t in enumerate(texts)]))
    assert (f.reason, f.severity, f.action) == ("Xid154RecoveryActionChanged", severity, action)
    assert shown in f.message and times_phrase(len(texts)) in f.message
    assert f.evidence["count"] == 1


def test_xid_154_cleared_later_is_not_kept_by_an_older_fatal_value():
    older = ev(154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", age=2 * DAY)
    cleared = ev(154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", age=1.5 * DAY)
    assert judge([older, cleared]) == []
    assert one(judge([older])).severity is Severity.FATAL


@pytest.mark.parametrize("code,text,severity,action,word", [
    (149, "NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 "
          "0x00000000)", Severity.FATAL, Action.RESET_GPU, "marked Fatal"),
    (149, "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
     Severity.FATAL, Action.RESET_GPU, "marked Fatal"),
    (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 "
          "0x00000004)", Severity.WARNING, Action.NONE, "marked Nonfatal"),
    (144, "SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)",
     Severity.WARNING, Action.NONE, "marked Nonfatal"),
    (150, "MSE unit error (0x00000001)", Severity.WARNING, Action.NONE, "MSE unit"),
])
def test_nvlink5_xids_use_the_fatal_word(code, text, severity, action, word):
    f = one(judge([ev(code, text)]))
    assert (f.severity, f.action) == (severity, action) and word in f.message
    assert f.reason == catalog.XID_CATALOG[code].reason


def test_xid_45_is_info_and_names_its_cause():
    f = one(judge([ev(45, "Ch 00000001 caused by previous Xid 149", "0000:dc:00.0", pid=1818990, name="python3"),
                   ev(45, "Ch 00000002 caused by previous Xid 149", "0000:dc:00.0", pid=1818990, name="python3")]))
    assert (f.severity, f.action) == (Severity.INFO, Action.NONE)
    assert "it followed Xid 149 on this GPU" in f.message and "act on that Xid's finding" in f.message
    assert f.evidence["caused_by"] == [149]


def test_unknown_code_is_a_warning_named_after_the_code():
    f = one(judge([ev(175, "GSP RPC timeout (DUP_OBJECT)")]))
    assert (f.reason, f.severity, f.action) == ("Xid175", Severity.WARNING, Action.NONE)
    assert f"not in {catalog.XID_DOCUMENT} (nodehealth catalog {catalog.CATALOG_VERSION})" in f.message
    assert one(judge([ev(None, "no number")])).reason == "XidUnknown"


# Windows and repeats.

@pytest.mark.parametrize("code,age,window,counted", [
    (13, 2 * HOUR, DAY, True),  # warning inside the window
    (13, 2 * DAY, DAY, False),  # warning outside it
    (13, 2 * HOUR, HOUR, False),  # a shorter configured window
    (38, 2 * DAY, DAY, False),  # info outside it
    (63, 2 * DAY, DAY, False),  # degraded outside it
    (79, 5 * DAY, DAY, True),  # fatal hardware counts all boot
    (48, 5 * DAY, HOUR, True),
    (13, None, HOUR, True),  # no wall time (replayed log): always counts
])
def test_window(code, age, window, counted):
    assert len(judge([ev(code, "x", age=age)], window_seconds=window)) == (1 if counted else 0)


def test_windowed_message_says_the_window_and_sticky_says_this_boot():
    assert "once in the last 24 h" in one(judge([ev(13, "x")])).message
    assert "once in the last 2 h" in one(judge([ev(13, "x")], window_seconds=7200.0)).message
    assert "once this boot" in one(judge([ev(79, "x")])).message


@pytest.mark.parametrize("count,repeat,severity", [
    (4, 5, Severity.WARNING),
    (5, 5, Severity.DEGRADED),
    (2, 2, Severity.DEGRADED),
    (1, 1, Severity.DEGRADED),
])
def test_repeats_of_a_warning_code_escalate(count, repeat, severity):
    f = one(judge([ev(31, "MMU Fault", age=100 + i) for i in range(count)], repeat_count=repeat))
    assert f.severity is severity and f.evidence["count"] == count
    if severity is Severity.DEGRADED:
        assert f.action is Action.HW_INSPECTION and f"repeat limit of {repeat}" in f.message
    else:
        assert f.action is Action.RESTART_APP and "repeat limit" not in f.message


def test_repeats_count_only_inside_the_window_and_per_gpu():
    old = [ev(13, "x", age=2 * DAY + i) for i in range(10)]
    recent = [ev(13, "x", age=100 + i) for i in range(3)]
    other_gpu = [ev(13, "x", GPU2, age=100 + i) for i in range(3)]
    findings = judge(old + recent + other_gpu)
    assert [(f.severity, f.evidence["count"]) for f in findings] == [(Severity.WARNING, 3)] * 2


@pytest.mark.parametrize("code", [94, 154])
def test_sympathetic_and_state_codes_do_not_escalate(code):
    f = one(judge([ev(code, "Contained: SM (0x1). RST: No, D-RST: No") for _ in range(10)]))
    assert f.severity is Severity.WARNING


def test_repeats_of_fatal_codes_stay_fatal():
    f = one(judge([ev(79, "GPU has fallen off the bus.")] * 6))
    assert (f.severity, f.action) == (Severity.FATAL, Action.REBOOT)


def test_mixed_nvlink5_lines_report_the_worst():
    f = one(judge([ev(149, "NETIR_LINK_EVT Nonfatal XC0 i0 Link 01"), ev(149, "NETIR_LINK_EVT Fatal XC0 i0 Link 01"),
                   ev(149, "NETIR_LINK_EVT Nonfatal XC0 i0 Link 01")]))
    assert (f.severity, f.action, f.evidence["count"]) == (Severity.FATAL, Action.RESET_GPU, 3)


# Overrides.

@pytest.mark.parametrize("overrides,code,severity,action", [
    ({79: {"severity": "warning"}}, 79, Severity.WARNING, Action.REBOOT),
    ({"13": {"severity": "fatal", "action": "reset-gpu"}}, 13, Severity.FATAL, Action.RESET_GPU),
    ({"109": {"action": "restart-app", "severity": "warning"}}, 109, Severity.WARNING, Action.RESTART_APP),
    ({175: {"severity": "degraded", "action": "hw-inspection"}}, 175, Severity.DEGRADED, Action.HW_INSPECTION),
    ({"149": {"severity": "info"}}, 149, Severity.INFO, Action.RESET_GPU),  # after the Fatal decode
])
def test_overrides(overrides, code, severity, action):
    f = one(judge([ev(code, "NETIR Fatal XC0 i0 Link -1")], overrides=overrides))
    assert (f.severity, f.action) == (severity, action) and "operator's override" in f.message


def test_override_ok_silences_a_code():
    assert judge([ev(43, "x"), ev(13, "y")], overrides={43: {"severity": "ok"}})[0].reason == "Xid13GraphicsException"
    assert len(judge([ev(43, "x"), ev(13, "y")], overrides={43: {"severity": "ok"}})) == 1


def test_an_override_of_the_action_replaces_event_specific_advice():
    text = "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"
    f = one(judge([ev(154, text)], overrides={154: {"action": "reboot"}}))
    assert f.action is Action.REBOOT and "let running work finish" not in f.message


@pytest.mark.parametrize("overrides,setting", [
    ({"x79": {"severity": "fatal"}}, "overrides.x79"),
    ({79: {"severity": "terrible"}}, "overrides.79"),
    ({79: {"severity": "unknown"}}, "overrides.79"),
    ({79: {"action": "pray"}}, "overrides.79"),
    ({79: {"colour": "red"}}, "overrides.79"),
    ({79: "fatal"}, "overrides.79"),
    ({79: {}}, "overrides.79"),
])
def test_a_bad_override_is_reported_and_ignored(overrides, setting):
    findings = judge([ev(79, "GPU has fallen off the bus.")], overrides=overrides)
    bad = [f for f in findings if f.reason == "XidOverrideInvalid"]
    assert len(bad) == 1 and bad[0].action is Action.FIX_CONFIG and f"checks.xid.{setting}" in bad[0].message
    assert bad[0].device == f"checks.xid.{setting}"
    fallen = [f for f in findings if f.reason == "Xid79FallenOffBus"]
    assert fallen[0].severity is Severity.FATAL


# SXid.

def test_sxid_known_fatal_code():
    f = one(judge([sxid(20034, "Fatal, Link 48 LTSSM Fault Up", True, link=48)]))
    assert (f.reason, f.severity, f.action, f.device) == ("SXid20034LtssmFaultUp", Severity.FATAL,
                                                          Action.RESET_GPU, SWITCH)
    assert (f"NVSwitch {SWITCH} (nvidia-nvswitch1) logged SXid 20034 (NVSWITCH_ERR_HW_DLPL_LTSSM_FAULT_UP) on link 48"
            in f.message)
    assert "Xid 79" not in f.message


def test_sxid_headline_lines_are_counted_not_continuations():
    lines = []
    for link in (44, 45, 46):
        lines += [sxid(22013, f"Non-fatal, Link {link} Minion Link DLREQ interrupt", False, "0000:04:00.0", link=link),
                  sxid(22013, f"Severity 0 Engine instance {link} Sub-engine instance 00", None, "0000:04:00.0"),
                  sxid(22013, "Data {0x0000002b, 0x0000002b, 0x00000000}", None, "0000:04:00.0")]
    f = one(judge(lines))
    assert (f.reason, f.severity, f.evidence["count"]) == ("SXid22013MinionNonFatal", Severity.INFO, 3)
    assert f.evidence["links"] == ["44", "45", "46"] and "Minion Link DLREQ" in f.message


@pytest.mark.parametrize("code,text,fatal,reason,severity,action", [
    (99999, "Fatal, Link 3 something new", True, "SXid99999", Severity.FATAL, Action.RESET_GPU),
    (99999, "Non-fatal, Link 3 something new", False, "SXid99999", Severity.WARNING, Action.NONE),
    # NVSentinel's sxid handler test line; NVIDIA's NVSwitch table rates SOE_HALT RESET_FABRIC, FATAL
    (26006, "SOE HALT data[0] = 0x               0", None, "SXid26006SoeHalt", Severity.FATAL, Action.RESET_GPU),
    (22013, "Fatal, Link 44 Minion Link DLREQ interrupt", True, "SXid22013MinionNonFatal", Severity.FATAL,
     Action.RESET_GPU),
    (20009, "Fatal, Link 2 RX short error rate", True, "SXid20009RxShortErrorRate", Severity.FATAL,
     Action.HW_INSPECTION),
    (12028, "Non-fatal, Link 61 egress non-posted PRIV error (First)", False, "SXid12028PrivResponseError",
     Severity.FATAL, Action.RESET_GPU),
])
def test_sxid_severity(code, text, fatal, reason, severity, action):
    f = one(judge([sxid(code, text, fatal)]))
    assert (f.reason, f.severity, f.action) == (reason, severity, action)


def test_sxid_overrides():
    f = one(judge([sxid(12028, "Non-fatal, Link 61 egress non-posted PRIV error", False)],
                  sxid_overrides={"12028": {"severity": "warning", "action": "none"}}))
    assert (f.severity, f.action) == (Severity.WARNING, Action.NONE)


def test_xid_79_with_sxid_20034_says_restart_the_node():
    findings = {f.reason: f for f in judge([
        ev(79, "GPU has fallen off the bus.", "0000:91:00.0", pid="<unknown>", name="<unknown>"),
        sxid(20034, "Fatal, Link 48 LTSSM Fault Up", True, "0000:06:00.0", link=48),
        sxid(20034, "Severity 1 Engine instance 60 Sub-engine instance 00", None, "0000:07:00.0")])}
    assert set(findings) == {"Xid79FallenOffBus", "SXid20034LtssmFaultUp"}
    assert "SXid 20034" in findings["Xid79FallenOffBus"].message
    assert "fell off the bus (Xid 79)" in findings["SXid20034LtssmFaultUp"].message
    assert findings["SXid20034LtssmFaultUp"].action is Action.REBOOT
    assert "must be restarted" in findings["Xid79FallenOffBus"].message


def test_sxid_window():
    assert judge([sxid(22013, "Non-fatal, Link 1", False, age=2 * DAY)]) == []
    assert len(judge([sxid(20034, "Fatal, Link 1", True, age=2 * DAY)])) == 1


# Never crashes.

DETAIL_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10 ** 7), st.text(max_size=10),
                          st.sampled_from(["<unknown>", "python3", ""]))
TEXTS = st.one_of(st.text(max_size=300), st.sampled_from([
    "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", "to 0xffffffffffffffffff",
    "to ()", "NETIR Fatal XC0", "Nonfatal", "Ch 1 caused by previous Xid 99999999999", "stuck for 99s!"]))
EVENTS = st.lists(st.builds(
    KernelEvent,
    kind=st.sampled_from(KINDS + ("other",)),
    device=st.one_of(st.sampled_from([GPU, GPU2, SWITCH, "", "mlx5_0", "cpu3", "python"]), st.text(max_size=12)),
    code=st.one_of(st.none(), st.sampled_from(sorted(catalog.XID_CATALOG) + sorted(catalog.SXID_CATALOG)),
                   st.integers(-10, 10 ** 6)),
    text=TEXTS,
    seq=st.one_of(st.none(), st.integers(0, 10 ** 6)),
    monotonic_us=st.one_of(st.none(), st.integers(0, 10 ** 13)),
    wall_time=st.one_of(st.none(), st.floats(NOW - 10 * DAY, NOW + HOUR)),
    detail=st.dictionaries(st.sampled_from(["pid", "name", "gpu_instance", "fatal", "link", "seconds"]),
                           DETAIL_VALUES, max_size=6),
), max_size=40)


@settings(max_examples=200, deadline=None)
@given(events=EVENTS, repeat=st.integers(1, 6), window=st.sampled_from([60.0, HOUR, DAY]))
def test_kernel_log_checks_never_raise_and_give_valid_findings(events, repeat, window):
    obs = Observed({"kmsg": KmsgFacts(tuple(events))}, now=NOW)
    cfgs = [(xid, dict(xid.DEFAULTS, repeat_count=repeat, window_seconds=window,
                       overrides={79: {"severity": "warning"}, "x": {}})),
            (kernel, dict(kernel.DEFAULTS, window_seconds=window, hung_task_repeat=repeat)),
            (link_events, dict(link_events.DEFAULTS, window_seconds=window, flap_count=repeat))]
    for module, cfg in cfgs:
        for f in module.judge(obs, cfg):
            assert f.check == module.NAME
            assert isinstance(f.severity, Severity) and f.severity not in (Severity.OK, Severity.UNKNOWN)
            assert isinstance(f.action, Action)
            assert re.match(r"^[A-Z][A-Za-z0-9]*$", f.reason)
            assert f.message.strip() and f.message.endswith(".")
            assert isinstance(f.device, str)


def saved(events):
    """Judged as `check --kernel-log` does: a saved log (no boot id), as of its last event."""
    obs = Observed({"kmsg": KmsgFacts(tuple(events), boot_id=None)}, now=NOW + 30 * DAY)
    return (xid.judge(obs, dict(xid.DEFAULTS)) + kernel.judge(obs, dict(kernel.DEFAULTS))
            + link_events.judge(obs, dict(link_events.DEFAULTS)))


def test_a_saved_log_lists_every_event_older_ones_as_info_fatal_as_they_are():
    """A post-mortem must show what happened days before the end, with its time, without counting it."""
    events = [ev(13, "Graphics Exception", age=3 * DAY), ev(79, "GPU has fallen off the bus", age=2 * DAY),
              ev(13, "Graphics Exception", device=GPU2, age=2 * DAY), ev(13, "Graphics Exception", device=GPU2),
              KernelEvent("hung_task", "python", text="INFO: task python:7 blocked for more than 120 seconds",
                          wall_time=NOW - 4 * DAY, detail={"pid": 7, "seconds": 120}),
              KernelEvent("link_up", "eth1", text="mlx5_core 0000:9d:00.1 eth1: Link up", wall_time=NOW - 5 * DAY),
              KernelEvent("link_down", "eth1", text="mlx5_core 0000:9d:00.1 eth1: Link down", wall_time=NOW - 4 * DAY),
              ev(31, "MMU Fault", age=0)]
    found = {(f.reason, f.device): f for f in saved(events)}
    old13 = found[("Xid13GraphicsException", GPU)]
    assert old13.severity is Severity.INFO and old13.action is Action.NONE
    assert "2023-11-11 22:13:20 UTC" in old13.message and "no longer counts" in old13.message
    assert old13.evidence["earlier_times"] == [NOW - 3 * DAY]
    assert found[("Xid79FallenOffBus", GPU)].severity is Severity.FATAL  # fatal counts all boot
    recent13 = found[("Xid13GraphicsException", GPU2)]
    assert recent13.severity is Severity.WARNING and recent13.evidence["count"] == 1
    assert recent13.evidence["earlier_count"] == 1 and "Earlier" in recent13.message
    assert found[("HungTask", "python")].severity is Severity.INFO
    assert found[("LinkDownRecovered", "eth1")].severity is Severity.INFO
    # On a live node the old transient ones are simply out of the window.
    assert [f.reason for f in judge(events[:1] + events[-1:])] == ["Xid31MmuFault"]
