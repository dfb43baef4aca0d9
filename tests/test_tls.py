"""The mesh's identity (issue 21) and the guard on :9456 (issue 22), on real sockets: certificates
made by the shipped script (deploy/tls/make-certs.sh, openssl), the Ping service over real gRPC,
the bounded HTTP server, the controller's fetch, all on loopback."""
from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading

import pytest
from conftest import HERE, free_port, wait_for

from nodehealth import server as httpbound
from nodehealth.pingmesh.fetch import FetchError, fetch
from nodehealth.tls.access import http_options
from nodehealth.tls.defaults import DEFAULTS as TLS_DEFAULTS
from nodehealth.tls.identity import Identity

SCRIPT = os.path.join(HERE, "..", "deploy", "tls", "make-certs.sh")
CONTROLLER = "nodehealth-controller"
TOKEN = "s3cret-token-for-prometheus"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """The cluster's CA with nodes a, b, c (c not in the inventory) and the controller; and another CA
    whose node a is a stranger with the right name."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificates")
    root = tmp_path_factory.mktemp("certs")
    nodes = root / "nodes.txt"
    nodes.write_text("a\nb\nc\n")
    for ca in ("cluster", "other"):
        subprocess.run(["sh", SCRIPT, str(root / ca), str(nodes), CONTROLLER], check=True, capture_output=True)
    return root


def identity(certs, name: str, ca: str = "cluster") -> Identity:
    d = certs / ca / name
    return Identity(dict(TLS_DEFAULTS, enabled=True, ca_file=str(d / "ca.crt"), cert_file=str(d / "tls.crt"),
                         key_file=str(d / "tls.key")))


def client_context(certs, name: str | None, ca: str = "cluster") -> ssl.SSLContext:
    """A client that checks the server against the cluster CA, presenting `name`'s certificate (None: none)."""
    ctx = ssl.create_default_context(cafile=str(certs / "cluster" / "ca.crt"))
    if name is not None:
        ctx.load_cert_chain(str(certs / ca / name / "tls.crt"), str(certs / ca / name / "tls.key"))
    return ctx


def test_a_certificate_that_does_not_name_this_node_or_chain_to_the_ca_stops_the_start_with_why(certs):
    from nodehealth.config import ConfigError
    from nodehealth.tls.identity import load_identity

    d = certs / "cluster" / "a"
    cfg = {"tls": dict(TLS_DEFAULTS, enabled=True, ca_file=str(d / "ca.crt"), cert_file=str(d / "tls.crt"),
                       key_file=str(d / "tls.key"))}
    assert load_identity(cfg, "a").names() == ["a"]
    with pytest.raises(ConfigError, match="names a, not b"):  # its peers would refuse it without a word
        load_identity(cfg, "b")
    other = certs / "other" / "a"
    cfg["tls"].update(cert_file=str(other / "tls.crt"), key_file=str(other / "tls.key"))
    with pytest.raises(ConfigError, match="does not verify"):
        load_identity(cfg, "a")
    assert load_identity({"tls": dict(TLS_DEFAULTS)}, "a") is None  # off: nothing is read


def test_a_tls_file_that_never_ends_is_refused_with_why(certs):
    """/dev/zero (or any file past 1 MiB) named as a certificate: a clear error, not a read without end."""
    from nodehealth.config import ConfigError
    from nodehealth.tls.identity import load_identity

    d = certs / "cluster" / "a"
    cfg = {"tls": dict(TLS_DEFAULTS, enabled=True, ca_file="/dev/zero", cert_file=str(d / "tls.crt"),
                       key_file=str(d / "tls.key"))}
    with pytest.raises(ConfigError, match="/dev/zero holds more than 1048576 bytes"):
        load_identity(cfg, "a")


def test_a_token_file_past_its_bound_admits_nobody(tmp_path):
    from nodehealth.tls.access import MAX_TOKEN_BYTES, Access

    big = "t" * (MAX_TOKEN_BYTES + 1)
    (tmp_path / "token").write_text(big)
    for token_file, token in ((str(tmp_path / "token"), big), ("/dev/zero", "\0" * 16)):
        assert Access(token_file).refuse("/metrics", f"Bearer {token}", []) == 401, token_file
    (tmp_path / "token").write_text("t" * MAX_TOKEN_BYTES)  # at the bound: a token
    assert Access(str(tmp_path / "token")).refuse("/metrics", "Bearer " + "t" * MAX_TOKEN_BYTES, []) is None


