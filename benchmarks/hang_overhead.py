"""Timer overhead on a loop of small gloo collectives: the same loop with and without the timer,
alternating in one run (so both see the same machine load).

    python benchmarks/hang_overhead.py [--ranks 2] [--iters 2000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import free_port  # noqa: E402


def loop(dist, torch, iters: int) -> float:
    t = torch.ones(16)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    return time.perf_counter() - start


def rank_main(rank: int, world: int, port: int, iters: int, rounds: int, directory: str, out) -> None:
    import torch
    import torch.distributed as dist

    from nodehealth.hang import timer

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    loop(dist, torch, iters // 4)  # warm up
    plain, timed = [], []
    for _ in range(rounds):
        plain.append(loop(dist, torch, iters))
        t = timer.enable(directory)
        timed.append(loop(dist, torch, iters))
        t.uninstall()
    if rank == 0:
        out.put((plain, timed))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as directory:
        port = free_port()
        procs = [ctx.Process(target=rank_main, args=(r, args.ranks, port, args.iters, args.rounds, directory, out))
                 for r in range(args.ranks)]
        for proc in procs:
            proc.start()
        plain, timed = out.get(timeout=600)
        for proc in procs:
            proc.join()
    per_op = [x / args.iters * 1e6 for x in plain], [x / args.iters * 1e6 for x in timed]
    ratio = statistics.median(timed) / statistics.median(plain)
    best = min(timed) / min(plain)
    print(f"gloo all_reduce of 16 floats, {args.ranks} ranks, {args.iters} ops x {args.rounds} rounds (alternating)")
    print(f"without timer: median {statistics.median(per_op[0]):.1f} us/op  (rounds: "
          + ", ".join(f"{v:.1f}" for v in per_op[0]) + ")")
    print(f"with timer:    median {statistics.median(per_op[1]):.1f} us/op  (rounds: "
          + ", ".join(f"{v:.1f}" for v in per_op[1]) + ")")
    print(f"overhead ratio: median {ratio:.3f}, best-of-rounds {best:.3f} (target <= 1.05)")
    print(f"wrapper cost per call, no communication: {wrapper_cost_us():.2f} us")


def wrapper_cost_us(calls: int = 100000) -> float:
    """What the timer adds to one call, measured around a function that does nothing."""
    import torch

    from nodehealth.hang import timer

    with tempfile.TemporaryDirectory() as directory:
        t = timer.Timer(directory, 0.5)
        t.dist = _FakeDist()
        t.group_class = type(None.__class__)
        noop = timer._wrap(t, "all_reduce", lambda tensor: None, False)
        tensor = torch.ones(16)
        start = time.perf_counter()
        for _ in range(calls):
            noop(tensor)
        with_timer = time.perf_counter() - start
        plain = lambda tensor: None  # noqa: E731
        start = time.perf_counter()
        for _ in range(calls):
            plain(tensor)
        return (with_timer - (time.perf_counter() - start)) / calls * 1e6


class _FakeDist:
    class group:  # noqa: N801 (mirrors torch.distributed.group)
        WORLD = object()

    @staticmethod
    def get_process_group_ranks(group):
        return [0]


if __name__ == "__main__":
    main()
