"""The rdma_bw check on runs fed in: results and errors as the VM tier recorded them from real
tests on Soft-RoCE (tests/fixtures/rdma/vm-runs.json), line rates of real HCA models."""
from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from nodehealth.checks import rdma_bw as check
from nodehealth.collectors.infiniband import Device, InfiniBand, Port
from nodehealth.collectors.rdma_bw import RdmaBw, Run
from nodehealth.model import Action, Observed, Severity

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "fixtures", "rdma", "vm-runs.json")) as f:
    VM = json.load(f)
RESULT = VM["client_result"]  # a real rdma-bw client result on rxe0 in the VM tier
FATAL, DEGRADED, UNKNOWN = Severity.FATAL, Severity.DEGRADED, Severity.UNKNOWN


def ok(bw, device="mlx5_0", peer="b", t=0.0):
    return Run(device, 1, peer, t, "ok", None, RESULT["size"], RESULT["seconds"], bw, bw * 1.01,
               RESULT["msg_rate_mpps"])


def failed(stage, error, device="mlx5_0", peer="b", t=0.0):
    return Run(device, 1, peer, t, stage, error, RESULT["size"])


def hca(name="mlx5_0", rate=(400.0, "4X NDR"), model=("MT4129", "MT_0000000838"), link_layer="InfiniBand"):
    port = Port(name, 1, 4, "ACTIVE", 5, "LinkUp", rate[0], rate[1], link_layer, {}, {}, {})
    return Device(name, "28.41.1000", model[1], model[0], None, (port,))


def rxe():
    """rxe0 as the VM's sysfs shows it (tests/fixtures/rdma/vm-runs.json: rxe0_sysfs)."""
    sysfs = VM["rxe0_sysfs"]
    rate = float(sysfs["ports/1/rate"].split()[0])
    port = Port("rxe0", 1, 4, "ACTIVE", 5, "LinkUp", rate, None, sysfs["ports/1/link_layer"], {}, {}, {})
    return Device("rxe0", sysfs.get("fw_ver"), sysfs.get("board_id"), sysfs.get("hca_type"), None, (port,))


def judge(runs, devices=(), rails=("mlx5_0:1",), error=None, **cfg):
    facts = RdmaBw(tuple(rails), tuple(sorted(runs, key=lambda r: r.time)), error=error)
    obs = Observed({"rdma_bw": facts, "infiniband": InfiniBand(tuple(devices) or (hca(),))})
    return check.judge(obs, dict(check.DEFAULTS, **cfg))


def summary(findings):
    return [(f.reason, f.severity, f.device) for f in findings]


NDR, HDR = 400.0, 200.0


@pytest.mark.parametrize("name, runs, devices, cfg, expected", [
    ("nothing ran: no verdict", [], (), {}, []),
    ("a healthy NDR rail (392 Gb/s, domain/network.md)", [ok(392.3, t=1), ok(391.0, t=2)], (), {}, []),
    ("one slow test is not yet a finding", [ok(392.3, t=1), ok(300.0, t=2)], (), {}, []),
    ("two slow tests in a row", [ok(300.0, t=1), ok(310.0, t=2)], (), {},
     [("RdmaBandwidthLow", DEGRADED, "mlx5_0:1")]),
    ("slow, then healthy again", [ok(300.0, t=1), ok(310.0, t=2), ok(395.0, t=3)], (), {}, []),
    ("an HDR rail is held to 200, not to the NDR rails' 400", [ok(196.5, t=1), ok(196.0, t=2)],
     (hca(rate=(HDR, "4X HDR"), model=("MT4123", "MT_0000000223")),), {}, []),
    ("the same HDR rail below 90 % of 200", [ok(150.0, t=1), ok(151.0, t=2)],
     (hca(rate=(HDR, "4X HDR"), model=("MT4123", "MT_0000000223")),), {},
     [("RdmaBandwidthLow", DEGRADED, "mlx5_0:1")]),
    ("min_fraction is configurable", [ok(300.0, t=1), ok(310.0, t=2)], (), {"min_fraction": 0.7}, []),
    ("low_runs is configurable", [ok(300.0, t=1)], (), {"low_runs": 1}, [("RdmaBandwidthLow", DEGRADED, "mlx5_0:1")]),
    ("the expectation configured for the HCA model wins over the line rate",
     [ok(300.0, t=1), ok(310.0, t=2)], (), {"expected_gbps": {"MT4129": 320}}, []),
])
def test_bandwidth_rules(name, runs, devices, cfg, expected):
    assert summary(judge(runs, devices, **cfg)) == expected


