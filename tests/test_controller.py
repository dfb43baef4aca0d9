"""The pingmesh controller against the fake API server, with agents served by real HTTP servers.

Leader election through a Lease, a full analysis (Nodes listed, summaries fetched, verdicts written
to one ConfigMap, the inventory to another when it changed), the agent side (the verdict read back
becomes a taint on that node only, through the Publisher), agents that misbehave, and an API server
that refuses.
"""
from __future__ import annotations

import base64
import gc
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import free_port, http_get
from fake_kube_apiserver import FakeApiServer

from nodehealth import config, inventory
from nodehealth.checks.pingmesh import verdict_findings
from nodehealth.kube import api as kube_api
from nodehealth.kube import election
from nodehealth.kube import publisher as kube_publisher
from nodehealth.kube import taints as kube_taints
from nodehealth.kube.defaults import DEFAULTS as KUBE_DEFAULTS
from nodehealth.model import Action, Report, Severity, verdict
from nodehealth.pingmesh import controller, packed, stats, verdicts
from nodehealth.pingmesh.fetch import fetch_summary
from nodehealth.server import STUCK_EXIT_SECONDS

W = 30.0  # window seconds
GPU = {"nvidia.com/gpu.present": "true"}
LEAVES = {"leaf-a": ["gpu-01", "gpu-02", "gpu-03", "gpu-04"], "leaf-b": ["gpu-05", "gpu-06", "gpu-07", "gpu-08"]}
LEAF_OF = {n: leaf for leaf, nodes in LEAVES.items() for n in nodes}
FAULTY = "gpu-03"
FAST_KUBE = {"retry_initial_seconds": 0.01, "retry_max_seconds": 0.05, "request_timeout_seconds": 2.0,
             "resync_seconds": 3600.0, "heartbeat_seconds": 3600.0}


def wait_for(predicate, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


# -- summaries, as agents serve them (the spec's "Summary" section) --------------------------------

def summary(node: str, now: float, windows: int = 10, bad: frozenset = frozenset({FAULTY}),
            window: float = W) -> dict:
    """`node`'s view: every other node probed on rail 0; probes to or from a `bad` node lose half."""
    first = math.floor(now / window) * window - (windows - 1) * window
    out = []
    for i in range(windows):
        start = first + i * window
        peers = []
        for peer in sorted(LEAF_OF):
            if peer == node:
                continue
            sent = 10
            lost = 5 if (node in bad or peer in bad) else 0
            counts = [[3, sent - lost]] if sent > lost else []
            peers.append({"node": peer, "leaf": LEAF_OF[peer], "rail": 0, "probe": "ping", "sent": sent,
                          "lost": lost, "counts": counts})
        out.append({"start": start, "closed": start + window <= now, "peers": peers})
    return {"schema_version": 1, "node": node, "leaf": LEAF_OF.get(node, ""), "pod": "", "time": now,
            "window_seconds": window, "buckets_seconds": list(stats.BUCKETS_SECONDS), "windows": out}


class Agents:
    """One HTTP server per node on 127.0.0.<n>, all on the same port (as agents share the daemon's port)."""

    def __init__(self, names: list[str], now: float):
        self.now = now
        self.behaviour: dict[str, object] = {}  # node -> a summary dict, or a misbehaviour (see _answer)
        self.addresses = {name: f"127.0.0.{i + 2}" for i, name in enumerate(names)}
        self.requests: list[tuple[str, str]] = []
        self.release = threading.Event()  # ends the slow answers at teardown
        self.hung_up: set[str] = set()  # agents whose dripped head the controller stopped reading
        self.packed: set[str] = set()  # agents of this version: asked for the packed form, they answer it
        self.served_packed: set[str] = set()
        for _ in range(20):
            self.port = free_port()
            try:
                self.servers = [self._server(name, address) for name, address in self.addresses.items()]
                break
            except OSError:  # the port was taken on one of the addresses: try another
                for srv in getattr(self, "servers", []):
                    srv.server_close()
        for srv in self.servers:
            threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def _server(self, name: str, address: str) -> ThreadingHTTPServer:
        agents = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                agents.requests.append((name, self.path))
                agents._answer(self, name)

            def log_message(self, *args) -> None:
                pass

        srv = ThreadingHTTPServer((address, self.port), Handler)
        srv.daemon_threads = True
        return srv

    def _answer(self, handler: BaseHTTPRequestHandler, name: str) -> None:
        how = self.behaviour.get(name, "ok")
        if how == "ok":
            windows = int(handler.path.rpartition("windows=")[2] or 10)
            how = summary(name, self.now, windows)
            if name in self.packed and packed.QUERY in handler.path.partition("?")[2].split("&"):
                self.served_packed.add(name)
                return self._send(handler, 200, packed.dumps(stats.parse_summary(how)), packed.CONTENT_TYPE)
        if isinstance(how, dict):
            return self._send(handler, 200, json.dumps(how).encode())
        if how == "garbage":
            return self._send(handler, 200, b'{"schema_version": 1, "node": [[[[')
        if how == "huge":  # says how large up front
            return self._send(handler, 200, b" " * (stats.MAX_SUMMARY_BYTES + 10))
        if how == "huge-unannounced":  # no Content-Length: the connection's end ends the body
            handler.send_response(200)
            handler.end_headers()
            try:
                for _ in range(40):
                    handler.wfile.write(b" " * 65536)
            except OSError:  # the controller hung up past its bound, as it should
                pass
            return None
        if how == "slow":
            self.release.wait(10)
            return self._send(handler, 200, json.dumps(summary(name, self.now)).encode())
        if how == "drip":  # headers at once, then a byte now and then: each read is quick, the whole is not
            handler.send_response(200)
            handler.send_header("Content-Length", "100000")
            handler.end_headers()
            while not self.release.wait(0.1):
                try:
                    handler.wfile.write(b" ")
                    handler.wfile.flush()
                except OSError:
                    return None
            return None
        if how in ("drip-status", "drip-headers"):  # the answer's head itself, a byte at a time
            head = b"HTTP/1.1 200 OK\r\n" if how == "drip-headers" else b""
            handler.wfile.write(head)
            try:
                for _ in range(DRIP_BYTES):  # each byte well within the fetch timeout, the whole far past it
                    if self.release.wait(0.05):
                        return None
                    handler.wfile.write(b"HTTP/1.1 200 OK " if how == "drip-status" else b"X")
                    handler.wfile.flush()
            except OSError:  # the controller hung up while the head was still coming: what we want
                self.hung_up.add(name)
            return None
        if how == "error":
            return self._send(handler, 500, b"boom")
        if isinstance(how, tuple) and how[0] == "impostor":  # a valid summary for another node's name
            return self._send(handler, 200, json.dumps(summary(how[1], self.now)).encode())
        raise AssertionError(how)

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, code: int, body: bytes, content_type: str = "application/json") -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        try:
            handler.wfile.write(body)
        except OSError:  # the controller hung up on an answer it would not read
            pass

    def close(self) -> None:
        self.release.set()
        for srv in self.servers:
            srv.shutdown()
            srv.server_close()


