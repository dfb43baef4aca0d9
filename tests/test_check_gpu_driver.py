from __future__ import annotations

import pytest

from nodehealth.checks import gpu_driver as check
from nodehealth.collectors.gpu_facts import Gpu, NvmlFacts
from nodehealth.collectors.pcie import PciDevice, Pcie
from nodehealth.model import Action, Observed, Severity

FATAL, UNKNOWN, INFO = Severity.FATAL, Severity.UNKNOWN, Severity.INFO
H100 = "NVIDIA H100 80GB HBM3"
BUS_IDS = ["0000:19:00.0", "0000:2a:00.0", "0000:3b:00.0", "0000:5d:00.0"]


def gpus(name=H100, count=4, **fields) -> tuple[Gpu, ...]:
    return tuple(Gpu(index=i, uuid=f"GPU-{i}", name=name, pci_bus_id=BUS_IDS[i], **fields) for i in range(count))


def facts(gpu_list=None, driver="535.154.05", count=None, **kw) -> NvmlFacts:
    gpu_list = gpus() if gpu_list is None else gpu_list
    return NvmlFacts("test", driver, "12.2", len(gpu_list) if count is None else count, gpu_list, **kw)


def device(address, kind="gpu") -> PciDevice:
    return PciDevice(address=address, kind=kind, vendor_id=0x10DE, device_id=0x2330, current_speed_gts=32.0,
                     max_speed_gts=32.0, current_width=16, max_width=16, parent_address=None,
                     parent_max_speed_gts=None, parent_max_width=None, aer={})


BUS = Pcie(tuple(device(a) for a in BUS_IDS) + (device("0000:0c:00.0", "nic"), device("0000:0d:00.0", "nvswitch")))


def judge(nvml, bus=BUS, **cfg):
    observed = {"nvml": nvml}
    if bus is not None:
        observed["pcie"] = bus
    return check.judge(Observed(observed), dict(check.DEFAULTS, **cfg))


def summary(findings):
    return [(f.reason, f.severity, f.action, f.device) for f in findings]


CASES = [
    # (name, nvml facts, pcie facts, expected)
    ("four GPUs, all seen", facts(), BUS, []),
    ("no PCI facts: nothing to compare", facts(), None, []),
    ("NVML did not start, GPUs on the bus", facts((), count=None, init_error="DriverNotLoaded"), BUS,
     [("NvmlInitFailed", FATAL, Action.REBOOT, "")]),
    ("no NVML library: a deployment fault or no driver, cannot tell",
     facts((), init_error="LibraryNotFound"), BUS, [("NvmlLibraryNotFound", UNKNOWN, Action.FIX_CONFIG, "")]),
    ("NVML did not start, no PCI facts: cannot tell", facts((), init_error="DriverNotLoaded"), None,
     [("NvmlInitFailed", UNKNOWN, Action.NONE, "")]),
    ("NVML did not start on a host without NVIDIA GPUs", facts((), init_error="DriverNotLoaded"),
     Pcie((device("0000:0c:00.0", "nic"),)), []),
    ("no NVML library on a host without NVIDIA GPUs", facts((), init_error="LibraryNotFound"), Pcie(()), []),
    ("one GPU missing", facts(gpus(count=3)), BUS, [("GpusMissing", FATAL, Action.REBOOT, "")]),
    ("GPU count unknown", NvmlFacts("test", "535.154.05", "12.2", None, gpus(count=3)), BUS, []),
    ("lost GPU", facts(gpus(count=1, lost=True) + gpus()[1:]), BUS,
     [("GpuLost", FATAL, Action.REBOOT, BUS_IDS[0])]),
    ("lost and reset required: lost says it all", facts(gpus(count=1, lost=True, reset_required=True) + gpus()[1:]),
     BUS, [("GpuLost", FATAL, Action.REBOOT, BUS_IDS[0])]),
    ("reset required", facts(gpus(count=1, reset_required=True) + gpus()[1:]), BUS,
     [("GpuResetRequired", FATAL, Action.RESET_GPU, BUS_IDS[0])]),
    ("Hopper on R515", facts(driver="515.65.01"), BUS, [("DriverTooOld", FATAL, Action.FIX_CONFIG, "")]),
    ("Hopper on R520", facts(driver="520.61.05"), BUS, []),
    ("HGX B200 below 570.133.20", facts(gpus("NVIDIA B200"), driver="570.124.06"), BUS,
     [("DriverTooOld", FATAL, Action.FIX_CONFIG, "")]),
    ("HGX B200 on 570.133.20", facts(gpus("NVIDIA B200"), driver="570.133.20"), BUS, []),
    ("A100 on R450", facts(gpus("NVIDIA A100-SXM4-80GB"), driver="450.51.05"), BUS, []),
    ("unknown product: no minimum", facts(gpus("NVIDIA A10"), driver="418.40.04"), BUS, []),
    ("driver version unreadable", facts(driver="unknown"), BUS, []),
    ("driver version absent", facts(driver=None), BUS, []),
    ("functions this driver lacks", facts(missing_functions=("nvmlDeviceGetCurrentClocksEventReasons",)), BUS,
     [("NvmlFunctionsMissing", INFO, Action.NONE, "")]),
]


@pytest.mark.parametrize("name, nvml, bus, expected", CASES, ids=[c[0] for c in CASES])
def test_rules(name, nvml, bus, expected):
    assert summary(judge(nvml, bus)) == expected


def test_missing_gpu_is_named():
    present = gpus()[:2] + gpus()[3:]
    (f,) = judge(facts(present))
    assert f.message.startswith("NVML sees 3 GPU(s) but the PCI bus shows 4 NVIDIA GPU(s) (not in NVML: 0000:3b:00.0)")
    assert f.evidence == {"nvml_count": 3, "pci_count": 4, "missing": ["0000:3b:00.0"]}


def test_ignored_gpus_are_not_missing():
    assert judge(facts(gpus(count=3)), ignore_devices=["0000:5D:00.0"]) == []


def test_init_failure_message():
    (f,) = judge(facts((), init_error="LibRmVersionMismatch"))
    assert f.message.startswith("NVML did not start (LibRmVersionMismatch) although the PCI bus shows 4 NVIDIA GPU(s)")
    assert "reboot" in f.message


def test_driver_message_names_the_minimum_and_the_gpus():
    (f,) = judge(facts(gpus(count=2) + gpus("NVIDIA B200")[2:], driver="515.65.01"))
    assert f.message.startswith("The NVIDIA driver 515.65.01 is older than 570.133.20, which the B200, H100 SXM5 "
                                "GPU(s) here need (GPU 0, 1, 2, 3)")
    assert f.evidence["minimum"] == "570.133.20"


def test_lost_gpu_message():
    (f,) = judge(facts(gpus(count=1, lost=True) + gpus()[1:]))
    assert f.message.startswith(f"GPU 0 ({BUS_IDS[0]}) is lost to the driver (NVML GpuIsLost)")


def test_missing_functions_named_once():
    findings = judge(facts(missing_functions=("nvmlDeviceGetTemperatureV", "nvmlDeviceGetMemoryInfo_v2")))
    assert len(findings) == 1
    assert "(nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetTemperatureV)" in findings[0].message


@pytest.mark.parametrize("text, version", [("535.154.05", (535, 154, 5)), ("570.133.20", (570, 133, 20)),
                                           ("550", (550,)), ("", None), (None, None), ("5x.1", None),
                                           ("535..1", None), ("٥٣٥.1", None)])
def test_parse_version(text, version):
    assert check.parse_version(text) == version
