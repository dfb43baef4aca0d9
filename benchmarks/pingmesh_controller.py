"""The controller's analysis cycle at 10,000 agents: the first one, then the steady state, JSON and packed.

The cluster, its faults and its peer entries are benchmarks/pingmesh_analyze.py's. Each cycle one more
window closes. Every agent answers what its `/v1/pingmesh?windows=6[&since=S]` would (the newest window
open, with a third of its peers so far; with `since`, the windows up to S and the open one by their
start alone), as bytes, in the form asked for: JSON, or the packed form (`&format=packed1`, packed.py;
the agent folds each window it sends). The controller's own code takes it from there:
stats.loads_summary, or packed.parse and packed.check_each (64 answers at a time),
controller.keep_windows (fold the new windows, take the kept ones) and pingmesh.Analyzer.run, with the
summaries streaming into it as the fetchers hand them on. No HTTP: fetching overlaps with this work in
the controller, and its cost is the network's. With both forms (the default), each cycle runs for JSON,
then for packed, each with its own controller state, in one process. Timed per cycle: decoding (with
validation), preparing (folding), the analysis, and the floor: the same bytes parsed by the
serialization alone (json.loads of a JSON answer; json.loads of a packed answer's header and
array.frombytes of its arrays), on every --floor-every'th answer; and the cyclic collector's share of the
cycle (gc.callbacks). After each cycle, as the controller does once its verdicts are written,
controller.freeze_survivors (--no-freeze: not, as before). Memory: RSS after each cycle and what
is kept (RSS covers both controllers with both forms: run one form for the controller's own). Past
10,000 nodes the analysis's caps (MAX_SUMMARIES, MAX_PEER_ENTRIES) are raised for the measurement, in
proportion: how cost grows past what one controller takes (docs/pingmesh.md, "Past one controller").
Usage: python benchmarks/pingmesh_controller.py [--nodes 10000] [--rails 2 --pairs 5] [--cycles 4]
       [--format both|json|packed] [--floor-every 10] [--check-together 64] [--pregenerate] [--no-freeze]
"""
from __future__ import annotations

import gc
import itertools
import json
import os
import random
import resource
import sys
import time
from array import array

from common import ROOT, rss_bytes
from pingmesh_analyze import (
    DEAD,
    PROBE_INTERVAL,
    T0,
    WS,
    as_summary,
    cluster,
    inventory,
    lose,
    mesh_arguments,
    peer_entries,
)

sys.path.insert(0, ROOT)

from nodehealth.pingmesh import analysis as pingmesh_analysis  # noqa: E402
from nodehealth.pingmesh import controller, packed  # noqa: E402
from nodehealth.pingmesh.analysis import Analyzer  # noqa: E402
from nodehealth.pingmesh.stats import BUCKETS_SECONDS, loads_summary  # noqa: E402

FETCH = 6  # pingmesh.fetch_windows


def answers(names, leaf, inter, leaf_size, rails, newest, since, form):
    """(name, bytes) of every agent's answer in `form` when window `newest` is the open one; `since` maps
    a name to the start it is asked after (absent: everything in full)."""
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
        doc = {"schema_version": 1, "node": name, "leaf": f"leaf-{leaf[me]}", "pod": "",
               "time": T0 + newest * WS + 3, "window_seconds": WS, "buckets_seconds": list(BUCKETS_SECONDS),
               "windows": ws}
        yield name, json.dumps(doc).encode() if form == "json" else packed.dumps(as_summary(doc))


def floor(data, form):
    """The serialization alone on the same bytes: JSON's parser, or the packed header's and array.frombytes."""
    if form == "json":
        json.loads(data)
        return
    end = 8 + int.from_bytes(data[4:8], "little")
    head = json.loads(data[8:end])
    view = memoryview(data)[end:]
    for w in head["windows"]:
        if "edges" not in w:
            continue
        for attr, code in packed.ARRAYS:
            a = array(code)
            n = (w["flat"] if attr == "flat" else w["edges"] + 1 if attr == "offsets" else w["edges"]) * a.itemsize
            a.frombytes(view[:n])
            view = view[n:]


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