DRIP_BYTES = 400  # 20 s of a dripped head: a controller that waits for it all has no deadline
SHORT = {"lease": 1.0, "renew": 0.2}  # a Lease of 1 s renewed every 0.2 s
NOW = math.floor(time.time() / W) * W + 0.2 * W  # a little into a window, as the controller runs


@pytest.fixture
def server():
    s = FakeApiServer().start()
    yield s
    s.close()


@pytest.fixture
def agents():
    a = Agents(sorted(LEAF_OF), NOW)
    yield a
    a.close()


@pytest.fixture
def cluster(server, agents):
    """The fake API server with the eight GPU nodes (leaf labels, InternalIPs) and a CPU node."""
    for name, leaf in sorted(LEAF_OF.items()):
        server.add_node(name, labels=dict(GPU, **{"nodehealth.io/leaf": leaf}),
                        internal_ip=agents.addresses[name])
    server.add_node("cpu-01", labels={"nodehealth.io/leaf": "leaf-c"}, internal_ip="127.0.0.99")
    return server


@pytest.fixture
def make(server, agents, tmp_path):
    """Controllers on the fake server, each through its own real client (Leases long enough for any test
    that calls cycle() by hand; the election tests pass short ones)."""
    made = []
    kubeconfig = server.kubeconfig(str(tmp_path / "kubeconfig"))

    def _make(identity: str = "controller-a", lease: float = 30.0, renew: float = 5.0,
              **pingmesh) -> controller.Controller:
        cfg = config.defaults()
        cfg["kube"].update(FAST_KUBE, kubeconfig=kubeconfig)
        cfg["daemon"]["listen"] = f"0.0.0.0:{agents.port}"
        cfg["pingmesh"].update({"enabled": True, "fetch_timeout_seconds": 1.0, **pingmesh})
        c = controller.Controller(cfg, identity, lease_seconds=lease, renew_seconds=renew)
        made.append(c)
        return c

    yield _make
    for c in made:
        c.stop.set()


def holder(server) -> str | None:
    lease = server.lease("nodehealth", "nodehealth-controller")
    return lease and lease["spec"].get("holderIdentity")


VERDICTS_CM, INVENTORY_CM = "nodehealth-pingmesh", "nodehealth-pingmesh-inventory"
CONFIGMAPS = "/api/v1/namespaces/nodehealth/configmaps"


def stored_doc(server) -> dict:
    cm = server.configmap("nodehealth", VERDICTS_CM)
    return json.loads(cm["data"]["verdicts.json"])


def stored_inventory(server) -> inventory.Inventory:
    return verdicts.decode_inventory(server.configmap("nodehealth", INVENTORY_CM)["binaryData"]["inventory.json.gz"])


def configmap_calls(server, name: str) -> list[str]:
    """The methods of the requests on ConfigMap `name` (GET, PUT; a create names it in its body, not its path)."""
    return [method for method, path in server.requests if path == f"{CONFIGMAPS}/{name}"]


def samples(c: controller.Controller, name: str) -> dict:
    return {labels: value for m in c.metrics() if m.name == name for labels, value in m.samples}


# -- leader election ---------------------------------------------------------------------------------

def test_one_leads_and_the_other_takes_over_only_after_the_lease_expires(server, make):
    a, b = make("controller-a", **SHORT), make("controller-b", **SHORT)
    assert a.elector.tick() and a.elector.is_leader()
    assert not b.elector.tick() and not b.elector.is_leader()
    lease = server.lease("nodehealth", "nodehealth-controller")["spec"]
    assert lease["holderIdentity"] == "controller-a" and lease["leaseDurationSeconds"] == 1
    assert "." in lease["renewTime"]  # a MicroTime, with microseconds

    # The leader renews; the standby sees the record change and keeps waiting.
    for _ in range(6):
        time.sleep(0.2)
        assert a.elector.tick()
        died = time.monotonic()
        assert not b.elector.tick()
    # The leader dies (no more renewals): it stops acting before anyone may take over ...
    assert wait_for(lambda: not a.elector.is_leader(), 2.0)
    assert time.monotonic() - died < 1.0
    # ... and the standby takes over only once the Lease has gone unrenewed for its duration.
    assert not b.elector.tick()
    took = wait_for(lambda: b.elector.tick() and time.monotonic(), 3.0)
    assert took - died >= 1.0
    assert holder(server) == "controller-b"
    assert server.lease("nodehealth", "nodehealth-controller")["spec"]["leaseTransitions"] == 1
    # The old leader, back, finds a live holder and stands by.
    assert not a.elector.tick() and not a.elector.is_leader()


