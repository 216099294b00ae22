"""Hostile input costs nothing: whatever a recipe, a hypothesis file, a rules table or a flag holds, reading it is
bounded (size, depth, alias expansion, numbers), a key given twice is refused, and the error is one bounded line
naming the line it is on. The same inputs, through the real CLI with time and memory measured, are in
benchmarks/reliability.py."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import pytest

from autorl import loading
from autorl.budget import parse_duration
from autorl.errors import MAX_LINE, BudgetError, RecipeError, UserError, one_line, validation_line
from autorl.recipe import parse_overrides, read_recipe_text, recipe_and_text, validate_recipe
from autorl.search.hypotheses import HypothesisError, load_hypothesis, load_library

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import reliability  # noqa: E402 - the suite's hostile inputs, so that the tests and the table use the same ones

HEAD = "name: x\nbackend: command\n"


def _bomb(key: str, levels: int = 9) -> str:
    return reliability._bomb(levels).replace(f"a{levels}: &a{levels}", f"{key}: &a{levels}")


@pytest.mark.parametrize(
    "text, line, needle",
    [
        (HEAD + _bomb("description") + "\ntrain: {argv: [echo]}\n", 9, "alias bomb"),
        (HEAD + _bomb("a9") + "\ntrain: {argv: [echo], lr: *a9}\n", 9, "alias bomb"),
        (HEAD + "description: &a [*a]\n", 3, "inside the value it names"),
        (HEAD + "description: " + "[" * 100_000 + "]" * 100_000 + "\n", 3, "nested deeper than 64"),
        (HEAD + "d:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 200)), 66, "nested deeper than 64"),
        (HEAD + "train: {lr: " + "9" * 1_000_000 + "}\n", 3, "1,000,000 characters"),
        (HEAD + "train: {argv: [echo], seed: 99999999999999999999}\n", 3, "outside 64 bits"),
        (HEAD + "train: {argv: [echo], seed: -0x8000000000000001}\n", 3, "outside 64 bits"),
        (HEAD + "train: {argv: [echo], seed: 1:2:3:4:5:6:7:8:9:10:11:12:13}\n", 3, "base-60 number"),
        (HEAD + "train: {argv: [echo], steps: 1:30}\n", 3, "reads as a base-60 number in YAML 1.1"),
        (HEAD + "train: {lr: 1e999}\n", 3, "too large for a float"),
        (HEAD + "train: {lr: 1e-400}\n", 3, "too small for a float (it would be read as 0)"),
        (HEAD + "train:\n  lr: 0.1\n  lr: 0.2\n", 5, "'lr' is given twice in one mapping (first on line 4)"),
        (HEAD + "description: 2024-99-99\n", 3, "cannot be read (month must be in 1..12)"),
        (HEAD + "description: !!binary aGk=\n", 3, "could not determine a constructor"),
        (HEAD + "description: !!python/object/apply:os.system ['true']\n", 3, "could not determine a constructor"),
    ],
)
def test_a_hostile_recipe_is_one_line_naming_its_line(text, line, needle):
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(RecipeError) as err:
        recipe_and_text(text, "bad.yaml")
    message = str(err.value)
    assert message.startswith(f"bad.yaml line {line}: ") and needle in message, message
    assert "\n" not in message and len(message) < 300
    # nothing expanded: the peak memory of this process grew by less than 100 MiB (ru_maxrss is in KiB)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - usage < 100 * 1024


def test_a_flag_where_a_number_is_wanted_is_refused():
    """pydantic reads `true` as 1: `steps: true` trained one step where the user meant something else."""
    with pytest.raises(RecipeError, match="train.steps is true, where a number is wanted"):
        recipe_and_text("name: x\nbackend: embedded\ntrain: {steps: true}\n", "bad.yaml")


def test_what_yaml_allows_within_the_bounds_still_reads():
    text = (
        "base: &base {lr: 0.001, seed: 1}\nrun:\n  <<: *base\n  seed: 2\nnums: [0x10, -9223372036854775808, "
        "9223372036854775807, .inf, -.inf, 1e300, 3e-4]\nwhen: 2024-02-29\n"
    )
    data = loading.parse(text)
    assert data["run"] == {"lr": 0.001, "seed": 2}  # a merge may be overridden: that is not a key given twice
    assert data["nums"][:3] == [16, -(2**63), 2**63 - 1] and data["nums"][3] == float("inf")
    assert str(data["when"]) == "2024-02-29"


def test_a_text_over_the_size_bound_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "w") as fh:
        fh.write("name: x\ndescription: |\n")
        for _ in range(2048):
            fh.write("  " + "x" * 1022 + "\n")
    with pytest.raises(RecipeError, match=r"big\.yaml is larger than the 1 MiB autorl reads"):
        read_recipe_text(path)
    with pytest.raises(loading.Refused, match="more than the 1 MiB"):
        loading.parse_value("x" * (2 << 20))


def test_a_file_that_is_not_utf8_or_not_a_file_is_one_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(RecipeError, match=r"is not UTF-8 text \(byte 6\)"):
        read_recipe_text(path)
    with pytest.raises(RecipeError, match="not found"):
        read_recipe_text(tmp_path)


@pytest.mark.parametrize(
    "item, needle",
    [
        ("description=" + reliability._flow_bomb(), "alias bomb"),
        ("lr=" + "9" * 100_000, "100,000 characters"),
        ("seed=99999999999999999999", "outside 64 bits"),
        ("a." * 5000 + "b=1", "up to 6 names"),
        ("x" * 100_000 + "=1", "up to 6 names"),
        ("l r=1", "up to 6 names"),
    ],
)
def test_a_hostile_set_value_is_one_line(item, needle):
    with pytest.raises(RecipeError) as err:
        parse_overrides([item])
    message = str(err.value)
    assert needle in message and "\n" not in message and len(message) < 300, message[:400]


def test_a_set_value_that_is_not_yaml_is_still_text():
    assert parse_overrides(["name=a: b: c", "objective.metric=eval/id/greedy_pass@1"]) == {
        ("name",): "a: b: c",
        ("objective", "metric"): "eval/id/greedy_pass@1",
    }


def test_a_hostile_hypothesis_file_is_one_line(tmp_path):
    path = tmp_path / "h99-bomb.md"
    path.write_text(reliability.HOSTILE_HYPOTHESIS)
    with pytest.raises(HypothesisError, match=r"h99-bomb\.md line 9: aliases here expand") as err:
        load_hypothesis(path)
    assert "\n" not in str(err.value)
    path.write_text("---\nid: h99-bomb\nid: h99-bomb\n---\n")
    with pytest.raises(HypothesisError, match="given twice"):
        load_hypothesis(path)


def test_a_folder_of_too_many_hypothesis_files_is_one_line(tmp_path):
    for i in range(1001):
        (tmp_path / f"h{i}.md").write_text("")
    with pytest.raises(HypothesisError, match="1,001 .md files, more than the 1,000"):
        load_library([tmp_path])


def test_a_huge_value_in_an_error_is_shown_short():
    bomb_ok = loading.parse(
        "a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c]\n"
    )
    with pytest.raises(RecipeError) as err:
        validate_recipe({"name": bomb_ok["d"], "backend": "command", "train": {"argv": ["echo"]}}, source="r.yaml")
    assert len(str(err.value)) < 400 and "..." in str(err.value)
    long = UserError("a " + "x" * 100_000 + "\nsecond line: do this")
    line = one_line(long)
    assert len(line) <= MAX_LINE and "\n" not in line and line.endswith("second line: do this")


@pytest.mark.parametrize(
    "text, needle",
    [("9" * 5000, "longer than a year"), ("400d", "longer than a year"), ("1" * 10_000 + "x", "is not a duration")],
)
def test_a_hostile_budget_is_one_short_line(text, needle):
    with pytest.raises(BudgetError, match=needle) as err:
        parse_duration(text)
    assert len(str(err.value)) < 300


def test_validation_line_never_walks_a_huge_input():
    from pydantic import BaseModel, ValidationError

    class M(BaseModel):
        x: int

    nested: list = []
    for _ in range(200):
        nested = [nested] * 10  # shared: cheap to build, 10**200 values if walked
    with pytest.raises(ValidationError) as err:
        M.model_validate({"x": nested})
    del nested  # (a failing assertion must not have pytest walk it either)
    line = validation_line(err.value)
    assert line.startswith("x: Input should be a valid integer (got [[[...]") and len(line) < 300


PROBE = """import runpy, sys
sys.argv = ["autorl", "-C", sys.argv[1], "run", "recipes/bad.yaml", "--budget", "1m"]
try:
    runpy.run_module("autorl.cli", run_name="__main__")
