"""Pingmesh localization over a large cluster's summaries: time and peak memory of analyze().

Builds a cluster of --nodes nodes in leaves of --leaf-size, --rails rails, ping + tcp probes: a full
mesh inside each leaf and --pairs representative pairs per leaf pair and rail (both ends probe); the
defaults give about 320 peer entries per node and window, `--rails 8 --pairs 2` the pinglist's 808.
Summaries are generated lazily, one node at a time, as decoded JSON (or parsed, --input parsed), so
only analyze() holds the cluster. Faults injected: one dead node, one node with 3% loss, one leaf
with 20% loss on its uplinks; background loss 1e-4. The analysis runs as the controller's does: with
the inventory (leaves, rails) and the agents' probe schedule (6 probes of each peer a window).
Usage: python benchmarks/pingmesh_analyze.py [--nodes 10000] [--windows 5] [--input json|parsed|packed]
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import time

from common import ROOT, rss_bytes

sys.path.insert(0, ROOT)

from nodehealth.inventory import Inventory, Node  # noqa: E402
from nodehealth.pingmesh import packed  # noqa: E402
from nodehealth.pingmesh.analysis import analyze  # noqa: E402
from nodehealth.pingmesh.stats import BUCKETS_SECONDS, PeerStats, Summary, Window, parse_summary  # noqa: E402

WS = 30.0
T0 = 1_800_000_000.0
DEAD = 17  # the dead node: reports nothing, answers nothing
PROBE_INTERVAL = 5.0  # pingmesh.probe_interval_seconds: 6 probes of a peer in a window of 30 s


def inventory(names: list[str], leaf: list[int], rails: int) -> Inventory:
    """The controller's inventory of the cluster: each node's leaf and one address per rail."""
    return Inventory(tuple(Node(name, f"leaf-{leaf[i]}", addresses=tuple(f"10.{r}.{i // 250}.{i % 250 + 1}"
                                                                        for r in range(rails)))
                           for i, name in enumerate(names)), rails)


def cluster(nodes: int, leaf_size: int, pairs: int,
            rails: int) -> tuple[list[str], list[int], list[list[tuple[int, int]]]]:
    """Names, leaf of each node, and each node's inter-leaf targets (peer, rail)."""
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    leaf = [i // leaf_size for i in range(nodes)]
    leaves = (nodes + leaf_size - 1) // leaf_size
    members = [list(range(x * leaf_size, min(nodes, (x + 1) * leaf_size))) for x in range(leaves)]
    inter: list[list[tuple[int, int]]] = [[] for _ in range(nodes)]
    for x in range(leaves):
        for y in range(x + 1, leaves):
            for rail in range(rails):
                for j in range(pairs):
                    a = members[x][(y * 7 + rail * 3 + j * 11) % len(members[x])]
                    b = members[y][(x * 5 + rail * 13 + j * 17) % len(members[y])]
                    inter[a].append((b, rail))
                    inter[b].append((a, rail))
    return names, leaf, inter


INTRA_COUNTS, INTER_COUNTS = [[2, 5], [3, 1]], [[3, 6]]  # latency histograms of a healthy probe


def peer_entries(names, leaf, inter, leaf_size, rails, me):
    """Node `me`'s peer entries with nothing lost: its leaf-mates on every rail, its inter-leaf pairs."""
    mates = range(leaf[me] * leaf_size, min(len(names), (leaf[me] + 1) * leaf_size))
    targets = [(p, r) for p in mates if p != me for r in range(rails)] + inter[me]
    return [{"node": names[p], "leaf": f"leaf-{leaf[p]}", "rail": rail, "probe": probe, "sent": 6, "lost": 0,
             "counts": INTRA_COUNTS if leaf[p] == leaf[me] else INTER_COUNTS}
            for p, rail in targets for probe in ("ping", "tcp")]


def lose(peers, names, leaf, me, rng):
    """The faults, in `peers` (a copy: entries are shared between windows): the dead node, a node at
    3 % loss and a leaf at 20 % uplink loss, and 0.01 % loss everywhere else."""
    lossy, bad_leaf = len(names) * 2 // 5 + 3, leaf[len(names) // 2]
    dead_name, lossy_name, bad_name = names[DEAD], names[lossy], f"leaf-{bad_leaf}"
    for k, e in enumerate(peers):
        p = e["node"]
        loss = 1e-4
        if p == dead_name:
            loss = 1.0
        elif me == lossy or p == lossy_name:
            loss = 0.03
        elif (leaf[me] == bad_leaf) != (e["leaf"] == bad_name):
            loss = 0.2
        if loss >= 1.0 or rng.random() < 6 * loss:
            lost = 6 if loss >= 1.0 else min(6, 1 + int(rng.random() < 0.2 + loss))
            counts = [[2 if e["counts"] is INTRA_COUNTS else 3, 6 - lost]] if lost < 6 else []
            peers[k] = dict(e, lost=lost, counts=counts)
    return peers


def summaries(names, leaf, inter, leaf_size, rails, windows, seed=1):
    """Each node's summary, built when asked for. Most entries are shared between windows (the
    analysis never mutates its input); lost probes are sprinkled in per window."""
    rng = random.Random(seed)
    for me, name in enumerate(names):
        if me == DEAD:
            continue
        base = peer_entries(names, leaf, inter, leaf_size, rails, me)
        ws = [{"start": T0 + w * WS, "closed": True, "peers": lose(list(base), names, leaf, me, rng)}
              for w in range(windows)]
        yield {"schema_version": 1, "node": name, "leaf": f"leaf-{leaf[me]}", "pod": "", "time": T0 + windows * WS,
               "window_seconds": WS, "buckets_seconds": list(BUCKETS_SECONDS), "windows": ws}


def as_summary(doc):
    """What the agent holds (its PeerStats) for a generated answer: packed.dumps folds it as the agent does."""
    return Summary(doc["node"], doc["leaf"], "", doc["time"], doc["window_seconds"], BUCKETS_SECONDS, [
        Window(w["start"], w["closed"], None if "peers" not in w else [
            PeerStats(p["node"], p["leaf"], p["rail"], p["probe"], p["sent"], p["lost"], p.get("retrans", 0),
                      dict(p["counts"])) for p in w["peers"]]) for w in doc["windows"]])


def timed(items, spent: list[float]):
    """Yield from `items`, adding the time spent producing them to spent[0]."""
    it = iter(items)
    while True:
        t0 = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            spent[0] += time.perf_counter() - t0
            return
        spent[0] += time.perf_counter() - t0
        yield item


def mesh_arguments() -> argparse.ArgumentParser:
    """The simulated cluster's options, the same for the controller's benchmark."""
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=10000)
    p.add_argument("--leaf-size", type=int, default=32)
    p.add_argument("--pairs", type=int, default=5, help="representative pairs per leaf pair and rail")
    p.add_argument("--rails", type=int, default=2)
    return p