class Clock:
    """A monotonic clock the test moves: the electors' schedule is judged in its seconds, not the machine's."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def electors(server, tmp_path, *names: str, clock: Clock) -> list[election.LeaderElector]:
    api = kube_api.ClientApi(server.kubeconfig(str(tmp_path / "kc")))
    return [election.LeaderElector(lambda: api, "nodehealth", "nodehealth-controller", name, "the controller",
                                   clock=clock) for name in names]


def run_schedule(clock: Clock, schedule: dict, until: float, on_tick) -> None:
    """Tick each elector at the times its own next_delay() asks for, in time order, until `until`
    or until on_tick(elector, led) returns True."""
    while True:
        elector, at = min(schedule.items(), key=lambda item: item[1])
        if at > until:
            return
        clock.t = at
        led = elector.tick()
        if on_tick(elector, led):
            return
        if elector in schedule:  # on_tick may have taken it out: it died
            schedule[elector] = clock.t + elector.next_delay()


@pytest.mark.parametrize("phase", [0.0, 0.4, 1.1, 1.9, 2.6, 3.3, 4.5])
def test_a_standby_takes_over_within_the_handover_time_the_docs_state(server, tmp_path, phase):
    """However the standby's looks fall against the leader's renewals, it leads at most a Lease plus one
    look (17 s) after the last renewal, and never before a Lease has passed since it saw that renewal."""
    clock = Clock()
    a, b = electors(server, tmp_path, "controller-a", "controller-b", clock=clock)
    assert election.HANDOVER_SECONDS == b.handover_seconds == 17.0
    assert a.tick()
    died = clock.t + 30 + phase * 2.3  # the leader's last renewal is its last tick before this
    renewals = []

    def on_tick(elector, led):
        if elector is a:
            renewals.append(clock.t)
            if clock.t + a.next_delay() > died:
                del schedule[a]  # it dies: no more ticks
            return False
        return led

    schedule = {a: clock.t + a.next_delay(), b: clock.t + phase}
    run_schedule(clock, schedule, died + 60, on_tick)
    assert holder(server) == "controller-b"
    took, last = clock.t, renewals[-1]
    assert last + b.lease_seconds <= took <= last + election.HANDOVER_SECONDS
    assert not a.is_leader()  # it stopped acting before then (a Lease less one renewal after its last)
    for doc in ("docs/pingmesh.md", "deploy/components/pingmesh/controller.yaml"):  # what operators read
        with open(os.path.join(os.path.dirname(__file__), "..", doc), encoding="utf-8") as f:
            text = " ".join(f.read().replace("#", " ").split())
        assert f"at most {election.HANDOVER_SECONDS:g} s after the leader's last renewal" in text, doc


def test_a_lease_claiming_a_huge_duration_stops_no_controller_for_good(server, tmp_path, caplog):
    """A Lease written by anyone else with leaseDurationSeconds of years is honoured for twice our own."""
    clock = Clock()
    server.add_lease("nodehealth", "nodehealth-controller", {})
    server.edit_lease("nodehealth", "nodehealth-controller", lambda lease: lease["spec"].update(
        holderIdentity="intruder", leaseDurationSeconds=10 ** 9, renewTime="2030-01-01T00:00:00.000000Z"))
    (b,) = electors(server, tmp_path, "controller-b", clock=clock)
    start = clock.t
    run_schedule(clock, {b: start}, start + 3600, lambda elector, led: led)
    assert holder(server) == "controller-b"
    assert clock.t - start <= election.MAX_DURATION_FACTOR * b.lease_seconds + b.retry_seconds
    assert "far past our 15 s" in caplog.text


def test_two_running_controllers_never_lead_at_once(server, make):
    a, b = make("controller-a", **SHORT), make("controller-b", **SHORT)
    a.start()
    b.start()
    leaders = set()
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        both = (a.elector.is_leader(), b.elector.is_leader())
        assert both != (True, True)
        if any(both):
            leaders.add(both)
        time.sleep(0.01)
    assert len(leaders) == 1  # one of them, and no flapping while both renew
    assert holder(server) in ("controller-a", "controller-b")


def test_a_clean_stop_hands_the_lease_over_at_once(server, make):
    a, b = make("controller-a", **SHORT), make("controller-b", **SHORT)
    assert a.elector.tick()
    assert not b.elector.tick()
    a.elector.release()
    assert not a.elector.is_leader() and holder(server) is None
    assert b.elector.tick()  # no wait for expiry: the Lease was given up


@pytest.mark.parametrize("new", [frozenset(), frozenset(LEAF_OF), frozenset(LEAVES["leaf-a"])],
                         ids=["old agents", "new agents", "half upgraded"])
def test_agents_old_and_new_give_the_same_verdicts_during_a_rolling_upgrade(cluster, agents, make, new):
    """A new agent answers the packed form the controller asks for; an old one ignores the question and
    answers JSON, which the controller reads as ever: every agent reports, the verdicts are the same."""
    agents.packed = set(new)
    c = make()
    assert c.elector.tick() and c.cycle(NOW)
    doc = stored_doc(cluster)
    assert doc["agents"] == {"reporting": 8, "failed": {}} and agents.served_packed == new
    assert {(v["kind"], v["element"]) for v in doc["verdicts"] if v["kind"] in ("node", "leaf")} == {
        ("node", FAULTY)}


def test_only_the_lease_holder_writes_and_the_lease_is_compare_and_swap(server, make):
    a = make("controller-a")
    assert a.elector.tick()
    # Another writer changes the Lease between our read and our write: the write is a 409, we do not lead.
    server.fail(409, times=1, method="PUT", path_end="/leases/nodehealth-controller")
    assert not a.elector.tick() and not a.elector.is_leader()
    assert not a.cycle(NOW)
    assert server.configmap("nodehealth", "nodehealth-pingmesh") is None


# -- a full analysis ---------------------------------------------------------------------------------

def test_a_cycle_writes_the_verdicts_and_the_inventory_each_to_its_configmap_and_nothing_else(cluster, agents,
                                                                                              make):
    c = make()
    assert c.elector.tick()
    assert c.cycle(NOW)
    doc = stored_doc(cluster)
    assert doc["schema_version"] == 1 and doc["time"] == NOW and doc["window_seconds"] == W
    assert (doc["nodes"], doc["leaves"]) == (8, 2)  # the CPU node is not managed
    assert doc["agents"] == {"reporting": 8, "failed": {}}
    found = {(v["kind"], v["element"]) for v in doc["verdicts"]}
    assert {(kind, element) for kind, element in found if kind in ("node", "leaf")} == {("node", FAULTY)}, found
    # Every agent was asked for the configured number of windows only.
    assert sorted(agents.requests) == sorted((n, f"/v1/pingmesh?{packed.QUERY}&windows=6") for n in LEAF_OF)
    # The inventory the agents will use, in a ConfigMap of its own: leaves from labels, InternalIP as rail 0.
    assert [(n.name, n.leaf, n.addresses) for n in stored_inventory(cluster).nodes] == [
        (n, LEAF_OF[n], (agents.addresses[n],)) for n in sorted(LEAF_OF)]
    verdicts_cm, inventory_cm = (cluster.configmap("nodehealth", name) for name in (VERDICTS_CM, INVENTORY_CM))
    assert set(verdicts_cm["data"]) == {"verdicts.json"} and not verdicts_cm.get("binaryData")
    assert set(inventory_cm["binaryData"]) == {"inventory.json.gz"} and not inventory_cm.get("data")
    # The controller wrote its Lease and its two ConfigMaps, nothing else (Nodes above all).
    assert sorted(cluster.writes()) == [
        ("POST", "/api/v1/namespaces/nodehealth/configmaps"), ("POST", "/api/v1/namespaces/nodehealth/configmaps"),
        ("POST", "/apis/coordination.k8s.io/v1/namespaces/nodehealth/leases")]
    assert cluster.node_writes == []
    # Its metrics.
    assert samples(c, "nodehealth_controller_leader") == {(): 1}
    assert samples(c, "nodehealth_pingmesh_agents_reporting") == {(): 8}
    assert samples(c, "nodehealth_pingmesh_inventory_nodes") == {(): 8}
    assert samples(c, "nodehealth_pingmesh_verdict")[("node", FAULTY)] == 1
    assert samples(c, "nodehealth_pingmesh_verdicts")[("node",)] >= 1
    assert samples(c, "nodehealth_controller_last_analysis_timestamp_seconds") == {(): NOW}
    sizes = samples(c, "nodehealth_controller_configmap_bytes")
    assert sizes == {(VERDICTS_CM,): len(verdicts_cm["data"]["verdicts.json"].encode()),
                     (INVENTORY_CM,): len(base64.b64decode(inventory_cm["binaryData"]["inventory.json.gz"]))}
    assert samples(c, "nodehealth_controller_configmap_refused_total") == {(VERDICTS_CM,): 0, (INVENTORY_CM,): 0}


def test_the_next_cycle_replaces_the_configmap_even_after_someone_else_changed_it(cluster, make):
    c = make()
    assert c.elector.tick() and c.cycle(NOW)
    cluster.put_configmap("nodehealth", VERDICTS_CM, data={"verdicts.json": "{}"})  # a new resourceVersion
    assert c.cycle(NOW + W)
    assert stored_doc(cluster)["time"] == NOW + W
    verdict_path, inventory_path = f"{CONFIGMAPS}/{VERDICTS_CM}", f"{CONFIGMAPS}/{INVENTORY_CM}"
    calls = [r for r in cluster.requests if r[1].startswith(CONFIGMAPS)]
    assert calls == [
        ("GET", verdict_path), ("POST", CONFIGMAPS),  # the verdicts: none yet, created
        ("GET", inventory_path), ("GET", inventory_path), ("POST", CONFIGMAPS),  # the inventory: not there, created
        # The verdicts: a PUT with the resourceVersion it wrote (a 409: stale), a fresh read, a PUT ...
        ("PUT", verdict_path), ("GET", verdict_path), ("PUT", verdict_path),
        ("GET", inventory_path)]  # ... the inventory: read, the same, left alone


def test_a_leader_frozen_between_its_check_and_its_write_never_overwrites_the_new_leaders_verdicts(cluster, make):
    """The old leader passes its leadership check, freezes (a GC pause, a SIGSTOP) while a standby takes
    over and writes, and wakes to write: its write meets the new leader's resourceVersion, and it does
    not read and write again once it no longer leads."""
    a, b = make("controller-a", **SHORT), make("controller-b", **SHORT)
    assert a.elector.tick() and a.cycle(NOW)
    real, calls, frozen = a.elector.is_leader, [], threading.Event()

    def checked_then_frozen() -> bool:
        calls.append(1)
        leads = real()
        if len(calls) == 2:  # the check right before the write: it passes, then the process stands still
            frozen.set()
            wait_for(lambda: holder(cluster) == "controller-b" and stored_doc(cluster)["time"] == NOW + 2 * W, 10.0)
        return leads

    a.elector.is_leader = checked_then_frozen
    old = threading.Thread(target=a.cycle, args=(NOW + W,))
    old.start()
    frozen.wait(5.0)
    wait_for(lambda: b.elector.tick(), 5.0)  # the Lease ran out while the old leader stood still
    assert b.cycle(NOW + 2 * W)
    old.join(10.0)
    assert not old.is_alive()
    assert stored_doc(cluster)["time"] == NOW + 2 * W  # the new leader's verdicts stand


def test_the_inventory_is_rewritten_only_when_it_changed(cluster, agents, make):
    c = make()
    assert c.elector.tick() and c.cycle(NOW)
    assert configmap_calls(cluster, INVENTORY_CM).count("PUT") == 0
    for i in range(1, 4):  # the same Nodes: the verdicts are written every window, the inventory never again
        assert c.cycle(NOW + i * W)
    assert configmap_calls(cluster, VERDICTS_CM).count("PUT") == 3
    assert configmap_calls(cluster, INVENTORY_CM).count("PUT") == 0
    assert stored_doc(cluster)["time"] == NOW + 3 * W
    # A node joins: the next window's inventory has it, written once.
    cluster.add_node("gpu-09", labels=dict(GPU, **{"nodehealth.io/leaf": "leaf-b"}), internal_ip="127.0.0.98")
    assert c.cycle(NOW + 4 * W) and c.cycle(NOW + 5 * W)
    assert configmap_calls(cluster, INVENTORY_CM).count("PUT") == 1
    assert [n.name for n in stored_inventory(cluster).nodes] == sorted(LEAF_OF) + ["gpu-09"]
    assert stored_inventory(cluster).get("gpu-09").addresses == ("127.0.0.98",)
    # Compared with what is there, not with what it last wrote: someone else's change is put right ...
    cluster.put_configmap("nodehealth", INVENTORY_CM, binary_data={})
    assert c.cycle(NOW + 6 * W)
    assert configmap_calls(cluster, INVENTORY_CM).count("PUT") == 2 and stored_inventory(cluster).get("gpu-09")
    # ... and a deleted one comes back.
    with cluster.lock:
        del cluster.configmaps[("nodehealth", INVENTORY_CM)]
    assert c.cycle(NOW + 7 * W)
    assert cluster.writes().count(("POST", CONFIGMAPS)) == 3 and stored_inventory(cluster).get("gpu-09")
    assert configmap_calls(cluster, INVENTORY_CM).count("PUT") == 2


def test_trouble_with_the_inventory_never_holds_the_verdicts_back(cluster, make, caplog):
    c = make()
    assert c.elector.tick() and c.cycle(NOW)
    cluster.add_node("gpu-09", labels=dict(GPU, **{"nodehealth.io/leaf": "leaf-b"}), internal_ip="127.0.0.98")
    cluster.fail(403, method="PUT", path_end=f"/configmaps/{INVENTORY_CM}")  # say, RBAC missing the new name
    assert c.cycle(NOW + W)
    assert stored_doc(cluster)["time"] == NOW + W
    assert stored_inventory(cluster).get("gpu-09") is None  # the agents keep the one they have
    assert samples(c, "nodehealth_controller_errors_total") == {("forbidden",): 1}
    assert "pingmesh inventory: Kubernetes API call failed (forbidden)" in caplog.text
    cluster.heal()
    assert c.cycle(NOW + 2 * W)  # the next window tries again
    assert stored_inventory(cluster).get("gpu-09")


def test_a_standby_analyzes_nothing_and_shows_no_analysis(cluster, agents, make):
    a, b = make("controller-a"), make("controller-b")
    assert a.elector.tick() and a.cycle(NOW)
    requests = len(agents.requests)
    assert not b.elector.tick()
    assert not b.cycle(NOW + W)
    assert samples(b, "nodehealth_controller_leader") == {(): 0}
    assert "nodehealth_pingmesh_agents_reporting" not in {m.name for m in b.metrics()}
    assert len(agents.requests) == requests  # no agent asked
    assert stored_doc(cluster)["time"] == NOW


# -- the agent's side: the verdict becomes a taint on that node only ---------------------------------

def test_the_faulty_nodes_own_agent_taints_its_node_from_the_verdict(cluster, make, tmp_path):
    c = make()
    assert c.elector.tick() and c.cycle(NOW)
    kubeconfig = cluster.kubeconfig(str(tmp_path / "agent-kubeconfig"))
    pm = config.defaults()["pingmesh"]
    publishers = {}
    for name in ("gpu-01", FAULTY, "gpu-05"):
        api = kube_api.ClientApi(kubeconfig)
        doc = verdicts.read_verdicts(api, pm)
        findings = verdict_findings(doc, name, LEAF_OF[name], NOW + 1)
        p = publishers[name] = kube_publisher.Publisher(name, dict(FAST_KUBE, kubeconfig=kubeconfig), api=api)
        p.publish(Report(name, verdict(findings), findings, [], NOW))
        assert p.sync_once()
        if name == FAULTY:
            [f] = [f for f in findings if f.reason == "PingmeshNodeFaulty"]
            assert (f.check, f.severity, f.action, f.device) == ("pingmesh", Severity.DEGRADED,
                                                                 Action.HW_INSPECTION, FAULTY)
    taints = {n: [(t["key"], t.get("value"), t["effect"]) for t in cluster.node(n)["spec"].get("taints") or []]
              for n in LEAF_OF}
    assert taints[FAULTY] == [("nodehealth.io/network", "PingmeshNodeFaulty", "PreferNoSchedule")]
    assert all(t == [] for n, t in taints.items() if n != FAULTY), taints
    conditions = {c["type"]: c for c in cluster.node(FAULTY)["status"]["conditions"]}
    assert conditions["NodeHealthNetworkProblem"]["status"] == "True"
    assert conditions["NodeHealthNetworkProblem"]["reason"] == "PingmeshNodeFaulty"

    # The controller stops: once its verdicts are 3 windows old, the agent lets the taint go.
    p = publishers[FAULTY]
    stale = verdict_findings(verdicts.read_verdicts(kube_api.ClientApi(kubeconfig), pm), FAULTY, "leaf-a",
                                      NOW + 3 * W + 1)
    assert [(f.severity, f.reason) for f in stale] == [(Severity.INFO, "PingmeshVerdictsStale")]
    p.publish(Report(FAULTY, verdict(stale), stale, [], NOW))
    assert p.sync_once()
    assert cluster.node(FAULTY)["spec"].get("taints") == []


def test_no_configmap_yet_is_no_verdicts(server, tmp_path):
    api = kube_api.ClientApi(server.kubeconfig(str(tmp_path / "kc")))
    pm = config.defaults()["pingmesh"]
    assert verdicts.read_verdicts(api, pm) is None
    assert verdicts.read_inventory(api, pm) is None
    assert verdict_findings(None, "gpu-01", "leaf-a", NOW) == []


def doc_with(*vs, time_=NOW, window=W) -> dict:
    return verdicts.parse_verdicts(json.dumps({"schema_version": 1, "time": time_, "window_seconds": window,
                                               "verdicts": list(vs), "nodes": 8, "leaves": 2}))


def v(kind: str, element: str, **kw) -> dict:
    return dict({"kind": kind, "element": element, "since": NOW - 90, "windows": 3,
                 "message": f"{kind} {element} is bad.", "evidence": {"loss": 0.5}}, **kw)


@pytest.mark.parametrize("verdict_, node, leaf, want", [
    (v("node", "gpu-03"), "gpu-03", "leaf-a", [("PingmeshNodeFaulty", Severity.DEGRADED, Action.HW_INSPECTION)]),
    (v("node", "gpu-03"), "gpu-04", "leaf-a", []),
    (v("leaf", "leaf-a"), "gpu-04", "leaf-a", [("PingmeshLeafFaulty", Severity.DEGRADED, Action.HW_INSPECTION)]),
    (v("leaf", "leaf-a"), "gpu-05", "leaf-b", []),
    (v("leaf", "leaf-a"), "gpu-09", "", []),  # a node without a leaf is in no leaf verdict
    (v("path", "leaf-a->leaf-b"), "gpu-05", "leaf-b", [("PingmeshPathDegraded", Severity.WARNING, Action.NONE)]),
    (v("path", "leaf-a->leaf-b"), "gpu-01", "leaf-a", [("PingmeshPathDegraded", Severity.WARNING, Action.NONE)]),
    (v("path", "leaf-a->leaf-b"), "gpu-09", "leaf-c", []),
    (v("path", "leaf-a->leaf-bb"), "gpu-09", "leaf-b", []),  # names match whole, never by prefix
    (v("inconclusive", "gpu-03"), "gpu-03", "leaf-a", []),
])
def test_verdict_findings(verdict_, node, leaf, want):
    findings = verdict_findings(doc_with(verdict_), node, leaf, NOW)
    assert [(f.reason, f.severity, f.action) for f in findings] == want
    for f in findings:
        assert f.check == "pingmesh" and kube_taints.subsystem_of(f) == "network"
        assert f.device == verdict_["element"] and f.message == verdict_["message"]
        assert f.evidence == {"loss": 0.5, "since": NOW - 90, "windows": 3} and f.first_seen == NOW - 90


def test_a_node_and_its_leaf_both_faulty_give_two_findings_and_one_degraded_taint():
    findings = verdict_findings(doc_with(v("node", "gpu-03"), v("leaf", "leaf-a")), "gpu-03", "leaf-a", NOW)
    assert sorted(f.reason for f in findings) == ["PingmeshLeafFaulty", "PingmeshNodeFaulty"]
    state = kube_taints.desired_state(Report("gpu-03", verdict(findings), findings, []), KUBE_DEFAULTS)["network"]
    assert (state.status, state.effect) == ("True", "PreferNoSchedule")


@pytest.mark.parametrize("age, stale", [(3 * W - 1, False), (3 * W + 1, True), (-3 * W - 1, True)])
def test_stale_verdicts_never_taint(age, stale):
    findings = verdict_findings(doc_with(v("node", "gpu-03")), "gpu-03", "leaf-a", NOW + age)
    if stale:
        assert [(f.severity, f.reason) for f in findings] == [(Severity.INFO, "PingmeshVerdictsStale")]
        assert kube_taints.desired_state(Report("gpu-03", verdict(findings), findings, []), KUBE_DEFAULTS)[
            "network"].effect is None
    else:
        assert [f.reason for f in findings] == ["PingmeshNodeFaulty"]


GOOD = {"schema_version": 1, "time": NOW, "window_seconds": W, "verdicts": [v("node", "gpu-03")]}


@pytest.mark.parametrize("doc, why", [
    (dict(GOOD, schema_version=2), "schema_version"),
    (dict(GOOD, time="now"), "time must be a finite number"),
    (dict(GOOD, window_seconds=0), "window_seconds must be positive"),
    (dict(GOOD, verdicts={}), "verdicts must be a list"),
    (dict(GOOD, verdicts=[v("node", "x")] * (verdicts.MAX_VERDICTS + 1)), "more than 1000"),
    (dict(GOOD, verdicts=[v("node", "")]), "element"),
    (dict(GOOD, verdicts=[v("node", "n" * 331)]), "element"),
    (dict(GOOD, verdicts=[v("node", "gpu-03", windows=-1)]), "windows"),
    (dict(GOOD, verdicts=[v("node", "gpu-03", since=None)]), "since"),
    (dict(GOOD, verdicts=["gpu-03"]), "not an object"),
    ([GOOD], "not a JSON object"),
])
def test_malformed_verdicts_are_refused_with_a_reason(doc, why):
    with pytest.raises(verdicts.VerdictError, match=why):
        verdicts.parse_verdicts(json.dumps(doc))


@pytest.mark.parametrize("text, why", [
    ("[" * 100_000 + "]" * 100_000, "not JSON"),  # deeper than the parser's stack: an error, not a crash
    (" " * (verdicts.MAX_DOC_BYTES + 1), "more than"),
    ("{", "not JSON"),
])
def test_unparseable_verdicts_are_refused(text, why):
    with pytest.raises(verdicts.VerdictError, match=why):
        verdicts.parse_verdicts(text)


def test_unknown_kinds_are_skipped_long_fields_bounded():
    doc = doc_with(v("switch-port", "leaf-a:7"), v("node", "gpu-03", message="m" * 5000,
                                                   evidence={"x": "y" * 5000}))
    assert len(doc["verdicts"]) == 1
    assert len(doc["verdicts"][0]["message"]) == verdicts.MAX_MESSAGE_CHARS and doc["verdicts"][0]["evidence"] == {}


def test_an_invalid_configmap_is_an_error_not_a_verdict(server, tmp_path):
    api = kube_api.ClientApi(server.kubeconfig(str(tmp_path / "kc")))
    pm = config.defaults()["pingmesh"]
    server.put_configmap("nodehealth", VERDICTS_CM, data={"verdicts.json": '{"schema_version": 9}'})
    server.put_configmap("nodehealth", INVENTORY_CM, binary_data={"inventory.json.gz": "not base64!"})
    with pytest.raises(kube_api.KubeError) as e:
        verdicts.read_verdicts(api, pm)
    assert e.value.kind == "invalid" and "schema_version" in str(e.value)
    with pytest.raises(kube_api.KubeError) as e:
        verdicts.read_inventory(api, pm)
    assert e.value.kind == "invalid" and f"ConfigMap nodehealth/{INVENTORY_CM}: " in str(e.value)


def test_read_inventory_reads_the_inventory_configmap_only(server, tmp_path):
    api = kube_api.ClientApi(server.kubeconfig(str(tmp_path / "kc")))
    pm = config.defaults()["pingmesh"]
    old = inventory.from_data({"nodes": [{"name": "gpu-01", "leaf": "leaf-a", "address": "10.0.0.1"}]})
    new = inventory.from_data({"nodes": [{"name": "gpu-02", "leaf": "leaf-b", "address": "10.0.0.2"}]})
    # Where an older controller kept it, beside the verdicts: not read.
    server.put_configmap("nodehealth", VERDICTS_CM, binary_data={"inventory.json.gz": verdicts.encode_inventory(old)})
    assert verdicts.read_inventory(api, pm) is None
    server.put_configmap("nodehealth", INVENTORY_CM, binary_data={"inventory.json.gz": verdicts.encode_inventory(new)})
    assert verdicts.read_inventory(api, pm) == new
    server.put_configmap("nodehealth", "elsewhere", binary_data={"inventory.json.gz": verdicts.encode_inventory(old)})
    assert verdicts.read_inventory(api, dict(pm, inventory_configmap="elsewhere")) == old
    gets = [path for method, path in server.requests if method == "GET"]
    assert gets == [f"{CONFIGMAPS}/{INVENTORY_CM}"] * 2 + [f"{CONFIGMAPS}/elsewhere"]


def test_an_inventory_that_inflates_past_the_bound_is_refused():
    import base64
    import gzip

    bomb = base64.b64encode(gzip.compress(b" " * (inventory.MAX_BYTES + 1))).decode()
    assert len(bomb) < 100_000
    with pytest.raises(verdicts.VerdictError, match="inflates"):
        verdicts.decode_inventory(bomb)
    inv = inventory.from_data({"nodes": [{"name": "gpu-01", "leaf": "leaf-a", "address": "10.0.0.1"}]})
    assert verdicts.decode_inventory(verdicts.encode_inventory(inv)) == inv
    assert verdicts.encode_inventory(inv) == verdicts.encode_inventory(inv)  # no timestamp in the gzip


# -- agents that misbehave --------------------------------------------------------------------------

def test_bad_agents_are_counted_and_never_stop_the_analysis(cluster, agents, make):
    agents.behaviour.update({"gpu-01": "slow", "gpu-02": "garbage", "gpu-04": "huge", "gpu-05": "huge-unannounced",
                             "gpu-06": "error", "gpu-07": ("impostor", "gpu-08")})
    cluster.edit_node("gpu-08", lambda n: n["status"].update(addresses=[]))
    c = make()
    assert c.elector.tick()
    started = time.monotonic()
    assert c.cycle(NOW)
    assert time.monotonic() - started < 5  # the slow agent costs its timeout (1 s), not more
    doc = stored_doc(cluster)
    assert doc["agents"] == {"reporting": 1, "failed": {"http_error": 1, "invalid": 1, "no_address": 1,
                                                        "timeout": 1, "too_large": 2, "wrong_node": 1}}
    assert samples(c, "nodehealth_pingmesh_agents_failed") == {
        ("http_error",): 1, ("invalid",): 1, ("no_address",): 1, ("timeout",): 1, ("too_large",): 2,
        ("wrong_node",): 1}
    assert samples(c, "nodehealth_pingmesh_agents_reporting") == {(): 1}


def test_a_summary_the_analysis_cannot_merge_is_counted_as_rejected(cluster, agents, make):
    agents.behaviour["gpu-05"] = dict(summary("gpu-05", NOW), buckets_seconds=[0.001, 0.01, 1.0])  # valid, alien
    c = make()
    assert c.elector.tick() and c.cycle(NOW)
    assert stored_doc(cluster)["agents"] == {"reporting": 7, "failed": {"rejected": 1}}
    assert samples(c, "nodehealth_pingmesh_agents_failed") == {("rejected",): 1}


def test_a_dripping_agent_is_cut_off_at_its_timeout(agents):
    agents.behaviour["gpu-01"] = "drip"
    started = time.monotonic()
    with pytest.raises(controller.FetchError) as e:
        fetch_summary(agents.addresses["gpu-01"], agents.port, 10, 0.5)
    assert e.value.reason == "timeout"
    assert time.monotonic() - started < 1.5


@pytest.mark.parametrize("how", ["drip-status", "drip-headers"])
def test_an_agent_dripping_its_status_line_or_headers_is_cut_off_at_its_timeout(agents, how):
    """The deadline covers the whole answer, its head included: each byte comes in time, the head never does."""
    agents.behaviour["gpu-01"] = how
    with pytest.raises(controller.FetchError) as e:
        fetch_summary(agents.addresses["gpu-01"], agents.port, 10, 0.5)
    assert e.value.reason == "timeout"
    wait_for(lambda: "gpu-01" in agents.hung_up)  # hung up while the agent was still dripping


def test_a_cycle_ends_at_its_budget_with_the_dripping_agents_counted(cluster, agents, make, monkeypatch):
    """Agents that drip their answer's head hold a fetch slot until the budget, never the cycle past it."""
    monkeypatch.setattr(controller, "FETCH_BUDGET_FRACTION", 1.0 / W)  # 1 s of fetching
    drippers = {"gpu-01": "drip-status", "gpu-02": "drip-headers", "gpu-05": "drip-headers"}
    agents.behaviour.update(drippers)
    c = make(fetch_timeout_seconds=30.0)  # the budget, not the timeout, is what ends them
    assert c.elector.tick() and c.cycle(NOW)
    assert stored_doc(cluster)["agents"] == {"reporting": 5, "failed": {"timeout": 3}}
    wait_for(lambda: agents.hung_up == set(drippers))  # each cut off while it still had most of its head to drip


