"""The exposition text: parsed back by prometheus_client's parser (an independent oracle)."""
from __future__ import annotations

import math
import re

import pytest
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
    # a family rendered again as it was is written as before; then one value moves, or a label, or a NaN comes
    same = ((("a",), 1), (("b",), 2))
    assert family(("device",), *same) == family(("device",), *same) == [
        'nodehealth_cache_probe{device="a"} 1', 'nodehealth_cache_probe{device="b"} 2']
    assert family(("device",), (("a",), 1), (("b",), 7)) == [
        'nodehealth_cache_probe{device="a"} 1', 'nodehealth_cache_probe{device="b"} 7']
    assert family(("device",), (("a",), 1), (("c",), 7)) == [
        'nodehealth_cache_probe{device="a"} 1', 'nodehealth_cache_probe{device="c"} 7']
    assert family(("device",), (("a",), math.nan)) == family(("device",), (("a",), math.nan)) == [
        'nodehealth_cache_probe{device="a"} NaN']
    # the same series again with one value moved: only that line changes, in label order whatever the samples' order
    spaced = (("e f",), 3), (("a b",), 1), (("c d",), 2)
    assert family(("device",), *spaced) == [
        'nodehealth_cache_probe{device="a b"} 1', 'nodehealth_cache_probe{device="c d"} 2',
        'nodehealth_cache_probe{device="e f"} 3']
    assert family(("device",), spaced[0], spaced[1], (("c d",), 2.25)) == [
        'nodehealth_cache_probe{device="a b"} 1', 'nodehealth_cache_probe{device="c d"} 2.25',
        'nodehealth_cache_probe{device="e f"} 3']
    assert family(("device",), (("e f",), 1e300), (("a b",), -0.0), (("c d",), math.inf)) == [
        'nodehealth_cache_probe{device="a b"} 0', 'nodehealth_cache_probe{device="c d"} +Inf',
        'nodehealth_cache_probe{device="e f"} 1e+300']
    assert family(("device",), (("a b",), -0.0), (("e f",), 1e300), (("c d",), math.inf)) == [  # another order
        'nodehealth_cache_probe{device="a b"} 0', 'nodehealth_cache_probe{device="c d"} +Inf',
        'nodehealth_cache_probe{device="e f"} 1e+300']


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


# -- the families an operator can afford: exporter.exclude_families and exporter.detail ------------------

def nvlink_report():
    """A pass over the 8xH100 fixture (NVML from its scenario file): the NVLink families per link."""
    from conftest import machine

    from nodehealth import config, node_pass
    cfg = config.defaults()
    engine = node_pass.build_engine(cfg, machine("nvml-h100-healthy"))
    results, findings = engine.run()
    report = Report("n", Status.HEALTHY, findings, list(results.values()))
    return exporter.report_metrics(report, engine.collectors)


def series(metrics) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in exporter.render(metrics).decode().splitlines():
        if not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            out[name] = out.get(name, 0) + 1
    return out


def test_excluded_families_are_left_out_by_name_or_pattern():
    metrics = nvlink_report()
    settings = dict(exporter.DEFAULTS, exclude_families=["nodehealth_gpu_info", "nodehealth_gpu_nvlink_*_total"])
    shaped = series(exporter.shape(metrics, settings))
    full = series(metrics)
    assert "nodehealth_gpu_info" in full and "nodehealth_gpu_info" not in shaped
    assert {n for n in full if n.startswith("nodehealth_gpu_nvlink_") and n.endswith("_total")}
    assert not {n for n in shaped if n.startswith("nodehealth_gpu_nvlink_") and n.endswith("_total")}
    assert shaped["nodehealth_gpu_nvlink_active"] == full["nodehealth_gpu_nvlink_active"]
    assert series(exporter.shape(metrics, exporter.DEFAULTS)) == full  # the defaults change nothing


def test_nvlink_per_link_off_sums_each_family_over_the_gpus_links():
    metrics = nvlink_report()
    settings = dict(exporter.DEFAULTS, detail={"nvlink_per_link": False})
    full, shaped = series(metrics), series(exporter.shape(metrics, settings))
    assert full["nodehealth_gpu_nvlink_active"] == 144 and shaped["nodehealth_gpu_nvlink_active"] == 8
    assert full["nodehealth_gpu_nvlink_errors_total"] == 576 and shaped["nodehealth_gpu_nvlink_errors_total"] == 32
    assert {n: c for n, c in shaped.items() if not n.startswith("nodehealth_gpu_nvlink_")} == {
        n: c for n, c in full.items() if not n.startswith("nodehealth_gpu_nvlink_")}
    families = parse(exporter.render(exporter.shape(metrics, settings)))
    active = families["nodehealth_gpu_nvlink_active"]
    assert "link" not in active.samples[0].labels and "summed over the GPU's links" in active.documentation
    # The sums are the per-link values added up: 18 links up per GPU, and the errors of every link.
    assert {s.labels["gpu"]: s.value for s in active.samples} == {str(i): 18.0 for i in range(8)}
    per_link = parse(exporter.render(metrics))["nodehealth_gpu_nvlink_errors"].samples
    summed = families["nodehealth_gpu_nvlink_errors"].samples
    for sample in summed:
        assert sample.value == sum(s.value for s in per_link if s.labels["gpu"] == sample.labels["gpu"]
                                   and s.labels["type"] == sample.labels["type"] and s.name == sample.name)


