"""One silence: which findings it covers, until when, who set it and why; and silences applied to findings.

A silence names a reason code (exactly) and optionally a device; it covers the findings with that reason
(on that device). It is read from a file an operator's command wrote or from a Node annotation anyone
allowed to annotate Nodes wrote, so every field is checked and bounded here, and a bad entry is refused
with a sentence saying why, never a crash.
"""
from __future__ import annotations

import datetime
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from nodehealth.model import Finding, Severity

MAX_TEXT = 500  # a comment or a name: a sentence, not a document
MAX_DEVICE = 256
REASON = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # reason codes are CamelCase words (docs/checks.md)
ID = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
SOURCES = ("file", "annotation")


@dataclass(frozen=True)
class Silence:
    id: str
    reason: str
    device: str  # "" covers the reason on every device
    expires: float  # Unix time
    comment: str
    by: str = ""
    created: float | None = None
    allow_fatal: bool = False  # without it, a fatal finding stays loud
    source: str = "file"  # "file" (nodehealth silence add) or "annotation" (the Node's)

    def covers(self, f: Finding) -> bool:
        return f.reason == self.reason and (not self.device or f.device == self.device)

    def to_dict(self) -> dict[str, Any]:
        """As stored in the file (the source is where it is stored, not a field)."""
        out: dict[str, Any] = {"id": self.id, "reason": self.reason, "device": self.device, "expires": self.expires,
                               "comment": self.comment, "by": self.by, "created": self.created}
        if self.allow_fatal:
            out["allow_fatal"] = True
        return out

    def shown(self) -> dict[str, Any]:
        """What a silenced finding carries in the report: which silence, until when, who and why."""
        return {"id": self.id, "source": self.source, "until": rfc3339(self.expires), "by": self.by,
                "comment": self.comment}

    def describe(self) -> str:
        where = f" on {self.device}" if self.device else " on every device"
        who = f" by {self.by}" if self.by else ""
        fatal = ", fatal included" if self.allow_fatal else ""
        return (f"silence {self.id} ({self.source}): {self.reason}{where} until {rfc3339(self.expires)}{who}"
                f"{fatal}: {self.comment or 'no comment'}")


def rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any, where: str) -> float:
    """Unix seconds, or an RFC 3339 time with its zone (`2026-12-01T00:00:00Z`); else ValueError."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and len(value) <= 40:
        text = value.strip()
        try:
            parsed = datetime.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
        except ValueError:
            raise ValueError(f"{where} is {value!r}, not an RFC 3339 time such as 2026-12-01T00:00:00Z") from None
        if parsed.tzinfo is None:
            raise ValueError(f"{where} is {value!r} without a time zone (add Z for UTC)")
        seconds = parsed.timestamp()
    else:
        raise ValueError(f"{where} is {str(value)[:40]!r}, not a time")
    if not 0 < seconds < 1e11:
        raise ValueError(f"{where} is {value!r}, not a time")
    return seconds


def _text(d: dict[str, Any], key: str, limit: int, where: str) -> str:
    value = d.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key} is {type(value).__name__}, not text")
    if len(value) > limit or any(ord(c) < 32 for c in value):
        raise ValueError(f"{where}.{key} is longer than {limit} characters or holds control characters")
    return value


def new_id(reason: str, device: str, expires: float) -> str:
    """A short stable id for a silence given without one (an annotation written by hand)."""
    import hashlib  # only where a silence is made or read: `check` without silences does not pay for it

    return hashlib.sha256(f"{reason}|{device}|{expires!r}".encode()).hexdigest()[:8]


def parse(d: Any, source: str, where: str = "silence") -> Silence:
    """A silence from its JSON form; ValueError saying what is wrong."""
    if not isinstance(d, dict):
        raise ValueError(f"{where} is {type(d).__name__}, not an object")
    unknown = sorted(set(d) - {"id", "reason", "device", "expires", "comment", "by", "created", "allow_fatal"})
    if unknown:
        raise ValueError(f"{where} has unknown field(s) {', '.join(map(str, unknown))[:100]}")
    reason = d.get("reason")
    if not isinstance(reason, str) or not REASON.fullmatch(reason):
        raise ValueError(f"{where}.reason is {str(reason)[:60]!r}, not a reason code such as GpuLost")
    device = _text(d, "device", MAX_DEVICE, where)
    if "expires" not in d:
        raise ValueError(f"{where} has no expires: every silence ends")
    expires = parse_time(d["expires"], f"{where}.expires")
    created = parse_time(d["created"], f"{where}.created") if d.get("created") is not None else None
    allow_fatal = d.get("allow_fatal", False)
    if not isinstance(allow_fatal, bool):
        raise ValueError(f"{where}.allow_fatal is {allow_fatal!r}, not true or false")
    ident = d.get("id") or new_id(reason, device, expires)
    if not isinstance(ident, str) or not ID.fullmatch(ident):
        raise ValueError(f"{where}.id is {str(ident)[:40]!r}, not 1-32 lower-case letters, digits and hyphens")
    return Silence(ident, reason, device, expires, _text(d, "comment", MAX_TEXT, where),
                   _text(d, "by", MAX_TEXT, where), created, allow_fatal, source)


def parse_list(data: Any, source: str, limit: int, now: float, max_seconds: float) -> tuple[list[Silence], list[str]]:
    """The silences of a JSON list (an object alone is a list of one), and why each refused one was:
    malformed, ending more than `max_seconds` from `now`, a second one with the same id, or over `limit`."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except (ValueError, RecursionError):
            return [], [f"{source}: not JSON"]
    items = [data] if isinstance(data, dict) else data
    if not isinstance(items, list):
        return [], [f"{source}: a {type(data).__name__}, not a list of silences"]
    out: list[Silence] = []
    problems: list[str] = []
    if len(items) > limit:
        problems.append(f"{source}: {len(items)} silences, more than silences.max_silences ({limit}); the first "
                        f"{limit} are used")
    for i, item in enumerate(items[:limit]):
        try:
            s = parse(item, source, f"{source}[{i}]")
        except ValueError as e:
            problems.append(str(e))
            continue
        if s.expires - now > max_seconds:
            problems.append(f"{source}[{i}]: {s.id} ends at {rfc3339(s.expires)}, more than silences.max_seconds "
                            f"({max_seconds:g} s) from now")
        elif any(o.id == s.id for o in out):
            problems.append(f"{source}[{i}]: a second silence with id {s.id}")
        else:
            out.append(s)
    return out, problems


def apply(findings: Sequence[Finding], silences: Sequence[Silence],
          now: float) -> tuple[list[Finding], list[tuple[Silence, Finding]]]:
    """The findings with those that an unexpired silence covers marked silenced, and the (silence, finding)
    pairs where a silence covers a fatal finding without allowing it (the finding stays loud)."""
    live = [s for s in silences if now < s.expires]
    out, refused = [], []
    for f in findings:
        covering = [s for s in live if s.covers(f)]
        allowed = [s for s in covering if s.allow_fatal or f.severity is not Severity.FATAL]
        refused += [(s, f) for s in covering if s not in allowed]
        out.append(replace(f, silenced=allowed[0].shown()) if allowed else f)
    return out, refused
