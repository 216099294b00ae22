"""autorl.judge.calibrate: a verdict's stated false-positive rate, simulated by its own test at the noise it assumed;
the Clopper-Pearson interval the benchmarks print."""

from __future__ import annotations

import numpy as np
import pytest

from autorl.judge.calibrate import (
    Design,
    columns,
    confirmation_rate,
    describe,
    false_confirmations,
    fp_rate,
    percent,
    stated_rate,
    verdict_rates,
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
