"""The first ten minutes of a new user, on fast stand-in trials (the command backend running a tiny script).

Real CLI in a child process, real git, SQLite and Optuna: no repeated configurations, resume keeps the study's
settings, a patch that does not apply fails one trial, review tables read at 80 columns, `show` prints no markup.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from conftest import git, run_cli, tree_digest

SCRIPT = Path(__file__).resolve().parents[1] / "data" / "scripts" / "crash_high_lr.py"


def _recipe(search: str, extra: str = "") -> str:
    return f"""name: quick
backend: command
train:
  argv: ["{sys.executable}", "crash_high_lr.py", "{{lr}}", "{{seed}}", "{{run_dir}}/metrics.jsonl"]
  lr: 0.001
  seed: 0
search:
{search}
verdict: {{baseline_repeats: 1, bootstrap: 200}}
timeout_s: 30
{extra}"""


def _workspace(tmp_path: Path, recipe: str) -> Path:
    ws = tmp_path / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    shutil.copy(SCRIPT, ws / "crash_high_lr.py")
    (ws / "recipes" / "quick.yaml").write_text(recipe)
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "quick recipe")
    return ws


def _rows(ws: Path, sql: str) -> list[dict]:
    conn = sqlite3.connect(ws / "ledger.sqlite")
    conn.row_factory = sqlite3.Row
    return [dict(r) for r in conn.execute(sql)]


SMALL_SPACE = "  lr: {choices: [0.001, 0.002]}\n  seed: {choices: [0, 1]}\n"


@pytest.fixture(scope="module")
def small_study(tmp_path_factory) -> Path:
    """A random-strategy study over a space of four configurations, asked for eight trials."""
    ws = _workspace(tmp_path_factory.mktemp("small"), _recipe(SMALL_SPACE))
    r = run_cli("-C", str(ws), "run", "recipes/quick.yaml", "--strategy", "random", "--max-trials", "6",
                "--budget", "5m", "--quiet", timeout=300)
    assert r.returncode == 0, r.stderr
    return ws


def test_no_configuration_runs_twice_unless_deliberately(small_study):
    trials = _rows(small_study, "SELECT * FROM autorl_trials ORDER BY number")
    assert len(trials) == 6
    seen: dict[str, int] = {}
    for t in trials:
        key = t["params"]
        assert key not in seen, f"{t['attempt']} repeats trial {seen.get(key)}"
        seen[key] = t["number"]
    deliberate = [t for t in trials if "deliberate repeat" in (t["why"] or "")]
    assert len(trials) - len(deliberate) == 4  # the four configurations, then repeats that say so
    assert all(json.loads(t["params"])["seed"] >= 2 for t in deliberate)  # a fresh seed, not a re-run
    events = _rows(small_study, "SELECT message FROM autorl_events WHERE kind = 'repeat'")
    assert events and all("already tried as attempt-" in e["message"] for e in events)


def test_resume_keeps_the_strategy_and_counts_the_studys_trials(small_study):
    before = tree_digest(small_study)
    r = run_cli("-C", str(small_study), "run", "--resume", "--strategy", "optuna", "--budget", "1m")
    assert r.returncode == 2 and "uses --strategy random" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_cli("-C", str(small_study), "run", "--resume", "--set", "lr=0.002", "--budget", "1m")
    assert r.returncode == 2 and "--set does not apply on --resume" in r.stderr
    assert tree_digest(small_study) == before
    r = run_cli("-C", str(small_study), "run", "--resume", "--max-trials", "6", "--budget", "1m", timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(_rows(small_study, "SELECT * FROM autorl_trials")) == 6  # the study had its six already
    r = run_cli("-C", str(small_study), "run", "--resume", "--max-trials", "7", "--budget", "1m", timeout=120)
    assert r.returncode == 0, r.stderr
    trials = _rows(small_study, "SELECT * FROM autorl_trials ORDER BY number")
    assert len(trials) == 7 and trials[-1]["proposer"] == "random"
    assert _rows(small_study, "SELECT strategy FROM autorl_studies") == [{"strategy": "random"}]


@pytest.mark.parametrize("command", [["ledger"], ["hypotheses"], ["triage"], ["show", "2"]])
def test_review_reads_at_80_columns_without_markup(small_study, command):
    r = run_cli("-C", str(small_study), *command, env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    if command[0] == "show":  # a diff is shown verbatim; the lines around it fit
        lines = [x for x in lines if not x.startswith(("+", "-", " ", "@@", "diff --git", "index "))]
    assert lines and max(len(x) for x in lines) <= 80
    assert "[/]" not in r.stdout and "[bold" not in r.stdout
    if command == ["hypotheses"]:
        assert "    Updates are too small to move the policy" in lines
    if command == ["ledger"]:
        assert any(x.startswith("02  ") for x in lines) and any("random: " in x for x in lines)


def test_a_patch_that_does_not_apply_fails_that_trial_not_the_study(tmp_path):
    ws = _workspace(tmp_path, _recipe("  lr: {low: 0.0005, high: 0.005, log: true}\n"))
    (ws / "patches").mkdir(exist_ok=True)
    (ws / "patches" / "stale.patch").write_text(
        "--- a/crash_high_lr.py\n+++ b/crash_high_lr.py\n@@ -1,1 +1,1 @@\n-no such line\n+still none\n")
    (ws / "hypotheses").mkdir(exist_ok=True)
    (ws / "hypotheses" / "h99-stale-patch.md").write_text(
        "---\nid: h99-stale-patch\ntitle: A patch that no longer applies\npriority: high\n"
        "symptoms: [flat_learning, stable_low_accuracy, grad_vanishing]\npatch: patches/stale.patch\n"
        "overrides: {lr: 0.002}\nsuccess: {confirm: c, refute: r}\n---\nbody\n")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "a stale patch")
    r = run_cli("-C", str(ws), "run", "recipes/quick.yaml", "--max-trials", "4", "--budget", "5m", "--quiet",
                timeout=300)
    assert r.returncode == 0, r.stderr
    trials = _rows(ws, "SELECT * FROM autorl_trials ORDER BY number")
    stale = [t for t in trials if t["hypothesis"] == "h99-stale-patch"]
    assert stale and stale[0]["verdict"] == "crash" and "does not apply" in stale[0]["reason"]
    assert len(trials) == 4  # the study went on after it


def test_promote_needs_an_eval_objective(tmp_path):
    recipe = _recipe("  lr: {low: 0.0005, high: 0.005, log: true}\n", "objective: {metric: reward_mean}\n")
    ws = _workspace(tmp_path, recipe)
    r = run_cli("-C", str(ws), "run", "recipes/quick.yaml", "--max-trials", "1", "--budget", "2m", "--quiet",
                timeout=200)
    assert r.returncode == 0, r.stderr
    r = run_cli("-C", str(ws), "promote", "1")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "'reward_mean' is not an eval/<split>/<metric> key" in r.stderr and "Traceback" not in r.stderr


def test_flow_style_train_block_runs_as_a_study(tmp_path):
    flow = _recipe(SMALL_SPACE).replace("train:\n  argv:", "train: {argv:").replace(
        '.jsonl"]\n  lr: 0.001\n  seed: 0\n', '.jsonl"], lr: 0.001, seed: 0}\n')
    assert "train: {argv:" in flow
    ws = _workspace(tmp_path, flow)
    r = run_cli("-C", str(ws), "run", "recipes/quick.yaml", "--strategy", "random", "--max-trials", "3",
                "--budget", "3m", "--quiet", timeout=300)
    assert r.returncode == 0, r.stderr
    trials = _rows(ws, "SELECT * FROM autorl_trials ORDER BY number")
    assert len(trials) == 3 and all(t["status"] == "complete" for t in trials)


def test_trial_starts_are_planned_with_what_trials_took(tmp_path):
    """Before any trial finished, timeout_s plans a start; after, the longest recent trial plus a margin."""
    from autorl.ledger import Ledger
    from autorl.recipe import validate_recipe
    from autorl.trial.controller import PLAN_MARGIN, PLAN_OVERHEAD_S, Controller, RunOptions
    from autorl.workspace import Workspace

    ws = _workspace(tmp_path, _recipe("  lr: {low: 0.0005, high: 0.005, log: true}\n"))
    ctl = Controller(Workspace.open(str(ws), None), RunOptions())
    ctl.ledger = Ledger(ws / "ledger.sqlite")
    ctl.base = validate_recipe({"backend": "command", "train": {"argv": ["true"]}, "timeout_s": 60})
    ctl.study = {"id": ctl.ledger.create_study(name="s", strategy="random")}
    assert ctl.expected_trial_s() == 60
    ctl.opts.budget_s = 90  # a short study still runs the first trials, which tell how long trials take
    assert ctl.expected_trial_s() == 45
    for n, took in enumerate([8.0, 9.0, 0.5], start=1):
        ctl.ledger.add_trial(study_id=ctl.study["id"], number=n, attempt=f"a{n}", started=100.0, finished=100.0 + took,
                             status="complete" if n < 3 else "crash")
    assert ctl.expected_trial_s() == 9.0 * PLAN_MARGIN + PLAN_OVERHEAD_S
    ctl.ledger.add_trial(study_id=ctl.study["id"], number=4, attempt="a4", started=0.0, finished=500.0,
                         status="complete")
    assert ctl.expected_trial_s() == 60  # timeout_s stays the hard limit
