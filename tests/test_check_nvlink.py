"""nvlink (link state and speed, judged at once) and nvlink_errors (error rates, debounced)."""
from __future__ import annotations

import pytest

from nodehealth.checks import nvlink as check
from nodehealth.checks import nvlink_errors as errors
from nodehealth.collectors.gpu_facts import Gpu, NvLink, NvmlFacts
from nodehealth.model import Action, Observed, Severity

BUS = "0000:19:00.0"
UUID = "GPU-8f3c"
H100 = "NVIDIA H100 80GB HBM3"
FATAL, DEGRADED, WARNING, UNKNOWN = Severity.FATAL, Severity.DEGRADED, Severity.WARNING, Severity.UNKNOWN


def links(count=18, speed=26562, down=(), unread=(), slow=None) -> tuple[NvLink, ...]:
    """`count` links, all up at `speed` except those named; `slow` maps a link to its speed."""
    out = []
    for n in range(count):
        active = None if n in unread else n not in down
        out.append(NvLink(n, active, speed_mbps=(slow or {}).get(n, speed if active else 0)))
    return tuple(out)


def gpu(name=H100, nvlinks=None, **fields) -> Gpu:
    base = dict(index=0, uuid=UUID, name=name, pci_bus_id=BUS, mig_enabled=False,
                nvlinks=links() if nvlinks is None else nvlinks)
    base.update(fields)
    return Gpu(**base)


def observe(*gpus, rates=None) -> Observed:
    facts = NvmlFacts("test", "535.154.05", "12.2", len(gpus), tuple(gpus))
    return Observed({"nvml": facts}, {"nvml": rates} if rates is not None else {})


def judge(*gpus, **cfg):
    return check.judge(observe(*gpus), dict(check.DEFAULTS, **cfg))


def judge_errors(*gpus, rates=None, **cfg):
    return errors.judge(observe(*gpus, rates=rates), dict(errors.DEFAULTS, **cfg))


def summary(findings):
    return [(f.reason, f.severity, f.action) for f in findings]


DOWN = [("NvLinkDown", FATAL, Action.RESET_GPU)]
SLOW = [("NvLinkSpeedDegraded", DEGRADED, Action.RESET_GPU)]

STATE_CASES = [
    # (name, gpu, expected)
    ("H100 SXM, 18 links up", gpu(), []),
    ("A100 SXM4, 12 links at 25 GB/s", gpu("NVIDIA A100-SXM4-80GB", links(12, 25000)), []),
    ("H800, 8 links", gpu("NVIDIA H800", links(8)), []),
    ("B200, 18 links at 53.125 GB/s", gpu("NVIDIA B200", links(18, 53125)), []),
    ("one link down", gpu(nvlinks=links(down=(5,))), DOWN),
    ("every link down (gpud#1085)", gpu("NVIDIA B200", links(18, 53125, down=range(18))), DOWN),
    ("NVML listed only 12 of 18 links", gpu(nvlinks=links(12)), DOWN),
    ("one link down and two without a state: too few either way", gpu(nvlinks=links(unread=(3, 4), down=(9,))), DOWN),
    ("one link without a state, the rest up", gpu(nvlinks=links(unread=(3,))),
     [("NvLinkStateUnknown", UNKNOWN, Action.NONE)]),
    ("links down in MIG mode are ignored, as DCGM does", gpu(nvlinks=links(down=range(18)), mig_enabled=True), []),
    ("MIG mode unknown: judged", gpu(nvlinks=links(down=(0,)), mig_enabled=None), DOWN),
    ("H100 NVL bridge links down: a PCIe card, skipped", gpu("NVIDIA H100 NVL", links(4, down=range(4))), []),
    ("H100 PCIe without links", gpu("NVIDIA H100 PCIe", links(18, down=range(18))), []),
    ("A100 PCIe", gpu("NVIDIA A100-PCIE-40GB", links(12, down=range(12))), []),
    ("unknown product: nothing expected", gpu("NVIDIA GeForce RTX 4090", links(4, down=range(4))), []),
    ("no product name", gpu(None, links(4, down=range(4))), []),
    ("no link facts", gpu(nvlinks=()), []),
    ("degraded H200 links at 1.0 and 1.562 GB/s", gpu("NVIDIA H200", links(slow={2: 1000, 7: 1562})), SLOW),
    ("just under 98% of 26562", gpu(nvlinks=links(slow={0: 26000})), SLOW),
    ("just over 98% of 26562", gpu(nvlinks=links(slow={0: 26100})), []),
    ("speed unknown", gpu(nvlinks=links(speed=None)), []),
    ("a down link's speed is not judged", gpu(nvlinks=links(down=(1,), slow={1: 0})), DOWN),
    ("slow in MIG mode is still slow", gpu(nvlinks=links(slow={0: 1000}), mig_enabled=True), SLOW),
    ("V100: speed not verified, not judged", gpu("Tesla V100-SXM2-16GB", links(6, speed=1000)), []),
    ("NVLink facts did not answer", gpu(nvlinks=(), unknown={"nvlink": "Timeout"}),
     [("GpuFactsUnknown", UNKNOWN, Action.NONE)]),
    ("the GPU did not answer at all", Gpu(index=0, unknown={"all": "NVML did not answer within 5s"}),
     [("GpuFactsUnknown", UNKNOWN, Action.NONE)]),
    ("no name, identity unknown: no SKU to judge by", gpu(None, unknown={"identity": "Unknown"}),
     [("GpuFactsUnknown", UNKNOWN, Action.NONE)]),
    ("identity partly unknown but the name is known", gpu(unknown={"identity": "Unknown"}), []),
]