except SystemExit as exc:
    print(exc.code, "autorl.study.controller" in sys.modules, "optuna" in sys.modules)
"""


@pytest.mark.parametrize(
    "text",
    [
        HEAD + _bomb("description") + "\n",
        "name: x\ntrain: {lr: " + "9" * 200_000 + "}\n",
        "name: x\ntrain:\n  lr: 0.1\n  lr: 0.2\n",
    ],
)
def test_autorl_run_refuses_hostile_recipe_text_before_loading_the_study_machinery(command_ws, text):
    """The refusal costs the start of Python and the bounded read, not the import of the controller, Optuna and
    the ledger (seconds on a busy machine)."""
    import subprocess

    (command_ws / "recipes" / "bad.yaml").write_text(text)
    r = subprocess.run([sys.executable, "-c", PROBE, str(command_ws)], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["2", "False", "False"], (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "bad.yaml line" in r.stderr


@pytest.mark.parametrize("key, shown", [("yes", "True"), ("1", "1"), ("~", "None")])
def test_a_key_yaml_reads_as_something_other_than_text_is_named_with_where_it_is(key, shown):
    with pytest.raises(RecipeError) as err:
        recipe_and_text(f"name: x\nbackend: embedded\ntrain:\n  {key}: 2\n", "bad.yaml")
    assert f"train has the key {shown}, which is not text" in str(err.value) and "quote it" in str(err.value)
