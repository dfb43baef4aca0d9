"""The log of the long-running commands (the daemon, the pingmesh controller, `hang watch`): text for a
person, or one JSON object a line for a log pipeline (`--log-format json`), always with the same keys.

JSON keys: time (RFC 3339, UTC), level, logger, msg, check, reason, device, node, and `error` (the
traceback) on a line about an exception. A line about a finding carries its check, reason and device
(`log.warning(..., extra=finding_fields(f))`); the others carry null there. `node` is the node the
process runs on.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from typing import Any

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
KEYS = ("time", "level", "logger", "msg", "check", "reason", "device", "node")
LOG_EVERY_SECONDS = 60.0  # RateLimitedLog: one line per cause this often at most
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def add_options(parser: argparse.ArgumentParser) -> None:
    """--log-format and --log-level, for every command that logs."""
    parser.add_argument("--log-format", choices=FORMATS, default="text",
                        help="text (default) or json: one object a line with the keys time, level, logger, msg, "
                             "check, reason, device, node")
    parser.add_argument("--log-level", choices=LEVELS, default="info", help="the least severe level logged "
                                                                            "(default info)")


def setup(log_format: str = "text", level: str = "info", node: str | None = None) -> None:
    """Send every logger's lines to stderr in `log_format`, from `level` up; replaces any earlier setup."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(node) if log_format == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def finding_fields(finding: Any) -> dict[str, str]:
    """The `extra` of a line about a finding: its check, reason and device."""
    return {"check": finding.check, "reason": finding.reason, "device": finding.device or None}


class JsonFormatter(logging.Formatter):
    def __init__(self, node: str | None = None):
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc = {
            "time": f"{seconds}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "check": getattr(record, "check", None),
            "reason": getattr(record, "reason", None),
            "device": getattr(record, "device", None),
            "node": getattr(record, "node", None) or self.node,
        }
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


class RateLimitedLog:
    """At most one line per cause every LOG_EVERY_SECONDS, saying how many like it went unsaid. What
    a peer sends in a loop must not become a log line (or a traceback) per request: callers count
    every one in a metric, and the log says that something happens and why."""

    def __init__(self, logger: logging.Logger, every: float = LOG_EVERY_SECONDS):
        self.logger = logger
        self.every = every
        self.said: dict[str, tuple[float, int]] = {}  # cause -> (when last said, how many since)
        self.lock = threading.Lock()

    def warning(self, cause: str, message: str) -> None:
        now = time.monotonic()
        with self.lock:
            last, unsaid = self.said.get(cause, (-self.every, 0))
            if now - last < self.every:
                self.said[cause] = (last, unsaid + 1)
                return
            self.said[cause] = (now, 0)
        more = f" ({unsaid} more like it in the last {self.every:g} s)" if unsaid else ""
        self.logger.warning("%s%s", message, more)
