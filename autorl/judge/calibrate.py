"""An error rate on every decision: what a verdict's test calls a trial that changed nothing, at the noise it assumed.

A verdict assumes a run-to-run sd for each arm (``Judgement.parent_sd``, ``trial_sd``) and rests on a few replicate
runs. Its **calibrated false-positive rate** is measured, not quoted: null trials (the parent's per-item solve
rates, each arm shifted by its assumed sd, coin flips on every item) are judged by the very same vectorised test
(``autorl.judge.noise.gain``: each simulated case re-estimates its noise from its own simulated replicates, as the
real verdict did), and the share called improved (or regressed) is the rate. At the nominal level a one-sided
call would be 2.5%; the prior, the few replicate df and binary items move it, which is why it is simulated.

A study's report adds the expected number of false confirmations at the noise measured in the study (a null
trial passing both the screening and the fresh-seed confirmation, times the trials judged) and the A/A evidence of
its own baseline repeats: each baseline run judged against the others.

The simulation is seeded by its inputs, so a verdict's stated rate is reproducible.
"""

from __future__ import annotations

import hashlib
import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from autorl.judge.noise import gain, value_gain
from autorl.judge.verdict import Judgement
from autorl.recipe import VerdictSettings
from autorl.states import Verdict

if TYPE_CHECKING:  # annotations only: the calibration runs without the ledger
    from autorl.ledger import Trial

CASES = 2000  # simulated null trials per stated rate: about +-0.7 points on a rate near 2.5%
STUDY_CASES = 20000  # for a study's false confirmations, rates near 0.1%
CELLS = 4_000_000  # simulated item results per chunk (memory)


class Design(NamedTuple):
    """The shape of one test: items' solve rates (None: run values only), runs per arm, replicate groups."""

    p: tuple[float, ...] | None
    parent_runs: int
    trial_runs: int
    own_runs: int  # runs in the trial's own replicate group (0: none beyond those judged)
    study_df: int  # replicate df of the study's other changed recipes
    parent_sd: float
    trial_sd: float


class Rates(NamedTuple):
    improved: float
    regressed: float
    cases: int


METHODS = {
    "paired_items": "per-item paired differences plus each arm's run noise",
    "run_values": "run values, each arm's own variance",
}


def test_name(v: Judgement) -> str:
    """The test behind a verdict, in words: what it compares, its t distribution's df and its level."""
    what = METHODS.get(v.method, "no noise model (unknown noise)")
    return f"{what}; Welch-Satterthwaite t ({v.df:.1f} df), {v.level * 100:g}% two-sided"


def columns(v: Judgement, s: VerdictSettings, confirmation: bool = False) -> dict[str, Any]:
    """A verdict's ledger columns for its error rate: ``test``, ``trial_sd``, ``parent_sd``, ``fp_rate``; for a
    ``confirmation`` the same prefixed ``confirm_``, and a confirmed one states ``confirmation_rate``."""
    prefix = "confirm_" if confirmation else ""
    rate = confirmation_rate(v, s) if confirmation and v.verdict == Verdict.IMPROVED else stated_rate(v, s)
    return {
        f"{prefix}test": test_name(v),
        f"{prefix}trial_sd": v.trial_sd,
        f"{prefix}parent_sd": v.parent_sd,
        f"{prefix}fp_rate": rate,
    }


class Stated(NamedTuple):
    """A verdict's (or, prefixed ``confirm_``, a confirmation's) test and error rate as its columns state them."""

    test: str | None
    trial_sd: float | None
    parent_sd: float | None
    fp_rate: float | None


def stated(row: Trial | dict[str, Any], prefix: str = "") -> Stated:
    """The columns ``prefix`` + test, trial_sd, parent_sd, fp_rate of a ledger row, or of a dict of columns
    (``columns``, a ``TrialResult`` dump)."""
    if isinstance(row, dict):
        return Stated(*(row.get(prefix + k) for k in Stated._fields))
    return Stated(*(getattr(row, prefix + k) for k in Stated._fields))


