"""The daemon's faces: a new one needs the Face protocol alone, and every face gets each report at
once, the pingmesh controller's verdicts too (judged like any other finding, --only included)."""
from __future__ import annotations

import json
import time

from conftest import machine

from nodehealth import config, exporter, node_pass
from nodehealth.daemon import Daemon
from nodehealth.faces import Face
from nodehealth.model import Metric, Severity, Status
from nodehealth.pingmesh.verdicts import parse_verdicts


class Recorder:
    """A throwaway face (a webhook, say): no base class, registered nowhere; it has the four methods."""

    def __init__(self):
        self.reports = []
        self.started = self.stopped = False

    def start(self) -> list:
        self.started = True
        return []  # no thread of its own

    def publish(self, report) -> None:
        self.reports.append(report)

    def metrics(self) -> list[Metric]:
        m = Metric("nodehealth_recorder_reports", "Reports the throwaway face took.")
        m.add((), len(self.reports))
        return [m]

    def stop(self, timeout: float) -> None:
        self.stopped = True


def daemon(tmp_path, root: str, only: list[str] | None = None) -> Daemon:
    cfg = config.load(None)
    cfg["daemon"]["state_dir"] = str(tmp_path / "state")
    return Daemon(node_pass.build_engine(cfg, root, only), cfg, "gpu-a")


def test_a_new_face_is_one_class_and_one_line(tmp_path):
    face = Recorder()
    assert isinstance(face, Face)
    d = daemon(tmp_path, machine("h100-8x-cx7"))
    d.faces.append(face)  # the one line
    d.start()  # the first pass runs at once
    try:
        deadline = time.monotonic() + 30
        while not face.reports and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        d.stop.set()
        d.shutdown()
    assert face.started and face.stopped
    assert face.reports and face.reports[-1] is d.report and d.report.status is Status.UNHEALTHY
    assert "nodehealth_recorder_reports " in exporter.render(d.metrics()).decode()


def verdicts_about(node: str) -> dict:
    now = time.time()
    return parse_verdicts(json.dumps({
        "schema_version": 1, "time": now, "window_seconds": 30.0, "nodes": 2, "leaves": 1,
        "verdicts": [{"kind": "node", "element": node, "since": now - 90, "windows": 3,
                      "message": f"{node} loses 12% of its probes", "evidence": {"loss": 0.12}}]}))


def test_the_controllers_verdicts_are_judged_and_sent_at_once(tmp_path):
    """A verdict read between passes reaches every face at once, as a finding of the `pingmesh` check
    that went through the policy; when it closes, the next read takes it away."""
    d = daemon(tmp_path, machine("plain-host"))
    face = Recorder()
    d.faces.append(face)
    d.run_pass()
    sent = len(face.reports)
    d.on_pingmesh_verdicts(verdicts_about("gpu-a"), time.time())
    assert len(face.reports) == sent + 1
    (found,) = [f for f in face.reports[-1].findings if f.check == "pingmesh"]
    assert (found.severity, found.reason, found.device) == (Severity.DEGRADED, "PingmeshNodeFaulty", "gpu-a")
    assert found.last_seen is not None and face.reports[-1].status is Status.UNHEALTHY
    d.on_pingmesh_verdicts(verdicts_about("gpu-b"), time.time())  # about another node: nothing here
    assert not [f for f in face.reports[-1].findings if f.check == "pingmesh"]


def test_only_leaves_the_verdicts_out_like_any_other_finding(tmp_path):
    d = daemon(tmp_path, machine("plain-host"), only=["vm"])
    face = Recorder()
    d.faces.append(face)
    d.run_pass()
    d.on_pingmesh_verdicts(verdicts_about("gpu-a"), time.time())
    assert face.reports[-1].status is Status.HEALTHY and not face.reports[-1].findings
