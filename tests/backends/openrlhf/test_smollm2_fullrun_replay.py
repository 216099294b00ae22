"""Replay of the three `autorl promote --resume` full runs of SmolLM2 seed 1's confirmed recipe on real OpenRLHF 0.10.4
(one H200), each from the promote's ledger restored into a workspace (tests/data/openrlhf-0.10.4/smollm2/, README in
each folder):

- ``h200-fullrun-misrestored``: the workspace was restored by a faulty first version of the restore script, which
  built the lost full run's start tag on the study's first recipe, so the run trained the baseline's values (lr
  1e-6, gens 8) at full length. It ran to its end (32 steps, four checkpoint evals, weights on disk) and is kept as
  what it is: a full-length control of the baseline's values.
- ``h200-promote-resumed``: the same, restored correctly (lr 1e-5, gens 32), cut by the end of the booked GPU time
  at step 25, with its step-8 and step-16 checkpoint evals.
- ``h200-promote-complete``: the same again, run to its end: 32 steps, four checkpoint evals, the final weights, the
  row closed with its best checkpoint.

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
from autorl.judge.earlystop import keep_checkpoint
from autorl.judge.evidence import runs_of
from autorl.ledger import open_read
from autorl.metrics import RunMetrics, iter_records
from autorl.recipe import load_recipe, set_train_values
from autorl.states import Kind, TrialStatus, Verdict

SMOLLM2 = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "smollm2"
CONTROL = SMOLLM2 / "h200-fullrun-misrestored"
RESUMED = SMOLLM2 / "h200-promote-resumed"
COMPLETE = SMOLLM2 / "h200-promote-complete"
REVALIDATION = SMOLLM2 / "h200x2-promote" / "runs"
FULL = "attempt-26-full-move-gens-32-lr-1em05"


def checkpoint(data: Path, step: int) -> RunMetrics:
    """The eval of the checkpoint saved at ``step``; the last step's is the run's own final eval."""
    if step == 32:
        return RunMetrics(iter_records(data / "runs" / FULL / "eval.jsonl"))
    return RunMetrics(iter_records(data / "runs" / FULL / "ckpt-evals" / f"step{step}.jsonl"))


def steps(data: Path) -> list[dict[str, float]]:
    text = gzip.open(data / "runs" / FULL / "train.log.gz", "rt", errors="replace").read()
    return [r[1] for r in map(parse_step_line, text.splitlines()) if r]


def lost_and_full(data: Path):
    """Rows 25 (the full run lost with its machine) and 26 (its `promote --resume`) of a kept ledger."""
    lg = open_read(data / "study-ledger.sqlite")
    rows = lg.trial(25), lg.trial(26)
    lg.close()
    return rows


def assert_resumed_to_its_end(data: Path) -> None:
    """25 marked interrupted (its monitor gone), 26 a complete full run that starts 25 over, from trial 08."""
    lost, full = lost_and_full(data)
    assert lost.status == TrialStatus.INTERRUPTED and "was gone" in (lost.reason or "")
    assert (full.kind, full.status, full.retry_of, full.promoted_from) == (Kind.FULL, TrialStatus.COMPLETE, 25, 8)


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
    assert_resumed_to_its_end(CONTROL)
    full = lost_and_full(CONTROL)[1]
    scores = {s: checkpoint(CONTROL, s).series("eval/id/greedy_pass@1")[-1] for s in (8, 16, 24, 32)}
    for step in (8, 16, 24, 32):  # each score is its per-item eval's mean
        items = checkpoint(CONTROL, step).items("id")
        assert items is not None and len(items) == 500 and sum(items or []) / 500 == pytest.approx(scores[step])
    assert scores == {8: 0.258, 16: 0.242, 24: 0.248, 32: 0.254}
    assert full.objective == max(scores.values())  # the best checkpoint's, as the monitor picked it
    record = json.loads((CONTROL / "runs" / "fullrun-26.monitor.log").read_text().strip().splitlines()[-1])
    assert record["best_checkpoint"]["step"] == 8 and record["best_checkpoint"]["weights"].endswith("global_step8_hf")
    # that was the best of four noisy evals; the rule since keeps the last, step 8's 0.258 being within noise of it
    kept = keep_checkpoint([checkpoint(CONTROL, s).evals[-1] for s in (8, 16, 24, 32)], "eval/id/greedy_pass@1")
    assert kept is not None and (kept.step, kept.value) == (32, 0.254) and "within noise" in kept.why
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
    got = judge([checkpoint(CONTROL, 32)], base, trial_recipe)
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
    lost, full = lost_and_full(RESUMED)
    assert lost.status == TrialStatus.INTERRUPTED and full.status == TrialStatus.RUNNING and full.retry_of == 25
    got = steps(RESUMED)
    assert len(got) == 25 and got[0]["actor_lr"] == pytest.approx(1e-05) and got[0]["rollout/num_samples"] == 1024
    assert got[0]["reward"] < 0.25 and statistics.fmean(s["reward"] for s in got[-5:]) > 0.7
    assert 15 < statistics.median(s["timing/step_total"] for s in got) < 22  # about 18.5 s a step alone on the card
    diff = (RESUMED / "show-full.txt").read_text()  # what `autorl show 26` printed: the restored recipe's diff
    assert "+  lr: 1.0e-05" in diff and "+  gens: 32" in diff and "+  num_episodes: 2" in diff


def test_the_completed_run_closed_its_row_with_four_checkpoint_evals_and_its_weights():
    assert_resumed_to_its_end(COMPLETE)
    full = lost_and_full(COMPLETE)[1]
    scores, ood = {}, {}
    for step in (8, 16, 24, 32):  # each score recomputed from its 500 per-item results
        ck = checkpoint(COMPLETE, step)
        items, ood_items = ck.items("id") or [], ck.items("ood") or []
        assert len(items) == len(ood_items) == 500 and ck.evals[-1]["step"] == step
        scores[step], ood[step] = sum(items) / 500, sum(ood_items) / 500
        assert ck.series("eval/id/greedy_pass@1")[-1] == pytest.approx(scores[step])
    assert scores == pytest.approx({8: 0.754, 16: 0.788, 24: 0.824, 32: 0.828})
    assert ood == pytest.approx({8: 0.574, 16: 0.682, 24: 0.694, 32: 0.708})
    assert full.objective == pytest.approx(scores[32])
    record = json.loads((COMPLETE / "runs" / "fullrun-26.monitor.log").read_text().strip().splitlines()[-1])
    assert record["status"] == "complete" and record["best_checkpoint"]["step"] == 32
    assert record["best_checkpoint"]["weights"].endswith(f"{FULL}/model")
    weights = (COMPLETE / "weights.txt").read_text().splitlines()
    assert f"{FULL}/model/model.safetensors" in " ".join(weights) and len(weights) == 5
    assert all(int(line.split()[-1]) > 300e6 for line in weights)  # 135M parameters in full precision, each
    config = json.loads((COMPLETE / "runs" / FULL / "model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    refs = (COMPLETE / "git.txt").read_text()
    assert "attempt-26-end" in refs and "attempt-25-end" not in refs
    assert "complete, best" in (COMPLETE / "status.txt").read_text()


def test_the_completed_run_trained_the_re_validated_values_and_kept_learning():
    got = steps(COMPLETE)
    assert len(got) == 32 and got[0]["actor_lr"] == pytest.approx(1e-05) and got[0]["rollout/num_samples"] == 1024
    rewards = [s["reward"] for s in got]
    assert rewards[0] < 0.25 and statistics.fmean(rewards[-5:]) > 0.75
    assert 15 < statistics.median(s["timing/step_total"] for s in got) < 22


def test_the_completed_run_beats_the_control_at_every_checkpoint_and_repeats_the_cut_run(trial_recipe):
    for step in (8, 16, 24, 32):  # the same prompts, seeds and length as the control: only the values differ
        got = judge([checkpoint(COMPLETE, step)], [checkpoint(CONTROL, step)], trial_recipe)
        assert got.verdict == Verdict.IMPROVED and got.delta > 0.45 and got.ci_low > 0.3
    for step in (8, 16):  # the run cut at step 25 saw the same checkpoints: the same scores within noise
        again = judge([checkpoint(COMPLETE, step)], [checkpoint(RESUMED, step)], trial_recipe)
        assert again.verdict == Verdict.FLAT and abs(again.delta) < 0.01


def test_the_final_model_holds_the_gain_it_was_promoted_on(trial_recipe):
    runs = {
        arm: [
            RunMetrics(iter_records(REVALIDATION / f"revalidate-08-{arm}-s{s}" / "eval.jsonl")) for s in (10000, 10007)
        ]
        for arm in ("base", "trial")
    }
    final = checkpoint(COMPLETE, 32)
    over_base = judge([final], runs["base"], trial_recipe)
    assert over_base.verdict == Verdict.IMPROVED and over_base.ci_low > 0.5
    over_trial = judge([final], runs["trial"], trial_recipe)  # twice the steps: no gain beyond the noise
    assert over_trial.verdict == Verdict.FLAT and over_trial.delta > 0
