"""One trial of the small recipe's GPU study, as real OpenRLHF 0.10.4 wrote it (one H200 of a 2-GPU host, Ray +
DeepSpeed + vLLM colocated, launched by `autorl run`): its driver log and the log's arrival times, its TensorBoard
events and its per-item eval. autorl reads them as they are; they also keep the evidence of why that study found
nothing: the model was warmed up with <bos> before every prompt, its rollouts had none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autorl.backends.openrlhf.metrics import OpenRLHFMetricsReader
from autorl.backends.openrlhf.phases import marks, phases, read_times
from autorl.backends.openrlhf.phases import start_up as phases_start_up

STUDY = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "small" / "study"
STARTED, FINISHED = 1795778344.28, 1795778498.21  # the trial's start and end on the controller's clock (154 s)


def _steps(tensorboard: bool) -> list[dict]:
    reader = OpenRLHFMetricsReader(
        STUDY / "tensorboard" if tensorboard else None,
        None,
        stdout_path=None if tensorboard else STUDY / "attempt03-train.log",
    )
    return reader.poll() + reader.flush()


def test_every_step_is_read_from_the_driver_log_and_tensorboard_alike():
    from_log, from_tb = _steps(False), _steps(True)
    assert [s["step"] for s in from_log] == list(range(1, 17)) == [s["step"] for s in from_tb]
    for a, b in zip(from_log, from_tb):
        for key in ("reward_mean", "lr", "frac_zero_std_groups"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key


def test_the_rollouts_scored_far_below_what_the_warm_up_sampled():
    """The warm-up check sampled right 35 % of the time (with <bos>); the rollouts (without it) about 1 %, nearly
    every group had one reward: the study had no signal to find a learning rate with."""
    warmup = json.loads((STUDY / "warmup.json").read_text())
    steps = _steps(False)
    mean_reward = sum(s["reward_mean"] for s in steps) / len(steps)
    zero_std = sum(s["frac_zero_std_groups"] for s in steps) / len(steps)
    assert warmup["sft_pass@1"] == pytest.approx(0.354) and mean_reward < 0.05 and zero_std > 0.9


def test_where_the_trial_spent_its_time():
    text = (STUDY / "attempt03-train.log").read_text()
    times = read_times(STUDY / "attempt03-train.log.times")
    assert list(marks(text, times)) == ["driver", "vllm", "actor", "training", "save"]
    got = phases(text, times, STARTED, FINISHED)
    start_up = phases_start_up(got)
    assert 85 <= start_up <= 95 and 50 <= got["training"] <= 57 and 8 <= got["eval"] <= 13
    assert (got["training"] + got["eval"]) / (FINISHED - STARTED) < 0.6  # the target this trial did not meet


def test_the_per_item_eval_scores_500_items_of_each_probe_set():
    rec = json.loads((STUDY / "attempt03-eval.jsonl").read_text().splitlines()[-1])
    assert rec["step"] == 16 and len(rec["eval/id/items"]) == 500 and len(rec["eval/ood/items"]) == 500
    assert rec["eval/id/greedy_pass@1"] == pytest.approx(0.482) == sum(rec["eval/id/items"]) / 500
