"""The gRPC Ping agent and the prober on loopback, with well-behaved and misbehaving peers."""
from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import HERE, free_port, http_get, machine, require_netns, require_tool, started_agent, wait_for

from nodehealth.pingmesh import agent, ping_wire
from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH_DEFAULTS
from nodehealth.pingmesh.pinglist import Target
from nodehealth.pingmesh.prober import Prober

pytest.importorskip("grpc")


def cfg(port: int, **over) -> dict:
    c = dict(PINGMESH_DEFAULTS, port=port, probe_interval_seconds=0.2, timeout_seconds=0.5)
    c.update(over)
    c["ping_interval_seconds"] = over.get("ping_interval_seconds", c["probe_interval_seconds"])  # a Ping a probe
    return c


def target(name: str, address: str) -> Target:
    return Target(node=name, address=address, rail=0, leaf="leaf0", group="same-leaf")


class Recorder:
    def __init__(self):
        self.lock = threading.Lock()
        self.results: list[tuple[str, str, float | None, bool]] = []

    def __call__(self, t, probe, sent_at, rtt, retrans):
        with self.lock:
            self.results.append((t.node, probe, rtt, retrans))

    def of(self, node, probe):
        with self.lock:
            return [r[2] for r in self.results if r[0] == node and r[1] == probe]


@contextlib.contextmanager
def running(prober: Prober):
    """The prober's loop on a thread of its own for the block; stopped, and seen to stop, after it."""
    stop = threading.Event()
    thread = threading.Thread(target=prober.run, args=(stop,))
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive(), "the prober did not stop"


def run_prober(prober: Prober, seconds: float) -> None:
    with running(prober):
        time.sleep(seconds)


@pytest.fixture
def port():
    return free_port()


def test_ping_and_tcp_probes_are_answered(port):
    server = started_agent(f"127.0.0.2:{port}", "node-b")
    try:
        rec = Recorder()
        prober = Prober("node-a", cfg(port), rec)
        prober.set_targets([target("node-b", "127.0.0.2")])
        run_prober(prober, 1.5)
    finally:
        server.stop(0)
    pings, connects = rec.of("node-b", "ping"), rec.of("node-b", "tcp")
    assert len(pings) >= 5 and len(connects) >= 5
    assert all(r is not None and r < 0.5 for r in pings + connects)
    assert prober.in_flight == 0


def test_a_peer_is_pinged_with_every_third_probe_at_the_default_ratio(port):
    """ping_interval_seconds three probe intervals (30 s against 10 s by default): a pinged peer gets a Ping
    with every third TCP probe; the rail it is not pinged on gets TCP probes alone."""
    server = started_agent(f"127.0.0.2:{port}", "node-b")
    try:
        rec = Recorder()
        prober = Prober("node-a", cfg(port, probe_interval_seconds=0.1, ping_interval_seconds=0.3), rec)
        assert prober.ping_every == round(PINGMESH_DEFAULTS["ping_interval_seconds"] /
                                          PINGMESH_DEFAULTS["probe_interval_seconds"]) == 3
        prober.set_targets([target("node-b", "127.0.0.2"), Target(node="node-b", address="127.0.0.2", rail=1,
                                                                   leaf="leaf0", group="same-leaf")])
        run_prober(prober, 1.5)
    finally:
        server.stop(0)
    pings, connects = rec.of("node-b", "ping"), rec.of("node-b", "tcp")
    assert len(connects) >= 18  # two rails, a probe each every 0.1 s
    assert 1 <= len(pings) and abs(len(pings) - len(connects) / 2 / 3) <= 1, (len(pings), len(connects))
    assert all(r is not None for r in pings)


def test_without_tcp_probes_every_probe_is_a_ping(port):
    prober = Prober("node-a", cfg(port, ping_interval_seconds=30.0, tcp_probe=False), Recorder())
    assert prober.ping_every == 1


def test_a_reply_from_another_node_is_not_an_answer(port):
    server = started_agent(f"127.0.0.2:{port}", "somebody-else")
    try:
        rec = Recorder()
        prober = Prober("node-a", cfg(port), rec)
        prober.set_targets([target("node-b", "127.0.0.2")])
        run_prober(prober, 1.0)
    finally:
        server.stop(0)
    assert rec.of("node-b", "ping") and all(r is None for r in rec.of("node-b", "ping"))


