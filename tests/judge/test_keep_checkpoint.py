"""keep_checkpoint(): a full run keeps its last eval's checkpoint unless an earlier one beats it beyond noise.

The best of K noisy evals is a coin flip on a flat run and its value is biased upward; the real control run of
SmolLM2 on OpenRLHF (baseline values, 32 steps) kept step 8's 0.258 over step 32's 0.254 under the old rule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from autorl.judge.earlystop import OOD_KEY, keep_checkpoint
from tests.judge.test_earlystop import series

ID_KEY = "eval/id/greedy_pass@1"
SMOLLM2 = Path(__file__).resolve().parents[1] / "data" / "openrlhf-0.10.4" / "smollm2"
RUN = "runs/attempt-26-full-move-gens-32-lr-1em05"


def real_evals(folder: str) -> list[dict]:
    """The four per-item checkpoint evals of a real 32-step full run, oldest first."""
    run = SMOLLM2 / folder / RUN
    files = [run / "ckpt-evals" / f"step{s}.jsonl" for s in (8, 16, 24)] + [run / "eval.jsonl"]
    return [json.loads(f.read_text().splitlines()[0]) for f in files]


def test_a_flat_real_run_keeps_its_last_checkpoint_not_its_luckiest():
    evals = real_evals("h200-fullrun-misrestored")
    assert [e[ID_KEY] for e in evals] == [0.258, 0.242, 0.248, 0.254]
    kept = keep_checkpoint(evals, ID_KEY)
    assert kept is not None and (kept.step, kept.value) == (32, 0.254)
    assert "within noise" in kept.why and "step 8's 0.258" in kept.why


def test_a_real_run_that_kept_learning_keeps_its_last():
    kept = keep_checkpoint(real_evals("h200-promote-complete"), ID_KEY)
    assert kept is not None and (kept.step, kept.value) == (32, 0.828) and "is the best" in kept.why


def test_an_earlier_checkpoint_clearly_better_is_kept():
    rng = np.random.default_rng(5)
    evals = series(rng, [0.4, 0.7, 0.7, 0.4], n=500)  # collapsed at the end
    kept = keep_checkpoint(evals, OOD_KEY)
    assert kept is not None and kept.step in (10, 20) and "beats the last eval" in kept.why
    assert kept.value == max(e[OOD_KEY] for e in evals[:3])


def test_flat_runs_almost_always_keep_the_last():
    """Checkpoints of equal skill, each a fresh draw on the same 300 items: an earlier one is kept about as often
    as the one-sided 1% the margin allows (Bonferroni over the earlier evals), where the best-of rule kept an
    earlier one in about three of four runs."""
    rng = np.random.default_rng(7)
    earlier = best_of = 0
    for _ in range(400):
        evals = series(rng, [0.5] * 4)
        kept = keep_checkpoint(evals, OOD_KEY)
        assert kept is not None
        earlier += kept.step != evals[-1]["step"]
        values = [e[OOD_KEY] for e in evals]
        best_of += values.index(max(values)) != 3
    assert earlier <= 8 and best_of >= 250


def test_a_checkpoint_that_really_improved_is_kept_over_a_later_small_dip():
    """A dip within noise after a real gain still keeps the last: it is not worse beyond what the items show."""
    rng = np.random.default_rng(11)
    evals = series(rng, [0.3, 0.6, 0.6, 0.58], n=500)
    kept = keep_checkpoint(evals, OOD_KEY)
    assert kept is not None and kept.step == 30


def test_without_per_item_results_the_best_is_kept_and_says_why():
    evals = [{"type": "eval", "step": s, "reward": v} for s, v in [(0, 0.2), (10, 0.6), (20, 0.5)]]
    kept = keep_checkpoint(evals, "reward")
    assert kept is not None and (kept.step, kept.value) == (10, 0.6) and "no per-item results" in kept.why


def test_minimize_and_edge_cases():
    evals = [{"type": "eval", "step": s, "eval/x/loss": v} for s, v in [(0, 0.9), (1, 0.2), (2, 0.5)]]
    kept = keep_checkpoint(evals, "eval/x/loss", maximize=False)
    assert kept is not None and kept.step == 1  # no items: the best, the lowest
    only = keep_checkpoint(evals[:1], "eval/x/loss", maximize=False)
    assert only is not None and only.step == 0 and "the only eval" in only.why
    assert keep_checkpoint([{"type": "eval", "step": 0}], "eval/x/loss") is None
    assert keep_checkpoint([], ID_KEY) is None
