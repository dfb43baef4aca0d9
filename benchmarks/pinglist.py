"""Pinglists at cluster scale: 10,000 nodes x 8 rails in leaves of 32 (313 leaves).

Times one node's list (the first call, which indexes the inventory and draws the epoch's
permutations, apart from the median of the calls after it), every node's list, the peers per rail,
the peak Python heap of inventory + index + one list (tracemalloc), and the inventory's ConfigMap
form (JSON and gzipped). Usage: python benchmarks/pinglist.py [--nodes 10000] [--rails 8]
[--leaf-size 32] [--samples 500]
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys
import time
import tracemalloc

from common import median, percentile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nodehealth.inventory import from_data, to_data  # noqa: E402
from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH_DEFAULTS  # noqa: E402
from nodehealth.pingmesh.pinglist import pinglist  # noqa: E402

EPOCH = 480_000  # about 2024-10-03 with one-hour epochs


def document(count: int, rails: int, leaf_size: int) -> dict:
    """Addresses numbered as a fabric plan would: 10.<rail>.<node / 256>.<node % 256>."""
    return {"nodes": [{"name": f"gpu-{i:05d}", "leaf": f"leaf-{i // leaf_size:03d}", "pod": f"pod-{i // 1024}",
                       "addresses": [f"10.{r}.{i // 256}.{i % 256}" for r in range(rails)]} for i in range(count)]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--rails", type=int, default=8)
    p.add_argument("--leaf-size", type=int, default=32)
    p.add_argument("--samples", type=int, default=500)
    args = p.parse_args()
    cfg = dict(PINGMESH_DEFAULTS)
    doc = document(args.nodes, args.rails, args.leaf_size)

    t0 = time.perf_counter()
    inv = from_data(doc, "benchmark")
    built = time.perf_counter() - t0
    leaves = len({n.leaf for n in inv.nodes})
    print(f"inventory: {len(inv.nodes)} nodes, {inv.rails} rails, {leaves} leaves, "
          f"inter_leaf_pairs {cfg['inter_leaf_pairs']}; validated in {built * 1000:.0f} ms")

    names = [n.name for n in inv.nodes]
    t0 = time.perf_counter()
    pinglist(inv, names[0], EPOCH, cfg)
    first = time.perf_counter() - t0
    step = max(1, len(names) // args.samples)
    times = []
    for name in names[1::step]:
        t0 = time.perf_counter()
        pinglist(inv, name, EPOCH, cfg)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    pinglist(inv, names[0], EPOCH + 1, cfg)
    next_epoch = time.perf_counter() - t0
    print(f"one node's list: first call {first * 1000:.1f} ms (indexes the inventory, draws the epoch's permutations)")
    print(f"  then median {median(times) * 1000:.2f} ms, p99 {percentile(times, 99) * 1000:.2f} ms over "
          f"{len(times)} nodes; the next epoch's first call {next_epoch * 1000:.1f} ms")

    per_rail = collections.defaultdict(list)
    total = 0
    t0 = time.perf_counter()
    for name in names:
        targets = pinglist(inv, name, EPOCH, cfg)
        total += len(targets)
        counts = collections.Counter(t.rail for t in targets)
        for rail in range(inv.rails):
            per_rail[rail].append(counts[rail])
    every = time.perf_counter() - t0
    print(f"every node's list: {every:.2f} s for {len(names)} nodes ({total} targets, "
          f"{total / len(names):.0f} per node)")
    for rail in range(inv.rails):
        values = per_rail[rail]
        print(f"  rail {rail}: peers min {min(values)} median {median(values):g} max {max(values)}")

    tracemalloc.start()
    inv = from_data(doc, "benchmark")
    pinglist(inv, names[0], EPOCH, cfg)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"peak Python heap, inventory + index + one list: {peak / 2**20:.1f} MiB")

    text = json.dumps(to_data(inv), separators=(",", ":")).encode()
    print(f"ConfigMap form: {len(text) / 2**20:.2f} MiB JSON, {len(gzip.compress(text)) / 2**20:.2f} MiB gzipped")


if __name__ == "__main__":
    main()
