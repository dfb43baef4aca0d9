"""The link_events check: ports down, flapping, or down and recovered, from kernel-log link events."""
from __future__ import annotations

import re

import pytest
from conftest import KmsgFacts
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.checks import link_events
from nodehealth.collectors.kernel_events import KINDS, LINK_DOWN, LINK_UP, KernelEvent
from nodehealth.model import Action, Observed, Severity

NOW = 1_700_000_000.0
MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0


def judge(events, now=NOW, **cfg):
    return link_events.judge(Observed({"kmsg": KmsgFacts(tuple(events))}, now=now),
                             dict(link_events.DEFAULTS, **cfg))


def down(port="eth1", age=60.0, mono=None):
    return KernelEvent(LINK_DOWN, port, None, f"mlx5_core 0000:01:00.1 {port}: Link down",
                       monotonic_us=mono, wall_time=None if age is None else NOW - age)


def up(port="eth1", age=50.0, mono=None):
    return KernelEvent(LINK_UP, port, None, f"mlx5_core 0000:01:00.1 {port}: Link up",
                       monotonic_us=mono, wall_time=None if age is None else NOW - age)


def linked(port="eth1"):
    """The port coming up at boot, three days ago: only downs after an up are drops."""
    return up(port, age=3 * DAY)


def cycles(n, port="eth1", start=2 * HOUR, every=10 * MINUTE):
    """The port up at boot, then n down-then-up cycles, `every` seconds apart, the first `start` seconds ago."""
    out = [linked(port)]
    for i in range(n):
        out += [down(port, start - i * every), up(port, start - i * every - 5)]
    return out


def reasons(findings):
    return sorted((f.device, f.reason, f.severity) for f in findings)


def test_no_events_and_ups_alone_give_nothing():
    assert judge([]) == []
    assert judge([up(age=300), up(age=200), up(age=100)]) == []  # cubecos#733: repeated "Link up" only
    assert judge([KernelEvent("xid", "0000:3b:00.0", 79, "GPU has fallen off the bus.")]) == []


def test_a_port_never_seen_up_is_unused_not_down():
    # gpud dmesg.decode.iso.log.1: uncabled ports brought up at boot print only "Link down".
    boot = [KernelEvent(LINK_DOWN, "enp157s0f1np1", None, "mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down",
                        wall_time=NOW - 600),
            KernelEvent(LINK_UP, "bootnet", None, "mlx5_core 0000:1b:00.0 bootnet: Link up", wall_time=NOW - 598)]
    assert judge(boot) == []


def test_downs_before_the_first_up_are_bring_up_not_drops():
    assert judge([down(age=600), down(age=590), up(age=580)]) == []
    assert [f.reason for f in judge([down(age=600), up(age=580), down(age=120)])] == ["LinkDown"]


def test_a_down_without_an_up_is_link_down():
    f = judge([up(age=500), down(age=120)])
    assert reasons(f) == [("eth1", "LinkDown", Severity.DEGRADED)]
    assert f[0].action is Action.HW_INSPECTION and f[0].check == "link_events"
    assert "Port eth1 went down at" in f[0].message and "no link up since" in f[0].message
    assert (f[0].first_seen, f[0].last_seen) == (NOW - 120, NOW - 120)


def test_a_down_that_came_back_is_a_warning():
    f = judge([linked(), down(age=120), up(age=100)])
    assert reasons(f) == [("eth1", "LinkDownRecovered", Severity.WARNING)]
    assert f[0].action is Action.NONE and "came back up" in f[0].message and "once" in f[0].message


@pytest.mark.parametrize("n,flap_count,expected", [
    (2, 3, "LinkDownRecovered"),
    (3, 3, "LinkFlapping"),
    (5, 5, "LinkFlapping"),
    (4, 5, "LinkDownRecovered"),
])
def test_flapping_threshold(n, flap_count, expected):
    f = judge(cycles(n), flap_count=flap_count)
    assert [x.reason for x in f] == [expected]
    if expected == "LinkFlapping":
        assert f[0].severity is Severity.DEGRADED and f[0].evidence["most_downs_in_flap_window"] == n
        assert f"{n} times within 1 h" in f[0].message and f"flap limit of {flap_count}" in f[0].message


def test_downs_spread_wider_than_the_flap_window_are_not_a_flap():
    f = judge(cycles(4, every=2 * HOUR, start=10 * HOUR))
    assert [x.reason for x in f] == ["LinkDownRecovered"] and f[0].evidence["downs"] == 4
    assert "4 times" in f[0].message and "each time" in f[0].message
    assert [x.reason for x in judge(cycles(4, every=2 * HOUR, start=10 * HOUR), flap_window_seconds=6 * HOUR)] == [
        "LinkFlapping"]