def test_an_agent_that_is_not_there_is_unreachable(agents):
    with pytest.raises(controller.FetchError) as e:
        fetch_summary("127.0.0.1", agents.port, 10, 1.0)  # nothing listens on 127.0.0.1 there
    assert e.value.reason == "unreachable"


def test_fetching_stops_at_the_analysis_budget(cluster, agents, make, monkeypatch):
    """With a whole window's worth of slow agents, the analysis still ends in time; the rest is "deadline"."""
    monkeypatch.setattr(controller, "FETCH_BUDGET_FRACTION", 0.5 / W)  # 0.5 s of fetching
    agents.behaviour.update({n: "slow" for n in LEAF_OF})
    c = make(fetch_concurrency=2)
    assert c.elector.tick()
    started = time.monotonic()
    assert c.cycle(NOW)
    assert time.monotonic() - started < 3
    failed = stored_doc(cluster)["agents"]["failed"]
    assert failed["deadline"] >= 4 and failed["deadline"] + failed.get("timeout", 0) == 8
    # The next analysis starts with the agents this one had no time for: none is always left out.
    first = {name for name, _ in agents.requests}
    assert c.cycle(NOW + W)
    second = [name for name, _ in agents.requests[len(first):]]
    assert second[:2] and not set(second[:2]) & first


