"""The dashboards are generated (dashboards/generate.py) and current, and query only metrics nodehealth
exports; the shipped alert rules too. tests/test_dashboard_queries.py runs every query on a real Prometheus."""
from __future__ import annotations

import functools
import json
import os
import re
import sys

import pytest
from conftest import HERE, load_script

ROOT = os.path.dirname(HERE)
NAME = re.compile(r"\bnodehealth_[a-z0-9_]+")


@functools.cache
def generator():
    """dashboards/generate.py, a script rather than a module of the package. Its builders
    (grafana-foundation-sdk, in the test extra from Python 3.11 on) need Python 3.11."""
    if sys.version_info < (3, 11):
        pytest.skip("grafana-foundation-sdk needs Python 3.11")
    return load_script(os.path.join("dashboards", "generate.py"), "dashboards_generate")


def committed() -> dict:
    out = {}
    for uid, path in generator().OUTPUTS.items():
        with open(path) as f:
            out[uid] = f.read()
    return out


def test_the_committed_dashboards_are_what_the_generator_writes():
    gen = generator()
    assert gen.main(["--check"]) == 0
    assert {uid: gen.render(d) for uid, d in gen.dashboards().items()} == committed()


def test_the_generator_refuses_a_family_nodehealth_does_not_export():
    gen = generator()
    exported = gen.exported_families()
    assert gen.check_families({"node": gen.node_rows(), "fleet": gen.fleet_rows()}, exported) == []
    # A renamed family: the panels that query the old name are named.
    missing = gen.check_families({"node": gen.node_rows()}, exported - {"nodehealth_gpu_lost"})
    assert missing == ["node: 'GPUs lost (NVML: fell off the bus)' queries nodehealth_gpu_lost"]
    # Names built at run time (the InfiniBand counters) come from the exporter's output, not the source.
    assert "nodehealth_infiniband_port_symbol_errors_total" in gen.fixture_families()


def test_panel_ids_are_unique_and_every_panel_queries():
    for text in committed().values():
        panels = json.loads(text)["panels"]
        assert len({p["id"] for p in panels}) == len(panels)
        assert all(p.get("targets") for p in panels if p["type"] != "row")


