"""Human table and JSON rendering of a Report, and the list of checks. Faces show a verdict; they never judge."""
from __future__ import annotations

import errno
import json
import math
import os
import shutil
import textwrap
from collections.abc import Sequence
from typing import Any

from nodehealth.engine import COLLECTOR_FAILED
from nodehealth.model import Finding, Report, Severity

SCHEMA_VERSION = 1


def to_json(report: Report) -> str:
    """The stable `check --json` / `/v1/report` document (see README, "JSON report"): strict JSON."""
    doc = {"schema_version": SCHEMA_VERSION}
    doc.update(report.to_dict())
    return json.dumps(_finite(doc), indent=2, sort_keys=False, default=str, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    """JSON has no NaN or Infinity (jq and Go reject them): a number that is not finite becomes null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def to_table(report: Report, width: int = 0, verbose: bool = False, checks: Sequence[Any] = ()) -> str:
    """The verdict for a person: each finding with its reason; each collector that failed, once, with the
    checks it left unable to judge; and what was checked. `checks` are the pass's checks (their NEEDS name
    the sources they read); `verbose` lists each with its verdict, and findings of severity ok too."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    lines: list[str] = [f"node {report.node}: {report.status.value.upper()}"]
    failed = [c for c in report.collectors if c.supported and not c.success]
    unjudged = {c.NAME for c in checks if any(n in {f.name for f in failed} for n in c.NEEDS)}
    shown = [f for f in report.findings if (verbose or f.severity is not Severity.OK)
             and not (f.reason == COLLECTOR_FAILED and f.check in unjudged)]  # said once per collector below
    if shown:
        lines += [""] + _columns(("STATUS", "CHECK", "REASON", "DEVICE", "ACTION"),
                                 [(f.severity.value + (" (silenced)" if f.silenced else ""), f.check, f.reason,
                                   f.device or "-", f.action.value, _message(f)) for f in shown], width)
    elif not failed:
        lines.append("no findings")
    if failed:
        lines.append("")
        folded = {(f.check, f.reason) for f in shown}  # the engine's one finding for a failed collector
        for c in failed:  # a failure its checks gave as one finding is shown in full there
            said = (c.name, c.failed_reason) in folded
            lines.append(f"could not read {c.name}: " + (f"{c.failed_reason} above" if said else c.error))
            names = sorted(x.NAME for x in checks if c.name in x.NEEDS)
            if names:
                lines.append(f"  {len(names)} checks could not judge: {', '.join(names)}")
        if any(_refused(c.error) for c in failed):
            lines += textwrap.wrap(ROOT_HINT if os.geteuid() != 0 else CAPABILITY_HINT, max(40, width),
                                   initial_indent="hint: ", subsequent_indent="      ")
    if checks and verbose:
        lines += [""] + _columns(("CHECK", "SOURCE", "VERDICT"), [
            (c.NAME, ", ".join(c.NEEDS), verdict) for c, verdict in check_verdicts(report, checks)], width)
    if checks:
        lines += ["", _checked(report, checks, unjudged, verbose)]
    return "\n".join(lines) + "\n"


def _message(f: Finding) -> list[str]:
    """A finding's message column: its sentence (and its silence), then whose work it hit, each a paragraph."""
    note = f" [silenced until {f.silenced['until']}: {f.silenced['comment']}]" if f.silenced else ""
    paragraphs = [f.message + note]
    if f.evidence.get("pods") or f.evidence.get("slurm_jobs"):  # attribution: whose work it hit
        from nodehealth.attribution.notices import holders  # paid for only when there is something to say

        paragraphs.append("hit: " + holders(f))
    return paragraphs


ROOT_HINT = ("nodehealth is not running as root, and some sources are root's alone (the kernel log, other "
             "processes' limits): run it as root, e.g. sudo nodehealth check")
CAPABILITY_HINT = ("refused although running as root: the process lacks a capability the source needs (a "
                   "container or a service that drops them; deploy/ gives the agent what it needs)")