def stream(items, kept, since, now, spent, counts, form, floor_every, together):
    """The prepared summaries, as the controller's fetchers and its loop hand them on; time and counts into
    the dicts. Packed answers are checked `together` at a time (packed.check_each), as the controller
    checks those that arrived while the analysis was busy (up to twice fetch_concurrency)."""
    k = 0
    while True:
        t0 = time.perf_counter()
        batch = list(itertools.islice(items, together if form == "packed" else 1))
        t1 = time.perf_counter()
        spent["generate"] += t1 - t0
        if not batch:
            return
        for _, data in batch:  # a sample: the floor of one answer in floor_every, before its decoding
            if k % floor_every == 0:
                t = time.perf_counter()
                floor(data, form)
                spent["floor"] += time.perf_counter() - t
                counts["sampled"] += 1
            k += 1
        t1 = time.perf_counter()
        if form == "json":
            parsed = [(loads_summary(data, stubs=name in since), []) for name, data in batch]
        else:
            parsed = [packed.parse(data, stubs=name in since) for name, data in batch]
            assert packed.check_each([arrays for _, arrays in parsed]) == [None] * len(batch)
        t2 = time.perf_counter()
        spent["parse"] += t2 - t1
        for (name, data), (summary, _) in zip(batch, parsed):
            t2 = time.perf_counter()
            prepared, kept[name], n = controller.keep_windows(kept.get(name), summary, now)
            t3 = time.perf_counter()
            spent["prepare"] += t3 - t2
            counts["answers"] += 1
            counts["bytes"] += len(data)
            counts["windows"] += n
            counts["entries"] += sum(w.ready.entries if w.ready is not None else len(w.peers)
                                     for w in summary.windows if w.peers is not None or w.ready is not None)
            yield prepared


def cycle(c, args, cluster_, analyzer, inv, kept, form):
    """One analysis cycle in `form`; prints its line and returns (work seconds, analysis)."""
    names, leaf, inter = cluster_
    newest = FETCH - 1 + c  # the first cycle finds the agents with fetch_windows windows
    now = T0 + newest * WS + 3
    since = {n: k.since() for n, k in kept.items() if k.since() is not None}
    spent = {"generate": 0.0, "parse": 0.0, "prepare": 0.0, "floor": 0.0}
    counts = {"bytes": 0, "windows": 0, "entries": 0, "answers": 0, "sampled": 0}
    items = answers(names, leaf, inter, args.leaf_size, args.rails, newest, since, form)
    if args.pregenerate:  # all answers made before the time, and their garbage collected
        items = iter(list(items))
        gc.collect()
    collector = {"started": 0.0, 0: 0.0, 1: 0.0, 2: 0.0}

    def timed(phase, info):  # the cyclic collector's time inside the timed cycle, by generation
        if phase == "start":
            collector["started"] = time.perf_counter()
        else:
            collector[info["generation"]] += time.perf_counter() - collector["started"]

    gc.callbacks.append(timed)
    t0 = time.perf_counter()
    try:
        analysis = analyzer.run(stream(items, kept, since, now, spent, counts, form, args.floor_every,
                                            args.check_together), now, inv)
    finally:
        total = time.perf_counter() - t0
        gc.callbacks.remove(timed)
    work = total - spent["generate"] - spent["floor"]
    analyze = work - spent["parse"] - spent["prepare"]
    edges, size = kept_bytes(kept)
    made = "before the time" if args.pregenerate else f"{spent['generate']:.1f} s"
    print(f"cycle {c + 1} {form}: {counts['windows']} windows parsed ({counts['entries']} peer entries, "
          f"{counts['bytes'] / 2**20:.0f} MiB); {analyzer.rebuilt} of {analysis.windows_seen} windows judged again")
    print(f"  decode {spent['parse']:.2f} s + prepare {spent['prepare']:.2f} s + analyze {analyze:.2f} s "
          f"= {work:.2f} s (generating the answers, not counted: {made}); the cyclic collector "
          f"{collector[0] + collector[1] + collector[2]:.2f} s of it (generations 0, 1, 2: "
          f"{collector[0]:.2f}, {collector[1]:.2f}, {collector[2]:.2f} s)")
    if spent["floor"]:
        per_answer, floor_per_answer = spent["parse"] / counts["answers"], spent["floor"] / counts["sampled"]
        print(f"  decode / floor per answer (the floor on 1 answer in {args.floor_every}): {per_answer * 1e6:.1f} us / "
              f"{floor_per_answer * 1e6:.1f} us = {per_answer / floor_per_answer:.2f}x")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    windows = sum(len(k.windows) for k in kept.values())
    print(f"  RSS {rss_bytes(os.getpid()) / 2**20:.0f} MiB, max {peak:.0f} MiB; kept: {edges} folded edges in "
          f"{windows} windows, {size / 2**20:.0f} MiB of arrays and tuples", flush=True)
    if args.freeze:  # what the controller does once the verdicts are written, not in its cycle's time
        t = time.perf_counter()
        controller.freeze_survivors(c + 1)
        print(f"  after the cycle, controller.freeze_survivors: {time.perf_counter() - t:.2f} s, "
              f"{gc.get_freeze_count()} objects hidden from the collector")
    return work, analysis


