"""Docs are generated from the code and must not go stale; every command has help."""

from pathlib import Path

import pytest

from autorl import docs
from autorl.cli import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("rel", sorted(docs.FILES))
def test_generated_docs_are_current(rel):
    assert (ROOT / rel).read_text() == docs.FILES[rel](), f"{rel} is stale: run `python -m autorl.docs`"


def _commands(group, prefix="autorl"):
    for name, cmd in group.commands.items():
        yield f"{prefix} {name}", cmd
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, f"{prefix} {name}")


@pytest.mark.parametrize("name, cmd", list(_commands(cli)))
def test_every_command_has_help_and_is_in_the_readme(name, cmd):
    assert (cmd.help or "").strip(), f"{name} has no help text"
    top = name.split()[1]
    assert f"autorl {top}" in (ROOT / "README.md").read_text(), f"README does not mention `autorl {top}`"


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = "bash scripts/setup.sh --test && .venv/bin/python -m pytest -q"
    assert command in readme and command in ci
