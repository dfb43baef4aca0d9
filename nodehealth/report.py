"""Human table and JSON rendering of a Report. Faces show a verdict; they never judge."""
from __future__ import annotations

import json
import math
import shutil
import textwrap
from typing import Any

from nodehealth.model import Report, Severity

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


def to_table(report: Report, width: int = 0, verbose: bool = False) -> str:
    """A readable table: status, check, device, message, action; then collectors that failed."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    lines: list[str] = [f"node {report.node}: {report.status.value.upper()}"]
    shown = [f for f in report.findings if verbose or f.severity is not Severity.OK]
    if shown:
        head = ("STATUS", "CHECK", "DEVICE", "ACTION")
        rows = [(f.severity.value + (" (silenced)" if f.silenced else ""), f.check, f.device or "-", f.action.value)
                for f in shown]
        widths = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
        message_width = max(30, width - sum(widths) - 10)
        lines.append("")
        lines.append(_row(head, widths) + "  MESSAGE")
        for f, row in zip(shown, rows):
            note = f" [silenced until {f.silenced['until']}: {f.silenced['comment']}]" if f.silenced else ""
            wrapped = textwrap.wrap(f.message + note, message_width) or [""]
            lines.append(_row(row, widths) + "  " + wrapped[0])
            indent = " " * (sum(widths) + 2 * 4)
            lines.extend(indent + part for part in wrapped[1:])
            if f.evidence.get("pods") or f.evidence.get("slurm_jobs"):  # attribution: whose work it hit
                from nodehealth.attribution.notices import holders  # paid for only when there is something to say

                lines.extend(indent + part for part in textwrap.wrap("hit: " + holders(f), message_width,
                                                                     break_on_hyphens=False, break_long_words=False))
    else:
        lines.append("no findings")
    failed = [c for c in report.collectors if c.supported and not c.success]
    if failed:
        lines.append("")
        lines.append("collectors that failed (their checks are unknown):")
        lines.extend(f"  {c.name}: {c.error}" for c in failed)
    if verbose:
        skipped = [c for c in report.collectors if not c.supported]
        if skipped:
            lines.append("")
            lines.append("collectors not supported here:")
            lines.extend(f"  {c.name}: {c.error}" for c in skipped)
    return "\n".join(lines) + "\n"


def _row(cells, widths) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths))
