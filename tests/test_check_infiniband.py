from dataclasses import replace

import pytest

from nodehealth.checks import infiniband as check
from nodehealth.collectors.infiniband import Device, InfiniBand, Port
from nodehealth.model import Action, Observed, Severity

FATAL, DEGRADED, WARNING, INFO, UNKNOWN = (Severity.FATAL, Severity.DEGRADED, Severity.WARNING, Severity.INFO,
                                           Severity.UNKNOWN)


def port(device="mlx5_0", number=1, state=(4, "ACTIVE"), phys=(5, "LinkUp"), rate=(400.0, "4X NDR"),
         link_layer="InfiniBand"):
    return Port(device=device, port=number, state_id=state[0], state=state[1], phys_state_id=phys[0],
                phys_state=phys[1], rate_gbps=rate[0], rate_text=rate[1], link_layer=link_layer,
                counters={}, counters_ext={}, hw_counters={})


def node(*ports):
    """An 8-rail NDR node plus a RoCE bond, with `ports` replacing the ones of the same name."""
    by_name = {p.name: p for p in [port(f"mlx5_{i}") for i in range(8)]
               + [port("mlx5_bond_0", rate=(200.0, "2X NDR"), link_layer="Ethernet")]}
    by_name.update({p.name: p for p in ports})
    devices = {}
    for p in by_name.values():
        devices.setdefault(p.device, []).append(p)
    return InfiniBand(tuple(Device(name, "28.41.1000", "MT_0000000838", "MT4129", None, tuple(ps))
                            for name, ps in sorted(devices.items())))


def judge(facts, rates=None, **cfg):
    obs = Observed({"infiniband": facts}, {"infiniband": rates} if rates is not None else {})
    return check.judge(obs, dict(check.DEFAULTS, **cfg))


def summary(findings):
    return [(f.reason, f.severity, f.device) for f in findings]


DOWN_POLLING = dict(state=(1, "DOWN"), phys=(2, "Polling"))
DISABLED = dict(state=(1, "DOWN"), phys=(3, "Disabled"))

STATE_CASES = [
    # (name, replaced ports, config, expected)
    ("all rails up", [], {}, []),
    ("an InfiniBand rail down", [port("mlx5_3", **DOWN_POLLING)], {}, [("PortDown", FATAL, "mlx5_3:1")]),
    ("the RoCE bond down", [port("mlx5_bond_0", link_layer="Ethernet", **DOWN_POLLING)], {},
     [("PortDown", DEGRADED, "mlx5_bond_0:1")]),
    ("a required RoCE port down", [port("mlx5_bond_0", link_layer="Ethernet", **DOWN_POLLING)],
     {"required_ports": ["mlx5_bond_0"]}, [("PortDown", FATAL, "mlx5_bond_0:1")]),
    ("link up but no subnet manager", [port("mlx5_2", state=(2, "INIT"))], {}, [("PortDown", FATAL, "mlx5_2:1")]),
    ("a disabled port is info", [port("mlx5_0", 2, **DISABLED)], {}, [("PortDisabled", INFO, "mlx5_0:2")]),
    ("a required disabled port is down", [port("mlx5_0", 2, **DISABLED)], {"required_ports": ["mlx5_0:2"]},
     [("PortDown", FATAL, "mlx5_0:2")]),
    ("an uncabled second port ignored by name", [port("mlx5_0", 2, **DOWN_POLLING)],
     {"ignore_ports": ["mlx5_0:2"]}, []),
    ("a whole device ignored", [port("mlx5_7", **DOWN_POLLING)], {"ignore_ports": ["mlx5_7"]}, []),
    ("ignoring one port keeps the other", [port("mlx5_0", 2, **DOWN_POLLING), port("mlx5_1", **DOWN_POLLING)],
     {"ignore_ports": ["mlx5_0:2"]}, [("PortDown", FATAL, "mlx5_1:1")]),
    ("a required device that is missing", [], {"required_ports": ["mlx5_9", "mlx5_0:1"]},
     [("PortMissing", FATAL, "mlx5_9")]),
    ("a required port that is missing", [], {"required_ports": ["mlx5_0:2"]}, [("PortMissing", FATAL, "mlx5_0:2")]),
    ("an unreadable state", [port("mlx5_4", state=(None, None))], {}, [("PortStateUnknown", UNKNOWN, "mlx5_4:1")]),
]


