import pytest

from nodehealth.model import Action, Finding, Metric, Severity, Status, sort_findings, verdict


def f(sev, check="c", reason="R", device=""):
    return Finding(check, sev, reason, "m", device)


@pytest.mark.parametrize("severities, fail_on_warning, expected", [
    ([], False, Status.HEALTHY),
    ([Severity.INFO, Severity.WARNING], False, Status.HEALTHY),
    ([Severity.WARNING], True, Status.UNHEALTHY),
    ([Severity.UNKNOWN, Severity.WARNING], False, Status.UNKNOWN),
    ([Severity.UNKNOWN, Severity.DEGRADED], False, Status.UNHEALTHY),
    ([Severity.FATAL], False, Status.UNHEALTHY),
])
def test_verdict(severities, fail_on_warning, expected):
    assert verdict([f(s) for s in severities], fail_on_warning) is expected


def test_status_codes_are_the_exit_codes():
    assert [s.code for s in Status] == [0, 1, 2]


def test_sort_is_worst_first_then_stable():
    items = [f(Severity.WARNING, "b"), f(Severity.FATAL, "z"), f(Severity.WARNING, "a", device="x")]
    assert [(x.severity, x.check) for x in sort_findings(items)] == [
        (Severity.FATAL, "z"), (Severity.WARNING, "a"), (Severity.WARNING, "b")]


def test_finding_round_trips_through_dict():
    x = Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "gone", "0000:3b:00.0", Action.REBOOT,
                {"count": 2}, 1.0, 2.0)
    assert Finding.from_dict(x.to_dict()) == x
    assert Finding.from_dict(x.to_dict()).evidence == {"count": 2}


def test_metric_rejects_bad_shapes_and_skips_absent_values():
    with pytest.raises(ValueError):
        Metric("x_total", "h", kind="summary")
    with pytest.raises(ValueError):
        Metric("x", "h", kind="counter")
    with pytest.raises(ValueError):  # a histogram's samples come from add_histogram only
        Metric("x", "h", kind="gauge").add_histogram((), (1.0,), {}, 0.0)
    h = Metric("h_seconds", "h", kind="histogram", labels=("g",))
    h.add_histogram(("a",), (1.0, 2.0), {0: 1}, 0.5)
    with pytest.raises(ValueError):  # every series of one family shares its buckets
        h.add_histogram(("b",), (1.0, 3.0), {}, 0.0)
    m = Metric("x", "h", labels=("a",))
    m.add(("1",), None)
    assert m.samples == []
    with pytest.raises(ValueError):
        m.add((), 1)
    m.add((3,), 2)
    assert m.samples == [(("3",), 2.0)]
    # put: labels a hot loop made once, already strings; the same checks on the shape and on absence
    labels = ("4",)
    m.put(labels, 5)
    m.put(labels, None)
    assert m.samples[1:] == [(("4",), 5.0)] and m.samples[1][0] is labels
    with pytest.raises(ValueError):
        m.put(("4", "5"), 1)


def test_the_json_report_is_strict_json_without_nan_or_infinity():
    import json
    import math

    from nodehealth import report as render
    from nodehealth.model import Finding, Report, Severity, Status

    f = Finding("infiniband", Severity.WARNING, "X", "m", evidence={"rate": math.nan, "limits": [math.inf, 1.5]},
                first_seen=-math.inf, last_seen=2.0)
    text = render.to_json(Report("n", Status.HEALTHY, [f], []))

    def refuse(name):
        raise AssertionError(f"{name} in the JSON report")

    doc = json.loads(text, parse_constant=refuse)
    assert doc["findings"][0]["evidence"] == {"rate": None, "limits": [None, 1.5]}
    assert doc["findings"][0]["first_seen"] is None and doc["findings"][0]["last_seen"] == 2.0