def _silent_peer(address: str, port: int, garbage: bool):
    """A peer that accepts connections and never answers, or answers garbage and closes."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen(64)
    stop = threading.Event()
    held = []

    def serve():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            if garbage:
                try:
                    conn.sendall(b"\x00\xff HTTP/0.9 nonsense\r\n" * 50)
                except OSError:
                    pass
                conn.close()
            else:
                held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def close():
        stop.set()
        thread.join(2)
        for c in held:
            c.close()
        listener.close()
    return close


def test_a_ping_our_own_stop_cuts_short_is_skipped_not_lost(port):
    """The prober's stop closes its channels, which cancels the Pings in flight: the network lost nothing,
    so they are skipped, as the TCP probes its stop cuts short are."""
    close = _silent_peer("127.0.0.3", port, garbage=False)
    try:
        rec = Recorder()
        prober = Prober("node-a", cfg(port, timeout_seconds=30.0, tcp_probe=False), rec)
        prober.set_targets([target("silent", "127.0.0.3")])
        with running(prober):
            assert wait_for(lambda: prober.started >= 1)
        assert wait_for(lambda: prober.in_flight == 0)
    finally:
        close()
    assert rec.of("silent", "ping") == [] and prober.skipped >= 1 and prober.started == 0, \
        (rec.results, prober.skipped, prober.started)


@pytest.mark.parametrize("garbage", [False, True], ids=["never-answers", "sends-garbage"])
def test_misbehaving_peer_costs_lost_probes_and_never_blocks_the_others(port, garbage):
    close = _silent_peer("127.0.0.3", port, garbage)
    server = started_agent(f"127.0.0.2:{port}", "good")
    try:
        rec = Recorder()
        prober = Prober("node-a", cfg(port), rec)
        prober.set_targets([target("bad", "127.0.0.3"), target("good", "127.0.0.2")])
        run_prober(prober, 2.0)
    finally:
        server.stop(0)
        close()
    assert rec.of("bad", "ping") and all(r is None for r in rec.of("bad", "ping"))
    good = rec.of("good", "ping")
    assert len(good) >= 6 and all(r is not None and r < 0.3 for r in good)


def test_nothing_listening_loses_pings_and_a_refused_connect_is_answered(port):
    rec = Recorder()
    prober = Prober("node-a", cfg(port), rec)
    prober.set_targets([target("down", "127.0.0.4")])
    run_prober(prober, 1.0)
    assert rec.of("down", "ping") and all(r is None for r in rec.of("down", "ping"))
    assert rec.of("down", "tcp") and all(r is not None for r in rec.of("down", "tcp"))


def test_rate_cap_skips_and_counts_instead_of_queueing(port):
    server = started_agent(f"127.0.0.2:{port}", "node-b")
    try:
        rec = Recorder()
        prober = Prober("node-a", cfg(port, probe_interval_seconds=0.05, max_probes_per_second=4.0), rec)
        prober.set_targets([target("node-b", "127.0.0.2")])
        run_prober(prober, 1.5)
    finally:
        server.stop(0)
    assert prober.skipped > 10
    assert len(rec.results) <= 4 * 1.5 + 5  # the bucket's burst plus its rate


def test_port_in_use_is_a_clear_error(port):
    held = socket.socket()
    held.bind(("127.0.0.2", port))
    held.listen(1)
    try:
        with pytest.raises(agent.ProbeError, match="cannot listen"):
            started_agent(f"127.0.0.2:{port}", "x")
    finally:
        held.close()
    with pytest.raises(agent.ProbeError, match="ADDR:PORT"):
        started_agent("nonsense", "x")


def test_two_daemons_probe_each_other_and_publish_windows(tmp_path, daemon_factory):
    """Real daemons on two loopback addresses: /v1/pingmesh, metrics that promtool accepts."""
    port = free_port()
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"nodes": [{"name": "a", "leaf": "l0", "address": "127.0.0.2"},
                                               {"name": "b", "leaf": "l0", "address": "127.0.0.3"},
                                               {"name": "c", "leaf": "l1", "address": "127.0.0.5"}]}))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"pingmesh": {"port": port, "tcp_port": free_port(),
                                               "probe_interval_seconds": 0.2, "ping_interval_seconds": 0.2,
                                               "window_seconds": 2.0, "timeout_seconds": 2.0}}))
    daemons = {}
    for name, address in (("a", "127.0.0.2"), ("b", "127.0.0.3")):
        daemons[name] = daemon_factory(machine("plain-host"), str(tmp_path / name), "--only", "modules,pingmesh",
                                       "--config", str(config), "--node-name", name,
                                       "--probe-listen", f"{address}:{port}", "--probe-inventory", str(inventory),
                                       interval=5.0)
    for d in daemons.values():
        d.wait_ready()
    deadline = time.monotonic() + 30
    while True:
        code, body = daemons["a"].get("/v1/pingmesh")
        assert code == 200
        doc = json.loads(body)
        closed = [w for w in doc["windows"] if w["closed"]]
        if len(closed) >= 2 or time.monotonic() > deadline:  # the first window may be partial
            break
        time.sleep(0.5)
    assert doc["node"] == "a" and doc["leaf"] == "l0"
    assert len(closed) >= 2, doc
    peers = {(p["node"], p["probe"]): p for p in closed[-1]["peers"]}
    assert peers[("b", "ping")]["sent"] >= 3 and peers[("b", "ping")]["lost"] == 0
    assert peers[("b", "tcp")]["lost"] == 0
    # c's agent does not run: its pings are lost (its refused connects crossed the network).
    assert peers[("c", "ping")]["lost"] == peers[("c", "ping")]["sent"] > 0
    code, body = daemons["a"].get("/v1/pingmesh?windows=1")
    assert len(json.loads(body)["windows"]) == 1
    code, body = daemons["a"].get("/metrics")
    text = body.decode()
    assert 'nodehealth_pingmesh_probes_total{peer_group="same-leaf",probe="ping"}' in text
    assert 'nodehealth_pingmesh_rtt_seconds_bucket{peer_group="same-leaf",probe="ping",le="+Inf"}' in text
    assert 'nodehealth_pingmesh_peer_loss_ratio{peer="c",rail="0",probe="ping"} 1' in text
    assert 'nodehealth_pingmesh_info{leaf="l0",pod=""} 1' in text
    promtool = require_tool("promtool")
    p = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    code, body = http_get(daemons["a"].url + "/v1/report")
    assert code == 200 and json.loads(body)["status"] == "healthy"


def test_a_flood_of_connects_on_the_tcp_probe_port_never_stops_our_own_probes(port):
    """Anyone can connect to the TCP probe port: the loop answers a bounded number per turn."""
    listener = agent.listen_tcp("127.0.0.6", free_port())
    server = started_agent(f"127.0.0.2:{port}", "node-b")
    stop_flood = threading.Event()

    def flood():
        while not stop_flood.is_set():
            with socket.socket() as s:
                s.settimeout(0.5)
                s.connect_ex(listener.getsockname())
    floods = [threading.Thread(target=flood, daemon=True) for _ in range(4)]
    try:
        rec = Recorder()
        prober = Prober("node-a", cfg(port, timeout_seconds=1.5), rec)  # a loaded machine: not 0.5 s
        prober.accept_probes(listener)
        prober.set_targets([target("node-b", "127.0.0.2")])
        for t in floods:
            t.start()
        run_prober(prober, 2.0)
    finally:
        stop_flood.set()
        for t in floods:
            t.join(2)
        server.stop(0)
        listener.close()
    pings = rec.of("node-b", "ping")
    assert len(pings) >= 6 and all(r is not None for r in pings)


def test_a_probe_that_resets_at_once_never_reaches_the_peers_accept(port):
    """The handshake is the answer: a probe the prober resets once its connect completes stays in the
    peer's kernel (TCP_DEFER_ACCEPT), so the peer's loop never accepts nor closes it; a connection
    that stays open is still handed to accept(), where the loop closes it."""
    listener = agent.listen_tcp("127.0.0.7", port)
    rec = Recorder()
    prober = Prober("node-a", cfg(port, tcp_port=port, ping_interval_seconds=10.0, timeout_seconds=3.0), rec)
    sel = selectors.DefaultSelector()
    accepts = selectors.DefaultSelector()  # not select.select: a whole suite's descriptors may pass 1024
    accepts.register(listener, selectors.EVENT_READ)
    try:
        for _ in range(20):
            prober._connect(target("node-b", "127.0.0.7"), sel)
        assert wait_for(lambda: (prober._poll_connects(sel, 0.1), len(rec.results) == 20)[1], timeout=10)
        assert accepts.select(0.5) == [] and all(rtt is not None for _, _, rtt, _ in rec.results), rec.results
        with socket.create_connection(listener.getsockname(), timeout=5):  # a client that stays
            ready = [key.fileobj for key, _ in accepts.select(10)]
        assert ready == [listener]
    finally:
        sel.close()
        accepts.close()
        listener.close()


def test_a_starved_prober_reports_the_kernels_round_trip_not_its_own_delay(port):
    """The loop gets to a finished connect 1.2 s late (a CPU-starved agent): the probe is still fast and
    not retransmitted, because the kernel timed the handshake."""
    listener = agent.listen_tcp("127.0.0.7", port)
    rec = Recorder()
    prober = Prober("node-a", cfg(port, tcp_port=port, timeout_seconds=3.0), rec)
    sel = selectors.DefaultSelector()
    try:
        prober._connect(target("node-b", "127.0.0.7"), sel)
        time.sleep(1.2)
        prober._poll_connects(sel, 0.5)
    finally:
        sel.close()
        listener.close()
    assert rec.results == [("node-b", "tcp", pytest.approx(0.0, abs=0.05), False)], rec.results


def test_the_loop_wakes_once_a_tick_not_once_a_probe(port, monkeypatch):
    """200 peers probed twice a second (400 TCP probes a second, each at its own phase): the loop takes
    them a tick at a time (a twentieth of the interval: 40 wake-ups a second), where it woke for every
    probe and every finished connect; every probe is still timed and answered."""
    listener = agent.listen_tcp("127.0.0.9", port)
    rec = Recorder()
    prober = Prober("node-a", cfg(port, tcp_port=port, probe_interval_seconds=0.5, timeout_seconds=1.5,
                                  max_probes_per_second=1000, max_concurrency=400), rec)
    prober.set_targets([Target(node=f"n{i}", address="127.0.0.9", rail=i, leaf="leaf0", group="same-leaf")
                        for i in range(200)])
    turns = []
    poll = prober._poll_connects
    monkeypatch.setattr(prober, "_poll_connects", lambda sel, wait: (turns.append(wait), poll(sel, wait)))
    try:
        run_prober(prober, 2.0)
    finally:
        listener.close()
    tcp = [r for r in rec.results if r[1] == "tcp"]
    # every peer probed, more than once where the machine keeps up (a loaded CI machine timed 515 of 800)
    assert len(tcp) >= 300 and all(rtt is not None for _, _, rtt, _ in tcp), [r for r in tcp if r[2] is None][:5]
    assert len(turns) <= 2.0 / prober.tick + 5, len(turns)


def test_at_the_10000_node_load_the_loop_wakes_twice_a_second_and_skips_nothing(port, monkeypatch):
    """41 peers x 8 rails at the default settings (33 TCP probes a second): the loop wakes twice a
    second (a wake-up costs more than the work it then does: benchmarks/RESULTS.md), its half-second
    batches of ~17 probes fit the cap on probes in flight, and every probe is answered."""
    listener = agent.listen_tcp("0.0.0.0", port)  # every peer's address: 127.0.9.1 ...
    rec = Recorder()
    prober = Prober("node-a", dict(PINGMESH_DEFAULTS, port=free_port(), tcp_port=port), rec)
    prober.set_targets([Target(node=f"n{i}", address=f"127.0.9.{i + 1}", rail=r, leaf="leaf0", group="same-leaf")
                        for i in range(41) for r in range(8)])
    turns = []
    poll = prober._poll_connects
    monkeypatch.setattr(prober, "_poll_connects", lambda sel, wait: (turns.append(wait), poll(sel, wait)))
    try:
        with running(prober):
            time.sleep(3.0)
            skipped = prober.skipped  # before the stop, which skips the Pings (to no agent here) it cuts short
    finally:
        listener.close()
    tcp = [r for r in rec.results if r[1] == "tcp"]
    assert len(tcp) >= 60 and all(rtt is not None for _, _, rtt, _ in tcp), [r for r in tcp if r[2] is None][:5]
    assert skipped == 0
    assert len(turns) <= 3.0 * 2 + 3, len(turns)


TCP_PROBE_SCRIPT = """
import json, selectors, sys, time
from nodehealth.pingmesh import agent
from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH_DEFAULTS
from nodehealth.pingmesh.pinglist import Target
from nodehealth.pingmesh.prober import Prober
port = int(sys.argv[1])
listener = agent.listen_tcp("127.0.0.1", port)
out = []
prober = Prober("a", dict(PINGMESH_DEFAULTS, tcp_port=port, timeout_seconds=4.0),
                lambda t, probe, sent, rtt, retrans: out.append([rtt, retrans]))
