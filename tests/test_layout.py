"""The rules of the house that code can check (docs/architecture.md): no import circle among nodehealth's
modules, lazy imports included; no long module without a reason; collectors and checks keep their
contracts; `check` and `rdma-bw` import only what they use."""
from __future__ import annotations

import ast
import os
import subprocess
import sys

from nodehealth import registry
from nodehealth.checks import Check
from nodehealth.collectors import Collector
from nodehealth.kube.taints import SUBSYSTEMS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where each package's files are (pyproject.toml maps collectors/ and checks/ into nodehealth).
FOLDERS = {"nodehealth": "nodehealth", "nodehealth.collectors": "collectors", "nodehealth.checks": "checks"}
GENERATED = ("podresources_pb2.py", "podresources_pb2_grpc.py")
LONG, TOO_LONG = 500, 600
MARKER = "Long on purpose:"


def modules() -> dict[str, str]:
    """Every module of the distribution: dotted name -> file."""
    out = {}
    for package, folder in FOLDERS.items():
        base = os.path.join(ROOT, folder)
        for dirpath, dirs, files in os.walk(base):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not (package == "nodehealth" and
                                                                      d in ("collectors", "checks"))]
            for name in files:
                if name.endswith(".py"):
                    parts = os.path.relpath(os.path.join(dirpath, name), base)[:-3].split(os.sep)
                    if parts[-1] == "__init__":
                        parts = parts[:-1]
                    out[".".join([package, *parts])] = os.path.join(dirpath, name)
    return out


def imports(known: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports anywhere: at the top, in a function, under TYPE_CHECKING."""
    graph = {}
    for module, path in known.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in known}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if f"{node.module}.{a.name}" in known:  # a submodule
                        edges.add(f"{node.module}.{a.name}")
                    elif node.module in known:  # a name in a module
                        edges.add(node.module)
        graph[module] = edges - {module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_circle_finder_finds_a_circle_through_a_lazy_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []
    known = modules()
    graph = imports(known)
    assert "nodehealth.daemon" in graph["nodehealth.cli"]  # imported inside cmd_daemon: counted


def test_no_import_circle_among_nodehealth_modules():
    assert circles(imports(modules())) == []


def test_no_module_is_long_without_saying_why():
    """Over ~500 lines a module says why near its top (a line `Long on purpose: ...`); over 600 it must."""
    silent = []
    for module, path in modules().items():
        if os.path.basename(path) in GENERATED:
            continue
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        if len(lines) > TOO_LONG and not any(MARKER in line for line in lines[:20]):
            silent.append(f"{module}: {len(lines)} lines")
    assert silent == []


def test_collectors_and_checks_keep_their_contracts():
    assert [m.NAME for m in registry.COLLECTORS if not isinstance(m, Collector)] == []
    assert [c.NAME for c in registry.CHECKS if not isinstance(c, Check)] == []
    assert {c.NAME: c.SUBSYSTEM for c in registry.CHECKS if c.SUBSYSTEM not in SUBSYSTEMS} == {}
    assert len({c.NAME for c in registry.CHECKS}) == len(registry.CHECKS)


def loaded(argv: list[str]) -> set[str]:
    """The nodehealth modules a command has loaded when it is about to run (its parser built, its
    command chosen), in a fresh interpreter."""
    code = ("import sys\nfrom nodehealth import cli\n"
            f"args = cli.parser().parse_args({argv!r})\n"
            "print(' '.join(m for m in sys.modules if m.startswith('nodehealth')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_rdma_bw_and_check_load_only_what_they_use():
    # Building the parser loads each feature's argparse module, and nothing of the pass.
    assert not loaded(["rdma-bw", "127.0.0.1"]) & {"nodehealth.registry", "nodehealth.engine", "nodehealth.rdma.bw",
                                                   "nodehealth.daemon", "nodehealth.node_pass"}
    # The configuration loads the registry and the features' defaults only when asked for them.
    code = ("import sys, nodehealth.config, nodehealth.pingmesh.analysis\n"
            "print(' '.join(m for m in sys.modules if m.startswith('nodehealth')))\n")
    out = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert not out & {"nodehealth.registry", "nodehealth.checks", "nodehealth.collectors"}


def test_the_daemon_and_its_probe_agent_never_load_numpy():
    """numpy (the analysis's adding-up, ~20 MiB) is the controller's and `pingmesh analyze`'s, not every node's."""
    code = ("import sys, nodehealth.daemon, nodehealth.pingmesh.mesh, nodehealth.pingmesh.packed\n"
            "print('numpy' in sys.modules, 'nodehealth.pingmesh.analysis' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_every_package_is_in_the_distribution():
    """A package left out of pyproject's list imports in a checkout and is missing from an installed
    wheel (nodehealth.tls was, and every command of the image failed)."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    found = {"nodehealth.collectors", "nodehealth.checks"}
    for folder, _, files in os.walk(os.path.join(ROOT, "nodehealth")):
        if "__init__.py" in files:
            found.add(os.path.relpath(folder, ROOT).replace(os.sep, "."))
    assert listed == found
