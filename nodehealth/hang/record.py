"""The per-rank state record: what a training process says about its collectives.

The timer writes it; the detector and the report read it. It is one small JSON file per rank,
written to a temporary name and renamed over the old one, so a reader sees either the previous
record or the new one, never half of one. Readers still check the shape: a corrupt or foreign
file is a RecordError naming the file, never a crash.
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from typing import Any

from nodehealth.host import read_fd, write_atomic

VERSION = 1
SUFFIX = ".rank.json"
FR_REQUEST = ".fr-request"  # the detector creates it: "dump Flight Recorder now"
FR_DUMP = ".fr.json"  # the rank writes its Flight Recorder dump here
# Caps checked before a record is parsed or merged: records are written by any user of the node.
# A real record is a few KiB (8 pending and 8 recent ops per group); 3D parallelism makes tens of
# groups; the largest jobs run tens of thousands of ranks.
MAX_RECORD_BYTES = 256 << 10
MAX_DEPTH = 12  # a record nests 6 deep (record, groups, group, pending, op, sizes, size)
MAX_WORLD = 1 << 16
MAX_GROUPS = 64
MAX_OPS = 64  # pending and recent ops per group
MAX_BLOCKS = 64  # blocks of op durations per group (the timer keeps 64)
MAX_POD_NAME = 253  # a pod's name is a DNS subdomain; a namespace is shorter


class RecordError(Exception):
    pass


def record_path(directory: str, job: str, rank: int) -> str:
    return os.path.join(directory, f"{safe_name(job)}.{rank}{SUFFIX}")


def flight_recorder_paths(record: str) -> tuple[str, str]:
    """The request and dump files of a record, named after the record's own file: the daemon never
    takes a path from what a rank wrote."""
    base = record[: -len(SUFFIX)]
    return base + FR_REQUEST, base + FR_DUMP


def open_plain(path: str, flags: int, kind: Any = stat.S_ISREG) -> int:
    """A descriptor of `path` only if the entry itself (not a symlink, hard link or device) is of
    `kind`: any training pod can write the records directory and the daemon acts on it as root.
    The kind is checked before the real open, so a planted device is never opened: O_PATH pins
    the inode without opening it, and /proc/self/fd reopens that very inode."""
    pinned = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(pinned)
        if not kind(st.st_mode) or st.st_nlink > 1:  # 0: just replaced by a rename, still whole
            raise OSError(errno.EPERM, "a link, or not the kind of file expected here; refused", path)
        return os.open(f"/proc/self/fd/{pinned}", flags | os.O_CLOEXEC)
    finally:
        os.close(pinned)


def read_regular(path: str, limit: int) -> bytes:
    """Up to `limit` bytes of a plain file, opened with open_plain."""
    fd = open_plain(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        return read_fd(fd, limit, path)
    finally:
        os.close(fd)


def safe_name(text: str) -> str:
    """A job id as a file name part: launchers use host:port and UUIDs, never trust them."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:100] or "job"


def write_json(path: str, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, separators=(",", ":"), sort_keys=True).encode("utf-8"))


def list_records(directory: str) -> list[str]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(os.path.join(directory, n) for n in names if n.endswith(SUFFIX) and not n.startswith("."))


def read_record(path: str) -> dict[str, Any]:
    """A validated record, or RecordError saying what is wrong with which file."""
    return read_owned(path)[0]


