"""NVML calls and CPU per collector pass for 8 GPUs through the real pynvml and the C fake library.

The fake libnvidia-ml.so.1 (tests/fakelib) answers from memory, so the time is pynvml's ctypes cost
plus nodehealth's own; calls are counted where pynvml looks up the C function of each call.
`--collector FILE` runs another version of collectors/nvml.py (an earlier commit's, for before and
after). Usage: python benchmarks/nvml_clib.py [--passes 100] [--collector FILE]
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import sys
import tempfile
import time

from common import ROOT, machine, median

sys.path.insert(0, os.path.join(ROOT, "tests", "fakelib"))

import fakelib  # noqa: E402

from nodehealth.host import HostPaths  # noqa: E402


def collector(path: str | None):
    if path is None:
        from nodehealth.collectors import nvml
        return nvml
    spec = importlib.util.spec_from_file_location("nvml_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--passes", type=int, default=100)
    p.add_argument("--collector", help="another collectors/nvml.py to run")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="nvml-clib-")
    root = machine("nvml-h100-healthy")
    env = fakelib.environment(os.path.join(root, "nvml.json"), work)
    ctypes.CDLL(os.path.join(env["LD_LIBRARY_PATH"].split(":")[0], fakelib.LIBRARY), mode=ctypes.RTLD_GLOBAL)
    os.environ.update({k: env[k] for k in ("FAKE_NVML_SCENARIO", "NODEHEALTH_NVML_BACKEND")})
    import pynvml

    calls = {}
    lookup = pynvml._nvmlGetFunctionPointer

    def counting(name):
        calls[name] = calls.get(name, 0) + 1
        return lookup(name)
    pynvml._nvmlGetFunctionPointer = counting
    nvml = collector(args.collector)
    host = HostPaths(root)
    facts = nvml.collect(host, nvml.DEFAULTS)  # starts NVML and takes the handles
    assert nvml._backend.name == "nvml" and len(facts.gpus) == 8 and not any(g.unknown for g in facts.gpus)
    calls.clear()
    cpu, wall = [], []
    for _ in range(args.passes):
        c0, w0 = time.process_time(), time.perf_counter()
        nvml.collect(host, nvml.DEFAULTS)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    total = sum(calls.values()) / args.passes
    top = sorted(calls.items(), key=lambda kv: -kv[1])[:4]
    print(f"passes: {args.passes} over nvml-h100-healthy (8x H100, 18 NVLinks each), real pynvml "
          f"{pynvml.__version__ if hasattr(pynvml, '__version__') else ''} on the C fake libnvidia-ml")
    print(f"collect: median CPU {median(cpu) * 1000:.2f} ms, wall {median(wall) * 1000:.2f} ms per pass")
    print(f"NVML C calls per pass: {total:.0f} ({total / 8:.1f} per GPU); most: "
          + ", ".join(f"{name} {n / args.passes:.0f}" for name, n in top))


if __name__ == "__main__":
    main()
