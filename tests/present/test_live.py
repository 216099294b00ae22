"""The line `autorl run` prints per finished trial: the numbers a person reads, the reason only where there is no
verdict to read it from."""

from __future__ import annotations

from autorl.ledger import Trial
from autorl.present.live import verdict_line
from autorl.states import Confirmation, TrialStatus, Verdict

EXPLANATION = (
    "improved: gain +0.0445, 95% CI [+0.002, +0.087] (paired_items, n=500; run-level sd 0.0185 (raw "
    "replicate estimate -7.3e-06 over 6 df, prior 0.02 x 1 df)); lower bound above min_effect 0"
)


def test_a_judged_trial_reads_as_its_verdict_and_gain_over_its_parent():
    row = Trial(
        attempt="attempt-08-move-lr-5em05",
        status=TrialStatus.COMPLETE,
        verdict=Verdict.IMPROVED,
        confirmation=Confirmation.CANDIDATE,
        objective=0.594,
        delta=0.062,
        ci_low=0.018,
        ci_high=0.106,
        parent=5,
        reason=EXPLANATION,
    )
    assert verdict_line(row) == (
        "attempt-08-move-lr-5em05  improved (candidate: fresh-seed runs decide)  "
        "objective 0.5940  Δ +0.0620 [+0.018, +0.106] vs 05"
    )
    flat = row.replace(verdict=Verdict.FLAT, confirmation=None, parent=None)
    assert verdict_line(flat).endswith("vs the baseline") and "replicate" not in verdict_line(flat)


def test_a_crash_or_a_prune_says_why():
    row = Trial(
        attempt="attempt-11-move-lr-5em04",
        verdict=Verdict.PRUNED,
        status=TrialStatus.PRUNED,
        reason="clearly worse than its parent attempt-08 at step 20",
    )
    assert (
        verdict_line(row) == "attempt-11-move-lr-5em04  pruned  - clearly worse than its parent attempt-08 at step 20"
    )
    nobase = Trial(
        attempt="attempt-05",
        status=TrialStatus.COMPLETE,
        verdict=Verdict.FLAT,
        objective=0.5,
        reason="no completed baseline to compare with",
    )
    assert verdict_line(nobase).endswith("- no completed baseline to compare with")
