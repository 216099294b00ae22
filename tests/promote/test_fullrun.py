"""A full run's kept checkpoint: the weights the backend kept for that eval, else the saved model that eval read
(an OpenRLHF full run on an H200 saved its model and was evaluated on it, and the ledger said "weights: none")."""

from __future__ import annotations

import json
from pathlib import Path

from autorl.metrics import RunMetrics
from autorl.promote.fullrun import _checkpoint, kept_eval
from autorl.recipe import load_recipe

DATA = Path(__file__).resolve().parents[1] / "data" / "openrlhf-0.10.4" / "small" / "host2"
RECIPES = Path(__file__).resolve().parents[2] / "recipes"
KEY = "eval/id/greedy_pass@1"


def _evals(model: Path) -> list[dict]:
    """The real full run's eval record, pointed at ``model`` (the run folder it named is on the GPU host)."""
    rec = json.loads((DATA / "full-eval.jsonl").read_text().splitlines()[0])
    return [{**rec, "checkpoint": str(model)}]


def test_the_model_the_kept_eval_read_is_the_full_runs_weights(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    m = RunMetrics(_evals(model))
    kept = kept_eval(m.evals, load_recipe(RECIPES / "openrlhf-small.yaml"))
    assert kept is not None and (kept.step, kept.value) == (32, 0.59)
    step, value = kept.step, kept.value
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


def test_the_engines_last_eval_weights_are_found_when_the_last_eval_is_kept(tmp_path):
    """The embedded engine keeps the best eval's weights (best.pt) and the last's (last.pt): the kept eval's file is
    named whichever of the two it is."""
    evals = [{"type": "eval", "step": s, KEY: v} for s, v in ((16, 0.60), (32, 0.58))]
    summary = {
        "type": "summary",
        "best_checkpoint": {"path": "best.pt", "step": 16, "metric": KEY, "value": 0.60},
        "last_checkpoint": {"path": "last.pt", "step": 32, "metric": KEY, "value": 0.58},
    }
    m = RunMetrics([*evals, summary])
    assert _checkpoint(m, 32, 0.58, KEY)["weights"] == "last.pt"
    assert _checkpoint(m, 16, 0.60, KEY)["weights"] == "best.pt"
    assert _checkpoint(m, 24, 0.59, KEY)["weights"] is None  # no file for an eval whose weights were not kept


def test_a_run_killed_before_its_summary_names_its_weights_from_the_engines_marks(tmp_path):
    """A full run stopped early is killed: no summary. The engine's kept.json beside its weights still says which
    eval each file holds; unreadable or absent, no weights are named rather than a wrong file."""
    evals = [{"type": "eval", "step": s, KEY: v} for s, v in ((16, 0.60), (32, 0.58))]
    marks = {
        "best_checkpoint": {"path": "best.pt", "step": 16, "metric": KEY, "value": 0.60},
        "last_checkpoint": {"path": "last.pt", "step": 32, "metric": KEY, "value": 0.58},
    }
    (tmp_path / "kept.json").write_text(json.dumps(marks))
    m = RunMetrics(evals)
    assert _checkpoint(m, 32, 0.58, KEY, tmp_path)["weights"] == "last.pt"
    assert _checkpoint(m, 16, 0.60, KEY, tmp_path)["weights"] == "best.pt"
    assert _checkpoint(m, 32, 0.58, KEY)["weights"] is None  # no run folder given
    (tmp_path / "kept.json").write_text('{"best_checkpoint": ')  # cut off mid-write by a kill
    assert _checkpoint(m, 16, 0.60, KEY, tmp_path)["weights"] is None
