"""The controller's analysis, incremental: each cycle fetches, parses and judges only what is new.

Agents here are real Pingmesh objects (the daemon's windows and its `/v1/pingmesh` document, with the
daemon's own query parsing) behind real HTTP servers, on one clock that the test moves a window at a
time; the controller runs against the fake API server. After every cycle its verdicts are compared
with a from-scratch analyze() over what every answering agent serves in full at that moment.
"""
from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import test_pingmesh_analysis as synthetic
from conftest import free_port, http_get, machine
from fake_kube_apiserver import FakeApiServer
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth import config, daemon, inventory, registry
from nodehealth.engine import Engine
from nodehealth.host import HostPaths
from nodehealth.pingmesh import analysis as pingmesh
from nodehealth.pingmesh import controller, fetch, folded, packed, stats
from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH_DEFAULTS
from nodehealth.pingmesh.mesh import Pingmesh

W = 30.0
T0 = 1_800_000_000.0  # a window boundary
LEAVES = {f"leaf-{x}": [f"gpu-{x}{i}" for i in range(4)] for x in "abc"}
LEAF_OF = {n: leaf for leaf, nodes in LEAVES.items() for n in nodes}
NAMES = sorted(LEAF_OF)
GPU = {"nvidia.com/gpu.present": "true"}
FAST_KUBE = {"retry_initial_seconds": 0.01, "retry_max_seconds": 0.05, "request_timeout_seconds": 2.0}
FETCH = PINGMESH_DEFAULTS["fetch_windows"]


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


