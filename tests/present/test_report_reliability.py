"""The report's reliability picture: the stated false-positive rate against the study's own A/A (each baseline run
judged against the others as a trial is)."""

from __future__ import annotations

import numpy as np

from autorl.judge.evidence import StudyErrors
from autorl.judge.verdict import Runs, judge
from autorl.present.report import _plot_reliability, _pyplot, aa_rates
from autorl.recipe import VerdictSettings
from autorl.states import Verdict

S = VerdictSettings()


def _aa(shift: float) -> list:
    """Four baseline runs (300 items, run sd 0.02) and the A/A comparisons a study makes; run 1 is shifted."""
    rng = np.random.default_rng(2)
    p = rng.uniform(0.1, 0.9, 300)
    shifts = rng.normal(0.0, 0.02, 4) + np.array([shift, 0, 0, 0])
    runs = [(rng.random(p.size) < np.clip(p + s, 0, 1)).astype(int).tolist() for s in shifts]
    pick = lambda idx: Runs(values=[float(np.mean(runs[j])) for j in idx], items=[runs[j] for j in idx])  # noqa: E731
    return [(i, judge(pick([i]), pick([j for j in range(4) if j != i]), S, "maximize")) for i in range(4)]


def _data(aa: list) -> dict:
    return {"errors": StudyErrors({}, 0.02, 3, None, 0, None, None, aa), "verdict": S}


def test_the_picture_states_each_aa_tests_rate_beside_what_the_aa_called():
    stated, (improved, regressed, n) = aa_rates(_data(_aa(0.0)))
    assert n == 4 and len(stated) == 4 and improved + regressed <= 1
    assert all(0.0 < up < 0.08 and 0.0 < down < 0.08 for up, down in stated)  # near the nominal 2.5% each side
    shifted = aa_rates(_data(_aa(0.15)))[1]
    assert shifted[0] >= 1  # a baseline run far above the others is an A/A that called improved, and it shows
    plt = _pyplot()
    fig = _plot_reliability(plt, _data(_aa(0.15)))
    assert len(fig.axes) == 2 and fig.axes[0].get_title().startswith("A/A")
    bars = [b.get_height() for b in fig.axes[1].patches]
    assert bars[2] == 0.25  # the A/A share called improved: 1 of 4
    plt.close(fig)
    assert _plot_reliability(plt, _data([])) is None
    assert Verdict.IMPROVED in {v.verdict for _, v in _aa(0.15)}
