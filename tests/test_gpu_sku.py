"""The SKU table and matcher, the shared helpers, and a property test of every GPU check."""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.checks import clocks, gpu_driver, gpu_memory, gpu_pcie, nvlink, nvlink_errors
from nodehealth.checks.gpu_sku import SKUS, device_of, match_sku, unknown_findings
from nodehealth.collectors.gpu_facts import (
    ARCHITECTURES,
    Clocks,
    EccCounts,
    Gpu,
    NvLink,
    NvmlFacts,
    Pcie,
    RemappedRows,
    RetiredPages,
    rate_key,
)
from nodehealth.collectors.pcie import PciDevice
from nodehealth.collectors.pcie import Pcie as PcieBus
from nodehealth.model import Action, Observed, Severity

NAMES = [
    # product names as nvidia-smi / NVML print them (shared/fixtures/nvidia-smi and NVIDIA's naming)
    ("NVIDIA A100-SXM4-40GB", "A100 SXM4"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM4"),
    ("NVIDIA A100-SXM-64GB", "A100 SXM4"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe"),
    ("NVIDIA A800-SXM4-80GB", "A800 SXM4"),
    ("NVIDIA A800 80GB PCIe", "A800 PCIe"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM5"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H800", "H800 SXM5"),
    ("NVIDIA H800 PCIe", "H800 PCIe"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA H20", "H20"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"),
    ("Tesla V100-SXM2-16GB", "V100 SXM2"),
    ("  nvidia   h100_80gb-hbm3 ", "H100 SXM5"),  # case, spaces, hyphens and underscores do not matter
]
UNKNOWN_NAMES = [None, "", "NVIDIA GeForce RTX 4090", "NVIDIA A10", "NVIDIA A10G", "NVIDIA A40", "Tesla T4",
                 "NVIDIA L40S", "NVIDIA H1000", "NVIDIA H100", "GRID P4-1Q", "Graphics Device",
                 "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"]


@pytest.mark.parametrize("name, sku", NAMES)
def test_product_names_match_their_sku(name, sku):
    assert match_sku(name).name == sku


@pytest.mark.parametrize("name", UNKNOWN_NAMES)
def test_unknown_products_match_nothing(name):
    assert match_sku(name) is None


def test_longest_pattern_wins_and_whole_words_only():
    assert match_sku("NVIDIA H200 NVL").name == "H200 NVL"  # not "H200"
    assert match_sku("NVIDIA H200").name == "H200 SXM"  # "H20" is not a word of it
    assert match_sku("NVIDIA GB200").name == "GB200"  # "B200" is not a word of it
    assert match_sku("NVIDIA H800 PCIe").name == "H800 PCIe"  # not "H800"


def test_pcie_cards_expect_no_nvlinks():
    """Bridges are optional on PCIe cards: expecting links raised false alarms (NVSentinel PR #1481)."""
    for sku in SKUS:
        if "PCIe" in sku.name or "NVL" in sku.name:
            assert sku.nvlinks is None, sku.name


def test_table_is_consistent():
    assert len({s.name for s in SKUS}) == len(SKUS)
    patterns = [p.lower() for s in SKUS for p in s.patterns]
    assert len(set(patterns)) == len(patterns)
    for sku in SKUS:
        assert sku.architecture in ARCHITECTURES.values(), sku.name
        assert sku.nvlink_speed_mbps is None or sku.nvlinks, sku.name
        assert sku.min_driver is None or all(isinstance(n, int) for n in sku.min_driver), sku.name
        assert sku.pcie_gen in (None, 3, 4, 5, 6) and sku.pcie_width in (None, 16), sku.name


def test_expectations_from_the_doc():
    h100, a100, h800, b200 = (match_sku(n) for n in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB",
                                                     "NVIDIA H800", "NVIDIA B200"))
    assert (h100.nvlinks, h100.nvlink_speed_mbps, h100.pcie_gen, h100.pcie_width) == (18, 26562, 5, 16)
    assert (a100.nvlinks, a100.nvlink_speed_mbps, a100.pcie_gen, a100.min_driver) == (12, 25000, 4, (450,))
    assert (h800.nvlinks, h800.min_driver) == (8, (520,))
    assert (b200.nvlinks, b200.nvlink_speed_mbps, b200.min_driver) == (18, 53125, (570, 133, 20))


def test_rate_key_and_device():
    gpu = Gpu(index=3, uuid="GPU-abc", pci_bus_id="0000:19:00.0")
    assert rate_key(gpu, "nvlink5:crc_flit") == "GPU-abc:nvlink5:crc_flit"
    assert rate_key(Gpu(index=3), "pcie_replay") == "3:pcie_replay"
    assert device_of(gpu) == "0000:19:00.0"
    assert device_of(Gpu(index=3, uuid="GPU-abc")) == "GPU-abc"
    assert device_of(Gpu(index=3)) == "GPU 3"


def test_unknown_findings_name_only_the_groups_asked_for():
    gpu = Gpu(index=1, pci_bus_id="0000:2a:00.0", unknown={"remapped_rows": "Timeout", "clocks": "Unknown"})
    (f,) = unknown_findings("gpu_memory", gpu, ("ecc", "remapped_rows"))
    assert (f.check, f.severity, f.reason, f.device) == ("gpu_memory", Severity.UNKNOWN, "GpuFactsUnknown",
                                                         "0000:2a:00.0")
    assert "remapped_rows (Timeout)" in f.message and "clocks" not in f.message
    assert unknown_findings("nvlink", gpu, ("nvlink",)) == []


@given(st.text(max_size=40))
@settings(max_examples=200, deadline=None)
def test_matcher_never_raises(name):
    sku = match_sku(name)
    assert sku is None or sku in SKUS


# -- every GPU check, on random facts --------------------------------------------------------------

CHECKS = (gpu_memory, nvlink, nvlink_errors, gpu_pcie, clocks, gpu_driver)
NODE_REASONS = {"NvmlInitFailed", "NvmlLibraryNotFound", "GpusMissing", "DriverTooOld", "NvmlFunctionsMissing"}
BUS_IDS = ["0000:19:00.0", "0000:2a:00.0", "0000:3b:00.0", "0000:5d:00.0"]
GROUPS = ["all", "identity", "ecc", "remapped_rows", "retired_pages", "nvlink", "pcie", "clocks", "utilization",
          "thermal"]
RATE_NAMES = ["ecc_volatile_corrected", "ecc_volatile_uncorrected", "pcie_replay", "clocks_hw_slowdown_ns",
              "clocks_hw_thermal_ns", "clocks_hw_power_brake_ns", "clocks_sw_thermal_ns"]
LINK_RATES = ["crc_flit", "crc_data", "replay", "recovery"]

ints = st.none() | st.integers(-3, 10**12)
small = st.none() | st.integers(-1, 64)
floats = st.none() | st.floats(allow_nan=True, allow_infinity=True)
bools = st.none() | st.booleans()
names = st.none() | st.sampled_from([n for n, _ in NAMES] + UNKNOWN_NAMES[1:]) | st.text(max_size=20)
links = st.builds(NvLink, link=st.integers(0, 20), active=bools, version=ints, speed_mbps=floats, crc_flit=ints,
                  crc_data=ints, replay=ints, recovery=ints)
gpus = st.builds(
    Gpu, index=st.integers(0, 15), uuid=st.none() | st.sampled_from(["GPU-a", "GPU-b", "GPU-c"]), name=names,
    pci_bus_id=st.none() | st.sampled_from(BUS_IDS), architecture=st.none() | st.sampled_from(["ampere", "volta"]),
    mig_enabled=bools, ecc_enabled=bools, ecc_pending=bools,
    ecc=st.none() | st.builds(EccCounts, ints, ints, ints, ints),
    retired_pages=st.none() | st.builds(RetiredPages, ints, ints, bools),
    remapped_rows=st.none() | st.builds(RemappedRows, st.integers(0, 10**6), st.integers(-1, 10**6), st.booleans(),
                                        st.booleans()),
    nvlinks=st.lists(links, max_size=18).map(tuple),
    pcie=st.none() | st.builds(Pcie, small, small, small, small, ints, floats, floats),
    clocks=st.none() | st.builds(Clocks, st.none() | st.integers(-1, 0x3FF), ints, ints, ints, ints),
    temperature_c=floats, power_w=floats, power_limit_w=floats, utilization_gpu_percent=floats,
    lost=st.booleans(), reset_required=st.booleans(),
    unknown=st.dictionaries(st.sampled_from(GROUPS), st.sampled_from(["Timeout", "Unknown", "NotReady"])))


def _bus(addresses: list[str]) -> PcieBus:
    return PcieBus(tuple(PciDevice(address=a, kind="gpu", vendor_id=0x10DE, device_id=None, current_speed_gts=None,
                                   max_speed_gts=None, current_width=None, max_width=None, parent_address=None,
                                   parent_max_speed_gts=None, parent_max_width=None, aer={}) for a in addresses))


@st.composite
def observations(draw):
    nvml_gpus = tuple(draw(st.lists(gpus, max_size=3)))
    facts = NvmlFacts(
        backend="test", driver_version=draw(st.none() | st.sampled_from(["535.154.05", "450.51.05", "x.1", ""])),
        cuda_driver_version=None, device_count=draw(st.none() | st.integers(0, 8)), gpus=nvml_gpus,
        missing_functions=tuple(draw(st.lists(st.text(min_size=1, max_size=10), max_size=3))),
        init_error=draw(st.none() | st.sampled_from(["DriverNotLoaded", "LibRmVersionMismatch", "LibraryNotFound"])))
    keys = [rate_key(g, n) for g in nvml_gpus for n in RATE_NAMES]
    keys += [rate_key(g, f"nvlink{link.link}:{n}") for g in nvml_gpus for link in g.nvlinks for n in LINK_RATES]
    rates = draw(st.dictionaries(st.sampled_from(keys), st.floats(0, 1e12))) if keys else {}
    observed = {"nvml": facts}
    if draw(st.booleans()):
        observed["pcie"] = _bus(draw(st.lists(st.sampled_from(BUS_IDS), unique=True)))
    return Observed(observed, {"nvml": rates}, now=1000.0)


@given(obs=observations())
@settings(max_examples=150, deadline=None)
def test_checks_never_raise_and_give_valid_findings(obs):
    devices = {device_of(g) for g in obs.facts["nvml"].gpus}
    for check in CHECKS:
        for f in check.judge(obs, dict(check.DEFAULTS)):
            assert f.check == check.NAME
            assert isinstance(f.severity, Severity) and isinstance(f.action, Action)
            assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", f.reason)
            assert f.message and f.message.endswith(".")
            assert f.device == "" if f.reason in NODE_REASONS else f.device in devices
            assert f.severity is not Severity.FATAL or f.action is not Action.NONE
            json.dumps(f.to_dict())  # goes into the state file and the JSON report