def _refused(error: str | None) -> bool:
    """A collector's error that says the kernel refused it for want of privilege."""
    return bool(error) and any(os.strerror(code) in error for code in (errno.EACCES, errno.EPERM))


def check_verdicts(report: Report, checks: Sequence[Any]) -> list[tuple[Any, str]]:
    """Each check with its verdict: the worst severity of its findings, `ok`, or `skipped: why` when a
    source it reads is not on this host (or only the daemon gathers it)."""
    results = {c.name: c for c in report.collectors}
    worst: dict[str, Severity] = {}
    for f in report.findings:
        if f.check not in worst or f.severity.rank > worst[f.check].rank:
            worst[f.check] = f.severity
    out = []
    for c in checks:
        missing = [n for n in c.NEEDS if n not in results or not results[n].supported]
        if missing:
            why = results[missing[0]].error if missing[0] in results else "only the daemon runs it"
            out.append((c, f"skipped: {why}"))
        else:
            out.append((c, worst.get(c.NAME, Severity.OK).value))
    return out


def _checked(report: Report, checks: Sequence[Any], unjudged: set[str], verbose: bool) -> str:
    """`checked: 12 checks on 6 sources; ...`, as NHC and dcgmi diag say what they ran."""
    verdicts = check_verdicts(report, checks)
    judged = [c for c, v in verdicts if not v.startswith("skipped") and c.NAME not in unjudged]
    skipped = sum(1 for _, v in verdicts if v.startswith("skipped"))
    sources = {n for c in judged for n in c.NEEDS}
    line = f"checked: {len(judged)} checks on {len(sources)} sources"
    if unjudged:
        line += f"; {len(unjudged)} could not judge"
    if skipped:
        line += f"; {skipped} skipped, their source is not here"
    return line + ("" if verbose else " (-v lists each check)")


def to_check_list(checks: Sequence[Any], width: int = 0) -> str:
    """`check --list`: every check, its subsystem, the collectors it reads and what it finds."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    lines = [f"{len(checks)} checks (--only and --skip take these names, or a collector's):"]
    for c in checks:
        lines += ["", f"{c.NAME}  [{c.SUBSYSTEM}]  reads {', '.join(c.NEEDS)}: {_plain(c.SOURCE)}"]
        lines += textwrap.wrap(_plain(c.FINDS), max(40, width - 2), initial_indent="  ", subsequent_indent="  ")
    return "\n".join(lines) + "\n"


def _plain(text: str) -> str:
    """Markdown's code quotes left out: the terminal shows the words."""
    return text.replace("`", "")


def _columns(head: tuple[str, ...], rows: list[tuple[str, ...]], width: int) -> list[str]:
    """Rows in aligned columns under `head`. A row one longer than `head` ends in a message (a list of paragraphs, each
    begun on a line of its own; words never broken): wrapped in a
    last column, or, where that column would be narrower than MESSAGE_MIN, under its row, indented."""
    n = len(head)
    widths = [max(len(r[i]) for r in [*rows, head]) for i in range(n)]
    if len(rows[0]) == n:
        return [_row(head, widths).rstrip()] + [_row(r, widths).rstrip() for r in rows]
    message_width = width - sum(widths) - 2 * n
    if message_width < MESSAGE_MIN:
        out = [_row(head, widths).rstrip()]
        for row in rows:
            out.append(_row(row[:n], widths).rstrip())
            for paragraph in row[n]:
                out.extend(_wrap(paragraph, max(MESSAGE_MIN, width - 4), "    "))
        return out
    out = [_row(head, widths) + "  MESSAGE"]
    indent = " " * (sum(widths) + 2 * n)
    for row in rows:
        wrapped = [part for paragraph in row[n] for part in _wrap(paragraph, message_width)] or [""]
        out.append(_row(row[:n], widths) + "  " + wrapped[0])
        out.extend(indent + part for part in wrapped[1:])
    return out


def _wrap(text: str, width: int, indent: str = "") -> list[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False,
                         break_long_words=False)


MESSAGE_MIN = 40


def _row(cells, widths) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths))