def test_every_fleet_panel_opens_the_node_dashboard_for_its_node():
    node, fleet = (json.loads(committed()[uid]) for uid in ("nodehealth-node", "nodehealth-fleet"))
    assert [v["name"] for v in node["templating"]["list"]] == ["datasource", "cluster", "node"]
    assert [v["name"] for v in fleet["templating"]["list"]] == ["datasource", "cluster"]
    panels = [p for p in fleet["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    for p in panels:
        (link,) = p["fieldConfig"]["defaults"]["links"]
        assert link["url"].startswith(f"/d/{node['uid']}/"), p
        assert "var-cluster=${cluster}" in link["url"]
        node_of_row = link["url"].rsplit("&var-node=", 1)[1]
        # tests/test_dashboard_queries.py checks which panels' series carry an instance
        assert node_of_row in ("${__data.fields.instance}" if p["type"] == "table" else "${__field.labels.instance}",
                               "$__all"), p
    assert not any(p["fieldConfig"]["defaults"].get("links") for p in node["panels"] if p["type"] != "row")


def test_every_alert_rule_uses_exported_metrics():
    """The same families the generator allows the dashboards (a histogram's series by their family)."""
    gen = generator()
    exported = gen.exported_families()
    with open(os.path.join(ROOT, "deploy", "prometheus", "nodehealth-rules.yaml")) as f:
        used = {next((n[:-len(s)] for s in gen.HISTOGRAM_SUFFIXES if n.endswith(s)), n) for n in NAME.findall(f.read())}
    assert "nodehealth_slurm_errors_total" in used
    assert used and used <= exported, sorted(used - exported)


# Families whose value is a code, not an amount: a panel showing one must say what each code means.
ENUM_FAMILIES = {
    "nodehealth_health_status": {0, 1, 2},
    "nodehealth_gpu_nic_relation": {0, 1, 2, 3, 4},
    "nodehealth_infiniband_port_state_id": {1, 2, 3, 5},  # the panel shows the ports that are not ACTIVE (4)
    "nodehealth_kube_breaker_tripped": {0, 1},
}
FILTER = re.compile(r"(==|!=) ?(\d+)\)?$")  # a query that keeps only the series equal to a code: a flag


def panels() -> list[tuple[str, dict]]:
    return [(uid, p) for uid, text in committed().items() for p in json.loads(text)["panels"] if p["type"] != "row"]


def test_every_panel_has_a_description_and_a_unit():
    for uid, p in panels():
        assert len(p.get("description", "")) > 20, (uid, p["title"])
        assert p["fieldConfig"]["defaults"].get("unit"), (uid, p["title"])


def test_panels_of_codes_and_flags_map_every_value_to_a_text_and_a_colour():
    """A flag (a query keeping the series equal to 1, or to 0) or a code (ENUM_FAMILIES) is never shown
    as a bare number: the verdict stat once showed a green 1 for an unhealthy node."""
    checked = 0
    for uid, p in panels():
        exprs = [t["expr"] for t in p["targets"]]
        codes = set()
        for expr in exprs:
            named = {f for f in ENUM_FAMILIES if f in expr and "count" not in expr.split(f)[0][-12:]}
            flag = FILTER.search(expr.strip())
            if named:
                codes |= set().union(*(ENUM_FAMILIES[f] for f in named))
            elif flag and flag.group(1) == "==" and not expr.startswith(("count", "sum", "topk", "sort_desc")):
                codes.add(int(flag.group(2)))
        if not codes:
            continue
        checked += 1
        mapped = {}
        for mapping in p["fieldConfig"]["defaults"].get("mappings", []):
            assert mapping["type"] == "value", (uid, p["title"])
            mapped.update(mapping["options"])
        for code in codes:
            result = mapped.get(str(code))
            assert result and result.get("text") and result.get("color"), (uid, p["title"], code)
    assert checked >= 15


def test_the_verdict_stat_shows_an_unhealthy_node_in_red_words():
    node = json.loads(committed()["nodehealth-node"])
    [verdict] = [p for p in node["panels"] if p["title"] == "Node verdict"]
    [mapping] = verdict["fieldConfig"]["defaults"]["mappings"]
    assert mapping["options"]["1"] == {"text": "unhealthy", "color": "red", "index": 1}
    assert mapping["options"]["0"]["color"] == "green" and mapping["options"]["2"]["text"] == "unknown"


def test_every_ratio_has_thresholds():
    for uid, p in panels():
        if p["fieldConfig"]["defaults"]["unit"] == "percentunit":
            steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
            assert len(steps) >= 2 and steps[0]["color"] == "green", (uid, p["title"])
            assert steps == sorted(steps, key=lambda s: -1 if s["value"] is None else s["value"])


def test_rates_follow_the_scrape_interval_and_every_query_is_scoped_to_the_cluster():
    for uid, p in panels():
        for t in p["targets"]:
            assert "[5m]" not in t["expr"], (uid, p["title"])
            for window in re.findall(r"\b(?:rate|irate)\([^\[]*\[([^\]]+)\]", t["expr"]):
                assert window == "$__rate_interval", (uid, p["title"], t["expr"])
            for selector in re.findall(r"\bnodehealth_[a-z0-9_]+(\{[^}]*\})?", t["expr"]):
                assert 'cluster=~"$cluster"' in selector, (uid, p["title"], t["expr"])


def test_both_dashboards_annotate_verdict_changes_and_taints():
    for text in committed().values():
        annotations = {a["name"]: a for a in json.loads(text)["annotations"]["list"]}
        assert "nodehealth_health_status" in annotations["Verdict changes"]["expr"]
        assert "nodehealth_kube_taint_applied" in annotations["nodehealth taints"]["expr"]
        for a in (annotations["Verdict changes"], annotations["nodehealth taints"]):
            assert a["enable"] is True and a["titleFormat"] and 'cluster=~"$cluster"' in a["expr"]


def test_the_grafana_component_ships_the_committed_dashboards():
    """deploy/components/grafana-dashboards: one ConfigMap per dashboard, labelled for Grafana's
    sidecar, holding the committed JSON as it is."""
    import yaml

    folder = os.path.join(ROOT, "deploy", "components", "grafana-dashboards")
    with open(os.path.join(folder, "kustomization.yaml")) as f:
        component = yaml.safe_load(f)
    shipped = {}
    for name in component["resources"]:
        with open(os.path.join(folder, name)) as f:
            doc = yaml.safe_load(f)
        assert doc["kind"] == "ConfigMap" and doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        shipped.update(doc["data"])
    by_file = {}
    for path in ("nodehealth-node.json", "nodehealth-fleet.json"):
        with open(os.path.join(ROOT, "dashboards", path)) as f:
            by_file[path] = f.read()
    assert shipped == by_file
