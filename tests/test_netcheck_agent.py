"""netcheck's agents on loopback (127.0.0.0/8): what the coordinator concludes when an agent dies,
and what an agent does for strangers (bounded loops, only loopback addresses)."""
from __future__ import annotations

import errno
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import free_port, unavailable

from nodehealth.netcheck import agent, coordinator
from nodehealth.netcheck.admission import Admission
from nodehealth.netcheck.rounds import SOUND, UNREACHABLE, Netcheck
from nodehealth.netcheck.wire import CONNECT_TIMEOUT, StreamError, request


class Agents:
    """In-process agents on 127.0.0.<base + i>, one port for all, as on real nodes."""

    def __init__(self, count: int, base: int):
        self.port = free_port()
        self.agents: dict[str, agent.Agent] = {}
        for i in range(count):
            address = f"127.0.0.{base + i}"
            a = agent.Agent((address, self.port), agent.AgentConfig(f"n{i}", f"{address}:{self.port}"))
            a.start()
            self.agents[f"n{i}"] = a

    def endpoints(self) -> list[str]:
        return [f"{a.server_address[0]}:{self.port}" for a in self.agents.values()]

    def stop(self, name: str) -> None:
        self.agents.pop(name).close()

    def close(self) -> None:
        for name in list(self.agents):
            self.stop(name)


@pytest.fixture
def four():
    nodes = Agents(4, 71)
    yield nodes
    nodes.close()


def test_a_node_whose_agent_died_is_unreachable_not_faulty(four):
    """n3 answered hello, then its agent died: n2's stream to it is refused and the coordinator
    cannot ask it to send. It is unreachable, with the reason, and no one is faulty."""
    hosts, problems = coordinator.hello(four.endpoints(), timeout=5)
    assert problems == [] and len(hosts) == 4
    job = coordinator.Job.new()
    assert coordinator.claim(hosts, job, 60) == []
    four.stop("n3")
    nc = Netcheck([h.name for h in hosts], slow_fraction=0.01)  # loopback's rate is the loaded CPUs': not judged here
    coordinator.run_rounds(nc, {h.name: h for h in hosts}, 0.2, agent.TCP, job)
    result = nc.result()
    assert result.status == {"n0": SOUND, "n1": SOUND, "n2": SOUND, "n3": UNREACHABLE}, result.tests
    assert "refused" in result.unreachable["n3"] and "127.0.0.74" in result.unreachable["n3"]


def test_the_report_names_the_node_whose_agent_died_during_the_check(four, monkeypatch, capsys):
    """Through the coordinator's report: exit 1, the node's row says unreachable and why."""
    from nodehealth import config
    from nodehealth.netcheck import preflight

    claimed = coordinator.claim

    def claim_then_die(hosts, job, seconds):
        refused = claimed(hosts, job, seconds)
        four.stop("n3")
        return refused
    monkeypatch.setattr(coordinator, "claim", claim_then_die)
    cfg = dict(config.defaults()["netcheck"], seconds=0.2, slow_fraction=0.01)
    doc, code = preflight.coordinate(four.endpoints(), cfg, {})
    assert code == preflight.EXIT_FAULT and doc["faulty"] == [] and doc["slow"] == []
    assert doc["nodes"]["n3"]["status"] == "unreachable" and "refused" in doc["nodes"]["n3"]["error"]
    assert doc["unreachable"] == [{"agent": f"127.0.0.74:{four.port}", "node": "n3",
                                   "error": doc["nodes"]["n3"]["error"]}]
    table = preflight.table(doc)
    row = next(line for line in table.splitlines() if line.startswith("n3 "))
    assert "unreachable" in row and "does not answer" in row and "; unreachable: n3" in table


