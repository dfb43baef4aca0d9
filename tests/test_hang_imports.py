"""The hang package's modules import each other without a circle: lazy imports (inside a function)
count too, since the circle is in the design whether Python notices it at start-up or not."""
from __future__ import annotations

import ast
import os

import nodehealth.hang

PACKAGE = os.path.dirname(nodehealth.hang.__file__)


def hang_imports(path: str) -> set[str]:
    """The nodehealth.hang modules a file imports anywhere in it, by their short names."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "nodehealth.hang":
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nodehealth.hang."):
            out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[2] for a in node.names if a.name.startswith("nodehealth.hang.")}
    return out


def test_no_import_circle_in_the_hang_package():
    modules = {name[:-3] for name in os.listdir(PACKAGE) if name.endswith(".py") and name != "__init__.py"}
    graph = {m: hang_imports(os.path.join(PACKAGE, f"{m}.py")) & modules for m in modules}

    def circle_from(start: str, path: list[str]) -> list[str] | None:
        for nxt in sorted(graph[path[-1]]):
            if nxt == start:
                return path + [nxt]
            if nxt not in path:
                found = circle_from(start, path + [nxt])
                if found:
                    return found
        return None

    circles = [c for m in sorted(modules) if (c := circle_from(m, [m]))]
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)
