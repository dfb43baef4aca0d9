"""The docs hold together: every relative link resolves, and the references name what the code has.

The coverage tests below (config keys, metric families, reason codes) keep the hand-written references
honest until they are generated from the code; the generator's drift test replaces them.
"""
from __future__ import annotations

import ast
import functools
import glob
import json
import os
import re

import pytest

from nodehealth import config

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


def rows(page: str, row: str) -> set[str]:
    """The first group of `row` in every table row of a page that matches it."""
    return {m.group(1) for m in re.finditer(row, read(page), re.M)}


def config_leaves(tree: dict, prefix: str) -> list[tuple[str, object]]:
    """Every documented key: nested settings spelled out; a collector or check with none has no row."""
    out = []
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            out += config_leaves(value, path)
        elif not (isinstance(value, dict) and prefix in ("collectors", "checks")):
            out.append((path, value))
    return out


def test_every_config_key_is_documented_with_its_default():
    rows = {}
    for line in read("docs/configuration.md").splitlines():
        row = re.match(r"\| `([a-z0-9_.]+)` \| `(.*?)` \|", line)
        if row:
            rows[row.group(1)] = row.group(2)
    defaults = dict(config_leaves(config.defaults(), ""))
    assert {k: json.dumps(v) for k, v in defaults.items() if rows.get(k) != json.dumps(v)} == {}
    assert set(rows) - set(defaults) == set()


@functools.cache
def source_trees() -> tuple[ast.AST, ...]:
    """Every module of the source, parsed once for the tests that read it."""
    trees = []
    for package in ("nodehealth", "collectors", "checks"):
        for path in glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True):
            with open(path, encoding="utf-8") as f:
                trees.append(ast.parse(f.read()))
    return tuple(trees)


def golden(pattern: str) -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, "tests", "golden", pattern)))


def test_every_metric_family_is_documented():
    family = re.compile(r"nodehealth_[a-z0-9_]+")
    names = set()
    for tree in source_trees():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str) and family.fullmatch(node.args[0].value)):
                names.add(node.args[0].value)
    for path in golden("*.metrics.txt"):
        with open(path, encoding="utf-8") as f:
            names |= set(re.findall(r"^# TYPE (\S+)", f.read(), re.M))
    documented = rows("docs/metrics.md",
                      r"^\| `((?:nodehealth|process)_[a-z0-9_<>]+)` \| (?:gauge|counter|histogram) \|")
    vmstat = {n for n in names if n.startswith("nodehealth_vmstat_")}  # one row: nodehealth_vmstat_<counter>_total
    assert vmstat and "nodehealth_vmstat_<counter>_total" in documented
    assert sorted(names - vmstat - documented) == []


def test_every_reason_code_is_documented():
    from nodehealth.checks import xid_catalog

    reasons = set()
    for tree in source_trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            at = {"Finding": 2, "Rating": 0}.get(name)
            if at is not None and len(node.args) > at and isinstance(node.args[at], ast.Constant):
                reasons.add(node.args[at].value)
    for path in golden("*.check.json"):
        with open(path, encoding="utf-8") as f:
            reasons |= {finding["reason"] for finding in json.load(f)["findings"]}
    catalog = {i.reason for i in xid_catalog.XID_CATALOG.values()} | {
        i.reason for i in xid_catalog.SXID_CATALOG.values()}
    assert sorted(reasons - catalog - rows("docs/checks.md", r"^\| [^|]+ \| `([A-Za-z0-9<>]+)` \|")) == []
    assert sorted(catalog - rows("docs/xid.md", r"^\| [0-9]+ \| `([A-Za-z0-9]+)` \|")) == []
