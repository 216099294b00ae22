"""`autorl run --resume` continues with what the study has left of its budget, unless --budget gives it more, and
says which on its first line.

A resume without --budget used to start a fresh hour (the option's default) for what was a 3-minute study, and the
ledger's budget grew by that hour. Now the session runs what is left: the study's budget (every session's, summed,
as the report's "Budget used" reads it) less what its sessions used, each counted from its start to its last trace,
so the pauses between sessions, and promote's runs, are not. Real studies on the command backend (real git, SQLite,
Optuna, the CLI in a child process), and a real ledger for the accounting.
"""

from __future__ import annotations

import re
import sqlite3
import sys
import time
from pathlib import Path

import pytest
import yaml

from autorl.ledger import Ledger
from autorl.study.opening import RESUMED, SESSION_END, budget_left
from tests.conftest import git, run_cli

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "scripts"


def _recipe(ws: Path) -> str:
    """A trial of a fraction of a second that always completes, over a continuous value (never runs out)."""
    argv = [sys.executable, str(SCRIPTS / "fail_above.py"), "--value", "{value}", "--how", "user"]
    recipe = {
        "name": "quick",
        "backend": "command",
        "train": {"argv": [*argv, "--out", "{run_dir}/metrics.jsonl"], "value": 0.5},
        "search": {"value": {"low": 0.1, "high": 0.9}},
        "verdict": {"baseline_repeats": 1, "confirm_runs": 0},
        "timeout_s": 60,
    }
    (ws / "recipes" / "quick.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "quick recipe")
    return "recipes/quick.yaml"


def _run(ws: Path, *args: str, timeout: float = 300) -> list[str]:
    r = run_cli("-C", str(ws), "run", "--strategy", "random", *args, timeout=timeout)
    assert r.returncode == 0, r.stderr + r.stdout
    return r.stdout.splitlines()


def _seconds(text: str) -> float:
    """'1m05s' -> 65 (autorl.budget.format_duration's forms)."""
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"(\d+)([hms])", text))


@pytest.mark.slow
def test_a_bare_resume_runs_what_the_study_has_left_and_says_so_first(command_ws):
    recipe = _recipe(command_ws)
    _run(command_ws, recipe, "--budget", "40s", "--max-trials", "2")
    study = Ledger(command_ws / "ledger.sqlite").study()
    t0 = time.time()
    out = _run(command_ws, "--resume", timeout=120)  # without the fix: an hour, and this times out
    took = time.time() - t0
    first = re.fullmatch(rf"resuming study {study.name}: (\S+) of its 40s budget left", out[0])
    assert first, out[:3]
    left = _seconds(first[1])
    assert 0 < left < 40
    assert any(line.endswith(f"budget {first[1]}, backend command, recipe {recipe}") for line in out), out
    assert took < left + 30, (took, left)  # it stopped at what was left (a trial's length and start-up over it)
    after = Ledger(command_ws / "ledger.sqlite").study()
    assert after.budget_s == 40.0  # nothing added: the report's "Budget used ... of 40s" stays true
    assert budget_left(Ledger(command_ws / "ledger.sqlite"), after) < left
    conn = sqlite3.connect(command_ws / "ledger.sqlite")
    (end,) = conn.execute("SELECT message FROM autorl_events WHERE kind = ? ORDER BY id DESC", [SESSION_END]).fetchone()
    assert "the budget is spent" in end or "more than the" in end, end  # the budget ended it, not the strategy


@pytest.mark.slow
def test_a_resume_with_budget_runs_that_much_more_and_adds_it_to_the_study(command_ws):
    recipe = _recipe(command_ws)
    _run(command_ws, recipe, "--budget", "1m", "--max-trials", "1")
    name = Ledger(command_ws / "ledger.sqlite").study().name
    out = _run(command_ws, "--resume", "--budget", "2m", "--max-trials", "2")
    first = re.fullmatch(
        rf"resuming study {name} for 2m00s \(--budget, added to its 1m00s; the (\S+) it had left stays for a "
        r"`--resume` without --budget\)",
        out[0],
    )
    assert first and 0 < _seconds(first[1]) < 60, out[:3]
    assert any("budget 2m00s, backend command" in line for line in out), out
    assert Ledger(command_ws / "ledger.sqlite").study().budget_s == 180.0  # every session's, summed
    out = _run(command_ws, "--resume", "--max-trials", "3")
    assert re.fullmatch(rf"resuming study {name}: \S+ of its 3m00s budget left", out[0]), out[:3]
    conn = sqlite3.connect(command_ws / "ledger.sqlite")
    kinds = [k for (k,) in conn.execute("SELECT kind FROM autorl_events WHERE kind IN (?, ?)", [RESUMED, SESSION_END])]
    assert kinds == [SESSION_END, RESUMED, SESSION_END, RESUMED, SESSION_END], kinds


def test_what_a_study_has_left_counts_its_sessions_not_the_pauses_between_them(tmp_path):
    """A 10-minute study: its first session ran from its creation to its end at +60 s (its last trial ended at
    +50 s); a promote re-validated at +2000 s; a resume at +3600 s ran a trial to +3630 s and was killed (no end
    recorded). Used: 60 + 30 s; left: 510 s. The pause and the promote are not counted."""
    led = Ledger(tmp_path / "ledger.sqlite")
    t0 = 1_000_000.0
    sid = led.create_study(name="s", recipe_path="r.yaml", recipe="x", budget_s=600.0, created=t0)
    for number, start, end in ((1, t0 + 5, t0 + 20), (2, t0 + 21, t0 + 50), (3, t0 + 3605, t0 + 3630)):
        led.add_trial(study_id=sid, number=number, attempt=f"attempt-{number:02d}-x", started=start, finished=end)
    led.add_trial(
        study_id=sid, number=4, attempt="attempt-04-full-x", kind="full", started=t0 + 2100, finished=t0 + 9e3
    )
    led.close()
    conn = sqlite3.connect(tmp_path / "ledger.sqlite")
    for when, kind in ((t0 + 60, SESSION_END), (t0 + 2000, "revalidation-run"), (t0 + 3600, RESUMED)):
        conn.execute(
            "INSERT INTO autorl_events (time, study_id, kind, message) VALUES (?, ?, ?, ?)", [when, sid, kind, "m"]
        )
    conn.commit()
    conn.close()
    led = Ledger(tmp_path / "ledger.sqlite")
    assert budget_left(led, led.study()) == pytest.approx(600 - 60 - 30)


def test_a_study_with_no_trace_after_its_start_has_its_whole_budget_left(tmp_path):
    led = Ledger(tmp_path / "ledger.sqlite")
    led.create_study(name="s", recipe_path="r.yaml", recipe="x", budget_s=180.0)
    assert budget_left(led, led.study()) == pytest.approx(180.0)
