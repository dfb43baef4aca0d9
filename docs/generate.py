"""Writes the tables of the reference pages from the code: every config key, check, reason code, metric
family and Xid is documented where it is declared, and these pages only show it.

    python docs/generate.py           # rewrite the generated tables of docs/*.md
    python docs/generate.py --check   # exit 1, naming the pages, if a table is not what the code says

A page marks each generated table with `<!-- generated: WHAT -->` and `<!-- end generated -->`; the prose
around the tables is written by hand. WHAT is one of:

    config SECTION   every key of a configuration section (nodehealth/config.py parts(): each module's
                     DEFAULTS, and MEANINGS beside it), with its default and type
    checks           every check of nodehealth/registry.py: its SOURCE, SUBSYSTEM, DEBOUNCE and FINDS
    reasons          every reason code: each check's REASONS, then those of the hang detector, the pod
                     attribution, the engine (every check) and the pass (nodehealth)
    metrics FILE...  the metric families those source files export: name, type, labels and HELP text
    xids, sxids, xid-differences, sxid-differences, recovery-actions
                     the tables of checks/xid_catalog.py

Metric families are found two ways, because many are built at run time (the InfiniBand counters from a
table, a family per /proc/vmstat counter): the exposition in tests/golden/*.metrics.txt, which the tests
keep equal to what the exporter writes for each fixture machine and for the daemon's features; and the
calls in the source whose first argument is a family name (Metric(...), the NVML collector's family(...),
the publisher's _flag(...)), for the families no golden file shows (the daemon's, Kubernetes', Slurm's,
the controller's). A family is in the table of the file that builds it.

A script beside the pages rather than a module of the package: it writes files of the repository and reads
its tests' golden files, and no installed nodehealth needs it (`nodehealth check` never imports it).
"""
from __future__ import annotations

import argparse
import ast
import functools
import glob
import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PAGES = ("configuration.md", "checks.md", "metrics.md", "xid.md")
BLOCK = re.compile(r"(<!-- generated: (.+?) -->\n)(.*?)(<!-- end generated -->)", re.S)
FAMILY = re.compile(r"(?:nodehealth|process)_[a-z0-9_]+")  # ours, and the process_* every exporter has
# One row for a family per kernel counter: which exist depends on the kernel.
FOLDED = {re.compile(r"nodehealth_vmstat_([a-z0-9_]+)_total"): ("nodehealth_vmstat_<counter>_total", "<counter>")}
SOURCE_DIRS = ("nodehealth", "collectors", "checks")


class DocsError(Exception):
    """The code says something a page cannot show: a key without a meaning, a family in no table."""


def table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# -- configuration ---------------------------------------------------------------------------------

TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "list"), (dict, "map"))