# -- an API server that refuses ---------------------------------------------------------------------

@pytest.mark.parametrize("code, kind, method, path_end", [
    (403, "forbidden", "GET", "/api/v1/nodes"),
    (500, "server_error", "GET", "/api/v1/nodes"),
    (403, "forbidden", "POST", "/configmaps"),
    (500, "server_error", "POST", "/configmaps"),
])
def test_a_refusing_api_server_is_counted_and_retried(cluster, make, code, kind, method, path_end, caplog):
    c = make()
    assert c.elector.tick()
    cluster.fail(code, method=method, path_end=path_end)
    assert not c.cycle(NOW)
    assert not c.cycle(NOW)
    assert samples(c, "nodehealth_controller_errors_total") == {(kind,): 2}
    assert f"({kind})" in caplog.text
    assert cluster.configmap("nodehealth", "nodehealth-pingmesh") is None
    cluster.heal()
    assert c.cycle(NOW)
    assert stored_doc(cluster)["time"] == NOW


def test_the_loops_ride_out_a_refused_lease_and_then_analyze(cluster, agents, make):
    cluster.fail(403, path_end="/leases/nodehealth-controller")
    cluster.fail(403, method="POST", path_end="/leases")
    agents.now = time.time()
    c = make(window_seconds=1.0, **SHORT)
    c.start()
    wait_for(lambda: samples(c, "nodehealth_controller_errors_total").get(("forbidden",), 0) >= 2)
    assert not c.elector.is_leader() and c.health()[0]
    cluster.heal()
    wait_for(lambda: c.elector.is_leader(), 3.0)
    wait_for(lambda: cluster.configmap("nodehealth", "nodehealth-pingmesh"), 5.0)
    assert stored_doc(cluster)["window_seconds"] == 1.0
    assert c.health() == (True, "ok: leading")


