"""Whole fixture machines: `check --root` and the daemon on each, against golden files.

Golden files hold the full `check --json` output and the daemon's full /metrics text, compared
byte for byte after dropping volatile lines by one rule (VOLATILE). UPDATE_GOLDEN=1 rewrites
them; review the diff like code.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import HERE, MACHINES, MACHINES_DIR, STOP_SECONDS, machine

GOLDEN = os.path.join(HERE, "golden")
# process_*: this run's own figures
VOLATILE = re.compile(r"duration_seconds|timestamp_seconds|daemon_passes_total|^process_")
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

EXPECTED_EXIT = {
    "plain-host": 0, "h100-8x-cx7": 1, "fragmented": 1, "small-memlock": 0,
    "nvml-h100-healthy": 0, "nvml-h100-xid79-lost": 1, "nvml-h100-volatile-dbe": 1, "nvml-h100-nvlink-down": 1,
    "nvml-h100-pcie-downtrained": 1, "nvml-h100-hw-slowdown": 1, "nvml-h200": 0, "nvml-h800": 0,
    "host-faults": 1, "nvml-a100-remap-pending": 1, "nvml-a100-remap-failure": 1, "nvml-a100-old-driver": 0,
    "nvml-a100": 0,
}


def stable(text: str) -> str:
    """Drop volatile lines; name the machines folder <machines>, wherever the checkout is."""
    text = text.replace(MACHINES_DIR, "<machines>")
    return "".join(line for line in text.splitlines(keepends=True) if not VOLATILE.search(line))


def compare(name: str, actual: str) -> None:
    path = os.path.join(GOLDEN, name)
    actual = stable(actual)
    if UPDATE or not os.path.exists(path):
        if not UPDATE and os.environ.get("CI") == "true":
            pytest.fail(f"golden file {name} is missing")
        with open(path, "w", encoding="utf-8") as f:
            f.write(actual)
        return
    with open(path, encoding="utf-8") as f:
        expected = f.read()
    assert actual == expected, f"{name} differs from its golden file (UPDATE_GOLDEN=1 to rewrite)"


def run_check(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="4000")  # one line per finding in the table
    return subprocess.run([sys.executable, "-m", "nodehealth.cli", "check", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_every_machine_has_an_expectation():
    assert sorted(EXPECTED_EXIT) == MACHINES


@pytest.mark.parametrize("name", MACHINES)
def test_check_json_is_golden(name, tmp_path):
    result = run_check("--json", "--root", machine(name), "--state-dir", str(tmp_path))
    assert result.returncode == EXPECTED_EXIT[name], result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert all(c["success"] or not c["supported"] for c in doc["collectors"]), doc["collectors"]
    compare(f"{name}.check.json", result.stdout)


@pytest.mark.parametrize("name", MACHINES)
def test_check_table_names_every_finding(name, tmp_path):
    doc = json.loads(run_check("--json", "--root", machine(name), "--state-dir", str(tmp_path)).stdout)
    table = run_check("--root", machine(name), "--state-dir", str(tmp_path)).stdout
    assert table.startswith(f"node {doc['node']}: {doc['status'].upper()}")
    for f in doc["findings"]:
        assert any(f["check"] in line and f["message"] in line and (f["device"] or "-") in line
                   for line in table.splitlines()), f["message"]


@pytest.mark.parametrize("name", MACHINES)
def test_daemon_metrics_are_golden(name, tmp_path, daemon_factory):
    d = daemon_factory(machine(name), str(tmp_path / "state"))
    report = d.wait_ready()
    code, body = d.get("/metrics")
    assert code == 200
    compare(f"{name}.metrics.txt", body.decode())
    assert d.stop() < STOP_SECONDS
    assert report["node"] == json.loads(run_check("--json", "--root", machine(name),
                                                  "--state-dir", str(tmp_path)).stdout)["node"]
