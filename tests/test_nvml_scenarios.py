"""The nvidia-smi -q parser behind the fake NVML scenarios, and the nvml-* fixture machines it built."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.collectors.fake_nvml import FakeNvmlBackend
from nodehealth.collectors.gpu_facts import NvmlError

HERE = os.path.dirname(os.path.abspath(__file__))
NVML_DIR = os.path.join(HERE, "fixtures", "nvml")
MACHINES_DIR = os.path.join(HERE, "fixtures", "machines")


def load_builder():
    spec = importlib.util.spec_from_file_location("build_scenarios", os.path.join(NVML_DIR, "build_scenarios.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


builder = load_builder()
MACHINE_NAMES = [m.name for m in builder.MACHINES]


def dump_text(relative: str) -> str:
    with open(os.path.join(NVML_DIR, relative), encoding="utf-8") as f:
        return f.read()


def parse(relative: str) -> dict:
    return builder.parse_dump(dump_text(relative), relative).scenario()


# --- the parser on real dumps -----------------------------------------------------------------------

def test_h100_dump_gives_every_call_it_shows():
    s = parse("thamada/H100SXMx8.nvidia-smi-a.txt")
    assert s["system"] == {"nvmlSystemGetDriverVersion": "565.57.01", "nvmlSystemGetCudaDriverVersion": 12070,
                           "nvmlDeviceGetCount": 8}
    gpu = s["gpus"][0]
    assert gpu["nvmlDeviceGetName"] == "NVIDIA H100 80GB HBM3"
    assert gpu["nvmlDeviceGetUUID"] == "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"
    assert gpu["nvmlDeviceGetSerial"] == "1654423001593"
    assert gpu["nvmlDeviceGetVbiosVersion"] == "96.00.74.00.01"
    assert gpu["nvmlDeviceGetPciInfo"] == {"busId": "00000000:18:00.0", "pciDeviceId": 0x233010DE}
    assert gpu["nvmlDeviceGetArchitecture"] == 9
    assert gpu["nvmlDeviceGetMigMode"] == [0, 0]
    assert gpu["nvmlDeviceGetPersistenceMode"] == 1
    assert gpu["nvmlDeviceGetEccMode"] == [1, 1]
    assert gpu["nvmlDeviceGetTotalEccErrors"] == {"0,0": 0, "1,0": 0, "0,1": 0, "1,1": 0}
    assert gpu["nvmlDeviceGetRemappedRows"] == [0, 0, 0, 0]
    assert (gpu["nvmlDeviceGetCurrPcieLinkGeneration"], gpu["nvmlDeviceGetMaxPcieLinkGeneration"]) == (5, 5)
    assert (gpu["nvmlDeviceGetCurrPcieLinkWidth"], gpu["nvmlDeviceGetMaxPcieLinkWidth"]) == (16, 16)
    assert gpu["nvmlDeviceGetPcieReplayCounter"] == 7
    assert gpu["nvmlDeviceGetPcieThroughput"] == {"0": 567, "1": 559}
    assert gpu["nvmlDeviceGetCurrentClocksEventReasons"] == 0x1  # Idle: Active
    assert gpu["nvmlDeviceGetCurrentClocksThrottleReasons"] == 0x1
    assert gpu["nvmlDeviceGetTemperature"] == {"0": 30}
    assert gpu["nvmlDeviceGetPowerUsage"] == 100890
    assert gpu["nvmlDeviceGetEnforcedPowerLimit"] == 700000
    assert gpu["nvmlDeviceGetUtilizationRates"] == {"gpu": 0, "memory": 0}
    assert gpu["nvmlDeviceGetGpuFabricInfo"] == {"state": 3, "status": 0}
    assert "nvmlDeviceGetRetiredPages" not in gpu  # N/A in the dump: NotSupported
    assert s["gpus"][6]["nvmlDeviceGetPciInfo"]["busId"] == "00000000:BA:00.0"
    assert s["gpus"][6]["nvmlDeviceGetPcieReplayCounter"] == 15


def test_every_value_names_its_dump_lines():
    s = parse("thamada/H100SXMx8.nvidia-smi-a.txt")
    prov = s["provenance"]["gpus"][0]
    assert prov["nvmlDeviceGetName"] == "thamada/H100SXMx8.nvidia-smi-a.txt line 9"
    assert prov["nvmlDeviceGetTotalEccErrors"] == "thamada/H100SXMx8.nvidia-smi-a.txt lines 138-142, 144-148"
    assert set(prov) == set(s["gpus"][0])
    assert s["provenance"]["system"]["nvmlSystemGetDriverVersion"] == "thamada/H100SXMx8.nvidia-smi-a.txt line 4"


def test_older_driver_prints_throttle_reasons_and_enforced_power_limit():
    dump = builder.parse_dump(dump_text("m4-logs/a100x8-525.60.13.gpu.query.all.txt"))
    s = dump.scenario()
    assert s["system"]["nvmlSystemGetDriverVersion"] == "525.60.13"
    assert s["system"]["nvmlSystemGetCudaDriverVersion"] == 12000
    assert set(dump.clock_sections) == {"Clocks Throttle Reasons"}
    gpu = s["gpus"][5]
    assert gpu["nvmlDeviceGetName"] == "NVIDIA A100-SXM4-80GB"
    assert gpu["nvmlDeviceGetPciInfo"]["busId"] == "00000000:8B:00.0"
    assert gpu["nvmlDeviceGetCurrentClocksThrottleReasons"] == 0
    assert "nvmlDeviceGetCurrentClocksEventReasons" not in gpu
    assert gpu["nvmlDeviceGetEnforcedPowerLimit"] == 400000
    assert gpu["nvmlDeviceGetTotalEccErrors"] == {"0,0": 0, "1,0": 0, "0,1": 21, "1,1": 0}
    assert gpu["nvmlDeviceGetRemappedRows"] == [1, 0, 0, 0]


def test_remap_pending_excerpt_with_elisions():
    s = parse("ml-engineering/a100-sxm4-80gb-510.73.08.xid63-remap-pending.partial.txt")
    assert s["system"]["nvmlSystemGetDriverVersion"] == "510.73.08"
    assert s["system"]["nvmlSystemGetCudaDriverVersion"] == 11060
    [gpu] = s["gpus"]
    assert gpu["nvmlDeviceGetPciInfo"] == {"busId": "00000000:10:1C.0"}
    assert gpu["nvmlDeviceGetArchitecture"] == 7  # from the product name: the excerpt has no architecture line
    assert gpu["nvmlDeviceGetTotalEccErrors"] == {"0,0": 177, "1,0": 0, "0,1": 177, "1,1": 0}
    assert gpu["nvmlDeviceGetRemappedRows"] == [1, 0, 1, 0]
    assert "nvmlDeviceGetCurrPcieLinkGeneration" not in gpu


def test_four_gpu_a100_has_a_real_pending_remap():
    gpus = parse("thamada/A100SXMx4.nvidia-smi-a.txt")["gpus"]
    assert [g["nvmlDeviceGetRemappedRows"] for g in gpus] == [[0, 0, 0, 0], [1, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert gpus[1]["nvmlDeviceGetTotalEccErrors"]["0,0"] == 353


def test_single_and_double_bit_ecc_layout_and_retired_pages():
    gpu = parse("thamada/V100_x8.nvidia-smi-a.txt")["gpus"][4]
    assert gpu["nvmlDeviceGetName"] == "Tesla V100-SXM2-16GB"
    assert gpu["nvmlDeviceGetArchitecture"] == 5
    assert gpu["nvmlDeviceGetTotalEccErrors"] == {"0,0": 0, "1,0": 0, "0,1": 4, "1,1": 0}
    assert gpu["nvmlDeviceGetRetiredPages"] == {"0": [1], "1": []}  # one fake address per retired page
    assert gpu["nvmlDeviceGetRetiredPagesPendingStatus"] == 0
    assert "nvmlDeviceGetRemappedRows" not in gpu  # `Remapped Rows : N/A`


def test_ecc_disabled_gpu_has_no_totals_and_one_section_is_one_gpu():
    s = parse("llm-action/h800-525.105.17.nvidia-smi-q-i0.txt")
    assert s["system"]["nvmlDeviceGetCount"] == 1  # `-i 0` of an 8-GPU node
    [gpu] = s["gpus"]
    assert gpu["nvmlDeviceGetName"] == "NVIDIA H800"
    assert gpu["nvmlDeviceGetEccMode"] == [0, 0]
    assert "nvmlDeviceGetTotalEccErrors" not in gpu


def test_sram_and_dram_counters_are_summed():
    text = "GPU 00000000:19:00.0\n" + dump_text("ml-engineering/ecc-errors-sram-uncorrectable.partial.txt")
    [gpu] = builder.parse_dump(text).scenario()["gpus"]
    assert gpu["nvmlDeviceGetTotalEccErrors"] == {"0,0": 0, "1,0": 1, "0,1": 0, "1,1": 5}


def test_damaged_dump_is_a_clear_error():
    with pytest.raises(ValueError, match=r"line 86: unknown clock event reason 'Invalid HW Slowdown'"):
        builder.parse_dump(dump_text("gpud/nvidia-smi-query.535.183.01.out.0.invalid"), "the.invalid")


@pytest.mark.parametrize("text, message", [
    ("", "no GPU section"),
    (dump_text("llm-action/h800.nvlink-status.txt"), "no GPU section"),
    ("GPU 00000000:19:00.0\n    PCI\n        Replays Since Reset : lots\n", "line 3: Replays Since Reset: expected"),
    ("GPU 00000000:19:00.0\n    Persistence Mode : Sometimes\n", "line 2: Persistence Mode: expected one of"),
    ("GPU 00000000:19:00.0\n    Retired Pages\n        Single Bit ECC : 99999999\n", "more than any GPU"),
])
def test_bad_input_names_the_problem(text, message):
    with pytest.raises(ValueError, match=message):
        builder.parse_dump(text)


REAL_LINES = dump_text("thamada/H100SXMx8.nvidia-smi-a.txt").splitlines()[:240]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(REAL_LINES), st.text(max_size=40)), max_size=40))
def test_fuzz_parser_gives_a_scenario_or_a_value_error(lines):
    try:
        scenario = builder.parse_dump("\n".join(lines)).scenario()
    except ValueError as e:
        assert str(e)
        return
    assert scenario["system"]["nvmlDeviceGetCount"] == len(scenario["gpus"]) > 0
    json.dumps(scenario)


# --- the machines -------------------------------------------------------------------------------------

def backend(name: str) -> FakeNvmlBackend:
    b = FakeNvmlBackend(os.path.join(MACHINES_DIR, name, "nvml.json"))
    b.init()
    return b


def nvml_error(b: FakeNvmlBackend, fn: str, *args) -> str | None:
    try:
        b.call(fn, *args)
    except NvmlError as e:
        return e.name
    return None


DEVICE_CALLS = [
    "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetSerial", "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetPciInfo", "nvmlDeviceGetArchitecture", "nvmlDeviceGetMigMode", "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetEccMode", "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetGpuFabricInfo",
]
KEYED_CALLS = [
    ("nvmlDeviceGetTotalEccErrors", (1, 0)), ("nvmlDeviceGetRetiredPages", (0,)), ("nvmlDeviceGetFieldValues", (91, 0)),
    ("nvmlDeviceGetFieldValues", (164, 0)), ("nvmlDeviceGetFieldValues", (271, 0)), ("nvmlDeviceGetNvLinkState", (0,)),
    ("nvmlDeviceGetNvLinkVersion", (0,)), ("nvmlDeviceGetNvLinkRemotePciInfo", (0,)),
    ("nvmlDeviceGetNvLinkErrorCounter", (0, 2)), ("nvmlDeviceGetPcieThroughput", (0,)),
    ("nvmlDeviceGetTemperature", (0,)),
]
EXPECTED_ERRORS = {"NotSupported", "FunctionNotFound", "GpuIsLost"}


@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_machine_answers_every_call_of_the_table(name):
    b = backend(name)
    count = b.call("nvmlDeviceGetCount")
    assert count == len(b.scenario["gpus"]) > 0
    assert b.call("nvmlSystemGetDriverVersion").count(".") == 2
    assert 11000 <= b.call("nvmlSystemGetCudaDriverVersion") < 13000
    lost = {e["gpu"] for e in b.scenario.get("errors", []) if e["error"] == "GpuIsLost"}
    for gpu in range(count):
        for fn, args in [(fn, ()) for fn in DEVICE_CALLS] + KEYED_CALLS:
            try:
                b.call(fn, gpu, *args)
            except NvmlError as e:
                assert e.name in EXPECTED_ERRORS, (gpu, fn, e.name)
        if gpu not in lost:
            assert b.call("nvmlDeviceGetName", gpu).startswith("NVIDIA ")
            links = b.scenario["gpus"][gpu]["nvmlDeviceGetNvLinkState"]
            assert b.call("nvmlDeviceGetFieldValues", gpu, 91, 0) == len(links)
    assert nvml_error(b, "nvmlDeviceGetName", count) == "InvalidArgument"


@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_machine_has_sysfs_gpus_identity_and_a_readme(name):
    root = os.path.join(MACHINES_DIR, name)
    with open(os.path.join(root, "nvml.json"), encoding="utf-8") as f:
        scenario = json.load(f)
    bus_ids = {g["nvmlDeviceGetPciInfo"]["busId"][-12:].lower() for g in scenario["gpus"]}
    devices = os.path.join(root, "sys", "bus", "pci", "devices")
    assert set(os.listdir(devices)) == bus_ids
    for gpu in scenario["gpus"]:
        device = os.path.join(devices, gpu["nvmlDeviceGetPciInfo"]["busId"][-12:].lower())
        with open(os.path.join(device, "vendor")) as v, open(os.path.join(device, "device")) as d, \
                open(os.path.join(device, "class")) as c:
            assert (v.read(), c.read()) == ("0x10de\n", "0x030200\n")
            assert int(d.read(), 16) == gpu["nvmlDeviceGetPciInfo"]["pciDeviceId"] >> 16
    for path in ("proc/stat", "proc/uptime", "proc/sys/kernel/hostname", "proc/sys/kernel/random/boot_id"):
        assert os.path.getsize(os.path.join(root, path)) > 0
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert readme.startswith(f"# {name}: ") and "Expected verdict: " in readme
    assert len(scenario["provenance"]["gpus"]) == len(scenario["gpus"])


# (machine, call, arguments, the answer or the NVML error it gives)
FAULTS = [
    ("nvml-h100-healthy", "nvmlDeviceGetName", (0,), "NVIDIA H100 80GB HBM3"),
    ("nvml-h100-healthy", "nvmlDeviceGetRetiredPages", (0, 0), "NotSupported"),
    ("nvml-h100-healthy", "nvmlDeviceGetNvLinkRemotePciInfo", (0, 17), {"busId": "00000000:86:00.0"}),
    ("nvml-h100-xid79-lost", "nvmlDeviceGetName", (3,), "GpuIsLost"),
    ("nvml-h100-xid79-lost", "nvmlDeviceGetRemappedRows", (3,), "GpuIsLost"),
    ("nvml-h100-xid79-lost", "nvmlDeviceGetName", (2,), "NVIDIA H100 80GB HBM3"),
    ("nvml-h100-volatile-dbe", "nvmlDeviceGetTotalEccErrors", (5, 1, 0), 1),
    ("nvml-h100-volatile-dbe", "nvmlDeviceGetTotalEccErrors", (5, 1, 1), 5),
    ("nvml-h100-volatile-dbe", "nvmlDeviceGetTotalEccErrors", (4, 1, 0), 0),
    ("nvml-h100-nvlink-down", "nvmlDeviceGetNvLinkState", (2, 7), 0),
    ("nvml-h100-nvlink-down", "nvmlDeviceGetNvLinkState", (2, 6), 1),
    ("nvml-h100-pcie-downtrained", "nvmlDeviceGetCurrPcieLinkWidth", (6,), 8),
    ("nvml-h100-pcie-downtrained", "nvmlDeviceGetMaxPcieLinkWidth", (6,), 16),
    ("nvml-h100-pcie-downtrained", "nvmlDeviceGetUtilizationRates", (6,), {"gpu": 100, "memory": 61}),
    ("nvml-h100-hw-slowdown", "nvmlDeviceGetCurrentClocksEventReasons", (1,), 0x88),
    ("nvml-h100-hw-slowdown", "nvmlDeviceGetFieldValues", (1, 271, 0), 37_500_000_000),
    ("nvml-h100-hw-slowdown", "nvmlDeviceGetFieldValues", (0, 271, 0), 0),
    ("nvml-h200", "nvmlDeviceGetName", (0,), "NVIDIA H200"),
    ("nvml-h200", "nvmlDeviceGetFieldValues", (0, 91, 0), 18),
    ("nvml-h800", "nvmlDeviceGetCurrentClocksEventReasons", (0,), "FunctionNotFound"),
    ("nvml-h800", "nvmlDeviceGetCurrentClocksThrottleReasons", (0,), 0x1),
    ("nvml-h800", "nvmlDeviceGetTotalEccErrors", (0, 0, 0), "NotSupported"),
    ("nvml-h800", "nvmlDeviceGetFieldValues", (0, 164, 7), 26562),
    ("nvml-h800", "nvmlDeviceGetFieldValues", (0, 138, 0), 1390774681),
    ("nvml-h800", "nvmlDeviceGetNvLinkState", (0, 8), "NotSupported"),
    ("nvml-a100-remap-pending", "nvmlDeviceGetRemappedRows", (1,), [1, 0, 1, 0]),
    ("nvml-a100-remap-pending", "nvmlDeviceGetNvLinkRemotePciInfo", (0, 0), {"busId": "00000000:9E:00.0"}),
    ("nvml-a100-remap-pending", "nvmlDeviceGetFieldValues", (0, 164, 11), 25000),
    ("nvml-a100-remap-failure", "nvmlDeviceGetRemappedRows", (4,), [0, 8, 0, 1]),
    ("nvml-a100-old-driver", "nvmlDeviceGetCurrentClocksEventReasons", (0,), "FunctionNotFound"),
    ("nvml-a100-old-driver", "nvmlDeviceGetGpuFabricInfo", (0,), "FunctionNotFound"),
    ("nvml-a100-old-driver", "nvmlDeviceGetFieldValues", (0, 269, 0), "FunctionNotFound"),
    ("nvml-a100-old-driver", "nvmlDeviceGetFieldValues", (0, 91, 0), 12),
    ("nvml-a100-old-driver", "nvmlDeviceGetCurrentClocksThrottleReasons", (0,), 0),
    ("nvml-a100", "nvmlDeviceGetName", (7,), "NVIDIA A100-SXM4-80GB"),
    ("nvml-a100", "nvmlDeviceGetGpuFabricInfo", (0,), "NotSupported"),
]


@pytest.mark.parametrize("name, fn, args, expected", FAULTS)
def test_machine_value_or_scripted_fault(name, fn, args, expected):
    b = backend(name)
    if isinstance(expected, str) and expected[0].isupper() and " " not in expected:
        assert nvml_error(b, fn, *args) == expected
    else:
        assert b.call(fn, *args) == expected


def test_lost_gpu_has_an_xid_79_event_and_kernel_record():
    b = backend("nvml-h100-xid79-lost")
    assert b.wait_events(0) == [{"gpu": 3, "kind": "xid", "data": 79}]
    assert b.wait_events(0) == []
    with open(os.path.join(MACHINES_DIR, "nvml-h100-xid79-lost", "dev", "kmsg"), encoding="utf-8") as f:
        assert f.read().endswith(",-;NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus\n")
    assert os.path.isdir(os.path.join(MACHINES_DIR, "nvml-h100-xid79-lost", "sys/bus/pci/devices/0000:5d:00.0"))


def test_builder_output_is_committed_and_deterministic(tmp_path):
    assert builder.main(["--out", str(tmp_path)]) == 0
    for name in MACHINE_NAMES:
        built, committed = tmp_path / name, os.path.join(MACHINES_DIR, name)
        built_files = sorted(str(p.relative_to(built)) for p in built.rglob("*") if p.is_file())
        committed_files = sorted(os.path.relpath(os.path.join(d, f), committed)
                                 for d, _, files in os.walk(committed) for f in files)
        assert built_files == committed_files, name
        for relative in built_files:
            with open(os.path.join(committed, relative), "rb") as f:
                assert (built / relative).read_bytes() == f.read(), f"{name}/{relative}"


# Real captures: on a lent H200 and a lent H100 (each one GPU passed through to a VM), tests/fixtures/nvml/
# capture.py recorded what the driver answered, `nvidia-smi -q` printed the same GPU, and the daemon served its
# metrics, all within a minute (tests/on_gpu_node.sh; SOURCES.md). Readings that move by the second are
# compared loosely. Each with the count of the daemon's GPU series that do not move.
DEVICES = {"h200": (os.path.join(NVML_DIR, "device-h200", "h200-580.159.04"), 33),
           "h100": (os.path.join(NVML_DIR, "device-h100", "h100-580.159.04"), 33)}
MOVING = {"nvmlDeviceGetPcieThroughput", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature",
          "nvmlDeviceGetUtilizationRates"}


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_the_builder_reads_a_580_dump_as_the_driver_answered_it(device):
    path, _ = DEVICES[device]
    with open(path + ".nvidia-smi-q.txt", encoding="utf-8") as f:
        built = builder.parse_dump(f.read(), f"device-{device}").scenario()
    with open(path + ".nvml.json", encoding="utf-8") as f:
        real = json.load(f)
    assert built["system"] == real["system"]
    [b], [r] = built["gpus"], real["gpus"]
    assert {fn: b[fn] for fn in b.keys() & r.keys() - MOVING} == {fn: r[fn] for fn in b.keys() & r.keys() - MOVING}
    # read (R580 prints no `Power Draw`, only its average and instantaneous), in mW, a moment apart: within 5 %
    assert abs(b["nvmlDeviceGetPowerUsage"] - r["nvmlDeviceGetPowerUsage"]) <= 0.05 * r["nvmlDeviceGetPowerUsage"]
    # the older name of the clock reasons, which the collector asks only where the newer is missing
    assert b.keys() - r.keys() == {"nvmlDeviceGetCurrentClocksThrottleReasons"}
    # nvidia-smi -q prints neither the slowdown counters nor a fabric (N/A: NVML's state 0, not supported)
    assert r.keys() - b.keys() == {"nvmlDeviceGetFieldValues", "nvmlDeviceGetGpuFabricInfo"}
    assert r["nvmlDeviceGetGpuFabricInfo"]["state"] == 0


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_the_capture_replayed_serves_the_metrics_the_daemon_served_on_that_machine(tmp_path, device):
    """The fake answering from a real capture is, metric for metric, the real driver under the daemon."""
    from nodehealth import exporter
    from nodehealth.collectors import nvml
    from nodehealth.host import HostPaths

    path, steady = DEVICES[device]
    shutil.copy(path + ".nvml.json", tmp_path / "nvml.json")
    text = exporter.render(nvml.metrics(nvml.collect(HostPaths(str(tmp_path)), nvml.DEFAULTS))).decode()
    moving = ("_bytes_per_second{", "_power_watts{", "_temperature_celsius{", "_utilization_ratio{")

    def samples(text: str) -> set[str]:
        return {line for line in text.splitlines()
                if line.startswith("nodehealth_gpu") and not any(m in line for m in moving)}
    with open(path + ".daemon-gpu-metrics.txt", encoding="utf-8") as f:
        served = samples(f.read())
    assert len(served) == steady and samples(text) == served