def describe(row: Trial | dict[str, Any], prefix: str = "") -> str | None:
    """One line for a person: the test, each arm's assumed run sd and the calibrated false-positive rate (None when
    the row has no verdict of that kind)."""
    s = stated(row, prefix)
    if not s.test:
        return None
    sd = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
    rate = "not simulated" if s.fp_rate is None else percent(s.fp_rate)
    return (
        f"{s.test}; run-to-run sd assumed: trial {sd(s.trial_sd)}, parent {sd(s.parent_sd)}; calibrated "
        f"false-positive rate {rate}"
    )


def percent(rate: float) -> str:
    """A simulated rate for a person: none of the ``CASES`` simulated null trials is below 1 in ``CASES``, not 0."""
    return f"<{1 / CASES:.2%}" if rate == 0 else f"{rate:.1%}"


def design_of(v: Judgement) -> Design | None:
    """The design a verdict's test had (None: a verdict that modelled no noise, such as unknown_noise)."""
    if v.parent_sd is None or v.trial_sd is None or v.method not in ("paired_items", "run_values"):
        return None
    p = tuple(v.parent_rates) if v.method == "paired_items" and v.parent_rates else None
    return Design(p, v.parent_runs, v.trial_runs, v.own_runs, v.study_df, v.parent_sd, v.trial_sd)


def stated_rate(v: Judgement, s: VerdictSettings) -> float | None:
    """A verdict's calibrated false-positive rate (``fp_rate`` of its call), None when it modelled no noise."""
    d = design_of(v)
    return None if d is None else fp_rate(v.verdict, verdict_rates(d, s, v.level))


def verdict_rates(d: Design, s: VerdictSettings, level: float) -> Rates:
    """The share of null trials the verdict's test calls improved and regressed, at the noise ``d`` assumes."""
    return _rates(_rounded(d), _settings_key(s), level)


def fp_rate(verdict: Verdict, rates: Rates) -> float:
    """The false-positive rate of the call made: improved or regressed; flat: the chance of either call."""
    calls = {Verdict.IMPROVED: rates.improved, Verdict.REGRESSED: rates.regressed}
    return calls.get(verdict, rates.improved + rates.regressed)


@lru_cache(maxsize=256)
def _rates(d: Design, skey: tuple, level: float) -> Rates:
    s = VerdictSettings(**dict(skey))
    rng = np.random.default_rng(_seed(d, skey, level))
    improved = regressed = 0
    for k in _chunks(d, CASES):
        low, high = _judge(rng, d, s, level, k)
        improved += int((low > s.min_effect).sum())
        regressed += int((high < 0).sum())
    return Rates(improved / CASES, regressed / CASES, CASES)


