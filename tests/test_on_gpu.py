"""What only a real NVIDIA GPU proves: NVML's facts against nvidia-smi, a check on a GPU host, the
hang timer's CUDA path on a real kernel and NCCL. Skipped where no GPU answers `nvidia-smi -L`
(CI has none); run on a GPU node as `python -m pytest tests/test_on_gpu.py -v`."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from conftest import free_port, wait_for

from nodehealth.collectors import nvml
from nodehealth.hang import record, timer
from nodehealth.host import HostPaths


def _gpu_host() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = pytest.mark.skipif(not _gpu_host(), reason="no NVIDIA GPU here (nvidia-smi -L)")


@pytest.fixture(scope="module")
def smi() -> ET.Element:
    out = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True, timeout=60, check=True)
    return ET.fromstring(out.stdout)


@pytest.fixture(scope="module")
def facts():
    nvml.reset_backend()
    return nvml.collect(HostPaths("/"), nvml.DEFAULTS)


def text(node: ET.Element, path: str) -> str | None:
    found = node.find(path)
    return found.text.strip() if found is not None and found.text is not None else None


def number(node: ET.Element, path: str) -> int | None:
    value = text(node, path)
    try:
        return int(value.split()[0].rstrip("x")) if value else None
    except ValueError:
        return None


def test_nvml_facts_are_what_nvidia_smi_shows(smi, facts):
    """Identity, modes and counters, GPU by GPU (nvidia-smi orders GPUs by PCI address, as NVML does)."""
    assert facts.backend == "nvml" and facts.init_error is None
    assert facts.driver_version == text(smi, "driver_version")
    gpus = smi.findall("gpu")
    assert facts.device_count == len(gpus) == int(text(smi, "attached_gpus"))
    for g, x in zip(facts.gpus, gpus):
        assert g.unknown == {}, g.unknown
        assert nvml.canonical_bus_id(x.get("id")) == g.pci_bus_id
        assert (g.uuid, g.name, g.serial, g.vbios) == (text(x, "uuid"), text(x, "product_name"), text(x, "serial"),
                                                       text(x, "vbios_version"))
        assert g.persistence_mode == (text(x, "persistence_mode") == "Enabled")
        assert g.ecc_enabled == (text(x, "ecc_mode/current_ecc") == "Enabled")
        assert g.mig_enabled in (None, text(x, "mig_mode/current_mig") == "Enabled")
        assert g.pcie.max_gen == number(x, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")
        assert g.pcie.max_width == number(x, "pci/pci_gpu_link_info/link_widths/max_link_width")
        rows = x.find("remapped_rows")
        if g.remapped_rows is not None and rows is not None and number(rows, "remapped_row_corr") is not None:
            assert (g.remapped_rows.correctable, g.remapped_rows.uncorrectable) == (
                number(rows, "remapped_row_corr"), number(rows, "remapped_row_unc"))
            assert g.remapped_rows.pending == (text(rows, "remapped_row_pending") == "Yes")
            assert g.remapped_rows.failure == (text(rows, "remapped_row_failure") == "Yes")
        volatile = [number(e, ".") for e in x.findall("ecc_errors/volatile/*")]
        if volatile and all(v == 0 for v in volatile if v is not None) and g.ecc is not None:
            assert (g.ecc.volatile_corrected, g.ecc.volatile_uncorrected) == (0, 0)
        temperature = number(x, "temperature/gpu_temp")
        if temperature is not None and g.temperature_c is not None:
            assert abs(g.temperature_c - temperature) <= 5  # read a moment apart


def test_check_reads_every_gpu_fact_on_this_host(tmp_path):
    """`nodehealth check --json` on the GPU host itself: NVML started, and no GPU check says unknown."""
    out = subprocess.run([sys.executable, "-m", "nodehealth.cli", "check", "--json", "--state-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    doc = json.loads(out.stdout)
    collectors = {c["name"]: c for c in doc["collectors"]}
    assert collectors["nvml"]["supported"] and collectors["nvml"]["success"], collectors["nvml"]
    gpu = [f for f in doc["findings"] if f.get("subsystem") == "gpu"]
    assert not [f for f in gpu if f.get("severity") == "unknown"], gpu
    print(json.dumps(doc, indent=2))


@pytest.fixture
def nccl_world_of_one(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        pytest.skip("torch without CUDA or NCCL")
    torch.cuda.set_device(0)
    t = timer.enable(str(tmp_path), interval=0.05)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield t, torch, dist
    dist.destroy_process_group()
    t.uninstall()


def test_a_collective_on_the_gpu_stays_pending_while_its_stream_is_busy(nccl_world_of_one):
    """The CUDA path end to end: an all_reduce queued behind a kernel that spins ~1 s returns at once
    to Python, stays pending in the record (its event queried through cuEventQuery, not the GIL-holding
    fallback) until the kernel ends, then completes with the time it really took."""
    t, torch, dist = nccl_world_of_one
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x)  # NCCL's communicator is made on the first call
    torch.cuda.synchronize()

    world = dist.group.WORLD.group_name

    def state() -> dict:
        t.publish()
        return record.read_record(t.path)["groups"][world]
    assert wait_for(lambda: state()["pending"] == [], timeout=30)
    torch.cuda._sleep(int(2e9))  # cycles: about a second at the H100's clocks
    dist.all_reduce(x)
    [pending] = state()["pending"]
    assert pending["op"] == "all_reduce" and pending["seq"] == 2
    torch.cuda.synchronize()
    assert wait_for(lambda: state()["pending"] == [], timeout=10)
    assert record.read_record(t.path)["gpu_poll"] == "cuEventQuery (GIL released)"
    done = state()["recent"][-1]
    assert done["op"] == "all_reduce" and done["seconds"] > 0.2 and "error" not in done, done
    assert x[0].item() == 1.0  # a world of one sums to itself


def test_the_cuda_overhead_benchmark_runs():
    """benchmarks/hang_overhead_cuda.py as a smoke (tiny sizes; its figures go to RESULTS.md)."""
    pytest.importorskip("torch")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "benchmarks/hang_overhead_cuda.py", "--iters", "20", "--rounds", "2"],
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert len(re.findall(r"^ +\d+ bytes, +(issue|until done): without +[\d.]+ us/op, with +[\d.]+ us/op",
                          run.stdout, re.M)) == 4, run.stdout
    assert "gpu_poll: cuEventQuery (GIL released); last_error: None" in run.stdout, run.stdout
