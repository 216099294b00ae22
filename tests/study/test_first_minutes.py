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
import time
from pathlib import Path

import pytest
from conftest import git, run_cli, tree_digest

from autorl.backends.base import get_backend
from autorl.judge.evidence import Evidence
from autorl.ledger import Ledger
from autorl.present.live import PlainView
from autorl.recipe import validate_recipe
from autorl.runs.slots import Slots
from autorl.search.proposal import Proposal
from autorl.search.proposer import Proposer
from autorl.states import Proposer as By
from autorl.states import TrialStatus
from autorl.study import recovery
from autorl.study.controller import Controller, RunOptions
from autorl.study.state import StudyState
from autorl.workspace import Workspace

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
    r = run_cli(
        "-C",
        str(ws),
        "run",
        "recipes/quick.yaml",
        "--strategy",
        "random",
        "--max-trials",
        "6",
        "--budget",
        "5m",
        "--quiet",
        timeout=300,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert r.returncode == 0, r.stderr
    (ws / ".autorl" / "run.out").write_text(r.stdout)
    return ws


def test_the_run_ends_with_what_was_found_and_the_next_command(small_study):
    out = (small_study / ".autorl" / "run.out").read_text()
    # a command-backend recipe with no probe set is told, first, that the hack gate cannot see a loophole
    assert out.startswith("warning: the hack gate is blind")
    tail = out[out.rindex("\nstudy ") :].strip().splitlines()
    assert tail[0].startswith("study quick-") and " 6 trials in " in tail[0]
    assert any(x.startswith("Found: ") for x in tail) and any(x.startswith("Next: ") for x in tail)
    assert any(x.startswith("Crashes: ") for x in tail)
    git_line = " ".join(x.strip() for x in tail[next(i for i, x in enumerate(tail) if x.startswith("Git: ")) :])
    assert git_line.startswith("Git: the study's trials left 6 branches and 12 tags")
    assert "autorl clean --dry-run" in git_line
    assert max(len(x) for x in tail) <= 80 and "{" not in "\n".join(tail)


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
        "--- a/crash_high_lr.py\n+++ b/crash_high_lr.py\n@@ -1,1 +1,1 @@\n-no such line\n+still none\n"
    )
    (ws / "hypotheses").mkdir(exist_ok=True)
    (ws / "hypotheses" / "h99-stale-patch.md").write_text(
        "---\nid: h99-stale-patch\ntitle: A patch that no longer applies\npriority: high\n"
        "symptoms: [flat_learning, stable_low_accuracy, grad_vanishing]\npatch: patches/stale.patch\n"
        "overrides: {lr: 0.002}\nsuccess: {confirm: c, refute: r}\n---\nbody\n"
    )
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "a stale patch")
    r = run_cli(
        "-C", str(ws), "run", "recipes/quick.yaml", "--max-trials", "4", "--budget", "5m", "--quiet", timeout=300
    )
    assert r.returncode == 0, r.stderr
    trials = _rows(ws, "SELECT * FROM autorl_trials ORDER BY number")
    stale = [t for t in trials if t["hypothesis"] == "h99-stale-patch"]
    assert stale and stale[0]["verdict"] == "crash" and "does not apply" in stale[0]["reason"]
    assert len(trials) == 4  # the study went on after it


def test_promote_needs_an_eval_objective(tmp_path):
    recipe = _recipe("  lr: {low: 0.0005, high: 0.005, log: true}\n", "objective: {metric: reward_mean}\n")
    ws = _workspace(tmp_path, recipe)
    r = run_cli(
        "-C", str(ws), "run", "recipes/quick.yaml", "--max-trials", "1", "--budget", "2m", "--quiet", timeout=200
    )
    assert r.returncode == 0, r.stderr
    r = run_cli("-C", str(ws), "promote", "1")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "'reward_mean' is not an eval/<split>/<metric> key" in r.stderr and "Traceback" not in r.stderr


