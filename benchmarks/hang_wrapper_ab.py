"""The timer's per-call cost before and after a change of its hot path, side by side in one process:
the wrapper of each version around a collective that does nothing (world of one, gloo, both
timers installed), in alternating rounds, so both see the same machine load.

    git show REV:nodehealth/hang/timer.py > /tmp/timer_before.py
    python benchmarks/hang_wrapper_ab.py /tmp/timer_before.py [--rounds 15] [--calls 100000]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import free_port  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("before", help="the timer.py of the earlier version")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=100000)
    args = p.parse_args()
    import torch
    import torch.distributed as dist

    from nodehealth.hang import timer as after

    spec = importlib.util.spec_from_file_location("timer_before", args.before)
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    directory = tempfile.mkdtemp()

    def nothing(tensor, group=None):
        return None

    wrappers = {}
    for name, module in (("before", before), ("after", after)):
        t = module.Timer(os.path.join(directory, name), 60.0)
        t.install()
        wrappers[name] = module._wrap(t, "all_reduce", nothing, False)
    tensor = torch.ones(16)

    def cost(wrapped) -> float:
        start = time.perf_counter()
        for _ in range(args.calls):
            wrapped(tensor)
        timed = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(args.calls):
            nothing(tensor)
        return (timed - (time.perf_counter() - start)) / args.calls * 1e6

    results: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name in results:
            results[name].append(cost(wrappers[name]))
    for name, values in results.items():
        print(f"{name}: median {statistics.median(values):.3f} us per call (min {min(values):.3f}, "
              f"max {max(values):.3f}; {args.rounds} rounds of {args.calls} calls)")
    diff = statistics.median(a - b for a, b in zip(results["after"], results["before"]))
    print(f"after - before, median of the rounds' differences: {diff:+.3f} us per call; "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
