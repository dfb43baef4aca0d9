import json
import os
import stat
import time

import pytest

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


def test_saving_unchanged_state_leaves_the_written_file_alone(tmp_path):
    s = StateFile(str(tmp_path))
    s.save({"a": 1})
    written = os.stat(s.path)
    s.save({"a": 1})  # the daemon saves after every pass; most passes change nothing
    again = os.stat(s.path)
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    s.save({"a": 2})
    assert os.stat(s.path).st_ino != written.st_ino and s.load()["a"] == 2


def test_unchanged_state_is_written_again_when_the_file_is_not_the_one_written(tmp_path):
    s = StateFile(str(tmp_path))
    s.save({"a": 1})
    os.unlink(s.path)  # removed behind the daemon's back
    s.save({"a": 1})
    assert s.load()["a"] == 1
    (tmp_path / "state.json").write_text(json.dumps({"version": 1, "a": 5}))  # replaced by another writer
    s.save({"a": 1})
    assert s.load()["a"] == 1


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


KMSG_OK = {"boot_id": "b", "records": 1, "last_seq": 3, "events": [{"kind": "xid", "device": "0000:3b:00.0",
                                                                   "code": 79, "text": "x", "detail": {}}]}


@pytest.mark.parametrize("bad", [
    {"kmsg": []},
    {"kmsg": dict(KMSG_OK, records="12")},
    {"kmsg": dict(KMSG_OK, last_seq="zz")},
    {"kmsg": dict(KMSG_OK, events=[dict(KMSG_OK["events"][0], device=3)])},
    {"kmsg": dict(KMSG_OK, events="xid")},
    {"debounce": {"infiniband|PortRateDegraded|mlx5_0:1": {"bad": "2", "good": 0}}},
    {"debounce": {"k": {"bad": 1, "good": 0, "raised": "yes"}}},
    {"sticky": [dict(LOST.to_dict(), severity="very")]},
    {"sticky": {"a": 1}},
    {"boot_id": 7},
])
def test_valid_json_with_wrong_types_is_set_aside_and_the_daemon_starts_afresh(tmp_path, bad, caplog):
    from nodehealth.kernel_stream import KernelEvents

    good = {"version": 1, "boot_id": "b", "sticky": [LOST.to_dict()], "debounce": {}, "kmsg": KMSG_OK}
    (tmp_path / "state.json").write_text(json.dumps(good))
    assert StateFile(str(tmp_path)).load(validate=KernelEvents.validate) == good
    (tmp_path / "state.json").write_text(json.dumps(dict(good, **bad)))
    assert StateFile(str(tmp_path)).load(validate=KernelEvents.validate) == {}
    assert (tmp_path / "state.json.corrupt").exists() and not (tmp_path / "state.json").exists()
    assert "starting afresh" in caplog.text


def test_a_fifo_in_place_of_the_state_file_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "state.json")
    assert StateFile(str(tmp_path)).load(read_only=True) == {}  # check: ignored, untouched
    assert stat.S_ISFIFO(os.lstat(tmp_path / "state.json").st_mode)
    assert StateFile(str(tmp_path)).load() == {}  # daemon: set aside
    assert stat.S_ISFIFO(os.lstat(tmp_path / "state.json.corrupt").st_mode)


def test_a_huge_state_file_is_not_read_whole(tmp_path, monkeypatch):
    from nodehealth import kernel_stream as daemon
    from nodehealth import policy

    event = {"kind": "xid", "device": "0000:3b:00.0", "code": 13, "text": "x" * 40, "seq": 1, "detail": {}}
    (tmp_path / "state.json").write_text(json.dumps({"version": 1, "boot_id": "b",
                                                     "kmsg": {"boot_id": "b", "events": [event] * 400000}}))
    reads = []
    real_read = os.read
    monkeypatch.setattr(policy.os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    assert StateFile(str(tmp_path)).load(validate=daemon.KernelEvents.validate) == {}
    assert sum(reads) <= policy.MAX_STATE_BYTES + 1
    # Under the size cap, only the newest MAX_EVENTS are kept.
    (tmp_path / "state.json").write_text(json.dumps({"version": 1, "boot_id": "b", "kmsg": {
        "boot_id": "b", "events": [dict(event, seq=i) for i in range(daemon.MAX_EVENTS + 5)]}}))
    kernel = daemon.KernelEvents("b", "/dev/kmsg")
    kernel.restore(StateFile(str(tmp_path)).load(validate=daemon.KernelEvents.validate)["kmsg"])
    assert len(kernel.events) == daemon.MAX_EVENTS and kernel.events[0].seq == 5


def test_a_crashed_writers_temporaries_are_removed_at_start(tmp_path):
    old, fresh = tmp_path / ".tmp-abc", tmp_path / ".tmp-def"
    old.write_text("{}")
    fresh.write_text("{}")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    StateFile(str(tmp_path)).load(read_only=True)
    assert old.exists()  # check never touches the daemon's directory
    StateFile(str(tmp_path)).load()
    assert not old.exists() and fresh.exists()  # one being written right now is left alone


def test_a_fifo_in_place_of_a_clear_request_does_not_block_the_pass(tmp_path):
    from nodehealth.policy import take_clear_request

    os.mkfifo(tmp_path / "clear-request.json")
    assert take_clear_request(str(tmp_path)) is None