def settings(defaults: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, default) of every setting: nested sections spelled out; an empty mapping is a
    setting of its own, a `map` whose keys are data (per-code overrides, per-port rates)."""
    out = []
    for key, value in defaults.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += settings(value, path + ".")
        else:
            out.append((path, value))
    return out


def config_rows(section: str) -> list[tuple[str, ...]]:
    from nodehealth import config

    rows, found = [], False
    for name, defaults, meanings in config.parts():
        if name.split(".")[0] != section:
            continue
        found = True
        keys = dict(settings(defaults))
        if set(meanings) != set(keys):
            missing, extra = sorted(set(keys) - set(meanings)), sorted(set(meanings) - set(keys))
            raise DocsError(f"{name}: keys without a meaning in MEANINGS: {missing}; meanings of no key: {extra}")
        for key, value in keys.items():
            kind = next(word for t, word in TYPES if isinstance(value, t))
            rows.append((f"`{name}.{key}`", f"`{json.dumps(value)}`", kind, meanings[key]))
    if not found:
        raise DocsError(f"no configuration section {section!r}")
    return rows


def config_table(section: str) -> str:
    return table(("key", "default", "type", "meaning"), config_rows(section))


# -- checks and reasons ----------------------------------------------------------------------------

def checks_table() -> str:
    from nodehealth import registry

    rows = []
    for c in registry.CHECKS:
        subsystem = f"by finding, else {c.SUBSYSTEM}" if hasattr(c, "finding_subsystem") else c.SUBSYSTEM
        rows.append((f"`{c.NAME}`", c.SOURCE, subsystem, "yes" if c.DEBOUNCE else "no", c.FINDS))
    return table(("check", "source", "subsystem", "debounced", "finds"), rows)


def reason_owners() -> list[tuple[str, dict]]:
    """(check name, its REASONS) of everything that makes findings, in the order of the table."""
    from nodehealth import engine, node_pass, registry
    from nodehealth.attribution import evidence
    from nodehealth.hang import detector

    return [*((c.NAME, c.REASONS) for c in registry.CHECKS), ("hang", detector.REASONS),
            (evidence.CHECK, evidence.REASONS), ("every check", engine.REASONS), ("nodehealth", node_pass.REASONS)]


def words(values: tuple, none: str = "per code") -> str:
    return " / ".join(v.value for v in values) or none


def reasons_table() -> str:
    merged: dict[tuple[str, Any], list[str]] = {}  # one row for a reason several checks share
    for check, reasons in reason_owners():
        for reason, about in reasons.items():
            merged.setdefault((reason, about), []).append(check)
    rows = [(", ".join(f"`{c}`" if c != "every check" else c for c in checks), f"`{reason}`",
             words(about.severities), words(about.actions), about.meaning)
            for (reason, about), checks in merged.items()]
    return table(("check", "reason", "severity", "action", "meaning"), rows)


# -- the Xid catalog -------------------------------------------------------------------------------

def xid_table(what: str) -> str:
    from nodehealth.checks import xid_catalog as catalog

    if what == "xids":
        return table(("Xid", "reason", "severity", "action", "NVIDIA's action", "meaning"), [
            (str(x.code), f"`{x.reason}`", x.severity.value, x.action.value, x.nvidia_action or "(none yet)",
             x.meaning) for x in sorted(catalog.XID_CATALOG.values(), key=lambda x: x.code)])
    if what == "sxids":
        return table(("SXid", "reason", "severity", "action", "the guide's table", "meaning"), [
            (str(x.code), f"`{x.reason}`", x.severity.value, x.action.value, x.fatality or "(not in the guide)",
             x.meaning) for x in sorted(catalog.SXID_CATALOG.values(), key=lambda x: x.code)])
    if what in ("xid-differences", "sxid-differences"):
        sxid = what.startswith("sxid")
        differences = catalog.DELIBERATE_SXID_DIFFERENCES if sxid else catalog.DELIBERATE_XID_DIFFERENCES
        return table(("SXid" if sxid else "Xid", "why nodehealth rates it otherwise"), [
            (str(code), f"{severity.value}, {action.value}: {why}")
            for code, (severity, action, why) in sorted(differences.items())])
    if what == "recovery-actions":
        return table(("value", "NVML's name", "severity", "action", "what to do"), [
            (f"0x{r.value:x}", f"`{r.name}`", r.severity.value, r.action.value, r.advice)
            for r in sorted(catalog.RECOVERY_ACTIONS.values(), key=lambda r: r.value)])
    raise DocsError(f"no Xid table {what!r}")


# -- metric families -------------------------------------------------------------------------------

@dataclass
class Family:
    name: str
    kind: str | None = None
    labels: tuple[str, ...] | None = None
    help: str | None = None
    files: list[str] = field(default_factory=list)  # the source files that build it


def golden_families() -> dict[str, Family]:
    """The families in the golden exposition files, with the labels their samples carry."""
    out: dict[str, Family] = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "golden", "*.metrics.txt"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                meta = re.match(r"# (HELP|TYPE) (\S+) (.*)", line.rstrip("\n"))
                if meta:
                    family = out.setdefault(meta.group(2), Family(meta.group(2)))
                    if meta.group(1) == "TYPE":
                        family.kind = meta.group(3)
                    else:
                        family.help = meta.group(3).replace("\\n", "\n").replace("\\\\", "\\")
                    continue
                sample = re.match(r"([a-z0-9_]+)(?:\{(.*)\})? ", line)
                if sample:
                    name = re.sub(r"_(bucket|count|sum)$", "", sample.group(1))
                    family = out.get(sample.group(1)) or out.get(name)
                    if family is not None and family.labels is None:
                        labels = re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', sample.group(2) or "")
                        family.labels = tuple(n for n in labels if n != "le")
    return out


class _Scope:
    """The names a family's arguments may use, each bound to the expression that gives it and the scope
    that expression is read in: a module's and a function's simple assignments, a helper's parameters,
    the items of a loop over a constant table (collectors/infiniband.py's counters)."""

    def __init__(self, parent: _Scope | None = None, nodes: list[ast.AST] = ()):
        self.parent = parent
        self.names: dict[str, tuple[ast.expr, _Scope] | None] = {}
        for node in nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):  # assigned twice: no constant
                        self.names[target.id] = None if target.id in self.names else (node.value, self)

    def lookup(self, name: str) -> tuple[ast.expr, _Scope] | None:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.names:
                return scope.names[name]
            scope = scope.parent
        return None

    def bind(self, target: ast.expr, node: ast.expr, scope: _Scope) -> None:
        """Bind a loop's target (a name, or a tuple of them) to one item of what it loops over."""
        while isinstance(node, ast.Name) and scope.lookup(node.id) is not None:
            node, scope = scope.lookup(node.id)
        if isinstance(target, ast.Name):
            self.names[target.id] = (node, scope)
        elif isinstance(target, ast.Tuple) and isinstance(node, ast.Tuple) and len(node.elts) == len(target.elts):
            for t, n in zip(target.elts, node.elts):
                self.bind(t, n, scope)

    def items(self, node: ast.expr) -> list[tuple[ast.expr, _Scope]] | None:
        """The items of the tuple or list `node` names, each with the scope to read it in."""
        scope: _Scope = self
        while isinstance(node, ast.Name) and scope.lookup(node.id) is not None:
            node, scope = scope.lookup(node.id)
        return [(e, scope) for e in node.elts] if isinstance(node, (ast.Tuple, ast.List)) else None

    def value(self, node: ast.expr | None) -> Any:
        """The node's value when it is a constant here, else None."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List)):
            items = [self.value(e) for e in node.elts]
            return None if any(i is None for i in items) else tuple(items)
        if isinstance(node, ast.JoinedStr):
            parts = [self.value(v.value) if isinstance(v, ast.FormattedValue) else v.value for v in node.values]
            return None if any(p is None for p in parts) else "".join(map(str, parts))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.value(node.left), self.value(node.right)
            return left + right if left is not None and right is not None and type(left) is type(right) else None
        if isinstance(node, ast.Name):
            found = self.lookup(node.id)
            return None if found is None else found[1].value(found[0])
        return None


def _metric_args(call: ast.Call) -> dict[str, ast.expr]:
    """Metric(name, help, kind="gauge", labels=()) and Metric.one(name, help, value, kind="gauge")."""
    one = isinstance(call.func, ast.Attribute) and call.func.attr == "one"
    positions = ("name", "help", "value", "kind") if one else ("name", "help", "kind", "labels")
    args = dict(zip(positions, call.args))
    args.update({k.arg: k.value for k in call.keywords if k.arg})
    return args


def _is_metric(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id == "Metric") or (
        isinstance(func, ast.Attribute) and func.attr == "one" and getattr(func.value, "id", "") == "Metric")


def _loops(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[tuple[ast.expr, ast.expr]]:
    """(target, iterable) of the loops and comprehensions around `node` in its function, outermost first."""
    out = []
    child, parent = node, parents.get(node)
    while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.Module)):
        if isinstance(parent, ast.For) and child in parent.body:
            out.append((parent.target, parent.iter))
        elif isinstance(parent, (ast.ListComp, ast.GeneratorExp, ast.SetComp)) and child is parent.elt:
            out += [(g.target, g.iter) for g in parent.generators]
        child, parent = parent, parents.get(parent)
    return out[::-1]


def _scopes(node: ast.AST, scope: _Scope, parents: dict[ast.AST, ast.AST]) -> list[_Scope]:
    """One scope per item of each constant table a loop around `node` goes over."""
    scopes = [scope]
    for target, iterable in _loops(node, parents):
        expanded = []
        for s in scopes:
            items = s.items(iterable)
            for item, where in items or [(None, None)]:
                inner = _Scope(s)
                if item is not None:
                    inner.bind(target, item, where)
                expanded.append(inner)
        scopes = expanded
    return scopes


def source_families() -> dict[str, Family]:
    """The families the source builds with a constant name: directly, through a helper of the same
    module whose Metric(...) takes its name from the helper's arguments, or in a loop over a table."""
    out: dict[str, Family] = {}

    def add(scope: _Scope, args: dict[str, ast.expr], path: str) -> None:
        name = scope.value(args.get("name"))
        if not isinstance(name, str) or not FAMILY.fullmatch(name):
            return
        family = out.setdefault(name, Family(name))
        family.help = family.help or scope.value(args.get("help"))
        family.kind = family.kind or scope.value(args.get("kind")) or ("counter" if name.endswith("_total")
                                                                        else "gauge")
        if family.labels is None:
            family.labels = scope.value(args["labels"]) if "labels" in args else ()
        if path not in family.files:
            family.files.append(path)

    for path, text, module in _sources():
        if "Metric" in text:
            _module_families(path, module, add)
    return out


