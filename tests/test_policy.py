import json

from nodehealth.config import POLICY_DEFAULTS
from nodehealth.model import Action, Finding, Severity
from nodehealth.policy import Policy, StateFile

CFG = dict(POLICY_DEFAULTS, raise_after_passes=2, clear_after_passes=3, clear_after_seconds=60.0)
LOST = Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "lost", "0000:3b:00.0", Action.REBOOT)
SLOW = Finding("infiniband", Severity.DEGRADED, "PortRateDegraded", "slow", "mlx5_0:1")


def test_sticky_fatal_survives_its_evidence_and_a_restart_of_the_same_boot(tmp_path):
    p = Policy(CFG, ["infiniband"], "boot-1")
    assert p.apply([LOST], 100.0) == []
    assert [x.reason for x in p.sticky_findings()] == ["Xid79FallenOffBus"]
    assert p.apply([], 200.0) == [] and len(p.sticky_findings()) == 1
    state = StateFile(str(tmp_path))
    state.save(p.dump())
    again = Policy(CFG, ["infiniband"], "boot-1")
    again.restore(state.load())
    assert [x.first_seen for x in again.sticky_findings()] == [100.0]


def test_reboot_clears_sticky(tmp_path):
    p = Policy(CFG, [], "boot-1")
    p.apply([LOST], 1.0)
    state = StateFile(str(tmp_path))
    state.save(p.dump())
    after_reboot = Policy(CFG, [], "boot-2")
    after_reboot.restore(state.load())
    assert after_reboot.sticky_findings() == []


def test_debounce_raises_after_k_and_clears_after_m_and_delay():
    p = Policy(CFG, ["infiniband"], "b")
    assert p.apply([SLOW], 0.0) == []  # one bad pass is a blip
    assert [x.reason for x in p.apply([SLOW], 10.0)] == ["PortRateDegraded"]
    assert p.apply([], 20.0) != []  # good pass 1: still shown
    assert p.apply([], 30.0) != []  # good pass 2
    assert p.apply([], 40.0) != []  # good pass 3, but only 30 s since the last bad one
    assert p.apply([], 80.0) == []  # enough passes and enough time


def test_a_blip_never_shows_and_leaves_no_track():
    p = Policy(CFG, ["infiniband"], "b")
    p.apply([SLOW], 0.0)
    p.apply([], 1.0)
    assert p.tracks == {}
    assert p.apply([SLOW], 2.0) == []  # counting starts again


def test_rejudging_other_checks_is_not_a_good_pass():
    p = Policy(CFG, ["infiniband"], "b")
    p.apply([SLOW], 0.0)
    p.apply([SLOW], 1.0)
    for t in range(2, 10):
        p.apply([], float(t), judged_checks=["xid"])
    assert "infiniband|PortRateDegraded|mlx5_0:1" in p.tracks


def test_unknown_is_never_debounced():
    p = Policy(CFG, ["infiniband"], "b")
    unknown = Finding("infiniband", Severity.UNKNOWN, "CollectorFailed", "x")
    assert [x.reason for x in p.apply([unknown], 0.0)] == ["CollectorFailed"]


def test_one_shot_policy_raises_at_once():
    p = Policy(CFG, ["infiniband"], "b", debounce=False)
    assert p.apply([SLOW], 0.0)[0].reason == "PortRateDegraded"


def test_corrupt_state_is_set_aside_not_fatal(tmp_path):
    (tmp_path / "state.json").write_text("{not json")
    assert StateFile(str(tmp_path)).load() == {}
    assert (tmp_path / "state.json.corrupt").exists()
    (tmp_path / "state.json").write_text(json.dumps({"version": 99}))
    assert StateFile(str(tmp_path)).load() == {}


def test_restore_ignores_garbage_entries(tmp_path):
    state = {"version": 1, "boot_id": "b", "sticky": [{"nope": 1}, LOST.to_dict()], "debounce": []}
    p = Policy(CFG, [], "b")
    p.restore(state)
    assert [x.reason for x in p.sticky_findings()] == ["Xid79FallenOffBus"]
    assert p.tracks == {}


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path):
    s = StateFile(str(tmp_path / "sub"))
    s.save({"a": 1})
    s.save({"a": 2})
    assert s.load()["a"] == 2
    assert sorted(x.name for x in (tmp_path / "sub").iterdir()) == ["state.json"]


def test_a_counter_increase_event_is_raised_at_once_and_held():
    cfg = dict(CFG, event_hold_seconds=600.0)
    p = Policy(cfg, ["infiniband"], "b", event_reasons=[("infiniband", "LinkDowned")])
    downed = Finding("infiniband", Severity.DEGRADED, "LinkDowned", "went down", "mlx5_0:1")
    assert [x.reason for x in p.apply([downed], 0.0)] == ["LinkDowned"]  # one increase is the event
    assert [x.reason for x in p.apply([], 30.0)] == ["LinkDowned"]  # held while the counter is quiet
    assert p.apply([], 599.0) != []
    assert p.apply([], 601.0) == []


def test_a_check_that_cannot_judge_does_not_clear_what_it_raised():
    p = Policy(CFG, ["infiniband"], "b")
    p.apply([SLOW], 0.0)
    p.apply([SLOW], 10.0)
    failing = Finding("infiniband", Severity.UNKNOWN, "CollectorFailed", "timed out")
    for t in range(20, 1000, 30):
        shown = p.apply([failing], float(t))
    assert "PortRateDegraded" in {x.reason for x in shown}  # still raised: nothing proved it gone
    assert [x.reason for x in p.apply([SLOW], 1010.0)] == ["PortRateDegraded"]  # and back at once


def test_check_reads_the_daemon_state_without_touching_it(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"version": 99}))  # a newer daemon's file
    assert StateFile(str(tmp_path)).load(read_only=True) == {}
    assert (tmp_path / "state.json").exists() and not (tmp_path / "state.json.corrupt").exists()
