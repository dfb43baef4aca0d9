"""docs/metrics.md's joins with dcgm-exporter, run by promtool on series with the label forms each
exporter writes: ours from the nvml-h100-healthy fixture's golden /metrics, dcgm-exporter's as it
labels a GPU (gpu, UUID, NVML's pci_bus_id, device, modelName, Hostname)."""
from __future__ import annotations

import re
import subprocess

import yaml
from conftest import HERE, require_tool
from test_docs import read

GPU1 = {"gpu": "1", "uuid": "GPU-7c3cadbd-17e5-0913-f69b-c618122ea0cd", "pci_bus_id": "0000:2a:00.0"}
DCGM = ('{gpu="1",UUID="GPU-7c3cadbd-17e5-0913-f69b-c618122ea0cd",pci_bus_id="00000000:2A:00.0",device="nvidia1",'
        'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-h100-07",instance="10.0.0.7:9400",job="dcgm-exporter"}')


def documented(name: str) -> str:
    m = re.search(rf"<!-- promql: {name} -->\n```promql\n(.*?)\n```", read("docs/metrics.md"), re.S)
    assert m, name
    return " ".join(m.group(1).split())


def our_gpu1_info() -> str:
    with open(f"{HERE}/golden/nvml-h100-healthy.metrics.txt", encoding="utf-8") as f:
        [line] = [x for x in f if x.startswith("nodehealth_gpu_info{") and f'uuid="{GPU1["uuid"]}"' in x]
    assert f'pci_bus_id="{GPU1["pci_bus_id"]}"' in line and f'gpu="{GPU1["gpu"]}"' in line
    return line.rsplit(" ", 1)[0].replace("{", '{instance="gpu-h100-07",job="nodehealth",', 1)


def test_the_documented_joins_give_each_dcgm_gpu_our_facts(tmp_path):
    promtool = require_tool("promtool")
    info = our_gpu1_info()
    serial = re.search(r'serial="([^"]*)"', info).group(1)
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": "DCGM_FI_DEV_GPU_TEMP" + DCGM, "values": "41x3"},
            {"series": info, "values": "1x3"},
            {"series": 'nodehealth_gpu_xid_events_total{instance="gpu-h100-07",job="nodehealth",'
                       f'pci_bus_id="{GPU1["pci_bus_id"]}",xid="79"}}', "values": "1x3"},
        ],
        "promql_expr_test": [
            {"expr": documented("dcgm-temperature-with-serial"), "eval_time": "2m",
             "exp_samples": [{"labels": DCGM[:-1] + f',serial="{serial}",nodehealth_bus_id="{GPU1["pci_bus_id"]}"}}',
                              "value": 41}]},
            {"expr": documented("xids-by-dcgm-uuid"), "eval_time": "2m",
             "exp_samples": [{"labels": f'{{UUID="{GPU1["uuid"]}",xid="79"}}', "value": 1}]},
        ]}]}
    path = tmp_path / "join.test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
