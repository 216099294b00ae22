"""Generated inputs through the paths a user's command takes. Property: what is invalid is refused in one line, exit
2, with no traceback and nothing written; what is valid is accepted (a study's base recipe, its baseline's point and
its first asked trials made into recipes; a train plan printed).

The fast profile runs in the suite; ``benchmarks/property_inputs.py`` runs the large one (profiles in tests/property/profiles.py).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import tempfile
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from autorl.cli import main
from autorl.errors import MAX_LINE, UserError, one_line
from autorl.recipe import check_base, editable_text, recipe_and_text
from autorl.search.hypotheses import load_hypothesis
from autorl.search.optuna_study import distributions
from tests.property import profiles  # noqa: F401 - registers and loads the hypothesis profiles first
from tests.property import strategies as s
from tests.study_ledger import git_workspace

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore:Fixed parameter:UserWarning")  # a base outside its range, by design
COMMANDS = ("ledger", "status", "show", "diagnose", "triage", "hypotheses", "recipe", "clean", "promote")


def _one_line(exc: UserError) -> None:
    """What the CLI prints of it (``errors.one_line``: a key that holds a newline is quoted on one line) is one
    bounded line, exit 2."""
    line = f"autorl: error: {one_line(exc)}"
    assert exc.exit_code == 2 and "\n" not in line and len(line) <= MAX_LINE + 20 and "Traceback" not in line, line


def first_trials(data: Any, overrides: list[str]) -> str:
    """A new study's base recipe as `autorl run` reads it (``opening.base_recipe``), then its baseline's point and
    two points Optuna asks in its space (``Search.ask``'s distributions) made into trial recipes. 'refused' or
    'ran'."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "recipe.yaml"
        text = yaml.safe_dump(data, allow_unicode=True)
        try:
            recipe, _ = recipe_and_text(editable_text(text, path), path, overrides)
            check_base(recipe, path)
        except UserError as exc:
            _one_line(exc)
            assert sorted(os.listdir(tmp)) == [], "a refused recipe wrote nothing"
            return "refused"
    study = optuna.create_study(direction="maximize")  # Search's own asks, its storage in memory (fast)
    study.enqueue_trial({k: recipe.train[k] for k in recipe.search}, skip_if_exists=False)
    for value in (0.5, 0.4, 0.6):
        trial = study.ask(distributions(recipe.search))
        recipe.with_train(**trial.params)
        study.tell(trial, value)
    return "ran"


@given(s.valid_recipe().flatmap(lambda d: st.tuples(st.just(d), st.lists(s.valid_set(d), max_size=2))))
def test_a_valid_recipe_and_set_values_start_a_study(case):
    data, sets = case
    assert first_trials(data, sets) == "ran"


@given(s.any_recipe(), st.lists(s.any_set(), max_size=3))
def test_any_recipe_and_set_values_run_or_are_one_line(data, sets):
    first_trials(data, sets)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@functools.cache
def workspace() -> Path:
    """One real workspace with a finished study's ledger, shared by every example (made once, when first needed)."""
    return git_workspace(Path(tempfile.mkdtemp(prefix="autorl-property-")) / "ws")


@given(st.one_of(s.any_recipe(), s.valid_recipe()), st.lists(s.any_set(), max_size=2))
def test_train_dry_run_on_any_recipe_prints_a_plan_or_one_line(data, sets):
    ws = workspace()
    recipe = ws / "recipes" / "generated.yaml"
    recipe.write_text(yaml.safe_dump(data, allow_unicode=True))
    before = _tree(ws)
    rc, _, err = _cli(["-C", str(ws), "train", "recipes/generated.yaml", "--dry-run", *(f"--set={x}" for x in sets)])
    lines = err.strip().splitlines()
    assert rc in (0, 2) and "Traceback" not in err, (rc, err)
    if rc == 2:
        assert len(lines) == 1 and lines[0].startswith("autorl: error: ") and len(lines[0]) <= MAX_LINE + 20, err
        assert _tree(ws) == before, "a refused train wrote nothing"
    recipe.unlink()


@given(s.any_hypothesis())
def test_any_hypothesis_file_loads_or_is_one_line(case):
    stem, meta, body = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{stem}.md"
        try:
            path.write_text(f"---\n{yaml.safe_dump(meta, allow_unicode=True)}---\n{body}\n")
        except (OSError, UnicodeEncodeError):
            return  # a name the file system refuses is no hypothesis file
        try:
            load_hypothesis(path)
        except UserError as exc:
            _one_line(exc)


@given(
    st.sampled_from(COMMANDS),
    st.lists(
        st.one_of(
            st.sampled_from(["--json", "--verdict", "--last", "--study", "--out", "--dry-run", "keys", "-h", "5"]),
            st.text(max_size=8),
            st.integers(-(10**12), 10**12).map(str),
        ),
        max_size=4,
    ),
)
def test_any_arguments_to_a_review_command_answer_or_are_one_line(command, args):
    argv = ["-C", str(workspace()), command, *args]
    if command == "clean" and "--dry-run" not in args or command == "promote" and "--dry-run" not in args:
        argv.append("--dry-run")  # never clean or promote the shared workspace for real
    rc, _, err = _cli(argv)
    assert rc in (0, 1, 2) and "Traceback" not in err, (argv, rc, err)
    if rc == 2:
        assert len(err.strip().splitlines()) == 1, (argv, err)
