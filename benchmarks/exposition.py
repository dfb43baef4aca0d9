"""/metrics text of the H100 fixture: our hand-written exposition vs prometheus_client's, side by side.

Both render the same families, those a daemon pass over tests/fixtures/machines/h100-8x-cx7 gives plus the
process_* families: ours with exporter.render(), prometheus_client's with generate_latest() over a
collector that hands it the same families (what using it for /metrics would take). CPU per render
(time.process_time), interleaved in rounds; then the start-up cost of importing prometheus_client, as
whole processes (python -c 'import prometheus_client' vs python -c 'pass').
Usage: python benchmarks/exposition.py [--renders 200] [--rounds 7] [--runs 20]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from common import machine, median, timed_run

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from prometheus_client import generate_latest  # noqa: E402
from prometheus_client.core import CollectorRegistry  # noqa: E402
from prometheus_client.core import Metric as ClientMetric

from nodehealth import config, exporter, node_pass  # noqa: E402
from nodehealth.process_metrics import process_metrics  # noqa: E402


class Families:
    """A prometheus_client collector over our families (histograms left out: ours only, not comparable)."""

    def __init__(self, metrics):
        self.metrics = [m for m in metrics if m.kind != "histogram"]

    def collect(self):
        for m in self.metrics:
            name = m.name[:-len("_total")] if m.kind == "counter" else m.name
            family = ClientMetric(name, m.help, m.kind)
            for labels, value in m.samples:
                family.add_sample(m.name, dict(zip(m.labels, labels)), value)
            yield family


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--renders", type=int, default=200)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    cfg = config.defaults()
    engine = node_pass.build_engine(cfg, machine("h100-8x-cx7"))
    report = node_pass.run(engine, cfg, "bench", read_state=False)
    metrics = exporter.report_metrics(report, engine.collectors, report.rates) + process_metrics()
    metrics = [m for m in metrics if m.kind != "histogram"]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(metrics))
    samples = sum(len(m.samples) for m in metrics)
    ours, theirs = [], []
    for _ in range(args.rounds):
        t0 = time.process_time()
        for _ in range(args.renders):
            exporter.render(metrics)
        ours.append((time.process_time() - t0) / args.renders)
        t0 = time.process_time()
        for _ in range(args.renders):
            generate_latest(registry)
        theirs.append((time.process_time() - t0) / args.renders)
    print(f"families: {len(metrics)}, samples: {samples} (h100-8x-cx7 and process_*); "
          f"{args.rounds} rounds x {args.renders} renders, interleaved")
    print(f"exporter.render                   median CPU {median(ours) * 1000:6.2f} ms per render")
    print(f"prometheus_client generate_latest median CPU {median(theirs) * 1000:6.2f} ms per render "
          f"({median(theirs) / median(ours):.1f}x)")
    bare, imported = [], []
    for _ in range(args.runs):
        bare.append(timed_run([sys.executable, "-c", "pass"]))
        imported.append(timed_run([sys.executable, "-c", "import prometheus_client"]))
    print(f"import prometheus_client: +{(median(imported) - median(bare)) * 1000:.1f} ms of start-up "
          f"(median of {args.runs} whole processes each, interleaved)")


if __name__ == "__main__":
    main()
