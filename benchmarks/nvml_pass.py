"""One NVML collector pass over the fake 8x H100 scenario: CPU time, wall time, NVML calls.

The fake answers from memory, so this measures nodehealth's own cost per pass (the facts, the
metrics, the checks); a real driver adds its own time per call, which is why the call count is
recorded too. Usage: python benchmarks/nvml_pass.py [--passes 200]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from common import machine, median

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nodehealth import config, exporter, registry  # noqa: E402
from nodehealth.collectors import nvml  # noqa: E402
from nodehealth.engine import Engine  # noqa: E402
from nodehealth.host import HostPaths  # noqa: E402
from nodehealth.model import Report, verdict  # noqa: E402


class Counting:
    """The started backend, counting calls."""

    def __init__(self, inner):
        self.inner, self.name, self.calls = inner, inner.name, 0

    def call(self, fn, *args):
        self.calls += 1
        return self.inner.call(fn, *args)

    def fields(self, index, wanted):
        self.calls += 1  # one nvmlDeviceGetFieldValues call for all of them
        return self.inner.fields(index, wanted)

    def init(self):
        self.inner.init()

    def shutdown(self):
        self.inner.shutdown()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--passes", type=int, default=200)
    args = p.parse_args()
    host = HostPaths(machine("nvml-h100-healthy"))
    counting = Counting(nvml.backend_for(host))
    nvml._backend = counting
    checks = [c for c in registry.CHECKS if c.NEEDS == ("nvml",)]
    engine = Engine([nvml], checks, host, config.defaults())
    engine.run()
    cpu, wall, rendered = [], [], []
    calls_before = counting.calls
    for _ in range(args.passes):
        c0, w0 = time.process_time(), time.perf_counter()
        results, findings = engine.run()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        report = Report("bench", verdict(findings), findings, list(results.values()))
        c1 = time.process_time()
        exporter.render(exporter.report_metrics(report, [nvml]))
        rendered.append(time.process_time() - c1)
    calls = (counting.calls - calls_before) / args.passes
    print(f"passes: {args.passes} over nvml-h100-healthy (8x H100, 18 NVLinks each, fake backend)")
    print(f"pass (collect + judge): median CPU {median(cpu) * 1000:.2f} ms, wall {median(wall) * 1000:.2f} ms")
    print(f"/metrics render: median CPU {median(rendered) * 1000:.2f} ms")
    print(f"NVML calls per pass: {calls:.0f} ({calls / 8:.0f} per GPU)")


if __name__ == "__main__":
    main()
