"""What time adds to a pass: debounce, sticky faults, and the state file that outlives restarts.

- Performance findings (from checks with DEBOUNCE) are raised after K consecutive bad passes and
  cleared after M good passes plus a delay, so a one-pass blip never taints a node.
- Fatal hardware findings are sticky: they stay until the boot id changes (the node rebooted)
  or an operator clears them, even if the evidence scrolls out of the kernel ring buffer.
- The state lives in one JSON file written atomically (write, fsync, rename).
- An operator clears sticky faults after a repair with a request file beside it (`nodehealth clear`).
"""
from __future__ import annotations

import copy
import json
import logging
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Callable

from nodehealth.host import read_bytes, write_atomic
from nodehealth.model import Action, Finding, Severity

log = logging.getLogger(__name__)

STATE_VERSION = 1
STATE_FILE = "state.json"
STICKY_ACTIONS = (Action.RESET_GPU, Action.REBOOT, Action.HW_INSPECTION)
# Read no more than this: 10,000 kernel events (kernel_stream.MAX_EVENTS) and the sticky faults fit in a few
# MiB; a larger file was not written by us, and parsing it whole would stall the start.
MAX_STATE_BYTES = 16 << 20
TEMP_MAX_AGE_SECONDS = 60.0  # a write_atomic temporary this old was left by a writer that died


def is_sticky(f: Finding) -> bool:
    return f.severity is Severity.FATAL and f.action in STICKY_ACTIONS


def _key_text(key: tuple[str, str, str]) -> str:
    return "|".join(key)


class StateFile:
    """One JSON document under the state directory; a corrupt file is set aside, never fatal."""

    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, STATE_FILE)
        # What the last save wrote, and the file it wrote: the daemon saves after every pass and
        # most passes change nothing, so an unchanged document is not written (and fsynced) again
        # while the file on disk is still the one written.
        self._written: tuple[bytes, tuple[int, ...]] | None = None

    def load(self, read_only: bool = False,
             validate: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """The saved state; an unusable file (unparseable, wrong types, too large, not a regular
        file) is set aside (renamed) unless `read_only` (the one-shot check must not touch the
        daemon's file: it may be a newer daemon's). `validate` checks the sections other modules
        own, raising ValueError. A daemon's load also removes temporaries a crashed writer left."""
        if not read_only:
            self._remove_stale_temporaries()
        try:
            try:
                raw = read_regular(self.path, MAX_STATE_BYTES + 1)
            except FileNotFoundError:
                return {}
            except OSError as e:
                log.warning("cannot read state file %s: %s; starting without history", self.path, e)
                return {}
            if len(raw) > MAX_STATE_BYTES:
                raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
                raise ValueError(f"not a nodehealth state document of version {STATE_VERSION}")
            validate_state(data)
            if validate is not None:
                validate(data)
            return data
        except (ValueError, RecursionError) as e:
            if read_only:
                log.warning("state file %s is unusable (%s); ignoring it", self.path, e)
                return {}
            aside = self.path + ".corrupt"
            log.error("state file %s is unusable (%s); moved to %s, starting afresh without history",
                      self.path, e, aside)
            try:
                os.replace(self.path, aside)
            except OSError:
                pass
            return {}

    def _remove_stale_temporaries(self) -> None:
        try:
            names = [n for n in os.listdir(self.directory) if n.startswith(".tmp-")]
        except OSError:
            return
        for name in names:
            path = os.path.join(self.directory, name)
            try:
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode) and time.time() - st.st_mtime > TEMP_MAX_AGE_SECONDS:
                    os.unlink(path)
            except OSError:
                continue

    def save(self, data: dict[str, Any]) -> None:
        data = dict(data, version=STATE_VERSION)
        raw = json.dumps(data, separators=(",", ":"), sort_keys=True, default=str).encode("utf-8")
        if self._written is not None and self._written == (raw, _identity(self.path)):
            return
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        write_atomic(self.path, raw, durable=True, mode=0o600)
        identity = _identity(self.path)
        self._written = None if identity is None else (raw, identity)


def _identity(path: str) -> tuple[int, ...] | None:
    """Which file is at `path` now (a rename or a rewrite changes it); None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def read_regular(path: str, limit: int) -> bytes:
    """At most `limit` bytes of a regular file; a FIFO or device in its place is a ValueError, never a
    wait (and one swapped in after the check reads without blocking: host.read_bytes)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError("not a regular file")
    return read_bytes(path, limit)


