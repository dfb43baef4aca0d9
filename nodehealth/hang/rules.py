"""The judging rules of hang detection, shared by the detector (live) and the report (after the
fact): the thresholds, what makes one rank hung, and what makes a rank a straggler. Pure
functions of records, the time and the thresholds; no files, no processes.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any

from nodehealth.hang.defaults import DEFAULTS  # noqa: F401 (the judging rules' defaults, imported from here)


@dataclass
class Rank:
    """One record as the detector sees it now."""

    path: str
    rec: dict[str, Any]
    host_pid: int | None  # None: the process is gone
    hung: str | None = None  # why, in words
    stuck_at: tuple = ()  # (group, seq) pairs or ("heartbeat", 0): the place of the hang
    pending_age: float = 0.0
    heartbeat_age: float = 0.0
    process: str = "running"  # running, stopped (T), gone, finished, refused
    exit_status: str | None = None  # how a gone process ended ("exit code 3"), when the kernel told us

    @property
    def silent(self) -> bool:
        """Its heartbeat stopped (judge() found it so)."""
        return ("heartbeat", 0) in self.stuck_at


def judge(rank: Rank, now: float, cfg: dict[str, Any]) -> None:
    """Set rank.hung (why, or None), the place it is stuck at and its ages: a pure function of
    the record, the time and the thresholds."""
    rec = rank.rec
    rank.heartbeat_age = max(0.0, now - rec["heartbeat"])
    # an op's age is taken at the heartbeat, when the rank last said it was pending: between two
    # publishes it may have finished, and a silent rank is caught by the heartbeat rule instead
    said_at = min(now, rec["heartbeat"])
    reasons, place, oldest = [], [], 0.0
    for name, group in sorted(rec["groups"].items()):
        pending = [op for op in group.get("pending", []) if isinstance(op.get("enqueued_at"), (int, float))]
        if not pending:
            continue
        op = min(pending, key=lambda o: o["seq"])
        age = max(0.0, said_at - op["enqueued_at"])
        oldest = max(oldest, age)
        limit = limit_for(group, op["op"], cfg)
        if age > limit:
            reasons.append(f"{op['op']} #{op['seq']} in group {name} pending for {age:.1f} s (limit {limit:.1f} s)")
            place.append((name, op["seq"]))
    rank.pending_age = oldest
    if rank.heartbeat_age > cfg["heartbeat_timeout_seconds"] and not rec.get("exited"):
        reasons.append(f"no heartbeat for {rank.heartbeat_age:.1f} s (limit {cfg['heartbeat_timeout_seconds']:.1f} s)")
        place.append(("heartbeat", 0))
    rank.hung = "; ".join(reasons) or None
    rank.stuck_at = tuple(place)


def limit_for(group: dict[str, Any], op: str, cfg: dict[str, Any]) -> float:
    stats = group.get("p99", {}).get(op)
    if isinstance(stats, dict) and isinstance(stats.get("seconds"), (int, float)) \
            and isinstance(stats.get("samples"), int) and stats["samples"] >= cfg["min_samples"]:
        return max(cfg["floor_seconds"], cfg["p99_factor"] * stats["seconds"])
    return cfg["floor_seconds"]


MIN_STRETCHES = 5  # stretches of ops a straggler is judged over (their medians)


def stragglers(records: dict[str, dict[str, Any]], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Ranks the others keep waiting for, one entry each. A rank slow every step arrives last at the
    step's first collective: the others wait there for it, it does not. Which collective absorbs the
    wait depends on the code, so ranks are compared over stretches of ops, the same ops on every
    rank, each long enough to hold a step: the others spend `straggler_ratio` times as long in the
    collectives of a stretch as it does, and their longest one (the wait per step) lasts
    `straggler_min_wait_seconds` longer than its own. Medians over the stretches, so one slow step
    (a checkpoint) names nobody; in an even job, or one slow in turns, nobody arrives last."""
    found: dict[int, dict[str, Any]] = {}
    groups = sorted({g for rec in records.values() for g in rec.get("groups", {}) if not g.endswith("/p2p")})
    for name in groups:
        ops, ranks = _stretches({int(r): rec["groups"].get(name) for r, rec in records.items()})
        count = len(next(iter(ranks.values()), ([], []))[0])
        for r, (spent, longest) in sorted(ranks.items()):
            others = [v for q, v in ranks.items() if q != r]
            their_spent = median([median([o[0][m] for o in others]) for m in range(count)])
            their_longest = median([median([o[1][m] for o in others]) for m in range(count)])
            own_spent, own_longest = median(spent), median(longest)
            wait = their_longest - own_longest
            if their_spent < cfg["straggler_ratio"] * own_spent or wait < cfg["straggler_min_wait_seconds"]:
                continue
            groups_of_r = found.get(r, {}).get("groups", []) + [name]
            if r in found and found[r]["wait_seconds"] >= wait:
                found[r]["groups"] = groups_of_r
                continue
            host = records[str(r)].get("host")
            found[r] = {"rank": r, "host": host, "group": name, "groups": groups_of_r, "ops_per_stretch": ops,
                        "wait_seconds": round(wait, 4), "others_longest": round(their_longest, 4),
                        "own_longest": round(own_longest, 4), "others_seconds": round(their_spent, 4),
                        "own_seconds": round(own_spent, 4),
                        "summary": f"rank {r}{f' on {host}' if host else ''} is a straggler: in group {name} the "
                                   f"others wait up to {their_longest:.3f} s in a collective for it (it waits "
                                   f"{own_longest:.3f} s) and spend {their_spent / max(own_spent, 1e-6):.1f}x "
                                   f"as long in collectives: it arrives last"}
    return [found[r] for r in sorted(found)]


def _stretches(groups: dict[int, Any]) -> tuple[int, dict[int, tuple[list[float], list[float]]]]:
    """Ops per stretch, and per rank the seconds spent in each stretch and in its longest op: the
    blocks of ops every rank published (timer._Stream.blocks), cut into MIN_STRETCHES or more
    stretches as long as they allow, the newest last. Nothing when fewer blocks are common."""
    blocks = {r: g["blocks"] for r, g in groups.items() if isinstance(g, dict) and isinstance(g.get("blocks"), dict)}
    if len(blocks) < 2 or len({b["ops"] for b in blocks.values()}) != 1:
        return 0, {}
    start = max(b["first"] for b in blocks.values())
    end = min(b["first"] + len(b["seconds"]) for b in blocks.values())
    if end - start < MIN_STRETCHES:
        return 0, {}
    per = (end - start) // MIN_STRETCHES
    cuts = range(end - per * ((end - start) // per), end, per)
    out = {}
    for r, b in blocks.items():
        seconds = [max(0.0, x) for x in b["seconds"]]  # a wall clock stepped back may give a negative
        longest = [max(0.0, x) for x in b["longest"]]
        out[r] = ([sum(seconds[c - b["first"]:c - b["first"] + per]) for c in cuts],
                  [max(longest[c - b["first"]:c - b["first"] + per]) for c in cuts])
    return per * next(iter(blocks.values()))["ops"], out
