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
    assert r.params.gens == 8 and r.train["gens"] == 8


@pytest.mark.parametrize(
    "override, needle",
    [
        ("lr=-1", "train.lr"),
        ("gens=1", "train.gens"),
        ("eps_clip=0", "train.eps_clip"),
        ("learning_rate=1e-4", "unknown key 'train.learning_rate'"),
        ("gens=many", "train.gens"),
        ("loss_type=ppo", "train.loss_type"),
        ("objective.direction=up", "objective.direction"),
        ("lr", "write key=value"),
    ],
)
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
    from autorl.recipe import SearchParam
    from autorl.search.view import distance

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


@pytest.mark.parametrize(
    "override, needle",
    [
        ("gens=6", "train.gens is 6, which is not among search.gens choices [4, 8, 16]"),
    ],
)
def test_a_study_base_lies_inside_its_own_search_space(override, needle):
    from autorl.recipe import check_base

    recipe = load_recipe(DEFAULT, [override])  # a single run may use it
    with pytest.raises(RecipeError, match=re.escape(needle)):
        check_base(recipe, DEFAULT)


@pytest.mark.parametrize(
    "override, needle",
    [
        ("lr=inf", "train.lr is inf: give a finite number"),
        ("lr=.inf", "train.lr is inf"),
        ("temperature=.nan", "train.temperature"),
        ("steps=0", "train.steps is 0: a run needs at least 1"),
    ],
)
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


@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "not found"),
        (b"name: caf\xe9\n", "is not UTF-8 text (byte 9): save it as UTF-8"),
    ],
)
def test_an_unreadable_recipe_file_is_one_line(tmp_path, content, needle):
    from autorl.recipe import read_recipe_text

    path = tmp_path / "r.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(RecipeError) as info:
        read_recipe_text(path)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_set_is_parsed_once_into_paths_and_numbers():
    from autorl.recipe import parse_overrides

    got = parse_overrides(["lr=3e-4", "timeout_s=30", "verdict.confirm_runs=0", "warmup=1e-5", "lr=1e-5", "name=a=b"])
    assert got == {
        ("train", "lr"): 1e-5,
        ("timeout_s",): 30,
        ("verdict", "confirm_runs"): 0,
        ("train", "warmup"): 1e-5,
        ("name",): "a=b",
    }
    with pytest.raises(RecipeError, match="write key=value"):
        parse_overrides(["=3"])


def test_overrides_outside_train_keep_the_users_comments():
    from autorl.recipe import recipe_and_text

    text = DEFAULT.read_text()
    overrides = [
        "lr=3e-4",
        "timeout_s=30",
        "verdict.confirm_runs=0",
        "abort.window=4",
        "objective.reduction=best",
        "search.gens.choices=[4, 8]",
    ]
    recipe, out = recipe_and_text(text, DEFAULT, overrides)
    assert recipe == load_recipe(DEFAULT, overrides)
    data = yaml.safe_load(out)
    assert (data["train"]["lr"], data["timeout_s"], data["verdict"]["confirm_runs"], data["abort"]["window"]) == (
        3e-4,
        30,
        0,
        4,
    )
    assert data["search"]["gens"] == {"choices": [4, 8]} and data["objective"]["reduction"] == "best"
    comments = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert comments and all(c in out.splitlines() for c in comments)
    assert "timeout_s: 30  # the hard per-trial limit" in out  # the value changed, its comment kept
    changed = [line for line in out.splitlines() if line not in text.splitlines()]
    assert len(changed) == 7  # one line per value (abort: is a new section of two lines)


@pytest.mark.parametrize(
    "text, path, value, expect",
    [
        (
            "a: 1\nabort: {window: 8, pruner: true}  # why\n",
            ("abort", "window"),
            4,
            "a: 1\nabort: {window: 4, pruner: true}  # why\n",
        ),
        (
            "search:\n  gens:\n    choices:\n    - 4\n    - 8\n  lr: {low: 1}\n",
            ("search", "gens", "choices"),
            [2],
            "search:\n  gens:\n    choices: [2]\n  lr: {low: 1}\n",
        ),
        (
            "train:\n    lr: 1  # keep\n# tail\nname: x",
            ("train", "gens"),
            8,
            "train:\n    lr: 1  # keep\n    gens: 8\n# tail\nname: x\n",
        ),
        ("name: x\n", ("verdict", "confirm_runs"), 0, "name: x\nverdict:\n  confirm_runs: 0\n"),
        ("train:\nname: x\n", ("train", "lr"), 0.001, "train:\n  lr: 0.001\nname: x\n"),
    ],
)
def test_values_are_written_in_place(text, path, value, expect):
    from autorl.recipe import set_values

    assert set_values(text, {path: value}) == expect


def test_a_layout_the_editor_does_not_follow_is_written_out_again():
    from autorl.recipe import recipe_and_text

    text = "name: x\ntrain: &t\n  lr: 0.1\ntimeout_s: 30\n"  # an anchor: the value text is not the mapping
    recipe, out = recipe_and_text(text, "x.yaml", ["lr=3e-4"])
    assert recipe.train["lr"] == 3e-4 and yaml.safe_load(out)["train"]["lr"] == 3e-4