class Mesh:
    """Twelve agents on 127.0.0.2-13, one port, one clock; `faulty` nodes lose half of the probes they
    send or answer. `how[node]`: "ok", "error" (HTTP 500), "garbage", or a function of the query that
    returns the body. Every request is recorded with the windows its answer carried in full."""

    def __init__(self):
        self.clock = Clock(T0 + 3)
        self.inv = inventory.from_data({"nodes": [{"name": n, "leaf": LEAF_OF[n], "address": self.address(n)}
                                                  for n in NAMES]})
        self.agents = {n: self.agent(n) for n in NAMES}
        self.faulty: set[str] = set()
        self.how: dict[str, object] = {}
        self.requests: list[tuple[str, str, int]] = []  # node, path, windows sent with their peers
        self.lock = threading.Lock()
        for _ in range(20):
            self.port = free_port()
            try:
                self.servers = [self._server(n) for n in NAMES]
                break
            except OSError:
                for srv in getattr(self, "servers", []):
                    srv.server_close()
        for srv in self.servers:
            threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @staticmethod
    def address(name: str) -> str:
        return f"127.0.0.{NAMES.index(name) + 2}"

    def agent(self, name: str, **over) -> Pingmesh:
        m = Pingmesh(name, dict(PINGMESH_DEFAULTS, **over), lambda: self.inv, clock=self.clock)
        m.refresh(self.clock.now)
        return m

    def restart(self, name: str, **over) -> None:
        self.agents[name] = self.agent(name, **over)

    def probe(self, start: float, until: float) -> None:
        """Every agent probes each of its targets every 3 s in [start, until)."""
        for name, m in self.agents.items():
            for target in m.targets:
                bad = name in self.faulty or target.node in self.faulty
                t = start
                k = 0
                while t < until:
                    m.record(target, "tcp", t, None if bad and k % 2 else 0.0002, False)
                    t += 3.0
                    k += 1

    def next_window(self) -> float:
        """Close the current window (probes in it, and a few in the next one) and return the time
        at which the controller runs: 3 s into the next window."""
        start = (self.clock.now // W) * W
        self.probe(start, start + W)
        self.clock.now = start + W + 3
        self.probe(start + W, start + W + 2)
        return self.clock.now

    def full(self, name: str) -> stats.Summary:
        """What the agent serves without `since`, as the controller parses it."""
        return stats.loads_summary(json.dumps(self.agents[name].summary(FETCH)).encode())

    def _server(self, name: str) -> ThreadingHTTPServer:
        mesh = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                query = self.path.partition("?")[2]
                how = mesh.how.get(name, "ok")
                if how == "error":
                    return self._send(500, b"boom", 0)
                if how == "garbage":
                    return self._send(200, b'{"schema_version": 1, "windows": [[[', 0)
                if callable(how):
                    doc = how(query)
                else:
                    doc = mesh.agents[name].summary(daemon._windows_param(query), daemon._since_param(query))
                if isinstance(doc, bytes):  # the packed form
                    head = json.loads(doc[8:8 + int.from_bytes(doc[4:8], "little")])
                    return self._send(200, doc, sum("edges" in w for w in head["windows"]), packed.CONTENT_TYPE)
                return self._send(200, json.dumps(doc).encode(), sum("peers" in w for w in doc["windows"]))

            def _send(self, code: int, body: bytes, full: int, media: str = "application/json") -> None:
                with mesh.lock:
                    mesh.requests.append((name, self.path, full))
                self.send_response(code)
                self.send_header("Content-Type", media)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        srv = ThreadingHTTPServer((self.address(name), self.port), Handler)
        srv.daemon_threads = True
        return srv

    def close(self) -> None:
        for srv in self.servers:
            srv.shutdown()
            srv.server_close()


@pytest.fixture
def mesh():
    m = Mesh()
    yield m
    m.close()


@pytest.fixture
def server(mesh):
    s = FakeApiServer().start()
    for name in NAMES:
        s.add_node(name, labels=dict(GPU, **{"nodehealth.io/leaf": LEAF_OF[name]}), internal_ip=mesh.address(name))
    yield s
    s.close()


@pytest.fixture
def ctl(server, mesh, tmp_path):
    """A leading controller whose analyses are kept in `ctl.runs` (the Analysis of each cycle)."""
    cfg = config.defaults()
    cfg["kube"].update(FAST_KUBE, kubeconfig=server.kubeconfig(str(tmp_path / "kubeconfig")))
    cfg["daemon"]["listen"] = f"0.0.0.0:{mesh.port}"
    cfg["pingmesh"].update({"enabled": True, "fetch_timeout_seconds": 2.0})
    c = controller.Controller(cfg, "controller-a")
    assert c.elector.tick()
    c.runs = []
    spy(c)
    yield c
    c.stop.set()


def spy(c: controller.Controller) -> None:
    """Keep each analysis of the controller's Analyzer in c.runs, and the inventory it was given in c.inv."""
    run = c.analyzer.run

    def spied(summaries, now, inv=None):
        c.inv = inv
        c.runs.append(run(summaries, now, inv))
        return c.runs[-1]
    c.analyzer.run = spied


def scratch(mesh: Mesh, now: float, answering, inv: inventory.Inventory | None = None) -> pingmesh.Analysis:
    """analyze() from scratch over what the answering agents serve in full now, in name order."""
    return pingmesh.analyze([mesh.full(n) for n in sorted(answering)], PINGMESH_DEFAULTS["analysis"], now, inv)


def same(a: pingmesh.Analysis, b: pingmesh.Analysis) -> None:
    assert a.to_dict() == b.to_dict()
    assert (a.windows_seen, a.window_starts, a.notes) == (b.windows_seen, b.window_starts, b.notes)
    assert sorted(name for name, _ in a.rejected) == sorted(name for name, _ in b.rejected)


def cycle(ctl, mesh: Mesh, answering=NAMES) -> pingmesh.Analysis:
    """One controller cycle at the next window; its analysis, checked against a from-scratch one."""
    now = mesh.next_window()
    del mesh.requests[:]
    assert ctl.cycle(now)
    same(ctl.runs[-1], scratch(mesh, now, answering, ctl.inv))
    return ctl.runs[-1]


def asked(mesh: Mesh, name: str) -> list[tuple[str, int]]:
    return [(path, full) for n, path, full in mesh.requests if n == name]


def edges_of(f: folded.Folded) -> tuple:
    return f.names, f.leaves, list(f.sent), list(f.lost), list(f.flat)


def kept_is_served(ctl, mesh: Mesh, name: str) -> None:
    """What the controller keeps of an agent is what the agent serves now, window for window."""
    served = mesh.full(name)
    by_start = {w.start: w for w in served.windows}
    for start, ready in ctl.kept[name].windows.items():
        assert edges_of(ready.folded) == edges_of(folded.Folded(by_start[start].peers)), (name, start)


# -- steady state ----------------------------------------------------------------------------------

def test_after_the_first_cycle_each_agent_sends_only_the_new_window_and_the_verdicts_stay_the_same(ctl, mesh):
    cycle(ctl, mesh)
    assert len(mesh.requests) == len(NAMES) and not any("since" in path for _, path, _ in mesh.requests)
    for _ in range(FETCH):  # the agents fill their windows
        cycle(ctl, mesh)
    mesh.faulty.add("gpu-b1")
    rebuilt, parsed = [], []
    for _ in range(4):
        cycle(ctl, mesh)
        rebuilt.append(ctl.analyzer.rebuilt)
        parsed.append(ctl.parsed)
        for name in NAMES:  # one request each, answered with the window that closed alone in full
            ((path, full),) = asked(mesh, name)
            assert "&since=" in path and full == 1
    assert parsed == [len(NAMES)] * 4
    assert rebuilt == [1, 1, 1, 1]  # only the new window is added up and judged
    verdicts = ctl.runs[-1].verdicts
    assert [(v.kind, v.element, v.windows) for v in verdicts] == [("node", "gpu-b1", 4)]
    assert all(len(kept.windows) <= FETCH for kept in ctl.kept.values())


def test_a_cycle_without_new_data_judges_nothing_again(ctl, mesh):
    for _ in range(3):
        cycle(ctl, mesh)
    del mesh.requests[:]
    now = mesh.clock.now
    assert ctl.cycle(now)  # the same window again (a retried cycle)
    same(ctl.runs[-1], scratch(mesh, now, NAMES, ctl.inv))
    assert ctl.analyzer.rebuilt == 0 and ctl.parsed == 0


# -- agents that change under the controller ---------------------------------------------------------

def test_an_agent_restarted_mid_way_is_read_whole_and_not_mixed_with_its_old_windows(ctl, mesh):
    mesh.faulty.add("gpu-a2")
    for _ in range(FETCH):
        cycle(ctl, mesh)
    mesh.restart("gpu-c0")  # a new process: its old windows are gone
    cycle(ctl, mesh)
    ((path, full),) = asked(mesh, "gpu-c0")
    assert "&since=" in path and full == 1  # it did not have the window it was asked after: all it has
    assert sorted(ctl.kept["gpu-c0"].windows) == [mesh.clock.now // W * W - W]
    for _ in range(3):
        cycle(ctl, mesh)
    assert ("node", "gpu-a2") in {(v.kind, v.element) for v in ctl.runs[-1].verdicts}


def test_an_agent_with_another_window_length_is_never_mixed_with_its_windows_of_the_old_length(ctl, mesh):
    for _ in range(FETCH + 1):
        cycle(ctl, mesh)
    since = max(ctl.kept["gpu-a1"].windows)
    assert since % 60 == 0  # a start of the new length too: the new process holds a 60 s window there
    mesh.restart("gpu-a1", window_seconds=60.0)
    analysis = cycle(ctl, mesh)
    assert [("since" in path, full) for path, full in asked(mesh, "gpu-a1")] == [(True, 0), (False, 2)]
    for _ in range(3):
        analysis = cycle(ctl, mesh)
        kept_is_served(ctl, mesh, "gpu-a1")
    assert "gpu-a1" in {name for name, _ in analysis.rejected}  # the size most agents use is analysed
    assert ctl.kept["gpu-a1"].window_seconds == 60.0


def test_a_window_that_arrives_late_is_added_and_judged_then(ctl, mesh):
    for _ in range(FETCH):
        cycle(ctl, mesh)
    behind = mesh.agents["gpu-b3"]
    behind.clock = Clock(0)  # its clock lags: the window that just ended is not closed yet for it

    def lagging(query):
        behind.clock.now = mesh.clock.now - 2.5
        return behind.summary(daemon._windows_param(query), daemon._since_param(query))
    mesh.how["gpu-b3"] = lagging
    first = cycle(ctl, mesh)
    newest = first.window_starts[-1]
    assert not ctl.kept["gpu-b3"].windows.get(newest)  # not closed: not kept, asked for again
    behind.clock = mesh.clock
    mesh.how.pop("gpu-b3")
    cycle(ctl, mesh)
    assert newest in ctl.kept["gpu-b3"].windows
    assert ctl.analyzer.rebuilt == 2  # the window it arrived late in, and the new one


def test_an_agent_that_stops_answering_keeps_nothing_and_comes_back_whole(ctl, mesh):
    mesh.faulty.add("gpu-c3")
    for _ in range(FETCH):
        cycle(ctl, mesh)
    mesh.how["gpu-a0"] = "error"
    answering = [n for n in NAMES if n != "gpu-a0"]
    analysis = cycle(ctl, mesh, answering)
    assert "gpu-a0" not in ctl.kept
    assert ctl.analyzer.rebuilt == len(analysis.window_starts)  # every window it was part of, again
    assert ctl.last["failed"] == {"http_error": 1}
    cycle(ctl, mesh, answering)
    mesh.how.pop("gpu-a0")
    cycle(ctl, mesh)
    ((path, full),) = asked(mesh, "gpu-a0")
    assert "since" not in path and full == FETCH  # nothing kept: asked for everything
    assert ("node", "gpu-c3") in {(v.kind, v.element) for v in ctl.runs[-1].verdicts}


def test_garbage_answers_fail_that_agent_alone(ctl, mesh):
    for _ in range(FETCH):
        cycle(ctl, mesh)
    mesh.how["gpu-b0"] = "garbage"
    cycle(ctl, mesh, [n for n in NAMES if n != "gpu-b0"])
    assert ctl.last["failed"] == {"invalid": 1} and "gpu-b0" not in ctl.kept
    mesh.how.pop("gpu-b0")
    cycle(ctl, mesh)
    assert ctl.last["failed"] == {}


def test_a_packed_answer_whose_numbers_do_not_add_up_fails_that_agent_alone(ctl, mesh):
    """The packed answers that arrive together have their arrays checked together (packed.check_each):
    one agent's lie fails that agent alone, nothing of it is kept, and every other agent's windows are
    kept and judged; its next honest answer is asked for whole."""
    def packed_answer(name: str, lie: bool = False):
        def answer(query: str) -> bytes:
            data = bytearray(mesh.agents[name].packed_summary(daemon._windows_param(query), daemon._since_param(query)))
            if lie:
                data[-1] = 100  # its last window's last edge: a p99 bucket past the histogram's
            return bytes(data)
        return answer
    for name in NAMES:
        mesh.how[name] = packed_answer(name)
    for _ in range(FETCH):
        cycle(ctl, mesh)
    assert ctl.last["failed"] == {} and len(ctl.kept) == len(NAMES)
    mesh.how["gpu-b1"] = packed_answer("gpu-b1", lie=True)
    cycle(ctl, mesh, [n for n in NAMES if n != "gpu-b1"])
    assert ctl.last["failed"] == {"invalid": 1}
    assert "gpu-b1" not in ctl.kept and len(ctl.kept) == len(NAMES) - 1
    mesh.how["gpu-b1"] = packed_answer("gpu-b1")
    cycle(ctl, mesh)
    ((path, full),) = asked(mesh, "gpu-b1")
    assert "since" not in path and full == FETCH and ctl.last["failed"] == {}


def test_a_failure_while_checking_answers_fails_those_agents_not_the_analysis(ctl, mesh, monkeypatch):
    cycle(ctl, mesh)

    def broken(answers):
        raise RuntimeError("a bug in the checks")
    monkeypatch.setattr(controller.packed, "check_each", broken)
    assert ctl.cycle(mesh.next_window())
    assert ctl.last["failed"] == {"internal": len(NAMES)} and not ctl.kept


def test_a_window_sent_by_its_start_alone_that_the_controller_lacks_is_asked_for_in_full(ctl, mesh):
    for _ in range(FETCH):
        cycle(ctl, mesh)
    agent = mesh.agents["gpu-c2"]

    def forgetful(query):  # leaves out every closed window, whatever it was asked
        doc = agent.summary(daemon._windows_param(query), None)
        if "since" in query:
            doc["windows"] = [{"start": w["start"], "closed": True} if w["closed"] else w for w in doc["windows"]]
        return doc
    mesh.how["gpu-c2"] = forgetful
    cycle(ctl, mesh)
    assert [("since" in path, full) for path, full in asked(mesh, "gpu-c2")] == [(True, 1), (False, FETCH)]
    assert ctl.last["failed"] == {}


def test_stubs_without_since_are_invalid(ctl, mesh):
    cycle(ctl, mesh)
    mesh.how["gpu-a3"] = lambda query: dict(mesh.agents["gpu-a3"].summary(1),
                                           windows=[{"start": T0, "closed": True}])
    ctl.kept.pop("gpu-a3")
    cycle(ctl, mesh, [n for n in NAMES if n != "gpu-a3"])
    assert ctl.last["failed"] == {"invalid": 1}


# -- memory ---------------------------------------------------------------------------------------

def test_what_is_kept_is_bounded_and_forgotten(ctl, mesh, server):
    for _ in range(FETCH + 6):
        cycle(ctl, mesh)
    newest = mesh.clock.now // W * W - W
    for name, kept in ctl.kept.items():  # the closed windows of the agent's last answer, no more
        assert sorted(kept.windows) == [newest - k * W for k in range(FETCH - 2, -1, -1)], name
        kept_is_served(ctl, mesh, name)
    assert len(ctl.analyzer._mesh.judged) == len(ctl.runs[-1].window_starts)
    server.edit_node("gpu-c1", lambda n: n["metadata"]["labels"].pop("nvidia.com/gpu.present"))
    cycle(ctl, mesh, [n for n in NAMES if n != "gpu-c1"])
    assert "gpu-c1" not in ctl.kept  # a Node no longer managed is forgotten


def test_a_standby_keeps_nothing_and_asks_for_everything_once_it_leads(ctl, mesh):
    for _ in range(3):
        cycle(ctl, mesh)
    ctl.elector._valid_until = -math.inf  # it could not renew the Lease
    assert not ctl.cycle(mesh.next_window())
    assert ctl.kept == {} and ctl.analyzer._mesh.judged == {}
    assert ctl.elector.tick()
    spy(ctl)  # a new Analyzer
    cycle(ctl, mesh)
    assert not any("since" in path for _, path, _ in mesh.requests)


# -- the agent's side -------------------------------------------------------------------------------

def test_since_leaves_out_only_closed_windows_the_agent_holds(mesh):
    for _ in range(4):
        mesh.next_window()
    m = mesh.agents["gpu-a0"]
    starts = [w["start"] for w in m.summary()["windows"]]
    assert len(starts) == 5
    doc = m.summary(since=starts[2])
    assert [("peers" in w, w["closed"]) for w in doc["windows"]] == [(False, True)] * 3 + [(True, True), (False, False)]
    for unknown in (starts[0] - W, starts[2] + 1, starts[-1]):  # not held, not a start, open: closed ones in full
        assert [("peers" in w) for w in m.summary(since=unknown)["windows"]] == [True] * 4 + [False]
    assert all("peers" in w for w in m.summary()["windows"])  # without `since`, as before
    parsed = stats.parse_summary(doc, stubs=True)
    assert [w.peers is None for w in parsed.windows] == [True, True, True, False, True]
    with pytest.raises(stats.SummaryError):
        stats.parse_summary(doc)  # only an answer to `since` may leave peers out


@pytest.fixture
def served(mesh, tmp_path):
    """The port of a daemon's HTTP server whose `/v1/pingmesh` is agent gpu-a0's, with four windows."""
    cfg = config.defaults()
    cfg["daemon"]["state_dir"] = str(tmp_path / "state")
    d = daemon.Daemon(Engine(registry.COLLECTORS, registry.CHECKS, HostPaths(machine("h100-8x-cx7")), cfg), cfg,
                      "gpu-a0")
    for _ in range(3):
        mesh.next_window()
    d.pingmesh = mesh.agents["gpu-a0"]
    srv = daemon.make_server(d, "127.0.0.1:0")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_daemons_endpoint_passes_since_on(served):
    url = f"http://127.0.0.1:{served}/v1/pingmesh?windows=6"
    starts = [w["start"] for w in json.loads(http_get(url)[1])["windows"]]
    doc = json.loads(http_get(f"{url}&since={starts[1]!r}")[1])
    assert [("peers" in w) for w in doc["windows"]] == [False, False, True, False]
    doc = json.loads(http_get(f"{url}&since=bogus")[1])
    assert [("peers" in w) for w in doc["windows"]] == [True] * 4


def test_the_daemon_answers_the_packed_form_to_who_asks_for_it_and_json_to_the_others(served, mesh):
    url = f"http://127.0.0.1:{served}/v1/pingmesh?windows=6"
    body, media = fetch.fetch_typed(url, 5.0)
    assert media == "application/json"  # an older controller's question: JSON, as ever
    from_json = stats.loads_summary(body)
    got = fetch.fetch_summary("127.0.0.1", served, 6, 5.0, packed=True)
    assert [(w.start, w.closed, w.peers) for w in got.windows] == [(w.start, w.closed, None) for w in from_json.windows]
    for w, p in zip(from_json.windows, got.windows):
        want = folded.prepare_window(w, from_json.window_seconds, from_json.buckets, mesh.clock.now)
        ready = folded.prepare_window(p, got.window_seconds, got.buckets, mesh.clock.now)
        assert (ready.entries, ready.max_sent) == (want.entries, want.max_sent)
        assert (ready.folded is None) == (want.folded is None)
        if want.folded is not None:
            assert want.folded.names and all(getattr(ready.folded, attr) == getattr(want.folded, attr)
                                             for attr in folded.Folded.__slots__[1:])
    since = fetch.fetch_summary("127.0.0.1", served, 6, 5.0, since=got.windows[1].start, packed=True)
    assert [w.ready is not None for w in since.windows] == [False, False, True, False]


@pytest.mark.parametrize("query, want", [
    ("since=1800000000.0", 1800000000.0), ("windows=6&since=12", 12.0), ("since=nan", None), ("since=inf", None),
    ("since=", None), ("since=abc", None), ("since=" + "1" * 40, None), ("windows=6", None)])
def test_the_since_parameter_is_validated(query, want):
    assert daemon._since_param(query) == want


# -- the analysis itself ----------------------------------------------------------------------------

def test_the_analyzer_gives_what_analyze_gives_judging_only_what_changed():
    now = synthetic.NOW
    topo = synthetic.topology(leaves=3, per_leaf=6)
    docs = synthetic.mesh(topo, windows=8, loss=synthetic.touching("gpu-b02", 0.3, windows={4, 5, 6, 7}))
    full = [stats.parse_summary(d) for d in docs]

    def upto(k, who=None):  # each agent's first k windows, the same prepared objects every time
        return [folded.Prepared(p.node, p.leaf, p.window_seconds, p.buckets, p.windows[:k])
                for p in prepared if who is None or p.node in who]
    prepared = [pingmesh.prepare(s, now) for s in full]
    analyzer = pingmesh.Analyzer({})
    for k, who, rebuilt in [(5, None, 5), (6, None, 1), (6, None, 0), (7, None, 1),
                            (7, {s.node for s in full} - {"gpu-a01"}, 7), (8, None, 8)]:
        got = analyzer.run(upto(k, who), now)
        want = pingmesh.analyze(upto(k, who), {}, now)
        assert got.to_dict() == want.to_dict() and got.window_starts == want.window_starts
        assert analyzer.rebuilt == rebuilt, k
    assert ("node", "gpu-b02") in {(v.kind, v.element) for v in got.verdicts}
    moved = [folded.Prepared(p.node, "leaf-c" if p.node == "gpu-a03" else p.leaf, p.window_seconds, p.buckets,
                               p.windows) for p in prepared]
    got = analyzer.run(moved, now)  # a node relabelled: every window was judged with its old leaf
    assert analyzer.rebuilt == 8 and got.to_dict() == pingmesh.analyze(moved, {}, now).to_dict()


def test_the_analyzer_forgets_names_no_longer_in_use():
    now = synthetic.NOW
    docs = synthetic.mesh(synthetic.topology(leaves=2, per_leaf=4), windows=3)
    noisy = json.loads(json.dumps(docs[0]))
    noisy["windows"][0]["peers"] += [dict(noisy["windows"][0]["peers"][0], node=f"ghost-{i}") for i in range(3000)]
    analyzer = pingmesh.Analyzer({})
    analyzer.run([noisy] + docs[1:], now)
    assert len(analyzer._mesh.names) > 3000
    analyzer.run(docs, now)  # the ghosts were in use in the last run: kept once more
    got = analyzer.run(docs, now)
    assert len(analyzer._mesh.names) == 8 and got.to_dict() == pingmesh.analyze(docs, {}, now).to_dict()


_TOPO = synthetic.topology(leaves=3, per_leaf=6)
_PREPARED = [pingmesh.prepare(stats.parse_summary(d), synthetic.NOW) for d in synthetic.mesh(
    _TOPO, windows=8, loss=lambda s, d, w: (0.3 if "gpu-b02" in (s, d) and w >= 3 else 0.0)
    + (0.2 if (s[4], d[4]) in {("a", "c"), ("c", "a")} and w >= 4 else 0.0))]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.sets(st.integers(0, len(_PREPARED) - 1), max_size=5),
                          st.booleans()), min_size=2, max_size=5))
def test_any_sequence_of_runs_gives_what_analyze_gives(steps):
    """Windows that come and go, agents that leave and come back, a node relabelled back and forth."""
    analyzer = pingmesh.Analyzer({})
    for k, absent, moved in steps:
        prepared = [folded.Prepared(p.node, "leaf-c" if moved and p.node == "gpu-a01" else p.leaf,
                                      p.window_seconds, p.buckets, p.windows[:k])
                    for i, p in enumerate(_PREPARED) if i not in absent]
        got, want = analyzer.run(prepared, synthetic.NOW), pingmesh.analyze(prepared, {}, synthetic.NOW)
        assert got.to_dict() == want.to_dict() and got.window_starts == want.window_starts
