"""The NVML collector over the fake backend: error isolation, lost and wedged GPUs, metrics."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodehealth import exporter
from nodehealth.collectors import nvml
from nodehealth.collectors.fake_nvml import FakeNvmlBackend
from nodehealth.collectors.gpu_facts import NVML_ERRORS, NvmlError
from nodehealth.host import HostPaths

H100 = {
    "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3", "nvmlDeviceGetUUID": "GPU-0",
    "nvmlDeviceGetPciInfo": {"busId": "00000000:19:00.0", "pciDeviceId": 0x233010DE},
    "nvmlDeviceGetArchitecture": 9, "nvmlDeviceGetEccMode": [1, 1],
    "nvmlDeviceGetTotalEccErrors": {"0,0": 3, "1,0": 0, "0,1": 10, "1,1": 0},
    "nvmlDeviceGetRemappedRows": [0, 0, 0, 0],
    "nvmlDeviceGetFieldValues": {"91,0": 2, "164,0": 26562, "164,1": 26562, "269,0": 5, "270,0": 7, "271,0": 9},
    "nvmlDeviceGetNvLinkState": {"0": 1, "1": 1},
    "nvmlDeviceGetNvLinkErrorCounter": {"0,0": 0, "0,1": 0, "0,2": 4, "0,3": 0, "1,0": 0, "1,1": 0, "1,2": 0, "1,3": 0},
    "nvmlDeviceGetCurrPcieLinkGeneration": 5, "nvmlDeviceGetMaxPcieLinkGeneration": 5,
    "nvmlDeviceGetCurrPcieLinkWidth": 16, "nvmlDeviceGetMaxPcieLinkWidth": 16, "nvmlDeviceGetPcieReplayCounter": 2,
    "nvmlDeviceGetCurrentClocksEventReasons": 0x1, "nvmlDeviceGetTemperature": {"0": 33},
    "nvmlDeviceGetPowerUsage": 71000, "nvmlDeviceGetEnforcedPowerLimit": 700000,
    "nvmlDeviceGetUtilizationRates": {"gpu": 0, "memory": 0},
}


def machine(tmp_path, gpus, **extra):
    scenario = {"system": {"nvmlSystemGetDriverVersion": "535.154.05", "nvmlSystemGetCudaDriverVersion": 12020,
                           "nvmlDeviceGetCount": len(gpus)}, "gpus": gpus, **extra}
    (tmp_path / "nvml.json").write_text(json.dumps(scenario))
    nvml.reset_backend()
    return HostPaths(str(tmp_path))


@pytest.fixture(autouse=True)
def fresh_backend():
    nvml.reset_backend()
    yield
    nvml.reset_backend()


def test_facts_from_a_scenario(tmp_path):
    host = machine(tmp_path, [H100])
    assert nvml.supported(host, {}) is None
    facts = nvml.collect(host, nvml.DEFAULTS)
    assert (facts.driver_version, facts.cuda_driver_version, facts.device_count) == ("535.154.05", "12.2", 1)
    g = facts.gpus[0]
    assert g.pci_bus_id == "0000:19:00.0" and g.architecture == "hopper" and g.ecc_enabled is True
    assert g.ecc.volatile_corrected == 3 and g.ecc.aggregate_corrected == 10
    assert g.retired_pages is None  # Hopper remaps rows instead
    assert [(link.link, link.active, link.speed_mbps, link.crc_flit) for link in g.nvlinks] == [
        (0, True, 26562.0, 4), (1, True, 26562.0, 0)]
    assert g.pcie.current_gen == 5 and g.pcie.replay == 2
    assert g.clocks.event_reasons == 1 and g.clocks.hw_power_brake_ns == 9
    assert g.power_w == 71.0 and g.power_limit_w == 700.0 and g.temperature_c == 33
    assert g.unknown == {} and not g.lost


def test_absent_facts_are_none_not_zero(tmp_path):
    facts = nvml.collect(machine(tmp_path, [{"nvmlDeviceGetName": "Tesla T4"}]), nvml.DEFAULTS)
    g = facts.gpus[0]
    assert g.ecc is None and g.remapped_rows is None and g.nvlinks == () and g.pcie is None and g.clocks is None
    text = exporter.render(nvml.metrics(facts)).decode()
    assert "nodehealth_gpu_ecc_errors_total" not in text and "nodehealth_gpu_info" in text


def test_error_kinds(tmp_path):
    errors = [{"gpu": 0, "fn": "nvmlDeviceGetRemappedRows", "error": "Timeout"},
              {"gpu": 0, "fn": "nvmlDeviceGetCurrentClocksEventReasons", "error": "FunctionNotFound"},
              {"gpu": 0, "fn": "nvmlDeviceGetTotalEccErrors", "error": "NotSupported"},
              {"gpu": 1, "fn": "*", "error": "GpuIsLost"}]
    gpus = [dict(H100, nvmlDeviceGetCurrentClocksThrottleReasons=0x8), dict(H100, nvmlDeviceGetUUID="GPU-1")]
    facts = nvml.collect(machine(tmp_path, gpus, errors=errors), nvml.DEFAULTS)
    g0, g1 = facts.gpus
    assert g0.unknown == {"remapped_rows": "Timeout"} and g0.remapped_rows is None
    assert g0.ecc is None  # NotSupported: absent, not unknown
    assert g0.clocks.event_reasons == 0x8  # fell back to the throttle-reasons call of older drivers
    assert facts.missing_functions == ("nvmlDeviceGetCurrentClocksEventReasons",)
    assert g1.lost and g1.index == 1


def test_a_wedged_gpu_is_unknown_in_time_and_not_asked_again(tmp_path):
    host = machine(tmp_path, [H100, dict(H100, nvmlDeviceGetUUID="GPU-1")],
                   hangs=[{"gpu": 1, "fn": "nvmlDeviceGetRemappedRows", "seconds": 30}])
    cfg = dict(nvml.DEFAULTS, gpu_timeout_seconds=0.3)
    t0 = time.monotonic()
    facts = nvml.collect(host, cfg)
    assert time.monotonic() - t0 < 2.0
    assert facts.gpus[0].unknown == {} and "all" in facts.gpus[1].unknown
    threads = threading.active_count()
    again = nvml.collect(host, cfg)
    assert "earlier pass" in again.gpus[1].unknown["all"]
    assert threading.active_count() <= threads  # no second thread stuck on the same GPU


def test_driver_gone_resets_and_reports(tmp_path):
    host = machine(tmp_path, [H100], errors=[{"fn": "nvmlDeviceGetCount", "error": "DriverNotLoaded"}])
    facts = nvml.collect(host, nvml.DEFAULTS)
    assert facts.init_error == "DriverNotLoaded" and facts.gpus == ()
    assert nvml._backend is None  # started afresh next pass


def test_init_failure_is_a_fact_not_a_crash(tmp_path):
    host = machine(tmp_path, [H100], errors=[{"fn": "nvmlInit", "error": "LibraryNotFound"}])
    assert nvml.collect(host, nvml.DEFAULTS).init_error == "LibraryNotFound"


def test_a_broken_scenario_is_a_clear_error(tmp_path):
    (tmp_path / "nvml.json").write_text("{nope")
    with pytest.raises(Exception, match="cannot load the NVML scenario"):
        nvml.collect(HostPaths(str(tmp_path)), nvml.DEFAULTS)


def test_metrics_and_counters(tmp_path):
    facts = nvml.collect(machine(tmp_path, [H100]), nvml.DEFAULTS)
    text = exporter.render(nvml.metrics(facts)).decode()
    ids = 'gpu="0",uuid="GPU-0",pci_bus_id="0000:19:00.0"'
    assert f'nodehealth_gpu_ecc_errors_total{{{ids},type="corrected",scope="volatile"}} 3' in text
    assert f'nodehealth_gpu_nvlink_active{{{ids},link="1"}} 1' in text
    assert f'nodehealth_gpu_clocks_event_active{{{ids},reason="gpu_idle"}} 1' in text
    assert f'nodehealth_gpu_utilization_ratio{{{ids},resource="gpu"}} 0' in text
    assert 'nodehealth_gpu_driver_info{driver_version="535.154.05",cuda_driver_version="12.2"} 1' in text
    assert nvml.counters(facts)["GPU-0:nvlink0:crc_flit"] == 4
    assert nvml.counters(facts)["GPU-0:clocks_hw_power_brake_ns"] == 9


def test_bus_ids_join_sysfs_and_the_kernel_log():
    assert nvml.canonical_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert nvml.canonical_bus_id("0019:01:00.0") == "0019:01:00.0"
    assert nvml.canonical_bus_id("garbage") is None and nvml.canonical_bus_id(None) is None


GARBAGE = st.one_of(st.none(), st.integers(-5, 10**12), st.text(max_size=8), st.lists(st.integers(), max_size=5),
                   st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))
ANSWER = st.one_of(st.just(("ok", None)), st.just(("ok", None)), st.just(("ok", None)),
                   st.tuples(st.just("error"), st.sampled_from(sorted(NVML_ERRORS.values()))),
                   st.tuples(st.just("garbage"), GARBAGE))


class Chaos:
    """A backend where any call may raise any NVML error (or return garbage), in any order: it
    replays a plan drawn up front (hypothesis cannot draw from the per-GPU threads)."""

    def __init__(self, inner: FakeNvmlBackend, plan: list):
        self.inner, self.plan, self.name = inner, list(plan), "chaos"
        self.lock = threading.Lock()

    def init(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def _answer(self, real, *args):
        """The plan's next answer instead of the real one: an error, garbage, or the real call."""
        with self.lock:
            kind, value = self.plan.pop(0) if self.plan else ("ok", None)
        if kind == "error":
            raise NvmlError(value)
        if kind == "garbage":
            return value
        return real(*args)

    def call(self, fn, *args):
        return self._answer(self.inner.call, fn, *args)

    def fields(self, index, wanted):
        return self._answer(self.inner.fields, index, wanted)


