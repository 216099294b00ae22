"""However a study ends, its clean-up never hides the error that ended it: every step of ``shut_down`` runs
whatever the steps before it did, none raises, and the study's lock is released last. A real study opened on a
real workspace (git, SQLite, Optuna, the command backend); the failures are real ones (a closed database, a
closed view)."""

from __future__ import annotations

import os
import sqlite3
import sys

import pytest
from conftest import git

from autorl.errors import LedgerError
from autorl.present.live import PlainView
from autorl.states import StudyStatus
from autorl.study import recovery
from autorl.study.controller import RunOptions
from autorl.study.opening import open_study
from autorl.workspace import Workspace

RECIPE = f"""name: c
backend: command
train: {{argv: ["{sys.executable}", "-c", "pass"], lr: 0.001}}
search: {{lr: {{low: 1.0e-5, high: 1.0e-1, log: true}}}}
"""


def _study(ws):
    (ws / "recipes" / "c.yaml").write_text(RECIPE)
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "recipe")
    opts = RunOptions(recipe_path=ws / "recipes" / "c.yaml", budget_s=60, strategy="random", study_name="s")
    return open_study(Workspace.open(str(ws), None), opts, PlainView(quiet=True))


def test_a_clean_up_that_fails_at_every_step_raises_nothing_and_still_releases_the_lock(command_ws):
    s = _study(command_ws)
    assert s.ws.study_holder("s")["pid"] == os.getpid()
    s.ledger.db.close()  # every write of the clean-up fails now: marking the study stopped, its event
    s.view.close()
    with pytest.raises(LedgerError, match="closed database"):
        s.ledger.update_study(s.id, status=StudyStatus.STOPPED)
    recovery.shut_down(s, {}, None, RuntimeError("the error that ended the study"))
    assert s.ws.study_holder("s") is None  # the last step ran: `--resume` is not told the study is busy


def test_after_an_ordinary_error_the_study_is_stopped_with_its_reason(command_ws):
    s = _study(command_ws)
    recovery.shut_down(s, {}, None, RuntimeError("the error that ended the study"))
    conn = sqlite3.connect(command_ws / "ledger.sqlite")
    assert conn.execute("SELECT status FROM autorl_studies WHERE name = 's'").fetchone()[0] == "stopped"
    why = conn.execute("SELECT message FROM autorl_events WHERE kind = 'study-stopped'").fetchone()[0]
    assert why == "RuntimeError: the error that ended the study"
    assert s.ws.study_holder("s") is None
