"""From bundles to an answer: who is the culprit, and where every rank stands.

The desync verdict, per process group, from the ranks' sequence numbers: k is the lowest
sequence still pending anywhere. Ranks that never entered k are the culprits. If every rank
entered k and none finished it, it is a communication hang (the network, not the code). If the
ranks entered different ops at k, the code paths diverged. When ranks of the group have no record
(a bundle of one node: they run elsewhere) and the ranks we have all entered k, the verdict is
"incomplete": the missing ones may be the culprits, so only all nodes' bundles together can say.
Stacks are merged into one tree of frames in which every node carries the set of ranks that passed
through it, minority branches first, so the odd rank out is the first thing one reads.
"""
from __future__ import annotations

import html
import json
import os
import zlib
from typing import Any

from nodehealth.hang import record
from nodehealth.hang.stacks import ADDRESS

NETWORK_HINT = ("suspect the links between these ranks: run `nodehealth check --only infiniband,link_events` "
                "on their nodes")
ALL_NODES_HINT = "run `nodehealth hang report` over the bundles of all the job's nodes for the verdict"


class ReportError(Exception):
    pass


# -- input ---------------------------------------------------------------------------------------
def load(paths: list[str]) -> list[dict[str, Any]]:
    """Bundles from files and directories; a directory of state records (no bundles) is read as
    one bundle per job without stacks, so a live record directory can be judged too."""
    bundles = []
    for path in paths:
        if os.path.isdir(path):
            names = sorted(os.listdir(path))
            found = [os.path.join(path, n) for n in names if n.startswith("hang-") and n.endswith(".json")]
            if found:
                bundles += [_read_bundle(p) for p in found]
            else:
                bundles += from_records(path)
        else:
            bundles.append(_read_bundle(path))
    if not bundles:
        raise ReportError(f"no hang bundles or state records in {', '.join(paths)}")
    return bundles