def test_the_daemon_serves_the_shaped_families(tmp_path, daemon_factory):
    """Through a config directory, as the DaemonSet gives it: the base file, then an overlay's one key."""
    from conftest import machine
    (tmp_path / "config.d").mkdir()
    (tmp_path / "config.d" / "00-base.yaml").write_text("exporter:\n  exclude_families: [nodehealth_pcie_*]\n")
    (tmp_path / "config.d" / "90-site.yaml").write_text("exporter:\n  detail: {nvlink_per_link: false}\n")
    d = daemon_factory(machine("nvml-h100-healthy"), str(tmp_path / "state"), "--config", str(tmp_path / "config.d"))
    d.wait_ready()
    families = parse(d.get("/metrics")[1])
    assert not [n for n in families if n.startswith("nodehealth_pcie_")]
    assert len(families["nodehealth_gpu_nvlink_active"].samples) == 8
    assert "nodehealth_gpu_info" in families


def fixture_daemon(tmp_path, settings: dict | None = None):
    from conftest import machine

    from nodehealth import config, node_pass
    from nodehealth.daemon import Daemon
    cfg = config.load(None)
    cfg["daemon"]["state_dir"] = str(tmp_path / "state")
    cfg["exporter"].update(settings or {})
    return Daemon(node_pass.build_engine(cfg, machine("h100-8x-cx7"), ["buddyinfo", "vm", "infiniband"]), cfg, "n")


def test_a_report_is_written_out_once_at_its_first_scrape_and_later_scrapes_read_that_text(tmp_path, monkeypatch):
    d = fixture_daemon(tmp_path, {"exclude_families": ["nodehealth_pagetype_*"]})
    assert d.exposition() == b""  # before the first pass: nothing, as node_exporter before its first read
    written = []
    report_metrics = exporter.report_metrics
    monkeypatch.setattr(exporter, "report_metrics", lambda *a: written.append(a) or report_metrics(*a))
    d.run_pass()
    assert written == []  # published, not written: no scrape has read it yet
    shown = {m.name.removesuffix("_total") for m in exporter.shape(d.metrics(), d.cfg["exporter"]) if m.samples}
    written.clear()
    text = d.exposition().decode()
    names = re.findall(r"^# TYPE (\S+)", text, re.M)
    assert names == sorted(names) and "nodehealth_daemon_passes_total" in names  # the two parts in one order
    scrapes = [parse(d.exposition()) for _ in range(3)]
    assert len(written) == 1  # four scrapes of one report: written at the first
    families = scrapes[-1]
    assert set(families) == shown  # every family, once (the parser names a counter's without _total)
    assert "nodehealth_infiniband_port_hw_events" in families and "nodehealth_daemon_passes" in families
    assert not [n for n in families if n.startswith("nodehealth_pagetype_")]  # the exporter settings, shaped
    assert families["nodehealth_daemon_passes"].samples[0].value == 1
    with d.lock:  # the daemon's own families are read at each scrape, with no report written again
        d.passes = 7
    assert parse(d.exposition())["nodehealth_daemon_passes"].samples[0].value == 7 and len(written) == 1
    d.run_pass()  # a new report: written again at its first scrape
    d.exposition()
    assert len(written) == 2


def test_a_report_whose_families_cannot_be_written_fails_the_scrape_not_shows_the_last_figures(tmp_path,
                                                                                                monkeypatch):
    d = fixture_daemon(tmp_path)
    d.run_pass()
    assert b"nodehealth_infiniband_port_state_id" in d.exposition()

    def broken(*args):
        raise ValueError("a bug")
    d.run_pass()
    monkeypatch.setattr(exporter, "written", broken)
    with pytest.raises(ValueError, match="a bug"):  # the server answers a route that raises 500, counted
        d.routes()["/metrics"]("")
    monkeypatch.undo()
    assert b"nodehealth_infiniband_port_state_id" in d.exposition()  # the next scrape writes it


def test_join_merges_written_parts_in_name_order_and_keeps_the_first_of_a_name(caplog):
    def family(name: str, value: float) -> Metric:
        m = Metric(name, "h")
        m.add((), value)
        return m
    first = exporter.written([family("b", 1), family("d", 1)])
    second = exporter.written([family("a", 2), family("b", 2), family("c", 2)])
    text = exporter.join(first, second).decode()
    assert re.findall(r"^(\w) (\d)$", text, re.M) == [("a", "2"), ("b", "1"), ("c", "2"), ("d", "1")]
    assert "metric family b emitted twice" in caplog.text
