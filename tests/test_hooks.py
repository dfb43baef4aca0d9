"""The remediation hook on real parts: real commands (exit codes, timeouts that kill the whole group,
hostile data that never meets a shell) and a real HTTP receiver on loopback (slow, dripping, failing,
refusing); bounded concurrency, the rate limit, the queue, metrics, and Events through the Kubernetes face."""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import free_port, machine
from test_kube_daemon import wait_until

from nodehealth import config, exporter, node_pass
from nodehealth.config import ConfigError
from nodehealth.daemon import Daemon
from nodehealth.hooks.hook import Hook
from nodehealth.hooks.runner import post, run_command
from nodehealth.model import Finding, Report, Severity, verdict
from nodehealth.silences.silence import apply, parse

LOST = Finding("gpu_driver", Severity.FATAL, "GpuLost", "GPU 3 is lost", device="0000:5d:00.0")
SLOW = Finding("infiniband", Severity.DEGRADED, "PortRateDegraded", "mlx5_0:1 runs at 100 Gb/s", device="mlx5_0:1")
NOTE = Finding("thp", Severity.WARNING, "ThpDefragAlways", "defrag=always")


def report(*findings: Finding) -> Report:
    return Report("gpu-7", verdict(findings), list(findings), [], time.time())


def settings(**kw) -> dict:
    return {**config.defaults()["hooks"], "enabled": True, "timeout_seconds": 5.0, **kw}


def wait_for(predicate, what: str, timeout: float = 20.0):
    value = wait_until(predicate, timeout)
    assert value, f"timed out waiting for {what}"
    return value


def metric(hook: Hook, line_start: str) -> str | None:
    text = exporter.render(hook.metrics()).decode()
    return next((line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(line_start + " ")), None)


def recorder(tmp_path, body: str = "") -> list[str]:
    """A real command: a Python script that appends the JSON it reads on stdin to a file, then runs `body`."""
    script = tmp_path / "remediate.py"
    script.write_text(f"import sys, time, os\ndata = sys.stdin.read()\n"
                      f"with open({str(tmp_path / 'events')!r}, 'a') as f:\n    f.write(data + '\\n')\n{body}\n")
    return [sys.executable, str(script)]


def events(tmp_path) -> list[dict]:
    path = tmp_path / "events"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def hooks():
    made = []

    def make(cfg, **kw) -> Hook:
        h = Hook("gpu-7", cfg, **kw)
        h.start()
        made.append(h)
        return h

    yield make
    for h in made:
        h.stop(5.0)


# -- commands --------------------------------------------------------------------------------------

def test_a_command_gets_each_appearing_and_clearing_finding_as_json_on_stdin(tmp_path, hooks):
    h = hooks(settings(command=recorder(tmp_path)))
    h.publish(report(LOST, SLOW, NOTE))  # the warning is under min_severity (degraded)
    wait_for(lambda: len(events(tmp_path)) == 2, "two appeared events")
    h.publish(report(LOST, SLOW, NOTE))  # nothing changed: nothing runs
    h.publish(report(LOST))
    got = wait_for(lambda: (lambda e: e if len(e) == 3 else None)(events(tmp_path)), "the cleared event")
    assert sorted((e["event"], e["finding"]["reason"]) for e in got) == [
        ("appeared", "GpuLost"), ("appeared", "PortRateDegraded"), ("cleared", "PortRateDegraded")]
    assert {e["node"] for e in got} == {"gpu-7"} and {e["schema_version"] for e in got} == {1}
    assert got[0]["finding"]["message"] in ("GPU 3 is lost", "mlx5_0:1 runs at 100 Gb/s")
    wait_for(lambda: metric(h, 'nodehealth_hook_runs_total{action="command",event="cleared",outcome="ok"}') == "1",
             "the run counted")
    assert metric(h, 'nodehealth_hook_runs_total{action="command",event="appeared",outcome="ok"}') == "2"
    assert metric(h, "nodehealth_hook_queued") == "0"


