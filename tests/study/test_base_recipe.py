"""A study's base recipe: the file is read once, and the model and the committed text agree."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from autorl.errors import RecipeError
from autorl.recipe import validate_recipe
from autorl.study.controller import RunOptions
from autorl.study.opening import base_recipe
from autorl.workspace import Workspace

OPENED: list[str] = []
WATCHED: set[str] = set()


def _audit(event: str, args: tuple) -> None:
    if event == "open" and isinstance(args[0], (str, os.PathLike)) and os.fspath(args[0]) in WATCHED:
        OPENED.append(os.fspath(args[0]))


sys.addaudithook(_audit)  # stays for the process; it only records opens of the watched paths


@pytest.fixture
def ws(tmp_path) -> Workspace:
    r = run_cli("init", str(tmp_path / "ws"))
    assert r.returncode == 0, r.stderr
    return Workspace.open(tmp_path / "ws")


def _base(ws: Workspace, overrides: list[str]) -> tuple:
    path = ws.root / "recipes" / "default.yaml"
    WATCHED.add(str(path))
    OPENED.clear()
    try:
        return base_recipe(ws, RunOptions(recipe_path=path, overrides=overrides))
    finally:
        WATCHED.discard(str(path))


@pytest.mark.parametrize("overrides", [[], ["lr=3e-4", "gens=16"], ["lr=3e-4", "timeout_s=30", "abort.window=4"]])
def test_the_recipe_file_is_read_once_and_the_text_says_what_the_model_says(ws, overrides):
    recipe, text, rel = _base(ws, overrides)
    assert len(OPENED) == 1, OPENED
    assert rel == "recipes/default.yaml"
    assert validate_recipe(yaml.safe_load(text)) == recipe
    if overrides:
        assert recipe.train["lr"] == 3e-4


def test_a_recipe_error_is_raised_before_anything_is_written(ws):
    before = sorted(p.name for p in ws.root.iterdir())
    with pytest.raises(RecipeError, match="unknown key 'train.learning_rate'"):
        _base(ws, ["learning_rate=1"])
    assert len(OPENED) == 1
    assert sorted(p.name for p in ws.root.iterdir()) == before and not Path(ws.ledger_path).exists()
