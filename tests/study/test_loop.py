"""The trial loop end to end: real git, real SQLite, real Optuna, real engine runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import git, run_cli, tree_digest

pytestmark = pytest.mark.slow

# Short trials: the loop, not the learning, is under test here.
FAST = ["--set", "steps=8", "--set", "eval_every=4", "--set", "batch_prompts=16", "--set", "verdict.baseline_repeats=2"]


def _ledger(ws: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(ws / "ledger.sqlite")
    conn.row_factory = sqlite3.Row
    return conn


def _trials(ws: Path) -> list[dict]:
    return [dict(r) for r in _ledger(ws).execute("SELECT * FROM autorl_trials ORDER BY number")]


def test_run_end_to_end(workspace):
    """`autorl run --budget 2m` completes >= 3 real trials, commit-scoped, user tree untouched."""
    (workspace / "notes.txt").write_text("the user's uncommitted work\n")
    before = tree_digest(workspace)
    r = run_cli("-C", str(workspace), "run", "--budget", "2m", "--strategy", "optuna", *FAST, timeout=400)
    assert r.returncode == 0, r.stderr + r.stdout
    assert tree_digest(workspace) == before
    trials = _trials(workspace)
    done = [t for t in trials if t["status"] in ("complete", "pruned", "crash")]
    assert len(done) >= 3, trials
    assert [t["proposer"] for t in trials[:2]] == ["baseline", "baseline"]
    judged = [t for t in done[2:] if t["proposer"] != "confirm"]
    assert all(t["verdict"] in ("improved", "regressed", "flat", "pruned", "crash") for t in judged)
    # a confirmation run (a quiet machine gets that far in 2 minutes) is judged with its candidate, not alone
    candidates = {t["number"] for t in trials if t["verdict"] == "improved"}
    assert all(t["verdict"] is None and t["confirms"] in candidates for t in done[2:] if t["proposer"] == "confirm")
    for t in done:
        assert git(workspace, "rev-parse", t["start_tag"]) == t["start_sha"]
        assert git(workspace, "rev-parse", t["end_tag"]) == t["end_sha"]
        assert git(workspace, "branch", "--list", t["branch"]).strip()
        assert not (workspace / ".autorl" / "worktrees" / t["attempt"]).exists()
    for t in (t for t in done if t["status"] == "complete"):  # when its start-up ended (the planner keeps it fixed)
        assert t["started"] < t["first_step"] < t["finished"]
    third = done[2]
    diff = git(workspace, "diff", trials[0]["start_tag"], third["start_tag"])
    changed = json.loads(third["changed"])
    for key in changed:
        assert f"+  {key}:" in diff
    assert diff.count("\n+  ") == len(changed)
    results = git(workspace, "show", f"{third['end_tag']}:results/{third['attempt']}.json")
    assert json.loads(results)["verdict"] == third["verdict"]
    log = git(workspace, "show", f"{third['end_tag']}:research_log.md")
    assert third["attempt"] in log
    conn = _ledger(workspace)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT count(*) FROM trials").fetchone()[0] >= 1  # Optuna's own table
    out = run_cli("-C", str(workspace), "ledger", "--json")
    assert out.returncode == 0 and len(json.loads(out.stdout)) == len(trials)
    show = run_cli("-C", str(workspace), "show", str(third["number"]), "--json")
    assert json.loads(show.stdout)["diff_vs_baseline"].strip() == diff.strip()


def _as_from_a_terminal() -> None:
    """SIGHUP at its default, as under a terminal: a suite run under nohup would hand the child an ignored SIGHUP,
    which autorl rightly leaves ignored."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _start_run(ws: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "autorl.cli", "-C", str(ws), "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_from_a_terminal,
    )


def _wait_running(ws: Path, timeout: float = 120) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (ws / "ledger.sqlite").exists():
            try:
                rows = [t for t in _trials(ws) if t["status"] == "running" and t["pid"]]
            except sqlite3.OperationalError:
                rows = []
            if rows:
                return rows[0]
        time.sleep(0.2)
    raise AssertionError("no trial started running")


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_kill9_then_resume(workspace):
    """kill -9 mid-trial, then --resume: no trial lost or duplicated, orphan gone, numbers continue."""
    proc = _start_run(workspace, "--budget", "10m", "--strategy", "optuna", *FAST, "--set", "steps=200")
    row = _wait_running(workspace)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _alive(row["pid"])  # the trial's process group outlives the controller
    r = run_cli("-C", str(workspace), "run", "--resume", "--strategy", "random", "--budget", "1m", timeout=60)
    assert r.returncode == 2 and "uses --strategy optuna" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_cli("-C", str(workspace), "run", "--resume", "--set", "lr=1e-4", "--budget", "1m", timeout=60)
    assert r.returncode == 2 and "--set does not apply on --resume" in r.stderr
    # --max-trials counts the study's trials: the interrupted one, plus one more
    r = run_cli("-C", str(workspace), "run", "--resume", "--budget", "3m", "--max-trials", "2", timeout=300)
    assert r.returncode == 0, r.stderr
    time.sleep(0.5)
    assert not _alive(row["pid"])
    trials = _trials(workspace)
    numbers = [t["number"] for t in trials]
    assert numbers == sorted(set(numbers)) and numbers[0] == 1
    killed = next(t for t in trials if t["number"] == row["number"])
    assert killed["status"] == "interrupted"
    assert killed["duration_s"] > 1.0 and killed["finished"] == pytest.approx(killed["started"] + killed["duration_s"])
    assert trials[-1]["number"] == row["number"] + 1
    assert trials[-1]["status"] in ("complete", "crash", "pruned")
    assert _ledger(workspace).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert not any(t["status"] == "running" for t in trials)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_a_schedulers_stop_or_a_closed_terminal_stops_the_study_cleanly(workspace, stop):
    """Ctrl-C, SIGTERM (a scheduler) and SIGHUP (the terminal closed) alike: the running trial is ended and recorded
    interrupted, the controller exits 130, nothing is left running."""
    proc = _start_run(workspace, "--budget", "10m", "--strategy", "random", *FAST, "--set", "steps=200")
    row = _wait_running(workspace)
    time.sleep(1.0)
    proc.send_signal(stop)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    time.sleep(0.3)
    assert not _alive(row["pid"])
    trial = next(t for t in _trials(workspace) if t["number"] == row["number"])
    assert trial["status"] == "interrupted" and trial["end_tag"]