def expect(value: Any, types: type | tuple[type, ...], where: str, optional: bool = False) -> Any:
    """`value` if it has one of `types` (a bool is no number), else ValueError naming `where`."""
    if value is None and optional:
        return value
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ValueError(f"{where} is {value!r}, not a number")
    if not isinstance(value, types):
        raise ValueError(f"{where} is {type(value).__name__} {str(value)[:40]!r}, not the type a state file holds")
    return value


def _check_finding(d: Any, where: str) -> None:
    expect(d, dict, where)
    for name in ("check", "reason", "message"):
        expect(d.get(name), str, f"{where}.{name}")
    expect(d.get("device", ""), str, f"{where}.device")
    expect(d.get("evidence"), dict, f"{where}.evidence", optional=True)
    for name in ("first_seen", "last_seen"):
        expect(d.get(name), (int, float), f"{where}.{name}", optional=True)
    try:
        Severity(d.get("severity"))
        Action(d.get("action", "none"))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def validate_state(data: dict[str, Any]) -> None:
    """The policy's sections of a state document have the types this code uses, else ValueError:
    a wrong type would crash every pass, and a daemon restarted by its supervisor would crash-loop."""
    expect(data.get("boot_id"), str, "boot_id", optional=True)
    for i, d in enumerate(expect(data.get("sticky", []), list, "sticky")):
        _check_finding(d, f"sticky[{i}]")
    for key, track in expect(data.get("debounce", {}), dict, "debounce").items():
        where = f"debounce[{key[:60]!r}]"
        expect(track, dict, where)
        for name in ("bad", "good"):
            expect(track.get(name, 0), int, f"{where}.{name}")
        for name in ("first_seen", "last_bad"):
            expect(track.get(name), (int, float), f"{where}.{name}", optional=True)
        for name in ("raised", "event"):
            expect(track.get(name, False), bool, f"{where}.{name}")
        expect(track.get("check"), str, f"{where}.check", optional=True)
        if track.get("finding") is not None:
            _check_finding(track["finding"], f"{where}.finding")