# -- the daemon's HTTP: TLS, the controller's path, the token ------------------------------------------

def routes():
    ok = lambda _: (200, b"ok\n", "text/plain")  # noqa: E731
    return {"/metrics": ok, "/healthz": ok, "/v1/report": ok, "/v1/pingmesh": ok}


def http_server(tls: Identity | None, token_file: str = ""):
    cfg = {"daemon": {"token_file": token_file}}
    srv = httpbound.make_server(f"127.0.0.1:{free_port()}", routes, "test", **http_options(cfg, tls))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def stop_after():
    servers = []
    yield servers.append
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def status(srv, path: str, ctx: ssl.SSLContext | None = None, server_name: str = "a",
           token: str | None = None) -> int | str:
    """The answer's status code, or "refused" when the connection ends without an answer (a failed handshake)."""
    host, port = srv.server_address[:2]
    try:
        with socket.create_connection((host, port), timeout=5) as raw:
            sock = ctx.wrap_socket(raw, server_hostname=server_name) if ctx is not None else raw
            headers = f"Authorization: Bearer {token}\r\n" if token is not None else ""
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n".encode())
            response = http.client.HTTPResponse(sock)
            response.begin()
            return response.status
    except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
        return "refused"


def test_with_tls_only_the_controller_reads_summaries_and_healthz_stays_open(certs, stop_after):
    srv = http_server(identity(certs, "a"))
    stop_after(srv)
    assert status(srv, "/healthz", client_context(certs, None)) == 200  # the kubelet presents nothing
    assert status(srv, "/v1/pingmesh", client_context(certs, CONTROLLER)) == 200
    assert status(srv, "/v1/pingmesh", client_context(certs, None)) == 401  # a stranger without a certificate
    assert status(srv, "/v1/pingmesh", client_context(certs, "b")) == 403  # a member, but not the controller
    assert status(srv, "/v1/pingmesh", client_context(certs, CONTROLLER, ca="other")) == "refused"  # wrong CA
    assert status(srv, "/v1/pingmesh") == "refused"  # plain HTTP to a TLS port
    assert wait_for(lambda: srv.dropped["handshake"] >= 2)
    assert srv.refused == {401: 1, 403: 1}


def test_the_token_guards_metrics_and_report_while_healthz_stays_open(tmp_path, stop_after):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    srv = http_server(None, str(token_file))
    stop_after(srv)
    assert status(srv, "/metrics") == 401
    assert status(srv, "/metrics", token="wrong") == 401
    assert status(srv, "/v1/report") == 401
    assert status(srv, "/metrics", token=TOKEN) == 200
    assert status(srv, "/v1/report", token=TOKEN) == 200
    assert status(srv, "/healthz") == 200
    token_file.write_text("rotated-token\n")  # a rotated Secret: the next request sees it
    assert status(srv, "/metrics", token=TOKEN) == 401
    assert status(srv, "/metrics", token="rotated-token") == 200
    token_file.unlink()  # an unreadable token file opens nothing
    assert status(srv, "/metrics", token="rotated-token") == 401


def test_without_tls_the_token_also_guards_summaries_and_the_controller_carries_it(tmp_path, stop_after):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    srv = http_server(None, str(token_file))
    stop_after(srv)
    url = "http://{}:{}/v1/pingmesh".format(*srv.server_address[:2])
    with pytest.raises(FetchError) as e:
        fetch(url, 5.0)
    assert e.value.reason == "http_error" and "401" in str(e.value)
    assert fetch(url, 5.0, token=TOKEN.encode()) == b"ok\n"


def test_with_tls_a_client_certificate_of_the_ca_reads_metrics_without_the_token(certs, tmp_path, stop_after):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    srv = http_server(identity(certs, "a"), str(token_file))
    stop_after(srv)
    assert status(srv, "/metrics", client_context(certs, None)) == 401
    assert status(srv, "/metrics", client_context(certs, None), token=TOKEN) == 200
    assert status(srv, "/metrics", client_context(certs, "b")) == 200


def test_with_tls_off_and_no_token_everything_answers_as_before(stop_after):
    srv = http_server(None)
    stop_after(srv)
    assert [status(srv, p) for p in routes()] == [200] * 4


