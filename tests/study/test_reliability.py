"""Faults run for real against the real CLI: a second controller of a running study, studies started at once on a
fresh ledger, the ledger removed, moved, replaced and damaged mid-study, kill -9 and a resume at once, a full
disk, odd refs in the repository, the run folder in every state. Each is a fault of benchmarks/reliability.py (the
suite that prints the table with seconds and memory); here each must end as the target says: one line and exit
code 2 (or a clean resume), no trial lost, none duplicated, no process left. Times and memory are the suite's
business, not these tests'."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest
from conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import reliability  # noqa: E402

pytestmark = pytest.mark.slow


def _met(res: reliability.Result) -> None:
    assert res.exit in res.want, (res.exit, res.first_line, res.notes, res.note)
    assert res.lines <= 1 and not res.notes, (res.first_line, res.notes, res.note)
    assert (res.lost, res.dup, res.orphans) == (0, 0, 0), res


# "moved" and "replaced" stay in the suite's table only: tests/test_ledger_file.py pins both on a real ledger in a
# second, and "removed" runs the same watch end to end here.
@pytest.mark.parametrize("fault", ["resume", "three", "removed", "corrupted", "kill9", "hostile-git"])
def test_a_fault_ends_in_one_line_or_a_clean_resume_and_loses_nothing(fault, tmp_path):
    got = reliability.FAULTS[fault](tmp_path)
    for res in got if isinstance(got, list) else [got]:
        _met(res)


def test_the_run_folder_in_any_state_is_one_line(tmp_path):
    for res in reliability.run_dir_states(tmp_path):
        _met(res)
        assert "autorl keeps its run folder there" in res.first_line


def test_a_full_disk_mid_trial_is_one_line_and_a_resume_once_freed_loses_nothing(tmp_path):
    res = reliability.disk_full_mid_study(tmp_path)
    if res.note.startswith("not run"):
        pytest.skip(res.note)
    _met(res)
    assert "no space left on the disk of" in res.first_line and "delete" not in res.first_line


def test_a_study_on_a_full_disk_is_refused_before_anything_is_written(tmp_path):
    res = reliability.disk_full_at_start(tmp_path)
    if res.note.startswith("not run"):
        pytest.skip(res.note)
    _met(res)


def test_a_study_whose_set_up_fails_is_stopped_with_its_reason(workspace):
    """The embedded backend builds its base model in .autorl/runs/prepare; a file there fails the set-up after the
    study's row is written: one line, and the study is stopped (not left running forever), with why."""
    (workspace / ".autorl" / "runs").mkdir(parents=True)
    (workspace / ".autorl" / "runs" / "prepare").write_text("in the way")
    r = run_cli("-C", str(workspace), "run", "--budget", "1m", "--study", "s1")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "prepare" in lines[0], r.stderr
    status = json.loads(run_cli("-C", str(workspace), "status", "--json").stdout)
    assert status["studies"][0]["status"] == "stopped"
    conn = sqlite3.connect(workspace / "ledger.sqlite")
    why = conn.execute("SELECT message FROM autorl_events WHERE kind = 'study-stopped'").fetchall()
    assert len(why) == 1 and "prepare" in why[0][0]
    (workspace / ".autorl" / "runs" / "prepare").unlink()
    r = run_cli("-C", str(workspace), "run", "--resume", "--max-trials", "1", "--set", "steps=2", "--budget", "2m")
    assert r.returncode == 2 and "--set does not apply on --resume" in r.stderr  # the lock was released: no "busy"


def test_status_shows_a_study_no_controller_runs_as_interrupted(tmp_path):
    ws, proc, row = reliability._mid_study(tmp_path)
    live = json.loads(run_cli("-C", str(ws), "status", "--json").stdout)["studies"][0]
    assert live["status"] == "running" and live["controller_pid"] == proc.pid
    proc.kill()
    proc.wait()
    dead = json.loads(run_cli("-C", str(ws), "status", "--json").stdout)["studies"][0]
    assert dead["status"].startswith("interrupted (no controller runs it") and "--resume --study rel" in dead["status"]
    with contextlib.suppress(ProcessLookupError):  # the trial the dead controller left, if it still runs
        os.killpg(row["pid"], 9)
