from dataclasses import replace

import pytest

from nodehealth.checks import pcie as check
from nodehealth.collectors.pcie import AerCounts, PciDevice, Pcie
from nodehealth.model import Action, Observed, Severity

GEN5_X16 = dict(current_speed_gts=32.0, max_speed_gts=32.0, current_width=16, max_width=16)


def dev(kind="gpu", address="0000:3b:00.0", aer=None, **link):
    fields = dict(GEN5_X16, parent_address=None, parent_max_speed_gts=None, parent_max_width=None)
    fields.update(link)
    return PciDevice(address=address, kind=kind, vendor_id=0x10DE, device_id=0x2330, aer=aer or {}, **fields)


def aer(fatal=0, nonfatal=0, correctable=0, fatal_types=None):
    return {"fatal": AerCounts(fatal, fatal_types or {}), "nonfatal": AerCounts(nonfatal, {}),
            "correctable": AerCounts(correctable, {})}


def judge(*devices, rates=None, **cfg):
    obs = Observed({"pcie": Pcie(tuple(devices))}, {"pcie": rates} if rates is not None else {})
    return check.judge(obs, dict(check.DEFAULTS, **cfg))


def summary(findings):
    return [(f.reason, f.severity, f.device) for f in findings]


DEGRADED, INFO, WARNING, FATAL = Severity.DEGRADED, Severity.INFO, Severity.WARNING, Severity.FATAL
A = "0000:3b:00.0"

CASES = [
    # (name, device, rates, expected findings)
    ("healthy gen5 x16 gpu", dev(), None, []),
    ("nothing known", dev(current_speed_gts=None, max_speed_gts=None, current_width=None, max_width=None), None, []),
    ("gpu at x8", dev(current_width=8), None, [("PCIeLinkWidthDegraded", DEGRADED, A)]),
    ("nic at x8", dev("nic", current_width=8), None, [("PCIeLinkWidthDegraded", DEGRADED, A)]),
    ("nvswitch lost a lane", dev("nvswitch", current_width=1, max_width=2), None,
     [("PCIeLinkWidthDegraded", DEGRADED, A)]),
    ("link down reads width 0", dev("nvme", current_width=0, max_width=4), None,
     [("PCIeLinkWidthDegraded", DEGRADED, A)]),
    ("idle gpu at 2.5 GT/s is info", dev(current_speed_gts=2.5), None, [("PCIeLinkSpeedBelowMax", INFO, A)]),
    ("nic at gen4", dev("nic", current_speed_gts=16.0), None, [("PCIeLinkSpeedDegraded", DEGRADED, A)]),
    ("nvme at gen3", dev("nvme", current_speed_gts=8.0, max_speed_gts=16.0, current_width=4, max_width=4), None,
     [("PCIeLinkSpeedDegraded", DEGRADED, A)]),
    ("nvswitch management link slow", dev("nvswitch", current_speed_gts=8.0, max_speed_gts=16.0), None,
     [("PCIeLinkSpeedDegraded", WARNING, A)]),
    ("gpu in a gen4 x8 slot, running at what the slot can do",
     dev(current_speed_gts=16.0, current_width=8, parent_address="0000:3a:00.0", parent_max_speed_gts=16.0,
         parent_max_width=8), None, [("PCIeSlotSlowerThanDevice", INFO, A)]),
    ("nic in a gen4 x8 slot, running below even that",
     dev("nic", current_speed_gts=8.0, current_width=4, parent_address="0000:3a:00.0", parent_max_speed_gts=16.0,
         parent_max_width=8), None,
     [("PCIeLinkWidthDegraded", DEGRADED, A), ("PCIeLinkSpeedDegraded", DEGRADED, A),
      ("PCIeSlotSlowerThanDevice", INFO, A)]),
    ("slot faster than the device is not news",
     dev(parent_address="0000:3a:00.0", parent_max_speed_gts=64.0, parent_max_width=32), None, []),
    ("fatal aer since boot", dev(aer=aer(fatal=1)), None, [("PCIeAERFatal", FATAL, A)]),
    ("old nonfatal errors alone say nothing", dev(aer=aer(nonfatal=3)), {}, []),
    ("new nonfatal errors", dev(aer=aer(nonfatal=3)), {f"{A}:aer_nonfatal": 0.1},
     [("PCIeAERNonFatal", DEGRADED, A)]),
    ("nonfatal first pass: no rates", dev(aer=aer(nonfatal=3)), None, []),
    # x16 at 32 GT/s and BER 1e-12 allows ceil(30.72) = 31 per minute
    ("correctable at 31 per minute is within budget", dev(aer=aer(correctable=900)),
     {f"{A}:aer_correctable": 31 / 60}, []),
    ("correctable at 32 per minute", dev(aer=aer(correctable=900)), {f"{A}:aer_correctable": 32 / 60},
     [("PCIeAERCorrectable", WARNING, A)]),
    ("correctable budget follows the trained link: x8 gen4 allows 8 per minute",
     dev("nic", current_speed_gts=16.0, max_speed_gts=16.0, current_width=8, max_width=8,
         aer=aer(correctable=900)), {f"{A}:aer_correctable": 9 / 60}, [("PCIeAERCorrectable", WARNING, A)]),
    ("correctable first pass: no rates", dev(aer=aer(correctable=10**6)), None, []),
    ("correctable with an unknown link is not judged",
     dev(current_speed_gts=None, max_speed_gts=None, aer=aer(correctable=10)), {f"{A}:aer_correctable": 100.0}, []),
]