def test_flow_style_train_block_runs_as_a_study(tmp_path):
    flow = (
        _recipe(SMALL_SPACE)
        .replace("train:\n  argv:", "train: {argv:")
        .replace('.jsonl"]\n  lr: 0.001\n  seed: 0\n', '.jsonl"], lr: 0.001, seed: 0}\n')
    )
    assert "train: {argv:" in flow
    ws = _workspace(tmp_path, flow)
    r = run_cli(
        "-C",
        str(ws),
        "run",
        "recipes/quick.yaml",
        "--strategy",
        "random",
        "--max-trials",
        "3",
        "--budget",
        "3m",
        "--quiet",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    trials = _rows(ws, "SELECT * FROM autorl_trials ORDER BY number")
    assert len(trials) == 3 and all(t["status"] == "complete" for t in trials)


def _planning_controller(ws: Path, budget_s: float = 600) -> Controller:
    """A controller on a real ledger, study and proposer, without running the loop."""
    ctl = Controller(Workspace.open(str(ws), None), RunOptions(budget_s=budget_s, strategy="random"))
    ledger = Ledger(ws / "ledger.sqlite")
    base = validate_recipe(
        {
            "backend": "command",
            "train": {"argv": ["true"], "steps": 10, "gens": 8, "lr": 1e-3},
            "search": {"gens": {"choices": [4, 8, 16]}, "lr": {"low": 1e-5, "high": 1e-1}},
            "timeout_s": 60,
        }
    )
    row = ledger.study(study_id=ledger.create_study(name="s", strategy="random", optuna_study="s"))
    proposer = Proposer(ctl.ws, ledger, row, base, ctl.opts)
    ctl.s = StudyState(
        ctl.ws,
        ctl.opts,
        PlainView(quiet=True),
        ledger,
        row,
        base,
        "",
        "recipes/r.yaml",
        get_backend("command"),
        proposer,
        proposer.records,
        Evidence(proposer.records),
    )
    ctl.slots = Slots(1, None)  # what the loop's opening makes: one local slot
    return ctl


def _finished(ctl: Controller, n: int, gens: int, took: float, status: TrialStatus = TrialStatus.COMPLETE) -> None:
    ctl.s.ledger.add_trial(
        study_id=ctl.s.id,
        number=n,
        attempt=f"a{n}",
        started=100.0,
        finished=100.0 + took,
        status=status,
        params={"argv": ["true"], "steps": 10, "gens": gens, "lr": 1e-3},
    )


def test_trial_starts_are_planned_from_what_the_next_trial_is(tmp_path):
    """Before any trial finished, timeout_s (or half the budget); after, the study's durations scaled by the next
    trial's work: one large trial does not make every later small one reserve its time."""
    ctl = _planning_controller(_workspace(tmp_path, _recipe("  lr: {low: 0.0005, high: 0.005, log: true}\n")))
    assert ctl.expected_trial_s() == 60
    ctl.opts.budget_s = 90  # a short study still runs the first trials, which tell how long trials take
    assert ctl.expected_trial_s() == 45
    for n in range(1, 5):
        _finished(ctl, n, 8, 10.0)
    _finished(ctl, 5, 16, 20.0)
    _finished(ctl, 6, 16, 0.5, status=TrialStatus.CRASH)  # a crash's time says nothing about a full trial's
    small = Proposal(By.RANDOM, {"gens": 4}, "", "g4")
    large = Proposal(By.RANDOM, {"gens": 16}, "", "g16")
    assert ctl.expected_trial_s() == pytest.approx(12.0)  # the baseline's values: gens 8
    assert ctl.expected_trial_s(large) == pytest.approx(22.0)
    assert ctl.expected_trial_s(small) == pytest.approx(7.0)  # 10 s = 0 + 1.25 s per gen, fitted
    _finished(ctl, 7, 8, 500.0)
    assert ctl.expected_trial_s() == 60  # timeout_s stays the hard limit of a trial the recipe's size
    huge = Proposal(By.RANDOM, {"gens": 64}, "", "g64")
    assert 60 < ctl.expected_trial_s(huge) <= 480  # eight times the work: up to eight times the limit


def test_a_proposal_that_does_not_fit_is_not_started_and_not_lost(tmp_path):
    """Its Optuna trial is told FAIL (never left RUNNING) and its values are enqueued for the next ask; no trial row."""
    ctl = _planning_controller(_workspace(tmp_path, _recipe("  lr: {low: 0.0005, high: 0.005, log: true}\n")))
    for n in range(1, 4):
        _finished(ctl, n, 8, 10.0)
    search = ctl.s.proposer.search()
    number, params = search.ask(ctl.s.base.search)
    ctl.s.proposer.pending.append(
        Proposal(By.RANDOM, params, "sampled", "next", optuna_study=search.name, optuna_number=number)
    )
    ctl.launched, ctl.done_before, ctl.deadline = 0, 3, time.time() + 3.0  # 3 s left, at least 7 s planned
    assert ctl._fill({}, ctl._slots()) == 0 and ctl._fill({}, ctl._slots()) == 0
    assert len(ctl.s.proposer.pending) == 1 and len(ctl.s.records.trials()) == 3
    ended = ctl._why_ended()  # the run's last line says why a study with budget left ended
    assert ended.startswith("the next trial (next) is planned at ") and "left of the budget" in ended
    assert "--allow-overrun" in ended
    recovery.release_unstarted(ctl.s)
    assert ctl.s.proposer.pending == []
    states = {t.number: (t.state.name, t.params) for t in search.study.get_trials(deepcopy=False)}
    assert states[number] == ("FAIL", params)
    assert search.ask(ctl.s.base.search)[1] == params  # the next ask (a resume's) proposes it again
    events = [e for e in ctl.s.ledger.events(ctl.s.id) if e.kind in ("budget", "not-started")]
    assert [e.kind for e in events] == ["not-started", "budget"]  # newest first; the hold logged once
    assert "next not started: planned at" in events[1].message and "enqueued" in events[0].message
