"""The exposition text: parsed back by prometheus_client's parser (an independent oracle)."""
from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from nodehealth import exporter
from nodehealth.model import Action, CollectorResult, Finding, Metric, Report, Severity, Status


def parse(body: bytes):
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_render_round_trips_through_the_reference_parser():
    g = Metric("nodehealth_x_bytes", 'Odd help with a \\ backslash\nand newline.', labels=("device", "port"))
    g.add(("mlx5_1", 1), 5e10)
    g.add(('we"ird\\na\nme', 2), 0.25)
    g.add(("inf", 3), math.inf)
    c = Metric("nodehealth_y_total", "A counter.", kind="counter")
    c.add((), 123456789012345)
    families = parse(exporter.render([c, g]))
    x = families["nodehealth_x_bytes"]
    assert x.type == "gauge" and x.documentation == 'Odd help with a \\ backslash\nand newline.'
    values = {s.labels["device"]: s.value for s in x.samples}
    assert values == {"mlx5_1": 5e10, 'we"ird\\na\nme': 0.25, "inf": math.inf}
    y = families["nodehealth_y"]
    assert y.type == "counter" and y.samples[0].value == 123456789012345


def test_output_is_sorted_and_stable():
    a = Metric("b_metric", "b", labels=("k",))
    for k in ("z", "a", "m"):
        a.add((k,), 1)
    b = Metric("a_metric", "a")
    b.add((), 1)
    text = exporter.render([a, b]).decode()
    assert text.index("a_metric") < text.index("b_metric")
    assert [line.split('"')[1] for line in text.splitlines() if line.startswith("b_metric{")] == ["a", "m", "z"]
    assert exporter.render([a, b]) == exporter.render([b, a])


def test_each_render_writes_the_series_it_is_given_whatever_came_before():
    """Renders remember how they wrote each series; what they remember never leaks into a later render."""
    def family(label_names, *samples):
        m = Metric("nodehealth_cache_probe", "h", labels=label_names)
        for labels, value in samples:
            m.add(labels, value)
        return exporter.render([m]).decode().splitlines()[2:]

    assert family(("device",), (("a",), 1), (("b",), 2.5)) == [
        'nodehealth_cache_probe{device="a"} 1', 'nodehealth_cache_probe{device="b"} 2.5']
    assert family(("device",), (("b",), 3), (("c",), 4)) == [  # a series gone, one new, a value changed
        'nodehealth_cache_probe{device="b"} 3', 'nodehealth_cache_probe{device="c"} 4']
    assert family(("port",), (("b",), 3)) == ['nodehealth_cache_probe{port="b"} 3']  # other label names
    assert family(("device", "port"), (("b", "1"), 3)) == ['nodehealth_cache_probe{device="b",port="1"} 3']
    assert family(("device",), (('q"\\\n',), 5)) == ['nodehealth_cache_probe{device="q\\"\\\\\\n"} 5']
    assert family((), ((), 6)) == ["nodehealth_cache_probe 6"]


def test_a_duplicate_family_is_dropped_not_fatal():
    one, two = Metric("dup", "first"), Metric("dup", "second")
    one.add((), 1)
    two.add((), 2)
    text = exporter.render([one, two]).decode()
    assert text.count("# TYPE dup") == 1 and "dup 1" in text


def test_core_metrics_are_always_present():
    report = Report("n", Status.UNHEALTHY,
                    [Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "m", "0000:1b:00.0", Action.REBOOT)],
                    [CollectorResult("kmsg", True, True, 0.1), CollectorResult("infiniband", False, False, 0, "none")])
    families = parse(exporter.render(exporter.report_metrics(report, [])))
    assert families["nodehealth_health_status"].samples[0].value == 1
    assert {s.labels["collector"]: s.value for s in families["nodehealth_collector_success"].samples} == {
        "kmsg": 1, "infiniband": 0}
    finding = families["nodehealth_finding"].samples[0]
    assert finding.labels == {"check": "xid", "severity": "fatal", "reason": "Xid79FallenOffBus",
                              "device": "0000:1b:00.0"}
    assert families["nodehealth_build_info"].samples[0].labels["version"]
    counts = {s.labels["severity"]: s.value for s in families["nodehealth_findings"].samples}
    assert counts["fatal"] == 1 and counts["warning"] == 0


def test_a_collector_whose_metrics_crash_does_not_take_metrics_down():
    class Broken:
        NAME = "broken"

        @staticmethod
        def metrics(facts):
            raise RuntimeError("bad facts")
    report = Report("n", Status.HEALTHY, [], [CollectorResult("broken", True, True, 0.0, None, object())])
    assert "nodehealth_health_status" in parse(exporter.render(exporter.report_metrics(report, [Broken])))
