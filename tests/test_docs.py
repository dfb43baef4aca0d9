"""The docs hold together: every relative link resolves, and the references are what the code says.

The configuration, checks, metrics and Xid references are written from the code by docs/generate.py: the
drift test regenerates them in memory and compares; the reason tables are tied to the findings the code
makes (its Finding(...) calls and the golden reports).
"""
from __future__ import annotations

import ast
import functools
import glob
import json
import os
import re

import pytest
from conftest import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
# Pages other branches are writing right now; a link to one is accepted while it does not exist yet.
PENDING: dict[str, str] = {}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def code_blocks(text: str) -> list[tuple[str, str]]:
    """The fenced code blocks of a Markdown text: (language, body), in order."""
    blocks, lang, body = [], None, []
    for line in text.splitlines():
        fence = line.strip()
        if fence.startswith("```"):
            if lang is None:
                lang, body = fence[3:].strip(), []
            else:
                blocks.append((lang, "\n".join(body) + "\n"))
                lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans, where links and headings are."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def anchors(text: str) -> set[str]:
    """GitHub's anchors for the headings: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        heading = re.match(r"#{1,6} (.*)", line)
        if fenced or not heading:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def links(page: str) -> list[str]:
    return [t for t in LINK.findall(prose(read(page))) if not SCHEME.match(t)]


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_points_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(os.path.join(ROOT, resolved)):
            if resolved not in PENDING:
                broken.append(f"{target}: no file {resolved}")
            continue
        if anchor and resolved.endswith(".md") and anchor not in anchors(read(resolved)):
            broken.append(f"{target}: no heading #{anchor} in {resolved}")
    assert broken == []


def test_the_link_checker_sees_a_broken_link_and_a_broken_anchor():
    text = "[a](docs/nowhere.md) [b](README.md#no-such-heading) `[c](skipped.md)` [d](https://example.com)"
    found = LINK.findall(prose(text))
    assert found == ["docs/nowhere.md", "README.md#no-such-heading", "https://example.com"]
    assert "no-such-heading" not in anchors(read("README.md"))
    assert anchors("## `nodehealth check`\n## Checks\n## Checks\n```\n# not a heading\n```") == {
        "nodehealth-check", "checks", "checks-1"}


def test_pending_pages_are_still_pending():
    """A page that now exists is checked like any other: take it off the list."""
    assert [p for p in PENDING if os.path.exists(os.path.join(ROOT, p))] == []


@functools.cache
def generator():
    """docs/generate.py, a script beside the pages it writes rather than a module of the package."""
    return load_script(os.path.join("docs", "generate.py"), "docs_generate")


@pytest.mark.parametrize("page", ["configuration.md", "checks.md", "metrics.md", "xid.md"])
def test_the_generated_references_are_what_the_code_says(page):
    """Regenerated in memory: a key, reason, family or Xid added, changed or removed in the code without
    `python docs/generate.py` fails here."""
    text = read(f"docs/{page}")
    assert "<!-- generated: " in text
    assert generator().render(page, text) == text, f"docs/{page} is out of date: run python docs/generate.py"


def test_the_drift_test_sees_a_changed_default_a_reason_and_a_family(monkeypatch):
    from nodehealth.checks import kernel, memory

    gen = generator()
    before = {page: gen.render(page, read(f"docs/{page}")) for page in ("configuration.md", "checks.md")}
    monkeypatch.setitem(kernel.DEFAULTS, "hung_task_repeat", 4)
    monkeypatch.setitem(memory.REASONS, "MemoryFragmented", memory.REASONS["ZoneLowOnMemory"])
    assert gen.render("configuration.md", before["configuration.md"]) != before["configuration.md"]
    assert gen.render("checks.md", before["checks.md"]) != before["checks.md"]
    monkeypatch.setitem(kernel.DEFAULTS, "new_key", 1)  # a key without its meaning stops the generator
    with pytest.raises(gen.DocsError, match="checks.kernel: keys without a meaning in MEANINGS: \\['new_key'\\]"):
        gen.render("configuration.md", before["configuration.md"])
    table = "<!-- generated: metrics collectors/edac.py -->\n<!-- end generated -->\n"
    assert "`nodehealth_edac_errors_total` | counter |" in gen.render("other.md", table)
    with pytest.raises(gen.DocsError, match="families in no table: .*nodehealth_edac_errors_total"):
        gen.render("metrics.md", read("docs/metrics.md").replace("metrics collectors/edac.py",
                                                                 "metrics collectors/mounts.py"))


def test_every_setting_has_its_meaning_beside_its_default():
    from nodehealth import config

    for name, defaults, meanings in config.parts():
        keys = {key for key, _ in generator().settings(defaults)}
        assert set(meanings) == keys, name
        assert all(isinstance(m, str) and m and "|" not in m for m in meanings.values()), name


def test_every_configuration_section_has_its_table():
    from nodehealth import config

    page = read("docs/configuration.md")
    sections = {name.split(".")[0] for name, _, _ in config.parts()}
    assert sorted(s for s in sections if f"<!-- generated: config {s} -->" not in page) == []


@functools.cache
def source_trees() -> tuple[tuple[str, ast.AST], ...]:
    """Every module of the source, parsed once for the tests that read it."""
    return tuple((path, tree) for path, _, tree in generator()._sources())


def golden(pattern: str) -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, "tests", "golden", pattern)))


def documented() -> dict[str, dict[str, object]]:
    """check name -> its reasons (reason -> Reason), from every table docs/checks.md is written from."""
    out: dict[str, dict[str, object]] = {}
    for check, reasons in generator().reason_owners():
        out.setdefault(check, {}).update(reasons)
    return out


def constants(tree: ast.AST) -> dict[str, ast.expr]:
    """A module's top-level NAME = value (and A, B = x, y) assignments."""
    out = {}
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    out.update({t.id: v for t, v in zip(target.elts, node.value.elts) if isinstance(t, ast.Name)})
    return out


