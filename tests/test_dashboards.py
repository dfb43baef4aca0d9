"""The dashboards are generated (dashboards/generate.py) and current, and query only metrics nodehealth
exports; the shipped alert rules too. tests/test_dashboard_queries.py runs every query on a real Prometheus."""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import sys

import pytest
from conftest import HERE

ROOT = os.path.dirname(HERE)
NAME = re.compile(r"\bnodehealth_[a-z0-9_]+")


@functools.cache
def generator():
    """dashboards/generate.py, a script rather than a module of the package. Its builders
    (grafana-foundation-sdk, in the test extra from Python 3.11 on) need Python 3.11."""
    if sys.version_info < (3, 11):
        pytest.skip("grafana-foundation-sdk needs Python 3.11")
    path = os.path.join(ROOT, "dashboards", "generate.py")
    spec = importlib.util.spec_from_file_location("dashboards_generate", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


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
    assert [v["name"] for v in node["templating"]["list"]] == ["datasource", "instance"]
    panels = [p for p in fleet["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    for p in panels:
        (link,) = p["fieldConfig"]["defaults"]["links"]
        assert link["url"].startswith(f"/d/{node['uid']}/"), p
        node_of_row = link["url"].rsplit("&var-instance=", 1)[1]
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
