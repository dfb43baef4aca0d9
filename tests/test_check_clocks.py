from __future__ import annotations

import pytest

from nodehealth.checks import clocks as check
from nodehealth.collectors.gpu_facts import (
    CLOCKS_APPLICATIONS_SETTING,
    CLOCKS_DISPLAY_SETTING,
    CLOCKS_GPU_IDLE,
    CLOCKS_HW_POWER_BRAKE,
    CLOCKS_HW_SLOWDOWN,
    CLOCKS_HW_THERMAL,
    CLOCKS_SW_POWER_CAP,
    CLOCKS_SW_THERMAL,
    CLOCKS_SYNC_BOOST,
    Clocks,
    Gpu,
    NvmlFacts,
)
from nodehealth.model import Action, Observed, Severity

BUS = "0000:19:00.0"
UUID = "GPU-8f3c"
DEGRADED, WARNING, UNKNOWN = Severity.DEGRADED, Severity.WARNING, Severity.UNKNOWN


def gpu(reasons=0, **fields) -> Gpu:
    base = dict(index=0, uuid=UUID, name="NVIDIA H100 80GB HBM3", pci_bus_id=BUS, clocks=Clocks(event_reasons=reasons))
    base.update(fields)
    return Gpu(**base)


def judge(*gpus, rates=None, **cfg):
    facts = NvmlFacts("test", "535.154.05", "12.2", len(gpus), tuple(gpus))
    obs = Observed({"nvml": facts}, {"nvml": rates} if rates is not None else {})
    return check.judge(obs, dict(check.DEFAULTS, **cfg))


def summary(findings):
    return [(f.reason, f.severity) for f in findings]


def ns(name):
    return f"{UUID}:clocks_{name}_ns"


BENIGN = (CLOCKS_GPU_IDLE | CLOCKS_APPLICATIONS_SETTING | CLOCKS_SW_POWER_CAP | CLOCKS_SYNC_BOOST
          | CLOCKS_DISPLAY_SETTING)
THERMAL = [("GpuHwThermalSlowdown", DEGRADED)]
BRAKE = [("GpuHwPowerBrake", DEGRADED)]
SLOWDOWN = [("GpuHwSlowdown", DEGRADED)]
SW_THERMAL = [("GpuSwThermalSlowdown", WARNING)]

CASES = [
    # (name, gpu, rates, expected)
    ("no reasons", gpu(), None, []),
    ("idle, power cap, app clocks, sync boost, display: normal operation", gpu(BENIGN), None, []),
    ("nothing known", gpu(clocks=None), None, []),
    ("reasons unknown, no rates", gpu(None), None, []),
    ("HW slowdown bit alone", gpu(CLOCKS_HW_SLOWDOWN), None, SLOWDOWN),
    ("HW thermal comes with HW slowdown: one finding", gpu(CLOCKS_HW_THERMAL | CLOCKS_HW_SLOWDOWN), None, THERMAL),
    ("power brake comes with HW slowdown: one finding", gpu(CLOCKS_HW_POWER_BRAKE | CLOCKS_HW_SLOWDOWN), None,
     BRAKE),
    ("power brake while at the power cap", gpu(CLOCKS_HW_POWER_BRAKE | CLOCKS_SW_POWER_CAP), None, BRAKE),
    ("thermal and brake together", gpu(CLOCKS_HW_THERMAL | CLOCKS_HW_POWER_BRAKE), None, THERMAL + BRAKE),
    ("SW thermal: a warning", gpu(CLOCKS_SW_THERMAL), None, SW_THERMAL),
    # 1e8 ns per second is 10% of the time
    ("HW thermal 10% of the interval", gpu(), {ns("hw_thermal"): 1e8}, []),
    ("HW thermal 11% of the interval", gpu(), {ns("hw_thermal"): 1.1e8}, THERMAL),
    ("power brake all the interval", gpu(), {ns("hw_power_brake"): 1e9}, BRAKE),
    ("SW thermal half the interval", gpu(), {ns("sw_thermal"): 5e8}, SW_THERMAL),
    ("HW slowdown 50% of the interval", gpu(), {ns("hw_slowdown"): 5e8}, SLOWDOWN),
    ("the interval's duration beats a bit caught in passing", gpu(CLOCKS_HW_THERMAL), {ns("hw_thermal"): 0.0}, []),
    ("no duration for thermal: the bit decides", gpu(CLOCKS_HW_THERMAL), {ns("hw_power_brake"): 0.0}, THERMAL),
    ("first pass: the bits decide", gpu(CLOCKS_HW_POWER_BRAKE), None, BRAKE),
    ("clocks did not answer", gpu(clocks=None, unknown={"clocks": "Timeout"}), None, [("GpuFactsUnknown", UNKNOWN)]),
]


@pytest.mark.parametrize("name, g, rates, expected", CASES, ids=[c[0] for c in CASES])
def test_rules(name, g, rates, expected):
    assert summary(judge(g, rates=rates)) == expected


def test_message_gives_the_share_temperature_power_and_fix():
    (f,) = judge(gpu(temperature_c=91.4, power_w=402.0, power_limit_w=700.0), rates={ns("hw_thermal"): 4e8})
    assert f.message.startswith(f"GPU 0 ({BUS}) was slowed 40% of the time since the last check (at 91 C, 402 of "
                                "700 W)")
    assert "cooling" in f.message
    assert f.device == BUS and f.action is Action.HW_INSPECTION
    assert f.evidence["share"] == pytest.approx(0.4)


def test_message_from_the_bits():
    (f,) = judge(gpu(CLOCKS_HW_POWER_BRAKE | CLOCKS_HW_SLOWDOWN))
    assert f.message.startswith(f"GPU 0 ({BUS}) is slowed right now: the system asserted the external power brake")
    assert f.evidence["event_reasons"] == "0x88"


def test_share_is_a_setting():
    assert judge(gpu(), rates={ns("hw_thermal"): 2e8}, slowdown_share=0.25) == []


def test_debounced_so_active_means_sustained():
    assert check.DEBOUNCE is True
