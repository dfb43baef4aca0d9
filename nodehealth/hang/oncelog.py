"""Warnings said once per cause, the rest counted.

A bad record stays bad scan after scan, a flood of foreign records is refused on every scan and a
refused bundle directory refuses every hang: the same news each second was ~650 MB of log a day.
Each cause is logged the first time and then at most once per REMIND_SECONDS, saying how many
like it were not logged since; every one is counted (nodehealth_hang_warnings_not_logged_total).
"""
from __future__ import annotations

import logging
from typing import Any

REMIND_SECONDS = 3600.0
CAUSES = ("bad_record", "over_cap", "foreign_process", "bundle_dir", "no_dumpable_process")


class OncePerCause:
    def __init__(self, log: logging.Logger, clock: Any):
        self.log = log
        self.clock = clock
        self.said: dict[str, float] = {}  # cause -> when it was last logged
        self.since: dict[str, int] = {}  # cause -> warnings not logged since then
        self.not_logged: dict[str, int] = dict.fromkeys(CAUSES, 0)  # cause -> all not logged (a counter)

    def warn(self, cause: str, message: str, level: int = logging.WARNING) -> None:
        now = self.clock()
        last = self.said.get(cause)
        if last is not None and now - last < REMIND_SECONDS:
            self.since[cause] = self.since.get(cause, 0) + 1
            self.not_logged[cause] += 1
            return
        more = self.since.pop(cause, 0)
        if last is None:
            note = (f" (more like it are counted in nodehealth_hang_warnings_not_logged_total{{cause=\"{cause}\"}}, "
                    f"said again at most hourly)")
        else:
            note = f" ({more} more like it since, not logged)"
        self.said[cause] = now
        self.log.log(level, "hang: %s%s", message, note)
