"""The README says what the code does: its commands, synopses and extras."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest

from nodehealth import __version__, cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


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


def options(parser: argparse.ArgumentParser, command: str) -> list[list[str]]:
    """Each option's spellings (`-v`, `--verbose`), help left out."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return [a.option_strings for a in sub._actions if a.option_strings and "--help" not in a.option_strings]


@pytest.mark.parametrize("command", ["check", "daemon", "slurm"])
def test_each_synopsis_lists_every_flag(command):
    synopsis = re.search(rf"```\n(nodehealth {command} .*?)```", read("README.md"), re.S).group(1)
    listed = set(re.findall(r"--?[a-z][a-z-]*", synopsis))
    assert [o for o in options(cli.parser(), command) if not listed & set(o)] == []


@pytest.mark.parametrize("command", ["serve", "run", "job"])
def test_each_netcheck_synopsis_lists_every_flag(command):
    synopsis = re.search(rf"\n(nodehealth netcheck {command} .*?)\nnodehealth ", read("README.md"), re.S).group(1)
    listed = set(re.findall(r"--?[a-z][a-z-]*", synopsis))
    netcheck = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["netcheck"]
    sub = next(a for a in netcheck._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    spellings = [a.option_strings for a in sub._actions if a.option_strings and "--help" not in a.option_strings]
    assert [o for o in spellings if not listed & set(o)] == []


def test_every_extra_is_documented():
    extras = re.search(r"\[project.optional-dependencies\]\n(.*?)\n\n", read("pyproject.toml"), re.S).group(1)
    names = re.findall(r"^([a-z0-9]+) = ", extras, re.M)
    assert set(names) == {"k8s", "probes", "hang", "zstd", "dashboards", "all", "test"}
    readme = read("README.md")
    for name in names:
        assert f"| `{name}` |" in readme, name


def test_version_flag():
    result = subprocess.run([sys.executable, "-m", "nodehealth.cli", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == f"nodehealth {__version__}"