def test_a_recipe_is_typed_by_its_backend_once():
    r = load_recipe(DEFAULT, ["lr=3e-4"])
    assert type(r.params).__name__ == "EngineConfig" and r.params.lr == 3e-4
    assert r.with_train(gens=4).params.gens == 4 and r.params.gens == 8
    copy = r.model_copy(update={"train": {**r.train, "gens": 16}})
    assert copy.params.gens == 16  # a copy with new values is validated again, so params never goes stale
    with pytest.raises(RecipeError, match="train.gens"):
        r.with_train(gens=1)


def test_a_set_value_reaches_the_engine_config_as_a_number(tmp_path):
    """The path of a setting (docs/architecture.md): --set parsed once, written into the recipe text, the recipe
    validated once into EngineConfig, the embedded plan writes it unvalidated, the child validates it once."""
    import json

    from autorl.backends.base import TrialSpec, get_backend
    from autorl.engine.config import EngineConfig
    from autorl.recipe import parse_overrides, recipe_and_text
    from autorl.toolkit.child import load_config

    overrides = parse_overrides(["lr=3e-4", "verdict.confirm_runs=0"])
    recipe, text = recipe_and_text(DEFAULT.read_text(), DEFAULT, overrides)
    assert "  lr: 0.0003\n" in text and type(recipe.params.lr) is float
    spec = TrialSpec(attempt="attempt-01-x", recipe=recipe, worktree=ROOT, run_dir=tmp_path, cache_dir=tmp_path)
    plan = get_backend("embedded").plan(spec)
    path = plan.argv[plan.argv.index("--config") + 1]
    assert json.loads(Path(path).read_text())["lr"] == 3e-4
    assert load_config(path, EngineConfig).lr == 3e-4 and load_config(path, EngineConfig) == recipe.params


def test_best_of_a_series_without_per_item_results_is_refused_in_one_line(tmp_path):
    """The best of a noisy series of run values favours the noisier recipe; only greedy pass@1 evals have the
    per-item results whose best is chosen without that bias (cross-fitted)."""
    for metric in ("reward_mean", "eval/id/sampling_pass@8"):
        with pytest.raises(RecipeError, match="reduction 'best' needs per-item results") as e:
            load_recipe(DEFAULT, [f"objective.metric={metric}", "objective.reduction=best"])
        assert "\n" not in str(e.value) and "use last or mean_last_k" in str(e.value)
    assert load_recipe(DEFAULT, ["objective.metric=reward_mean", "objective.reduction=mean_last_k"])
    assert load_recipe(DEFAULT, ["objective.metric=eval/ood/greedy_pass@1", "objective.reduction=best"])
    r = run_cli_bad_recipe(tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def run_cli_bad_recipe(tmp_path):
    from tests.conftest import run_cli

    data = _data()
    data["objective"] = {"metric": "reward_mean", "reduction": "best"}
    path = tmp_path / "best.yaml"
    path.write_text(yaml.safe_dump(data))
    return run_cli("train", str(path), "--dry-run")


@pytest.mark.parametrize(
    "space, needle",
    [
        ({"low": float("nan"), "high": float("inf")}, "low nan is not a finite number"),
        ({"low": 1e-7, "high": float("inf"), "log": True}, "high inf is not a finite number"),
        ({"low": -1e308, "high": 1e308}, "wider than a float holds"),
        ({"low": 1e-7, "high": 1e-2, "int": True}, "an int range needs whole-number bounds"),
        ({"choices": [float("nan"), 1e-5]}, "choice nan is not a finite number"),
    ],
)
def test_a_search_space_optuna_cannot_sample_is_refused_before_any_study(space, needle):
    """Such a range passed validation, the baseline ran, and the first proposal died in Optuna with a traceback."""
    data = _data()
    data["search"] = {"lr": space}
    with pytest.raises(RecipeError, match=re.escape(needle)) as e:
        validate_recipe(data, source="r.yaml")
    assert "search" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "override, needle",
    [
        ("gens=100000000", "train.gens"),
        ("max_new_tokens=100000000", "train.max_new_tokens"),
        ("threads=100000", "train.threads"),
        ("steps=1000000000000", "train.steps"),
        ("timeout_s=1e308", "timeout_s"),
        ("verdict.baseline_repeats=1000000000", "baseline_repeats"),
        ("full.steps=-3", "full.steps"),
        ("full.bogus=3", "full"),
    ],
)
def test_unbounded_sizes_and_a_full_block_the_backend_cannot_run_are_refused_with_the_recipe(override, needle):
    """These passed validation: a study started with steps 1e12, and a full block's mistakes surfaced only when
    its promoted run started."""
    with pytest.raises(RecipeError) as e:
        load_recipe(DEFAULT, [override])
    assert needle in str(e.value) and "\n" not in str(e.value)
