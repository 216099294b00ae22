"""What a real OpenRLHF 0.10.4 GRPO trial wrote (one H100, Ray + DeepSpeed + vLLM colocated, launched by autorl as
a Ray job): its driver log, TensorBoard events and per-item eval, and a real start-up failure. autorl must read
them as they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autorl.backends.openrlhf.metrics import OpenRLHFMetricsReader
from autorl.backends.openrlhf.preflight import lr_at
from autorl.judge.abort import check_abort
from autorl.judge.triage import classify
from autorl.recipe import AbortRules

REAL = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4"


def _steps(tensorboard: bool, stdout: bool) -> list[dict]:
    reader = OpenRLHFMetricsReader(
        REAL / "tensorboard" if tensorboard else None, None, stdout_path=REAL / "train.log" if stdout else None
    )
    return reader.poll() + reader.flush()


def test_driver_log_gives_every_step_with_the_keys_the_rules_need():
    steps = _steps(tensorboard=False, stdout=True)
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    for s in steps:
        for key in (
            "reward_mean",
            "grad_norm",
            "kl",
            "truncated_rate",
            "frac_zero_std_groups",
            "time_generate_s",
            "tokens_per_s",
        ):
            assert isinstance(s[key], float), key
        assert 0.0 <= s["frac_zero_std_groups"] <= 1.0 and key not in s["absent"]
    assert steps[2]["reward_mean"] == pytest.approx(0.03125) and steps[2]["frac_zero_std_groups"] == 0.875


def test_tensorboard_and_driver_log_agree():
    from_tb, from_log = _steps(tensorboard=True, stdout=False), _steps(tensorboard=False, stdout=True)
    assert len(from_tb) == len(from_log) == 4
    for a, b in zip(from_tb, from_log):
        for key in ("reward_mean", "grad_norm", "lr", "truncated_rate", "frac_zero_std_groups"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key


def test_preflight_lr_model_matches_the_real_scheduler():
    # 32 prompts x 4 samples // 32 = 4 scheduler steps, warmup ceil(4 x 0.03) = 1, cosine to 0.1 x lr
    logged = [s["lr"] for s in _steps(tensorboard=False, stdout=True)]
    assert logged == pytest.approx([lr_at(step, 4, 1e-4, 0.03) for step in (1, 2, 3, 4)])


def test_an_untrained_policy_trips_the_early_abort_on_real_metrics():
    steps = _steps(tensorboard=False, stdout=True)
    decision = check_abort(steps[:2], AbortRules(window=2), None)
    assert decision is not None and decision.rule in {
        "reward_stuck_zero",
        "zero_std_groups",
        "truncation",
        "grad_norm_zero",
    }
    assert check_abort(steps[:1], AbortRules(window=2), None) is None


def test_the_per_item_eval_of_the_saved_model():
    rec = json.loads((REAL / "eval.jsonl").read_text().splitlines()[0])
    assert rec["step"] == 4 and len(rec["eval/id/items"]) == 32 and len(rec["eval/ood/items"]) == 32
    assert rec["eval/id/greedy_pass@1"] == sum(rec["eval/id/items"]) / 32


def test_a_real_unknown_flag_failure_is_triaged_with_its_line():
    d = classify((REAL / "unknown-flag.log").read_text(errors="replace"), exit_code=2)
    assert d.category == "backend_incompat"
    assert "unrecognized arguments: --packing_samples" in d.root_cause_line