def main() -> None:
    p = mesh_arguments()
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--input", choices=("json", "parsed", "packed"), default="json",
                   help="json: decoded JSON, parse_summary inside analyze (the CLI's case); parsed: stats.Summary "
                        "objects, parsed before analyze and not timed (the controller's case before the packed "
                        "form); packed: each summary's packed form, decoded (packed.loads) inside the time")
    args = p.parse_args()
    names, leaf, inter = cluster(args.nodes, args.leaf_size, args.pairs, args.rails)
    items = summaries(names, leaf, inter, args.leaf_size, args.rails, args.windows)
    if args.input == "parsed":
        items = map(parse_summary, items)
    spent = [0.0]
    if args.input == "packed":  # the bytes are made outside the time, decoded inside it
        items = map(packed.loads, timed((packed.dumps(as_summary(s)) for s in items), spent))
    before = rss_bytes(os.getpid())
    t0 = time.perf_counter()
    inv = inventory(names, leaf, args.rails)
    analysis = analyze(items if args.input == "packed" else timed(items, spent), {}, T0 + (args.windows + 1) * WS,
                       inv, PROBE_INTERVAL)
    elapsed = time.perf_counter() - t0
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    entries = args.windows * sum(2 * (min(args.nodes, (leaf[i] + 1) * args.leaf_size) - leaf[i] * args.leaf_size - 1)
                                 * args.rails + 2 * len(inter[i]) for i in range(args.nodes) if i != DEAD)
    print(f"{args.nodes} nodes in {len(set(leaf))} leaves, {args.windows} windows, input {args.input}: "
          f"{entries / args.nodes / args.windows:.0f} peer entries per node and window ({entries} in all)")
    work = elapsed - spent[0]
    making = {"json": "generation", "parsed": "generation and parse_summary", "packed": "generation and packing"}
    print(f"analyze: {work:.1f} s ({work / entries * 1e6:.2f} us per peer entry); producing the input "
          f"({making[args.input]}, not counted): {spent[0]:.1f} s")
    print(f"memory: RSS {before / 2**20:.0f} MiB before analyze, max RSS {max_rss / 2**20:.0f} MiB: "
          f"analyze added {(max_rss - before) / 2**20:.0f} MiB")
    print(f"windows analysed: {analysis.windows_seen}; rejected: {len(analysis.rejected)}; "
          f"notes: {analysis.notes}")
    for v in analysis.verdicts:
        print(f"  {v.kind:12} {v.element:16} {v.windows} windows  {v.message}")


if __name__ == "__main__":
    main()