def test_data_from_a_finding_never_meets_a_shell(tmp_path, hooks):
    canary = tmp_path / "pwned"
    hostile = Finding("mounts", Severity.FATAL, "MountHung", "hung",
                      device=f"/mnt/x; touch {canary}; $(touch {canary})")
    h = hooks(settings(command=recorder(tmp_path)))
    h.publish(report(hostile))
    got = wait_for(lambda: events(tmp_path), "the event")
    assert got[0]["finding"]["device"] == hostile.device and not canary.exists()


@pytest.mark.parametrize("body, result, detail", [
    ("sys.exit(3)", "failed", "exit 3"),
    ("os.kill(os.getpid(), 9)", "failed", "killed by signal 9"),
    ("print('x' * 10_000_000)", "ok", "exit 0"),  # a chatty command: its output is read, a little kept
])
def test_a_command_outcome_is_its_exit(tmp_path, body, result, detail):
    outcome = run_command(recorder(tmp_path, body), b"{}", 10.0, threading.Event())
    assert (outcome.result, outcome.detail) == (result, detail)
    assert len(outcome.output) <= 4096


def test_a_command_that_cannot_run_is_an_error(tmp_path):
    outcome = run_command([str(tmp_path / "missing")], b"{}", 5.0, threading.Event())
    assert outcome.result == "error" and "cannot run" in outcome.detail


def test_a_command_that_does_not_read_a_large_event_is_not_waited_on(tmp_path):
    outcome = run_command(["/bin/true"], b"x" * (4 << 20), 10.0, threading.Event())
    assert outcome.result == "ok"


def test_a_command_past_its_deadline_is_killed_with_its_whole_group(tmp_path):
    pidfile = tmp_path / "child"
    body = (f"import subprocess\np = subprocess.Popen(['sleep', '300'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))\ntime.sleep(300)")
    outcome = run_command(recorder(tmp_path, body), b"{}", 1.5, threading.Event())
    assert outcome.result == "timeout" and "no exit in 1.5 s; killed" in outcome.detail
    child = int(pidfile.read_text())

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{child}/stat") as f:  # killed but not yet reaped by init: a zombie is gone too
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    wait_for(gone, "the grandchild to be killed")


def test_stop_kills_a_running_command_at_once(tmp_path, hooks):
    h = hooks(settings(command=recorder(tmp_path, "time.sleep(300)"), timeout_seconds=300.0))
    h.publish(report(LOST))
    wait_for(lambda: events(tmp_path), "the command to start")
    started = time.monotonic()
    h.stop(10.0)
    assert time.monotonic() - started < 5.0
    assert metric(h, 'nodehealth_hook_runs_total{action="command",event="appeared",outcome="timeout"}') == "1"


# -- a real HTTP receiver on loopback -------------------------------------------------------------

class Receiver:
    """A real HTTP server on loopback that records each POST; `mode` says how it answers."""

    def __init__(self, mode: str = "ok"):
        self.mode = mode
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver.lock:
                    receiver.bodies.append(body)
                    receiver.in_flight += 1
                    receiver.most = max(receiver.most, receiver.in_flight)
                try:
                    if receiver.mode == "hold":
                        receiver.release.wait(30)
                    if receiver.mode == "slow":
                        receiver.release.wait(30)  # answers long after the hook's deadline
                    if receiver.mode == "drip":  # a byte at a time, each well within any per-read timeout
                        for byte in b"HTTP/1.1 200 OK\r\nX-Drip: " + b"y" * 200:
                            if receiver.release.is_set():
                                return
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(0.05)
                        return
                    code = 500 if receiver.mode == "fail" else 200
                    self.send_response(code)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"no" if code == 500 else b"ok")
                finally:
                    with receiver.lock:
                        receiver.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/remediate?site=a"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver():
    made = []

    def make(mode: str = "ok") -> Receiver:
        r = Receiver(mode)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def test_a_receiver_gets_the_event_posted_as_json(receiver, hooks):
    r = receiver()
    h = hooks(settings(url=r.url))
    h.publish(report(SLOW))
    wait_for(lambda: r.bodies, "the POST")
    assert r.bodies[0]["event"] == "appeared" and r.bodies[0]["finding"]["device"] == "mlx5_0:1"
    wait_for(lambda: metric(h, 'nodehealth_hook_runs_total{action="url",event="appeared",outcome="ok"}') == "1",
             "the ok run")