sel = selectors.DefaultSelector()
for _ in range(2):
    prober._connect(Target(node="b", address="127.0.0.1", rail=0, leaf="l", group="g"), sel)
    while sel.get_map():
        prober._poll_connects(sel, 0.5)
print(json.dumps(out))
"""


def test_a_dropped_syn_is_a_retransmission_the_kernel_counted(port):
    """In a namespace whose loopback drops every other SYN (nftables), each connect needs its SYN sent
    twice: retransmitted, about a second. Without the rule: neither."""
    require_netns()
    ns = f"nh-syn-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)

        def probe() -> list:
            done = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", TCP_PROBE_SCRIPT, str(port)],
                                  capture_output=True, text=True, timeout=60, cwd=os.path.dirname(HERE))
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)

        clean = probe()
        assert [r[1] for r in clean] == [False, False] and all(r[0] < 0.1 for r in clean), clean
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], check=True, text=True,
                       input="table inet t {\n chain syns {\n type filter hook input priority 0;\n"
                             f" tcp dport {port} tcp flags & (syn|ack) == syn numgen inc mod 2 == 0 drop\n }}\n}}\n")
        dropped = probe()
        assert [r[1] for r in dropped] == [True, True] and all(0.9 <= r[0] < 2.5 for r in dropped), dropped
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


# -- a hostile peer on the Ping port ----------------------------------------------------------------

OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # grpc shares connections between like channels


def ping_once(port: int, address: str = "127.0.0.2", timeout: float = 3.0):
    import grpc

    with grpc.insecure_channel(f"{address}:{port}", options=OWN_CONNECTION) as channel:
        ping = channel.unary_unary(ping_wire.METHOD, response_deserializer=ping_wire.decode_reply)
        return ping(ping_wire.encode_request(7, 0, "node-a"), timeout=timeout)


def test_calls_that_never_send_their_request_cannot_stop_the_answers_and_end_at_the_deadline(port, monkeypatch):
    """Ten calls on two connections send their headers and never their message (no deadline of their
    own): Pings are still answered, and the agent ends each stuck call itself, counted."""
    import grpc
    monkeypatch.setattr(agent, "CALL_SECONDS", 1.0)
    server = started_agent(f"127.0.0.2:{port}", "node-b")
    never = threading.Event()

    def no_message():
        never.wait(30)
        yield b""
    channels = [grpc.insecure_channel(f"127.0.0.2:{port}", options=OWN_CONNECTION) for _ in range(2)]
    try:
        stuck = [channels[n % 2].stream_unary(ping_wire.METHOD).future(no_message()) for n in range(10)]
        reply = ping_once(port)
        assert reply.seq == 7 and reply.node == "node-b"
        codes = []
        for call in stuck:
            with pytest.raises(grpc.RpcError) as e:
                call.result(timeout=10)
            codes.append(e.value.code())
        assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * 10
        assert server.refused["deadline"] == 10
    finally:
        never.set()
        for channel in channels:
            channel.close()
        server.stop(0)


def test_malformed_requests_are_refused_counted_and_logged_once(port, caplog):
    import logging

    import grpc
    caplog.set_level(logging.DEBUG)
    server = started_agent(f"127.0.0.2:{port}", "node-b")
    try:
        with grpc.insecure_channel(f"127.0.0.2:{port}") as channel:
            garbled = channel.unary_unary(ping_wire.METHOD)
            for _ in range(20):
                with pytest.raises(grpc.RpcError) as e:
                    garbled(b"\xff\xff\xff\xff", timeout=3)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert ping_once(port).node == "node-b"
    finally:
        server.stop(0)
    assert server.refused["malformed"] == 20
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "refused" in lines[0].getMessage() and lines[0].exc_info is None, lines
    assert "Traceback" not in caplog.text


def test_connections_past_the_cap_are_closed_at_once_and_silent_ones_at_the_handshake_deadline(port, monkeypatch):
    monkeypatch.setattr(agent, "HANDSHAKE_SECONDS", 1.0)
    server = agent.Agent(f"127.0.0.2:{port}", "node-b", max_connections=8)
    server.start()
    conns = [socket.create_connection(("127.0.0.2", port), timeout=10) for _ in range(20)]
    try:
        closed_at_once, settings = 0, 0
        for c in conns:
            first = c.recv(100)  # the server's SETTINGS, or the close of a connection past the cap
            closed_at_once += first == b""
            settings += first != b""
        assert closed_at_once >= 12 and settings <= 8
        for c in conns:  # those that never speak HTTP/2 are closed at the handshake deadline
            while c.recv(100):
                pass
        assert ping_once(port).node == "node-b"  # and the freed places take new peers
    finally:
        for c in conns:
            c.close()
        server.stop(0)


OUT_OF_DESCRIPTORS_SCRIPT = """
import json, os, resource, sys, threading, time
from nodehealth.pingmesh import agent
from nodehealth.pingmesh.defaults import DEFAULTS
from nodehealth.pingmesh.pinglist import Target
from nodehealth.pingmesh.prober import Prober
port, tcp_port = int(sys.argv[1]), int(sys.argv[2])
peer = agent.listen_tcp("127.0.0.9", tcp_port)  # the peer's TCP probe port: connects complete in its backlog
# Our Ping service, as in the daemon. It also keeps gRPC initialized: gRPC aborts the process when it
# must initialize again (after its last channel closed) with no descriptor left for its epoll.
ours = agent.Agent(f"127.0.0.8:{port}", "a")
ours.start()
recorded = []
prober = Prober("a", dict(DEFAULTS, port=port, tcp_port=tcp_port, probe_interval_seconds=0.1,
                            ping_interval_seconds=0.1, timeout_seconds=1.0),
                lambda t, probe, sent, rtt, retrans: recorded.append([probe, rtt]))