def _module_families(path: str, module: ast.Module, add: Callable[[_Scope, dict[str, ast.expr], str], None]
                     ) -> None:
    """Every Metric(...) of one module, and every call of a helper of the module that builds one."""
    parents = {child: node for node in ast.walk(module) for child in ast.iter_child_nodes(node)}
    top = _Scope(None, module.body)
    functions: dict[ast.FunctionDef, _Scope] = {}

    def scope_of(function: ast.FunctionDef) -> _Scope:
        """A function's own scope: its assignments and its parameters' defaults."""
        if function not in functions:
            scope = functions[function] = _Scope(top, list(ast.walk(function))[1:])
            args = function.args.args
            for arg, default in zip(args[len(args) - len(function.args.defaults):], function.args.defaults):
                scope.names[arg.arg] = (default, top)
        return functions[function]

    def enclosing(node: ast.AST) -> _Scope:
        while node in parents and not isinstance(node, ast.FunctionDef):
            node = parents[node]
        return scope_of(node) if isinstance(node, ast.FunctionDef) else top

    helpers: dict[str, tuple[ast.FunctionDef, ast.Call]] = {}  # builders of a family named by a parameter
    for node in ast.walk(module):
        if isinstance(node, ast.Call) and _is_metric(node) and isinstance(_metric_args(node).get("name"), ast.Name):
            function = node
            while function in parents and not isinstance(function, ast.FunctionDef):
                function = parents[function]
            if isinstance(function, ast.FunctionDef) and \
                    _metric_args(node)["name"].id in {a.arg for a in function.args.args}:
                helpers[function.name] = (function, node)

    for node in ast.walk(module):
        if not isinstance(node, ast.Call):
            continue
        for scope in _scopes(node, enclosing(node), parents):
            if _is_metric(node):
                add(scope, _metric_args(node), path)
            elif isinstance(node.func, ast.Name) and node.func.id in helpers:
                helper, call = helpers[node.func.id]
                inner = _Scope(scope_of(helper))
                for param, arg in zip((a.arg for a in helper.args.args), node.args):
                    inner.names[param] = (arg, scope)
                for keyword in node.keywords:
                    if keyword.arg:
                        inner.names[keyword.arg] = (keyword.value, scope)
                add(inner, _metric_args(call), path)