def main() -> None:
    p = mesh_arguments()
    p.add_argument("--cycles", type=int, default=4)
    p.add_argument("--format", choices=("both", "json", "packed"), default="both")
    p.add_argument("--pregenerate", action="store_true",
                   help="make each cycle's answers before timing it (the packed form's fit in memory): the "
                        "generator's garbage is not collected inside the controller's time")
    p.add_argument("--no-freeze", dest="freeze", action="store_false",
                   help="do not call controller.freeze_survivors after each cycle (as before it was)")
    p.add_argument("--floor-every", type=int, default=10, help="measure the floor on every n-th answer")
    p.add_argument("--check-together", type=int, default=64,
                   help="packed answers checked together (the controller: those that arrived while it was busy)")
    args = p.parse_args()
    forms = ("json", "packed") if args.format == "both" else (args.format,)
    pingmesh_analysis.MAX_SUMMARIES = max(pingmesh_analysis.MAX_SUMMARIES, args.nodes)
    caps = pingmesh_analysis.MAX_PEER_ENTRIES
    pingmesh_analysis.MAX_PEER_ENTRIES = max(caps, caps * args.nodes // 10_000)
    cluster_ = names, leaf, inter = cluster(args.nodes, args.leaf_size, args.pairs, args.rails)
    inv = inventory(names, leaf, args.rails)
    state = {form: (Analyzer({}, PROBE_INTERVAL), {}) for form in forms}
    rss0 = rss_bytes(os.getpid())
    print(f"{args.nodes} nodes, {args.rails} rails, {args.pairs} pairs; RSS {rss0 / 2**20:.0f} MiB before the first "
          "cycle")
    found = {}
    for c in range(args.cycles):
        work = {}
        for form in forms:
            work[form], analysis = cycle(c, args, cluster_, state[form][0], inv, state[form][1], form)
            found[form] = [(v.kind, v.element, v.windows) for v in analysis.verdicts]
        if len(forms) == 2:
            print(f"cycle {c + 1}: json {work['json']:.2f} s / packed {work['packed']:.2f} s = "
                  f"{work['json'] / work['packed']:.1f}x cheaper")
    for form in forms:
        print(f"verdicts {form}: {found[form]}")
    if len(forms) == 2:
        print(f"the same verdicts: {found['json'] == found['packed']}")


if __name__ == "__main__":
    main()