# -- the controller's fetch --------------------------------------------------------------------------

def test_the_controller_takes_a_summary_only_from_the_node_it_asked(certs, stop_after):
    srv = http_server(identity(certs, "b"))  # node b's agent, at the address the controller has for a
    stop_after(srv)
    url = "http://{}:{}/v1/pingmesh".format(*srv.server_address[:2])
    controller = identity(certs, CONTROLLER)
    assert fetch(url, 5.0, controller, "b") == b"ok\n"
    with pytest.raises(FetchError) as e:
        fetch(url, 5.0, controller, "a")
    assert e.value.reason == "tls"
    with pytest.raises(FetchError) as e:  # a node's certificate is not the controller's
        fetch(url, 5.0, identity(certs, "a"), "b")
    assert e.value.reason == "http_error"


def test_a_rotated_certificate_reaches_new_connections(certs, tmp_path, stop_after):
    live = tmp_path / "tls"
    shutil.copytree(certs / "cluster" / "a", live)
    srv = http_server(Identity(dict(TLS_DEFAULTS, enabled=True, ca_file=str(live / "ca.crt"),
                                    cert_file=str(live / "tls.crt"), key_file=str(live / "tls.key"))))
    stop_after(srv)
    assert status(srv, "/healthz", client_context(certs, None), server_name="a") == 200
    for f in ("tls.crt", "tls.key"):  # as the kubelet swaps a Secret's files
        shutil.copy(certs / "cluster" / "b" / f, live / (f + ".new"))
        os.replace(live / (f + ".new"), live / f)
    assert status(srv, "/healthz", client_context(certs, None), server_name="b") == 200
    assert status(srv, "/healthz", client_context(certs, None), server_name="a") == "refused"


# -- the Ping service ----------------------------------------------------------------------------------

grpc = pytest.importorskip("grpc")

from nodehealth.pingmesh import agent  # noqa: E402 (grpc checked above)
from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH_DEFAULTS  # noqa: E402
from nodehealth.pingmesh.pinglist import Target  # noqa: E402
from nodehealth.pingmesh.prober import Prober  # noqa: E402

INVENTORY = {"a", "b"}


def pings(port: int, prober_tls: Identity | None, count: int = 4) -> list[float | None]:
    """Round trips of `count` Pings from node b to node a at 127.0.0.1:port (None: lost)."""
    results: list[float | None] = []
    prober = Prober("b", dict(PINGMESH_DEFAULTS, port=port, probe_interval_seconds=0.1, timeout_seconds=1.0,
                              tcp_probe=False), lambda t, probe, sent, rtt, r: results.append(rtt), prober_tls)
    prober.set_targets([Target(node="a", address="127.0.0.1", rail=0, leaf="leaf0", group="same-leaf")])
    stop = threading.Event()
    thread = threading.Thread(target=prober.run, args=(stop,))
    thread.start()
    try:
        assert wait_for(lambda: len(results) >= count, timeout=20), "the prober made no Pings"
    finally:
        stop.set()
        thread.join(5)
    return results[:count]


@pytest.fixture
def ping_agent(certs):
    """Node a's Ping service with mutual TLS, answering members of the inventory; returns its port."""
    agents = []

    def start(cert_name: str = "a") -> tuple[int, agent.Agent]:
        port = free_port()
        a = agent.Agent(f"127.0.0.1:{port}", "a", tls=identity(certs, cert_name),
                        admit=lambda names: bool(INVENTORY & set(names)))
        a.start()
        agents.append(a)
        return port, a

    yield start
    for a in agents:
        a.stop(0)


def test_a_member_pings_and_strangers_do_not(certs, ping_agent):
    port, a = ping_agent()
    assert all(r is not None for r in pings(port, identity(certs, "b")))
    assert all(r is None for r in pings(port, None))  # no certificate: no handshake
    assert all(r is None for r in pings(port, identity(certs, "b", ca="other")))  # a wrong CA
    assert all(r is None for r in pings(port, identity(certs, "c")))  # the CA's, but not in the inventory
    assert a.refused["stranger"] >= 1


def test_a_member_cannot_answer_for_another_node(certs, ping_agent):
    port, _ = ping_agent("c")  # node c's certificate, answering as "a" at a's address
    assert all(r is None for r in pings(port, identity(certs, "b")))


