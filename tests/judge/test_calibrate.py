"""autorl.judge.calibrate: a verdict's stated false-positive rate, simulated by its own test at the noise it assumed;
the Clopper-Pearson interval the benchmarks print."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autorl.judge.calibrate import (
    UNMEASURED,
    Design,
    _draw,
    _sds,
    columns,
    confirmation_rate,
    describe,
    false_confirmations,
    fp_rate,
    logit_scale,
    percent,
    run_sd,
    smoothed,
    stated_rate,
    verdict_rates,
)
from autorl.judge.calibrate import (
    test_name as name_of_test,
)
from autorl.judge.stats import clopper_pearson
from autorl.judge.verdict import Noise, Runs, confirm, judge
from autorl.ledger import Trial
from autorl.recipe import VerdictSettings
from autorl.states import Verdict

S = VerdictSettings()
P = tuple(np.random.default_rng(0).uniform(0.1, 0.9, 300))


def test_a_test_whose_prior_is_the_truth_stays_under_its_nominal_rate():
    # run values only, run sd equal to the prior's: the prior's pseudo-observation is exact, so the t interval with
    # the prior's df counted in is a little wide: each side is called somewhat under the nominal 2.5%
    r = verdict_rates(Design(None, 5, 1, 0, 0, S.run_sd_prior, S.run_sd_prior), S, 0.95)
    assert 0.005 < r.improved < 0.03 and 0.005 < r.regressed < 0.03 and r.cases == 2000
    wide = verdict_rates(Design(None, 5, 1, 0, 0, 3 * S.run_sd_prior, 3 * S.run_sd_prior), S, 0.95)
    assert wide.improved > r.improved  # a run sd far above the prior: the shrinkage pulls the variance down


def test_the_rate_follows_the_level_and_is_reproducible():
    d = Design(P, 5, 1, 0, 0, 0.03, 0.03)
    strict, loose = verdict_rates(d, S, 0.99), verdict_rates(d, S, 0.90)
    assert strict.improved < loose.improved
    assert verdict_rates(d, S, 0.90) == loose
    assert fp_rate(Verdict.IMPROVED, loose) == loose.improved and fp_rate(Verdict.REGRESSED, loose) == loose.regressed
    assert fp_rate(Verdict.FLAT, loose) == pytest.approx(loose.improved + loose.regressed)


def test_a_confirmed_false_positive_is_rarer_than_a_candidate():
    d = Design(P, 5, 1, 0, 0, 0.03, 0.03)
    assert 0 <= false_confirmations(d, S) < verdict_rates(d, S, S.level).improved


def test_a_verdict_states_its_test_noise_and_rate():
    rng = np.random.default_rng(1)
    p = np.asarray(P)
    runs = [(rng.random(p.size) < p).astype(int).tolist() for _ in range(6)]
    v = judge(Runs(values=[0.0], items=runs[:1]), Runs(values=[0.0] * 5, items=runs[1:]), S, "maximize")
    rate = stated_rate(v, S)
    assert 0 <= rate < 0.05 and v.parent_runs == 5 and v.trial_runs == 1 and len(v.parent_rates) == p.size
    line = describe({"test": "t", "trial_sd": v.trial_sd, "parent_sd": v.parent_sd, "fp_rate": rate})
    assert line.startswith("t; run-to-run sd assumed: trial ") and line.endswith(
        f"calibrated false-positive rate {percent(rate)}"
    )
    row = Trial(test="t", trial_sd=v.trial_sd, parent_sd=v.parent_sd, fp_rate=rate)  # a ledger row says the same
    assert describe(row) == line and describe(row, "confirm_") is None
    assert describe({}) is None and describe(Trial()) is None
    # none of the simulated null trials called so is a rate below 1 in CASES, never "0.0%"
    assert percent(0.0) == "<0.05%" and percent(0.0249) == "2.5%"
    assert describe({"test": "t", "fp_rate": 0.0}).endswith("calibrated false-positive rate <0.05%")
    assert describe(Trial(confirm_test="t", confirm_fp_rate=0.0), "confirm_").endswith(
        "trial -, parent -; calibrated false-positive rate <0.05%"
    )


def test_clopper_pearson_known_values():
    assert clopper_pearson(0, 30)[1] == pytest.approx(0.1157, abs=1e-4)
    low, high = clopper_pearson(5, 100)
    assert (low, high) == pytest.approx((0.01643, 0.11283), abs=1e-4)
    assert clopper_pearson(10, 10)[1] == 1.0 and clopper_pearson(0, 0) == (0.0, 1.0)


def test_a_confirmation_states_the_rate_of_a_null_candidate_being_confirmed_not_of_its_fresh_runs_alone():
    """The screening and the confirmation share the baseline runs: an unlucky-low baseline passes a null candidate
    through both. Given a screened null, the confirmation passed 4-6% of the time where the fresh runs' own test
    stated 0.7-1.1%; a confirmed verdict now states the conditional rate."""
    rng = np.random.default_rng(1)
    p = np.asarray(P)

    def run(shift: float) -> list[int]:
        return (rng.random(len(p)) < np.clip(p + shift, 0, 1)).astype(int).tolist()

    parent = [run(rng.normal(0, 0.04)) for _ in range(5)]
    fresh = [run(0.15 + rng.normal(0, 0.04)) for _ in range(3)]
    runs = lambda rs: Runs(values=[float(np.mean(r)) for r in rs], items=rs)  # noqa: E731
    v = confirm(runs(fresh), runs(parent), S, "maximize", Noise(trial=[runs(fresh + [run(0.15)])]))
    assert v.verdict == Verdict.IMPROVED
    stated = columns(v, S, confirmation=True)["confirm_fp_rate"]
    assert stated == confirmation_rate(v, S) and stated > 2 * stated_rate(v, S)
    assert columns(v, S)["fp_rate"] == stated_rate(v, S)  # a screening verdict keeps its own test's rate


def _observed(runs: int, seed: int = 3) -> tuple[float, ...]:
    """Items' observed solve rates over ``runs`` runs of items with true rates ``P``."""
    rng = np.random.default_rng(seed)
    return tuple((rng.random((runs, len(P))) < np.asarray(P)).mean(axis=0))


