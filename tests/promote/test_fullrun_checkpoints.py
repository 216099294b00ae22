"""A promoted full run evaluates the checkpoints its run saves as it trains (a command recipe's `checkpoints:` glob;
OpenRLHF's Hugging Face checkpoints), so its OOD early stop has evals to watch before the run ends and its best
checkpoint's folder is kept. Real: a script that saves a tiny Hugging Face model every two steps, the per-item
evaluator on each, a real study and `autorl promote`."""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
from conftest import git, run_cli
from test_promote import _wait_full_run

from autorl.backends.openrlhf.tiny import write_inputs

pytestmark = pytest.mark.slow

# Saves the model as checkpoint-2, -4, -6, -8 (a step every 2.5 s, each logged), then as the final model.
TRAIN = """
import json, shutil, sys, time
from pathlib import Path
run_dir, model, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
(run_dir / "out").mkdir(parents=True, exist_ok=True)
for step in range(1, steps + 1):
    with open(run_dir / "m.jsonl", "a") as f:
        f.write(json.dumps({"type": "train", "step": step, "reward_mean": 0.1, "t": time.time()}) + "\\n")
    if step % 2 == 0:
        shutil.copytree(model, run_dir / "out" / f"checkpoint-{step}")
    time.sleep(2.5)
shutil.copytree(model, run_dir / "out" / "final")
"""


def _recipe(model: Path) -> str:
    return f"""backend: command
train:
  argv: ["{sys.executable}", "train.py", "{{run_dir}}", "{model}", "{{steps}}"]
  metrics: "{{run_dir}}/m.jsonl"
  checkpoint: "{{run_dir}}/out/final"
  checkpoints: "{{run_dir}}/out/checkpoint-*"
  probe_id: probes/id.jsonl
  probe_ood: probes/ood.jsonl
  probe_max_new_tokens: 4
  probe_engine: hf
  steps: 8
objective: {{metric: eval/id/greedy_pass@1, direction: maximize}}
verdict: {{baseline_repeats: 1}}
"""


def _metrics(ws: Path, number: int) -> list[dict]:
    conn = sqlite3.connect(ws / "ledger.sqlite")
    trial_id = conn.execute("SELECT id FROM autorl_trials WHERE number = ?", [number]).fetchone()[0]
    return [
        json.loads(r[0])
        for r in conn.execute("SELECT data FROM autorl_metrics WHERE trial_id = ? ORDER BY rowid", [trial_id])
    ]


def test_a_full_run_evaluates_its_checkpoints_as_they_appear_and_keeps_the_best(command_ws, tmp_path):
    pytest.importorskip("transformers")
    tiny = write_inputs(tmp_path / "tiny")
    ws = command_ws
    (ws / "probes").mkdir()
    shutil.copy(tiny / "probe_id.jsonl", ws / "probes" / "id.jsonl")
    shutil.copy(tiny / "probe_ood.jsonl", ws / "probes" / "ood.jsonl")
    (ws / "train.py").write_text(TRAIN)
    (ws / "recipes" / "ckpt.yaml").write_text(_recipe(tiny / "model"))
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "a script that saves checkpoints")
    r = run_cli("-C", str(ws), "run", "recipes/ckpt.yaml", "--max-trials", "1", "--budget", "5m", timeout=400)
    assert r.returncode == 0, r.stderr + r.stdout
    out = run_cli("-C", str(ws), "promote", "1", "--force", "--repeats", "1", "--parallel", "2", "--json", timeout=400)
    assert out.returncode == 0, out.stderr + out.stdout
    number = json.loads(out.stdout)["number"]
    row = _wait_full_run(ws, number)
    assert row["status"] == "complete", row
    metrics = _metrics(ws, number)
    evals = [m for m in metrics if m.get("type") == "eval"]
    by_step = {e["step"]: Path(e["checkpoint"]).name for e in evals}
    assert by_step == {2: "checkpoint-2", 4: "checkpoint-4", 6: "checkpoint-6", 8: "final"}  # checkpoint-8: final step
    run_dir = ws / ".autorl" / "runs" / row["attempt"]
    # evaluated while the run trained: checkpoint-2's eval reached the ledger before the run's last step
    first_eval, last_step = (
        metrics.index(evals[0]),
        max(i for i, m in enumerate(metrics) if m.get("step") == 8 and m.get("type", "step") != "eval"),
    )
    assert first_eval < last_step
    result = json.loads(git(ws, "show", f"{row['end_tag']}:results/{row['attempt']}.json"))
    best = result["best_checkpoint"]
    assert best["weights"] and Path(best["weights"]).is_dir() and Path(best["weights"]).parent.parent == run_dir
    assert best["value"] == max(e["eval/id/greedy_pass@1"] for e in evals)
