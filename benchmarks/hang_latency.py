"""Detection-to-bundle latency for 8 local ranks: from the moment a pending op crosses the hang
threshold to the bundle with every rank's Python stack (real py-spy) on disk.

The ranks are plain Python processes that publish a state record and sleep in a function, as a
rank blocked in a collective does; 8 torch ranks on a 2-core box would measure torch's start-up.

    python benchmarks/hang_latency.py [--ranks 8] [--samples 10] [--scan 0.1]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nodehealth.hang import record  # noqa: E402
from nodehealth.hang.detector import Detector  # noqa: E402

RANK = "import time\ndef wait_in_all_reduce():\n    time.sleep(3600)\nwait_in_all_reduce()\n"
FLOOR = 1.0


def start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def publish(directory: str, procs: list[subprocess.Popen], seq: int, enqueued_at: float) -> None:
    for rank, p in enumerate(procs):
        done = seq if rank == 0 else seq - 1  # rank 0 never entered: the culprit
        pending = [] if rank == 0 else [{"seq": seq, "op": "all_reduce", "sizes": [[16]], "dtype": "float32",
                                         "enqueued_at": enqueued_at}]
        record.write_json(record.record_path(directory, "bench", rank), {
            "version": 1, "job": "bench", "rank": rank, "world_size": len(procs), "pid": p.pid,
            "start_time": start_ticks(p.pid), "heartbeat": time.time() + 3600, "step": seq, "regions": [],
            "groups": {"0": {"ranks": list(range(len(procs))), "enqueued": seq - (rank == 0),
                             "completed": done - (rank == 0), "pending": pending, "recent": [], "p99": {}}}})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--scan", type=float, default=0.1, help="detector scan interval (the daemon default is 1 s)")
    args = p.parse_args()
    logging.getLogger("nodehealth").setLevel(logging.ERROR)  # one warning per hang is the daemon's job, not ours
    procs = [subprocess.Popen([sys.executable, "-c", RANK]) for _ in range(args.ranks)]
    time.sleep(0.5)
    latencies, collections = [], []
    try:
        with tempfile.TemporaryDirectory() as directory:
            detector = Detector(directory, os.path.join(directory, "bundles"),
                                {"floor_seconds": FLOOR, "native_stacks": False, "heartbeat_timeout_seconds": 1e9})
            for i in range(args.samples):
                enqueued = time.time()
                publish(directory, procs, i + 2, enqueued)
                while True:
                    paths = detector.poll()
                    if paths:
                        break
                    time.sleep(args.scan)
                latencies.append(time.time() - (enqueued + FLOOR))
                with open(paths[0]) as f:
                    bundle = json.load(f)
                assert all(s.get("threads") for s in bundle["stacks"].values()), bundle["errors"]
                assert bundle["verdicts"][0]["culprits"] == [0]
                collections.append(bundle["durations"]["python_stacks"])
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    ms = sorted(x * 1000 for x in latencies)
    print(f"{args.ranks} ranks, {args.samples} hangs, scan every {args.scan:g} s, real py-spy (Python stacks)")
    print(f"threshold crossed -> bundle on disk: p50 {statistics.median(ms):.0f} ms  max {ms[-1]:.0f} ms"
          " (target < 1000 ms)")
    cs = sorted(x * 1000 for x in collections)
    print(f"of which stack collection + bundle: p50 {statistics.median(cs):.0f} ms  max {cs[-1]:.0f} ms")


if __name__ == "__main__":
    main()