def test_the_ping_service_takes_a_rotated_certificate_without_a_restart(certs, tmp_path):
    live = tmp_path / "tls"
    shutil.copytree(certs / "cluster" / "a", live)
    port = free_port()
    a = agent.Agent(f"127.0.0.1:{port}", "a", tls=Identity(dict(TLS_DEFAULTS, enabled=True,
                    ca_file=str(live / "ca.crt"), cert_file=str(live / "tls.crt"), key_file=str(live / "tls.key"))),
                    admit=lambda names: bool(INVENTORY & set(names)))
    a.start()
    try:
        assert all(r is not None for r in pings(port, identity(certs, "b")))
        for f in ("tls.crt", "tls.key"):  # b's certificate now: a prober that means a must not take it
            shutil.copy(certs / "cluster" / "b" / f, live / (f + ".new"))
            os.replace(live / (f + ".new"), live / f)
        assert all(r is None for r in pings(port, identity(certs, "b")))
    finally:
        a.stop(0)


def test_with_tls_off_pings_work_as_before():
    port = free_port()
    a = agent.Agent(f"127.0.0.1:{port}", "a")
    a.start()
    try:
        assert all(r is not None for r in pings(port, None))
    finally:
        a.stop(0)


def test_the_script_names_each_node_and_the_controller(certs):
    names = {}
    for name in ("a", "b", "c", CONTROLLER):
        text = subprocess.run(["openssl", "x509", "-in", str(certs / "cluster" / name / "tls.crt"), "-noout",
                               "-ext", "subjectAltName,extendedKeyUsage"], check=True, capture_output=True,
                              text=True).stdout
        names[name] = text
    for name, text in names.items():
        assert f"DNS:{name}" in text and "Client Authentication" in text and "Server Authentication" in text
    assert json.dumps(sorted(os.listdir(certs / "cluster" / "a"))) == '["ca.crt", "tls.crt", "tls.key"]'


# -- netcheck ------------------------------------------------------------------------------------------

from nodehealth.netcheck import agent as nc_agent  # noqa: E402
from nodehealth.netcheck import coordinator as nc_coordinator  # noqa: E402
from nodehealth.netcheck.admission import Admission  # noqa: E402
from nodehealth.netcheck.wire import StreamError, request  # noqa: E402

COORDINATOR_ADDRESS = "127.0.0.60"


@pytest.fixture
def netcheck_agents(certs):
    """Agents of nodes a (127.0.0.61) and b (127.0.0.62) under mutual TLS, taking jobs from 127.0.0.60."""
    port = free_port()
    agents = {}
    for name, address in (("a", "127.0.0.61"), ("b", "127.0.0.62")):
        agents[name] = nc_agent.Agent((address, port), nc_agent.AgentConfig(name, f"{address}:{port}"),
                                      admission=Admission(coordinators=[COORDINATOR_ADDRESS]),
                                      tls=identity(certs, name))
        agents[name].start()
    yield {name: f"{a.server_address[0]}:{port}" for name, a in agents.items()}
    for a in agents.values():
        a.close()


def test_netcheck_under_tls_tests_a_pair_and_strangers_are_not_heard(certs, netcheck_agents):
    a, b = netcheck_agents["a"], netcheck_agents["b"]
    for stranger in (None, identity(certs, "c", ca="other")):  # no certificate; one of another CA
        with pytest.raises(StreamError):
            request(a, {"op": "hello"}, 5, source=COORDINATOR_ADDRESS, tls=stranger)
    coordinator = identity(certs, "c")
    hosts, problems = nc_coordinator.hello([a, b], 5, COORDINATOR_ADDRESS, coordinator)
    assert problems == [] and sorted(h.name for h in hosts) == ["a", "b"]
    job = nc_coordinator.Job.new(COORDINATOR_ADDRESS, coordinator)
    assert nc_coordinator.claim(hosts, job, 60) == []
    by_name = {h.name: h for h in hosts}
    result = nc_coordinator.run_pair(by_name["a"], by_name["b"], 0.3, nc_agent.TCP, job)
    assert result.ok and result.bandwidth_gbps > 0, result  # the request under TLS, the stream in the clear
    # a's stream goes only to the agent whose certificate names the node the coordinator named
    asked = job.ask(by_name["a"], {"op": "send", "job": job.id, "to": b, "name": "c", "seconds": 0.3}, 10)
    assert "is not c" in asked["error"], asked
    # an agent that answers hello as another node is not taken: its certificate does not name it
    impostor = nc_coordinator.Host(b, "a", b)
    assert "is not a" in nc_coordinator.claim([impostor], job, 60)[0][1]