prober.accept_probes(agent.listen_tcp("127.0.0.8", tcp_port))
peers = [Target(node="b", address="127.0.0.9", rail=0, leaf="l", group="g")]
answered = lambda since: sum(1 for probe, rtt in recorded[since:] if probe == "tcp" and rtt is not None)
def wait(condition):
    deadline = time.monotonic() + 10
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
stop = threading.Event()
thread = threading.Thread(target=prober.run, args=(stop,))
thread.start()
prober.set_targets(peers)
wait(lambda: answered(0) > 0)  # the loop runs
prober.set_targets([])
wait(lambda: prober.in_flight == 0)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
hog = []
while True:
    try:
        hog.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
print("no descriptor left", flush=True)
sys.stdin.readline()  # a peer's TCP probe now waits on our listener
prober.set_targets(peers)
wait(lambda: prober.skipped >= 3 and prober.accept_paused_until is not None)
starved = {"skipped": prober.skipped, "paused": prober.accept_paused_until is not None}
for fd in hog:
    os.close(fd)
before = len(recorded)
wait(lambda: answered(before) >= 3)
stop.set()
thread.join(5)
print(json.dumps(dict(starved, answered_after=answered(before), prober_alive=thread.is_alive() or None)))
"""


def test_out_of_descriptors_the_prober_skips_its_probes_rests_its_listener_and_lives_on(port):
    """With every descriptor taken, a probe cannot start: it is skipped (not lost: the network lost
    nothing), the TCP probe listener rests instead of spinning on a connection it cannot accept, and
    once descriptors are free again the same loop probes on."""
    tcp_port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", OUT_OF_DESCRIPTORS_SCRIPT, str(port), str(tcp_port)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(HERE))
    try:
        assert proc.stdout.readline() == "no descriptor left\n"
        with socket.create_connection(("127.0.0.8", tcp_port), timeout=5):
            out, err = proc.communicate("go\n", timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    result = json.loads(out.splitlines()[-1])
    assert result["skipped"] >= 3 and result["paused"], result
    assert result["answered_after"] >= 3, result


# -- agents of the version before ping_wire (protoc's classes) ----------------------------------------

def test_a_prober_of_the_last_version_gets_our_answer(port, protoc_probe):
    import grpc
    pb2, pb2_grpc = protoc_probe
    server = started_agent(f"127.0.0.2:{port}", "node-b")
    try:
        with grpc.insecure_channel(f"127.0.0.2:{port}", options=OWN_CONNECTION) as channel:
            reply = pb2_grpc.ProbeStub(channel).Ping(
                pb2.PingRequest(seq=9, send_time_ns=-5, source="node-a", padding=b"\0" * 64), timeout=5)
    finally:
        server.stop(0)
    assert (reply.seq, reply.send_time_ns, reply.node) == (9, -5, "node-b")


def test_our_prober_times_an_agent_of_the_last_version(port, protoc_probe):
    """A Ping service of protoc's servicer, as agents before ping_wire ran it: answered, and a reply from
    another node is still no answer."""
    from concurrent import futures

    import grpc
    pb2, pb2_grpc = protoc_probe
    answered: list = []

    class Servicer(pb2_grpc.ProbeServicer):
        def Ping(self, request, context):
            answered.append((request.seq > 0, request.source, len(request.padding)))
            return pb2.PingReply(seq=request.seq, send_time_ns=request.send_time_ns, node="node-b")
    server = grpc.server(futures.ThreadPoolExecutor(2))
    pb2_grpc.add_ProbeServicer_to_server(Servicer(), server)
    server.add_insecure_port(f"127.0.0.2:{port}")
    server.start()
    try:
        rec = Recorder()
        prober = Prober("node-a", cfg(port, tcp_probe=False, payload_bytes=100), rec)
        prober.set_targets([target("node-b", "127.0.0.2"), target("node-c", "127.0.0.2")])
        run_prober(prober, 1.0)
    finally:
        server.stop(0)
    assert answered and set(answered) == {(True, "node-a", 100)}
    pings, wrong = rec.of("node-b", "ping"), rec.of("node-c", "ping")
    assert pings and all(r is not None and r < 0.5 for r in pings), pings
    assert wrong and all(r is None for r in wrong), wrong


def test_the_agent_and_its_prober_never_import_protobuf(port):
    """The Ping's messages are ping_wire's: a process that answers and times Pings carries no protobuf
    runtime (2.7 MiB of the agent's memory)."""
    code = f"""
import sys, threading, time
from nodehealth.pingmesh import agent
from nodehealth.pingmesh.defaults import DEFAULTS
from nodehealth.pingmesh.pinglist import Target
from nodehealth.pingmesh.prober import Prober
server = agent.Agent("127.0.0.2:{port}", "node-b")
server.start()
got = []
prober = Prober("node-a", dict(DEFAULTS, port={port}, tcp_probe=False, probe_interval_seconds=0.2),
                lambda t, probe, sent, rtt, retrans: got.append(rtt))
prober.set_targets([Target(node="node-b", address="127.0.0.2", rail=0, leaf="l", group="g")])
stop = threading.Event()
threading.Thread(target=prober.run, args=(stop,), daemon=True).start()
end = time.monotonic() + 20
while not any(r is not None for r in got) and time.monotonic() < end:
    time.sleep(0.05)
stop.set()
server.stop(0)
print(any(r is not None for r in got), sorted(m for m in sys.modules if m.startswith("google")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[0] == "True []", (out.stdout, out.stderr[-2000:])
