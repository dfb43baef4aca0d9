"""--log-format json|text and --log-level: one setup (nodehealth/logs.py) for the daemon, the controller and
`hang watch`; the JSON lines of a real daemon and a real controller are parsed here."""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import free_port, http_get, machine
from test_daemon import XID79, append_kmsg, last_seq

from nodehealth import cli, logs

KEYS = {"time", "level", "logger", "msg", "check", "reason", "device", "node"}


def lines(output: str) -> list[dict]:
    """Every line of a JSON log, parsed: a line that is not JSON fails the test."""
    out = []
    for line in output.splitlines():
        doc = json.loads(line)
        assert set(doc) - {"error"} == KEYS and isinstance(doc, dict), line
        out.append(doc)
    return out


def test_a_json_line_has_the_stable_keys_and_a_finding_s_fields(capsys):
    from nodehealth.model import Finding, Severity

    logs.setup("json", "info", node="gpu-07")
    log = logging.getLogger("nodehealth.test")
    try:
        log.debug("not shown at info")
        log.warning("seen %s", "once", extra=logs.finding_fields(
            Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "msg", device="0000:1b:00.0")))
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    finally:
        logs.setup()  # back to text for the tests after this one
    first, second = lines(capsys.readouterr().err)
    assert first["msg"] == "seen once" and first["level"] == "warning" and first["logger"] == "nodehealth.test"
    assert (first["check"], first["reason"], first["device"], first["node"]) == (
        "xid", "Xid79FallenOffBus", "0000:1b:00.0", "gpu-07")
    assert first["time"].endswith("Z") and time.strptime(first["time"][:19], "%Y-%m-%dT%H:%M:%S")
    assert second["check"] is None and "ValueError: boom" in second["error"]


@pytest.mark.parametrize("command", [["daemon"], ["controller"], ["hang", "watch", "DIR"]])
def test_each_long_running_command_takes_the_log_options(command):
    args = cli.parser().parse_args([*command, "--log-format", "json", "--log-level", "warning"])
    assert (args.log_format, args.log_level) == ("json", "warning")
    assert cli.parser().parse_args(command).log_format == "text"


def test_a_real_daemon_logs_json_lines_with_the_finding_it_raises(tmp_path, daemon_factory):
    root = tmp_path / "machine"
    shutil.copytree(machine("plain-host"), root, symlinks=True)
    d = daemon_factory(str(root), str(tmp_path / "state"), "--node-name", "gpu-07", "--log-format", "json",
                       interval=0.3)
    d.wait_ready()
    append_kmsg(root, XID79, last_seq(root) + 1, 348_000_000)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if any(f["reason"] == "Xid79FallenOffBus" for f in json.loads(d.get("/v1/report")[1])["findings"]):
            break
        time.sleep(0.05)
    d.stop()
    logged = lines(d.output())
    assert any(line["msg"].startswith("nodehealth daemon on 127.0.0.1:") and line["level"] == "info"
               for line in logged)
    raised = [line for line in logged if line["reason"] == "Xid79FallenOffBus"]
    assert raised and raised[0]["check"] == "xid" and raised[0]["device"] == "0000:1b:00.0"
    assert raised[0]["level"] == "warning" and "fallen off the bus" in raised[0]["msg"]
    assert {line["node"] for line in logged} == {"gpu-07"}


def test_a_real_daemon_at_log_level_warning_leaves_out_info(tmp_path, daemon_factory):
    d = daemon_factory(machine("plain-host"), str(tmp_path / "state"), "--log-format", "json",
                       "--log-level", "warning")
    d.wait_ready()
    d.stop()
    assert [line for line in lines(d.output()) if line["level"] in ("info", "debug")] == []


def test_a_real_controller_logs_json_lines(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "nodehealth.cli", "controller", "--listen", f"127.0.0.1:{port}",
                             "--identity", "controller-a", "--log-format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, NODE_NAME="cpu-01"))
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if http_get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)[0] == 200:
                    break
            except OSError:
                time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    logged = lines(err)
    assert any("the controller idles" in line["msg"] for line in logged)
    assert {line["node"] for line in logged} == {"cpu-01"}
