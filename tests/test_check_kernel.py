"""The kernel check (hung tasks, soft and hard lockups) and the helpers the kernel-log checks share.
Texts are real kernel lines from /work/shared/fixtures/kmsg as the collector hands them over."""
from __future__ import annotations

import re

import pytest
from conftest import KmsgFacts
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.checks import kernel, kernel_log
from nodehealth.collectors.kernel_events import HARD_LOCKUP, HUNG_TASK, KINDS, SOFT_LOCKUP, KernelEvent
from nodehealth.model import Action, Observed, Severity

NOW = 1_700_000_000.0
HOUR = 3600.0
DAY = 86400.0


def judge(events, now=NOW, **cfg):
    return kernel.judge(Observed({"kmsg": KmsgFacts(tuple(events))}, now=now), dict(kernel.DEFAULTS, **cfg))


def hung(task, pid, seconds=120, age=60.0, text=None):
    return KernelEvent(HUNG_TASK, task, None, text or f"task {task}:{pid} blocked for more than {seconds} seconds.",
                       wall_time=None if age is None else NOW - age, detail={"pid": pid, "seconds": seconds})


def soft(cpu, seconds, task="pytest:25222", age=60.0):
    return KernelEvent(SOFT_LOCKUP, f"cpu{cpu}", None, f"BUG: soft lockup - CPU#{cpu} stuck for {seconds}s! [{task}]",
                       wall_time=None if age is None else NOW - age)


def hard(cpu, age=60.0):
    return KernelEvent(HARD_LOCKUP, f"cpu{cpu}", None, f"Watchdog detected hard LOCKUP on cpu {cpu}",
                       wall_time=None if age is None else NOW - age)


def one(findings):
    assert len(findings) == 1, [f.reason for f in findings]
    return findings[0]


def test_no_events_no_findings():
    assert judge([]) == []
    assert judge([KernelEvent("xid", "0000:3b:00.0", 79, "GPU has fallen off the bus.")]) == []


def test_one_hung_task_is_a_warning_with_its_numbers():
    f = one(judge([hung("umount.aufs", 21568)]))
    assert (f.check, f.reason, f.severity, f.action, f.device) == (
        "kernel", "HungTask", Severity.WARNING, Action.NONE, "umount.aufs")
    assert "Task umount.aufs (pid 21568) was blocked in the kernel once in the last 24 h" in f.message
    assert "more than 120 s" in f.message and "call trace" in f.message
    assert f.evidence["count"] == 1 and f.evidence["nvidia_driver"] is False
    assert (f.first_seen, f.last_seen) == (NOW - 60, NOW - 60)


def test_hung_tasks_are_grouped_by_task_name_with_longest_time_and_pids():
    findings = judge([hung("python", 280058, 120, age=500), hung("python", 280058, 241, age=380),
                      hung("python", 280059, 362, age=260), hung("epilog.sh", 1, 120, age=100)])
    by_task = {f.device: f for f in findings}
    assert set(by_task) == {"python", "epilog.sh"}
    py = by_task["python"]
    assert py.evidence["count"] == 3 and py.evidence["longest_blocked_seconds"] == 362
    assert py.evidence["pids"] == [280058, 280059] and "more than 362 s" in py.message
    assert py.severity is Severity.DEGRADED and "limit of 3" in py.message
    assert by_task["epilog.sh"].severity is Severity.WARNING


@pytest.mark.parametrize("count,repeat,severity", [(2, 3, Severity.WARNING), (3, 3, Severity.DEGRADED),
                                                   (1, 1, Severity.DEGRADED), (4, 5, Severity.WARNING)])
def test_hung_task_repeat_threshold(count, repeat, severity):
    f = one(judge([hung("docker", 20744, age=100 + i) for i in range(count)], hung_task_repeat=repeat))
    assert f.severity is severity and f.action is Action.NONE


@pytest.mark.parametrize("task,text", [
    ("nvc:[driver]", None),  # the container toolkit's driver thread (k8s-device-plugin#77)
    ("nv_queue", None),
    ("nvidia-smi", None),
    ("python3.11", "task:python3.11 state:D stack:0 pid:15277 ppid:15257 flags:0x00000002 Call Trace: "
                   "uvm_page_tree_get_ptes_async+0x93/0x970 [nvidia_uvm]"),
])
def test_hung_task_in_the_nvidia_driver_is_named(task, text):
    f = one(judge([hung(task, 5403, text=text)]))
    assert f.evidence["nvidia_driver"] is True and "inside the NVIDIA driver" in f.message
    assert f.severity is Severity.WARNING and f.action is Action.NONE
    repeated = one(judge([hung(task, 5403, text=text, age=100 + i) for i in range(3)]))
    assert (repeated.severity, repeated.action) == (Severity.DEGRADED, Action.REBOOT)
    assert "GPU driver is likely wedged" in repeated.message


def test_hung_task_not_in_the_driver_is_not_blamed_on_it():
    f = one(judge([hung("mmfsd", 77, text="task mmfsd:77 blocked for more than 120 seconds. [mmfs26]")]))
    assert f.evidence["nvidia_driver"] is False and "NVIDIA" not in f.message


