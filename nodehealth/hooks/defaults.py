"""The `hooks` section: the remediation hook (off, and with nothing to run, until a site configures it)."""
from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "enabled": False,
    # The program and its arguments, e.g. ["/usr/local/sbin/remediate", "--site", "a"]: run without a shell,
    # the event's JSON on its stdin; exit 0 is success. argv[0] is an absolute path. Empty: no command.
    "command": [],
    # POST the event's JSON here (http:// or https://); a 2xx answer is success. Empty: no POST.
    "url": "",
    # Findings at or above this severity count (warning, unknown, degraded or fatal); silenced ones never do.
    "min_severity": "degraded",
    # One run (the whole command, or the whole HTTP exchange) ends after this long: it is killed or cut off.
    "timeout_seconds": 30.0,
    # Runs at once. A repair tool that drains or reboots should see one event at a time per node.
    "max_concurrency": 2,
    # Runs per minute at most (a token bucket of this size, refilled evenly): a flapping finding or a
    # restart that finds twenty faults must not flood a ticket system or a remediation API.
    "max_per_minute": 10.0,
    # Events waiting for a run; beyond it the oldest waiting one is dropped and counted.
    "max_queue": 100,
}
MEANINGS = {
    "enabled": "run the hook when a finding appears or clears (needs `command` or `url`)",
    "command": "the program and its arguments, its first an absolute path; run without a shell, the event's JSON "
               "on stdin; exit 0 is success",
    "url": "POST the event's JSON here (`http://` or `https://`); a 2xx answer is success",
    "min_severity": "findings at or above this severity count: `warning`, `unknown`, `degraded` or `fatal` "
                    "(silenced ones never do)",
    "timeout_seconds": "one whole run: the command's process group is killed, the HTTP exchange cut",
    "max_concurrency": "runs at once (events of one finding never run at once)",
    "max_per_minute": "runs per minute at most (a bucket of this many, refilled evenly); the others wait",
    "max_queue": "events waiting for a run; past it the oldest waiting one is dropped and counted",
}
