"""The daemon's periodic RDMA tests with a fake at the verbs boundary (fake_rdma stands in for
nodehealth.rdma's client and server, answering with results and errors the VM tier recorded from
real tests, tests/fixtures/rdma/vm-runs.json): rounds, peers in turn, one test at a time and only
between passes, shutdown, bounded series, and the daemon's /metrics and report."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
import types

import pytest
from conftest import machine

from nodehealth import config, exporter, registry
from nodehealth.collectors import rdma_bw as facts_module
from nodehealth.config import ConfigError
from nodehealth.daemon import Daemon
from nodehealth.engine import Engine
from nodehealth.host import HostPaths
from nodehealth.rdma import bw as rdma
from nodehealth.rdma import periodic as rdma_periodic
from nodehealth.rdma.periodic import Admission, RdmaPeriodic, find_rails, inventory_peers

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden", "rdma-bw.metrics.txt")
with open(os.path.join(HERE, "fixtures", "rdma", "vm-runs.json")) as f:
    VM = json.load(f)


def fake_rdma(answers=None, hold=0.0):
    """nodehealth.rdma at the verbs boundary: client() answers from `answers` (peer -> a recorded
    result or (stage, message)), holding each test for `hold` seconds; serve() serves until stop."""
    calls, served, active = [], [], []
    lock = threading.Lock()

    def client(peer, opts, host, timeout, cancel=None):
        with lock:
            active.append(peer)
            calls.append((peer, opts, len(active)))
        try:
            if cancel is not None and cancel.wait(hold):
                raise rdma.RdmaError("the test was cancelled (the daemon is stopping)", "cancelled")
            answer = (answers or {}).get(peer, VM["client_result"])
            if isinstance(answer, tuple):
                raise rdma.RdmaError(answer[1], answer[0])
            return rdma.Result(**answer)
        finally:
            with lock:
                active.remove(peer)

    def serve(opts, stop, on_result, listen, host, timeout, admit):
        served.append(opts)
        for client in ("192.0.2.7", "::ffff:192.0.2.7", "198.51.100.9"):  # a peer twice, then a stranger
            if not admit(client):
                on_result(rdma.RdmaError(f"refused a test for {client}: not one of this node's peers", "refused"))
        on_result(rdma.Result(**VM["client_result"]))
        on_result(rdma.RdmaError(VM["errors"]["bogus"]))
        stop.wait()

    return types.SimpleNamespace(Options=rdma.Options, RdmaError=rdma.RdmaError, pick_gid=lambda *a: 1,
                                 client=client, serve=serve, calls=calls, served=served)


def cfg(**over):
    c = config.defaults()
    c["rdma_bw"].update(enabled=True, start_delay_seconds=0.0, interval_seconds=0.05, duration_seconds=0.01,
                        rails=["mlx5_0:1", "mlx5_1:1"], peers=["b", "c", "d"], serve_to=["192.0.2.0/28"])
    c["rdma_bw"].update(over)
    return c


def runner(c, backend, on_run=lambda: None, clock=time.time):
    return RdmaPeriodic(c["rdma_bw"], HostPaths("/nonexistent"), "a", on_run, clock, backend=backend)


def run_until(r, backend, n, idle=None, stop=None):
    stop = stop or threading.Event()
    idle = idle or threading.Event()
    if not idle.is_set() and idle is not None:
        idle.set()
    threads = r.start(stop, idle)
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while len(backend.calls) < n and time.monotonic() < deadline:
        time.sleep(0.005)
    stop.set()
    for t in threads:
        t.join(5)
    assert not any(t.is_alive() for t in threads)
    return threads


def test_rounds_take_peers_in_turn_one_test_at_a_time():
    backend = fake_rdma(hold=0.01)
    r = runner(cfg(), backend)
    run_until(r, backend, 6)
    tested = [(opts.device, peer) for peer, opts, _ in backend.calls[:6]]
    # round 0: rail 0 -> b, rail 1 -> c; round 1: rail 0 -> c, rail 1 -> d; round 2: d, b
    assert tested == [("mlx5_0", "b"), ("mlx5_1", "c"), ("mlx5_0", "c"), ("mlx5_1", "d"), ("mlx5_0", "d"),
                      ("mlx5_1", "b")]
    assert max(n for _, _, n in backend.calls) == 1  # never two tests at once
    opts = backend.calls[0][1]
    assert (opts.port, backend.calls[1][1].port) == (18515, 18516)  # rail i is served on port + i
    assert opts.duration == 0.01 and opts.size == 65536 and opts.gid_index == 1


def test_no_test_starts_while_a_pass_runs():
    backend = fake_rdma()
    r = runner(cfg(), backend)
    stop, idle = threading.Event(), threading.Event()  # a pass is running: not idle
    threads = r.start(stop, idle)
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert backend.calls == []
    idle.set()  # the pass ended
    deadline = time.monotonic() + 5
    while not backend.calls and time.monotonic() < deadline:
        time.sleep(0.005)
    stop.set()
    for t in threads:
        t.join(5)
    assert backend.calls


def test_stop_interrupts_a_test_and_records_nothing_for_it():
    backend = fake_rdma(hold=30.0)
    r = runner(cfg(), backend)
    stop, idle = threading.Event(), threading.Event()
    idle.set()
    threads = r.start(stop, idle)
    for t in threads:
        t.start()
    while not backend.calls:
        time.sleep(0.005)
    start = time.monotonic()
    stop.set()
    for t in threads:
        t.join(5)
    assert time.monotonic() - start < 2 and not any(t.is_alive() for t in threads)
    assert r.facts().runs == ()


def test_outcomes_become_runs_with_their_stage_and_the_servers_count_what_they_served():
    killed = ("transfer", VM["errors"]["killed"])
    backend = fake_rdma({"c": killed, "d": ("peer", VM["errors"]["unreachable"])})
    r = runner(cfg(), backend)
    run_until(r, backend, 4)
    facts = r.facts()
    by = {(run.device, run.peer): run for run in facts.runs}
    assert by[("mlx5_0", "b")].stage == "ok" and by[("mlx5_0", "b")].bw_avg_gbps == VM["client_result"]["bw_avg_gbps"]
    assert by[("mlx5_1", "c")].stage == "transfer" and by[("mlx5_1", "c")].error == VM["errors"]["killed"]
    assert by[("mlx5_1", "d")].stage == "peer"
    assert [o.port for o in backend.served] == [18515, 18516]
    assert dict(facts.served) == {"ok": 2, "error": 2, "refused": 2}  # the stranger, at each rail


def test_a_peer_that_does_not_take_the_test_hands_the_rail_to_the_next():
    from nodehealth.checks import rdma_bw as check
    from nodehealth.model import Observed

    backend = fake_rdma({"b": ("peer", VM["errors"]["unreachable"])})
    c = cfg(rails=["mlx5_0:1"])
    r = runner(c, backend)
    run_until(r, backend, 2)
    assert [peer for peer, _, _ in backend.calls[:2]] == ["b", "c"]  # the same round, the same rail
    facts = r.facts()
    assert [(run.peer, run.stage) for run in facts.runs[:2]] == [("b", "peer"), ("c", "ok")]
    assert check.judge(Observed({"rdma_bw": facts}), dict(check.DEFAULTS, expected_gbps={"mlx5_0": 0.1})) == []


def test_series_stay_bounded():
    c = cfg(history=3)
    r = runner(c, fake_rdma())
    for i in range(100):
        r.record(facts_module.Run("mlx5_0", 1, ["b", "c", "d"][i % 3], float(i), "ok", None, 65536, 1.0, 1.0, 1.0,
                                  1.0))
    assert len([run for run in r.facts().runs if run.peer == "b"]) <= 3
    assert len(r.facts().runs) == 3  # the history holds the newest against every peer
    r.peers = ["b"]  # the peers changed: c and d's series go once the rail's history has moved on
    for t in (200.0, 201.0, 202.0):
        r.record(facts_module.Run("mlx5_0", 1, "b", t, "ok", None, 65536, 1.0, 1.0, 1.0, 1.0))
    latest = facts_module.latest(r.facts())
    assert set(latest) == {("mlx5_0", 1, "b")}


def test_metrics_of_runs(tmp_path):
    r = runner(cfg(), fake_rdma())
    res = VM["client_result"]
    r.record(facts_module.Run("mlx5_0", 1, "b", 100.0, "ok", None, res["size"], res["seconds"], res["bw_avg_gbps"],
                              res["bw_peak_gbps"], res["msg_rate_mpps"]))
    r.record(facts_module.Run("mlx5_1", 1, "b", 101.0, "transfer", VM["errors"]["killed"], res["size"]))
    text = exporter.render(facts_module.metrics(r.facts())).decode()
    assert f'nodehealth_rdma_write_bw_gbps{{device="mlx5_0",port="1",peer="b",stat="avg"}} {res["bw_avg_gbps"]!r}' \
        in text
    assert 'nodehealth_rdma_write_bw_gbps{device="mlx5_1"' not in text  # absent, not zero, when it failed
    assert 'nodehealth_rdma_bw_last_run_success{device="mlx5_1",port="1",peer="b"} 0' in text
    assert 'nodehealth_rdma_bw_last_run_timestamp_seconds{device="mlx5_0",port="1",peer="b"} 100' in text
    assert 'nodehealth_rdma_bw_runs_total{device="mlx5_1",port="1",result="transfer"} 1' in text
    rate = float(text.split('nodehealth_rdma_write_messages_per_second{device="mlx5_0",port="1",peer="b"} ')[1]
                 .split()[0])
    assert rate == pytest.approx(res["msg_rate_mpps"] * 1e6)


def test_metrics_golden():
    """The families and their text, byte for byte (UPDATE_GOLDEN=1 rewrites): two rails, three peers,
    the recorded result and the recorded failures, and what this node served."""
    r = runner(cfg(), fake_rdma())
    res = VM["client_result"]
    for t, (device, peer) in enumerate([("mlx5_0", "b"), ("mlx5_1", "c"), ("mlx5_0", "c"), ("mlx5_1", "d")]):
        r.record(facts_module.Run(device, 1, peer, 1000.0 + t, "ok", None, res["size"], res["seconds"],
                                  res["bw_avg_gbps"], res["bw_peak_gbps"], res["msg_rate_mpps"]))
    r.record(facts_module.Run("mlx5_0", 1, "d", 1010.0, "transfer", VM["errors"]["killed"], res["size"]))
    r.record(facts_module.Run("mlx5_1", 1, "b", 1011.0, "peer", VM["errors"]["unreachable"], res["size"]))
    r._served(rdma.Result(**res))
    r._served(rdma.RdmaError(VM["errors"]["bogus"]))
    r._served(rdma.RdmaError("refused a test for 198.51.100.9: not one of this node's peers", "refused"))
    text = exporter.render(facts_module.metrics(r.facts())).decode()
    if os.environ.get("UPDATE_GOLDEN"):
        with open(GOLDEN, "w") as f:
            f.write(text)
    with open(GOLDEN) as f:
        assert text == f.read()


def test_the_daemon_judges_a_run_at_once_and_shows_it(tmp_path):
    root = tmp_path / "machine"
    shutil.copytree(machine("h100-8x-cx7"), root, symlinks=True)
    c = cfg(peers=["b"])
    c["daemon"]["state_dir"] = str(tmp_path / "state")
    host = HostPaths(str(root))
    engine = Engine(registry.COLLECTORS, registry.CHECKS, host, c)
    d = Daemon(engine, c, "a")
    d.rdma = runner(c, fake_rdma(), on_run=d.on_rdma, clock=engine.clock)
    d.rdma.rails = [("mlx5_0", 1)]
    d.run_pass()
    assert d.pass_idle.is_set()
    assert not [f for f in d.report.findings if f.check == "rdma_bw"]  # nothing ran: no verdict
    for t in (1.0, 2.0):  # two runs at a third of the rail's 400 Gb/s
        d.rdma.record(facts_module.Run("mlx5_0", 1, "b", t, "ok", None, 65536, 5.0, 130.0, 131.0, 0.25))
    d.on_rdma()
    assert [(f.reason, f.severity.value) for f in d.report.findings if f.check == "rdma_bw"] == [
        ("RdmaBandwidthLow", "degraded")]
    text = exporter.render(d.metrics()).decode()
    assert 'nodehealth_rdma_write_bw_gbps{device="mlx5_0",port="1",peer="b",stat="avg"} 130' in text
    assert 'nodehealth_finding{check="rdma_bw",severity="degraded",reason="RdmaBandwidthLow",device="mlx5_0:1"} 1' \
        in text
    for t, peer in ((3.0, "b"), (4.0, "c")):  # writes fail against two peers: fatal, sticky, saved at once
        d.rdma.record(facts_module.Run("mlx5_0", 1, peer, t, "transfer", VM["errors"]["killed"], 65536))
    d.on_rdma()
    assert "RdmaWriteFailed" in json.dumps(json.loads((tmp_path / "state" / "state.json").read_text())["sticky"])


def test_the_servers_admit_the_peers_only_unless_serve_to_says_whom():
    now = [0.0]
    names = {"gpu-002": {"10.1.0.2", "fe80::2%eth0"}, "gpu-003": {"10.1.0.3"}}
    lookups = []

    def resolve(name):
        lookups.append(name)
        return names.get(name, set())

    peers = Admission(["gpu-002", "gpu-003", "10.9.0.1"], resolve, clock=lambda: now[0])
    assert peers.admits("10.1.0.2") and peers.admits("::ffff:10.1.0.3") and peers.admits("10.9.0.1")
    assert peers.admits("fe80::2")  # a scoped address is the same host
    assert not peers.admits("10.1.0.4") and not peers.admits("10.9.0.2") and not peers.admits("garbage")
    assert lookups == ["gpu-002", "gpu-003"]  # once for every client in the next minute
    names["gpu-003"] = {"10.1.0.33"}  # the node moved: believed after RESOLVE_SECONDS, not before
    assert peers.admits("10.1.0.3") and not peers.admits("10.1.0.33")
    now[0] = rdma_periodic.RESOLVE_SECONDS
    assert peers.admits("10.1.0.33") and not peers.admits("10.1.0.3")
    assert len(lookups) == 4

    anyone = Admission(["0.0.0.0/0", "::/0"], resolve)
    assert anyone.admits("203.0.113.1") and anyone.admits("2001:db8::1")
    nobody = Admission([], resolve)
    assert not nobody.admits("127.0.0.1")
    assert not Admission(["unknown-name"], resolve).admits("127.0.0.1")  # an unresolved name admits no one
    assert not Admission(["x" * 64 + ".invalid"]).admits("127.0.0.1")  # too long for DNS: UnicodeError, no crash


def test_serve_to_takes_the_place_of_the_peers_and_refusals_are_logged_once_a_minute(caplog):
    r = runner(cfg(peers=["10.1.0.2"], serve_to=[]), fake_rdma())
    assert r.admission.admits("10.1.0.2") and not r.admission.admits("10.2.0.1")
    r = runner(cfg(peers=["10.1.0.2"], serve_to=["10.2.0.0/16"]), fake_rdma())
    assert r.admission.admits("10.2.0.1") and not r.admission.admits("10.1.0.2")
    with caplog.at_level(logging.WARNING, logger="nodehealth.rdma"):
        for _ in range(5):
            r._served(rdma.RdmaError("refused a test for 10.1.0.2: not one of this node's peers", "refused"))
    assert dict(r.facts().served) == {"refused": 5}
    assert len(caplog.records) == 1 and "refused a test for 10.1.0.2" in caplog.text


def test_find_rails_and_pick_gid_on_a_fixture_sysfs(tmp_path):
    for dev, state in (("mlx5_1", "4: ACTIVE"), ("mlx5_0", "4: ACTIVE"), ("mlx5_2", "1: DOWN")):
        port = tmp_path / f"sys/class/infiniband/{dev}/ports/1"
        (port / "gids").mkdir(parents=True)
        (port / "gid_attrs/types").mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "link_layer").write_text("Ethernet\n")
        for i, (gid, kind) in enumerate([("fe80:0000:0000:0000:0200:00ff:fe00:0000", "IB/RoCE v1"),
                                         ("fe80:0000:0000:0000:0200:00ff:fe00:0000", "RoCE v2"),
                                         ("0000:0000:0000:0000:0000:ffff:0a00:0001", "IB/RoCE v1"),
                                         ("0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2")]):
            (port / f"gids/{i}").write_text(gid + "\n")
            (port / f"gid_attrs/types/{i}").write_text(kind + "\n")
    host = HostPaths(str(tmp_path))
    assert find_rails(host, []) == [("mlx5_0", 1), ("mlx5_1", 1)]  # sorted, ACTIVE only
    assert find_rails(host, ["mlx5_7", "mlx5_2:1"]) == [("mlx5_7", 1), ("mlx5_2", 1)]  # configured: kept, to say why
    assert rdma.pick_gid(host, "mlx5_0", 1) == 3  # RoCE v2 with an IPv4 address
    (tmp_path / "sys/class/infiniband/mlx5_0/ports/1/gids/3").write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
    assert rdma.pick_gid(host, "mlx5_0", 1) == 1  # else any RoCE v2
    (tmp_path / "sys/class/infiniband/mlx5_0/ports/1/link_layer").write_text("InfiniBand\n")
    assert rdma.pick_gid(host, "mlx5_0", 1) is None  # InfiniBand: LIDs
    assert find_rails(HostPaths(str(tmp_path / "none")), []) == []


def test_peers_from_the_pingmesh_inventory(tmp_path):
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps({"nodes": [
        {"name": "a", "leaf": "l1", "addresses": ["10.0.0.1"]}, {"name": "b", "leaf": "l1", "addresses": ["10.0.0.2"]},
        {"name": "c", "leaf": "l1"}, {"name": "d", "leaf": "l2", "addresses": ["10.0.1.1"]}]}))
    assert inventory_peers(str(inv), "a") == ["10.0.0.2", "c"]
    assert inventory_peers(str(inv), "zz") == []


@pytest.mark.parametrize("section, key, value, fragment", [
    ("rdma_bw", "duration_seconds", 120.0, "rdma_bw.duration_seconds: must be in (0, 60]"),
    ("rdma_bw", "interval_seconds", 6.0, "more than twice rdma_bw.duration_seconds"),
    ("rdma_bw", "rails", ["mlx5_0:x"], "'mlx5_0:x' is not 'device' or 'device:port'"),
    ("rdma_bw", "peers", [""], "rdma_bw.peers: at most 64 non-empty"),
    ("rdma_bw", "history", 1, "rdma_bw.history (1) must be at least checks.rdma_bw.low_runs (2)"),
    ("rdma_bw", "size", 0, "rdma_bw.size: must be 1 B to 1 GiB"),
    ("checks.rdma_bw", "min_fraction", 1.5, "checks.rdma_bw.min_fraction: must be a fraction"),
    ("checks.rdma_bw", "expected_gbps", {"mlx5_0": "fast"}, "checks.rdma_bw.expected_gbps.mlx5_0: must be a number"),
])
def test_config_is_validated(tmp_path, section, key, value, fragment):
    doc: dict = {}
    node = doc
    for part in section.split("."):
        node = node.setdefault(part, {})
    node[key] = value
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as err:
        config.load(str(path))
    assert fragment in str(err.value)


def test_off_by_default_and_pyverbs_stays_unloaded():
    assert config.defaults()["rdma_bw"]["enabled"] is False
    import subprocess
    import sys

    code = ("import sys, nodehealth.daemon, nodehealth.rdma.periodic; "
            "print([m for m in sys.modules if m.startswith(('pyverbs', 'nodehealth.rdma.bw', "
            "'nodehealth.rdma.periodic'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['nodehealth.rdma.periodic']"


def test_a_bug_in_one_test_does_not_end_the_rounds():
    backend = fake_rdma()
    real = backend.client
    broken = []

    def client(peer, opts, host, timeout, cancel=None):
        if not broken:
            broken.append(peer)
            raise ValueError("a bug")
        return real(peer, opts, host, timeout, cancel)

    backend.client = client
    r = runner(cfg(), backend)
    run_until(r, backend, 3)
    assert broken == ["b"] and len(r.facts().runs) >= 3


def test_a_real_daemon_on_a_fixture_node_says_why_its_rails_were_not_tested(tmp_path, daemon_factory):
    """The real nodehealth.rdma on an 8-rail fixture of a machine this host is not: every ACTIVE rail's
    test stops before any write, each says why, and nothing is called healthy."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"rdma_bw": {"enabled": True, "peers": ["127.0.0.1"], "start_delay_seconds": 0,
                                            "port": 28515, "listen": "127.0.0.1"}}))
    d = daemon_factory(machine("h100-8x-cx7"), str(tmp_path / "state"), "--config", str(path))
    d.wait_ready()
    rails = find_rails(HostPaths(machine("h100-8x-cx7")), [])
    deadline = time.monotonic() + 20
    found = []
    while time.monotonic() < deadline and len(found) < len(rails):  # every rail's test ended
        report = json.loads(d.get("/v1/report")[1])
        found = [f for f in report["findings"] if f["check"] == "rdma_bw"]
        time.sleep(0.1)
    assert {(f["reason"], f["severity"]) for f in found} == {("RdmaBwNotRun", "unknown")}
    assert len(rails) >= 7 and sorted(f["device"] for f in found) == [f"{d}:{p}" for d, p in rails]
    # the fixture has uverbs files, so the test gets as far as pyverbs, which finds no such device
    assert found[0]["message"].startswith("The RDMA bandwidth test of mlx5_0:1 could not run: ")
    text = d.get("/metrics")[1].decode()
    assert re.search(r'nodehealth_rdma_bw_runs_total\{device="mlx5_0",port="1",result="(preflight|setup)"\} 1', text)
    assert "nodehealth_rdma_write_bw_gbps" not in text
    assert d.stop() < 5
