"""Link bandwidth: NVLink per link and InfiniBand per port from their counters' rates between two
passes, PCIe TX/RX per GPU from NVML; in bytes per second, in the daemon's /metrics."""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from conftest import STOP_SECONDS, machine
from test_machines import compare

from nodehealth import config, exporter
from nodehealth.collectors import infiniband, nvml
from nodehealth.engine import Engine
from nodehealth.host import HostPaths
from nodehealth.model import Report, verdict

IB_PORT = "sys/class/infiniband/mlx5_0/ports/1/counters"


@pytest.fixture
def node(tmp_path):
    """h100-8x-cx7's InfiniBand ports with one GPU of nvml-h100-healthy."""
    root = tmp_path / "node"
    shutil.copytree(machine("h100-8x-cx7"), root, symlinks=True)
    with open(os.path.join(machine("nvml-h100-healthy"), "nvml.json"), encoding="utf-8") as f:
        scenario = json.load(f)
    scenario["gpus"] = scenario["gpus"][:1]
    scenario["system"]["nvmlDeviceGetCount"] = 1
    # Traffic counters (KiB): no nvidia-smi capture of this H100 host has them, so made up here.
    scenario["gpus"][0]["nvmlDeviceGetFieldValues"].update({"138,0": 1000, "138,1": 7, "139,17": 5000})
    (root / "nvml.json").write_text(json.dumps(scenario))
    nvml.reset_backend()
    yield root, scenario
    nvml.reset_backend()


def counter(root, name: str) -> int:
    return int((root / IB_PORT / name).read_text())


def test_throughput_from_two_passes(node):
    root, scenario = node
    engine = Engine([nvml, infiniband], [], HostPaths(str(root)), config.defaults())
    first = engine.collect()
    assert engine.rates(first, 1000.0) == {}  # one sample: no rate yet
    report = Report("node", verdict([]), [], list(first.values()))
    text = exporter.render(exporter.report_metrics(report, [nvml, infiniband], {})).decode()
    assert "throughput_bytes_per_second" not in text  # absent, not zero, before the second pass

    fields = scenario["gpus"][0]["nvmlDeviceGetFieldValues"]
    fields["138,0"] += 250_000  # KiB in 10 s: 25.6 MB/s
    fields["139,17"] += 1_000
    (root / "nvml.json").write_text(json.dumps(scenario))
    nvml.reset_backend()  # the fake reads its scenario when it starts
    xmit, rcv = counter(root, "port_xmit_data"), counter(root, "port_rcv_data")
    (root / IB_PORT / "port_xmit_data").write_text(f"{xmit + 12_500_000_000}\n")  # words: 5 GB/s
    (root / IB_PORT / "port_rcv_data").write_text(f"{rcv + 25}\n")
    second = engine.collect()
    rates = engine.rates(second, 1010.0)
    report = Report("node", verdict([]), [], list(second.values()))
    text = exporter.render(exporter.report_metrics(report, [nvml, infiniband], rates)).decode()
    gpu = 'gpu="0",uuid="GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1",pci_bus_id="0000:18:00.0"'
    nvlink = "nodehealth_gpu_nvlink_throughput_bytes_per_second{" + gpu
    assert f'{nvlink},link="0",direction="transmit"}} 25600000\n' in text
    assert f'{nvlink},link="17",direction="receive"}} 102400\n' in text
    assert f'{nvlink},link="1",direction="transmit"}} 0\n' in text
    assert f'{nvlink},link="1",direction="receive"' not in text  # no counter, no rate
    port = 'device="mlx5_0",port="1"'
    assert f'nodehealth_infiniband_port_throughput_bytes_per_second{{{port},direction="transmit"}} 5000000000\n' in text
    assert f'nodehealth_infiniband_port_throughput_bytes_per_second{{{port},direction="receive"}} 10\n' in text
    assert f'nodehealth_gpu_pcie_transmit_bytes_per_second{{{gpu}}} 567000\n' in text  # NVML's own sample
    compare("bandwidth.metrics.txt", "".join(line for line in text.splitlines(keepends=True)
                                             if "throughput_bytes" in line or "_pcie_transmit" in line
                                             or "_pcie_receive" in line))


def test_a_counter_that_went_back_has_no_rate(node):
    root, _ = node
    engine = Engine([infiniband], [], HostPaths(str(root)), config.defaults())
    engine.rates(engine.collect(), 1000.0)
    (root / IB_PORT / "port_xmit_data").write_text("5\n")  # reset (driver reload): no negative bandwidth
    second = engine.collect()
    rates = engine.rates(second, 1010.0)
    text = exporter.render(infiniband.rate_metrics(second["infiniband"].facts, rates["infiniband"])).decode()
    assert 'device="mlx5_0",port="1",direction="transmit"' not in text
    assert 'device="mlx5_0",port="1",direction="receive"} 0' in text


def test_the_daemon_serves_throughput_from_its_second_pass(node, tmp_path, daemon_factory):
    """A replayed machine's clock is its proc/uptime, so the test moves it on to let time pass."""
    root, _ = node
    uptime = root / "proc" / "uptime"
    start = float(uptime.read_text().split()[0])
    d = daemon_factory(str(root), str(tmp_path / "state"), interval=0.3)
    d.wait_ready()
    deadline = time.monotonic() + 10
    body = ""
    while time.monotonic() < deadline and "nodehealth_infiniband_port_throughput" not in body:
        (tmp_path / "uptime").write_text(f"{start + time.monotonic() - deadline + 20:.2f} 0.00\n")
        os.replace(tmp_path / "uptime", uptime)
        body = d.get("/metrics")[1].decode()
        time.sleep(0.1)
    assert 'nodehealth_infiniband_port_throughput_bytes_per_second{device="mlx5_0",port="1",direction="transmit"} 0' \
        in body
    assert 'link="1",direction="transmit"} 0' in body  # the NVLink family, from the same rates
    assert d.stop() < STOP_SECONDS