class Policy:
    """Turns each pass's raw findings into the node's current findings, remembering across passes."""

    def __init__(self, cfg: dict[str, Any], debounced_checks: Iterable[str], boot_id: str | None,
                 debounce: bool = True, event_reasons: Iterable[tuple[str, str]] = ()):
        self.raise_after = max(1, int(cfg["raise_after_passes"])) if debounce else 1
        self.clear_after = max(1, int(cfg["clear_after_passes"])) if debounce else 1
        self.clear_after_seconds = float(cfg["clear_after_seconds"]) if debounce else 0.0
        self.debounced_checks: set[str] = set(debounced_checks)
        # (check, reason) pairs that report a counter's increase: one bad pass is the whole event, so
        # they are raised at once and held for event_hold_seconds after the last increase.
        self.event_reasons: set[tuple[str, str]] = set(event_reasons)
        self.event_hold_seconds = float(cfg["event_hold_seconds"])
        self.boot_id = boot_id
        self.sticky: dict[str, Finding] = {}
        self.tracks: dict[str, dict[str, Any]] = {}

    # -- persistence -------------------------------------------------------------------------
    def restore(self, state: dict[str, Any]) -> None:
        """Take sticky faults and debounce tracks from a saved state of the same boot."""
        if not state or state.get("boot_id") != self.boot_id or self.boot_id is None:
            return
        for d in state.get("sticky", []):
            try:
                f = Finding.from_dict(d)
            except (KeyError, ValueError, TypeError):
                continue
            self.sticky[_key_text(f.key)] = f
        tracks = state.get("debounce", {})
        if isinstance(tracks, dict):
            self.tracks = {k: v for k, v in tracks.items() if isinstance(v, dict)}

    def dump(self) -> dict[str, Any]:
        return {
            "boot_id": self.boot_id,
            "sticky": [f.to_dict() for _, f in sorted(self.sticky.items())],
            "debounce": copy.deepcopy(self.tracks),
        }

    def clear_sticky(self) -> list[Finding]:
        """An operator's clear: forget every sticky fault. Returns what was cleared."""
        cleared = list(self.sticky.values())
        self.sticky.clear()
        return cleared

    # -- one pass ------------------------------------------------------------------------------
    def apply(self, findings: list[Finding], now: float,
              judged_checks: Iterable[str] | None = None) -> list[Finding]:
        """This pass's findings plus history -> the current non-sticky findings of the judged checks.

        Sticky faults are kept in the policy (see sticky_findings()). `judged_checks` names the
        checks that ran; debounce tracks of other checks are left alone, so re-judging only the
        kernel-log checks on a new record does not count as a pass for the others.
        """
        judged = set(judged_checks) if judged_checks is not None else None
        unknown = {f.check for f in findings if f.severity is Severity.UNKNOWN}
        out: list[Finding] = []
        seen_debounced: set[str] = set()
        for f in findings:
            key = _key_text(f.key)
            f = self._stamp(f, key, now)
            if is_sticky(f):
                self.sticky[key] = f
                continue
            if f.check in self.debounced_checks and f.severity is not Severity.UNKNOWN:
                seen_debounced.add(key)
                if self._bad(key, f, now):
                    out.append(f)
                continue
            out.append(f)
        self._good_passes(seen_debounced, judged, unknown, now, out)
        return out

    def sticky_findings(self) -> list[Finding]:
        return list(self.sticky.values())

    def _stamp(self, f: Finding, key: str, now: float) -> Finding:
        previous = self.sticky.get(key)
        track = self.tracks.get(key)
        first = f.first_seen
        if first is None:
            first = previous.first_seen if previous is not None else (track or {}).get("first_seen", now)
        last = f.last_seen if f.last_seen is not None else now
        return replace(f, first_seen=first, last_seen=last)

    def _bad(self, key: str, f: Finding, now: float) -> bool:
        track = self.tracks.setdefault(key, {"bad": 0, "good": 0, "raised": False, "first_seen": now})
        track["bad"] += 1
        track["good"] = 0
        track["last_bad"] = now
        track["check"] = f.check
        track["event"] = (f.check, f.reason) in self.event_reasons
        if track["bad"] >= (1 if track["event"] else self.raise_after):
            track["raised"] = True
            track["finding"] = f.to_dict()  # shown while it proves it is gone for good
        return bool(track["raised"])

    def _good_passes(self, seen: set[str], judged: set[str] | None, unknown: set[str], now: float,
                     out: list[Finding]) -> None:
        for key in list(self.tracks):
            if key in seen:
                continue
            track = self.tracks[key]
            if judged is not None and track.get("check") not in judged:
                continue
            if track.get("check") in unknown:
                # The check could not judge: nothing proved the fault gone, so it stays as it was.
                if track.get("raised") and track.get("finding"):
                    out.append(Finding.from_dict(track["finding"]))
                continue
            track["good"] = track.get("good", 0) + 1
            track["bad"] = 0
            quiet = now - track.get("last_bad", now)
            if track.get("event"):
                done = quiet >= self.event_hold_seconds
            else:
                done = track["good"] >= self.clear_after and quiet >= self.clear_after_seconds
            if not track.get("raised") or done:
                del self.tracks[key]
            elif track.get("finding"):
                # Still raised while it proves it is gone for good: keep showing it.
                out.append(Finding.from_dict(track["finding"]))


# -- an operator's clear, asked for by `nodehealth clear` and applied by the daemon's next pass ---------

CLEAR_REQUEST = "clear-request.json"
MAX_REASON = 500


def request_clear(state_dir: str, reason: str) -> str:
    """Ask the daemon to clear sticky faults (`nodehealth clear`); it acts at its next pass."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    path = os.path.join(state_dir, CLEAR_REQUEST)
    write_atomic(path, json.dumps({"reason": reason[:MAX_REASON], "time": time.time()}).encode(), mode=0o600)
    return path


def take_clear_request(state_dir: str) -> str | None:
    """The reason of a pending clear request, removing it; None when there is none (or it is garbage)."""
    path = os.path.join(state_dir, CLEAR_REQUEST)
    try:
        data = json.loads(read_regular(path, 4096))  # a FIFO put there must not block the passes
        os.unlink(path)
    except (OSError, ValueError):
        return None
    reason = data.get("reason") if isinstance(data, dict) else None
    return str(reason)[:MAX_REASON] if reason else "no reason given"
