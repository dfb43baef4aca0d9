"""The shipped dashboard and alert rules query only metrics that nodehealth exports."""
from __future__ import annotations

import glob
import json
import os
import re

from conftest import HERE

ROOT = os.path.dirname(HERE)
NAME = re.compile(r"\bnodehealth_[a-z0-9_]+")


def exported_names() -> set:
    """Every family in the golden expositions (the fixture machines, the pingmesh agent), and the
    families the controller declares."""
    names = set()
    for path in glob.glob(os.path.join(HERE, "golden", "*.metrics.txt")):
        with open(path) as f:
            # Sample names: a histogram's series are NAME_bucket, NAME_count and NAME_sum.
            names |= {line.split("{")[0].split()[0] for line in f if not line.startswith("#")}
    with open(os.path.join(ROOT, "nodehealth", "controller.py")) as f:
        names |= set(re.findall(r'"(nodehealth_[a-z0-9_]+)"', f.read()))
    return names


def test_every_dashboard_query_uses_exported_metrics():
    exported = exported_names()
    assert "nodehealth_health_status" in exported
    with open(os.path.join(ROOT, "dashboards", "nodehealth.json")) as f:
        dashboard = json.load(f)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert exprs and len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    used = {n for e in exprs for n in NAME.findall(e)}
    assert used and used <= exported, sorted(used - exported)


def test_every_alert_rule_uses_exported_metrics():
    with open(os.path.join(ROOT, "deploy", "prometheus", "nodehealth-rules.yaml")) as f:
        used = set(NAME.findall(f.read()))
    assert used and used <= exported_names(), sorted(used - exported_names())
