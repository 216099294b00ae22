"""Runs without a branch (promote's re-validation): up to --parallel at once on one prepared backend, in throwaway
worktrees, outcomes in the order asked, nothing left behind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import git

from autorl.recipe import validate_recipe
from autorl.runs.lifecycle import DetachedRun, run_detached
from autorl.states import TrialStatus
from autorl.workspace import Workspace

# A run: its start and end times and its seed to the metrics file, a second apart; seed 13 fails.
SCRIPT = """
import json, sys, time
run_dir, seed = sys.argv[1], int(sys.argv[2])
t0 = time.time()
time.sleep(1.0)
if seed == 13:
    sys.exit(3)
with open(run_dir + "/m.jsonl", "w") as f:
    f.write(json.dumps({"type": "train", "step": 1, "seed": seed, "t0": t0, "t1": time.time()}) + "\\n")
"""


def _recipe(ws: Path):
    (ws / "run.py").write_text(SCRIPT)
    git(ws, "add", "run.py")
    git(ws, "commit", "-qm", "a run script")
    return validate_recipe(
        {
            "backend": "command",
            "train": {"argv": [sys.executable, "run.py", "{run_dir}", "{seed}"], "metrics": "{run_dir}/m.jsonl"},
        }
    )


def _times(ws: Path, name: str) -> tuple[float, float]:
    rec = json.loads((ws / ".autorl" / "runs" / name / "m.jsonl").read_text())
    return rec["t0"], rec["t1"]


def test_runs_go_two_at_once_in_order_and_leave_no_worktree(command_ws):
    recipe = _recipe(command_ws)
    ws = Workspace.open(command_ws)
    runs = [DetachedRun(recipe, "HEAD", f"r{i}", seed) for i, seed in enumerate((1, 2, 13, 4))]
    ended = []
    outs = run_detached(ws, runs, parallel=2, on_end=lambda run, out: ended.append(run.name))
    done, crash = TrialStatus.COMPLETE, TrialStatus.CRASH
    assert [o.status for o in outs] == [done, done, crash, done]
    assert [o.metrics.steps[0]["seed"] for o in outs if o.status == done] == [1, 2, 4]
    assert sorted(ended) == ["r0", "r1", "r2", "r3"]
    (a0, a1), (b0, b1), d0 = _times(command_ws, "r0"), _times(command_ws, "r1"), _times(command_ws, "r3")[0]
    assert max(a0, b0) < min(a1, b1)  # the first two ran at once
    assert d0 >= min(a1, b1)  # the fourth waited for a free slot
    assert not list((command_ws / ".autorl" / "worktrees").glob("r*"))
    assert "r0" not in git(command_ws, "branch", "--list")


def test_one_at_a_time_by_default(command_ws):
    recipe = _recipe(command_ws)
    ws = Workspace.open(command_ws)
    outs = run_detached(ws, [DetachedRun(recipe, "HEAD", f"s{i}", i) for i in range(2)])
    assert [o.status for o in outs] == [TrialStatus.COMPLETE, TrialStatus.COMPLETE]
    assert _times(command_ws, "s1")[0] >= _times(command_ws, "s0")[1]
