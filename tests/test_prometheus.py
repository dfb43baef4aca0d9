"""A real Prometheus server scrapes the daemon; promtool lints the exposition."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.parse

import pytest
from conftest import MACHINES, free_port, http_get, machine, require_tool


def query(base: str, expr: str):
    code, body = http_get(f"{base}/api/v1/query?query={urllib.parse.quote(expr)}", timeout=2.0)
    if code != 200:
        return []
    return json.loads(body)["data"]["result"]


@pytest.mark.parametrize("name", MACHINES)
def test_promtool_accepts_the_exposition(name, tmp_path, daemon_factory):
    promtool = require_tool("promtool")
    d = daemon_factory(machine(name), str(tmp_path / "state"))
    d.wait_ready()
    code, body = d.get("/metrics")
    assert code == 200
    lint = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
    assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()
    d.stop()


def test_prometheus_scrapes_the_daemon(tmp_path, daemon_factory):
    prometheus = require_tool("prometheus")
    d = daemon_factory(machine("h100-8x-cx7"), str(tmp_path / "state"))
    report = d.wait_ready()
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: nodehealth\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{d.port}']\n")
    server = subprocess.Popen(
        [prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        status = []
        while time.monotonic() < deadline and not status:
            if server.poll() is not None:
                pytest.fail("prometheus exited: " + server.stderr.read().decode()[-2000:])
            try:
                status = query(base, 'nodehealth_health_status{job="nodehealth"}')
            except OSError:
                pass
            time.sleep(0.5)
        assert status, "Prometheus never stored nodehealth_health_status"
        expected = {"healthy": 0, "unhealthy": 1, "unknown": 2}[report["status"]]
        assert float(status[0]["value"][1]) == expected
        up = query(base, 'up{job="nodehealth"}')
        assert float(up[0]["value"][1]) == 1
        # A value that comes from the fixture machine's sysfs: mlx5_0 port 1 is 400 Gb/s NDR.
        rate = query(base, 'nodehealth_infiniband_port_rate_bytes_per_second{device="mlx5_0",port="1"}')
        assert rate and float(rate[0]["value"][1]) == 400e9 / 8
        findings = query(base, 'nodehealth_finding{check="xid"}')
        assert {r["metric"]["reason"] for r in findings} >= {"Xid79FallenOffBus"}
    finally:
        server.terminate()
        server.wait(10)
        d.stop()