@pytest.mark.parametrize("name, device, rates, expected", CASES, ids=[c[0] for c in CASES])
def test_rules(name, device, rates, expected):
    assert summary(judge(device, rates=rates)) == expected


def test_message_has_the_numbers_the_cost_and_the_fix():
    width, speed = judge(dev(current_width=8, current_speed_gts=16.0))
    assert width.message.startswith("0000:3b:00.0 (GPU) runs at x8 of x16, 16.0 of 32.0 GT/s: 8 lanes did not train")
    assert "50% of what the link can carry" in width.message and "reseat" in width.message
    assert width.action is Action.HW_INSPECTION
    assert (speed.reason, speed.severity, speed.action) == ("PCIeLinkSpeedBelowMax", INFO, Action.NONE)
    assert "idle GPU" in speed.message


def test_fatal_aer_names_the_error_types():
    (f,) = judge(dev("nic", aer=aer(fatal=2, fatal_types={"DLP": 1, "CmpltTO": 1, "ECRC": 0})))
    assert "2 fatal uncorrectable PCIe error(s)" in f.message and "CmpltTO 1, DLP 1" in f.message
    assert f.message.startswith("0000:3b:00.0 (NIC)")
    assert f.action is Action.HW_INSPECTION


def test_correctable_message_gives_rate_and_budget():
    (f,) = judge(dev(aer=aer(correctable=5)), rates={f"{A}:aer_correctable": 1.0})
    assert "60 correctable PCIe errors per minute, above the 31 per minute" in f.message
    assert f.evidence["allowed_per_minute"] == 31


def test_a_stricter_ber_lowers_the_budget():
    device = dev(aer=aer(correctable=5))
    rates = {f"{A}:aer_correctable": 20 / 60}
    assert judge(device, rates=rates) == []
    assert summary(judge(device, rates=rates, correctable_error_ber=1e-13)) == [("PCIeAERCorrectable", WARNING, A)]


def test_ignored_devices_are_not_judged():
    lom = dev("nic", address="0000:01:00.0", current_width=1, max_width=2)
    assert summary(judge(lom)) == [("PCIeLinkWidthDegraded", DEGRADED, "0000:01:00.0")]
    assert judge(lom, ignore_devices=["0000:01:00.0"]) == []
    assert summary(judge(lom, replace(lom, address="0000:01:00.1"), ignore_devices=["0000:01:00.0"])) == [
        ("PCIeLinkWidthDegraded", DEGRADED, "0000:01:00.1")]


def test_module_contract():
    assert check.NAME == "pcie" and check.NEEDS == ("pcie",) and check.DEBOUNCE is True


def test_gpus_that_nvml_reports_are_left_to_the_gpu_pcie_check():
    from nodehealth.collectors.gpu_facts import Gpu, NvmlFacts
    from nodehealth.collectors.gpu_facts import Pcie as GpuPcie
    narrow = dev(current_width=8)
    nvml = NvmlFacts("fake", "535", "12.2", 1, (Gpu(0, pci_bus_id=A, pcie=GpuPcie(current_width=8)),))
    both = check.judge(Observed({"pcie": Pcie((narrow,)), "nvml": nvml}), check.DEFAULTS)
    assert summary(judge(narrow)) == [("PCIeLinkWidthDegraded", DEGRADED, A)] and both == []
