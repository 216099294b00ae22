"""A full run's best checkpoint: the weights the backend kept for the best eval, else the saved model that eval read
(an OpenRLHF full run on an H200 saved its model and was evaluated on it, and the ledger said "weights: none")."""

from __future__ import annotations

import json
from pathlib import Path

from autorl.metrics import RunMetrics
from autorl.promote.fullrun import _checkpoint, best_eval

DATA = Path(__file__).resolve().parents[1] / "data" / "openrlhf-0.10.4" / "small" / "host2"
KEY = "eval/id/greedy_pass@1"


def _evals(model: Path) -> list[dict]:
    """The real full run's eval record, pointed at ``model`` (the run folder it named is on the GPU host)."""
    rec = json.loads((DATA / "full-eval.jsonl").read_text().splitlines()[0])
    return [{**rec, "checkpoint": str(model)}]


def test_the_model_the_best_eval_read_is_the_full_runs_weights(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    m = RunMetrics(_evals(model))
    step, value = best_eval(m.evals, KEY)
    assert (step, value) == (32, 0.59)
    assert _checkpoint(m, step, value, KEY) == {"step": 32, "value": 0.59, "metric": KEY, "weights": str(model)}


def test_a_checkpoint_no_longer_on_disk_is_not_named(tmp_path):
    m = RunMetrics(_evals(tmp_path / "gone"))
    assert _checkpoint(m, 32, 0.59, KEY)["weights"] is None


def test_weights_the_backend_kept_for_the_best_step_come_first(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    kept = {"type": "summary", "best_checkpoint": {"path": "best.pt", "step": 32, "metric": KEY}}
    m = RunMetrics([*_evals(model), kept])
    assert _checkpoint(m, 32, 0.59, KEY)["weights"] == "best.pt"