@pytest.mark.parametrize("name, g, expected", STATE_CASES, ids=[c[0] for c in STATE_CASES])
def test_state_rules(name, g, expected):
    assert summary(judge(g)) == expected


def test_down_message_counts_and_names_the_links():
    (f,) = judge(gpu(nvlinks=links(down=(5, 11))))
    assert f.device == BUS
    assert f.message.startswith(f"GPU 0 ({BUS}) has 16 of 18 NVLinks active (H100 SXM5; down: links 5, 11)")
    assert f.evidence["down"] == [5, 11] and f.evidence["expected"] == 18


def test_slow_message_gives_the_speeds():
    (f,) = judge(gpu("NVIDIA H200", links(slow={2: 1000, 7: 1562})))
    assert "2 NVLink(s) trained below the 26.562 GB/s a H200 SXM link runs at" in f.message
    assert "link 2 at 1 GB/s, link 7 at 1.56 GB/s" in f.message
    assert f.evidence["slow_links"] == {"2": 1000, "7": 1562}


def test_expected_links_setting_overrides_the_table():
    board = gpu(nvlinks=links(down=(16, 17)))
    assert summary(judge(board)) == DOWN
    assert judge(board, expected_links=16) == []


def test_state_check_is_not_debounced_and_errors_are():
    assert check.DEBOUNCE is False and errors.DEBOUNCE is True
    assert check.NEEDS == errors.NEEDS == ("nvml",)


def key(link, counter, uuid=UUID):
    return f"{uuid}:nvlink{link}:{counter}"


CRC_HIGH = ("NvLinkCrcErrorRateHigh", FATAL, Action.HW_INSPECTION)
CRC = ("NvLinkCrcErrors", WARNING, Action.HW_INSPECTION)
REPLAYS = ("NvLinkReplays", WARNING, Action.HW_INSPECTION)
RECOVERIES = ("NvLinkRecoveries", WARNING, Action.HW_INSPECTION)

ERROR_CASES = [
    # (name, gpu, rates, expected)
    ("first pass: no rates", gpu(), None, []),
    ("no errors", gpu(), {key(0, "crc_flit"): 0.0, key(0, "replay"): 0.0, key(0, "recovery"): 0.0}, []),
    ("CRC flit at DCGM's 100/s", gpu(), {key(3, "crc_flit"): 100.0}, [CRC_HIGH]),
    ("CRC data above 100/s", gpu(), {key(3, "crc_data"): 150.0}, [CRC_HIGH]),
    ("CRC just under 100/s", gpu(), {key(3, "crc_flit"): 99.9}, [CRC]),
    ("a few CRC errors", gpu(), {key(3, "crc_flit"): 0.01}, [CRC]),
    ("one link high, another low", gpu(), {key(0, "crc_flit"): 150.0, key(1, "crc_data"): 2.0}, [CRC_HIGH, CRC]),
    ("replays", gpu(), {key(0, "replay"): 0.05}, [REPLAYS]),
    ("recoveries", gpu(), {key(0, "recovery"): 1 / 60}, [RECOVERIES]),
    ("a PCIe card's bridge link errs: judged", gpu("NVIDIA H100 NVL", links(4)), {key(0, "crc_flit"): 5.0}, [CRC]),
    ("rates of links NVML did not list are ignored", gpu(nvlinks=links(2)), {key(9, "crc_flit"): 500.0}, []),
    ("no uuid: keyed by index", Gpu(index=4, pci_bus_id=BUS, nvlinks=links(2)), {"4:nvlink1:replay": 1.0}, [REPLAYS]),
]


@pytest.mark.parametrize("name, g, rates, expected", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_error_rules(name, g, rates, expected):
    assert summary(judge_errors(g, rates=rates)) == expected


def test_error_messages_name_links_and_rates():
    high, low = judge_errors(gpu(), rates={key(0, "crc_flit"): 150.0, key(4, "crc_data"): 2.0})
    assert high.message.startswith(f"GPU 0 ({BUS}) has NVLink CRC errors at 150/s on link 0 (limit 100/s)")
    assert high.evidence == {"crc_per_second": {"0": 150.0}, "limit": 100.0}
    assert "2/s on link 4" in low.message and high.device == low.device == BUS
    (replays,) = judge_errors(gpu(), rates={key(2, "replay"): 0.5})
    assert "NVLink replays at 30/min on link 2" in replays.message


def test_crc_limit_is_a_setting():
    rates = {key(0, "crc_flit"): 150.0}
    assert summary(judge_errors(gpu(), rates=rates, crc_errors_per_second=200.0)) == [CRC]
