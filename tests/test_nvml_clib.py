"""The real NVML backend and the real pynvml on a fake libnvidia-ml.so.1 written in C (tests/fakelib).

The Python fake stands in above pynvml; this one stands in below it, at the C ABI of NVIDIA's own
nvml.h, so what pynvml does with ctypes structures, versioned symbols, buffer sizes and return
codes is exercised. Both answer from the same nvml.json, and must give the same golden output.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import MACHINES, STOP_SECONDS, machine, require_tool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_machines import EXPECTED_EXIT, GOLDEN, stable
from test_nvml import judge_every_nvml_check

from nodehealth.collectors import nvml
from nodehealth.collectors.gpu_facts import NVML_ERRORS
from nodehealth.host import HostPaths

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakelib"))
import fakelib  # noqa: E402

NVML_MACHINES = [m for m in MACHINES if m.startswith("nvml-")]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    require_tool("gcc")
    return str(tmp_path_factory.mktemp("fake-nvml"))


def golden(name: str) -> str:
    with open(os.path.join(GOLDEN, name), encoding="utf-8") as f:
        return f.read()


def check(name: str, env: dict, state: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nodehealth.cli", "check", "--json", "--root", machine(name),
                           "--state-dir", state], capture_output=True, text=True, timeout=60,
                          env=dict(env, COLUMNS="4000"))


@pytest.mark.parametrize("name", NVML_MACHINES)
def test_check_through_real_pynvml_is_the_python_fakes_golden(name, work, tmp_path):
    env = fakelib.environment(os.path.join(machine(name), "nvml.json"), work)
    result = check(name, env, str(tmp_path))
    assert result.returncode == EXPECTED_EXIT[name], result.stderr
    assert stable(result.stdout) == golden(f"{name}.check.json")


@pytest.mark.parametrize("name", NVML_MACHINES)
def test_daemon_metrics_through_real_pynvml_are_golden(name, work, tmp_path, daemon_factory):
    env = fakelib.environment(os.path.join(machine(name), "nvml.json"), work)
    d = daemon_factory(machine(name), str(tmp_path / "state"), env=env)
    d.wait_ready()
    code, body = d.get("/metrics")
    assert code == 200
    assert stable(body.decode()) == golden(f"{name}.metrics.txt")
    assert d.stop() < STOP_SECONDS  # nvmlShutdown ends the event wait at once


def test_without_the_library_the_driver_backend_says_so(work, tmp_path):
    """The equality above is the C fake's doing: with no libnvidia-ml the same run has no GPUs."""
    env = fakelib.environment(os.path.join(machine("nvml-h100-healthy"), "nvml.json"), work)
    env["LD_LIBRARY_PATH"] = str(tmp_path)
    doc = json.loads(check("nvml-h100-healthy", env, str(tmp_path)).stdout)
    assert stable(json.dumps(doc, indent=2)) != stable(golden("nvml-h100-healthy.check.json"))
    assert "LibraryNotFound" in json.dumps(doc)