def test_flapping_and_still_down_gives_both():
    f = judge(cycles(3) + [down(age=60)])
    assert reasons(f) == [("eth1", "LinkDown", Severity.DEGRADED), ("eth1", "LinkFlapping", Severity.DEGRADED)]


def test_each_port_is_judged_on_its_own():
    f = judge(cycles(3, "mlx5_0") + [linked("mlx5_1"), down("mlx5_1", 100)] + cycles(1, "eth0"))
    assert reasons(f) == [("eth0", "LinkDownRecovered", Severity.WARNING),
                          ("mlx5_0", "LinkFlapping", Severity.DEGRADED),
                          ("mlx5_1", "LinkDown", Severity.DEGRADED)]


@pytest.mark.parametrize("events,window,expected", [
    ([down(age=2 * DAY)], DAY, []),
    ([down(age=2 * DAY), up(age=DAY)], DAY, []),
    ([down(age=2 * HOUR)], HOUR, []),
    ([down(age=2 * HOUR)], DAY, ["LinkDown"]),
    ([down(age=None)], HOUR, ["LinkDown"]),  # replayed log without wall time
])
def test_window(events, window, expected):
    assert [f.reason for f in judge([linked()] + events, window_seconds=window)] == expected


def test_old_downs_do_not_count_towards_a_flap():
    f = judge(cycles(2, start=2.5 * DAY) + cycles(2, start=2 * HOUR))
    assert [x.reason for x in f] == ["LinkDownRecovered"] and f[0].evidence["downs"] == 2


def test_monotonic_time_is_used_when_every_down_has_it():
    # Wall times spread over a day (a clock that jumped), monotonic times inside ten minutes.
    events = [down(age=20 * HOUR - i * 8 * HOUR, mono=(1000 + i * 300) * 10 ** 6) for i in range(3)]
    events = [linked()] + [x for e in events for x in (e, up(age=NOW - e.wall_time - 5))]
    assert [x.reason for x in judge(events)] == ["LinkFlapping"]


def test_hca_ports_are_named_like_the_infiniband_check_names_them():
    # gpud#1209: "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT" ... "Link ACTIVE"; the collector
    # gives the HCA as device and the port number in detail.
    def hca(kind, age, port):
        return KernelEvent(kind, "mlx5_5", None, f"mlx5_core 0000:ab:00.0 mlx5_5: Port: {port} Link x",
                           wall_time=NOW - age, detail={"pci_bus_id": "0000:ab:00.0", "port": port})
    f = judge([hca(LINK_UP, 900, 1), hca(LINK_UP, 900, 2), hca(LINK_DOWN, 300, 1), hca(LINK_UP, 200, 1),
               hca(LINK_DOWN, 100, 2)])
    assert reasons(f) == [("mlx5_5:1", "LinkDownRecovered", Severity.WARNING),
                          ("mlx5_5:2", "LinkDown", Severity.DEGRADED)]


def test_downs_without_any_time_may_all_fall_in_one_window():
    assert link_events.most_in_span([down(age=None)] * 3, HOUR) == 3
    assert link_events.most_in_span([down(age=5 * HOUR), down(age=None), down(age=1 * HOUR)], HOUR) == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.builds(
    KernelEvent,
    kind=st.sampled_from(KINDS),
    device=st.sampled_from(["eth1", "mlx5_0", ""]),
    detail=st.dictionaries(st.just("port"), st.one_of(st.none(), st.integers(), st.booleans(), st.text(max_size=3))),
    text=st.text(max_size=200),
    monotonic_us=st.one_of(st.none(), st.integers(0, 10 ** 13)),
    wall_time=st.one_of(st.none(), st.floats(NOW - 10 * DAY, NOW + HOUR)),
), max_size=40), st.integers(1, 5), st.sampled_from([60.0, HOUR, DAY]))
def test_never_raises_and_findings_are_valid(events, flap_count, flap_window):
    for f in judge(events, flap_count=flap_count, flap_window_seconds=flap_window):
        assert f.reason in ("LinkDown", "LinkFlapping", "LinkDownRecovered")
        assert f.severity in (Severity.WARNING, Severity.DEGRADED) and isinstance(f.action, Action)
        assert re.match(r"^Port .* went down", f.message) and f.message.endswith(".")
        assert f.evidence["downs"] >= 1
