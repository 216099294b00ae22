"""A study's controller reads the same ledger rows per trial however long the study has run.

A soak (benchmarks/soak.py) measured 0.54 s of controller overhead a trial at the start and 0.94 s after 1,687
trials: the proposer, the planner, the pruner at each intermediate eval and the verdict each re-read and decoded
every trial row of the study. Here a real study runs in this process (real git, SQLite, Optuna TPE, child
processes on the command backend, the noise-aware pruner at every intermediate eval), and the trial rows decoded
from the ledger are counted per trial: the last trials of the study must cost what the first ones did.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml
from conftest import git, run_cli

from autorl import ledger as L
from autorl.present.live import PlainView
from autorl.study.controller import Controller, RunOptions
from autorl.workspace import Workspace

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "data" / "scripts" / "quality.py"
TRIALS = 30


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    shutil.copy(SCRIPT, ws / "quality.py")
    argv = [
        sys.executable,
        "quality.py",
        "--quality",
        "{quality}",
        "--seed",
        "{seed}",
        "--steps",
        "{steps}",
        "--sleep",
        "0",
        "--out",
        "{run_dir}/metrics.jsonl",
    ]
    recipe = {
        "name": "overhead",
        "backend": "command",
        "train": {"argv": argv, "quality": 0.5, "seed": 0, "steps": 4},
        "search": {"quality": {"low": 0.45, "high": 0.55}},
        "verdict": {"baseline_repeats": 2},
        "timeout_s": 60,
    }
    (ws / "recipes" / "overhead.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "overhead recipe")
    return ws


def test_the_rows_a_trial_reads_do_not_grow_with_the_study(tmp_path, monkeypatch):
    ws = _workspace(tmp_path)
    decoded: list[int] = []  # trial rows decoded from the file (every read of a trial row decodes it)
    started: list[int] = []  # len(decoded) as each trial's row is added
    real_decode, real_add = L.rows.decode, L.Ledger.add_trial

    def counted_decode(row: dict):
        decoded.extend([1] if "attempt" in row else [])
        return real_decode(row)

    def counted_add(self, **row):
        started.append(len(decoded))
        return real_add(self, **row)

    for module in (L.store, L.views):  # every read of a trial row decodes it
        monkeypatch.setattr(module, "decode", counted_decode)
    monkeypatch.setattr(L.Ledger, "add_trial", counted_add)
    opts = RunOptions(
        recipe_path=ws / "recipes" / "overhead.yaml",
        budget_s=600,
        max_trials=TRIALS,
        strategy="optuna",
        study_name="overhead",
    )
    summary = Controller(Workspace.open(str(ws), None), opts, PlainView(quiet=True)).run()
    assert summary["trials"] == TRIALS and summary["stopped_by"] is None, summary
    per_trial = [b - a for a, b in zip(started, started[1:] + [len(decoded)])]
    early, late = per_trial[3:10], per_trial[-7:]  # the baseline's two runs apart
    # a trial's own row, read again after each write (a candidate's confirmation adds its row): not the study's
    # rows (before this was kept in memory: 27-51 a trial early on, 97-127 at the end)
    assert max(per_trial) <= 8 and sum(late) <= sum(early) + 6, per_trial
