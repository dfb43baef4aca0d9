"""The per-rank state record: what a training process says about its collectives.

The timer writes it; the detector and the report read it. It is one small JSON file per rank,
written to a temporary name and renamed over the old one, so a reader sees either the previous
record or the new one, never half of one. Readers still check the shape: a corrupt or foreign
file is a RecordError naming the file, never a crash.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

from nodehealth.host import write_atomic

VERSION = 1
SUFFIX = ".rank.json"
MAX_RECORD_BYTES = 1 << 20
MAX_WORLD = 1 << 20


class RecordError(Exception):
    pass


def record_path(directory: str, job: str, rank: int) -> str:
    return os.path.join(directory, f"{safe_name(job)}.{rank}{SUFFIX}")


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
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
    except OSError as e:
        raise RecordError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"{path}: larger than {MAX_RECORD_BYTES} bytes; not a state record")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RecordError(f"{path}: corrupt state record (not JSON: {e})") from None
    return validate(obj, path)


def validate(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise RecordError(f"{where}: corrupt state record (expected an object)")
    if obj.get("version") != VERSION:
        raise RecordError(f"{where}: unsupported state record version {obj.get('version')!r}")
    for key, kind in (("rank", int), ("world_size", int), ("pid", int), ("job", str),
                      ("heartbeat", (int, float)), ("groups", dict)):
        if not isinstance(obj.get(key), kind) or isinstance(obj.get(key), bool):
            raise RecordError(f"{where}: corrupt state record ({key} missing or of the wrong type)")
    if not 0 < obj["world_size"] <= MAX_WORLD or not 0 <= obj["rank"] < obj["world_size"]:
        raise RecordError(f"{where}: corrupt state record (rank {obj['rank']} of world size {obj['world_size']})")
    for name, group in obj["groups"].items():
        if not isinstance(group, dict):
            raise RecordError(f"{where}: corrupt state record (group {name} is not an object)")
        for key in ("enqueued", "completed"):
            if not isinstance(group.get(key), int):
                raise RecordError(f"{where}: corrupt state record (group {name} has no {key} sequence)")
        if not isinstance(group.get("pending", []), list) or not isinstance(group.get("recent", []), list):
            raise RecordError(f"{where}: corrupt state record (group {name} pending/recent is not a list)")
        for op in group.get("pending", []) + group.get("recent", []):
            if not isinstance(op, dict) or not isinstance(op.get("seq"), int) or not isinstance(op.get("op"), str):
                raise RecordError(f"{where}: corrupt state record (group {name} has a malformed op)")
            if not isinstance(op.get("enqueued_at", 0), (int, float)):
                raise RecordError(f"{where}: corrupt state record (group {name} op {op['seq']} has a bad time)")
        if not isinstance(group.get("p99", {}), dict):
            raise RecordError(f"{where}: corrupt state record (group {name} p99 is not an object)")
    return obj