@pytest.mark.parametrize("name, ports, cfg, expected", STATE_CASES, ids=[c[0] for c in STATE_CASES])
def test_state_rules(name, ports, cfg, expected):
    assert summary(judge(node(*ports), **cfg)) == expected


def test_port_down_message_and_no_sticky_action():
    (f,) = judge(node(port("mlx5_3", **DOWN_POLLING)))
    assert f.message.startswith("mlx5_3:1 (InfiniBand) is DOWN with physical state Polling:")
    assert "cable" in f.message and f.action is Action.NONE  # clears when the port comes back
    (f,) = judge(node(port("mlx5_2", state=(2, "INIT"))))
    assert "subnet manager" in f.message


RATE_CASES = [
    ("one NDR rail trained to HDR", [port("mlx5_5", rate=(200.0, "4X HDR"))], {},
     [("PortRateDegraded", DEGRADED, "mlx5_5:1")]),
    ("one rail trained to fewer lanes", [port("mlx5_5", rate=(100.0, "1X NDR"))], {},
     [("PortRateDegraded", DEGRADED, "mlx5_5:1")]),
    ("the RoCE bond is compared with Ethernet ports only", [], {}, []),
    ("an expected rate catches a node where every rail is slow",
     [port(f"mlx5_{i}", rate=(200.0, "4X HDR")) for i in range(8)], {"expected_rate_gbps": {"InfiniBand": 400}},
     [("PortRateDegraded", DEGRADED, f"mlx5_{i}:1") for i in range(8)]),
    ("without it, a uniformly slow node looks uniform",
     [port(f"mlx5_{i}", rate=(200.0, "4X HDR")) for i in range(8)], {}, []),
    ("an expected Ethernet rate", [], {"expected_rate_gbps": {"Ethernet": 400}},
     [("PortRateDegraded", DEGRADED, "mlx5_bond_0:1")]),
    ("a down port's rate is not judged", [port("mlx5_5", rate=(10.0, "4X"), **DOWN_POLLING)], {},
     [("PortDown", FATAL, "mlx5_5:1")]),
    ("an ignored port's rate does not set the bar",
     [port("mlx5_9", rate=(800.0, "4X XDR"))], {"ignore_ports": ["mlx5_9"]}, []),
]


@pytest.mark.parametrize("name, ports, cfg, expected", RATE_CASES, ids=[c[0] for c in RATE_CASES])
def test_rate_rules(name, ports, cfg, expected):
    assert summary(judge(node(*ports), **cfg)) == expected


def test_rate_message():
    (f,) = judge(node(port("mlx5_5", rate=(200.0, "4X HDR"))))
    assert f.message.startswith("mlx5_5:1 runs at 200 Gb/s (4X HDR) instead of 400 Gb/s")
    assert "50%" in f.message and f.action is Action.HW_INSPECTION


def key(name, port_name="mlx5_2:1"):
    return f"{port_name}:{name}"


COUNTER_CASES = [
    # (name, rates of mlx5_2:1 per second, expected)
    ("quiet counters", {key("symbol_error"): 0.0, key("link_downed"): 0.0}, []),
    ("link went down", {key("link_downed"): 1 / 30}, [("LinkDowned", DEGRADED)]),
    ("buffer overrun", {key("excessive_buffer_overrun_errors"): 1 / 30}, [("ExcessiveBufferOverrun", DEGRADED)]),
    ("link integrity", {key("local_link_integrity_errors"): 1 / 30}, [("LocalLinkIntegrityErrors", DEGRADED)]),
    ("symbol errors at 121 per hour", {key("symbol_error"): 121 / 3600}, [("SymbolErrors", DEGRADED)]),
    ("symbol errors at 119 per hour", {key("symbol_error"): 119 / 3600}, []),
    ("6 recoveries per minute", {key("link_error_recovery"): 6 / 60}, [("LinkErrorRecovery", WARNING)]),
    ("4 recoveries per minute", {key("link_error_recovery"): 4 / 60}, []),
    ("11 receive errors per second", {key("port_rcv_errors"): 11.0}, [("ReceiveErrors", WARNING)]),
    ("9 receive errors per second", {key("port_rcv_errors"): 9.0}, []),
    ("101 transmit discards per second", {key("port_xmit_discards"): 101.0}, [("TransmitDiscards", WARNING)]),
    ("99 transmit discards per second", {key("port_xmit_discards"): 99.0}, []),
    ("2 ack timeouts per second", {key("hw_counters/local_ack_timeout_err"): 2.0}, [("LocalAckTimeouts", WARNING)]),
    ("a counters/ name is not a hw counter", {key("local_ack_timeout_err"): 2.0}, []),
    ("rnr retries are the peer application's", {key("hw_counters/rnr_nak_retry_err"): 5.0}, []),
    ("traffic is not an error", {key("transmitted_bytes"): 4.6e10, key("port_xmit_wait"): 1e6}, []),
    ("several at once", {key("link_downed"): 0.1, key("symbol_error"): 1.0, key("port_rcv_errors"): 20.0},
     [("LinkDowned", DEGRADED), ("SymbolErrors", DEGRADED), ("ReceiveErrors", WARNING)]),
]