def literal(node: ast.expr | None, names: dict[str, ast.expr], kind: str) -> set[str] | None:
    """What `node` can be: a string constant, or `Severity.X` / `Action.X` values (both branches of an
    `a if c else b`), through the module's constants; None where the code computes it."""
    from nodehealth.model import Action, Severity

    if isinstance(node, ast.Name) and node.id in names:
        return literal(names[node.id], names, kind)
    if isinstance(node, ast.IfExp):
        a, b = literal(node.body, names, kind), literal(node.orelse, names, kind)
        return None if a is None or b is None else a | b
    if kind == "str" and isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == kind:
        return {{"Severity": Severity, "Action": Action}[kind][node.attr].value}
    return None


def made_findings() -> list[tuple[str, str | None, str, set[str] | None, set[str] | None]]:
    """(file:line, check, reason, severities, actions) of every Finding(...) and Rating(...) in the source
    whose reason is a constant; check None where a helper outside a check takes it as an argument (then
    any check's table will do)."""
    out = []
    for path, tree in source_trees():
        names = constants(tree)
        for node in ast.walk(tree):
            name = getattr(node.func, "id", getattr(node.func, "attr", "")) if isinstance(node, ast.Call) else ""
            if name not in ("Finding", "Rating"):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            if name == "Finding":
                check, severity, reason = (node.args + [None] * 3)[:3]
                severities, actions = [severity], [kw.get("action", ast.Attribute(ast.Name("Action"), "NONE"))]
            else:
                reason, severity, action = (node.args + [None] * 3)[:3]
                check, severities = None, [severity, kw.get("repeated")]
                actions = [action, kw.get("repeated_action")]
            reasons = literal(reason, names, "str")
            if reasons is None:
                continue
            checks = literal(check, names, "str") if check is not None else None
            if checks is None and "NAME" in names:  # a check module's Rating, or its helper's Finding
                checks = literal(names["NAME"], names, "str")
            if isinstance(check, ast.Attribute) and check.attr == "NAME" and path == "nodehealth/engine.py":
                checks = {"every check"}
            found = [literal(s, names, "Severity") for s in severities if s is not None]
            done = [literal(a, names, "Action") for a in actions if a is not None]
            for reason in reasons:
                for one in sorted(checks) if checks else [None]:
                    out.append((f"{path}:{node.lineno}", one, reason,
                                None if None in found else set().union(*found),
                                None if None in done else set().union(*done)))
    return out


def test_the_reason_tables_name_every_finding_the_code_makes_with_its_severity_and_action():
    tables = documented()
    everywhere: dict[str, list[object]] = {}
    for reasons in tables.values():
        for reason, about in reasons.items():
            everywhere.setdefault(reason, []).append(about)
    made = made_findings()
    assert len(made) > 80  # the walk sees the checks' findings
    wrong = []
    for where, check, reason, severities, actions in made:
        abouts = [tables[check][reason]] if check in tables and reason in tables[check] else (
            everywhere.get(reason, []) if check is None else [])
        if not abouts:
            wrong.append(f"{where}: {reason} of {check or 'a check'} is in no REASONS table")
            continue
        if severities is not None and not any(severities <= {s.value for s in a.severities} for a in abouts):
            wrong.append(f"{where}: {reason} can be {sorted(severities)}, its table says otherwise")
        if actions is not None and not any(actions <= {x.value for x in a.actions} for a in abouts):
            wrong.append(f"{where}: {reason} can ask for {sorted(actions)}, its table says otherwise")
    assert wrong == []


def test_the_reason_tables_hold_every_finding_of_the_golden_reports():
    from nodehealth.checks import xid_catalog

    tables = documented()
    catalog = {i.reason: i for i in [*xid_catalog.XID_CATALOG.values(), *xid_catalog.SXID_CATALOG.values()]}
    wrong, seen = [], 0
    for path in golden("*.check.json"):
        with open(path, encoding="utf-8") as f:
            findings = json.load(f)["findings"]
        for f in findings:
            seen += 1
            about = catalog.get(f["reason"]) if f["check"] == "xid" else None
            if about is not None:
                if (f["severity"], f["action"]) != (about.severity.value, about.action.value):
                    wrong.append(f"{os.path.basename(path)}: {f['reason']} is not as the catalog rates it")
                continue
            about = tables.get(f["check"], {}).get(f["reason"]) or tables["every check"].get(f["reason"])
            if about is None:
                wrong.append(f"{os.path.basename(path)}: {f['check']} {f['reason']} is in no REASONS table")
            elif f["severity"] not in {s.value for s in about.severities} or \
                    f["action"] not in {a.value for a in about.actions}:
                wrong.append(f"{os.path.basename(path)}: {f['reason']} {f['severity']}/{f['action']} is not in its "
                             "table")
    assert seen > 20 and wrong == []


def test_every_documented_reason_is_one_the_code_makes():
    """No stale row: each reason of a table is spelled somewhere in the source, outside the tables."""
    spelled = set()
    for _, tree in source_trees():
        tables = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                  and any(getattr(t, "id", "") == "REASONS" for t in n.targets)}
        skip = {id(k) for n in ast.walk(tree) if id(n) in tables for k in n.keys}
        spelled |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    and id(n) not in skip}
    stale = sorted(r for reasons in documented().values() for r in reasons if "<" not in r and r not in spelled)
    assert stale == []
