"""Work queued when a study stops is run on `autorl run --resume`, and a baseline that needed a reduced OOM retry
changes the recipe later trials start from.

Real studies on the command backend (real git, SQLite, Optuna, child processes): a study is stopped by its trial
limit right after a candidate or a crash, while that trial's confirmation runs or retry are still queued; the
resumed study runs them first, with their links to the trial they confirm or retry.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from autorl.ledger import Ledger
from autorl.states import Confirmation

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "scripts"


def _recipe(ws: Path, name: str, script: str, args: list[str], train: dict, search: dict, verdict: dict) -> str:
    argv = [sys.executable, str(SCRIPTS / script), *args, "--out", "{run_dir}/metrics.jsonl"]
    recipe = {
        "name": name,
        "backend": "command",
        "train": {"argv": argv, **train},
        "search": search,
        "verdict": {"baseline_repeats": 1, **verdict},
        "timeout_s": 60,
    }
    (ws / "recipes" / f"{name}.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return f"recipes/{name}.yaml"


def _run(ws: Path, *args: str) -> str:
    r = run_cli("-C", str(ws), "run", "--budget", "10m", "--strategy", "random", "--seed", "0", *args, timeout=300)
    assert r.returncode == 0, r.stderr + r.stdout
    return r.stdout


def _rows(ws: Path) -> list[dict]:
    conn = sqlite3.connect(ws / "ledger.sqlite")
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute("SELECT * FROM autorl_trials ORDER BY number")]
    for r in rows:
        r["changed"], r["params"] = json.loads(r["changed"] or "{}"), json.loads(r["params"] or "{}")
    return rows


def _events(ws: Path, kind: str) -> list[str]:
    conn = sqlite3.connect(ws / "ledger.sqlite")
    return [r[0] for r in conn.execute("SELECT message FROM autorl_events WHERE kind = ? ORDER BY id", [kind])]


def test_a_candidate_left_unconfirmed_by_a_stop_is_confirmed_first_on_resume(command_ws):
    """fake_oom.py scores more eval items the smaller the micro-batch (never over its limit here): the trial at
    1 is improved over the baseline at 9. The study stops (trial limit) before its two confirmation runs start."""
    recipe = _recipe(
        command_ws,
        "small-mb",
        "fake_oom.py",
        ["--micro-batch", "{micro_batch}", "--limit", "99"],
        {"micro_batch": 9},
        {"micro_batch": {"choices": [1, 9]}},
        {"confirm_runs": 2},
    )
    _run(command_ws, recipe, "--max-trials", "2")
    base, candidate = _rows(command_ws)
    assert candidate["verdict"] == "improved" and candidate["confirmation"] == "candidate", candidate
    unstarted = _events(command_ws, "not-started")
    assert len(unstarted) == 2 and all(f"confirm-{candidate['number']:02d}" in m for m in unstarted), unstarted

    out = _run(command_ws, "--resume", "--max-trials", "5")
    assert "resume: 2 queued run(s)" in out
    assert Ledger(command_ws / "ledger.sqlite").study().budget_s == 1200  # each session's 10m, summed
    rows = _rows(command_ws)
    first, second, later = rows[2:]
    for k, run in enumerate((first, second)):
        assert (run["proposer"], run["confirms"], run["parent"]) == ("confirm", candidate["number"], None), run
        assert run["changed"] == {**candidate["changed"], "seed": 1000 + 10 * candidate["number"] + k}
        assert run["status"] == "complete"
    # new work only after the queued runs: with both micro-batches tried, the search can only repeat one of them,
    # and a seed-only repeat of the baseline's values is one more baseline run
    assert later["confirms"] is None and later["started"] >= second["finished"]
    assert later["proposer"] == "random" or (later["proposer"] == "baseline" and "deliberate repeat" in later["why"])
    done = Ledger(command_ws / "ledger.sqlite").trial(candidate["number"])
    assert done.confirmation == Confirmation.CONFIRMED, done
    assert "confirmed: 2 fresh-seed runs" in done.reason


def test_a_confirmation_run_stopped_by_ctrl_c_is_run_again_on_resume(command_ws):
    """SIGINT while the first confirmation run is training: it is recorded interrupted, the second is not started;
    on resume both run (the interrupted one with its own seed again), and only runs that ran judge the candidate."""
    recipe = _recipe(
        command_ws,
        "slow",
        "fake_oom.py",
        ["--micro-batch", "{micro_batch}", "--limit", "99", "--sleep", "3"],
        {"micro_batch": 9},
        {"micro_batch": {"choices": [1, 9]}},
        {"confirm_runs": 2},
    )
    cmd = [
        sys.executable,
        "-m",
        "autorl.cli",
        "-C",
        str(command_ws),
        "run",
        recipe,
        "--budget",
        "10m",
        "--strategy",
        "random",
        "--seed",
        "0",
        "--max-trials",
        "4",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(command_ws, "SELECT 1 FROM autorl_trials WHERE proposer = 'confirm' AND status = 'running'")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 130), err + out
    base, candidate, stopped = _rows(command_ws)
    assert (stopped["proposer"], stopped["status"], stopped["confirms"]) == ("confirm", "interrupted", 2), stopped
    assert Ledger(command_ws / "ledger.sqlite").trial(2).confirmation == Confirmation.CANDIDATE

    _run(command_ws, "--resume", "--max-trials", "5")
    again, second = _rows(command_ws)[3:]
    assert again["seed"] == stopped["seed"] and second["seed"] == stopped["seed"] + 1
    assert all(r["confirms"] == 2 and r["status"] == "complete" for r in (again, second))
    done = Ledger(command_ws / "ledger.sqlite").trial(2)
    assert done.confirmation == Confirmation.CONFIRMED and "2 fresh-seed runs" in done.reason, done.reason


def _wait_for(ws: Path, sql: str, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if (ws / "ledger.sqlite").exists():
            conn = sqlite3.connect(ws / "ledger.sqlite")
            try:
                if conn.execute(sql).fetchone():
                    return
            except sqlite3.OperationalError:  # the tables are not there yet
                pass
            finally:
                conn.close()
        time.sleep(0.1)
    raise AssertionError(f"nothing matched {sql!r} within {timeout_s} s")


def test_a_crash_whose_retry_was_queued_when_the_study_stopped_is_retried_first_on_resume(command_ws):
    """Values above 1 cannot reach the reward server (a real ECONNREFUSED): triage queues one retry with the same
    values, but the trial limit stops the study first. The resumed study runs that retry, linked to the crash."""
    recipe = _recipe(
        command_ws,
        "net",
        "fail_above.py",
        ["--value", "{value}", "--how", "network"],
        {"value": 0.5},
        {"value": {"low": 2.0, "high": 3.0}},
        {},
    )
    _run(command_ws, recipe, "--max-trials", "2")
    base, crashed = _rows(command_ws)
    assert crashed["crash_category"] == "network_unavailable" and crashed["crash_action"] == "retry_once", crashed
    assert any("retry-" in m for m in _events(command_ws, "not-started"))

    _run(command_ws, "--resume", "--max-trials", "3")
    retry = _rows(command_ws)[2]
    assert (retry["proposer"], retry["retry_of"]) == ("retry", crashed["number"]), retry
    assert retry["changed"] == crashed["changed"]
    assert retry["crash_action"] == "record"  # crashed again: one retry only, whatever the resumes
    _run(command_ws, "--resume", "--max-trials", "4")
    assert [r["retry_of"] for r in _rows(command_ws)].count(crashed["number"]) == 1


def test_a_crashed_baseline_stopped_before_its_retry_is_retried_on_resume_and_the_study_goes_on(command_ws):
    """The reward server is down on the first run only: the baseline crashes, the study is stopped before its
    retry; on resume the retry runs first, stands in for the baseline, and trials are judged against it."""
    marker = command_ws / "first-run-done"
    recipe = _recipe(
        command_ws,
        "net-base",
        "fail_above.py",
        ["--value", "{value}", "--how", "network", "--fail-first", str(marker)],
        {"value": 0.5},
        {"value": {"low": 0.1, "high": 0.9}},
        {},
    )
    _run(command_ws, recipe, "--max-trials", "1")
    (base,) = _rows(command_ws)
    assert base["proposer"] == "baseline" and base["crash_action"] == "retry_once"

    _run(command_ws, "--resume", "--max-trials", "3")
    _, retry, trial = _rows(command_ws)
    assert (retry["proposer"], retry["retry_of"], retry["status"]) == ("retry", base["number"], "complete")
    assert trial["status"] == "complete" and trial["verdict"] in ("improved", "regressed", "flat"), trial
    assert "no completed baseline" not in trial["reason"]
    assert "base recipe" not in (retry["reason"] or "")  # an unchanged retry carries nothing into the base
    assert Ledger(command_ws / "ledger.sqlite").study().base_changes is None


def test_a_baseline_that_needed_a_smaller_micro_batch_changes_the_base_recipe_of_later_trials(command_ws):
    """fake_oom.py prints PyTorch's CUDA OOM above micro-batch 4. The recipe as written (8) OOMs; its reduced
    retry (4) works, so the study's base recipe carries micro_batch 4: the second baseline seed and every later
    trial run at 4 and none OOMs at 8 again, also after a resume; the retry's reason and the study say so."""
    recipe = _recipe(
        command_ws,
        "oom-base",
        "fake_oom.py",
        ["--micro-batch", "{micro_batch}", "--steps", "{steps}"],
        {"micro_batch": 8, "steps": 4},
        {"steps": {"choices": [4, 5, 6, 7]}},
        {"baseline_repeats": 2},
    )
    _run(command_ws, recipe, "--max-trials", "5")
    base, retry, repeat, *trials = _rows(command_ws)
    assert base["crash_category"] == "cuda_oom" and base["crash_action"] == "retry_reduced"
    assert retry["retry_of"] == base["number"] and retry["changed"] == {"micro_batch": 4}
    assert "the study's base recipe now has micro_batch=4" in retry["reason"], retry["reason"]
    assert "instead of micro_batch=8" in retry["reason"]
    assert repeat["proposer"] == "baseline" and repeat["changed"] == {"seed": 1}
    assert len(trials) == 2 and all("micro_batch" not in t["changed"] for t in trials)  # the base itself has 4 now
    assert all(t["status"] == "complete" and t["params"]["micro_batch"] == 4 for t in [repeat, *trials]), trials
    study = Ledger(command_ws / "ledger.sqlite").study()
    assert study.base_changes == {"micro_batch": 4}
    (line,) = _events(command_ws, "base-recipe")
    assert retry["attempt"] in line and base["attempt"] in line

    _run(command_ws, "--resume", "--max-trials", "6")
    resumed = _rows(command_ws)[5]
    assert resumed["status"] == "complete" and resumed["params"]["micro_batch"] == 4, resumed
    assert [r["proposer"] for r in _rows(command_ws)].count("retry") == 1