def test_a_function_an_older_driver_lacks_is_not_exported(work):
    folder = fakelib.build(work, ["nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetGpuFabricInfo"])
    probe = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); print(' '.join(str(int(hasattr(lib, n))) for n in "
             "sys.argv[2:]))")  # its own process: this one loads the full library under the same soname
    names = ["nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetPciInfo_v3",
             "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetGpuFabricInfo"]
    out = subprocess.run([sys.executable, "-c", probe, os.path.join(folder, fakelib.LIBRARY), *names],
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1", "0", "0"]


# --- in this process: the real backend on the C fake, one scenario after another --------------------

H100 = {
    "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3", "nvmlDeviceGetUUID": "GPU-0",
    "nvmlDeviceGetPciInfo": {"busId": "00000000:19:00.0", "pciDeviceId": 0x233010DE},
    "nvmlDeviceGetArchitecture": 9, "nvmlDeviceGetEccMode": [1, 1],
    "nvmlDeviceGetTotalEccErrors": {"0,0": 3, "1,0": 0, "0,1": 10, "1,1": 0},
    "nvmlDeviceGetRemappedRows": [0, 0, 0, 0],
    "nvmlDeviceGetFieldValues": {"91,0": 2, "164,0": 26562, "164,1": 26562, "138,0": 7, "269,0": 5,
                                 "270,0": {"error": "FunctionNotFound"}, "271,0": 9},
    "nvmlDeviceGetNvLinkState": {"0": 1, "1": 0},
    "nvmlDeviceGetNvLinkRemotePciInfo": {"0": {"busId": "00000000:05:00.0"}},
    "nvmlDeviceGetNvLinkErrorCounter": {"0,0": 0, "0,1": 0, "0,2": 4, "0,3": 0},
    "nvmlDeviceGetCurrPcieLinkGeneration": 5, "nvmlDeviceGetMaxPcieLinkGeneration": 5,
    "nvmlDeviceGetCurrPcieLinkWidth": 8, "nvmlDeviceGetMaxPcieLinkWidth": 16, "nvmlDeviceGetPcieReplayCounter": 2,
    "nvmlDeviceGetPcieThroughput": {"0": 567, "1": 559},
    "nvmlDeviceGetCurrentClocksEventReasons": 0x88, "nvmlDeviceGetTemperature": {"0": 33},
    "nvmlDeviceGetPowerUsage": 71000, "nvmlDeviceGetEnforcedPowerLimit": 700000,
    "nvmlDeviceGetUtilizationRates": {"gpu": 40, "memory": 7},
    "nvmlDeviceGetGpuFabricInfo": {"state": 3, "status": 0},
    "nvmlDeviceGetRetiredPages": {"0": [4096, 8192], "1": []},
}
V100 = dict(H100, nvmlDeviceGetArchitecture=5, nvmlDeviceGetUUID="GPU-1",
            nvmlDeviceGetPciInfo={"busId": "00000000:3B:00.0", "pciDeviceId": 0x1DB110DE},
            nvmlDeviceGetRetiredPagesPendingStatus=1)


@pytest.fixture
def in_process(work, tmp_path, monkeypatch):
    """Load the C fake into this process (pynvml then finds it by its soname) and point it at a
    scenario written by `use(gpus, **extra)`; the real backend is the one nvml.collect starts."""
    folder = fakelib.build(work)
    ctypes.CDLL(os.path.join(folder, fakelib.LIBRARY), mode=ctypes.RTLD_GLOBAL)
    monkeypatch.setenv(nvml.BACKEND_ENV, "driver")
    flat = tmp_path / "scenario.txt"
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(flat))

    def use(gpus: list, plan: list[int] = (), **extra) -> HostPaths:
        scenario = {"system": {"nvmlSystemGetDriverVersion": "535.154.05", "nvmlSystemGetCudaDriverVersion": 12020,
                               "nvmlDeviceGetCount": len(gpus)}, "gpus": gpus, **extra}
        flat.write_text(fakelib.derive(scenario) + "".join(f"p\t{code}\n" for code in plan))
        nvml.reset_backend()
        return HostPaths(str(tmp_path))
    yield use
    nvml.reset_backend()


def test_every_shape_through_ctypes(in_process):
    facts = nvml.collect(in_process([H100, V100]), nvml.DEFAULTS)
    assert nvml._backend.name == "nvml"  # the pynvml backend, not the Python fake
    assert (facts.driver_version, facts.cuda_driver_version, facts.device_count) == ("535.154.05", "12.2", 2)
    g, v = facts.gpus
    assert (g.name, g.uuid, g.pci_bus_id, g.pci_device_id) == ("NVIDIA H100 80GB HBM3", "GPU-0", "0000:19:00.0",
                                                              0x233010DE)
    assert g.ecc.volatile_corrected == 3 and g.ecc.aggregate_corrected == 10 and g.ecc_enabled
    assert [(n.link, n.active, n.speed_mbps, n.crc_flit, n.remote_pci_bus_id, n.tx_bytes) for n in g.nvlinks] == [
        (0, True, 26562.0, 4, "0000:05:00.0", 7 * 1024), (1, False, 26562.0, None, None, None)]
    assert (g.pcie.current_width, g.pcie.max_width, g.pcie.tx_bytes_per_second) == (8, 16, 567000.0)
    assert (g.clocks.event_reasons, g.clocks.sw_thermal_ns, g.clocks.hw_thermal_ns) == (0x88, 5, None)
    assert facts.missing_functions == ("nvmlDeviceGetFieldValues",)  # field 270: the driver predates it
    assert (g.temperature_c, g.power_w, g.utilization_gpu_percent, g.fabric_state) == (33, 71.0, 40, "completed")
    assert v.retired_pages.single_bit == 2 and v.retired_pages.double_bit == 0 and v.retired_pages.pending
    assert g.unknown == {} and v.unknown == {}


def test_c_level_errors(in_process):
    errors = [{"gpu": 0, "fn": "nvmlDeviceGetRemappedRows", "error": "Timeout"},
              {"gpu": 0, "fn": "nvmlDeviceGetTotalEccErrors", "error": "NotSupported"},
              {"gpu": 0, "fn": "nvmlDeviceGetCurrentClocksEventReasons", "error": "FunctionNotFound"},
              {"gpu": 1, "fn": "*", "error": "GpuIsLost"}]
    gpus = [dict(H100, nvmlDeviceGetCurrentClocksThrottleReasons=0x8), V100]
    facts = nvml.collect(in_process(gpus, errors=errors), nvml.DEFAULTS)
    g0, g1 = facts.gpus
    assert g0.unknown == {"remapped_rows": "Timeout"} and g0.remapped_rows is None and g0.ecc is None
    assert g0.clocks.event_reasons == 0x8  # the older call, after FunctionNotFound
    assert "nvmlDeviceGetCurrentClocksEventReasons" in facts.missing_functions
    assert g1.lost and g1.index == 1


def test_a_call_that_blocks_in_c_is_unknown_in_time(in_process):
    host = in_process([H100, V100], hangs=[{"gpu": 1, "fn": "nvmlDeviceGetRemappedRows", "seconds": 30}])
    t0 = time.monotonic()
    facts = nvml.collect(host, dict(nvml.DEFAULTS, gpu_timeout_seconds=0.3))
    assert time.monotonic() - t0 < 2.0
    assert facts.gpus[0].unknown == {} and "all" in facts.gpus[1].unknown
    stuck = nvml._stuck[1]
    nvml.reset_backend()  # nvmlShutdown releases the blocked C call
    stuck.join(2.0)
    assert not stuck.is_alive()


def test_events_through_the_event_set(in_process):
    in_process([H100, V100], events=[{"gpu": 1, "kind": "xid", "data": 79}])
    backend = nvml.backend_for(HostPaths("/nonexistent"))
    assert backend.wait_events(0.05) == [{"gpu": 1, "kind": "xid", "data": 79}]
    t0 = time.monotonic()
    assert backend.wait_events(0.2) == []
    assert 0.15 < time.monotonic() - t0 < 2.0
    waiter = threading.Thread(target=backend.wait_events, args=(30,))
    waiter.start()
    time.sleep(0.05)
    nvml.reset_backend()
    waiter.join(2.0)
    assert not waiter.is_alive()


PLAN = st.lists(st.one_of(st.just(0), st.just(0), st.just(0), st.sampled_from(sorted(NVML_ERRORS.values()))),
                max_size=200)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(PLAN)
def test_any_c_level_error_at_any_call_still_completes_the_pass(in_process, plan):
    facts = nvml.collect(in_process([H100, V100], plan=plan), nvml.DEFAULTS)
    assert facts.init_error is not None or facts.backend == "nvml"
    judge_every_nvml_check(facts)


def test_mig_devices_through_mig_handles(in_process):
    """The MIG calls through real pynvml: a handle per MIG device, its UUID and GPU instance id asked of that
    handle (the DataDog/datadog-agent#33120 A100, with constructed instance ids and an empty slot)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "nvml", "datadog",
                           "a100-mig-1g10gb.nvml.json"), encoding="utf-8") as f:
        [a100] = json.load(f)["gpus"]
    devices = a100["nvmlDeviceGetMigDeviceHandleByIndex"]
    a100 = dict(a100, nvmlDeviceGetMigDeviceHandleByIndex=dict(
        {k: dict(v, gpuInstanceId=7 + int(k)) for k, v in devices.items() if k != "6"}, **{"6": {"error": "NotFound"}}))
    facts = nvml.collect(in_process([a100, dict(H100, nvmlDeviceGetMigMode=[0, 0])]), nvml.DEFAULTS)
    assert nvml._backend.name == "nvml"
    g, h = facts.gpus
    assert [(m.uuid, m.gpu_instance) for m in g.mig_devices] == [(devices[str(i)]["uuid"], 7 + i) for i in range(6)]
    assert g.uuid == "GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16"  # the parent's own UUID, not a MIG device's
    assert g.unknown == {} and h.mig_devices == () and facts.missing_functions == ("nvmlDeviceGetFieldValues",)


@pytest.mark.parametrize("name", ["nvml-h100-healthy", "nvml-a100-remap-failure", "nvml-h100-xid79-lost"])
def test_a_capture_through_real_pynvml_replays_to_the_same_facts(name, work, tmp_path):
    """tests/fixtures/nvml/capture.py, run as on a GPU node but over the C fake: the scenario it writes,
    answered by the Python fake, gives every GPU the facts the scenario it captured gives."""
    original = os.path.join(machine(name), "nvml.json")
    env = fakelib.environment(original, work)
    capture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "nvml", "capture.py")
    done = subprocess.run([sys.executable, capture, "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "nvml.json", encoding="utf-8") as f:
        captured = json.load(f)
    assert "a real NVML capture" in captured["source"] and "NotSupported" not in json.dumps(captured)

    def facts(path: str) -> list:
        backend = nvml.FakeNvmlBackend(path)
        nvml._known.clear()  # a lost GPU's identity from an earlier read must not carry across
        return [nvml.read_gpu(backend, i, set()) for i in range(backend.call("nvmlDeviceGetCount"))]
    replayed, expected = facts(str(tmp_path / "nvml.json")), facts(original)
    assert replayed == expected and [g.unknown for g in replayed] == [g.unknown for g in expected]
    assert len(expected) == len(json.load(open(original, encoding="utf-8"))["gpus"])
