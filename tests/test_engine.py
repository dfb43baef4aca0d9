import threading
import time
import types
from dataclasses import dataclass

from nodehealth import config
from nodehealth.engine import Engine
from nodehealth.host import HostPaths
from nodehealth.model import Finding, Severity


@dataclass(frozen=True)
class Facts:
    value: int


def collector(name, collect, supported=None, counters=None):
    m = types.SimpleNamespace(NAME=name, DEFAULTS={}, supported=lambda host, cfg: supported,
                              collect=collect, metrics=lambda facts: [])
    if counters:
        m.counters = counters
    return m


def check(name, needs, judge):
    return types.SimpleNamespace(NAME=name, NEEDS=needs, DEFAULTS={}, DEBOUNCE=False, judge=judge)


def engine(collectors, checks, timeout=1.0, clock=time.time):
    cfg = config.defaults()
    cfg["collectors"].update({c.NAME: {} for c in collectors})
    cfg["checks"].update({c.NAME: {} for c in checks})
    return Engine(collectors, checks, HostPaths("/nonexistent"), cfg, timeout=timeout, clock=clock)


def says(check_name):
    return lambda obs, cfg: [Finding(check_name, Severity.WARNING, "Saw", f"saw {obs.facts}")]


def test_a_failing_collector_makes_only_its_checks_unknown():
    def boom(host, cfg):
        raise OSError(13, "Permission denied", "/proc/x")
    e = engine([collector("bad", boom), collector("good", lambda h, c: Facts(1))],
               [check("b", ("bad",), says("b")), check("g", ("good",), says("g"))])
    results, findings = e.run()
    assert not results["bad"].success and results["bad"].error == "Permission denied: /proc/x"
    assert results["good"].success
    assert {(f.check, f.severity) for f in findings} == {("b", Severity.UNKNOWN), ("g", Severity.WARNING)}


def test_a_collector_whose_failure_has_its_own_reason_gives_its_checks_one_finding():
    """The kernel log read by seven checks: unreadable, it is one finding naming the fix, not seven."""
    def refused(host, cfg):
        raise OSError(1, "Operation not permitted", "/dev/kmsg")
    log = collector("log", refused)
    log.FAILED_REASON = "LogUnreadable"
    e = engine([log, collector("good", lambda h, c: Facts(1))],
               [check("a", ("log",), says("a")), check("b", ("log",), says("b")), check("both", ("good", "log"),
                                                                                   says("both")),
                check("g", ("good",), says("g"))])
    results, findings = e.run()
    assert results["log"].failed_reason == "LogUnreadable"
    [one] = [f for f in findings if f.severity is Severity.UNKNOWN]
    assert (one.check, one.reason, one.device) == ("log", "LogUnreadable", "")
    assert one.message == ("Could not judge a, b and both: collector log failed: Operation not permitted: "
                           "/dev/kmsg.")
    assert one.evidence == {"checks": ["a", "b", "both"], "error": "Operation not permitted: /dev/kmsg"}
    assert [f.check for f in findings if f.severity is Severity.WARNING] == ["g"]


def test_unsupported_collector_skips_its_checks_silently():
    e = engine([collector("ib", lambda h, c: Facts(1), supported="no InfiniBand devices")],
               [check("ib", ("ib",), says("ib"))])
    results, findings = e.run()
    assert results["ib"].supported is False and results["ib"].error == "no InfiniBand devices"
    assert findings == []


def test_a_collector_that_hangs_times_out_and_is_not_started_again_while_stuck():
    release = threading.Event()
    started = []

    def hang(host, cfg):
        started.append(1)
        release.wait(10)
        return Facts(1)
    e = engine([collector("nfs", hang), collector("fast", lambda h, c: Facts(2))],
               [check("n", ("nfs",), says("n"))], timeout=0.2)
    t0 = time.monotonic()
    results, findings = e.run()
    assert time.monotonic() - t0 < 5.0  # not the collector's 10 s: room for a loaded machine
    assert results["nfs"].error == "timed out after 0.2s" and results["fast"].success
    assert findings[0].severity is Severity.UNKNOWN
    results, _ = e.run()
    assert results["nfs"].error == "still stuck in a read from an earlier pass"
    assert len(started) == 1
    release.set()
    deadline = time.monotonic() + 10
    while not results["nfs"].success and time.monotonic() < deadline:  # until the stuck read has returned
        time.sleep(0.05)
        results, _ = e.run()
    assert results["nfs"].success and len(started) == 2


def test_a_crashing_check_is_unknown_not_an_exception():
    def crash(obs, cfg):
        raise KeyError("x")
    e = engine([collector("c", lambda h, c: Facts(1))], [check("k", ("c",), crash)])
    _, findings = e.run()
    assert findings[0].reason == "CheckFailed" and findings[0].severity is Severity.UNKNOWN


def test_rates_from_counters_between_passes_and_none_after_a_reset():
    values = iter([10, 40, 5])
    now = iter([100.0, 110.0, 120.0])
    seen = []
    e = engine([collector("c", lambda h, c: Facts(next(values)), counters=lambda f: {"x": f.value})],
               [check("k", ("c",), lambda obs, cfg: seen.append(obs.rate("c", "x")) or [])],
               clock=lambda: next(now))
    e.run()
    e.run()
    e.run()
    assert seen == [None, 3.0, None]


def test_a_failed_pass_does_not_inflate_the_next_rate():
    values = iter([0, None, None, 90])
    now = iter([0.0, 30.0, 60.0, 90.0])
    seen = []

    def collect(host, cfg):
        v = next(values)
        if v is None:
            raise OSError(5, "Input/output error", "/sys/x")
        return Facts(v)
    e = engine([collector("c", collect, counters=lambda f: {"x": f.value})],
               [check("k", ("c",), lambda obs, cfg: seen.append(obs.rate("c", "x")) or [])],
               clock=lambda: next(now))
    for _ in range(4):
        e.run()
    assert seen == [None, 1.0]  # 90 over the 90 s since the last good sample, not over 30 s


def test_a_collector_may_lift_its_deadline_for_finite_work():
    """`check --kernel-log` on a log of a million lines takes longer than the collector deadline."""
    from nodehealth.collectors import kmsg

    slow = collector("saved", lambda host, cfg: (time.sleep(0.5), Facts(1))[1])
    slow.deadline = kmsg.deadline
    e = engine([slow], [check("s", ("saved",), says("s"))], timeout=0.1)
    e.config["collectors"]["saved"] = {"files": ["kern.log"]}
    results, findings = e.run()
    assert results["saved"].success and [f.reason for f in findings] == ["Saw"]
    e.config["collectors"]["saved"] = {"files": []}  # the live /dev/kmsg keeps the engine's deadline
    results, findings = e.run()
    assert not results["saved"].success and "timed out" in results["saved"].error


def test_the_checks_that_fold_into_one_finding_are_not_debounced():
    """A folded failure says unknown under the collector's name, not each check's: the policy, which keeps a
    raised debounced finding while its own check says unknown, would not see those checks as unknown."""
    from nodehealth import registry
    folding = {m.NAME for m in registry.COLLECTORS if getattr(m, "FAILED_REASON", None)}
    assert folding == {"kmsg"}
    for c in registry.CHECKS:
        if folding & set(c.NEEDS):
            assert not c.DEBOUNCE and not getattr(c, "EVENT_REASONS", ()), c.NAME