def serve(address: str, port: int, *extra: str, descriptors: int = 1024) -> subprocess.Popen:
    """`netcheck serve` as a daemon would run it, with a limit of `descriptors`."""
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    p = subprocess.Popen([sys.executable, "-m", "nodehealth.cli", "netcheck", "serve", "--listen", f"{address}:{port}",
                          "--name", address, "--method", "tcp", "--for", "120", *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    deadline = time.monotonic() + 30
    while True:
        try:
            request(f"{address}:{port}", {"op": "hello"}, 2)
            return p
        except StreamError:
            if time.monotonic() > deadline or p.poll() is not None:
                p.kill()
                raise


def test_two_thousand_idle_sinks_leave_the_coordinator_its_answer():
    """A stranger holds 2,000 connections to an agent (at 256 descriptors, to be quick), each a
    sink that receives nothing, reopening each one the agent drops: the coordinator still gets
    its answer every time. Sinks had no count and held a thread and a descriptor each for a
    minute, so the agent ran out and its listen queue of 5 stayed full."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2400:
        unavailable(f"the test needs 2400 descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port = free_port()
    victim = serve("127.0.0.81", port, descriptors=256)
    held: dict[socket.socket, bool] = {}  # -> whether its line went out
    stop = threading.Event()

    def hold():
        while not stop.is_set():  # bounded: until the coordinator's three hellos are done
            for s in [s for s in held if _closed(s)]:
                del held[s]
                s.close()
            while len(held) < 2000:
                s = socket.socket()
                s.setblocking(False)
                s.bind(("127.0.0.82", 0))
                s.connect_ex(("127.0.0.81", port))
                held[s] = False
            for s, sent in list(held.items()):
                if not sent and s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    try:
                        s.send(b'{"op": "sink", "seconds": 60}\n')
                        held[s] = True
                    except OSError:
                        pass  # still connecting
            stop.wait(0.2)
    attacker = threading.Thread(target=hold, daemon=True)
    try:
        attacker.start()
        deadline = time.monotonic() + 8  # the agent holds all it can take, or has held out this long
        while len(os.listdir(f"/proc/{victim.pid}/fd")) < 250 and time.monotonic() < deadline:
            time.sleep(0.1)
        answers = []
        for _ in range(3):
            time.sleep(1)
            try:
                answers.append(request(f"127.0.0.81:{port}", {"op": "hello"}, CONNECT_TIMEOUT * 2))
            except StreamError as e:
                answers.append(str(e))
        assert [a.get("name") if isinstance(a, dict) else a for a in answers] == ["127.0.0.81"] * 3
    finally:
        stop.set()
        attacker.join(10)
        for s in held:
            s.close()
        victim.terminate()
        victim.wait(10)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "Traceback" not in victim.stderr.read()


def _closed(s: socket.socket) -> bool:
    """Whether the agent closed it (or refused it); one still connecting is not."""
    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
        return True
    try:
        return s.recv(4096, socket.MSG_PEEK) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError as e:
        return e.errno != errno.ENOTCONN


class Counter:
    """A plain TCP listener that counts what it receives: the address a stranger wants flooded."""

    def __init__(self, address: str):
        self.sock = socket.create_server((address, 0))
        self.endpoint = f"{address}:{self.sock.getsockname()[1]}"
        self.received = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._count, args=(conn,), daemon=True).start()

    def _count(self, conn):
        with conn:
            conn.settimeout(10)
            try:
                while chunk := conn.recv(1 << 16):
                    self.received += len(chunk)
            except OSError:
                pass


def test_an_agent_relays_nothing_for_a_stranger():
    """Agents that take jobs from 127.0.0.90 only. A stranger (127.0.0.92) cannot make one send
    (440 bytes of such requests made an agent send 62 GB), claim it, or sink into the other; the
    coordinator cannot point one at an address outside the job; within the job the test runs."""
    coordinator, stranger = "127.0.0.90", "127.0.0.92"
    port = free_port()
    a = agent.Agent(("127.0.0.91", port), agent.AgentConfig("a", f"127.0.0.91:{port}"),
                    admission=Admission(coordinators=[coordinator]))
    b = agent.Agent(("127.0.0.93", port), agent.AgentConfig("b", f"127.0.0.93:{port}"),
                    admission=Admission(coordinators=[coordinator]))
    victim = Counter("127.0.0.94")
    a.start()
    b.start()
    A, B = f"127.0.0.91:{port}", f"127.0.0.93:{port}"
    try:
        asked = request(A, {"op": "send", "to": B, "seconds": 1}, 10, source=stranger)
        assert asked == {"error": "no job: a coordinator claims this agent first"}
        asked = request(A, {"op": "claim", "job": "j1", "members": ["127.0.0.92", "127.0.0.94"], "seconds": 60}, 5,
                        source=stranger)
        assert "takes jobs from 127.0.0.90 only" in asked["error"], asked
        job = {"op": "claim", "job": "j1", "members": ["127.0.0.91", "127.0.0.93"], "seconds": 60}
        assert request(A, job, 5, source=coordinator) == {"ok": True}
        assert request(B, job, 5, source=coordinator) == {"ok": True}
        busy = request(A, dict(job, job="j2"), 5, source=stranger)
        assert "error" in busy, busy  # one job at a time, and never the stranger's
        asked = request(A, {"op": "send", "job": "j1", "to": B, "seconds": 1}, 10, source=stranger)
        assert "not the coordinator" in asked["error"], asked
        asked = request(A, {"op": "send", "job": "j1", "to": victim.endpoint, "seconds": 1}, 10, source=coordinator)
        assert "not an agent of this job" in asked["error"], asked
        asked = request(B, {"op": "sink", "job": "j1", "seconds": 1}, 5, source=stranger)
        assert "not an agent of this job" in asked["error"], asked
        assert victim.received == 0
        sent = request(A, {"op": "send", "job": "j1", "to": B, "seconds": 0.3}, 10, source=coordinator)
        assert sent.get("gbps", 0) > 0, sent
        assert request(A, {"op": "release", "job": "j1"}, 5, source=coordinator) == {"ok": True}
        asked = request(A, {"op": "send", "job": "j1", "to": B, "seconds": 0.3}, 10, source=coordinator)
        assert "no job" in asked["error"], asked
    finally:
        a.close()
        b.close()
        victim.sock.close()


def test_admission_one_job_at_a_time_for_its_lease():
    adm = Admission(coordinators=["10.1.0.0/24"])
    assert adm.may_claim("10.1.0.7") and not adm.may_claim("10.2.0.7") and not adm.may_claim("not-an-address")
    job = {"job": "j1", "members": ["10.0.0.1", "10.0.0.2"], "seconds": 0.3}
    assert adm.claim("10.1.0.7", job) == {"ok": True}
    assert "busy: in a job of the coordinator at 10.1.0.7" in adm.claim("10.1.0.8", dict(job, job="j2"))["error"]
    assert adm.release("10.1.0.8", {"job": "j1"}) == {"error": "no job of this coordinator to release"}
    assert adm.may_send("10.1.0.7", {"job": "j1"}, "10.0.0.2") is None
    assert adm.member("::ffff:10.0.0.1", {"job": "j1"}) is None  # an IPv6 listener sees IPv4 peers so
    assert "seconds" in adm.claim("10.1.0.7", dict(job, seconds=1e9))["error"]  # a lease is capped
    assert adm.line_limit("10.1.0.7", 4096) > 4096 and adm.line_limit("10.2.0.7", 4096) == 4096
    time.sleep(0.4)  # the lease ran out: the job is over, another coordinator may claim
    assert adm.may_send("10.1.0.7", {"job": "j1"}, "10.0.0.2") == "no job: a coordinator claims this agent first"
    assert adm.claim("10.1.0.8", dict(job, job="j2")) == {"ok": True}
    assert Admission().may_claim("127.0.0.1") and not Admission().may_claim("192.0.2.1")  # this host's own only


def test_a_node_of_a_job_closes_a_strangers_connection_unread():
    """Where the job's hosts are known, a connection from any other address is closed at once:
    it costs the agent no line, no thread, no answer."""
    port = free_port()
    node = agent.Agent(("127.0.0.96", port), agent.AgentConfig("n", f"127.0.0.96:{port}"),
                       admission=Admission(coordinators=["127.0.0.95"], hosts={"127.0.0.95", "127.0.0.96"}))
    node.start()
    try:
        assert request(f"127.0.0.96:{port}", {"op": "hello"}, 5, source="127.0.0.95")["name"] == "n"
        with pytest.raises(StreamError, match="closed before a whole line|reset"):
            request(f"127.0.0.96:{port}", {"op": "hello"}, 5, source="127.0.0.97")
        assert node.listener.refused == 1
    finally:
        node.close()
