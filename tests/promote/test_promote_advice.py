"""After a full run, the advice brings in the recipe the study can go on from: the promoted trial's confirmed values
at the study's trial length, from the trial's branch, not the full run's.

The advice was `git checkout attempt-NN-full-... -- recipes/default.yaml`, which brought in the full run's length
(`steps: 300`): the next study's every trial would have been a full-length run. Here a real git workspace holds the
study (tests/study_ledger.py), trial 08's branch commits its recipe (lr 5e-5 at the study's 40 steps) and the full
run's branch the same recipe at 300 steps; the advice `autorl status` gives is run as printed, with real git.
"""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest
import yaml

from autorl.ledger import Ledger
from autorl.present import findings
from autorl.recipe import set_train_values
from tests.conftest import git, run_cli
from tests.study_ledger import git_workspace

RECIPE = "recipes/default.yaml"


def _commit_on(ws, branch: str, text: str, message: str) -> None:
    git(ws, "checkout", "-q", branch)
    (ws / RECIPE).write_text(text)
    git(ws, "commit", "-qam", message)
    git(ws, "checkout", "-q", "-")


@pytest.fixture
def ws(tmp_path):
    """The study of tests/study_ledger.py with trial 08's recipe on its branch and full run 16 promoted from it."""
    root = git_workspace(tmp_path / "ws")
    base = (root / RECIPE).read_text()
    _commit_on(root, "attempt-08-move", set_train_values(base, {"lr": 5e-05}), "attempt 08: lr 5e-5")
    git(root, "branch", "attempt-16-full-move", "attempt-08-move")
    _commit_on(root, "attempt-16-full-move", set_train_values(base, {"lr": 5e-05, "steps": 300}), "full run")
    git(root, "tag", "attempt-16-start", "attempt-16-full-move")
    git(root, "tag", "attempt-16-end", "attempt-16-full-move")
    led = Ledger(root / "ledger.sqlite")
    led.add_trial(
        study_id=led.study().id,
        number=16,
        attempt="attempt-16-full-move",
        branch="attempt-16-full-move",
        kind="full",
        start_tag="attempt-16-start",
        end_tag="attempt-16-end",
        proposer="promote",
        status="complete",
        objective=0.668,
        promoted_from=8,
        changed={"steps": 300},
    )
    led.close()
    return root


def _status(ws) -> list[str]:
    r = run_cli("-C", str(ws), "status", env={**os.environ, "COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_the_next_command_after_a_full_run_brings_in_the_trial_length_recipe(ws):
    lines = _status(ws)
    nxt = next(line for line in lines if line.startswith("Next: "))
    assert nxt == f"Next: git checkout attempt-08-move -- {RECIPE}", lines
    subprocess.run(shlex.split(nxt.removeprefix("Next: ")), cwd=ws, check=True)  # as a person would run it
    train = yaml.safe_load((ws / RECIPE).read_text())["train"]
    assert train["steps"] == 40 and train["lr"] == 5e-05  # the confirmed value, at the study's trial length
    why = " ".join(x.strip() for x in lines[lines.index(nxt) + 1 :])
    assert "08's confirmed values at the study's trial length" in why and "full length (steps=300)" in why, why


def test_the_full_run_lines_name_both_branches_and_what_each_is_for(ws):
    text = " ".join(x.strip() for x in _status(ws))  # lines wrap at 100 columns at most
    assert (
        "branch to adopt: attempt-16-full-move (the full run's weights and results; its recipe runs at full length: "
        "steps=300)" in text
    )
    assert f"a next study goes on from 08's recipe at trial length: git checkout attempt-08-move -- {RECIPE}" in text
    assert f"git checkout attempt-16-full-move -- {RECIPE}" not in text


def test_promote_says_which_recipe_a_next_study_goes_on_from():
    """promote's own lines once it launched the full run (the shape `promotion._launch_full` returns)."""
    launched = {
        "attempt": "attempt-16-full-move",
        "number": 16,
        "promoted_from": 8,
        "trial_branch": "attempt-08-move",
        "recipe_path": RECIPE,
        "monitor_pid": 123,
        "revalidation": {"verdict": "improved"},
        "forced": False,
        "gate": None,
    }
    lines = findings.promoted_lines(launched)
    assert lines[-1] == (
        f"a next study goes on from 08's recipe at trial length: git checkout attempt-08-move -- {RECIPE}"
    )
