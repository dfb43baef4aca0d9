"""The silences file in the state directory: written by `nodehealth silence`, read by every pass.

One JSON document, `{"version": 1, "silences": [...]}`, written atomically (root only: mode 0600 in the
state directory, 0700). Two commands that change it at once take turns on a lock file beside it, so
neither loses the other's silence. A reader never takes the lock: it sees the old file or the new one.
"""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from nodehealth.host import write_atomic
from nodehealth.policy import read_regular
from nodehealth.silences import FILE
from nodehealth.silences.silence import Silence, parse_list

LOCK = ".silences.lock"
VERSION = 1
MAX_BYTES = 1 << 20  # 64 silences of a few hundred bytes each; a larger file was not written by us


class StoreError(Exception):
    """The silences file cannot be read or written; a change is refused rather than losing silences."""


def path(state_dir: str) -> str:
    return os.path.join(state_dir, FILE)


def read_raw(state_dir: str) -> list[Any]:
    """The stored entries as JSON values (not yet validated); [] without a file; StoreError when unusable."""
    try:
        raw = read_regular(path(state_dir), MAX_BYTES + 1)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise StoreError(f"cannot read {path(state_dir)}: {getattr(e, 'strerror', None) or e}") from None
    if len(raw) > MAX_BYTES:
        raise StoreError(f"{path(state_dir)} is larger than {MAX_BYTES} bytes")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise StoreError(f"{path(state_dir)} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("silences"), list):
        raise StoreError(f"{path(state_dir)} is not a silences file of version {VERSION}")
    return doc["silences"]


def load(state_dir: str, limit: int, now: float, max_seconds: float) -> tuple[list[Silence], list[str]]:
    """The valid silences of the file and why any others were refused (a file that cannot be read is one
    problem and no silence: a silence that cannot be read silences nothing)."""
    try:
        return parse_list(read_raw(state_dir), "file", limit, now, max_seconds)
    except StoreError as e:
        return [], [str(e)]


@contextlib.contextmanager
def _locked(state_dir: str) -> Iterator[None]:
    import fcntl  # only a command that changes silences pays for it

    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(state_dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def change(state_dir: str, edit: Callable[[list[Any]], list[Any]]) -> list[Any]:
    """Read the entries, let `edit` return the new list, write it; under the lock. StoreError when the
    file cannot be read (it is never overwritten then) or written."""
    try:
        with _locked(state_dir):
            entries = edit(read_raw(state_dir))
            text = json.dumps({"version": VERSION, "silences": entries}, indent=1, sort_keys=True)
            write_atomic(path(state_dir), text.encode("utf-8") + b"\n", durable=True, mode=0o600)
    except OSError as e:
        raise StoreError(f"cannot write {path(state_dir)}: {e.strerror or e}") from None
    return entries
