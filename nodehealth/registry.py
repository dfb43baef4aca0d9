"""The one explicit list of collectors and checks. Read it to see everything nodehealth does."""
from __future__ import annotations

from nodehealth.checks import modules as modules_check
from nodehealth.collectors import modules

COLLECTORS = (
    modules,
)

CHECKS = (
    modules_check,
)
