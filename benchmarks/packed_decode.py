"""Decoding the controller's steady answers in the packed form, against the floor, and against another
version of packed.py side by side in one process.

A steady cycle's answer is one agent's `/v1/pingmesh?windows=6&since=S&format=packed1`: the window that
closed since the last cycle in full, the others by their start alone (benchmarks/pingmesh_controller.py
makes them, for the cluster of benchmarks/pingmesh_analyze.py). Each round decodes the same answers with
packed.loads_each, `--check-together` answers at a time (their arrays checked in one numpy pass, as the
controller and `pingmesh analyze` do), with packed.loads one at a time, with `--before` (a packed.py of
another commit, e.g. `git show REV:nodehealth/pingmesh/packed.py > /tmp/packed_before.py`) and with the
serialization alone (the floor: json.loads of the header, array.frombytes of the arrays), in an order
that alternates by round; the median of the rounds is printed, per answer.
Usage: python benchmarks/packed_decode.py [--agents 300] [--rounds 9] [--check-together 64] [--before PATH]
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import statistics
import sys
import time

from common import ROOT
from pingmesh_analyze import T0, WS, cluster
from pingmesh_controller import answers, floor

sys.path.insert(0, ROOT)

from nodehealth.pingmesh import packed  # noqa: E402

NEWEST = 6  # the open window; the controller has every window up to NEWEST - 2


def steady_answers(agents: int, nodes: int, rails: int, pairs: int) -> list[bytes]:
    names, leaf, inter = cluster(nodes, 32, pairs, rails)
    since = {n: T0 + (NEWEST - 2) * WS for n in names}
    return [data for _, data in itertools.islice(answers(names, leaf, inter, 32, rails, NEWEST, since, "packed"),
                                                 agents)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=300, help="answers decoded each round")
    p.add_argument("--nodes", type=int, default=10000)
    p.add_argument("--rails", type=int, default=8)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--before", metavar="PATH", help="another version of nodehealth/pingmesh/packed.py")
    p.add_argument("--check-together", type=int, default=64, help="answers decoded together (packed.loads_each)")
    args = p.parse_args()
    data = steady_answers(args.agents, args.nodes, args.rails, args.pairs)
    together = args.check_together
    decoders = {
        f"{together} together": lambda ds: [packed.loads_each(ds[k:k + together], stubs=True)
                                          for k in range(0, len(ds), together)],
        "one at a time": lambda ds: [packed.loads(d, stubs=True) for d in ds],
        "floor": lambda ds: [floor(d, "packed") for d in ds]}
    if args.before:
        spec = importlib.util.spec_from_file_location("packed_before", args.before)
        before = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)
        decoders["before"] = lambda ds: [before.loads(d, stubs=True) for d in ds]
    for decode in decoders.values():  # each one's memo of names lists filled, as in a steady cycle
        decode(data)
    spent: dict[str, list[float]] = {k: [] for k in decoders}
    order = list(decoders)
    for r in range(args.rounds):
        for k in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            decoders[k](data)
            spent[k].append((time.perf_counter() - t0) / len(data))
    median = {k: statistics.median(v) for k, v in spent.items()}
    print(f"{len(data)} steady answers ({sum(map(len, data)) // len(data)} bytes each), {args.rounds} rounds, "
          f"median per answer")
    for k, v in median.items():
        print(f"  {k:16s} {v * 1e6:7.1f} us  ({v / median['floor']:.2f}x the floor)")


if __name__ == "__main__":
    main()
