from __future__ import annotations

import pytest

from nodehealth.checks import gpu_pcie as check
from nodehealth.collectors.gpu_facts import Gpu, NvmlFacts, Pcie
from nodehealth.model import Action, Observed, Severity

BUS = "0000:19:00.0"
UUID = "GPU-8f3c"
H100 = "NVIDIA H100 80GB HBM3"
DEGRADED, UNKNOWN = Severity.DEGRADED, Severity.UNKNOWN
GEN5_X16 = dict(current_gen=5, max_gen=5, current_width=16, max_width=16)


def gpu(name=H100, utilization=90.0, **link) -> Gpu:
    return Gpu(index=0, uuid=UUID, name=name, pci_bus_id=BUS, utilization_gpu_percent=utilization,
               pcie=Pcie(**dict(GEN5_X16, **link)))


def judge(*gpus, rates=None, **cfg):
    facts = NvmlFacts("test", "535.154.05", "12.2", len(gpus), tuple(gpus))
    obs = Observed({"nvml": facts}, {"nvml": rates} if rates is not None else {})
    return check.judge(obs, dict(check.DEFAULTS, **cfg))


def summary(findings):
    return [(f.reason, f.severity) for f in findings]


REPLAY = f"{UUID}:pcie_replay"
WIDTH = [("GpuPcieWidthDegraded", DEGRADED)]
GEN = [("GpuPcieGenDegraded", DEGRADED)]
SKU = [("GpuPcieBelowSku", DEGRADED)]
REPLAYS = [("GpuPcieReplays", DEGRADED)]

CASES = [
    # (name, gpu, rates, expected)
    ("H100 at Gen5 x16 under load", gpu(), None, []),
    ("no PCIe facts", Gpu(index=0, pci_bus_id=BUS, name=H100), None, []),
    ("nothing known", gpu(current_gen=None, max_gen=None, current_width=None, max_width=None), None, []),
    ("idle GPU at Gen1: saving power", gpu(utilization=0.0, current_gen=1), None, []),
    ("Gen1 at 29.9% busy", gpu(utilization=29.9, current_gen=1), None, []),
    ("Gen1 at 30% busy", gpu(utilization=30.0, current_gen=1), None, GEN),
    ("Gen4 of Gen5 under load", gpu(current_gen=4), None, GEN),
    ("low generation, utilization unknown", gpu(utilization=None, current_gen=1), None, []),
    ("x8 of x16 at idle: a lane fault all the same", gpu(utilization=0.0, current_width=8), None, WIDTH),
    ("x8 of x16 and Gen3 under load", gpu(current_width=8, current_gen=3), None, WIDTH + GEN),
    ("H100 whose slot tops out at Gen4", gpu(current_gen=4, max_gen=4), None, SKU),
    ("H100 in an x8 slot", gpu(current_width=8, max_width=8), None, SKU),
    ("A100 at Gen4 x16 is what it should be", gpu("NVIDIA A100-SXM4-80GB", current_gen=4, max_gen=4), None, []),
    ("A100 in a Gen3 slot", gpu("NVIDIA A100-SXM4-80GB", current_gen=3, max_gen=3), None, SKU),
    ("GH200 on NVLink-C2C shows Gen4 x1: nothing expected",
     gpu("NVIDIA GH200 480GB", current_gen=4, max_gen=4, current_width=1, max_width=1), None, []),
    ("unknown product in a Gen3 slot", gpu("NVIDIA A10", current_gen=3, max_gen=3), None, []),
    # Gen5 x16 at BER 1e-12 allows ceil(30.72) = 31 replays per minute, Gen4 x16 ceil(15.36) = 16.
    ("31 replays per minute at Gen5 x16", gpu(), {REPLAY: 31 / 60}, []),
    ("32 replays per minute at Gen5 x16", gpu(), {REPLAY: 32 / 60}, REPLAYS),
    ("17 replays per minute at Gen4 x16", gpu("NVIDIA A100-SXM4-80GB", current_gen=4, max_gen=4),
     {REPLAY: 17 / 60}, REPLAYS),
    ("16 replays per minute at Gen4 x16", gpu("NVIDIA A100-SXM4-80GB", current_gen=4, max_gen=4),
     {REPLAY: 16 / 60}, []),
    ("replays, first pass: no rate", gpu(), None, []),
    ("replays on an unknown link", gpu(current_gen=None, max_gen=None), {REPLAY: 100.0}, []),
    ("PCIe facts did not answer", Gpu(index=0, pci_bus_id=BUS, name=H100, unknown={"pcie": "Timeout"}), None,
     [("GpuFactsUnknown", UNKNOWN)]),
]


@pytest.mark.parametrize("name, g, rates, expected", CASES, ids=[c[0] for c in CASES])
def test_rules(name, g, rates, expected):
    assert summary(judge(g, rates=rates)) == expected


def test_messages_name_the_gpu_the_link_and_the_fix():
    width, gen = judge(gpu(current_width=8, current_gen=3, utilization=75.0))
    assert width.message.startswith(f"GPU 0 ({BUS}) runs its PCIe link at x8 of x16: 8 lane(s) did not train")
    assert "50% of the bandwidth" in width.message and "reseat" in width.message
    assert "at Gen3 of Gen5 while 75% busy" in gen.message and "about 25% of the bandwidth" in gen.message
    assert {width.device, gen.device} == {BUS}
    assert {width.action, gen.action} == {Action.HW_INSPECTION}


def test_below_sku_message_names_the_shortfall():
    (f,) = judge(gpu(current_gen=4, max_gen=4, current_width=8, max_width=8))
    assert "can reach only Gen4 instead of Gen5 and x8 instead of x16 on PCIe, less than a H100 SXM5" in f.message
    assert "BIOS" in f.message


def test_replay_message_gives_rate_and_budget():
    (f,) = judge(gpu(), rates={REPLAY: 1.0})
    assert "replays 60 PCIe packets per minute, above the 31 per minute" in f.message
    assert f.evidence["allowed_per_minute"] == 31


def test_settings():
    assert judge(gpu(utilization=50.0, current_gen=1), busy_utilization_percent=60.0) == []
    assert summary(judge(gpu(), rates={REPLAY: 20 / 60}, replay_ber=1e-13)) == REPLAYS


def test_debounced():
    assert check.DEBOUNCE is True
