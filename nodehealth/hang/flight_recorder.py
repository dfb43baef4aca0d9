"""Asking ranks for their PyTorch Flight Recorder dump, from the daemon's side.

Through the timer's request file (any backend: the timer answers it) and, when the rank made it in
our records directory, PyTorch's NCCL debug-info pipe. Every path is ours, built from the record's
own file name or checked to lie in our directory: records are written by the training pods, and the
detector acts on these files as root.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
import time
from typing import Any

from nodehealth.hang import record
from nodehealth.hang.rules import Rank
from nodehealth.host import write_atomic

DUMP_LIMIT = 64 << 20


def ask(ranks: dict[int, Rank], directory: str, errors: list[str]) -> dict[int, dict[str, Any]]:
    """Ask every live rank that runs Flight Recorder for a dump; what was asked of whom (for read())."""
    asked = {}
    for r, rank in ranks.items():
        fr = rank.rec.get("flight_recorder")
        if not rank.host_pid or not isinstance(fr, dict):
            continue
        if rank.process == "stopped":  # it can never answer: do not wait for it
            errors.append(f"rank {r} (Flight Recorder): no dump asked: its process is stopped (SIGSTOP)")
            continue
        request, dump = record.flight_recorder_paths(rank.path)
        info: dict[str, Any] = {"dump": dump, "nccl_pipe": None}
        with contextlib.suppress(OSError):
            os.unlink(dump)  # removes a planted link itself, never what it points at
        try:
            write_atomic(request, b"1\n")  # a rename: replaces a planted link, never writes through it
        except OSError as e:
            info["error"] = f"cannot write the Flight Recorder request file: {e.strerror or e}"
        info["nccl_pipe"] = poke_pipe(directory, fr.get("nccl_pipe"))
        asked[r] = info
    return asked


def read(asked: dict[int, dict[str, Any]], limit: float, stop: threading.Event) -> dict[str, Any]:
    """The dumps asked for, each read once it appears, all within `limit` seconds (or until `stop`)."""
    deadline = time.monotonic() + limit
    out: dict[str, Any] = {}
    for r, info in sorted(asked.items()):
        entry: dict[str, Any] = {"nccl_pipe": info["nccl_pipe"]}
        while not os.path.lexists(info["dump"]) and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.05)
        try:
            entry["dump"] = json.loads(record.read_regular(info["dump"], DUMP_LIMIT))
        except FileNotFoundError:
            entry["error"] = f"no Flight Recorder dump from rank {r} within {limit:g} s (is its process stopped?)"
        except OSError as e:
            entry["error"] = f"cannot read the Flight Recorder dump of rank {r}: {e.strerror or e}"
        except ValueError as e:
            entry["error"] = f"rank {r} wrote a Flight Recorder dump that is not JSON: {e}"
        out[str(r)] = entry
    return out


def poke_pipe(directory: str, name: Any) -> str | None:
    """Write to PyTorch's NCCL debug-info FIFO, which makes the rank dump Flight Recorder. Only a
    FIFO named in the record that lies in our directory, opened without following links."""
    if not isinstance(name, str) or not name or name != record.safe_name(name) or name.startswith("."):
        return None
    pipe = os.path.join(directory, name)
    try:
        fd = record.open_plain(pipe, os.O_WRONLY | os.O_NONBLOCK, stat.S_ISFIFO)
        try:
            os.write(fd, b"1\n")
        finally:
            os.close(fd)
        return f"wrote to {pipe}; the dump goes to the rank's TORCH_FR_DUMP_TEMP_FILE prefix"
    except OSError as e:  # ENXIO: nobody reads it (not an NCCL process group, or FR off)
        return f"cannot trigger through {pipe}: {e.strerror or e}"