def test_a_budget_never_overruns_by_more_than_a_trial(workspace):
    start = time.time()
    r = run_cli(
        "-C",
        str(workspace),
        "run",
        "--budget",
        "25s",
        "--allow-overrun",
        "--strategy",
        "random",
        *FAST,
        "--set",
        "timeout_s=20",
        timeout=200,
    )
    assert r.returncode == 0, r.stderr
    assert time.time() - start < 25 + 20 + 15  # budget + one trial timeout + start-up slack


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "--budget", "soon"], "budget 'soon' is not a duration"),
        (["run", "--set", "learning_rate=1"], "unknown key 'train.learning_rate'"),
        (["run", "--set", "search.lr.low=1"], "swap them"),
        (["run", "--set", "search.warmup.low=1", "--set", "search.warmup.high=2"], "search names 'warmup'"),
        (["--ledger", "/nonexistent/dir/ledger.sqlite", "run"], "does not exist"),
        (["run", "recipes/missing.yaml"], "not found"),
        (["run", "--set", "gens=6"], "train.gens is 6, which is not among search.gens choices [4, 8, 16]: add it"),
        (["run", "--set", "lr=inf"], "train.lr is inf: give a finite number"),
        (["run", "--set", "lr=.nan"], "train.lr"),
        (["run", "--set", "steps=0"], "train.steps is 0: a run needs at least 1"),
        (["run", "--set", "steps=-3"], "train.steps"),
        (["run", "--resume"], "no ledger at"),
        (["run", "--set", "learning_rate=1"], "`autorl recipe keys` lists them"),
        (["train", "recipes/default.yaml", "--set", "lr=inf", "--dry-run"], "train.lr is inf"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(workspace, args, needle):
    _assert_refused(workspace, args, needle)


def _assert_refused(workspace: Path, args: list[str], needle: str) -> None:
    """Exit 2, one line naming the problem, no traceback, and nothing written: no ledger, no refs, no tree change."""
    before = tree_digest(workspace)
    refs = git(workspace, "for-each-ref")
    autorl_dir = sorted(p.name for p in (workspace / ".autorl").iterdir())
    r = run_cli("-C", str(workspace), *args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (workspace / "ledger.sqlite").exists()
    assert tree_digest(workspace) == before and git(workspace, "for-each-ref") == refs
    assert sorted(p.name for p in (workspace / ".autorl").iterdir()) == autorl_dir


def test_bad_hypothesis_file_stops_the_study_before_anything_is_written(workspace):
    (workspace / "hypotheses").mkdir(exist_ok=True)
    (workspace / "hypotheses" / "h99-mine.md").write_text("---\nid: h99-mine\ntitle: [unclosed\n---\nbody\n")
    _assert_refused(workspace, ["run", "--budget", "1m"], "h99-mine.md line")
    (workspace / "hypotheses" / "h99-mine.md").write_text(
        "---\nid: h99-mine\ntitle: t\npriority: high\nsymptoms: [flat_learning]\npatch: patches/nope.patch\n"
        "success: {confirm: c, refute: r}\n---\nb\n"
    )
    _assert_refused(workspace, ["run", "--budget", "1m"], "field 'patch'")


def test_train_dry_run_writes_nothing(workspace):
    shutil.rmtree(workspace / ".autorl")
    r = run_cli("-C", str(workspace), "train", "recipes/default.yaml", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert "engine_config.json" in " ".join(plan["argv"]) and str(workspace / ".autorl" / "train") in plan["log_path"]
    assert not (workspace / ".autorl").exists()


def test_recipe_keys_lists_the_train_keys():
    r = run_cli("recipe", "keys")
    assert r.returncode == 0, r.stderr
    assert "lr (default 0.0001)" in r.stdout and "eps_clip (default 0.2)" in r.stdout
    r = run_cli("recipe", "keys", "--backend", "nope")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_not_a_git_repository(tmp_path):
    r = run_cli("-C", str(tmp_path), "run", "--budget", "1m")
    assert r.returncode == 2 and "not a git repository" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_trial_ran_until_its_last_write_not_until_the_resume(tmp_path):
    """A run the controller's death stopped is recorded as having run until the last write in its run folder: on two
    H200s eight such runs read "0s" in `autorl ledger` after two minutes of real work, and their end was the resume's
    time, which may be days later."""
    from autorl.runs.watch import last_seen

    run = tmp_path / "runs" / "attempt-09-x"
    run.mkdir(parents=True)
    log = run / "train.log"
    log.write_text("step 1\n")
    (run / "train.log.times").write_text("0\t1.0\n")
    started = time.time() - 600
    os.utime(log, (started + 95, started + 95))
    os.utime(run / "train.log.times", (started + 121, started + 121))
    assert last_seen(str(log), started) == pytest.approx(started + 121)
    assert last_seen(str(tmp_path / "gone" / "train.log"), started) == started  # nothing written: no time run
    assert last_seen(None, started) == started and last_seen(str(log), None) is None
