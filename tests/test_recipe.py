"""Recipe validation: every mistake is one line naming the field."""

from pathlib import Path

import pytest
import yaml

from autorl.errors import RecipeError
from autorl.recipe import load_recipe, set_train_values, validate_recipe

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "recipes" / "default.yaml"


def _data():
    return yaml.safe_load(DEFAULT.read_text())


def test_default_recipe_validates():
    r = load_recipe(DEFAULT)
    assert r.backend == "embedded" and set(r.search) == {"lr", "eps_clip", "kl_coef", "gens"}
    assert r.params().gens == 8


@pytest.mark.parametrize("override, needle", [
    ("lr=-1", "train.lr"),
    ("gens=1", "train.gens"),
    ("eps_clip=0", "train.eps_clip"),
    ("learning_rate=1e-4", "unknown key 'train.learning_rate'"),
    ("gens=many", "train.gens"),
    ("loss_type=ppo", "train.loss_type"),
    ("objective.direction=up", "objective.direction"),
    ("lr", "write key=value"),
])
def test_bad_overrides_name_the_field(override, needle):
    with pytest.raises(RecipeError) as e:
        load_recipe(DEFAULT, [override])
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_search_errors():
    d = _data()
    d["search"]["lr"] = {"low": 1e-2, "high": 1e-6, "log": True}
    with pytest.raises(RecipeError, match="swap"):
        validate_recipe(d)
    d = _data()
    d["search"]["warmup_ratio"] = {"low": 0, "high": 1}
    with pytest.raises(RecipeError, match="search names 'warmup_ratio'"):
        validate_recipe(d)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(RecipeError, match="not found"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(bad)


def test_set_overrides_apply():
    r = load_recipe(DEFAULT, ["lr=3e-4", "gens=16", "timeout_s=30", "objective.reduction=best"])
    assert (r.train["lr"], r.train["gens"], r.timeout_s, r.objective.reduction) == (3e-4, 16, 30, "best")


def test_set_train_values_changes_only_those_lines():
    text = DEFAULT.read_text()
    out = set_train_values(text, {"lr": 0.0003, "gens": 16, "entropy_coef": 0.01})
    changed = [(a, b) for a, b in zip(text.splitlines(), out.splitlines()) if a != b]
    assert [b.strip() for _, b in changed][:2] == ["lr: 0.0003", "gens: 16"]
    data = yaml.safe_load(out)
    assert data["train"]["entropy_coef"] == 0.01 and data["search"] == yaml.safe_load(text)["search"]
    assert len(out.splitlines()) == len(text.splitlines()) + 1


def test_search_distance_for_crash_avoidance():
    from autorl.search.proposer import distance
    from autorl.recipe import SearchParam

    space = {"lr": SearchParam(low=1e-6, high=1e-2, log=True), "gens": SearchParam(choices=[4, 8])}
    assert distance(space, {"lr": 1e-3, "gens": 8}, {"lr": 1e-3, "gens": 8}) == 0
    assert distance(space, {"lr": 1e-3, "gens": 8}, {"lr": 1.2e-3, "gens": 8}) < 0.1
    assert distance(space, {"lr": 1e-3, "gens": 8}, {"lr": 1e-5, "gens": 8}) == pytest.approx(0.5)
    assert distance(space, {"lr": 1e-3, "gens": 8}, {"lr": 1e-3, "gens": 4}) == 1.0