@functools.cache
def _sources() -> tuple[tuple[str, str, ast.Module], ...]:
    """(path, text, tree) of every source file, read once."""
    out = []
    for package in SOURCE_DIRS:
        for path in sorted(glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True)):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            out.append((os.path.relpath(path, ROOT), text, ast.parse(text)))
    return tuple(out)


def _names_in_files() -> list[tuple[re.Pattern, str]]:
    """(pattern, file) of every family name the source spells: as a string (in a table the file loops over)
    or as an f-string (`nodehealth_vmstat_{name}_total`)."""
    out = []
    for path, text, module in _sources():
        if "nodehealth_" not in text and "process_" not in text:
            continue
        for node in ast.walk(module):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and FAMILY.fullmatch(node.value):
                out.append((re.compile(re.escape(node.value)), path))
            elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                    and str(node.values[0].value).startswith("nodehealth_"):
                pattern = "".join(re.escape(v.value) if isinstance(v, ast.Constant) else "[a-z0-9_]+"
                                  for v in node.values)
                out.append((re.compile(pattern), path))
    return out


@functools.cache
def families() -> dict[str, Family]:
    """Every family, each with its type, labels, HELP text and the files that build it."""
    found = source_families()
    spelled = _names_in_files()
    for name, golden in golden_families().items():
        family = found.setdefault(name, Family(name))
        family.kind, family.help = golden.kind or family.kind, golden.help or family.help
        family.labels = golden.labels if golden.labels is not None else family.labels
        if not family.files:
            family.files = sorted({path for pattern, path in spelled if pattern.fullmatch(name)})
    for pattern, (row, placeholder) in FOLDED.items():
        members = [f for f in found.values() if pattern.fullmatch(f.name)]
        for f in members:
            del found[f.name]
        if members:
            first = members[0]
            counter = pattern.fullmatch(first.name).group(1)
            found[row] = Family(row, first.kind, first.labels, (first.help or "").replace(counter, placeholder),
                                first.files)
    unknown = sorted(f"{f.name} ({', '.join(f.files) or 'no file'})" for f in found.values()
                     if not f.files or f.help is None or f.labels is None)
    if unknown:
        raise DocsError("families whose file, HELP text or labels the source does not say: " + ", ".join(unknown))
    return found