def _judge(
    rng: np.random.Generator,
    d: Design,
    s: VerdictSettings,
    level: float,
    k: int,
    runs: dict[str, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of ``k`` simulated null verdicts of design ``d``; ``runs`` may give the parent's, the trial's and
    the runs its own group adds (``extra``) instead of fresh draws."""
    runs = runs or {}
    parent = runs.get("parent", _draw(rng, d, d.parent_sd, k, d.parent_runs))
    trial = runs.get("trial", _draw(rng, d, d.trial_sd, k, d.trial_runs))
    own_groups = [trial] if d.trial_runs > 1 else []
    if d.own_runs > d.trial_runs:  # the judged runs plus others of the same recipe (a candidate's own run)
        extra = runs.get("extra", _draw(rng, d, d.trial_sd, k, d.own_runs - d.trial_runs))
        own_groups = [np.concatenate([trial, extra], axis=1)]
    study = [_draw(rng, d, d.trial_sd, k, 3) for _ in range(d.study_df // 2)]
    study += [_draw(rng, d, d.trial_sd, k, 2)] if d.study_df % 2 else []
    sources = [x for x in (own_groups, own_groups + study if study else []) if x]
    fn = gain if d.p is not None else value_gain
    g = fn(trial, parent, [parent], sources, s.run_sd_prior, s.run_sd_prior_df, level)
    return g["low"], g["high"]


def false_confirmations(d: Design, s: VerdictSettings) -> float:
    """The chance that a null trial becomes a candidate and is then confirmed by ``confirm_runs`` fresh runs (its
    own run, selected for looking good, joins them in its own group), at the noise ``d`` assumes."""
    return _false_confirmations(_rounded(d._replace(trial_runs=1, own_runs=0)), _settings_key(s))[0] / STUDY_CASES


def confirmation_rate(v: Judgement, s: VerdictSettings) -> float | None:
    """A confirmation's false-positive rate: the chance that a null candidate (a trial that changed nothing and
    was screened 'improved' against the same baseline runs) is confirmed, at the noise the confirmation assumed.
    The screening and the confirmation share the baseline runs, so this is not the fresh-runs test's own rate
    (4-6% where that said 0.7-1.1%). None when the verdict modelled no noise."""
    d = design_of(v)
    if d is None:
        return None
    hits, candidates = _false_confirmations(_rounded(d._replace(trial_runs=1, own_runs=0)), _settings_key(s))
    return hits / candidates if candidates else 0.0


@lru_cache(maxsize=32)
def _false_confirmations(d: Design, skey: tuple) -> tuple[int, int]:
    """(null cases confirmed, null cases that became candidates) of ``STUDY_CASES``."""
    s = VerdictSettings(**dict(skey))
    if not s.confirm_runs:
        return 0, 0
    rng, hits, candidates = np.random.default_rng(_seed(d, skey, "confirm")), 0, 0
    fresh_d = d._replace(trial_runs=s.confirm_runs, own_runs=s.confirm_runs + 1)
    for k in _chunks(fresh_d, STUDY_CASES):
        parent, screen = _draw(rng, d, d.parent_sd, k, d.parent_runs), _draw(rng, d, d.trial_sd, k, 1)
        cand = _judge(rng, d, s, s.level, k, {"parent": parent, "trial": screen})[0] > s.min_effect
        if not cand.any():
            continue
        candidates += int(cand.sum())
        runs = {"parent": parent[cand], "extra": screen[cand]}
        hits += int((_judge(rng, fresh_d, s, s.confirm_level, int(cand.sum()), runs)[0] > s.min_effect).sum())
    return hits, candidates


def _draw(rng: np.random.Generator, d: Design, sd: float, k: int, runs: int) -> np.ndarray:
    """``runs`` null runs per case: (k, runs, items) 0/1 results, or (k, runs) values without items."""
    shift = rng.normal(0.0, sd, (k, runs)) if sd > 0 else np.zeros((k, runs))
    if d.p is None:
        return shift
    p = np.asarray(d.p, np.float32)
    q = np.clip(p + shift[..., None].astype(np.float32), 0.0, 1.0)
    return (rng.random(q.shape, dtype=np.float32) < q).astype(np.float32)


def _chunks(d: Design, cases: int) -> list[int]:
    runs = d.parent_runs + d.trial_runs + d.own_runs + 3 * (d.study_df // 2 + 1) + 4
    per = max(1, CELLS // (runs * len(d.p or (0,))))
    return [min(per, cases - i) for i in range(0, cases, per)]


def _rounded(d: Design) -> Design:
    """Inputs rounded so that verdicts of one study share their simulation (and the cache)."""
    p = None if d.p is None else tuple(round(min(max(x, 0.0), 1.0), 2) for x in d.p)
    return d._replace(p=p, parent_sd=_sig(d.parent_sd), trial_sd=_sig(d.trial_sd))


def _sig(x: float) -> float:
    return 0.0 if not x or not math.isfinite(x) else float(f"{x:.2g}")


def _settings_key(s: VerdictSettings) -> tuple:
    return tuple(sorted(s.model_dump().items()))


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")