@pytest.mark.parametrize("mode, result, detail", [
    ("fail", "failed", "HTTP 500"),
    ("slow", "timeout", "no whole answer in 1 s"),
    ("drip", "timeout", "no whole answer in 1 s"),
])
def test_a_receiver_that_fails_or_stalls_is_bounded(receiver, mode, result, detail):
    r = receiver(mode)
    started = time.monotonic()
    outcome = post(r.url, b'{"event": "appeared"}', 1.0)
    assert (outcome.result, outcome.detail.startswith(detail)) == (result, True), outcome
    assert time.monotonic() - started < 3.0  # the whole exchange, not each read, has the deadline


def test_a_receiver_that_refuses_is_an_error():
    outcome = post(f"http://127.0.0.1:{free_port()}/", b"{}", 2.0)
    assert outcome.result == "error" and "Connection refused" in outcome.detail


def test_runs_are_bounded_in_concurrency_and_one_finding_runs_in_order(receiver, hooks):
    r = receiver("hold")
    h = hooks(settings(url=r.url, max_concurrency=2))
    many = [Finding("infiniband", Severity.DEGRADED, "PortDown", "down", device=f"mlx5_{i}:1") for i in range(5)]
    h.publish(report(*many))
    wait_for(lambda: len(r.bodies) == 2, "two runs at once")
    assert metric(h, "nodehealth_hook_running") == "2" and metric(h, "nodehealth_hook_queued") == "3"
    r.release.set()
    wait_for(lambda: len(r.bodies) == 5, "the other three")
    assert r.most == 2


def test_the_rate_limit_holds_events_and_the_queue_drops_its_oldest(receiver, hooks):
    r = receiver()
    now = [1000.0]
    h = hooks(settings(url=r.url, max_per_minute=2, max_queue=3), clock=lambda: now[0])
    many = [Finding("infiniband", Severity.DEGRADED, "PortDown", "down", device=f"mlx5_{i}:1") for i in range(5)]
    h.publish(report(*many))  # five events, a queue of three: the two oldest are dropped
    wait_for(lambda: len(r.bodies) == 2, "the two the bucket allows")
    wait_for(lambda: metric(h, "nodehealth_hook_rate_limited_total") == "1", "the third's wait counted")
    assert metric(h, "nodehealth_hook_queued") == "1" and metric(h, "nodehealth_hook_dropped_total") == "2"
    now[0] += 60.0  # a minute later the bucket is full again
    h.publish(report(*many[:4]))  # the last one clears: the workers wake, the waiting events run
    wait_for(lambda: len(r.bodies) == 4, "the held event and the new one")
    assert [(b["event"], b["finding"]["device"]) for b in r.bodies][2:] == [("appeared", "mlx5_4:1"),
                                                                            ("cleared", "mlx5_4:1")]
    assert not {"mlx5_0:1", "mlx5_1:1"} & {b["finding"]["device"] for b in r.bodies}  # dropped, never run


def test_a_silenced_finding_runs_nothing_and_silencing_one_clears_it(tmp_path, hooks):
    h = hooks(settings(command=recorder(tmp_path)))
    silence = parse({"reason": "GpuLost", "expires": time.time() + 3600, "comment": "RMA 1234",
                     "allow_fatal": True}, "file")
    h.publish(report(SLOW, *apply([LOST], [silence], time.time())[0]))
    wait_for(lambda: events(tmp_path), "the degraded port's event")
    h.publish(report(*apply([SLOW], [parse({"reason": "PortRateDegraded", "expires": time.time() + 60},
                                           "file")], time.time())[0]))
    got = wait_for(lambda: (lambda e: e if len(e) == 2 else None)(events(tmp_path)), "the cleared event")
    assert [(e["event"], e["finding"]["reason"]) for e in got] == [("appeared", "PortRateDegraded"),
                                                                  ("cleared", "PortRateDegraded")]
    assert got[1]["finding"]["silenced"]["source"] == "file"  # the receiver can tell why it cleared


