"""Packaging: the licence pyproject names is the one shipped."""
from __future__ import annotations

import os
import re

from conftest import HERE

ROOT = os.path.dirname(HERE)


def test_license_file_is_the_apache_2_0_text_pyproject_names():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        assert re.search(r'^license = \{ text = "Apache-2.0" \}$', f.read(), re.M)
    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as f:
        text = f.read()
    assert text.lstrip().startswith("Apache License\n")
    assert "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
