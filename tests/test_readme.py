"""The README and docs/ say what the code does: the test command, each command's synopsis, the extras."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest
from test_docs import code_blocks, read

from nodehealth import __version__, cli


def readme_test_command() -> str:
    return re.search(r"Test it .*?```sh\n(.*?)\n```", read("README.md"), re.S).group(1)


def test_the_test_command_works_as_root_and_not_and_ci_runs_it():
    command = readme_test_command()
    assert not command.startswith("sudo") and "id -u" in command  # a root machine may have no sudo
    ci = read(".ci/run")
    for step in ("apt-get install -y", "python3 -m venv .venv", ". .venv/bin/activate",
                 "pip install -q -e '.[test]'", "python -m pytest"):
        assert step.replace(" -q", "") in command and step in ci, step
    assert 'sudo="sudo"' in ci and '[ "$(id -u)" -eq 0 ]' in ci


def test_the_test_command_installs_every_debian_package_ci_installs():
    """A fresh machine that runs the README's command has every package .ci/run would add."""
    command = readme_test_command().split()
    ci_packages = {p for group in re.findall(r"need\+=\(([^)]*)\)", read(".ci/run")) for p in group.split()}
    assert ci_packages and sorted(ci_packages - set(command)) == []


# Where each command's synopsis lives: the page that documents the command.
SYNOPSES = {
    "check": "docs/commands.md",
    "daemon": "docs/commands.md",
    "clear": "docs/commands.md",
    "config defaults": "docs/commands.md",
    "breaker reset": "docs/commands.md",
    "silence add": "docs/commands.md",
    "silence list": "docs/commands.md",
    "silence remove": "docs/commands.md",
    "slurm": "docs/slurm.md",
    "netcheck serve": "docs/netcheck.md",
    "netcheck run": "docs/netcheck.md",
    "netcheck job": "docs/netcheck.md",
    "rdma-bw": "docs/rdma.md",
    "pingmesh analyze": "docs/pingmesh.md",
    "controller": "docs/pingmesh.md",
    "hang watch": "docs/hang.md",
    "hang report": "docs/hang.md",
}


def subcommand(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    for word in words:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    return parser


def options(parser: argparse.ArgumentParser, command: str) -> list[list[str]]:
    """Each option's spellings (`-v`, `--verbose`), help left out."""
    sub = subcommand(parser, command.split())
    return [a.option_strings for a in sub._actions if a.option_strings and "--help" not in a.option_strings]


def synopsis(text: str, command: str) -> str:
    """The synopsis of `command`: in a plain code block, from `nodehealth COMMAND` to the next command or the
    block's end."""
    for lang, block in code_blocks(text):
        found = re.search(rf"^(nodehealth {re.escape(command)}(?: .*?)?)(?=^nodehealth |\Z)", block, re.S | re.M)
        if not lang and found:
            return found.group(1)
    raise AssertionError(f"no synopsis of `nodehealth {command}`")


@pytest.mark.parametrize("command", sorted(SYNOPSES))
def test_each_synopsis_lists_every_flag(command):
    listed = set(re.findall(r"--?[a-zA-Z][a-z-]*", synopsis(read(SYNOPSES[command]), command)))
    assert [o for o in options(cli.parser(), command) if not listed & set(o)] == []


def test_every_command_has_a_synopsis():
    top = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    documented = {c.split()[0] for c in SYNOPSES}
    assert set(top) - documented == {"version"}  # `version` takes nothing


def test_every_extra_is_documented():
    extras = re.search(r"\[project.optional-dependencies\]\n(.*?)\n\n", read("pyproject.toml"), re.S).group(1)
    names = re.findall(r"^([a-z0-9]+) = ", extras, re.M)
    assert set(names) == {"k8s", "analysis", "probes", "attribution", "hang", "zstd", "dashboards", "all", "test"}
    readme = read("README.md")
    for name in names:
        assert f"| `{name}` |" in readme, name


def test_version_flag():
    result = subprocess.run([sys.executable, "-m", "nodehealth.cli", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == f"nodehealth {__version__}"