def test_soft_roce_is_judged_only_against_a_configured_rate():
    bw = RESULT["bw_avg_gbps"]
    runs = [ok(bw, "rxe0", t=1), ok(bw, "rxe0", t=2)]
    assert judge(runs, (rxe(),), rails=("rxe0:1",)) == []  # no model, no line rate to hold it to
    found = judge(runs, (rxe(),), rails=("rxe0:1",), expected_gbps={"rxe0": 1000})
    assert summary(found) == [("RdmaBandwidthLow", DEGRADED, "rxe0:1")]
    assert "configured for rxe0" in found[0].message and found[0].action is Action.HW_INSPECTION


def test_the_message_says_whose_rail_until_peers_agree():
    one = judge([ok(300.0, peer="b", t=1), ok(310.0, peer="b", t=2)])[0]
    assert "this rail or b's is slow" in one.message and "below 90% of 400 Gb/s" in one.message
    assert "300, 310 Gb/s" in one.message and one.evidence["expected_gbps"] == 400.0
    two = judge([ok(300.0, peer="b", t=1), ok(310.0, peer="c", t=2)])[0]
    assert "this rail is slow" in two.message and two.evidence["peers"] == ["b", "c"]


@pytest.mark.parametrize("stage, key, reason", [
    ("preflight", "memlock", "RdmaBwNotRun"),
    ("preflight", "wronggid", "RdmaBwNotRun"),
    ("preflight", "portdown", "RdmaBwNotRun"),
    ("peer", "unreachable", "RdmaBwPeerUnavailable"),
])
def test_a_test_that_could_not_run_is_unknown_and_names_why(stage, key, reason):
    error = VM["errors"][key]
    found = judge([ok(392.0, t=1), failed(stage, error, t=2)])
    assert summary(found) == [(reason, UNKNOWN, "mlx5_0:1")]
    assert error in found[0].message


def test_failed_writes_are_degraded_against_one_peer_and_fatal_against_two():
    error = VM["errors"]["killed"]
    one = judge([failed("transfer", error, peer="b", t=1), failed("transfer", error, peer="b", t=2)])
    assert summary(one) == [("RdmaWriteFailed", DEGRADED, "mlx5_0:1")]
    assert "this rail or the peer's" in one[0].message and error in one[0].message
    two = judge([failed("transfer", error, peer="b", t=1), failed("transfer", error, peer="c", t=2)])
    assert summary(two) == [("RdmaWriteFailed", FATAL, "mlx5_0:1")]
    assert "2 different peers in a row (b, c)" in two[0].message
    recovered = judge([failed("transfer", error, peer="b", t=1), ok(392.0, peer="c", t=2),
                       failed("transfer", error, peer="d", t=3)])
    assert summary(recovered) == [("RdmaWriteFailed", DEGRADED, "mlx5_0:1")]  # not in a row


def test_a_peer_that_did_not_take_the_test_does_not_break_a_streak():
    """rounds() records a busy peer's refusal and tests the next peer in the same round: the rail's
    runs in a row are the measured ones around it."""
    busy = failed("peer", VM["errors"]["unreachable"], peer="x", t=2)
    slow = judge([ok(120.0, peer="b", t=1), busy, ok(118.0, peer="c", t=3)], devices=(hca(),))
    assert summary(slow) == [("RdmaBandwidthLow", DEGRADED, "mlx5_0:1")]
    error = VM["errors"]["killed"]
    broken = judge([failed("transfer", error, peer="b", t=1), busy, failed("transfer", error, peer="c", t=3)])
    assert summary(broken) == [("RdmaWriteFailed", FATAL, "mlx5_0:1")]


def test_each_rail_is_judged_on_its_own_runs():
    devices = (hca("mlx5_0"), hca("mlx5_1"))
    runs = [ok(300.0, "mlx5_0", t=1), ok(392.0, "mlx5_1", t=2), ok(301.0, "mlx5_0", t=3), ok(393.0, "mlx5_1", t=4)]
    assert summary(judge(runs, devices, rails=("mlx5_0:1", "mlx5_1:1"))) == [
        ("RdmaBandwidthLow", DEGRADED, "mlx5_0:1")]


def test_no_rail_to_test_is_unknown_not_healthy():
    found = judge([], rails=(), error="no RDMA device with an ACTIVE port to test (/sys/class/infiniband)")
    assert summary(found) == [("RdmaBwNotRun", UNKNOWN, "")]


def test_a_rail_whose_device_vanished_keeps_its_runs_but_has_no_line_rate():
    runs = [ok(10.0, t=1), ok(10.0, t=2)]
    assert judge(runs, (replace(hca(), name="mlx5_9"),)) == []


def test_module_contract():
    assert check.NAME == "rdma_bw" and check.NEEDS == ("rdma_bw",) and not getattr(check, "DEBOUNCE", False)


def test_check_with_only_this_check_says_the_daemon_runs_it():
    from nodehealth.node_pass import nothing_checked

    found = nothing_checked([check], {})
    assert found.reason == "NothingChecked" and "rdma_bw: only the daemon runs it" in found.message