def _read_bundle(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.loads(f.read(256 << 20))
    except OSError as e:
        raise ReportError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise ReportError(f"{path}: not a JSON hang bundle ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != "nodehealth-hang-bundle":
        raise ReportError(f"{path}: not a nodehealth hang bundle")
    records, errors = {}, list(data.get("errors") or [])
    for r, rec in (data.get("records") or {}).items():
        try:
            records[str(r)] = record.validate(rec, f"{path} rank {r}")
        except record.RecordError as e:
            errors.append(str(e))
    return {**data, "records": records, "errors": errors}


def from_records(directory: str) -> list[dict[str, Any]]:
    jobs: dict[str, dict[str, Any]] = {}
    errors = []
    for path in record.list_records(directory):
        try:
            rec = record.read_record(path)
        except record.RecordError as e:
            errors.append(str(e))
            continue
        job = jobs.setdefault(rec["job"], {"kind": "nodehealth-hang-bundle", "job": rec["job"], "node": rec.get("host"),
                                           "records": {}, "stacks": {}, "errors": [], "live": True})
        job["records"][str(rec["rank"])] = rec
    for job in jobs.values():
        job["errors"] += errors
    return list(jobs.values())


def combine(bundles: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One view per job across nodes: records, stacks and FR dumps of every rank, the latest wins."""
    jobs: dict[str, dict[str, Any]] = {}
    for b in sorted(bundles, key=lambda b: b.get("detected_at") or 0):
        job = jobs.setdefault(str(b.get("job")), {"job": b.get("job"), "nodes": [], "records": {}, "stacks": {},
                                                  "native_stacks": {}, "flight_recorder": {}, "processes": {},
                                                  "exit_statuses": {}, "silent": {}, "errors": [],
                                                  "live": True})
        job["live"] = job["live"] and bool(b.get("live"))
        job["nodes"].append(b.get("node"))
        for key in ("records", "stacks", "native_stacks", "flight_recorder", "processes", "exit_statuses", "silent"):
            job[key].update(b.get(key) or {})
        job["errors"] += b.get("errors") or []
        job["detected_at"] = b.get("detected_at")
    return jobs


# -- the verdict ---------------------------------------------------------------------------------
def verdicts(bundle: dict[str, Any]) -> list[dict[str, Any]]:
    """The desync verdict for every process group with a pending op, worst news first; a rank whose
    process is gone or stopped is said so plainly, first."""
    records = {int(r): rec for r, rec in (bundle.get("records") or {}).items()}
    fr = _flight_recorder_status(bundle.get("flight_recorder") or {})
    processes = {int(r): p for r, p in (bundle.get("processes") or {}).items() if str(r).isdigit()}
    stale = {r for r, p in processes.items() if p in ("gone", "stopped") and r in records and r not in fr}
    names = sorted({g for rec in records.values() for g in rec["groups"]} | {g for st in fr.values() for g in st})
    statuses = bundle.get("exit_statuses") or {}
    out = [_process_verdict(r, processes[r], records[r], statuses.get(str(r))) for r in sorted(stale)]
    out += _silent(bundle, records, stale)
    for name in names:
        if name.endswith("/p2p"):
            out += _p2p(name, records)
        else:
            v = _group_verdict(name, records, fr, stale)
            if v:
                out.append(v)
    if any(v["group"] and not v["group"].startswith("fr/") and v["kind"] != "p2p_pending" for v in out):
        # the Flight Recorder's groups ("fr/NAME", read every few seconds) are the door for ops issued
        # from C++; when our own exact counts give a verdict, they would only repeat it, staler
        out = [v for v in out if not v["group"].startswith("fr/")]
    order = {"rank_gone": 0, "rank_stopped": 0, "never_joined": 1, "heartbeat_lost": 2, "diverged": 3,
             "communication_hang": 4, "not_finished": 5, "incomplete": 6, "p2p_pending": 7}
    return sorted(out, key=lambda v: (order.get(v["kind"], 9), v["group"]))


def _process_verdict(r: int, process: str, rec: dict[str, Any], status: Any = None) -> dict[str, Any]:
    """What became of a stopped or gone rank; `status` is how it ended ("exit code 3", "killed by
    SIGKILL"), when the detector heard it from the kernel."""
    status = status[:100] if isinstance(status, str) and status else None
    code = rec.get("exit_code")
    if status is None and rec.get("exited") and isinstance(code, int) and not isinstance(code, bool):
        status = f"exit code {code}"  # the rank's own word, where the kernel's was not heard
    if process == "stopped":
        summary = f"rank {r} is stopped (SIGSTOP, or a debugger holds it): it cannot take part until resumed"
    elif rec.get("exited") and isinstance(rec.get("exit_reason"), str):
        summary = (f"rank {r}'s process is gone ({status or 'exit code not known'}): it exited after an "
                   f"{rec['exit_reason'][:200]} while its peers wait")
    elif rec.get("exited"):
        summary = f"rank {r}'s process is gone ({status or 'exit code not known'}): it exited while its peers wait"
    elif status:
        summary = f"rank {r}'s process is gone ({status}) without exiting normally"
    else:
        summary = f"rank {r}'s process is gone: killed or crashed without exiting normally (exit code not known)"
    return {"kind": f"rank_{process}", "group": "", "culprits": [r], "summary": summary}


def _silent(bundle: dict[str, Any], records: dict[int, dict[str, Any]], stale: set[int]) -> list[dict[str, Any]]:
    """Ranks whose heartbeat stopped with no collective in flight: no sequence number can speak, so
    their silence does. `silent` (rank -> seconds without a heartbeat) is what the detector saw."""
    out = []
    for r, age in sorted((int(r), a) for r, a in (bundle.get("silent") or {}).items() if str(r).isdigit()):
        rec = records.get(r)
        if rec is None or r in stale or any(g.get("pending") for g in rec["groups"].values()):
            continue
        stack = (bundle.get("stacks") or {}).get(str(r)) or {}
        state = f"; its process is in state {stack['state']}" if stack.get("state") else ""
        state += f" (wchan {stack['wchan']})" if state and stack.get("wchan") else ""
        out.append({"kind": "heartbeat_lost", "group": "", "culprits": [r],
                    "summary": f"rank {r} has published no heartbeat for {float(age):.0f} s and has no collective "
                               "in flight: its process runs no Python (a C call holding the GIL, a deadlock, a wait "
                               f"in the kernel) or cannot write its record (a full or hung file system){state}"})
    return out


def _group_verdict(name: str, records: dict[int, dict[str, Any]], fr: dict[int, dict[str, Any]],
                   stale: set[int] | frozenset[int] = frozenset()) -> dict | None:
    world = max((rec["world_size"] for rec in records.values()), default=0)
    members = next((rec["groups"][name].get("ranks") for rec in records.values()
                    if name in rec["groups"] and isinstance(rec["groups"][name].get("ranks"), list)), None)
    members = sorted(members) if members else list(range(world)) or sorted(records)
    # A group seen through the Flight Recorder ("fr/NAME") is in each record as that rank's timer last
    # read it, seconds apart between ranks: a rank read mid-op looks stuck in an op its peers finished.
    # The dumps asked for the bundle are read at one moment: when every member has one, they decide.
    pg = name[3:] if name.startswith("fr/") else None
    dumped = pg is not None and bool(members) and all(pg in fr.get(r, {}) for r in members)
    seqs, ops, missing = {}, {}, []
    for r in members:
        group = records[r]["groups"].get(name) if r in records else None
        if dumped or group is not None:
            seqs[r] = fr[r][pg] if dumped else (group["enqueued"], group["completed"])
            listed = group.get("recent", []) + group.get("pending", []) if group is not None else []
            ops[r] = {op["seq"]: op for op in listed}
        elif r in records:
            seqs[r] = (0, 0)  # its record has no op in this group at all: it never entered one
            ops[r] = {}
        elif name in fr.get(r, {}):
            seqs[r] = fr[r][name]  # no record, but its Flight Recorder knows
            ops[r] = {}
        else:
            missing.append(r)
    fresh = [seqs[r][1] for r in seqs if r not in stale]
    if fresh:  # a gone or stopped rank's last record is older than it: it took part in all the others finished
        done_by_all = min(fresh)
        for r in stale & set(seqs):
            seqs[r] = (max(seqs[r][0], done_by_all), max(seqs[r][1], done_by_all))
    pending = [r for r, (enq, done) in seqs.items() if enq > done]
    if not pending:
        return None
    k = min(seqs[r][1] + 1 for r in pending)
    never = sorted(r for r, (enq, _) in seqs.items() if enq < k)
    entered = sorted(r for r, (enq, _) in seqs.items() if enq >= k)
    finished = sorted(r for r in entered if seqs[r][1] >= k)
    at_k = {r: ops[r].get(k) for r in entered}
    signatures = {r: (op["op"], json.dumps(op.get("sizes")), op.get("dtype")) for r, op in at_k.items() if op}
    op_name = next((s[0] for s in signatures.values()), "op")
    base = {"group": name, "seq": k, "op": op_name, "members": fold(members), "entered": fold(entered),
            "finished": fold(finished), "never_entered": fold(never), "no_record": fold(missing),
            "culprits": never, "ranks": {str(r): {"enqueued": e, "completed": c} for r, (e, c) in sorted(seqs.items())}}
    where = f"{op_name} #{k} of group {name}"
    if never:
        waiting = f"; ranks {fold(entered)} wait in it" if entered else ""
        summary = f"rank{'s' if len(never) > 1 else ''} {fold(never)} never entered {where}{waiting}"
        kind = "never_joined"
    elif len(set(signatures.values())) > 1:
        groups: dict[tuple, list[int]] = {}
        for r, sig in signatures.items():
            groups.setdefault(sig, []).append(r)
        by_size = sorted(groups.items(), key=lambda g: len(g[1]))
        parts = [f"ranks {fold(rs)} in {sig[0]} {sig[1]} {sig[2]}" for sig, rs in by_size]
        summary = f"the ranks diverged at #{k} of group {name}: " + " vs ".join(parts)
        kind = "diverged"
        base["culprits"] = by_size[0][1]
    elif missing:  # the ranks we lack may never have entered: no verdict from one node's view
        done = f", ranks {fold(finished)} finished it" if finished else ", none finished it"
        summary = (f"ranks {fold(entered)} entered {where}{done}; ranks {fold(missing)} have no record here "
                   f"(they run on other nodes): {ALL_NODES_HINT}")
        kind = "incomplete"
    elif not finished:
        summary = f"all ranks entered {where} and none finished: a communication hang; {NETWORK_HINT}"
        kind = "communication_hang"
    else:
        stuck = sorted(set(entered) - set(finished))
        summary = f"ranks {fold(finished)} finished {where} but ranks {fold(stuck)} did not"
        kind = "not_finished"
        base["culprits"] = stuck
    if missing and kind != "incomplete":
        summary += f" (no record from ranks {fold(missing)})"
    return {**base, "kind": kind, "summary": summary}


def _p2p(name: str, records: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r, rec in sorted(records.items()):
        group = rec["groups"].get(name)
        for op in (group or {}).get("pending", [])[:1]:
            peer = op.get("peer")
            out.append({"kind": "p2p_pending", "group": name, "seq": op["seq"], "op": op["op"], "culprits": [],
                        "summary": f"rank {r} waits in {op['op']} #{op['seq']} of group {name}"
                                   + (f" with peer {peer}" if peer is not None else "")})
    return out


def _flight_recorder_status(fr: dict[str, Any]) -> dict[int, dict[str, tuple[int, int]]]:
    """pg_status of each rank's Flight Recorder dump: group name -> (last enqueued, last completed)."""
    out: dict[int, dict[str, tuple[int, int]]] = {}
    for r, entry in fr.items():
        dump = entry.get("dump") if isinstance(entry, dict) else None
        status = dump.get("pg_status") if isinstance(dump, dict) else None
        if not isinstance(status, dict) or not str(r).isdigit():
            continue
        groups = {}
        for name, st in status.items():
            try:
                groups[str(name)] = (int(st["last_enqueued_collective"]), int(st["last_completed_collective"]))
            except (KeyError, TypeError, ValueError):
                continue
        out[int(r)] = groups
    return out


def live_hang(job: dict[str, Any], now: float) -> bool:
    """Whether live records (written at different moments) show a hang by the detector's own
    thresholds. Between two publishes a healthy rank may be one op ahead of another: only an op
    pending past its limit, or a silent heartbeat, makes the sequence numbers worth comparing.
    Ranks whose heartbeat stopped go into job["silent"], as the detector puts them in a bundle."""
    from nodehealth.hang.rules import DEFAULTS, Rank, judge  # loads hang/defaults.py: only a live report needs it

    hung = False
    for r, rec in job.get("records", {}).items():
        if rec.get("finished") or rec.get("exited"):
            continue
        rank = Rank(str(r), rec, rec.get("pid"))
        judge(rank, now, DEFAULTS)
        hung = hung or bool(rank.hung)
        if rank.silent:
            job.setdefault("silent", {})[str(r)] = round(rank.heartbeat_age, 1)
    return hung


def standing(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Where every rank stands: step, regions, oldest pending op, process state, innermost frame."""
    out = []
    ranks = sorted({int(r) for r in job.get("records", {})} | {int(r) for r in job.get("stacks", {})})
    for r in ranks:
        rec = job["records"].get(str(r)) or {}
        stack = (job.get("stacks") or {}).get(str(r)) or {}
        pending = [f"{op['op']} #{op['seq']} (group {g})" for g, grp in sorted(rec.get("groups", {}).items())
                   for op in grp.get("pending", [])[:1]]
        main = _main_thread(stack.get("threads") or [])
        frame = _label(main["frames"][0]) if main and main["frames"] else None
        out.append({"rank": r, "host": rec.get("host"), "pid": rec.get("pid"), "step": rec.get("step"),
                    "regions": [g.get("name") for g in rec.get("regions", []) if isinstance(g, dict)],
                    "pending": pending, "state": stack.get("state"), "frame": frame, "error": stack.get("error")})
    return out


def _main_thread(threads: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((t for t in threads if t.get("name") == "MainThread"), threads[0] if threads else None)


# -- the stack tree ------------------------------------------------------------------------------
class Node:
    __slots__ = ("frame", "ranks", "ends", "children")

    def __init__(self, frame: str):
        self.frame = frame
        self.ranks: set[int] = set()
        self.ends: set[int] = set()  # ranks whose stack ends here
        self.children: dict[str, Node] = {}

    def ordered(self) -> list[Node]:
        """Minority branches first: the odd rank out is read before the crowd."""
        return sorted(self.children.values(), key=lambda n: (len(n.ranks), min(n.ranks), n.frame))

    def to_dict(self) -> dict[str, Any]:
        return {"frame": self.frame, "ranks": fold(self.ranks), "count": len(self.ranks),
                "children": [c.to_dict() for c in self.ordered()]}


def stack_tree(stacks: dict[str, Any], native: dict[str, Any] | None = None) -> Node:
    """Every rank's threads, outermost frame first, merged; the first level is the thread name. A
    rank's native dump (py-spy --native: C/C++ frames interleaved with the Python ones) is used
    where it has threads; its child processes (DataLoader workers) follow under their own names."""
    root = Node("all")
    for r, dump in stacks.items():
        rank = int(r)
        full = (native or {}).get(r) or {}
        threads = full.get("threads") or (dump or {}).get("threads") or []
        if not threads:
            continue
        root.ranks.add(rank)
        for thread in threads:
            _add(_child(root, f"thread {thread.get('name') or thread.get('thread_id')}", rank), thread, rank)
        for child in ((dump or {}).get("children") or {}).values():
            for thread in (child or {}).get("threads") or []:
                _add(_child(root, f"child process, thread {thread.get('name') or thread.get('thread_id')}", rank),
                     thread, rank)
    return root


def _add(node: Node, thread: dict[str, Any], rank: int) -> None:
    for frame in reversed(thread.get("frames") or []):
        node = _child(node, _label(frame), rank)
    node.ends.add(rank)


def _child(node: Node, frame: str, rank: int) -> Node:
    child = node.children.get(frame)
    if child is None:
        child = node.children[frame] = Node(frame)
    child.ranks.add(rank)
    return child


def _label(frame: dict[str, Any]) -> str:
    """`name (file:line)`; a native frame still a bare address (a pasted dump, an older bundle) differs
    in every process and would split the ranks: it is an unnamed frame of its library."""
    name, line = str(frame.get("name", "?")), frame.get("line") or 0
    if ADDRESS.fullmatch(name):
        name = "?"
    return f"{name} ({frame.get('file', '?')}{':' + str(line) if line else ''})"


def fold(ranks: Any) -> str:
    """Rank numbers as ranges: {0,1,2,3,5} -> "0-3,5"."""
    nums = sorted(set(ranks))
    parts, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(parts)


# -- renderings ----------------------------------------------------------------------------------
def to_text(job: dict[str, Any], tree: Node, vs: list[dict[str, Any]]) -> str:
    nodes = ", ".join(sorted({str(n) for n in job.get("nodes", [])}))
    lines = [f"job {job.get('job')} (nodes: {nodes})", "", "verdict:"]
    lines += [f"  {v['summary']}" for v in vs] or [f"  {job.get('note') or 'no pending collective in any record'}"]
    lines += ["", "ranks:"]
    for s in standing(job):
        where = ", ".join(s["pending"]) or "no pending op"
        lines.append(f"  rank {s['rank']}: step {s['step']}, {where}, state {s['state'] or '?'}, "
                     f"at {s['frame'] or '?'}" + (f" [{s['error']}]" if s["error"] else ""))
    lines += ["", "stacks (rank sets, minority branches first):"]
    lines += _tree_lines(tree, 1) or ["  no stacks collected"]
    if job.get("errors"):
        lines += ["", "errors:"] + [f"  {e}" for e in job["errors"]]
    return "\n".join(lines) + "\n"


def _tree_lines(node: Node, depth: int) -> list[str]:
    out = []
    for child in node.ordered():
        out.append(f"{'  ' * depth}[{fold(child.ranks)}] {child.frame}")
        out += _tree_lines(child, depth + 1)
    return out


def to_json(job: dict[str, Any], tree: Node, vs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"job": job.get("job"), "nodes": job.get("nodes"), "verdicts": vs, "note": job.get("note"),
            "ranks": standing(job),
            "tree": tree.to_dict(), "errors": job.get("errors", [])}


def to_folded(tree: Node) -> str:
    """Flamegraph folded lines; each frame carries its rank set, the count is ranks ending there."""
    lines: list[str] = []

    def walk(node: Node, path: list[str]) -> None:
        here = path + [f"{node.frame} [{fold(node.ranks)}]".replace(";", ":")]
        if node.ends:
            lines.append(f"{';'.join(here)} {len(node.ends)}")
        for child in node.ordered():
            walk(child, here)

    for child in tree.ordered():
        walk(child, [])
    return "\n".join(lines) + ("\n" if lines else "")


ROW, WIDTH, CHAR = 18, 1200, 7.0


def to_svg(job: dict[str, Any], tree: Node, vs: list[dict[str, Any]]) -> str:
    """An icicle picture (outermost frame on top), width by rank count; hover shows frame and ranks."""
    total = max(1, len(tree.ranks))
    header = [f"hang report: job {job.get('job')}"] + [v["summary"] for v in vs]
    top = 10 + ROW * len(header)
    rects: list[str] = []

    def draw(node: Node, x: float, depth: int, crowd: int) -> None:
        width = WIDTH * len(node.ranks) / total
        y = top + depth * ROW
        color = "#e4572e" if len(node.ranks) < crowd else _warm(node.frame)
        label = f"{node.frame} [{fold(node.ranks)}]"
        text = label[: max(0, int((width - 6) / CHAR))]
        rects.append(f'<g><title>{html.escape(label)}</title>'
                     f'<rect x="{x:.1f}" y="{y}" width="{max(width - 1, 0.5):.1f}" height="{ROW - 1}" '
                     f'fill="{color}" rx="2"/>'
                     + (f'<text x="{x + 3:.1f}" y="{y + 13}">{html.escape(text)}</text>' if text else "") + "</g>")
        largest = max((len(c.ranks) for c in node.children.values()), default=0)
        for child in node.ordered():
            draw(child, x, depth + 1, largest)
            x += WIDTH * len(child.ranks) / total

    x = 0.0
    largest = max((len(c.ranks) for c in tree.children.values()), default=0)
    for child in tree.ordered():
        draw(child, x, 0, largest)
        x += WIDTH * len(child.ranks) / total
    height = top + ROW * (_depth(tree) + 1) + 10
    head = "".join(f'<text x="4" y="{14 + i * ROW}" font-weight="{"bold" if i == 0 else "normal"}">'
                   f"{html.escape(t)}</text>" for i, t in enumerate(header))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'font-family="monospace" font-size="11">\n<rect width="100%" height="100%" fill="#fffdf8"/>\n'
            f"{head}\n" + "\n".join(rects) + "\n</svg>\n")


def _depth(node: Node) -> int:
    return max((1 + _depth(c) for c in node.children.values()), default=0)


def _warm(frame: str) -> str:
    """A stable warm color per frame, so the same frame looks the same in every picture."""
    h = zlib.crc32(frame.encode())
    return f"rgb({225 + h % 30},{140 + (h >> 8) % 80},{40 + (h >> 16) % 50})"
