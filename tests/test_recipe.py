"""Recipe validation: every mistake is one line naming the field."""

import re
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


def test_flow_style_train_becomes_an_editable_block():
    from autorl.recipe import editable_text

    text = "name: x\ntrain: {lr: 1.0e-4, gens: 8, steps: 40}\nsearch:\n  lr: {low: 1.0e-6, high: 1.0e-2, log: true}\n"
    block = editable_text(text)
    edited = set_train_values(block, {"lr": 3e-4})
    data = yaml.safe_load(edited)
    assert data["train"] == {"lr": 3e-4, "gens": 8, "steps": 40} and data["search"]["lr"]["log"] is True
    plain = DEFAULT.read_text()
    assert editable_text(plain) == plain  # a block-style recipe keeps its comments and layout


@pytest.mark.parametrize("override, needle", [
    ("gens=6", "train.gens is 6, which is not among search.gens choices [4, 8, 16]"),
])
def test_a_study_base_lies_inside_its_own_search_space(override, needle):
    from autorl.recipe import check_base

    recipe = load_recipe(DEFAULT, [override])  # a single run may use it
    with pytest.raises(RecipeError, match=re.escape(needle)):
        check_base(recipe, DEFAULT)


@pytest.mark.parametrize("override, needle", [
    ("lr=inf", "train.lr is inf: give a finite number"), ("lr=.inf", "train.lr is inf"),
    ("temperature=.nan", "train.temperature"), ("steps=0", "train.steps is 0: a run needs at least 1"),
])
def test_non_finite_numbers_and_zero_steps_are_refused(override, needle):

    with pytest.raises(RecipeError, match=re.escape(needle)):
        load_recipe(DEFAULT, [override])


def test_recipe_keys_cover_the_backend_model():
    from autorl.recipe import params_model, train_keys

    keys = train_keys("embedded")
    assert [k["key"] for k in keys] == list(params_model("embedded").model_fields)
    assert next(k for k in keys if k["key"] == "lr")["description"].startswith("AdamW")


def test_a_study_base_may_start_outside_a_numeric_search_range():
    from autorl.recipe import check_base

    check_base(load_recipe(DEFAULT, ["lr=0.5"]), DEFAULT)  # searching away from the start is allowed


def test_recipe_from_text_is_load_recipe_without_the_read():
    from autorl.recipe import recipe_from_text

    overrides = ["lr=3e-4", "abort.window=4"]
    assert recipe_from_text(DEFAULT.read_text(), DEFAULT, overrides) == load_recipe(DEFAULT, overrides)
    with pytest.raises(RecipeError, match=r"^x\.yaml line 3: not valid YAML"):
        recipe_from_text("name: a\ntrain: [unclosed\n", "x.yaml")
    with pytest.raises(RecipeError, match=r"^x\.yaml: a recipe is a YAML mapping"):
        recipe_from_text("- a list\n", "x.yaml")


@pytest.mark.parametrize("content, needle", [
    (None, "not found"),
    (b"name: caf\xe9\n", "cannot be read (UnicodeDecodeError)"),
])
def test_an_unreadable_recipe_file_is_one_line(tmp_path, content, needle):
    from autorl.recipe import read_recipe_text

    path = tmp_path / "r.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(RecipeError) as info:
        read_recipe_text(path)
    assert needle in str(info.value) and "\n" not in str(info.value)