def judge_every_nvml_check(facts) -> None:
    """Export, count and judge whatever a pass collected: no crash, no check that fails."""
    from nodehealth import registry
    from nodehealth.engine import run_check
    from nodehealth.model import CollectorResult, Observed, Severity
    exporter.render(nvml.metrics(facts))
    nvml.counters(facts)
    results = {"nvml": CollectorResult("nvml", True, True, 0.0, None, facts)}
    obs = Observed({"nvml": facts}, {}, 0.0)
    for check in registry.CHECKS:
        if check.NEEDS == ("nvml",):
            for f in run_check(check, results, obs, check.DEFAULTS):
                assert f.reason != "CheckFailed", f.message
                assert isinstance(f.severity, Severity) and f.message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ANSWER, max_size=300))
def test_any_error_at_any_call_still_completes_the_pass(tmp_path, plan):
    host = machine(tmp_path, [H100, dict(H100, nvmlDeviceGetUUID="GPU-1")])
    inner = FakeNvmlBackend(str(tmp_path / "nvml.json"))
    nvml._backend, nvml._backend_key = Chaos(inner, plan), nvml.scenario_path(host.root)
    judge_every_nvml_check(nvml.collect(host, nvml.DEFAULTS))


MIG_A100 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "nvml", "datadog",
                        "a100-mig-1g10gb.nvml.json")


