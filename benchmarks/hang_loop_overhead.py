"""The timer's loop overhead on small gloo all_reduce calls, measured so that a noisy machine cannot
fake it either way: every arm runs in the same processes, interleaved, and is judged by medians with
a bootstrap confidence interval.

    python benchmarks/hang_loop_overhead.py [--ranks 2] [--calls 20000] [--blocks 400] [--block 50]

Arms: the original all_reduce; the timer's wrapper; a control that spins, before the original, as
long as the wrapper takes in this loop (timed around a collective that does nothing, right after a
real one: the wrapper runs cold there, slower than in a tight loop); and the minimal timer, two
clock reads around the original, which any in-process timer must do. The control and the minimal
timer show what that much work on the training thread does to this loop on this machine, so the
timer is compared with known quantities, not with zero. Two designs, in the same run:

- per call: each round calls every arm once, in an order drawn from a seeded generator that
  every rank shares (so the ranks always meet in the same arm), and times each call;
- loop: rounds of blocks of `block` calls, one block per arm in a shared random order (drift
  and load changes fall on every arm alike), and the ratio of each arm's block to the plain block of
  the same round, as a training loop sees it.
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
    original, wrapped = t.originals["all_reduce"], dist.all_reduce
    tensor = torch.ones(16)
    clock = time.perf_counter
    for _ in range(500):  # warm up
        original(tensor)
        wrapped(tensor)
    hot = wrapper_cost_us(t, torch, None, calls=50000)
    # in the loop the wrapper runs cold (gloo and the kernel ran in between): time it there, around a
    # collective that does nothing, right after a real one
    nothing = timer._wrap(t, "all_reduce", lambda tensor, group=None: None, False)
    cold = []
    for _ in range(3000):
        original(tensor)
        start = clock()
        nothing(tensor)
        cold.append(clock() - start)
    # every rank spins for rank 0's figure, or the ranks' control arms would differ
    shared = torch.tensor([hot, statistics.median(cold) * 1e6])
    dist.broadcast(shared, src=0)
    hot, cost = float(shared[0]), float(shared[1])
    spin = cost * 1e-6

    def control(tensor):
        end = clock() + spin
        while clock() < end:
            pass
        return original(tensor)

    last = [0.0]

    def minimal(tensor):  # the least any timer in the process does: read a clock before and after
        start = time.time()
        result = original(tensor)
        last[0] = time.time() - start
        return result

    arms = (original, wrapped, control, minimal)
    for arm in arms * 500:  # warm up every path
        arm(tensor)
    rng = random.Random(SEED)  # the same on every rank: the ranks always meet in the same arm
    per_call: list[list[float]] = [[] for _ in arms]
    for _ in range(args.calls):
        for a in rng.sample(range(len(arms)), len(arms)):
            arm = arms[a]
            start = clock()
            arm(tensor)
            per_call[a].append(clock() - start)
    blocks: list[list[float]] = [[] for _ in arms]
    for _ in range(args.blocks):
        for a in rng.sample(range(len(arms)), len(arms)):
            arm = arms[a]
            start = clock()
            for _ in range(args.block):
                arm(tensor)
            blocks[a].append(clock() - start)
    t.uninstall()
    if rank == 0:
        out.put((hot, cost, per_call, blocks))
    dist.destroy_process_group()


def bootstrap(stat, n: int, resamples: int = 1000) -> tuple[float, float]:
    """2.5th and 97.5th percentiles of `stat(indices)` over resampled index lists (seeded)."""
    rng = random.Random(SEED)
    values = sorted(stat([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    return values[int(0.025 * resamples)], values[int(0.975 * resamples) - 1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--calls", type=int, default=20000, help="rounds of calls, one per arm")
    p.add_argument("--blocks", type=int, default=400, help="rounds of blocks, one per arm")
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
        hot, cost, per_call, blocks = out.get(timeout=1800)
        for proc in procs:
            proc.join()
    plain, timed, control, minimal = per_call
    us = [statistics.median(x) * 1e6 for x in per_call]
    n = len(plain)

    def ratio_of_medians(arm):
        return lambda idx: statistics.median(arm[i] for i in idx) / statistics.median(plain[i] for i in idx)

    print(f"gloo all_reduce of 16 floats, {args.ranks} ranks; the wrapper alone: {hot:.2f} us per call in a tight "
          f"loop, {cost:.2f} us in this loop (cold, right after a real all_reduce)")
    print(f"per call, {n} rounds of {len(per_call)} interleaved calls (rank 0's times):")
    print(f"  median us/op: plain {us[0]:.1f}, timed {us[1]:.1f}, control ({cost:.2f} us spin) {us[2]:.1f}, "
          f"minimal (two clock reads) {us[3]:.1f}")
    for name, arm, median in (("timed", timed, us[1]), ("control", control, us[2]), ("minimal", minimal, us[3])):
        lo, hi = bootstrap(ratio_of_medians(arm), n)
        print(f"  {name}/plain: median ratio {median / us[0]:.4f} (95% CI {lo:.4f}-{hi:.4f})")
    print(f"loop, {args.blocks} rounds of {len(blocks)} blocks of {args.block} calls in a shared random order: "
          "median us/op " + ", ".join(f"{name} {statistics.median(b) / args.block * 1e6:.1f}"
                                     for name, b in zip(("plain", "timed", "control", "minimal"), blocks)))
    for name, arm in (("timed", blocks[1]), ("control", blocks[2]), ("minimal", blocks[3])):
        ratios = [b / a for a, b in zip(blocks[0], arm)]
        lo, hi = bootstrap(lambda idx, r=ratios: statistics.median(r[i] for i in idx), len(ratios))
        print(f"  {name}/plain: median of per-round ratios {statistics.median(ratios):.4f} (95% CI {lo:.4f}-{hi:.4f})"
              + ("; target <= 1.05" if name == "timed" else ""))
    print(f"  expected from the wrapper's cost in this loop alone: {1 + cost / us[0]:.4f}")

if __name__ == "__main__":
    main()