def test_what_survives_an_analysis_is_hidden_from_the_collector_until_the_loop_stops(cluster, agents, make):
    agents.now = time.time()
    c = make(window_seconds=1.0, **SHORT)
    gc.unfreeze()
    threads = c.start()
    wait_for(lambda: cluster.configmap("nodehealth", "nodehealth-pingmesh"), 5.0)
    wait_for(lambda: gc.get_freeze_count() > 0, 5.0)  # after the analysis that wrote it
    c.stop.set()
    for t in threads:
        t.join(5.0)
    assert gc.get_freeze_count() == 0  # a process that goes on (here, pytest) gets its collector back


def test_a_reference_cycle_that_became_garbage_while_hidden_lives_until_the_next_thaw():
    class Cyclic:
        pass

    gc.unfreeze()
    try:
        garbage = Cyclic()
        garbage.me = garbage
        gone = weakref.ref(garbage)
        controller.freeze_survivors(1)
        assert gc.get_freeze_count() > 0
        del garbage
        for cycles in range(2, controller.THAW_EVERY_CYCLES):
            controller.freeze_survivors(cycles)
            assert gone() is not None, cycles  # hidden: the collector does not see it
        controller.freeze_survivors(controller.THAW_EVERY_CYCLES)
        assert gone() is None  # walked once again and freed
    finally:
        gc.unfreeze()


