"""The controller's analysis cycle at 10,000 agents: the first one, then the steady state.

The cluster, its faults and its peer entries are benchmarks/pingmesh_analyze.py's. Each cycle one
more window closes. Every agent answers what its `/v1/pingmesh?windows=6[&since=S]` would (the
newest window open, with a third of its peers so far; with `since`, the windows up to S and the
open one by their start alone), as bytes; the controller's own code takes it from there: stats.loads_summary,
controller.keep_windows (fold the new windows, take the kept ones) and pingmesh.Analyzer.run, with
the summaries streaming into it as the fetchers hand them on. No HTTP: fetching overlaps with this
work in the controller, and its cost is the network's. Timed per cycle: parsing (JSON and
validation), preparing (folding), the analysis; memory: RSS after each cycle and what is kept.
Usage: python benchmarks/pingmesh_controller.py [--nodes 10000] [--rails 2 --pairs 5] [--cycles 4]
"""
from __future__ import annotations

import json
import os
import random
import resource
import sys
import time

from common import ROOT, rss_bytes
from pingmesh_analyze import DEAD, PROBE_INTERVAL, T0, WS, cluster, inventory, lose, mesh_arguments, peer_entries

sys.path.insert(0, ROOT)

from nodehealth.pingmesh import controller  # noqa: E402
from nodehealth.pingmesh.analysis import Analyzer  # noqa: E402
from nodehealth.pingmesh.stats import BUCKETS_SECONDS, loads_summary  # noqa: E402

FETCH = 6  # pingmesh.fetch_windows


def answers(names, leaf, inter, leaf_size, rails, newest, since):
    """(name, bytes) of every agent's answer when window `newest` is the open one; `since` maps a name
    to the start it is asked after (absent: everything in full)."""
    for me, name in enumerate(names):
        if me == DEAD:
            continue
        base = peer_entries(names, leaf, inter, leaf_size, rails, me)
        ws = []
        for w in range(max(0, newest - FETCH + 1), newest + 1):
            start = T0 + w * WS
            if name in since and (start <= since[name] or w == newest):  # kept, or open: by its start alone
                ws.append({"start": start, "closed": w < newest})
                continue
            rng = random.Random(me * 100_003 + w)  # the same window is the same whenever it is asked for
            peers = list(base) if w < newest else base[:len(base) // 3]
            ws.append({"start": start, "closed": w < newest, "peers": lose(peers, names, leaf, me, rng)})
        yield name, json.dumps({"schema_version": 1, "node": name, "leaf": f"leaf-{leaf[me]}", "pod": "",
                                "time": T0 + newest * WS + 3, "window_seconds": WS,
                                "buckets_seconds": list(BUCKETS_SECONDS), "windows": ws}).encode()


def kept_bytes(kept: dict[str, controller.KeptWindows]) -> tuple[int, int]:
    """Folded edges kept, and the bytes of their arrays and tuples, each counted once (names and leaves
    are shared between an agent's windows; the strings are shared by all)."""
    edges, seen, size = 0, set(), 0
    for k in kept.values():
        for ready in k.windows.values():
            f = ready.folded
            edges += len(f.sent)
            for a in ("names", "leaves", "sent", "lost", "top", "p99", "offsets", "flat"):
                x = getattr(f, a)
                if id(x) not in seen:
                    seen.add(id(x))
                    size += sys.getsizeof(x)
    return edges, size


def stream(items, kept, since, now, spent, counts):
    """The prepared summaries, as the controller's fetchers hand them on; time and counts into the dicts."""
    while True:
        t0 = time.perf_counter()
        item = next(items, None)
        t1 = time.perf_counter()
        spent["generate"] += t1 - t0
        if item is None:
            return
        name, data = item
        summary = loads_summary(data, stubs=name in since)
        t2 = time.perf_counter()
        prepared, kept[name], parsed = controller.keep_windows(kept.get(name), summary, now)
        t3 = time.perf_counter()
        spent["parse"] += t2 - t1
        spent["prepare"] += t3 - t2
        counts["bytes"] += len(data)
        counts["windows"] += parsed
        counts["entries"] += sum(len(w.peers) for w in summary.windows if w.peers is not None)
        yield prepared


def main() -> None:
    p = mesh_arguments()
    p.add_argument("--cycles", type=int, default=4)
    args = p.parse_args()
    names, leaf, inter = cluster(args.nodes, args.leaf_size, args.pairs, args.rails)
    analyzer = Analyzer({}, PROBE_INTERVAL)
    inv = inventory(names, leaf, args.rails)
    kept: dict[str, controller.KeptWindows] = {}
    rss0 = rss_bytes(os.getpid())
    print(f"{args.nodes} nodes, {args.rails} rails, {args.pairs} pairs; RSS {rss0 / 2**20:.0f} MiB before the first "
          "cycle")
    for c in range(args.cycles):
        newest = FETCH - 1 + c  # the first cycle finds the agents with fetch_windows windows
        now = T0 + newest * WS + 3
        since = {n: k.since() for n, k in kept.items() if k.since() is not None}
        spent = {"generate": 0.0, "parse": 0.0, "prepare": 0.0}
        counts = {"bytes": 0, "windows": 0, "entries": 0}

        t0 = time.perf_counter()
        items = answers(names, leaf, inter, args.leaf_size, args.rails, newest, since)
        analysis = analyzer.run(stream(items, kept, since, now, spent, counts), now, inv)
        total = time.perf_counter() - t0
        work = total - spent["generate"]
        analyze = work - spent["parse"] - spent["prepare"]
        edges, size = kept_bytes(kept)
        print(f"cycle {c + 1}: {counts['windows']} windows parsed ({counts['entries']} peer entries, "
              f"{counts['bytes'] / 2**20:.0f} MiB of JSON); {analyzer.rebuilt} of {analysis.windows_seen} windows "
              f"judged again")
        print(f"  parse {spent['parse']:.1f} s + prepare {spent['prepare']:.1f} s + analyze {analyze:.1f} s "
              f"= {work:.1f} s (generating the answers, not counted: {spent['generate']:.1f} s)")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
        windows = sum(len(k.windows) for k in kept.values())
        print(f"  RSS {rss_bytes(os.getpid()) / 2**20:.0f} MiB, max {peak:.0f} MiB; kept: {edges} folded edges in "
              f"{windows} windows, {size / 2**20:.0f} MiB of arrays and tuples")
    print(f"verdicts: {[(v.kind, v.element, v.windows) for v in analysis.verdicts]}")


if __name__ == "__main__":
    main()
