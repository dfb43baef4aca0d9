"""One pass, wherever it runs: `check` and the daemon judge a machine alike, NothingChecked included."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import MACHINES, STOP_SECONDS, machine

from nodehealth import config, node_pass
from nodehealth.daemon import Daemon


def metric_value(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_daemon_with_nothing_to_check_says_unknown_like_check(tmp_path, daemon_factory):
    """A plain host asked only about InfiniBand has no source for it: `check` says unknown (exit 2),
    and so must the daemon, in its report and in nodehealth_health_status (it said healthy, 0)."""
    plain = machine("plain-host")
    check = subprocess.run([sys.executable, "-m", "nodehealth.cli", "check", "--json", "--root", plain,
                            "--only", "infiniband", "--state-dir", str(tmp_path / "check")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 2, check.stderr
    assert [f["reason"] for f in json.loads(check.stdout)["findings"]] == ["NothingChecked"]
    d = daemon_factory(plain, str(tmp_path / "state"), "--only", "infiniband")
    report = d.wait_ready()
    assert report["status"] == "unknown"
    assert [(f["check"], f["severity"], f["reason"]) for f in report["findings"]] == [
        ("nodehealth", "unknown", "NothingChecked")]
    assert metric_value(d.get("/metrics")[1].decode(), "nodehealth_health_status") == 2
    assert d.stop() < STOP_SECONDS


@pytest.mark.parametrize("name, only", [(m, None) for m in MACHINES] + [("plain-host", ["infiniband"])])
def test_check_and_the_daemon_agree_on_every_machine(name, only, tmp_path):
    """The daemon's verdict, once it has read the kernel log and run the passes that raise a debounced
    finding (policy.raise_after_passes), is `check`'s: the same status and the same findings."""
    cfg = config.load(None)
    cfg["daemon"]["state_dir"] = str(tmp_path / "state")
    cfg["daemon"]["interval_seconds"] = 3600.0  # one pass from its thread; the test runs the others
    check = node_pass.run(node_pass.build_engine(cfg, machine(name), only), cfg, "node")
    kernel = next((c.facts for c in check.collectors if c.name == "kmsg" and c.success), None)
    d = Daemon(node_pass.build_engine(cfg, machine(name), only), cfg, "node")
    d.open()
    d.start()
    try:
        assert wait_for(lambda: d.passes >= 1 and (kernel is None or d.kernel.records >= kernel.records), 30.0)
        for _ in range(cfg["policy"]["raise_after_passes"] - 1):
            d.run_pass()
        report = d.report
    finally:
        d.stop.set()
        d.shutdown()
    assert report.status == check.status
    assert keys(report) == keys(check)


def keys(report) -> list[tuple[str, str, str, str]]:
    return sorted((f.check, f.severity.value, f.reason, f.device) for f in report.findings)


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return bool(condition())
