"""The hang timer's cost on the CUDA path, on a real GPU: NCCL all_reduce calls with and without the
timer, in alternating rounds in one process (a world of one on GPU 0), so both arms see the same GPU
and the same load. On this path each call also records a CUDA event, which the watchdog thread
queries through cuEventQuery.

    python benchmarks/hang_overhead_cuda.py [--iters 2000] [--rounds 21] [--timer FILE]

Two figures per arm: the host's time to issue a round of calls (what a training thread pays while
the GPU is busy) and the round's time until the GPU has finished it (torch.cuda.synchronize). Then
the parts of the CUDA path, each alone, per call. `--timer FILE` times another version of
nodehealth/hang/timer.py (an older commit's, saved to a file) in the same way, for a side-by-side run.
Needs torch with CUDA and NCCL; tests/on_gpu_node.sh runs it on a GPU node.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_round(torch, all_reduce, tensor, iters: int) -> tuple[float, float]:
    """(seconds to issue `iters` calls, seconds until the GPU finished them)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        all_reduce(tensor)
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    return issued, time.perf_counter() - start


def per_call_us(fn, calls: int = 20000) -> float:
    """Best of 3 of `calls` calls of fn(), in microseconds per call."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def parts(torch, timer, t) -> None:
    """Each piece of the CUDA path alone, on the current stream of GPU 0, per call."""
    tensor = torch.ones(16, device="cuda")
    stream = torch.cuda.current_stream

    def new_event():
        torch.cuda.Event().record(stream(0))  # made, recorded, and dropped (destroyed) at once
    reused = torch.cuda.Event()

    def wrapper_alone():  # the timer around a collective that does nothing, CUDA tensor: the whole path
        wrapped(tensor)
    wrapped = timer._wrap(t, "all_reduce", lambda tensor, group=None: None, False)
    reused.record(stream(0))
    torch.cuda.synchronize()
    for name, fn in (("torch.cuda.current_stream(0)", lambda: stream(0)),
                     ("tensor.device.index", lambda: tensor.device.index),
                     ("new torch.cuda.Event, record, drop", new_event),
                     ("record a kept event", lambda: reused.record(stream(0))),
                     ("cuEventQuery of a completed event", lambda: t.cuda.done(reused, 0)),
                     ("wrapper alone (no collective), CUDA tensor", wrapper_alone)):
        torch.cuda.synchronize()
        print(f"  {name:<44} {per_call_us(fn):7.2f} us")
        torch.cuda.synchronize()


def load_timer(path: str | None):
    if path is None:
        from nodehealth.hang import timer
        return timer
    spec = importlib.util.spec_from_file_location("baseline_timer", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--timer", help="another version of nodehealth/hang/timer.py to time instead")
    args = p.parse_args()
    import torch
    import torch.distributed as dist

    timer = load_timer(args.timer)

    if not torch.cuda.is_available():
        sys.exit("hang_overhead_cuda: no CUDA device")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    with tempfile.TemporaryDirectory() as directory:
        t = timer.enable(directory)  # on for the whole run: rounds alternate the original and the wrapper
        original, wrapped = t.originals["all_reduce"], dist.all_reduce
        print(f"NCCL all_reduce on {torch.cuda.get_device_name(0)}, world of one, {args.iters} ops x "
              f"{args.rounds} rounds (alternating), torch {torch.__version__}, timer {args.timer or 'this checkout'}")
        for floats in (16, 16 << 20):
            tensor = torch.ones(floats, device="cuda")
            one_round(torch, original, tensor, args.iters // 4)  # warm up: NCCL's communicator, the caches
            one_round(torch, wrapped, tensor, args.iters // 4)
            plain, timed = [], []
            for _ in range(args.rounds):
                plain.append(one_round(torch, original, tensor, args.iters))
                timed.append(one_round(torch, wrapped, tensor, args.iters))
            for i, what in ((0, "issue"), (1, "until done")):
                without = [r[i] / args.iters * 1e6 for r in plain]
                with_timer = [r[i] / args.iters * 1e6 for r in timed]
                ratio = statistics.median(w / o for o, w in zip(without, with_timer))
                print(f"{floats * 4:>10} bytes, {what:>10}: without {statistics.median(without):8.2f} us/op, "
                      f"with {statistics.median(with_timer):8.2f} us/op, median of pair ratios {ratio:.3f}")
        print("parts of the CUDA path, per call (best of 3):")
        parts(torch, timer, t)
        record = t.snapshot()
        print(f"the record's gpu_poll: {record['gpu_poll']}; last_error: {record['last_error']}")
        t.uninstall()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
