"""A `--parallel 2` study of the small recipe on two H200s of a 4-GPU host (OpenRLHF 0.10.4, one Ray head for the
study, one GPU per trial), as real OpenRLHF and autorl wrote it, after the model's tokenizer stopped adding <bos>:
a baseline run's driver log with arrival times, its TensorBoard events and per-item eval; the driver log of a
trial whose Ray head was killed under it (SIGTERM to the head process while two trials ran); the study's output
and ledger. autorl reads them as they are."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autorl.backends.openrlhf.metrics import OpenRLHFMetricsReader
from autorl.backends.openrlhf.phases import marks, phases, read_times
from autorl.backends.openrlhf.phases import start_up as phases_start_up
from autorl.judge.triage import classify

RUN = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "small" / "parallel2"
STARTED, FINISHED = 1795791196.64, 1795791446.50  # attempt 02 on the controller's clock (250 s, a cold start)


def _steps(tensorboard: bool) -> list[dict]:
    reader = OpenRLHFMetricsReader(
        RUN / "tensorboard" if tensorboard else None,
        None,
        stdout_path=None if tensorboard else RUN / "attempt02-train.log",
    )
    return reader.poll() + reader.flush()


def test_rollouts_now_score_what_the_warm_up_sampled():
    """Without <bos> in warm-up, eval and rollouts alike, the rollouts are right about as often as the warm-up's
    check sampled (0.32), not 1 % as before: most groups have rewards that differ, so GRPO has a signal."""
    warmup = json.loads((RUN / "warmup.json").read_text())
    steps = _steps(False)
    assert [s["step"] for s in steps] == list(range(1, 17)) == [s["step"] for s in _steps(True)]
    mean_reward = sum(s["reward_mean"] for s in steps) / len(steps)
    zero_std = sum(s["frac_zero_std_groups"] for s in steps) / len(steps)
    assert warmup["sft_pass@1"] == pytest.approx(0.32)
    assert 0.2 <= mean_reward <= 0.45 and zero_std < 0.5


def test_a_cold_trial_spends_most_of_its_time_starting():
    text = (RUN / "attempt02-train.log").read_text()
    times = read_times(RUN / "attempt02-train.log.times")
    assert list(marks(text, times)) == ["driver", "vllm", "actor", "training", "save"]
    got = phases(text, times, STARTED, FINISHED)
    start_up = phases_start_up(got)
    assert 170 <= start_up <= 190 and 45 <= got["training"] <= 60
    rec = json.loads((RUN / "attempt02-eval.jsonl").read_text().splitlines()[-1])
    assert len(rec["eval/id/items"]) == 500 and rec["eval/id/greedy_pass@1"] == pytest.approx(0.476)


def test_a_killed_head_is_triaged_as_lost_not_as_the_recipe():
    d = classify((RUN / "attempt03-head-lost-train.log").read_text(errors="replace"), exit_code=1)
    assert d.category == "killed_external" and "stopped answering" in d.root_cause_line


def test_the_study_retried_both_lost_trials_once_and_went_on():
    ledger = (RUN / "ledger.txt").read_text()
    rows = re.findall(r"^(\d\d)  (\w+)(?: \((\w+)\))?", ledger, re.M)
    assert [(n, s) for n, s, _ in rows if s == "crash"] == [("03", "crash"), ("04", "crash")]
    assert {c for _, s, c in rows if s == "crash"} == {"killed_external"}
    assert "retry / h13-flat-learning: lr=1e-05" in ledger and "retry / h13-flat-learning: lr=3.16e-06" in ledger
    assert len(rows) == 12 and sum(s in ("flat", "complete") for _, s, _ in rows) == 10  # nothing else lost
    log = (RUN / "study.log").read_text()
    assert log.count("retrying once unchanged") == 2 and "Crashes: 2 (killed_external" in log