@pytest.mark.parametrize("name, rates, expected", COUNTER_CASES, ids=[c[0] for c in COUNTER_CASES])
def test_counter_rules(name, rates, expected):
    findings = judge(node(), rates)
    assert [(f.reason, f.severity) for f in findings] == expected
    assert all(f.device == "mlx5_2:1" and f.action is Action.HW_INSPECTION for f in findings)


def test_first_pass_has_no_rates_and_no_counter_findings():
    facts = node(replace(port("mlx5_2"), counters={"link_downed": 7, "symbol_error": 10**6}))
    assert judge(facts) == []
    assert judge(facts, rates={}) == []


def test_ignored_ports_counters_are_not_judged():
    rates = {key("link_downed"): 1.0}
    assert judge(node(), rates, ignore_ports=["mlx5_2"]) == []


def test_counter_message_has_the_rate():
    (f,) = judge(node(), {key("symbol_error"): 1.0})
    assert f.message.startswith("mlx5_2:1 sees 3.6e+03 symbol errors per hour, above 120")
    assert f.evidence == {"counter": "symbol_error", "per_second": 1.0}


def test_thresholds_are_configurable():
    rates = {key("port_rcv_errors"): 3.0}
    assert judge(node(), rates) == []
    assert summary(judge(node(), rates, receive_errors_per_second=2.0)) == [("ReceiveErrors", WARNING, "mlx5_2:1")]


def test_module_contract():
    assert check.NAME == "infiniband" and check.NEEDS == ("infiniband",) and check.DEBOUNCE is True


def mixed_node(storage_model=("MT4123", "MT_0000000223")):
    """Eight CX-7 NDR rails and a CX-6 HDR card for storage, all InfiniBand."""
    rails = node()
    storage = Device("mlx5_8", "20.39.1002", storage_model[1], storage_model[0], None,
                     (port("mlx5_8", rate=(200.0, "4X HDR")),))
    return InfiniBand(rails.devices + (storage,))


def test_rates_are_compared_only_within_one_hca_model_and_link_layer():
    assert judge(mixed_node()) == []  # a CX-6 at HDR is not a CX-7 that trained down
    assert judge(mixed_node(storage_model=(None, None))) == []  # unknown model: compared with itself only
    slow = replace(mixed_node(), devices=mixed_node().devices[:2] + (
        replace(mixed_node().devices[2], ports=(port("mlx5_2", rate=(200.0, "4X HDR")),)),) + mixed_node().devices[3:])
    assert summary(judge(slow)) == [("PortRateDegraded", DEGRADED, "mlx5_2:1")]


@pytest.mark.parametrize("expected", [{"mlx5_8": 400}, {"mlx5_8:1": 400}, {"InfiniBand": 400}])
def test_a_configured_expectation_per_port_device_or_layer(expected):
    assert summary(judge(mixed_node(), expected_rate_gbps=expected)) == [("PortRateDegraded", DEGRADED, "mlx5_8:1")]



def test_the_most_specific_expectation_wins():
    assert judge(mixed_node(), expected_rate_gbps={"InfiniBand": 400, "mlx5_8": 200}) == []
    assert judge(mixed_node(), expected_rate_gbps={"mlx5_8": 400, "mlx5_8:1": 200}) == []