@pytest.mark.parametrize("sd", [0.01, 0.02, 0.05])
@pytest.mark.parametrize("runs", [2, 5])
def test_the_simulator_reproduces_the_run_sd_it_is_given(sd, runs):
    """Items seen at 0 or 1 used to barely move (clipped shifts): the simulated run sd was 0.62-0.89x the assumed.
    Now each item's rate is smoothed and a run shifts the logits; the run means' sd less the flips' share is the
    assumed sd within 10%."""
    d = Design(_observed(runs), runs, 1, 0, 0, sd, sd)
    x = _draw(np.random.default_rng(7), d, np.full(6000, sd), 2)  # (cases, 2 runs, items)
    m = x.mean(axis=-1)
    flips = np.var(x, axis=1, ddof=1).mean(axis=-1).mean() / x.shape[-1]
    simulated = math.sqrt(max(np.var(m[:, 0] - m[:, 1]) / 2 - flips, 0.0))
    assert simulated == pytest.approx(sd, rel=0.10)
    q = smoothed(np.asarray(d.p), runs)
    assert run_sd(q, logit_scale(q, sd)) == pytest.approx(sd, rel=0.02)  # the quadrature the scale is solved on


def test_smoothed_rates_keep_the_mean_and_leave_no_item_certain():
    p = np.asarray(_observed(2))
    q = smoothed(p, 2)
    assert ((p == 0) | (p == 1)).mean() > 0.2 and 0 < q.min() and q.max() < 1
    assert q.mean() == pytest.approx(p.mean(), abs=1e-9)
    assert np.all(np.diff(q[np.argsort(p, kind="stable")]) >= -1e-12)  # the order of the items is kept
    assert np.abs(q - np.asarray(P)).mean() < np.abs(p - np.asarray(P)).mean()  # nearer the truth than raw


def test_each_simulated_case_draws_its_true_run_sd_from_what_the_estimate_knows():
    """Not a plugged-in point estimate: the parent's sd from a scaled inverse chi-square with its replicate df
    (assumed / true variance is chi-square / df: mean 1, variance 2 / df); a measured trial recipe's sd drawn apart
    with its own df; an unmeasured one as noisy as the parent's, case by case."""
    d = Design(P, 5, 1, 0, 0, 0.02, 0.03, 4, 6)
    sd_p, sd_t = _sds(np.random.default_rng(5), d, S, 40000)
    for sd, assumed, df in ((sd_p, 0.02, 4), (sd_t, 0.03, 6)):
        ratio = np.square(assumed / sd)
        assert ratio.mean() == pytest.approx(1.0, abs=0.03) and ratio.var() == pytest.approx(2 / df, rel=0.1)
    assert abs(np.corrcoef(sd_p, sd_t)[0, 1]) < 0.03
    sd_p, sd_t = _sds(np.random.default_rng(5), d._replace(trial_df=0), S, 1000)
    assert np.allclose(sd_t, 1.5 * sd_p) and sd_p.std() > 0.002
    narrow = _sds(np.random.default_rng(6), d, S, 40000)[0]
    wide = _sds(np.random.default_rng(6), d._replace(parent_df=1), S, 40000)[0]  # two parent runs: 1 df
    assert np.quantile(wide, 0.9) > 1.3 * np.quantile(narrow, 0.9)


def test_an_unmeasured_trial_recipe_says_its_rate_rests_on_the_parents_noise():
    rng = np.random.default_rng(1)
    p = np.asarray(P)
    runs = [(rng.random(p.size) < p).astype(int).tolist() for _ in range(9)]
    one = judge(Runs(values=[0.0], items=runs[:1]), Runs(values=[0.0] * 5, items=runs[1:6]), S, "maximize")
    assert name_of_test(one).endswith(UNMEASURED) and UNMEASURED in columns(one, S)["test"]
    own = Noise(trial=[Runs(values=[0.0] * 3, items=runs[:1] + runs[6:8])])
    measured = judge(Runs(values=[0.0], items=runs[:1]), Runs(values=[0.0] * 5, items=runs[1:6]), S, "maximize", own)
    assert UNMEASURED not in name_of_test(measured)
