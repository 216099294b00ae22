"""Replay of the two `autorl promote --resume` full runs of SmolLM2 seed 1's confirmed recipe on real OpenRLHF 0.10.4
(one H200), each from the promote's ledger restored into a workspace (tests/data/openrlhf-0.10.4/smollm2/, README in
each folder):

- ``h200-fullrun-misrestored``: the workspace was restored by a faulty first version of the restore script, which
  built the lost full run's start tag on the study's first recipe, so the run trained the baseline's values (lr
  1e-6, gens 8) at full length. It ran to its end (32 steps, four checkpoint evals, weights on disk) and is kept as
  what it is: a full-length control of the baseline's values.
- ``h200-promote-resumed``: the same, restored correctly (lr 1e-5, gens 32), cut by the end of the booked GPU time
  at step 25, with its step-8 and step-16 checkpoint evals.

Each checkpoint's score is recomputed from its per-item eval, and the two runs are judged against each other and
against the promote's re-validation runs by the study's own paired test."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest

from autorl.backends.openrlhf.metrics import parse_step_line
from autorl.judge import verdict
from autorl.judge.evidence import runs_of
from autorl.ledger import open_read
from autorl.metrics import RunMetrics, iter_records
from autorl.recipe import load_recipe, set_train_values
from autorl.states import Kind, TrialStatus, Verdict

SMOLLM2 = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "smollm2"
CONTROL = SMOLLM2 / "h200-fullrun-misrestored"
RESUMED = SMOLLM2 / "h200-promote-resumed"
REVALIDATION = SMOLLM2 / "h200x2-promote" / "runs"
FULL = "attempt-26-full-move-gens-32-lr-1em05"


def checkpoint(data: Path, step: int) -> RunMetrics:
    return RunMetrics(iter_records(data / "runs" / FULL / "ckpt-evals" / f"step{step}.jsonl"))


def steps(data: Path) -> list[dict[str, float]]:
    text = gzip.open(data / "runs" / FULL / "train.log.gz", "rt", errors="replace").read()
    return [r[1] for r in map(parse_step_line, text.splitlines()) if r]


@pytest.fixture(scope="module")
def trial_recipe(tmp_path_factory):
    lg = open_read(RESUMED / "study-ledger.sqlite")
    path = tmp_path_factory.mktemp("recipe") / "small.yaml"
    path.write_text(set_train_values(lg.study("smollm2-seed1").recipe, {"gens": 32, "lr": 1e-05}))
    lg.close()
    return load_recipe(path)


def judge(a: list[RunMetrics], b: list[RunMetrics], recipe) -> verdict.Judgement:
    fresh, base = runs_of(a, recipe), runs_of(b, recipe)
    assert fresh is not None and base is not None and fresh.items and base.items
    return verdict.judge(fresh, base, recipe.verdict, recipe.objective.direction)


def test_the_control_ran_to_its_end_with_its_weights_and_four_checkpoint_evals():
    lg = open_read(CONTROL / "study-ledger.sqlite")
    lost, full = lg.trial(25), lg.trial(26)
    lg.close()
    assert lost.status == TrialStatus.INTERRUPTED and "was gone" in (lost.reason or "")
    assert (full.kind, full.status, full.retry_of, full.promoted_from) == (Kind.FULL, TrialStatus.COMPLETE, 25, 8)
    scores = {s: checkpoint(CONTROL, s).series("eval/id/greedy_pass@1")[-1] for s in (8, 16, 24)}
    final = RunMetrics(iter_records(CONTROL / "runs" / FULL / "eval.jsonl"))
    scores[32] = final.series("eval/id/greedy_pass@1")[-1]
    for step in (8, 16, 24):  # each score is its per-item eval's mean
        items = checkpoint(CONTROL, step).items("id")
        assert items is not None and len(items) == 500 and sum(items or []) / 500 == pytest.approx(scores[step])
    assert scores == {8: 0.258, 16: 0.242, 24: 0.248, 32: 0.254}
    assert full.objective == max(scores.values())  # the best checkpoint's, as the monitor picked it
    record = json.loads((CONTROL / "runs" / "fullrun-26.monitor.log").read_text().strip().splitlines()[-1])
    assert record["best_checkpoint"]["step"] == 8 and record["best_checkpoint"]["weights"].endswith("global_step8_hf")
    weights = (CONTROL / "weights.txt").read_text()
    assert all(f"{FULL}/ckpt/global_step{s}_hf/model.safetensors" in weights for s in (8, 16, 24, 32))


def test_the_control_trained_the_baseline_values_not_the_re_validated_ones():
    """What the faulty restore cost, read from the run's own log: the learning rate and the group size the trainer
    used are the baseline's, not those of trial 08 that the ledger says was re-validated; `promote --resume` now
    checks the start tag against them first (tests/promote/test_promote_resume.py)."""
    lg = open_read(CONTROL / "study-ledger.sqlite")
    source = lg.trial(8).params or {}
    lg.close()
    assert (source["lr"], source["gens"]) == (1e-05, 32)
    got = steps(CONTROL)
    assert len(got) == 32 and got[0]["actor_lr"] == pytest.approx(1e-06)
    assert got[0]["rollout/num_samples"] == 256  # 32 prompts x 8, not x 32
    rewards = [s["reward"] for s in got]
    assert statistics.fmean(rewards[:8]) < 0.25 and statistics.fmean(rewards[-8:]) < 0.25  # it learned nothing


def test_the_control_at_full_length_is_flat_against_the_baseline(trial_recipe):
    base = [RunMetrics(iter_records(REVALIDATION / f"revalidate-08-base-s{s}" / "eval.jsonl")) for s in (10000, 10007)]
    last = RunMetrics(iter_records(CONTROL / "runs" / FULL / "eval.jsonl"))
    got = judge([last], base, trial_recipe)
    assert got.verdict == Verdict.FLAT and got.ci_low < 0 < got.ci_high


def test_the_re_validated_recipe_at_full_length_keeps_its_gain(trial_recipe):
    """Its checkpoints against the control's at the same step (the same prompts, seeds and length, only the
    re-validated values differ), and its step-16 checkpoint against the trial-length runs it was promoted on."""
    for step, expected in ((8, 0.756), (16, 0.790)):
        ck = checkpoint(RESUMED, step)
        assert ck.series("eval/id/greedy_pass@1")[-1] == expected and sum(ck.items("id") or []) / 500 == pytest.approx(
            expected
        )
        got = judge([ck], [checkpoint(CONTROL, step)], trial_recipe)
        assert got.verdict == Verdict.IMPROVED and got.delta > 0.45
    trial = [
        RunMetrics(iter_records(REVALIDATION / f"revalidate-08-trial-s{s}" / "eval.jsonl")) for s in (10000, 10007)
    ]
    halfway = judge([checkpoint(RESUMED, 16)], trial, trial_recipe)
    assert halfway.verdict == Verdict.FLAT  # 0.790 halfway through 32 steps against 0.788 after the trial's 16


def test_the_resumed_run_trained_the_re_validated_values_until_the_time_ended():
    lg = open_read(RESUMED / "study-ledger.sqlite")
    lost, full = lg.trial(25), lg.trial(26)
    lg.close()
    assert lost.status == TrialStatus.INTERRUPTED and full.status == TrialStatus.RUNNING and full.retry_of == 25
    got = steps(RESUMED)
    assert len(got) == 25 and got[0]["actor_lr"] == pytest.approx(1e-05) and got[0]["rollout/num_samples"] == 1024
    assert got[0]["reward"] < 0.25 and statistics.fmean(s["reward"] for s in got[-5:]) > 0.7
    assert 15 < statistics.median(s["timing/step_total"] for s in got) < 22  # about 18.5 s a step alone on the card
    diff = (RESUMED / "show-full.txt").read_text()  # what `autorl show 26` printed: the restored recipe's diff
    assert "+  lr: 1.0e-05" in diff and "+  gens: 32" in diff and "+  num_episodes: 2" in diff
