"""Silent failures (judge/silent.py) on real runs: embedded-engine runs in tests/data/runs/silent
(see its README for how each was made) and a real OpenRLHF 0.10.4 run's TensorBoard metrics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from autorl.backends.openrlhf.metrics import OpenRLHFMetricsReader
from autorl.judge import silent, triage
from autorl.judge.evidence import objective_value, runs_of
from autorl.metrics import RunMetrics, iter_records
from autorl.recipe import validate_recipe
from autorl.states import CrashAction, CrashCategory

DATA = Path(__file__).resolve().parents[1] / "data"
RUNS = DATA / "runs" / "silent"


def _run(name: str) -> tuple[RunMetrics, str]:
    return RunMetrics(iter_records(RUNS / f"{name}.jsonl")), (RUNS / f"{name}.log").read_text()


def _check(name: str, planned: int):
    m, log = _run(name)
    return silent.check(m.steps, m.summary, log, planned, evals=m.evals)


@pytest.mark.parametrize(
    "name, planned, check, category, evidence",
    [
        ("no-steps", 5, "no_training", CrashCategory.NO_TRAINING, "0 of 5 training steps ran"),
        (
            "reward-nan",
            10,
            "nonfinite",
            CrashCategory.NAN_DIVERGENCE,
            "step 6/10 reward nan kl 0.0000 clip 0.000 grad nan",
        ),
        (
            "reward-zero",
            8,
            "reward_constant",
            CrashCategory.REWARD_CONSTANT,
            "reward_mean was 0 on all 8 steps from step 1",
        ),
        (
            "collapse-empty",
            20,
            "output_collapse",
            CrashCategory.OUTPUT_COLLAPSE,
            "degenerate_rate >= 0.9 on each of the last 3 steps",
        ),
        (
            "collapse-repeat",
            20,
            "output_collapse",
            CrashCategory.OUTPUT_COLLAPSE,
            "degenerate_rate >= 0.9 on each of the last 3 steps",
        ),
    ],
)
def test_each_silent_failure_on_a_real_engine_run(name, planned, check, category, evidence):
    f = _check(name, planned)
    assert f is not None and (f.check, f.category) == (check, category), f
    assert evidence in f.root_cause_line
    fields = f.fields()
    assert fields["crash_category"] == category and fields["crash_signature"].startswith(category + "-")
    assert fields["remedy"] and "\n" not in fields["remedy"] and "{" not in fields["remedy"]


def test_the_nan_root_line_is_the_engines_own_log_line():
    f = _check("reward-nan", 10)
    assert f.root_cause_line in _run("reward-nan")[1].splitlines() and f.step == 6


def test_a_collapse_that_fools_the_eval_is_still_a_failure():
    """The length-only reward scores its own loophole: the eval reads 1.000, the completions are EOS alone."""
    m, _ = _run("collapse-empty")
    assert m.series("eval/id/greedy_pass@1")[-1] == 1.0
    assert m.series("response_length_mean")[-1] == 1.0 and _check("collapse-empty", 20).check == "output_collapse"


@pytest.mark.parametrize(
    "path", [RUNS / "healthy.jsonl", DATA / "runs" / "flat-lr5e-7.jsonl", DATA / "runs" / "kl-pinned.jsonl"]
)
def test_healthy_real_runs_pass(path):
    m = RunMetrics(iter_records(path))
    assert m.steps and silent.check(m.steps, m.summary, "", len(m.steps), evals=m.evals) is None


def test_a_real_openrlhf_run_with_a_sparse_reward_is_not_a_constant_reward():
    """OpenRLHF 0.10.4's tiny-model run: reward 0 on three of four steps, 1/32 on one. It had a
    signal once, so it is not 'identically 0 from the first step'; with that step it would be."""
    d = DATA / "openrlhf-0.10.4"
    reader = OpenRLHFMetricsReader(d / "tensorboard", d / "none.jsonl", {})
    steps = [r for r in reader.poll() + reader.flush() if r["type"] == "step"]
    log = (d / "train.log").read_text(errors="replace")
    assert [r["reward_mean"] for r in steps] == [0.0, 0.0, 0.03125, 0.0]
    assert "degenerate_rate" in steps[0]["absent"]  # OpenRLHF cannot give it: the other collapse tests apply
    assert silent.check(steps, None, log, len(steps)) is None
    zeroed = [{**r, "reward_mean": 0.0} for r in steps]
    assert silent.check(zeroed, None, log, len(steps)).category == CrashCategory.REWARD_CONSTANT


def test_no_training_needs_the_metrics_to_have_been_read():
    """No records at all is unreadable metrics, not evidence of a run without steps."""
    assert silent.check([], None, "", 10) is None
    assert silent.check([], {"type": "summary", "steps_done": 0, "status": "ok"}, "", 0) is None  # nothing planned
    assert silent.check([], {"type": "summary", "steps_done": 0, "status": "ok"}, "", 10).check == "no_training"


def _steps(n: int, **values) -> list[dict]:
    return [
        {"type": "step", "step": i, "reward_mean": 0.4, "loss": 0.1, "grad_norm": 0.5, **values}
        for i in range(1, n + 1)
    ]


def test_collapse_without_degenerate_rate_uses_entropy_and_truncation():
    steps = _steps(6, entropy_mean=0.001, truncated_rate=1.0, response_length_mean=64.0)
    assert silent.check(steps, None, "", 6).check == "output_collapse"
    assert silent.check(_steps(6, entropy_mean=0.001, truncated_rate=0.2), None, "", 6) is None  # confident, not cut
    measured = _steps(6, entropy_mean=0.001, truncated_rate=1.0, degenerate_rate=0.05)
    assert silent.check(measured, None, "", 6) is None  # the backend measured it: deterministic but not degenerate


def test_reward_constant_needs_enough_steps_and_exactly_zero_or_one():
    assert silent.check(_steps(2, reward_mean=0.0), None, "", 2) is None
    assert silent.check(_steps(5, reward_mean=1.0), None, "", 5).root_cause_line.startswith("reward_mean was 1 ")
    assert silent.check(_steps(5, reward_mean=0.5), None, "", 5) is None
    varying = _steps(5, reward_mean=0.0)
    varying[3]["reward_mean"] = 0.125
    assert silent.check(varying, None, "", 5) is None


def test_a_nan_in_any_key_counts_and_the_main_keys_are_named_first():
    steps = _steps(4)
    steps[2].update(ratio_max=math.inf, kl=math.nan)
    f = silent.check(steps, None, "step 3 kl nan\n", 4)
    assert (f.category, f.step, f.root_cause_line) == (CrashCategory.NAN_DIVERGENCE, 3, "step 3 kl nan")
    steps[2] = {"type": "step", "step": 3, "loss": "nan"}
    assert silent.check(steps, None, "", 4).root_cause_line == "step 3: loss = nan (metrics record)"


def test_every_silent_category_has_an_action():
    rules = triage.load_rules()
    checks = silent.load_rules()
    categories = {
        checks.no_training.category,
        checks.nonfinite.category,
        checks.output_collapse.category,
        checks.reward_constant.category,
        checks.no_objective.category,
    }
    assert set(triage.SILENT_CATEGORIES) <= categories and categories <= set(rules.actions)
    assert all(isinstance(c, CrashCategory) for c in categories)  # the table's words read into the enum
    assert rules.actions[CrashCategory.OUTPUT_COLLAPSE].kind == CrashAction.RECORD
    assert rules.actions[CrashCategory.NO_TRAINING].on_baseline == CrashAction.STOP
    assert rules.actions[CrashCategory.REWARD_CONSTANT].on_baseline == CrashAction.STOP


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "NaN"])
def test_a_nan_or_infinite_eval_is_a_failure_though_every_step_is_finite(value):
    """The verdict would compare it: one NaN baseline run makes every gain NaN (every verdict flat), an infinite
    trial value an infinite gain (improved)."""
    steps = [{"step": i, "loss": 0.1, "reward_mean": 0.4, "response_length_mean": 4.0} for i in (1, 2, 3)]
    evals = [{"step": 3, "eval/id/greedy_pass@1": 0.5}, {"step": 3, "eval/id/sampling_pass@8": value}]
    found = silent.check(steps, None, "", 3, evals=evals)
    assert found is not None and found.check == "nonfinite" and found.category == CrashCategory.NAN_DIVERGENCE
    assert found.root_cause_line.startswith("eval at step 3: eval/id/sampling_pass@8 = ")
    assert silent.check(steps, None, "", 3, evals=evals[:1]) is None


def test_a_nan_or_infinite_objective_is_no_value_to_judge():
    recipe = validate_recipe({"name": "r", "objective": {"metric": "eval/id/sampling_pass@8", "reduction": "last"}})
    runs = [RunMetrics([{"type": "eval", "step": 3, "eval/id/sampling_pass@8": v}]) for v in (0.5, math.nan, math.inf)]
    assert [objective_value(m, recipe) for m in runs] == [0.5, None, None]
    assert runs_of(runs, recipe).values == [0.5]


def test_an_objective_the_run_never_logs_names_the_keys_it_did_log():
    steps = [{"step": i, "loss": 0.1, "reward_mean": 0.4} for i in (1, 2, 3)]
    evals = [
        {
            "type": "eval",
            "step": 3,
            "eval/id/greedy_pass@1": 0.5,
            "eval/id/items": [1, 0],
            "eval/ood/greedy_pass@1": 0.4,
        }
    ]
    found = silent.missing_objective(steps, evals, "eval/id/greedy_pas@1")
    assert found is not None and found.check == "no_objective" and found.category == CrashCategory.CONFIG_ERROR
    assert found.root_cause_line == (
        "no eval record has the objective metric eval/id/greedy_pas@1 (did you mean "
        "eval/id/greedy_pass@1?); they have: eval/id/greedy_pass@1, eval/ood/greedy_pass@1"
    )
    assert "set objective.metric to a key the run logs" in found.remedy and "{metric}" not in found.remedy
    step_key = silent.missing_objective(steps, evals, "reward")
    assert step_key is not None and step_key.root_cause_line.startswith(
        "no step record has the objective metric reward"
    )
    assert silent.missing_objective(steps, evals, "eval/id/greedy_pass@1") is None  # it is there
    assert silent.missing_objective(steps, [], "eval/id/greedy_pass@1") is None  # no eval at all: no evidence of a name
    many = [{"step": 1, **{f"k{i:02d}": 0.0 for i in range(20)}}]
    assert silent.missing_objective(many, [], "zzz").root_cause_line.endswith("k11 and 8 more")
