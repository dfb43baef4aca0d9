"""Timer overhead, measured both ways in one run (so both see the same machine load):

- the loop: small gloo all_reduce calls with and without the timer, alternating rounds, on N ranks
  and on one rank in one process (best of 3, as a user would try it);
- the wrapper alone: the timer around a collective that does nothing, on the real default process
  group with the watchdog thread running, so every call takes the full timing path; and, for
  comparison, the pass-through branch (a group this rank is not in), which the first version of
  this benchmark measured by mistake.

    python benchmarks/hang_overhead.py [--ranks 2] [--iters 500] [--rounds 21]

Short alternating rounds, and the median of the per-pair ratios, because on a shared machine the
load of others moves a 2-rank loop by more than the timer costs.
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


def loop(dist, torch, iters: int, all_reduce=None) -> float:
    all_reduce = all_reduce or dist.all_reduce
    t = torch.ones(16)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        all_reduce(t)
    return time.perf_counter() - start


def batch(dist, torch, iters: int) -> float:
    """Issue `iters` async all_reduce calls, then wait for them all (the pattern that made the first
    version of the timer cost O(n) per call: it removed each handle from a list)."""
    t = torch.ones(16)
    start = time.perf_counter()
    works = [dist.all_reduce(t, async_op=True) for _ in range(iters)]
    for work in works:
        work.wait()
    return time.perf_counter() - start


def rank_main(rank: int, world: int, port: int, iters: int, rounds: int, directory: str, out) -> None:
    import torch
    import torch.distributed as dist

    from nodehealth.hang import timer

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    loop(dist, torch, iters // 4)  # warm up
    plain, timed = [], []
    # the timer stays on (its thread running) and the rounds alternate between the original function
    # and the wrapper: starting the timer (a thread, the first record) is not a per-call cost
    t = timer.enable(directory)
    original = t.originals["all_reduce"]

    def busy(tensor):  # the control: 4 us of plain Python per call, about what the wrapper costs
        end = time.perf_counter() + 4e-6
        while time.perf_counter() < end:
            pass
        return original(tensor)

    control = []
    for _ in range(rounds):
        plain.append(loop(dist, torch, iters, original))
        timed.append(loop(dist, torch, iters))
        control.append(loop(dist, torch, iters, busy))
    t.uninstall()
    if rank == 0:
        out.put((plain, timed, control))
    dist.destroy_process_group()


def one_rank(port: int, directory: str, out) -> None:
    """One process, world size 1, best of 3: then the wrapper alone, full path and pass-through."""
    import torch
    import torch.distributed as dist

    from nodehealth.hang import timer

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    iters = 20000
    loop(dist, torch, iters // 4)
    plain, timed = [], []
    for _ in range(3):
        plain.append(loop(dist, torch, iters) / iters * 1e6)
        t = timer.enable(directory)
        timed.append(loop(dist, torch, iters) / iters * 1e6)
        t.uninstall()
    many = [[], []]
    for _ in range(5):
        many[0].append(batch(dist, torch, iters) / iters * 1e6)
        t = timer.enable(directory)
        many[1].append(batch(dist, torch, iters) / iters * 1e6)
        t.uninstall()
    t = timer.enable(directory)
    full = wrapper_cost_us(t, torch, None)
    outsider = dist.new_group([0])  # then made to look foreign: the pass-through branch
    t.groups[outsider] = None
    passing = wrapper_cost_us(t, torch, outsider)
    t.uninstall()
    dist.destroy_process_group()
    out.put((min(plain), min(timed), min(many[0]), min(many[1]), full, passing))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--iters", type=int, default=500)
    p.add_argument("--rounds", type=int, default=21)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as directory:
        port = free_port()
        procs = [ctx.Process(target=rank_main, args=(r, args.ranks, port, args.iters, args.rounds, directory, out))
                 for r in range(args.ranks)]
        for proc in procs:
            proc.start()
        plain, timed, control = out.get(timeout=600)
        for proc in procs:
            proc.join()
        single = ctx.Process(target=one_rank, args=(free_port(), directory, out))
        single.start()
        one_plain, one_timed, many_plain, many_timed, full, passing = out.get(timeout=600)
        single.join()
    per_op = [x / args.iters * 1e6 for x in plain], [x / args.iters * 1e6 for x in timed]
    ratio = statistics.median(t / p for p, t in zip(plain, timed))
    best = min(timed) / min(plain)
    print(f"gloo all_reduce of 16 floats, {args.ranks} ranks, {args.iters} ops x {args.rounds} rounds (alternating)")
    print(f"without timer: median {statistics.median(per_op[0]):.1f} us/op  (min {min(per_op[0]):.1f}, "
          f"max {max(per_op[0]):.1f})")
    print(f"with timer:    median {statistics.median(per_op[1]):.1f} us/op  (min {min(per_op[1]):.1f}, "
          f"max {max(per_op[1]):.1f})")
    print(f"overhead ratio: median of pairs {ratio:.3f}, best-of-rounds {best:.3f} (target <= 1.05)")
    busy = statistics.median(c / p for p, c in zip(plain, control))
    print(f"control, a 4 us busy-wait instead of the timer: median {statistics.median(control) / args.iters * 1e6:.1f} "
          f"us/op, ratio {busy:.3f}")
    print(f"one rank, one process, best of 3: without {one_plain:.1f} us/op, with {one_timed:.1f} us/op, "
          f"difference {one_timed - one_plain:.1f} us")
    print(f"one rank, 20000 async calls issued then waited, best of 5: without {many_plain:.1f} us/op, "
          f"with {many_timed:.1f} us/op, difference {many_timed - many_plain:.1f} us")
    print(f"wrapper alone, full timing path (real group, watchdog running): {full:.2f} us per call (target <= 10)")
    print(f"wrapper alone, pass-through branch (what the first benchmark measured): {passing:.2f} us per call")


def wrapper_cost_us(t, torch, group, calls: int = 100000) -> float:
    """What the timer adds to one call around a collective that does nothing, best of 3."""
    from nodehealth.hang import timer

    def nothing(tensor, group=None):
        return None

    wrapped = timer._wrap(t, "all_reduce", nothing, False)
    tensor = torch.ones(16)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            wrapped(tensor, group)
        with_timer = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(calls):
            nothing(tensor, group)
        best = min(best, (with_timer - (time.perf_counter() - start)) / calls * 1e6)
    return best


if __name__ == "__main__":
    main()