def read_owned(path: str) -> tuple[dict[str, Any], int]:
    """A validated record and the uid owning its file (the user it speaks for), or RecordError.
    Size and nesting are checked on the bytes, before json parses them."""
    try:
        fd = open_plain(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise RecordError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        owner = os.fstat(fd).st_uid
        data = os.read(fd, MAX_RECORD_BYTES + 1)
    except OSError as e:
        raise RecordError(f"{path}: cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"{path}: over the cap: larger than {MAX_RECORD_BYTES} bytes; not a state record")
    if nesting(data) > MAX_DEPTH:
        raise RecordError(f"{path}: over the cap: nested deeper than {MAX_DEPTH}; not a state record")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RecordError(f"{path}: corrupt state record (not JSON: {e})") from None
    return validate(obj, path), owner


_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = re.compile(rb"[^\[\]{}]+")


def nesting(data: bytes) -> int:
    """How deep the JSON in `data` nests, counted without parsing (json recurses per level): the
    strings are cut out, then the brackets counted, stopping as soon as the cap is passed."""
    depth = deepest = 0
    for c in _NOT_BRACKETS.sub(b"", _STRINGS.sub(b"", data)):
        depth += 1 if c in b"[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > MAX_DEPTH:
                break
    return deepest


def validate(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise RecordError(f"{where}: corrupt state record (expected an object)")
    if obj.get("version") != VERSION:
        raise RecordError(f"{where}: unsupported state record version {obj.get('version')!r}")
    for key, kind in (("rank", int), ("world_size", int), ("pid", int), ("job", str),
                      ("heartbeat", (int, float)), ("groups", dict)):
        if not isinstance(obj.get(key), kind) or isinstance(obj.get(key), bool):
            raise RecordError(f"{where}: corrupt state record ({key} missing or of the wrong type)")
    if not math.isfinite(obj["heartbeat"]):
        raise RecordError(f"{where}: corrupt state record (heartbeat is not a finite time)")
    if obj["world_size"] > MAX_WORLD:
        raise RecordError(f"{where}: over the cap: world size {obj['world_size']} > {MAX_WORLD}")
    if not 0 < obj["world_size"] or not 0 <= obj["rank"] < obj["world_size"]:
        raise RecordError(f"{where}: corrupt state record (rank {obj['rank']} of world size {obj['world_size']})")
    _check_pod(obj.get("pod"), where)
    if len(obj["groups"]) > MAX_GROUPS:
        raise RecordError(f"{where}: over the cap: {len(obj['groups'])} process groups > {MAX_GROUPS}")
    for name, group in obj["groups"].items():
        if not isinstance(group, dict):
            raise RecordError(f"{where}: corrupt state record (group {name} is not an object)")
        ranks = group.get("ranks")
        if ranks is not None and (not isinstance(ranks, list) or len(ranks) > obj["world_size"]
                                  or not all(isinstance(r, int) and 0 <= r < obj["world_size"] for r in ranks)):
            raise RecordError(f"{where}: corrupt state record (group {name} ranks are not ranks of the job)")
        if len(group.get("pending") or []) + len(group.get("recent") or []) > 2 * MAX_OPS:
            raise RecordError(f"{where}: over the cap: group {name} lists more than {2 * MAX_OPS} ops")
        for key in ("enqueued", "completed"):
            if not isinstance(group.get(key), int):
                raise RecordError(f"{where}: corrupt state record (group {name} has no {key} sequence)")
        if not isinstance(group.get("pending", []), list) or not isinstance(group.get("recent", []), list):
            raise RecordError(f"{where}: corrupt state record (group {name} pending/recent is not a list)")
        for op in group.get("pending", []) + group.get("recent", []):
            if not isinstance(op, dict) or not isinstance(op.get("seq"), int) or not isinstance(op.get("op"), str):
                raise RecordError(f"{where}: corrupt state record (group {name} has a malformed op)")
            if not isinstance(op.get("enqueued_at", 0), (int, float)) or not math.isfinite(op.get("enqueued_at", 0)):
                raise RecordError(f"{where}: corrupt state record (group {name} op {op['seq']} has a bad time)")
        if not isinstance(group.get("p99", {}), dict):
            raise RecordError(f"{where}: corrupt state record (group {name} p99 is not an object)")
        _check_blocks(group.get("blocks"), where, name)
    return obj


def _check_pod(pod: Any, where: str) -> None:
    """The rank's pod (timer._pod), when the record names one: Kubernetes names, bounded."""
    if pod is None:
        return
    names = (pod.get("name"), pod.get("namespace") or "") if isinstance(pod, dict) else ()
    if not names or not all(isinstance(n, str) and len(n) <= MAX_POD_NAME for n in names) or not names[0]:
        raise RecordError(f"{where}: corrupt state record (pod is not a pod's namespace and name)")


def _check_blocks(blocks: Any, where: str, group: str) -> None:
    """The durations of a group's blocks of ops (timer._Stream.blocks), when the record has them."""
    if blocks is None:
        return
    corrupt = RecordError(f"{where}: corrupt state record (group {group} has malformed blocks of ops)")
    if not isinstance(blocks, dict):
        raise corrupt
    seconds, longest = blocks.get("seconds"), blocks.get("longest")
    if not isinstance(seconds, list) or not isinstance(longest, list) or len(seconds) != len(longest):
        raise corrupt
    if len(seconds) > MAX_BLOCKS:
        raise RecordError(f"{where}: over the cap: group {group} has more than {MAX_BLOCKS} blocks of ops")
    if not all(_count(blocks.get(key), least) for key, least in (("ops", 1), ("first", 0))):
        raise corrupt
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
               for x in seconds + longest):
        raise corrupt


def _count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least
