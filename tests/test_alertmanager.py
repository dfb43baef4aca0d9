"""The shipped alert rules fire in a real Prometheus and reach a real Alertmanager routed by
deploy/prometheus/alertmanager.yml, which delivers them to a webhook receiver here; a lost GPU pages once."""
from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest
import yaml
from conftest import HERE, free_port, http_get, machine, require_tool

PROM_DIR = os.path.join(os.path.dirname(HERE), "deploy", "prometheus")
ROUTING = os.path.join(PROM_DIR, "alertmanager.yml")
RULES = os.path.join(PROM_DIR, "nodehealth-rules.yaml")


def alertmanager_binary() -> str:
    return shutil.which("alertmanager") or require_tool("prometheus-alertmanager")  # Debian's name


def test_amtool_accepts_the_routing_config():
    amtool = require_tool("amtool")
    done = subprocess.run([amtool, "check-config", ROUTING], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


class Webhook:
    """Alertmanager's webhook receiver: records each notification's path and body."""

    def __init__(self):
        self.received: list[tuple[str, dict]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def firing(self, path: str) -> set[tuple[str, str, str]]:
        """(alertname, instance, reason) of every firing alert delivered to `path`."""
        return {(a["labels"]["alertname"], a["labels"].get("instance", ""), a["labels"].get("reason", ""))
                for p, body in list(self.received) if p == path
                for a in body["alerts"] if a["status"] == "firing"}


def start(argv: list[str], name: str, tmp_path) -> subprocess.Popen:
    log = open(tmp_path / f"{name}.log", "wb")
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    return p


def api(base: str, path: str):
    try:
        code, body = http_get(base + path, timeout=2.0)
    except OSError:
        return None
    return json.loads(body) if code == 200 else None


def test_alerts_reach_the_webhook_routed_and_a_lost_gpu_pages_once(tmp_path, daemon_factory):
    prometheus = require_tool("prometheus")
    alertmanager = alertmanager_binary()
    hook = Webhook()
    nodes = {name: daemon_factory(machine(name), str(tmp_path / name)) for name in
             ("nvml-h100-xid79-lost", "nvml-h100-nvlink-down", "h100-8x-cx7", "fragmented", "plain-host")}
    instance = {name: f"127.0.0.1:{d.port}" for name, d in nodes.items()}

    # The shipped routing and inhibition as they are; only the receivers' URLs point here and the
    # waits are seconds, not minutes.
    with open(ROUTING) as f:
        routing = yaml.safe_load(f)
    routing["route"].update(group_wait="1s", group_interval="2s", repeat_interval="1h")
    for receiver in routing["receivers"]:
        for hook_cfg in receiver.get("webhook_configs", []):
            hook_cfg["url"] = hook.url + urllib.parse.urlparse(hook_cfg["url"]).path
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(routing))
    # The shipped rules, with every `for:` cut to 1 s so that the degraded alert fires within the test.
    with open(RULES) as f:
        rules = yaml.safe_load(f)
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))

    am_port, prom_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "nodehealth", "static_configs": [{"targets": list(instance.values())}]}],
    }))
    am = start([alertmanager, f"--config.file={tmp_path / 'alertmanager.yml'}", f"--storage.path={tmp_path / 'am'}",
                f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="], "alertmanager", tmp_path)
    prom = start([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                  f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                 "prometheus", tmp_path)
    am_base, prom_base = f"http://127.0.0.1:{am_port}", f"http://127.0.0.1:{prom_port}"
    lost, nvlink, frag, kmsg = (instance[n] for n in ("nvml-h100-xid79-lost", "nvml-h100-nvlink-down", "fragmented",
                                                      "h100-8x-cx7"))
    paged = {("NodeHealthFatal", lost, "GpuLost"), ("NodeHealthFatal", nvlink, "NvLinkDown")}
    ticketed = ("NodeHealthDegraded", frag, "HugeBlocksExhausted")

    def suppressed(node: str = lost) -> set[str]:
        alerts = api(am_base, "/api/v2/alerts?inhibited=true") or []
        return {a["labels"].get("reason", "") for a in alerts
                if a["labels"].get("instance") == node and a["status"]["inhibitedBy"]}

    try:
        for d in nodes.values():
            d.wait_ready()
        deadline = time.monotonic() + 50
        while time.monotonic() < deadline:
            for name, p in (("alertmanager", am), ("prometheus", prom)):
                if p.poll() is not None:
                    pytest.fail(f"{name} exited: {(tmp_path / f'{name}.log').read_text()[-2000:]}")
            if (hook.firing("/pager") >= paged and ticketed in hook.firing("/tickets")
                    and "Xid79FallenOffBus" in suppressed() and "Xid63MemoryRetirementRecorded" in suppressed(kmsg)):
                break
            time.sleep(0.5)
        time.sleep(3)  # one more group_interval: anything else that was going to be sent has been
        pager, tickets = hook.firing("/pager"), hook.firing("/tickets")
        assert {a for a in pager if a[1] in (lost, nvlink)} == paged, pager
        assert ticketed in tickets, tickets
        # Only the kernel log saw this GPU fall off the bus: the Xid 79 pages; the node's degraded
        # finding (Xid 63 on another GPU) waits behind its fatal ones instead of making a ticket.
        assert ("NodeHealthFatal", kmsg, "Xid79FallenOffBus") in pager, pager
        assert "Xid63MemoryRetirementRecorded" in suppressed(kmsg)
        assert not any(i == kmsg for _, i, _ in tickets), tickets
        # Prometheus fires the Xid 79 alert too; the inhibition, not the rule, keeps it from paging.
        code, body = http_get(f"{prom_base}/api/v1/query?query="
                              + urllib.parse.quote(f'ALERTS{{alertstate="firing",instance="{lost}"}}'))
        fired = {r["metric"].get("reason") for r in json.loads(body)["data"]["result"]}
        assert {"GpuLost", "Xid79FallenOffBus"} <= fired, fired
        assert "Xid79FallenOffBus" in suppressed()
        # The lost GPU's node is one notification, whatever else it fires; the healthy node none.
        assert sum(1 for p, body in hook.received if p == "/pager" and body["groupLabels"].get("instance") == lost) == 1
        assert not any(i == instance["plain-host"] for _, i, _ in pager | tickets)
    finally:
        for p in (prom, am):
            p.terminate()
            p.wait(10)
        hook.server.shutdown()


def test_a_node_blind_to_its_kernel_log_raises_one_alert_not_two(tmp_path):
    """The shipped routing in a real Alertmanager: NodeHealthKernelLogUnreadable holds back the
    NodeHealthCannotJudge and the kmsg NodeHealthCollectorFailing that its unreadable kernel log also
    raises on that node, and only there."""
    alertmanager = alertmanager_binary()
    port = free_port()
    am = start([alertmanager, f"--config.file={ROUTING}", f"--storage.path={tmp_path / 'am'}",
                f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="], "alertmanager", tmp_path)
    base = f"http://127.0.0.1:{port}"
    sent = [{"labels": {"alertname": name, "instance": node, "severity": "warning", **extra}}
            for name, node, extra in (("NodeHealthKernelLogUnreadable", "gpu-1:9456", {}),
                                      ("NodeHealthCannotJudge", "gpu-1:9456", {}),
                                      ("NodeHealthCannotJudge", "gpu-2:9456", {}),
                                      ("NodeHealthCollectorFailing", "gpu-1:9456", {"collector": "kmsg"}),
                                      ("NodeHealthCollectorFailing", "gpu-1:9456", {"collector": "nvml"}))]
    try:
        deadline = time.monotonic() + 30
        while api(base, "/api/v2/status") is None:
            if am.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"alertmanager did not start: {(tmp_path / 'alertmanager.log').read_text()[-2000:]}")
            time.sleep(0.2)
        request = urllib.request.Request(base + "/api/v2/alerts", data=json.dumps(sent).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as r:
            assert r.status == 200

        def state() -> dict[tuple[str, str, str], bool]:
            return {(a["labels"]["alertname"], a["labels"]["instance"], a["labels"].get("collector", "")):
                    bool(a["status"]["inhibitedBy"]) for a in api(base, "/api/v2/alerts?inhibited=true") or []}
        while len(state()) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert state() == {("NodeHealthKernelLogUnreadable", "gpu-1:9456", ""): False,
                           ("NodeHealthCannotJudge", "gpu-1:9456", ""): True,
                           ("NodeHealthCannotJudge", "gpu-2:9456", ""): False,
                           ("NodeHealthCollectorFailing", "gpu-1:9456", "kmsg"): True,
                           ("NodeHealthCollectorFailing", "gpu-1:9456", "nvml"): False}
    finally:
        am.terminate()
        am.wait(10)
