"""promtool checks and unit-tests the shipped alert rules; every alert carries what an on-call needs
(a severity, a runbook in docs/runbooks.md) and a promtool test that makes it fire; the PrometheusRule
the monitoring component ships is generated from the same rules file."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess

import yaml
from conftest import HERE, require_tool

ROOT = os.path.dirname(HERE)
RULES_DIR = os.path.join(ROOT, "deploy", "prometheus")
RUNBOOKS = os.path.join(ROOT, "docs", "runbooks.md")
RUNBOOK_BASE = "https://github.com/example/nodehealth/blob/main/docs/runbooks.md#"


def rules() -> list[dict]:
    with open(os.path.join(RULES_DIR, "nodehealth-rules.yaml")) as f:
        return [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]


def alerts() -> dict[str, dict]:
    return {r["alert"]: r for r in rules() if "alert" in r}


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_rules_are_valid_and_their_unit_tests_pass():
    promtool = require_tool("promtool")
    check = subprocess.run([promtool, "check", "rules", "nodehealth-rules.yaml"], cwd=RULES_DIR,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", "nodehealth-rules.test.yaml"], cwd=RULES_DIR,
                          capture_output=True, text=True)
    assert test.returncode == 0, test.stdout + test.stderr


def test_every_alert_has_a_unit_test_in_which_it_fires():
    with open(os.path.join(RULES_DIR, "nodehealth-rules.test.yaml")) as f:
        tests = yaml.safe_load(f)["tests"]
    fired = {case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert sorted(set(alerts()) - fired) == []


def test_every_alert_has_a_severity_a_summary_and_a_runbook_section():
    with open(RUNBOOKS, encoding="utf-8") as f:
        anchors = heading_anchors(f.read())
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(RUNBOOK_BASE) and url[len(RUNBOOK_BASE):] in anchors, (name, url)


def test_every_runbook_section_says_what_it_means_how_to_confirm_act_and_clear():
    with open(RUNBOOKS, encoding="utf-8") as f:
        sections = re.split(r"^## ", f.read(), flags=re.M)[1:]
    named = {s.split("\n", 1)[0].strip(): s for s in sections}
    assert set(alerts()) <= set(named)
    for name in alerts():
        for part in ("**Meaning**", "**Confirm**", "**Act**", "**Clear**"):
            assert part in named[name], (name, part)


def test_the_alerts_an_operator_asked_for_exist():
    a = alerts()
    assert "nodehealth_kube_breaker_tripped" in a["NodeHealthQuarantineBreakerTripped"]["expr"]
    assert "nodehealth_kube_taint_withheld" in a["NodeHealthTaintWithheld"]["expr"]
    assert "nodehealth_kube_publish_errors_total" in a["NodeHealthKubePublishFailing"]["expr"]
    assert "nodehealth_state_save_errors_total" in a["NodeHealthStateNotSaved"]["expr"]
    assert "nodehealth_hang_detected" in a["NodeHealthHangDetected"]["expr"]
    # The one finding the daemon exports for a kernel log it cannot read (the kmsg collector's FAILED_REASON).
    from nodehealth.collectors import kmsg
    assert f'nodehealth_finding{{reason="{kmsg.FAILED_REASON}"}}' in a["NodeHealthKernelLogUnreadable"]["expr"]
    # A pod that never started has no `up` series: the DaemonSet's desired and available pods.
    down = a["NodeHealthDaemonDown"]["expr"]
    assert "kube_daemonset_status_desired_number_scheduled" in down
    assert "kube_daemonset_status_number_available" in down


def generator():
    path = os.path.join(RULES_DIR, "prometheusrule.py")
    spec = importlib.util.spec_from_file_location("prometheusrule", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_monitoring_component_ships_the_same_rules_as_a_prometheusrule():
    gen = generator()
    with open(gen.OUTPUT, encoding="utf-8") as f:
        committed = f.read()
    assert committed == gen.render()
    [doc] = [d for d in yaml.safe_load_all(committed) if d]
    assert doc["kind"] == "PrometheusRule" and doc["apiVersion"] == "monitoring.coreos.com/v1"
    with open(os.path.join(RULES_DIR, "nodehealth-rules.yaml")) as f:
        assert doc["spec"] == yaml.safe_load(f)
    assert gen.main(["--check"]) == 0
