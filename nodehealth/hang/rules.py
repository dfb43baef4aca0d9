"""The judging rules of hang detection, shared by the detector (live) and the report (after the
fact): the thresholds, what makes one rank hung, and what makes a rank a straggler. Pure
functions of records, the time and the thresholds; no files, no processes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodehealth.config import HANG_DEFAULTS

DEFAULTS = HANG_DEFAULTS  # kept in config.py with the other settings


@dataclass
class Rank:
    """One record as the detector sees it now."""

    path: str
    rec: dict[str, Any]
    host_pid: int | None  # None: the process is gone
    hung: str | None = None  # why, in words
    stuck_at: tuple = ()  # (group, seq) pairs or ("heartbeat",): the place of the hang
    pending_age: float = 0.0
    heartbeat_age: float = 0.0
    process: str = "running"  # running, stopped (T), gone, finished, refused
    exit_status: str | None = None  # how a gone process ended ("exit code 3"), when the kernel told us


def judge(rank: Rank, now: float, cfg: dict[str, Any]) -> None:
    """Set rank.hung (why, or None), the place it is stuck at and its ages: a pure function of
    the record, the time and the thresholds."""
    rec = rank.rec
    rank.heartbeat_age = max(0.0, now - rec["heartbeat"])
    reasons, place, oldest = [], [], 0.0
    for name, group in sorted(rec["groups"].items()):
        pending = [op for op in group.get("pending", []) if isinstance(op.get("enqueued_at"), (int, float))]
        if not pending:
            continue
        op = min(pending, key=lambda o: o["seq"])
        age = max(0.0, now - op["enqueued_at"])
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


def stragglers(records: dict[str, dict[str, Any]], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Ranks the others keep waiting for. A rank that is slow every step arrives last at each
    collective and waits least in it, while its peers wait for it: its median duration of an op is
    far below the median of the others' medians. An even job has no such rank."""
    out = []
    groups = sorted({g for rec in records.values() for g in rec.get("groups", {}) if not g.endswith("/p2p")})
    for name in groups:
        by_op: dict[str, dict[int, float]] = {}
        for r, rec in records.items():
            for op, stats in ((rec["groups"].get(name) or {}).get("p99") or {}).items():
                stats = stats if isinstance(stats, dict) else {}
                p50, samples = stats.get("p50"), stats.get("samples")
                if isinstance(p50, (int, float)) and isinstance(samples, int) and samples >= cfg["min_samples"]:
                    by_op.setdefault(op, {})[int(r)] = float(p50)
        for op, medians in sorted(by_op.items()):
            if len(medians) < 2:
                continue
            for r, own in sorted(medians.items()):
                others = sorted(v for q, v in medians.items() if q != r)
                typical = others[len(others) // 2]
                if typical >= cfg["straggler_ratio"] * own and typical - own >= cfg["straggler_min_wait_seconds"]:
                    host = records[str(r)].get("host")
                    out.append({"rank": r, "host": host, "group": name, "op": op, "own_p50": round(own, 4),
                                "others_p50": round(typical, 4),
                                "summary": f"rank {r}{f' on {host}' if host else ''} is a straggler: the others "
                                           f"wait {typical:.3f} s (median) in {op} of group {name}, it waits "
                                           f"{own:.3f} s: it arrives last"})
    return out
