"""The `silences` section: how long and how many silences an operator may set."""
from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    # The longest a silence may last. A forgotten silence hides a fault for good, so every silence ends;
    # a repair that waits for parts (an RMA) takes days to a few weeks: 30 days covers it, and a longer one
    # is set again on purpose.
    "max_seconds": 30 * 86400.0,
    # At most this many silences in the file and in the Node annotation each: every finding of every
    # pass is matched against them, and an annotation is read from the API server.
    "max_silences": 64,
}
MEANINGS = {
    "max_seconds": "the longest a silence may last (30 days): every silence ends, and one set further ahead is "
                   "refused",
    "max_silences": "silences used from the file and from the annotation each; those past it are refused and "
                    "counted",
}
