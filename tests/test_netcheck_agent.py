"""netcheck's agents on loopback (127.0.0.0/8): what the coordinator concludes when an agent dies,
and what an agent does for strangers (bounded loops, only loopback addresses)."""
from __future__ import annotations

import threading

import pytest
from conftest import free_port

from nodehealth.netcheck import agent
from nodehealth.netcheck.rounds import SOUND, UNREACHABLE, Netcheck


class Agents:
    """In-process agents on 127.0.0.<base + i>, one port for all, as on real nodes."""

    def __init__(self, count: int, base: int):
        self.port = free_port()
        self.agents: dict[str, agent.Agent] = {}
        for i in range(count):
            address = f"127.0.0.{base + i}"
            a = agent.Agent((address, self.port), agent.AgentConfig(f"n{i}", f"{address}:{self.port}"))
            threading.Thread(target=a.serve_forever, daemon=True).start()
            self.agents[f"n{i}"] = a

    def endpoints(self) -> list[str]:
        return [f"{a.server_address[0]}:{self.port}" for a in self.agents.values()]

    def stop(self, name: str) -> None:
        a = self.agents.pop(name)
        a.shutdown()
        a.server_close()

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
    hosts, problems = agent.hello(four.endpoints(), timeout=5)
    assert problems == [] and len(hosts) == 4
    four.stop("n3")
    nc = Netcheck([h.name for h in hosts], slow_fraction=0.01)  # loopback's rate is the loaded CPUs': not judged here
    agent.run_rounds(nc, {h.name: h for h in hosts}, 0.2)
    result = nc.result()
    assert result.status == {"n0": SOUND, "n1": SOUND, "n2": SOUND, "n3": UNREACHABLE}, result.tests
    assert "refused" in result.unreachable["n3"] and "127.0.0.74" in result.unreachable["n3"]


def test_the_report_names_the_node_whose_agent_died_during_the_check(four, monkeypatch, capsys):
    """Through the coordinator's report: exit 1, the node's row says unreachable and why."""
    from nodehealth import config
    from nodehealth.netcheck import preflight

    said_hello = agent.hello

    def hello_then_die(endpoints, timeout):
        answer = said_hello(endpoints, timeout)
        four.stop("n3")
        return answer
    monkeypatch.setattr(agent, "hello", hello_then_die)
    cfg = dict(config.defaults()["netcheck"], seconds=0.2, slow_fraction=0.01)
    doc, code = preflight.coordinate(four.endpoints(), cfg, {})
    assert code == preflight.EXIT_FAULT and doc["faulty"] == [] and doc["slow"] == []
    assert doc["nodes"]["n3"]["status"] == "unreachable" and "refused" in doc["nodes"]["n3"]["error"]
    assert doc["unreachable"] == [{"agent": four.endpoints()[0].replace("71", "74"), "node": "n3",
                                   "error": doc["nodes"]["n3"]["error"]}]
    table = preflight.table(doc)
    row = next(line for line in table.splitlines() if line.startswith("n3 "))
    assert "unreachable" in row and "does not answer" in row and "; unreachable: n3" in table
