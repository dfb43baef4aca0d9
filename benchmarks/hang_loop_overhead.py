"""The timer's loop overhead on small gloo all_reduce calls, measured so that a noisy machine cannot
fake it either way: every arm runs in the same processes, interleaved, and is judged by medians with
a bootstrap confidence interval.

    python benchmarks/hang_loop_overhead.py [--ranks 2] [--calls 6000] [--blocks 120] [--block 50]

Arms: the original all_reduce, the timer's wrapper, and a control that spins as long as the wrapper
costs per call (measured first, in the same process) before the original: the control shows what a
cost of that size does to this loop here, so the timer is compared with a known quantity, not with
zero. Two designs:

- per call: each round calls the three arms once, in an order drawn from a seeded generator that
  every rank shares (so the ranks always meet in the same arm), and times each call;
- loop: blocks of `block` calls, plain and timed in ABBA order (drift cancels), the ratio of each
  adjacent pair of blocks, as the loop of a training job sees it.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import free_port  # noqa: E402
from benchmarks.hang_overhead import wrapper_cost_us  # noqa: E402

SEED = 12


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, directory: str, out) -> None:
    import torch
    import torch.distributed as dist

    from nodehealth.hang import timer

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    t = timer.enable(directory)
    cost = wrapper_cost_us(t, torch, None, calls=50000)
    # every rank spins for rank 0's figure, or the ranks' control arms would differ
    shared = torch.tensor([cost])
    dist.broadcast(shared, src=0)
    cost = float(shared[0])
    original, wrapped = t.originals["all_reduce"], dist.all_reduce
    spin = cost * 1e-6
    clock = time.perf_counter

    def control(tensor):
        end = clock() + spin
        while clock() < end:
            pass
        return original(tensor)

    arms = (original, wrapped, control)
    tensor = torch.ones(16)
    for arm in arms * 500:  # warm up every path
        arm(tensor)
    rng = random.Random(SEED)
    per_call: list[list[float]] = [[], [], []]
    for _ in range(args.calls):
        for a in rng.sample(range(3), 3):
            arm = arms[a]
            start = clock()
            arm(tensor)
            per_call[a].append(clock() - start)
    blocks: list[list[float]] = [[], []]
    for i in range(args.blocks):
        for a in ((0, 1, 1, 0) if i % 2 == 0 else (1, 0, 0, 1)):
            arm = arms[a]
            start = clock()
            for _ in range(args.block):
                arm(tensor)
            blocks[a].append(clock() - start)
    t.uninstall()
    if rank == 0:
        out.put((cost, per_call, blocks))
    dist.destroy_process_group()


def bootstrap(stat, n: int, resamples: int = 1000) -> tuple[float, float]:
    """2.5th and 97.5th percentiles of `stat(indices)` over resampled index lists (seeded)."""
    rng = random.Random(SEED)
    values = sorted(stat([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    return values[int(0.025 * resamples)], values[int(0.975 * resamples) - 1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--calls", type=int, default=6000, help="rounds of three calls, one per arm")
    p.add_argument("--blocks", type=int, default=120, help="ABBA quadruples of blocks")
    p.add_argument("--block", type=int, default=50, help="calls per block")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as directory:
        port = free_port()
        procs = [ctx.Process(target=rank_main, args=(r, args.ranks, port, args, directory, out))
                 for r in range(args.ranks)]
        for proc in procs:
            proc.start()
        cost, per_call, blocks = out.get(timeout=1800)
        for proc in procs:
            proc.join()
    plain, timed, control = per_call
    us = [statistics.median(x) * 1e6 for x in per_call]
    n = len(plain)

    def ratio_of_medians(arm):
        return lambda idx: statistics.median(arm[i] for i in idx) / statistics.median(plain[i] for i in idx)

    print(f"gloo all_reduce of 16 floats, {args.ranks} ranks; wrapper cost measured here {cost:.2f} us per call")
    print(f"per call, {n} rounds of 3 interleaved calls (rank 0's times):")
    print(f"  median us/op: plain {us[0]:.1f}, timed {us[1]:.1f}, control ({cost:.2f} us spin) {us[2]:.1f}")
    for name, arm in (("timed", timed), ("control", control)):
        lo, hi = bootstrap(ratio_of_medians(arm), n)
        print(f"  {name}/plain: median ratio {us[1 if arm is timed else 2] / us[0]:.4f} (95% CI {lo:.4f}-{hi:.4f})")
    pairs = [b / a for a, b in zip(blocks[0], blocks[1])]
    lo, hi = bootstrap(lambda idx: statistics.median(pairs[i] for i in idx), len(pairs))
    print(f"loop, {len(pairs)} ABBA pairs of {args.block}-call blocks: plain median "
          f"{statistics.median(blocks[0]) / args.block * 1e6:.1f} us/op, timed "
          f"{statistics.median(blocks[1]) / args.block * 1e6:.1f} us/op")
    print(f"  timed/plain: median of pair ratios {statistics.median(pairs):.4f} (95% CI {lo:.4f}-{hi:.4f}); "
          f"target <= 1.05")
    print(f"  expected from the per-call cost alone: {1 + cost / us[0]:.4f}")


if __name__ == "__main__":
    main()