def test_an_oversized_configmap_is_refused_not_written(cluster, make, monkeypatch, caplog):
    monkeypatch.setattr(verdicts, "MAX_CONFIGMAP_BYTES", 200)
    c = make()
    assert c.elector.tick()
    assert not c.cycle(NOW)
    assert cluster.configmap("nodehealth", VERDICTS_CM) is None
    assert cluster.configmap("nodehealth", INVENTORY_CM) is None  # nor the inventory: the analysis is retried
    assert samples(c, "nodehealth_controller_configmap_refused_total") == {(VERDICTS_CM,): 1, (INVENTORY_CM,): 0}
    assert "more than the 200 a ConfigMap may" in caplog.text


def test_the_size_cap_applies_to_each_configmap_on_its_own(cluster, agents, make, monkeypatch, caplog):
    """Many nodes with many rails make the inventory larger than the verdicts; a cap between the two
    refuses the inventory alone, and the verdicts are still written: each ConfigMap has its own 1 MiB."""
    for i in range(60):  # no InternalIP: nothing to fetch (no_address), but 8 rails in the inventory
        rails = ",".join(f"10.{rail}.{i * 37 % 256}.{i * 91 % 256}" for rail in range(8))
        cluster.add_node(f"gpu-x{i:02d}", labels=dict(GPU, **{"nodehealth.io/leaf": f"leaf-x{i % 7}"}),
                         annotations={"nodehealth.io/probe-addresses": rails})
    c = make()
    assert c.elector.tick() and c.cycle(NOW)
    sizes = samples(c, "nodehealth_controller_configmap_bytes")
    assert sizes[(VERDICTS_CM,)] < sizes[(INVENTORY_CM,)] - 1
    monkeypatch.setattr(verdicts, "MAX_CONFIGMAP_BYTES", sizes[(INVENTORY_CM,)] - 1)
    cluster.add_node("gpu-09", labels=dict(GPU, **{"nodehealth.io/leaf": "leaf-b"}), internal_ip="127.0.0.98")
    assert c.cycle(NOW + W)
    assert stored_doc(cluster)["time"] == NOW + W
    assert stored_inventory(cluster).get("gpu-09") is None  # the agents keep the inventory they have
    assert samples(c, "nodehealth_controller_configmap_refused_total") == {(VERDICTS_CM,): 0, (INVENTORY_CM,): 1}
    assert f"ConfigMap nodehealth/{INVENTORY_CM} would hold" in caplog.text