def metrics_table(files: list[str], claimed: dict[str, str]) -> str:
    """The families built in `files` that no earlier table of the page holds (`claimed`: family -> file)."""
    rows = []
    built = {name: family for name, family in families().items() if set(family.files) & set(files)}
    if not built:
        raise DocsError(f"no family is built in {', '.join(files)}")
    for name, family in sorted(built.items()):
        if name not in claimed:
            claimed[name] = files[0]
            labels = ", ".join(f"`{n}`" for n in family.labels) or "(none)"
            rows.append((f"`{name}`", family.kind or "gauge", labels, family.help or ""))
    return table(("family", "type", "labels", "meaning"), rows)


# -- the pages -------------------------------------------------------------------------------------

def render(page: str, text: str) -> str:
    """`text` with every generated table of `page` written afresh."""
    claimed: dict[str, str] = {}
    renderers: dict[str, Callable[[list[str]], str]] = {
        "config": lambda args: config_table(args[0]),
        "checks": lambda args: checks_table(),
        "reasons": lambda args: reasons_table(),
        "metrics": lambda args: metrics_table(args, claimed),
        **{what: (lambda args, what=what: xid_table(what))
           for what in ("xids", "sxids", "xid-differences", "sxid-differences", "recovery-actions")},
    }

    def one(match: re.Match) -> str:
        what, *args = match.group(2).split()
        if what not in renderers:
            raise DocsError(f"{page}: no generated table {what!r}")
        return match.group(1) + renderers[what](args) + match.group(4)

    out = BLOCK.sub(one, text)
    if page == "metrics.md":
        left = sorted(n for n, f in families().items() if n not in claimed)
        if left:
            raise DocsError(f"metrics.md: families in no table: {', '.join(left)} (add their file to a table)")
    return out


def stale_pages() -> list[str]:
    """The pages whose generated tables differ from what the code says now."""
    stale = []
    for page in PAGES:
        path = os.path.join(HERE, page)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if render(page, text) != text:
            stale.append(page)
    return stale


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a page is not what this script writes")
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    try:
        if args.check:
            stale = stale_pages()
            for page in stale:
                print(f"docs/{page} is out of date: run python docs/generate.py", file=sys.stderr)
            return 1 if stale else 0
        for page in PAGES:
            path = os.path.join(HERE, page)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            new = render(page, text)
            if new != text:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
                print(f"wrote docs/{page}")
    except DocsError as e:
        print(f"docs/generate.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