def test_a_member_cannot_join_a_job_under_another_nodes_name(certs):
    rendezvous = nc_agent.Rendezvous(2, answer_timeout=10)
    port = free_port()
    coordinator = nc_agent.Agent(("127.0.0.63", port), nc_agent.AgentConfig("a", f"127.0.0.63:{port}"), rendezvous,
                                 Admission(coordinators=["127.0.0.63"]), tls=identity(certs, "a"))
    coordinator.start()
    try:
        endpoint = f"127.0.0.63:{port}"
        with pytest.raises(StreamError, match="certificate of c"):  # c's certificate, b's name
            nc_agent.join(endpoint, {"op": "join", "name": "b", "agent": "127.0.0.64:1"}, 0, 5,
                          tls=identity(certs, "c"))
        with pytest.raises(StreamError):  # no certificate: not heard at all
            nc_agent.join(endpoint, {"op": "join", "name": "b", "agent": "127.0.0.64:1"}, 0, 5)
        assert rendezvous.members == {}
        joined = threading.Thread(target=nc_agent.join, args=(endpoint, {"op": "join", "name": "b",
                                                                         "agent": "127.0.0.64:1"}, 0, 10),
                                  kwargs={"tls": identity(certs, "b")})
        joined.start()
        assert wait_for(lambda: "b" in rendezvous.members, timeout=10)
        rendezvous.finish({"verdict": {}, "code": 0}, linger=5)
        joined.join(10)
    finally:
        coordinator.close()


# -- the daemon, end to end --------------------------------------------------------------------------

def test_two_daemons_with_tls_ping_each_other_and_only_the_controller_reads_them(certs, tmp_path, daemon_factory):
    from conftest import machine

    from nodehealth.pingmesh.fetch import fetch_summary

    port = free_port()
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"nodes": [{"name": "a", "leaf": "l0", "address": "127.0.0.66"},
                                               {"name": "b", "leaf": "l0", "address": "127.0.0.67"}]}))
    daemons = {}
    for name, address in (("a", "127.0.0.66"), ("b", "127.0.0.67")):
        d = certs / "cluster" / name
        config = tmp_path / f"{name}.json"
        config.write_text(json.dumps({
            "pingmesh": {"port": port, "tcp_port": free_port(), "probe_interval_seconds": 0.2,
                         "ping_interval_seconds": 0.2, "window_seconds": 2.0,
                         "timeout_seconds": 1.0},
            "tls": {"enabled": True, "ca_file": str(d / "ca.crt"), "cert_file": str(d / "tls.crt"),
                    "key_file": str(d / "tls.key")}}))
        daemons[name] = daemon_factory(machine("plain-host"), str(tmp_path / name), "--only", "modules,pingmesh",
                                       "--config", str(config), "--node-name", name,
                                       "--probe-listen", f"{address}:{port}", "--probe-inventory", str(inventory),
                                       interval=5.0)
    a = daemons["a"]

    class Listening:  # what status() needs of a server
        server_address = ("127.0.0.1", a.port)
    assert wait_for(lambda: status(Listening, "/healthz", client_context(certs, None)) == 200, timeout=20), \
        a.output() if a.proc.poll() is not None else "no answer over HTTPS"
    assert status(Listening, "/v1/pingmesh", client_context(certs, "b")) == 403
    controller = identity(certs, CONTROLLER)

    def newest_closed():  # the first window may hold pings sent before b listened
        closed = [w for w in fetch_summary("127.0.0.1", a.port, 10, 5.0, None, controller, "a").windows if w.closed]
        return closed[-1] if len(closed) >= 2 else None
    window = wait_for(newest_closed, timeout=30, step=0.5)
    assert window is not None, "no closed windows"
    [ping] = [p for p in window.peers if p.node == "b" and p.probe == "ping"]
    assert ping.sent >= 3 and ping.lost == 0, (ping.sent, ping.lost)
    with pytest.raises(FetchError):  # a's summary is not b's
        fetch_summary("127.0.0.1", a.port, 10, 5.0, None, controller, "b")
