"""Crash actions end to end: real `autorl run` studies on the command backend with a script that
really fails (ECONNREFUSED, IndexError, ENOSPC on a small private tmpfs), then the ledger's
events and `autorl triage` show what was done and why.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "data" / "scripts" / "fail_above.py"


@pytest.fixture
def ws(command_ws) -> Path:
    return command_ws


def _recipe(ws: Path, how: str, base: float, space: dict, extra: list[str] = ()) -> str:
    argv = [sys.executable, str(SCRIPT), "--value", "{value}", "--how", how, "--out", "{run_dir}/metrics.jsonl", *extra]
    recipe = {
        "name": f"fail-{how}",
        "backend": "command",
        "train": {"argv": argv, "value": base},
        "search": {"value": space},
        "verdict": {"baseline_repeats": 1},
        "timeout_s": 60,
    }
    (ws / "recipes" / f"{how}.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return f"recipes/{how}.yaml"


def _study(ws: Path, recipe: str, trials: int) -> subprocess.CompletedProcess:
    return run_cli(
        "-C",
        str(ws),
        "run",
        recipe,
        "--budget",
        "10m",
        "--strategy",
        "random",
        "--seed",
        "0",
        "--max-trials",
        str(trials),
        timeout=300,
    )


def _rows(ws: Path, sql: str) -> list[dict]:
    conn = sqlite3.connect(ws / "ledger.sqlite")
    conn.row_factory = sqlite3.Row
    return [dict(r) for r in conn.execute(sql)]


def _actions(ws: Path) -> list[str]:
    return [
        e["message"] for e in _rows(ws, "SELECT message FROM autorl_events WHERE kind = 'crash-action' ORDER BY id")
    ]


def test_network_error_is_retried_once_unchanged_then_recorded(ws):
    r = _study(ws, _recipe(ws, "network", 0.5, {"low": 2.0, "high": 3.0}), trials=3)
    assert r.returncode == 0, r.stderr + r.stdout
    base, crashed, retry = _rows(ws, "SELECT * FROM autorl_trials ORDER BY number")
    assert base["status"] == "complete" and crashed["crash_category"] == "network_unavailable", crashed
    assert retry["proposer"] == "retry" and retry["retry_of"] == crashed["number"]
    assert json.loads(retry["changed"]) == json.loads(crashed["changed"])  # same values
    assert retry["crash_category"] == "network_unavailable"
    first, second = _actions(ws)
    assert ": retry_once: network_unavailable" in first and ": record: network_unavailable again" in second
    (group,) = json.loads(run_cli("-C", str(ws), "triage", "--json").stdout)
    assert any(a.startswith("retry_once:") for a in group["actions"]), group["actions"]
    assert any(a.startswith(f"retried as {retry['attempt']}") for a in group["actions"])
    shown = run_cli("-C", str(ws), "triage", str(crashed["number"])).stdout
    assert "done: retry_once: network_unavailable" in shown


def test_user_code_error_in_the_baseline_stops_the_study_with_one_line(ws):
    r = _study(ws, _recipe(ws, "user", 5.0, {"low": 0.1, "high": 0.5}), trials=3)
    assert r.returncode == 1, r.stderr + r.stdout
    (base,) = _rows(ws, "SELECT * FROM autorl_trials")
    assert base["crash_category"] == "user_code_error" and "IndexError" in base["root_cause"]
    (action,) = _actions(ws)
    assert ": stop: user_code_error in the baseline" in action
    study_line = " ".join(r.stdout.split("\nstudy ")[-1].split("\n\n")[0].split())  # the study's summary, unwrapped
    assert "ended:" in study_line and "every trial would fail" in study_line, r.stdout


def test_a_transient_baseline_crash_is_retried_once_and_the_study_goes_on(ws):
    """The baseline's reward server is down on its first run only (ECONNREFUSED, a marker file makes the
    second run work): triage retries it unchanged, the retry stands in for the baseline, trials follow."""
    marker = ws / "first-run-done"
    r = _study(ws, _recipe(ws, "network", 0.5, {"low": 0.1, "high": 0.9}, ["--fail-first", str(marker)]), trials=4)
    assert r.returncode == 0, r.stderr + r.stdout
    base, retry, *trials = _rows(ws, "SELECT * FROM autorl_trials ORDER BY number")
    assert base["proposer"] == "baseline" and base["crash_category"] == "network_unavailable", base
    assert retry["proposer"] == "retry" and retry["retry_of"] == base["number"] and retry["status"] == "complete"
    assert json.loads(retry["changed"]) == json.loads(base["changed"])  # the recipe as written, again
    assert retry["verdict"] is None  # the baseline is the reference, not judged against itself
    assert len(trials) == 2 and all(t["status"] == "complete" and t["verdict"] for t in trials), trials
    assert all("no completed baseline" not in (t["reason"] or "") for t in trials)
    (action,) = _actions(ws)
    assert ": retry_once: network_unavailable" in action
    assert action.endswith("the baseline is retried before the study goes on"), action


def test_a_baseline_crash_that_stays_after_its_retry_ends_the_study_with_one_line(ws):
    r = _study(ws, _recipe(ws, "network", 5.0, {"low": 0.1, "high": 0.9}), trials=4)
    assert r.returncode == 1, r.stderr + r.stdout  # a study that could measure nothing is no success
    base, retry = _rows(ws, "SELECT * FROM autorl_trials ORDER BY number")
    assert (base["crash_category"], retry["crash_category"]) == ("network_unavailable", "network_unavailable")
    assert retry["retry_of"] == base["number"]
    first, second = _actions(ws)
    assert "the baseline is retried" in first
    assert ": record: network_unavailable again after 1 retry" in second
    assert second.endswith("the baseline failed, so the study ends here"), second


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare for a private tmpfs")
def test_disk_full_stops_the_study_naming_the_volume_and_its_free_space(ws):
    """The study runs in a private mount namespace where ws/vol is a 256 KiB tmpfs (never the real disk)."""
    vol = ws / "vol"
    vol.mkdir()
    recipe = _recipe(ws, "disk", 0.5, {"low": 2.0, "high": 3.0}, ["--ckpt-dir", str(vol)])
    probe = subprocess.run(
        ["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(vol)], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip("no private tmpfs mount here")
    cmd = 'mount -t tmpfs -o size=256k tmpfs "$1" && shift && exec "$@"'
    r = subprocess.run(
        [
            "unshare",
            "-rm",
            "sh",
            "-c",
            cmd,
            "sh",
            str(vol),
            sys.executable,
            "-m",
            "autorl.cli",
            "-C",
            str(ws),
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
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 1, r.stderr + r.stdout
    base, crashed = _rows(ws, "SELECT * FROM autorl_trials ORDER BY number")
    assert base["status"] == "complete" and crashed["crash_category"] == "disk_full", crashed
    (action,) = _actions(ws)
    assert f": stop: disk_full: {vol} has " in action and " free;" in action
    free = action.split(" has ", 1)[1].split(" free", 1)[0]
    assert free.endswith(("B", "KiB")), action  # the tmpfs, not the real disk
