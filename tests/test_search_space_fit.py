"""A search space that does not fit the train block is refused before the study starts: one line naming the key and
what to do, exit 2, nothing written (no .autorl/, no ledger, the repository as it was).

Each of these ran a study before it was refused, and ended in an Optuna ``ValueError`` traceback or a recipe error
once a trial was made of a point the train block cannot hold: a log scale whose base is 0, a choice of another type,
a float range on a whole-number key, a range on a text or yes/no key, a choice that is a list. The real CLI in a
child process on a workspace made by `autorl init`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from autorl.recipe import check_base, validate_recipe
from autorl.search.optuna_study import Search, Told
from tests.conftest import ROOT, run_cli
from tests.study.test_refusals_write_nothing import refused_unwritten

DEFAULT = yaml.safe_load((ROOT / "recipes" / "default.yaml").read_text())

# name: (train values changed, search block, what the line names)
CASES = {
    "log scale through zero": ({"lr": 0.0}, {"lr": {"low": 1e-7, "high": 1e-2, "log": True}}, "train.lr is 0.0"),
    "log scale below zero": (
        {"kl_coef": -0.5},
        {"kl_coef": {"low": 1e-4, "high": 1.0, "log": True}},
        "train.kl_coef",
    ),
    "log scale with low at zero": ({}, {"lr": {"low": 0.0, "high": 1e-2, "log": True}}, "log scale needs low > 0"),
    "mixed choices": ({}, {"gens": {"choices": [8, "x", 4]}}, "search.gens: its choice 'x'"),
    "empty choices": ({}, {"gens": {"choices": []}}, "choices is empty"),
    "choice that is a list": ({}, {"kl_coef": {"choices": [0.0, [1, 2]]}}, "search.kl_coef choice [1, 2]"),
    "yes/no choices with a number": (
        {},
        {"scale_rewards": {"choices": [True, 3]}},
        "search.scale_rewards: its choice 3",
    ),
    "base excluded by its choices": ({"gens": 8}, {"gens": {"choices": [4, 16]}}, "not among search.gens choices"),
    "float range on a whole-number key": ({}, {"gens": {"low": 2, "high": 9}}, "int: true"),
    "range on a text key": ({}, {"loss_type": {"low": 0, "high": 1}}, "search.loss_type is a range"),
    "range on a yes/no key": ({}, {"scale_rewards": {"low": 0, "high": 1}}, "search.scale_rewards is a range"),
    "bound the key cannot take": ({}, {"gens": {"low": 0, "high": 8, "int": True}}, "search.gens: its low 0"),
    "a step": ({}, {"lr": {"low": 1e-7, "high": 1e-2, "step": 1e-3}}, "search.lr.step"),
    "a nested key": ({}, {"model.size": {"low": 1, "high": 2}}, "search names 'model.size'"),
    "a key train does not have": ({}, {"learning_rate": {"low": 1e-7, "high": 1e-2}}, "search names 'learning_rate'"),
    "base missing": ({"lr": None}, {"lr": {"low": 1e-7, "high": 1e-2, "log": True}}, "train.lr"),
}


def recipe_with(train: dict, search: dict) -> dict:
    data = yaml.safe_load(yaml.safe_dump(DEFAULT))
    data["train"].update(train)
    data["search"] = search
    return data


def _refused(name: str, root: Path) -> None:
    train, search, needle = CASES[name]
    ws = root / name.replace(" ", "-").replace("/", "-")
    assert run_cli("init", str(ws)).returncode == 0
    (ws / "recipes" / "space.yaml").write_text(yaml.safe_dump(recipe_with(train, search)))
    refused_unwritten(ws, ["run", "recipes/space.yaml", "--budget", "1m", "--max-trials", "2"], needle, cwd=ws)
    assert not (ws / ".autorl").exists() and not (ws / "ledger.sqlite").exists(), name


def test_a_search_space_that_does_not_fit_train_is_refused_before_the_study(tmp_path):
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: _refused(name, tmp_path), sorted(CASES)))


def test_a_base_outside_its_range_still_runs_as_designed(tmp_path):
    """A base outside a numeric range is a deliberate design (the search explores a region away from the recipe):
    it validates, and Optuna asks for points with it as the study's first."""
    recipe = validate_recipe(recipe_with({"lr": 0.5}, {"lr": {"low": 1e-7, "high": 1e-2, "log": True}}), "r.yaml")
    check_base(recipe, "r.yaml")
    search = Search(tmp_path / "o.sqlite", "s")
    number, params = search.ask(recipe.search, fixed={"lr": 0.5})
    assert params == {"lr": 0.5}
    search.tell(number, Told.COMPLETE, 0.4)
    for _ in range(3):
        number, params = search.ask(recipe.search)
        recipe.with_train(**params)
        search.tell(number, Told.COMPLETE, 0.5)