# -- configuration, the daemon and Kubernetes -------------------------------------------------------

@pytest.mark.parametrize("hooks_cfg, said", [
    ({"enabled": True}, "nothing to run"),
    ({"command": ["remediate", "--node"]}, "absolute path"),
    ({"command": ["/bin/sh", 7]}, "absolute path"),
    ({"url": "file:///etc/passwd"}, "http:// or https://"),
    ({"min_severity": "info"}, "warning, unknown, degraded or fatal"),
    ({"max_concurrency": 0}, "at least 1"),
    ({"timeout_seconds": 0}, "greater than 0"),
])
def test_a_bad_hook_setting_is_a_clear_config_error(tmp_path, hooks_cfg, said):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"hooks": hooks_cfg}))
    with pytest.raises(ConfigError, match=said):
        config.load(str(path))


def test_nothing_runs_by_default():
    hooks_cfg = config.defaults()["hooks"]
    assert hooks_cfg["enabled"] is False and hooks_cfg["command"] == [] and hooks_cfg["url"] == ""


def test_the_daemon_runs_the_hook_as_one_more_face(tmp_path):
    cfg = config.load(None)
    cfg["daemon"]["state_dir"] = str(tmp_path / "state")
    cfg["hooks"].update(enabled=True, command=recorder(tmp_path))
    d = Daemon(node_pass.build_engine(cfg, machine("nvml-h100-xid79-lost")), cfg, "gpu-a")
    d.start()
    try:
        got = wait_for(lambda: (lambda e: e if len(e) == 2 else None)(events(tmp_path)), "the daemon's hook to run")
        assert sorted((e["event"], e["finding"]["reason"]) for e in got) == [("appeared", "GpuLost"),
                                                                            ("appeared", "Xid79FallenOffBus")]
        ran = 'nodehealth_hook_runs_total{action="command",event="appeared",outcome="ok"} '
        wait_for(lambda: any(line.startswith(ran) and not line.endswith(" 0")
                             for line in exporter.render(d.metrics()).decode().splitlines()), "the run in /metrics")
    finally:
        d.stop.set()
        d.shutdown()


def test_each_outcome_is_an_event_on_the_node(tmp_path, receiver, hooks):
    from fake_kube_apiserver import FakeApiServer

    from nodehealth.kube.publisher import Publisher

    server = FakeApiServer().start()
    try:
        server.add_node("gpu-7")
        kube = dict(config.defaults()["kube"], kubeconfig=server.kubeconfig(str(tmp_path / "kubeconfig")),
                    retry_initial_seconds=0.1)
        publisher = Publisher("gpu-7", kube)
        publisher.start()
        ok, failing = receiver(), receiver("fail")
        first = hooks(settings(url=ok.url), notify=publisher.note)
        second = hooks(settings(url=failing.url), notify=publisher.note)
        shown = report(SLOW)
        for face in (publisher, first, second):
            face.publish(shown)
        said = wait_for(lambda: (lambda e: e if len(e) == 2 else None)(
            [e for e in server.events if e["reason"].startswith("NodeHealthHook")]), "two Events")
        by_reason = {e["reason"]: e for e in said}
        assert by_reason["NodeHealthHookSucceeded"]["type"] == "Normal"
        failed = by_reason["NodeHealthHookFailed"]
        assert failed["type"] == "Warning" and failed["involvedObject"]["name"] == "gpu-7"
        assert "PortRateDegraded on mlx5_0:1 appeared: failed, HTTP 500" in failed["message"]
        publisher.stop(1.0)
    finally:
        server.close()


def test_a_receiver_address_nobody_answers_does_not_hold_the_worker():
    with socket.socket() as s:  # a listener that never accepts: the connect succeeds, no answer ever comes
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        started = time.monotonic()
        outcome = post(f"http://127.0.0.1:{s.getsockname()[1]}/", b"{}", 1.0)
    assert outcome.result == "timeout" and time.monotonic() - started < 3.0