def test_a_flood_of_verdicts_is_cut_to_what_the_agents_accept_node_verdicts_first(cluster, make, monkeypatch):
    many = [{"kind": kind, "element": f"{kind}-{i:04d}", "since": NOW - 60, "windows": 2, "message": "x" * 400,
             "evidence": {"loss": 0.5, "examples": ["y" * 60] * 5}} for i in range(800) for kind in ("path", "node")]

    class Flood:
        rejected, notes, windows_seen = [], [], 0

        def to_dict(self):
            return {"schema_version": 1, "time": NOW, "window_seconds": W, "verdicts": many, "nodes": 8, "leaves": 2}

    c = make()
    monkeypatch.setattr(c.analyzer, "run", lambda summaries, now, inv=None: (list(summaries), Flood())[1])
    assert c.elector.tick() and c.cycle(NOW)
    text = cluster.configmap("nodehealth", "nodehealth-pingmesh")["data"]["verdicts.json"]
    doc = verdicts.parse_verdicts(text)  # what every agent accepts
    assert len(text) <= verdicts.MAX_DOC_BYTES and len(doc["verdicts"]) <= verdicts.MAX_VERDICTS
    kinds = [v["kind"] for v in doc["verdicts"]]
    assert len(kinds) > 500 and set(kinds) == {"node"}  # the verdicts that taint come first
    assert json.loads(text)["truncated"] == 1600 - len(doc["verdicts"])


def test_the_fake_server_refuses_a_configmap_over_one_mib_as_the_real_one_does(server, tmp_path):
    api = kube_api.ClientApi(server.kubeconfig(str(tmp_path / "kc")))
    body = {"metadata": {"name": "big"}, "data": {"a": "x" * (1 << 20)}, "binaryData": {"b": "eHh4"}}
    with pytest.raises(kube_api.KubeError) as e:
        api.create_configmap("nodehealth", body)
    assert e.value.kind == "client_error" and "Too long" in str(e.value)


# -- the process's faces ------------------------------------------------------------------------------

def test_metrics_and_healthz_over_http(cluster, make):
    c = make(controller_listen="127.0.0.1:0")
    assert c.elector.tick() and c.cycle(NOW)
    srv = controller.make_server(c, c.pm["controller_listen"])
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        code, body = http_get(base + "/metrics")
        text = body.decode()
        assert code == 200 and "nodehealth_controller_leader 1\n" in text
        assert f'nodehealth_pingmesh_verdict{{kind="node",element="{FAULTY}"}} 1' in text
        assert http_get(base + "/healthz") == (200, b"ok: leading\n")
        assert http_get(base + "/nope")[0] == 404
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_client_that_hangs_up_early_leaves_no_traceback(cluster, make, capfd, caplog):
    c = make(controller_listen="127.0.0.1:0")
    assert c.elector.tick() and c.cycle(NOW)
    srv = controller.make_server(c, c.pm["controller_listen"])
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        for _ in range(20):  # asks, and is gone before the answer: the answer's writes meet a closed socket
            with socket.create_connection(srv.server_address[:2]) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_for(lambda: srv.slots._value == controller.server.MAX_CONCURRENT_REQUESTS and not srv._active)
        code, _ = http_get(f"http://127.0.0.1:{srv.server_address[1]}/healthz")
        assert code == 200  # and it goes on answering
    finally:
        srv.shutdown()
        srv.server_close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert "Traceback" not in caplog.text, caplog.text


def test_the_process_leads_writes_and_hands_the_lease_over_on_sigterm(cluster, agents, tmp_path):
    """`nodehealth controller` as a process: it leads, writes the ConfigMap, serves /healthz, and on
    SIGTERM gives its Lease up and exits 0."""
    port = free_port()
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "kube": {"kubeconfig": cluster.kubeconfig(str(tmp_path / "kubeconfig"))},
        "daemon": {"listen": f"0.0.0.0:{agents.port}"},
        "pingmesh": {"enabled": True, "window_seconds": 1.0, "fetch_timeout_seconds": 0.5,
                     "controller_listen": f"127.0.0.1:{port}"}}))
    code = ("import argparse, sys; from nodehealth.pingmesh import controller; "
            "sys.exit(controller.cmd_controller(argparse.Namespace(config=sys.argv[1], listen=None, identity=None, "
            "log_format='text', log_level='info')))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(cfg)], env=dict(os.environ, POD_NAME="controller-7f9c"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: cluster.configmap("nodehealth", "nodehealth-pingmesh"), 15.0)
        assert holder(cluster) == "controller-7f9c"
        assert http_get(f"http://127.0.0.1:{port}/healthz") == (200, b"ok: leading\n")
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(10)
    finally:
        proc.kill()
        output = proc.communicate()[0].decode()
    assert rc == 0, output
    assert holder(cluster) is None, output  # handed over: a standby needs no expiry to take over
    assert "controller-7f9c leads the pingmesh controller now" in output


def test_a_stop_that_cannot_finish_exits_anyway_with_every_stack(tmp_path):
    """A thread nobody ends would hold the controller past its grace period: it exits 1 and says
    where it was stuck."""
    port = free_port()
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"pingmesh": {"enabled": False, "controller_listen": f"127.0.0.1:{port}"}}))
    code = ("import argparse, sys, threading, time\n"
            "def stray_thread_that_never_ends():\n    time.sleep(3600)\n"
            "threading.Thread(target=stray_thread_that_never_ends).start()\n"
            "from nodehealth.pingmesh import controller\n"
            "sys.exit(controller.cmd_controller(argparse.Namespace(config=sys.argv[1], listen=None, identity=None, "
            "log_format='text', log_level='info')))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: _answers(f"http://127.0.0.1:{port}/healthz") or proc.poll() is not None, 15.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(STUCK_EXIT_SECONDS + 5) == 1
    finally:
        proc.kill()
        output = proc.communicate()[0].decode()
    assert "most recent call first" in output and "stray_thread_that_never_ends" in output, output


def _answers(url: str) -> bool:
    try:
        return http_get(url)[0] == 200
    except OSError:
        return False


def test_a_disabled_pingmesh_leaves_the_controller_idle(make):
    c = make(enabled=False)
    assert c.health() == (True, "idle: pingmesh.enabled is false")


def test_the_command_line():
    from nodehealth import cli
    from nodehealth.pingmesh import cli as pingmesh_cli

    args = cli.parser().parse_args(["controller", "--config", "c.yaml", "--listen", "127.0.0.1:9999",
                                    "--identity", "me"])
    assert (args.func, args.config, args.listen, args.identity) == (pingmesh_cli.cmd_controller, "c.yaml",
                                                                    "127.0.0.1:9999", "me")


def test_next_cycle_is_a_little_into_the_next_window(make):
    c = make()
    assert c.next_cycle(300.0) == 303.0
    assert c.next_cycle(303.0) == 333.0
    assert c.next_cycle(310.0) == 333.0
