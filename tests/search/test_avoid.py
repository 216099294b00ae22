"""A crash whose signature repeats makes its region off limits: later proposals keep their distance."""

import json
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
from conftest import git, run_cli

from autorl.recipe import SearchParam
from autorl.search.view import AVOID_RADIUS, distance
from autorl.states import CrashCategory

SCRIPT = Path(__file__).resolve().parents[1] / "data" / "scripts" / "crash_high_lr.py"
RECIPE = f"""name: crashy
backend: command
train:
  argv: ["{sys.executable}", "crash_high_lr.py", "{{lr}}", "{{seed}}", "{{run_dir}}/metrics.jsonl"]
  lr: 0.001
search:
  lr: {{low: 1.0e-4, high: 1.0e-1, log: true}}
verdict: {{baseline_repeats: 1, bootstrap: 200}}
timeout_s: 30
"""


@pytest.mark.slow
def test_repeated_crash_region_is_avoided(tmp_path):
    ws = tmp_path / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    shutil.copy(SCRIPT, ws / "crash_high_lr.py")
    (ws / "recipes" / "crashy.yaml").write_text(RECIPE)
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "crashy recipe")
    r = run_cli(
        "-C",
        str(ws),
        "run",
        "recipes/crashy.yaml",
        "--strategy",
        "random",
        "--max-trials",
        "16",
        "--budget",
        "10m",
        "--seed",
        "3",
        "--quiet",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    conn = sqlite3.connect(ws / "ledger.sqlite")
    rows = conn.execute(
        "SELECT number, params, crash_signature, crash_category FROM autorl_trials ORDER BY number"
    ).fetchall()
    crashes = [(n, json.loads(p), sig, cat) for n, p, sig, cat in rows if sig]
    assert len(crashes) >= 2 and {c[3] for c in crashes} == {CrashCategory.ILLEGAL_MEMORY_ACCESS}
    assert len({c[2] for c in crashes}) == 1  # one signature for the same failure at different lrs
    space = {"lr": SearchParam(low=1e-4, high=1e-1, log=True)}
    for i, (_, params, _, _) in enumerate(crashes[2:], start=2):
        for _, earlier, _, _ in crashes[:i]:
            assert distance(space, params, earlier) >= AVOID_RADIUS
    events = conn.execute("SELECT count(*) FROM autorl_events WHERE kind = 'avoided'").fetchone()[0]
    told_fail = conn.execute("SELECT count(*) FROM trials WHERE state = 'FAIL'").fetchone()[0]
    assert told_fail >= len(crashes) + events