def test_hung_task_without_pid_or_seconds():
    e = KernelEvent(HUNG_TASK, "kworker/9:0", None, "task kworker/9:0 blocked", wall_time=NOW,
                    detail={"pid": "<unknown>"})
    f = one(judge([e]))
    assert "pid unknown" in f.message and f.evidence["longest_blocked_seconds"] is None


def test_soft_lockups_are_degraded_with_the_cpus_and_longest_stall():
    f = one(judge([soft(0, 27, "node:1984"), soft(9, 27, "kworker/9:0:24827"), soft(21, 37, "node:297692")]))
    assert (f.reason, f.severity, f.action, f.device) == ("SoftLockup", Severity.DEGRADED, Action.REBOOT, "")
    assert f.evidence["cpus"] == ["cpu0", "cpu9", "cpu21"] and f.evidence["longest_stuck_seconds"] == 37
    assert "3 times" in f.message and "up to 37 s" in f.message and "cpu0, cpu9, cpu21" in f.message


def test_hard_lockups_are_fatal_for_the_whole_boot():
    f = one(judge([hard(3, age=5 * DAY), hard(10, age=4 * DAY)]))
    assert (f.reason, f.severity, f.action) == ("HardLockup", Severity.FATAL, Action.REBOOT)
    assert f.evidence["cpus"] == ["cpu3", "cpu10"] and "2 times this boot" in f.message


@pytest.mark.parametrize("make,age,window,counted", [
    (lambda a: hung("python", 1, age=a), 2 * HOUR, DAY, True),
    (lambda a: hung("python", 1, age=a), 2 * DAY, DAY, False),
    (lambda a: hung("python", 1, age=a), 2 * HOUR, HOUR, False),
    (lambda a: hung("python", 1, age=a), None, HOUR, True),
    (lambda a: soft(1, 22, age=a), 2 * DAY, DAY, False),
    (lambda a: soft(1, 22, age=a), None, DAY, True),
    (lambda a: hard(1, age=a), 30 * DAY, HOUR, True),
])
def test_window(make, age, window, counted):
    assert len(judge([make(age)], window_seconds=window)) == (1 if counted else 0)


def test_repeats_only_count_inside_the_window():
    events = [hung("python", 1, age=2 * DAY + i) for i in range(5)] + [hung("python", 1, age=10)]
    f = one(judge(events))
    assert f.evidence["count"] == 1 and f.severity is Severity.WARNING


# Shared helpers.

@pytest.mark.parametrize("seconds,words", [(86400.0, "24 h"), (3600.0, "1 h"), (7200, "2 h"), (600.0, "10 min"),
                                           (90.0, "90 s"), (5400.0, "90 min"), (0.5, "0.5 s")])
def test_span(seconds, words):
    assert kernel_log.span(seconds) == words


def test_trim_flattens_and_bounds():
    assert kernel_log.trim("a\n  b\tc") == "a b c"
    assert kernel_log.trim("x" * 500) == "x" * 157 + "..."
    assert kernel_log.trim("y" * 160) == "y" * 160


def test_clock_is_utc():
    assert kernel_log.clock(0) == "1970-01-01 00:00:00 UTC"


def test_latest_distinct_keeps_the_latest_in_order():
    assert kernel_log.latest_distinct([1, 2, 1, 3]) == [2, 1, 3]
    assert kernel_log.latest_distinct(range(20)) == list(range(12, 20))


def test_whole_numbers_skips_what_is_not_one():
    assert kernel_log.whole_numbers([1, "2", "<unknown>", None, True, 3.5, "-4", "²", "9" * 5000]) == [1, 2]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.builds(
    KernelEvent,
    kind=st.sampled_from(KINDS),
    device=st.text(max_size=12),
    code=st.one_of(st.none(), st.integers()),
    text=st.text(max_size=200),
    wall_time=st.one_of(st.none(), st.floats(NOW - 10 * DAY, NOW + HOUR)),
    detail=st.dictionaries(st.sampled_from(["pid", "seconds", "name"]),
                           st.one_of(st.none(), st.integers(), st.text(max_size=8), st.booleans()), max_size=3),
), max_size=30), st.integers(1, 5))
def test_never_raises_and_findings_are_valid(events, repeat):
    for f in judge(events, hung_task_repeat=repeat):
        assert f.severity in (Severity.WARNING, Severity.DEGRADED, Severity.FATAL)
        assert isinstance(f.action, Action) and re.match(r"^[A-Z][A-Za-z]+$", f.reason)
        assert f.message.endswith(".") and f.evidence["count"] >= 1


def test_a_saved_log_is_judged_as_of_its_last_event():
    """`check --kernel-log` on a dead node's log, days later: the window ends where the log ends."""
    old = [hung("python3", 7, age=3 * DAY), soft(2, 23, age=3 * DAY - 60)]
    live = kernel.judge(Observed({"kmsg": KmsgFacts(tuple(old))}, now=NOW), kernel.DEFAULTS)
    assert live == []  # on a live node these are three days old
    replay = kernel.judge(Observed({"kmsg": KmsgFacts(tuple(old), boot_id=None)}, now=NOW), kernel.DEFAULTS)
    assert {f.reason for f in replay} == {"HungTask", "SoftLockup"}
    assert kernel_log.reference_time(Observed({"kmsg": KmsgFacts(tuple(old), boot_id=None)}, now=NOW)) == \
        NOW - 3 * DAY + 60
