"""promtool checks and unit-tests the shipped alert rules."""
from __future__ import annotations

import os
import subprocess

from conftest import HERE, require_tool

RULES_DIR = os.path.join(os.path.dirname(HERE), "deploy", "prometheus")


def test_rules_are_valid_and_their_unit_tests_pass():
    promtool = require_tool("promtool")
    check = subprocess.run([promtool, "check", "rules", "nodehealth-rules.yaml"], cwd=RULES_DIR,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", "nodehealth-rules.test.yaml"], cwd=RULES_DIR,
                          capture_output=True, text=True)
    assert test.returncode == 0, test.stdout + test.stderr
