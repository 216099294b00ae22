"""Confirmed recipes ranked by their gain over the baseline, measured on their fresh-seed runs; promote's default
pick follows that rank; and the smallest gain a test could have detected.

The study's ledger (tests/study_ledger.py) holds a chain of two confirmed improvements, 05 (lr 5e-6 on the
baseline) and 08 (lr 5e-5 on top of 05). Each verdict is against its parent, and 05's lower bound over its parent
is the higher one: ranking by it promoted the weaker recipe.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from autorl.judge import gains
from autorl.ledger import Ledger, Trial
from autorl.metrics import value_range
from autorl.promote.promotion import pick_best
from autorl.recipe import Objective
from autorl.states import Confirmation
from tests.study_ledger import items, write_study


@pytest.fixture
def ledger(tmp_path):
    return Ledger(write_study(tmp_path))


def test_a_chain_of_two_confirmed_improvements_ranks_the_later_one_first(ledger):
    first, second = ledger.trial(5), ledger.trial(8)
    assert first.ci_low > second.ci_low  # the parent-relative bound that picked the weaker recipe
    ranked = gains.ranked(gains.study_gains(ledger, ledger.study()))
    assert [g.number for g in ranked] == [8, 5]
    assert ranked[0].chain == [5, 8] and ranked[1].chain == [5]
    assert ranked[0].delta > second.delta + 0.02  # over the baseline, not only its step over 05
    assert ranked[0].ci_low > ranked[1].ci_low > 0
    row, why = pick_best(ledger)
    assert row.number == 8
    assert "largest gain over the baseline" in why and "05 → 08" in why and "2 fresh-seed runs" in why


def test_the_gain_is_measured_on_the_fresh_seed_runs_against_the_baseline_runs(ledger):
    g = gains.study_gains(ledger, ledger.study())[8]
    fresh = [np.mean(items(0.63, n)) for n in (9, 10)]  # 08's confirmation runs; its own lucky run left out
    base = [np.mean(items(0.48, n)) for n in (1, 2, 3, 4)]
    assert g.delta == pytest.approx(np.mean(fresh) - np.mean(base))
    assert (g.runs, g.baseline_runs, g.n, g.method) == (2, 4, 400, "paired_items")
    assert g.ci_low < g.delta < g.ci_high


def test_a_rejected_or_open_candidate_is_never_ranked(ledger):
    ledger.set_confirmation(8, Confirmation.REJECTED, "fresh seeds disagreed")
    ranked = gains.ranked(gains.study_gains(ledger, ledger.study()))
    assert [g.number for g in ranked] == [5]
    assert pick_best(ledger)[0].number == 5


def test_chain_follows_parents_and_survives_a_loop():
    rows = {5: Trial(number=5, parent=None), 8: Trial(number=8, parent=5), 12: Trial(number=12, parent=8)}
    assert gains.chain_of(rows, 12) == [5, 8, 12]
    assert gains.chain_of({1: Trial(number=1, parent=2), 2: Trial(number=2, parent=1)}, 1) == [2, 1]


def test_detectable_gain_of_an_interval():
    z80 = 0.8416212335729143
    assert gains.detectable(-0.05, 0.05, 0.95) == pytest.approx(0.05 * (1 + z80 / 1.959963984540054))
    assert gains.detectable(-0.05, 0.05, 0.95, min_effect=0.01) == pytest.approx(0.01 + 0.05 * 1.4294, abs=1e-4)
    assert gains.detectable(-0.02, 0.02, 0.95) < gains.detectable(-0.05, 0.05, 0.95)  # a tighter test sees more
    assert gains.detectable(-math.inf, math.inf, 0.95) is None


def test_a_test_that_would_need_more_than_the_metric_allows_could_detect_no_gain():
    """The soak's flat trials: two baseline runs (one replicate df, t at 12.7) gave a pass@1 interval of
    [-1.666, +1.901] around a gain of +0.117 over a parent at 0.508; 'could detect a gain of +2.550' named a gain
    no pass@1 can make. A gain over that parent is at most +0.492: the test is blind, and says so."""
    row = Trial(objective=0.625, delta=0.1171875, ci_low=-1.666497249599213, ci_high=1.900872249599213)
    pass1 = Objective(metric="eval/id/greedy_pass@1")
    blind = gains.sensitivity(row, pass1, 0.95)
    assert blind.detectable == pytest.approx(2.550, abs=1e-3) and blind.possible == pytest.approx(1 - 0.5078125)
    assert blind.blind and blind.seen is None
    narrow = gains.sensitivity(row.replace(ci_low=0.05, ci_high=0.18), pass1, 0.95)
    assert not narrow.blind and narrow.seen == pytest.approx(0.065 * 1.4294, abs=1e-4)
    reward = gains.sensitivity(row, Objective(metric="reward_mean"), 0.95)  # no known range: stated as it is
    assert reward.possible is None and reward.seen == pytest.approx(2.550, abs=1e-3)
    low_is_better = Objective(metric="eval/id/truncated_rate", direction="minimize")  # a share, to be lowered
    assert gains.sensitivity(row.replace(objective=0.1, delta=0.05), low_is_better, 0.95).possible == pytest.approx(
        0.15
    )
    assert gains.sensitivity(Trial(ci_low=-0.1, ci_high=0.1), pass1, 0.95).possible == 1.0  # parent unknown


def test_the_range_of_a_metric_comes_from_the_schema():
    assert value_range("eval/ood/greedy_pass@1") == value_range("eval/id/sampling_pass@16") == (0.0, 1.0)
    assert value_range("correctness") == value_range("eval/id/empty_rate") == (0.0, 1.0)
    assert value_range("reward_mean") is value_range("eval/id/length_mean") is value_range("loss") is None
