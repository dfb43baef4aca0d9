"""What time adds to a pass: debounce, sticky faults, and the state file that outlives restarts.

- Performance findings (from checks with DEBOUNCE) are raised after K consecutive bad passes and
  cleared after M good passes plus a delay, so a one-pass blip never taints a node.
- Fatal hardware findings are sticky: they stay until the boot id changes (the node rebooted)
  or an operator clears them, even if the evidence scrolls out of the kernel ring buffer.
- The state lives in one JSON file written atomically (write, fsync, rename).
"""
from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from nodehealth.host import write_atomic
from nodehealth.model import Action, Finding, Severity

log = logging.getLogger(__name__)

STATE_VERSION = 1
STATE_FILE = "state.json"
STICKY_ACTIONS = (Action.RESET_GPU, Action.REBOOT, Action.HW_INSPECTION)
MAX_STATE_BYTES = 64 << 20


def is_sticky(f: Finding) -> bool:
    return f.severity is Severity.FATAL and f.action in STICKY_ACTIONS


def _key_text(key: tuple[str, str, str]) -> str:
    return "|".join(key)


class StateFile:
    """One JSON document under the state directory; a corrupt file is set aside, never fatal."""

    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, STATE_FILE)

    def load(self, read_only: bool = False) -> dict[str, Any]:
        """The saved state; an unusable file is set aside (renamed) unless `read_only` (the
        one-shot check must not touch the daemon's file: it may be a newer daemon's)."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as e:
            log.warning("cannot read state file %s: %s; starting without history", self.path, e)
            return {}
        try:
            if len(raw) > MAX_STATE_BYTES:
                raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
                raise ValueError(f"not a nodehealth state document of version {STATE_VERSION}")
            return data
        except ValueError as e:
            if read_only:
                log.warning("state file %s is unusable (%s); ignoring it", self.path, e)
                return {}
            aside = self.path + ".corrupt"
            log.error("state file %s is unusable (%s); moved to %s, starting without history", self.path, e, aside)
            try:
                os.replace(self.path, aside)
            except OSError:
                pass
            return {}

    def save(self, data: dict[str, Any]) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        data = dict(data, version=STATE_VERSION)
        text = json.dumps(data, separators=(",", ":"), sort_keys=True, default=str)
        write_atomic(self.path, text.encode("utf-8"), durable=True, mode=0o600)

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
