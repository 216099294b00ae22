"""judge(), confirm(), credit(), objective_items(): verdicts on synthetic runs with known answers; flags()."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autorl.judge.abort import load_window_rules
from autorl.judge.verdict import FLAG_LIMITS, Noise, Runs, confirm, credit, flags, judge, objective_items
from autorl.recipe import AbortRules, Objective, VerdictSettings
from autorl.states import Verdict

N_ITEMS = 200
S = VerdictSettings()


def runs(rng: np.random.Generator, p: np.ndarray, effect: float, n_runs: int, shift_sd: float = 0.0) -> Runs:
    """0/1 results per item for n_runs seeds: each item solved with prob p + effect (+ a per-run shift)."""
    items = []
    for _ in range(n_runs):
        q = np.clip(p + effect + rng.normal(0, shift_sd), 0, 1)
        items.append((rng.random(p.shape[0]) < q).astype(int).tolist())
    return Runs(values=[float(np.mean(r)) for r in items], items=items)


def one_case(
    seed: int,
    effect: float,
    repeats: int = 3,
    shift_sd: float = 0.0,
    direction: str = "maximize",
    n_items: int = N_ITEMS,
    settings: VerdictSettings = S,
):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.1, 0.9, n_items)
    base = runs(rng, p, 0.0, repeats, shift_sd)
    trial = runs(rng, p, effect, 1, shift_sd)
    return judge(trial, base, settings, direction)


def test_true_15_point_gain_is_improved():
    calls = [one_case(seed, 0.15).verdict for seed in range(40)]
    assert calls.count(Verdict.IMPROVED) >= 32  # power >= 80% with three baseline repeats
    v = one_case(3, 0.15)
    assert v.method == "paired_items" and v.n == N_ITEMS and v.blind == ""
    assert v.ci_low < v.delta < v.ci_high and 0.08 < v.delta < 0.22


def test_no_effect_is_rarely_called_improved():
    calls = [one_case(1000 + seed, 0.0).verdict for seed in range(200)]
    assert calls.count(Verdict.IMPROVED) < 10  # < 5% of 200 repeats


def test_no_effect_with_large_run_level_seed_noise_is_rarely_called_improved():
    # run sd 0.05: the old z-widened bootstrap called ~7% of these improved with two repeats
    calls = [one_case(5000 + seed, 0.0, repeats=3, shift_sd=0.05).verdict for seed in range(300)]
    assert calls.count(Verdict.IMPROVED) < 15


def test_true_loss_is_regressed():
    v = one_case(7, -0.15)
    assert v.verdict == Verdict.REGRESSED and v.ci_high < 0


def test_minimize_flips_the_sign():
    up = one_case(7, -0.15, direction="maximize")
    down = one_case(7, -0.15, direction="minimize")
    assert up.verdict == Verdict.REGRESSED and down.verdict == Verdict.IMPROVED
    assert down.delta == pytest.approx(-up.delta)
    assert (down.ci_low, down.ci_high) == pytest.approx((-up.ci_high, -up.ci_low))


def test_min_effect_raises_the_bar():
    v = one_case(3, 0.15)
    strict = one_case(3, 0.15, settings=VerdictSettings(min_effect=v.ci_low + 0.01))
    assert strict.verdict == Verdict.FLAT and "min_effect" in strict.explanation


def test_disagreeing_repeats_widen_the_interval():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.2, 0.8, N_ITEMS)
    trial = runs(rng, p, 0.1, 1)
    one = runs(rng, p, 0.0, 1)
    close = Runs(values=one.values * 3, items=one.items * 3)  # identical repeats: no run-level spread
    far = Runs(values=[0.0] * 3, items=[runs(rng, np.clip(p + s, 0, 1), 0.0, 1).items[0] for s in (-0.08, 0.0, 0.08)])
    a, b = judge(trial, close, S, "maximize"), judge(trial, far, S, "maximize")
    assert (b.ci_high - b.ci_low) > 1.5 * (a.ci_high - a.ci_low)
    assert b.parent_sd > 0.05 and b.parent_df == 2
    assert b.trial_sd == b.parent_sd and b.trial_noise == "the parent's"  # one run: never assumed quieter


def test_negative_raw_noise_is_reported_not_silently_zeroed():
    rng = np.random.default_rng(4)
    p = rng.uniform(0.2, 0.8, N_ITEMS)
    one = runs(rng, p, 0.0, 1).items[0]
    shuffled = [one, list(rng.permutation(one)), list(rng.permutation(one))]  # equal means, items disagree
    same = Runs(values=[float(np.mean(r)) for r in shuffled], items=shuffled)  # raw estimate = -flips/n < 0
    v = judge(runs(rng, p, 0.0, 1), same, S, "maximize")
    assert "raw replicate estimate -" in v.explanation and "prior 0.02" in v.explanation


def test_one_baseline_run_says_what_it_cannot_see():
    rng = np.random.default_rng(2)
    p = rng.uniform(0.1, 0.9, N_ITEMS)
    v = judge(runs(rng, p, 0.25, 1), runs(rng, p, 0.0, 1), S, "maximize")
    assert v.method == "paired_items" and v.parent_df == 0 and "not measured" in v.blind
    assert v.parent_sd == pytest.approx(S.run_sd_prior) and v.verdict == Verdict.IMPROVED
    two = judge(runs(rng, p, 0.0, 1), runs(rng, p, 0.0, 2), S, "maximize")
    assert "1 replicate df" in two.blind


def test_a_study_whose_changed_recipes_are_noisier_widens_the_trial_arm():
    rng = np.random.default_rng(5)
    p = rng.uniform(0.1, 0.9, N_ITEMS)
    trial, parent = runs(rng, p, 0.0, 1), runs(rng, p, 0.0, 3)
    loud = [
        Runs(values=[0.0] * 3, items=[runs(rng, np.clip(p + s, 0, 1), 0.0, 1).items[0] for s in (-0.08, 0.0, 0.08)])
        for _ in range(4)
    ]  # changed recipes whose seeds move them by 8 points
    quiet = [runs(rng, p, 0.0, 3) for _ in range(4)]
    alone = judge(trial, parent, S, "maximize")
    v = judge(trial, parent, S, "maximize", Noise(study=loud))
    assert v.trial_noise == "the study's changed recipes" and v.trial_df == 4 * 2 and v.parent_df == 2
    assert v.trial_sd > 2 * v.parent_sd and v.ci_high - v.ci_low > 1.3 * (alone.ci_high - alone.ci_low)
    same = judge(trial, parent, S, "maximize", Noise(study=quiet))  # as quiet as the parent: nothing changes
    assert same.trial_noise == "the parent's" and same.ci_low == pytest.approx(alone.ci_low)


def test_fallback_t_interval_from_run_values():
    v = judge(Runs(values=[0.62]), Runs(values=[0.50, 0.52, 0.49, 0.51]), S, "maximize")
    assert v.method == "run_values" and v.n == 5 and v.df == pytest.approx(3 + S.run_sd_prior_df)
    assert v.verdict == Verdict.IMPROVED and v.delta == pytest.approx(0.115)
    noisy = judge(Runs(values=[0.62]), Runs(values=[0.40, 0.60]), S, "maximize")
    assert noisy.verdict == Verdict.FLAT


def test_fallback_is_not_hopeless_with_default_repeats():
    # the old fallback had 1 df (t = 12.7) with two baseline values; three values plus the prior give 3 df
    v = judge(Runs(values=[0.58]), Runs(values=[0.50, 0.51, 0.49]), S, "maximize")
    assert v.verdict == Verdict.IMPROVED and v.df == pytest.approx(3)


def test_fallback_for_a_train_metric_objective_does_not_crash():
    v = judge(Runs(values=[0.31]), Runs(values=[0.30, 0.29, 0.33]), S, "maximize")  # e.g. objective reward_mean
    assert v.method == "run_values" and v.verdict == Verdict.FLAT


def test_unknown_noise_without_prior_is_flat():
    v = judge(Runs(values=[0.9]), Runs(values=[0.1]), VerdictSettings(run_sd_prior_df=0), "maximize")
    assert v.method == "unknown_noise" and v.verdict == Verdict.FLAT and math.isinf(v.ci_high)


@pytest.mark.parametrize("off", [{"run_sd_prior_df": 0}, {"run_sd_prior": 0}])
def test_per_item_results_do_not_stand_in_for_unmeasured_run_noise(off):
    """One run each and the prior switched off: the items' flips would take the run-to-run noise for zero (a
    seed's shift of the whole eval would pass for a gain), so there is no verdict but flat; a second parent run
    measures it and the items are judged again."""
    rng = np.random.default_rng(3)
    p = rng.uniform(0.2, 0.8, 400)
    trial = (rng.random(400) < np.clip(p + 0.08, 0, 1)).astype(int)
    parent = [(rng.random(400) < p).astype(int) for _ in range(2)]
    settings = VerdictSettings(**off)
    one = judge(
        Runs(values=[trial.mean()], items=[trial.tolist()]),
        Runs(values=[parent[0].mean()], items=[parent[0].tolist()]),
        settings,
        "maximize",
    )
    assert (one.method, one.verdict) == ("unknown_noise", Verdict.FLAT) and math.isinf(one.ci_low)
    assert one.delta == pytest.approx(trial.mean() - parent[0].mean())
    two = judge(
        Runs(values=[trial.mean()], items=[trial.tolist()]),
        Runs(values=[x.mean() for x in parent], items=[x.tolist() for x in parent]),
        settings,
        "maximize",
    )
    assert two.method == "paired_items" and math.isfinite(two.ci_low)


def test_mismatched_item_lists_fall_back_to_values():
    v = judge(Runs(values=[0.66], items=[[1, 0, 1]]), Runs(values=[0.5, 0.4], items=[[1, 0], [0, 0]]), S, "maximize")
    assert v.method == "run_values"


def test_bad_direction_and_missing_values_raise():
    with pytest.raises(ValueError, match="direction"):
        judge(Runs(values=[1.0]), Runs(values=[1.0]), S, "max")
    with pytest.raises(ValueError, match="at least one"):
        judge(Runs(values=[]), Runs(values=[1.0]), S, "maximize")


# ---- confirm and credit ------------------------------------------------------------------


def test_confirm_uses_the_stricter_level_and_the_fresh_runs_as_their_own_noise():
    rng = np.random.default_rng(9)
    p = rng.uniform(0.1, 0.9, 500)
    v = confirm(runs(rng, p, 0.12, 2), runs(rng, p, 0.0, 3), S, "maximize")
    assert v.level == S.confirm_level and v.verdict == Verdict.IMPROVED and v.parent_df == 2
    assert (v.trial_noise, v.trial_df) in {("its own runs", 1), ("the parent's", 2)}
    null = [confirm(runs(rng, p, 0.0, 2), runs(rng, p, 0.0, 3), S, "maximize").verdict for _ in range(100)]
    assert null.count(Verdict.IMPROVED) <= 3


def test_credit_judges_against_the_parent_and_reports_the_baseline_gain():
    rng = np.random.default_rng(11)
    p = rng.uniform(0.1, 0.8, 500)
    base = runs(rng, p, 0.0, 3)
    parent = runs(rng, p, 0.10, 3)  # an earlier confirmed improvement
    trial = runs(rng, p, 0.10, 1)  # built on the parent, adds nothing
    c = credit(trial, parent, base, S, "maximize")
    assert c.vs_parent.verdict == Verdict.FLAT and c.vs_baseline.verdict == Verdict.IMPROVED
    same = credit(trial, base, base, S, "maximize")
    assert same.vs_parent == same.vs_baseline


# ---- objective items ----------------------------------------------------------------------


def evals_with(values_items: list[tuple[int, list[int]]]) -> list[dict]:
    return [
        {"type": "eval", "step": s, "eval/id/greedy_pass@1": sum(it) / len(it), "eval/id/items": it}
        for s, it in values_items
    ]


EVALS = evals_with([(0, [0, 0, 0, 0]), (10, [1, 1, 1, 0]), (20, [1, 0, 0, 0]), (30, [0, 1, 1, 0])])


def test_objective_items_follow_the_reduction():
    last = objective_items(EVALS, Objective(reduction="last"))
    best = objective_items(EVALS, Objective(reduction="best"))
    mean3 = objective_items(EVALS, Objective(reduction="mean_last_k", k=2))
    assert last == [0, 1, 1, 0] and best == [1, 1, 1, 0]
    assert mean3 == pytest.approx([0.5, 0.5, 0.5, 0.0])
    assert np.mean(mean3) == pytest.approx(np.mean([0.25, 0.5]))  # the items reduce to the objective


def test_objective_items_minimize_best_picks_the_lowest():
    assert objective_items(EVALS, Objective(reduction="best", direction="minimize")) == [0, 0, 0, 0]


def test_objective_items_none_where_the_engine_has_no_items():
    assert objective_items(EVALS, Objective(metric="eval/id/sampling_pass@4")) is None
    assert objective_items(EVALS, Objective(metric="reward_mean")) is None
    assert objective_items(EVALS, Objective(metric="eval/ood/greedy_pass@1")) is None


# ---- flags -----------------------------------------------------------------------------


def steps_of(n: int, **series) -> list[dict]:
    rows = []
    for i in range(n):
        row = {"type": "step", "step": i + 1}
        row.update({k: (f(i) if callable(f) else f) for k, f in series.items()})
        rows.append(row)
    return rows


HEALTHY = steps_of(
    20,
    reward_mean=lambda i: 0.3 + 0.005 * i,
    response_length_mean=lambda i: 40 + (i % 3),
    truncated_rate=lambda i: 0.1 + 0.5 * (i == 7),
)
HEALTHY_EVALS = [
    {"type": "eval", "step": s, "eval/ood/greedy_pass@1": v} for s, v in [(5, 0.30), (10, 0.33), (15, 0.32), (20, 0.34)]
]


def names(found) -> set[str]:
    return {f.name for f in found}


def test_healthy_run_has_no_flags():
    assert flags(HEALTHY, HEALTHY_EVALS, {"steps_done": 20, "status": "ok"}, 20) == []


def test_train_eval_divergence():
    evals = [
        {"type": "eval", "step": s, "eval/ood/greedy_pass@1": v}
        for s, v in [(5, 0.40), (10, 0.42), (15, 0.39), (20, 0.35)]
    ]
    found = flags(HEALTHY, evals, {"steps_done": 20, "status": "ok"}, 20)
    assert names(found) == {"train_eval_divergence"}
    assert "0.42 -> 0.39 -> 0.35" in found[0].evidence
    flat_reward = steps_of(20, reward_mean=0.3)
    assert flags(flat_reward, evals, None, 20) == []


def test_length_collapse():
    s = steps_of(20, response_length_mean=lambda i: 200 if i < 10 else 30)
    found = flags(s, [], {"steps_done": 20, "status": "ok"}, 20)
    assert names(found) == {"length_collapse"} and "200" in found[0].evidence


def test_high_truncation_must_be_sustained():
    sustained = steps_of(12, truncated_rate=lambda i: 0.8 if i >= 4 else 0.2)
    assert names(flags(sustained, [], None, 12)) == {"high_truncation"}
    blips = steps_of(12, truncated_rate=lambda i: 0.9 if i % 3 == 0 else 0.1)
    assert flags(blips, [], None, 12) == []


def test_truncation_flag_reads_the_abort_threshold():
    at_07 = steps_of(12, truncated_rate=0.7)
    assert "truncation_rate" not in FLAG_LIMITS  # the rate lives in the recipe's abort block only
    assert names(flags(at_07, [], None, 12)) == {"high_truncation"}  # default abort.truncated_rate 0.5
    assert flags(at_07, [], None, 12, abort=AbortRules(truncated_rate=0.75)) == []
    found = flags(at_07, [], None, 12, abort=AbortRules(truncated_rate=0.6))
    assert names(found) == {"high_truncation"} and "> 0.6 " in found[0].evidence
    rule = next(r for r in load_window_rules() if r.metric == "truncated_rate")
    assert rule.limit == "truncated_rate"  # early abort names the same threshold


def test_exit_zero_with_no_training_steps():
    found = flags(
        [], [{"type": "eval", "step": 0, "eval/id/greedy_pass@1": 0.4}], {"steps_done": 0, "status": "ok"}, 50
    )
    assert names(found) == {"no_training"} and "0 of 50" in found[0].evidence
    assert flags([], [], {"steps_done": 0, "status": "ok"}, 0) == []


def test_short_run_reported_ok():
    found = flags(HEALTHY[:5], [], {"steps_done": 5, "status": "ok"}, 50)
    assert names(found) == {"short_run"}


def test_the_explanation_names_the_level_it_used_unrounded():
    """The default confirmation is at 97.5 %: the line must not say '98%' (a level no test used)."""
    fresh = Runs(values=[0.6, 0.6], items=[[1.0] * 60 + [0.0] * 40, [1.0] * 61 + [0.0] * 39])
    parent = Runs(values=[0.4] * 3, items=[[1.0] * 40 + [0.0] * 60, [1.0] * 41 + [0.0] * 59, [1.0] * 39 + [0.0] * 61])
    v = confirm(fresh, parent, VerdictSettings(), "maximize")
    assert v.level == 0.975 and "97.5% CI" in v.explanation and "98%" not in v.explanation
    assert "95% CI" in judge(fresh, parent, VerdictSettings(), "maximize").explanation


def test_best_of_k_takes_each_half_of_the_items_from_the_eval_the_other_half_ranks_best():
    two = evals_with([(10, [1, 0, 1, 0]), (20, [0, 1, 0, 1])])  # evens solved at step 10, odds at step 20
    assert objective_items(two, Objective(reduction="best")) == [0, 0, 0, 0]
    assert objective_items(evals_with([(10, [1, 0, 1])]), Objective(reduction="best")) == [1, 0, 1]


def test_best_of_many_evals_is_not_biased_upward_by_its_own_coin_flips():
    # 8 evals of a run whose every checkpoint is equally good (pass rate p_j, coin flips only): the in-sample best
    # eval's items average above p_j, which made a trial that evaluates more often than its parent look better
    rng = np.random.default_rng(11)
    p = rng.uniform(0.1, 0.9, 200)
    bias = []
    for _ in range(300):
        evals = evals_with([(s, (rng.random(200) < p).astype(int).tolist()) for s in range(8)])
        bias.append(np.mean(objective_items(evals, Objective(reduction="best"))) - p.mean())
    assert abs(np.mean(bias)) < 0.004  # in-sample selection: about +0.045
