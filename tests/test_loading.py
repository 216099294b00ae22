"""autorl.loading: numbers like 3e-4 read as numbers everywhere, and every rules table fails in one line."""

from __future__ import annotations

import pytest

from autorl import loading
from autorl.errors import RecipeError, RulesError
from autorl.judge import abort, diagnose, triage
from autorl.recipe import load_recipe, validate_recipe
from autorl.runs import plan
from autorl.search import moves


@pytest.mark.parametrize(
    "text, value",
    [
        ("3e-4", 3e-4),
        ("1e-5", 1e-5),
        ("-2E+3", -2000.0),
        ("1.0e5", 1e5),
        ("5.0e-07", 5e-7),
        (".5e-1", 0.05),
        ("10", 10),
        ("1_000", 1000),
        ("0x10", 16),
        ("1e", "1e"),
        ("e5", "e5"),
        ("'3e-4'", "3e-4"),
    ],
)
def test_numbers_without_a_dot_are_numbers(text, value):
    got = loading.parse(f"v: {text}")["v"]
    assert got == value and type(got) is type(value)
    assert loading.parse_value(text) == value


def test_a_string_that_looks_like_a_number_survives_a_dump():
    data = {"s": "3e-4", "f": 3e-4, "g": 1e-5, "l": [4, 8]}
    assert loading.parse(loading.dump(data)) == data
    assert loading.parse("v: " + loading.render("1e-5"))["v"] == "1e-5"
    assert loading.render(1e-5) == "1.0e-05" and loading.render([4, 8]) == "[4, 8]"


def test_untyped_values_of_a_recipe_are_numbers_too(tmp_path):
    """The command backend keeps keys it does not declare as they are: a YAML 1.1 reader left 1e-5 a string."""
    path = tmp_path / "r.yaml"
    path.write_text("backend: command\ntrain:\n  argv: [echo, '{warmup_lr}']\n  warmup_lr: 1e-5\n")
    recipe = load_recipe(path, ["beta=3e-4"])
    assert recipe.train["warmup_lr"] == 1e-5 and recipe.train["beta"] == 3e-4


def test_bad_yaml_in_a_recipe_names_the_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: x\ntrain:\n  lr: [1\n")
    with pytest.raises(RecipeError, match=r"r\.yaml line \d+: not valid YAML"):
        load_recipe(path)
    with pytest.raises(RecipeError, match="a recipe is a YAML mapping"):
        validate_recipe(loading.parse("- a"), source="x")


@pytest.mark.parametrize(
    "load, text, where",
    [
        (moves.load_table, "moves: []\nexploit: {ratio: 4}\n", "gallop"),
        (moves.load_table, "moves: [\n", "not valid YAML"),
        (diagnose.load_rules, "symptoms: {}\nbottlenecks: oops\n", "bottlenecks"),
        (
            triage.load_rules,
            "families: [{id: a, category: cuda_oom, priority: 1, patterns: ['('], remedy: r}]\n"
            "nonfinite_remedy: n\nunknown_remedy: u\n",
            "not a valid regex",
        ),
        (triage.load_rules, "families_from: [missing.yaml]\nnonfinite_remedy: n\nunknown_remedy: u\n", "missing.yaml"),
        (abort.load_window_rules, "rules: 3\n", "rules"),
    ],
)
def test_every_rules_table_fails_in_one_line(tmp_path, load, text, where):
    bad = tmp_path / "table.yaml"
    bad.write_text(text)
    with pytest.raises(RulesError, match=where) as err:
        load(bad)
    line = str(err.value)
    assert "\n" not in line and str(bad) in line and "fix the file" in line


def test_the_planning_table_is_one_line_too(tmp_path, monkeypatch):
    bad = tmp_path / "plan.yaml"
    bad.write_text("window: 0\n")
    monkeypatch.setattr(plan, "RULES_PATH", bad)
    with pytest.raises(RulesError, match=r"planning rules .*plan\.yaml: .*fix the file"):
        plan.rules()


def test_a_missing_table_says_so(tmp_path):
    with pytest.raises(RulesError, match="cannot be read"):
        moves.load_table(tmp_path / "none.yaml")


def test_a_table_is_read_again_when_its_file_changes(tmp_path):
    path = tmp_path / "moves.yaml"
    shipped = moves.load_table().model_dump_json()
    path.write_text(loading.dump(moves.load_table().model_dump()))
    assert moves.load_table(path).model_dump_json() == shipped
    assert moves.load_table(path) is moves.load_table(path)  # cached while the file is unchanged
    path.write_text(path.read_text() + "\n# edited\n")
    with pytest.raises(RulesError):
        path.write_text("moves: 1\n")
        moves.load_table(path)


def test_a_table_that_includes_others_is_read_again_when_one_of_them_changes(tmp_path):
    main, extra = tmp_path / "crash.yaml", tmp_path / "more.yaml"
    main.write_text(
        "families_from: [more.yaml]\nnonfinite_remedy: n\nunknown_remedy: u\n"
        "families: [{id: a, category: cuda_oom, priority: 1, patterns: [alpha], remedy: r}]\n"
    )
    extra.write_text("families: [{id: b, category: disk_full, priority: 2, patterns: [beta], remedy: r}]\n")
    assert [f.id for f in triage.load_rules(main).families] == ["a", "b"]
    extra.write_text(
        "families: [{id: b, category: disk_full, priority: 2, patterns: [beta], remedy: r},\n"
        "           {id: c, category: host_oom, priority: 3, patterns: [gamma], remedy: r}]\n"
    )
    assert [f.id for f in triage.load_rules(main).families] == ["a", "b", "c"]
