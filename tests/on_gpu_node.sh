#!/usr/bin/env bash
# What only a real NVIDIA GPU proves, in one run on a GPU node (docs/development.md, "On a GPU node"):
#   OUT=DIR bash tests/on_gpu_node.sh
# Installs this checkout into the node's python3 (which must already hold the dependencies, and torch
# with CUDA for the hang timer's GPU path), then writes under $OUT: nvidia-smi -q (text and XML), an NVML
# capture (nvml.json, tests/fixtures/nvml/capture.py), `check --json`, the daemon's /metrics, the NVML
# pass's timing, the hang timer's cost on CUDA (benchmarks/hang_overhead_cuda.py) and the GPU tests'
# log. It changes nothing on the node but the Python install.
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-gpu-node-out}
mkdir -p "$OUT"
STATE=$(mktemp -d)  # the runs' state directories and the daemon's log, kept out of $OUT
trap 'rm -rf "$STATE"' EXIT
export PYTHONUNBUFFERED=1
N=$OUT/notes.txt
{ date -u; uname -r; nvidia-smi -L; python3 -c 'import sys, torch; print(sys.version, torch.__version__, torch.version.cuda, torch.cuda.is_available())'; } >"$N" 2>&1
nvidia-smi -q >"$OUT/nvidia-smi-q.txt" 2>&1
nvidia-smi -q -x >"$OUT/nvidia-smi-q.xml" 2>&1
{ python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || python3 -m pip install -q --no-deps --no-build-isolation --no-index . ; } >>"$N" 2>&1
echo "install rc=$?" >>"$N"
# -P: the installed package, not ./nodehealth (whose collectors/ and checks/ live beside it)
python3 -P tests/fixtures/nvml/capture.py --out "$OUT" >>"$N" 2>&1
python3 -P -m nodehealth.cli check --json --state-dir "$STATE/1" >"$OUT/check.json" 2>>"$N"; echo "check --json rc=$?" >>"$N"
python3 -P -m nodehealth.cli check -v --state-dir "$STATE/2" >>"$N" 2>&1; echo "check -v rc=$?" >>"$N"
python3 -P - >>"$N" 2>&1 <<'PY'
import time
from nodehealth.collectors import nvml
from nodehealth.host import HostPaths
host = HostPaths("/")
t = time.perf_counter(); nvml.collect(host, nvml.DEFAULTS); first = time.perf_counter() - t
walls = []
for _ in range(30):
    t = time.perf_counter(); nvml.collect(host, nvml.DEFAULTS); walls.append(time.perf_counter() - t)
walls.sort()
print(f"nvml.collect wall time on this host: first {first * 1000:.1f} ms; next 30: median {walls[15] * 1000:.2f} ms, max {walls[-1] * 1000:.2f} ms")
PY
python3 -P -m nodehealth.cli daemon --listen 127.0.0.1:9456 --state-dir "$STATE/3" --interval 5 >"$STATE/daemon.log" 2>&1 &
daemon=$!
python3 - "$OUT/metrics.txt" >>"$N" 2>&1 <<'PY'
import sys, time, urllib.request
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        body = urllib.request.urlopen("http://127.0.0.1:9456/metrics", timeout=5).read()
    except OSError:
        body = b""
    if b"nodehealth_gpu_info" in body:
        open(sys.argv[1], "wb").write(body)
        print("metrics", len(body), "bytes")
        break
    time.sleep(0.5)
else:
    print("no GPU metrics within 60 s")
PY
kill "$daemon"; wait "$daemon"; tail -20 "$STATE/daemon.log" >>"$N"
timeout 120 python3 -P benchmarks/hang_overhead_cuda.py >"$OUT/hang_overhead_cuda.txt" 2>&1
timeout 300 python3 -P -m pytest -p no:cacheprovider -v -rs tests/test_on_gpu.py tests/test_hang_timer.py >"$OUT/pytest.log" 2>&1
echo "pytest rc=$?" >>"$N"
tail -5 "$OUT/pytest.log"
cat "$N"