def mig_scenario() -> dict:
    with open(MIG_A100, encoding="utf-8") as f:
        return json.load(f)


def test_a_gpu_in_mig_mode_lists_its_mig_devices(tmp_path):
    """The seven 1g.10gb devices of DataDog/datadog-agent#33120's A100, in `nvidia-smi -L` order, so that a
    pod given a MIG device (the device plugin's mixed strategy) is placed on its GPU."""
    scenario = mig_scenario()
    facts = nvml.collect(machine(tmp_path, scenario["gpus"]), nvml.DEFAULTS)
    [g] = facts.gpus
    assert g.mig_enabled is True and g.uuid == "GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16"
    assert [m.uuid for m in g.mig_devices] == [
        scenario["gpus"][0]["nvmlDeviceGetMigDeviceHandleByIndex"][str(i)]["uuid"] for i in range(7)]
    assert {m.gpu_instance for m in g.mig_devices} == {None}  # the capture shows no GPU instance ids
    assert g.unknown == {} and facts.missing_functions == ()


def test_mig_devices_with_instance_ids_gaps_and_trouble(tmp_path):
    """Constructed: GPU instance ids where NVML gives them, an empty slot (NotFound), a slot that times out
    (the MIG group is unknown, the rest stays), and a GPU without MIG, which is not asked at all."""
    devices = {"0": {"uuid": "MIG-feb88891-0321-5fef-9c87-d4af3b54259e", "gpuInstanceId": 7},
               "1": {"error": "NotFound"}, "2": {"error": "Timeout"},
               "3": {"uuid": "MIG-36c795f2-5cf7-55d6-af30-e535e79b7bb6", "gpuInstanceId": 10}}
    mig = dict(H100, nvmlDeviceGetMigMode=[1, 1], nvmlDeviceGetMaxMigDeviceCount=7,
               nvmlDeviceGetMigDeviceHandleByIndex=devices)
    plain = dict(H100, nvmlDeviceGetUUID="GPU-1", nvmlDeviceGetMigMode=[0, 0],
                 nvmlDeviceGetMigDeviceHandleByIndex={"0": {"error": "Unknown"}})
    facts = nvml.collect(machine(tmp_path, [mig, plain]), nvml.DEFAULTS)
    g, p = facts.gpus
    assert [(m.uuid[:12], m.gpu_instance) for m in g.mig_devices] == [("MIG-feb88891", 7), ("MIG-36c795f2", 10)]
    assert g.unknown == {"mig": "Timeout"}
    assert p.mig_devices == () and p.unknown == {}


def test_a_lost_gpu_keeps_the_mig_devices_of_its_last_good_read(tmp_path):
    """A GPU that falls off the bus answers nothing; the daemon still knows its MIG devices, so the pods on
    them are named next to its Xid 79."""
    machine(tmp_path, mig_scenario()["gpus"])
    backend = FakeNvmlBackend(str(tmp_path / "nvml.json"))
    good = nvml.read_gpu(backend, 0, set())
    backend.scenario["errors"] = [{"gpu": 0, "fn": "*", "error": "GpuIsLost"}]
    lost = nvml.read_gpu(backend, 0, set())
    assert lost.lost and len(good.mig_devices) == 7 and lost.mig_devices == good.mig_devices
