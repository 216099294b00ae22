"""An error rate on every decision: what a verdict's test calls a trial that changed nothing, at the noise it assumed.

A verdict assumes a run-to-run sd for each arm (``Judgement.parent_sd``, ``trial_sd``) and rests on a few replicate
runs. Its **calibrated false-positive rate** is measured, not quoted: null trials are simulated and judged by the
very same vectorised test (``autorl.judge.noise.gain``: each simulated case re-estimates its noise from its own
simulated replicates, as the real verdict did), and the share called improved (or regressed) is the rate. At the
nominal level a one-sided call would be 2.5%; the prior, the few replicate df and binary items move it, which is
why it is simulated. A simulated null trial:

- each item's solve rate is the parent's observed rate smoothed by an empirical-Bayes Beta prior fitted over the
  items (``smoothed``): an item seen solved in all of 5 runs is not taken to be certain. Clipping p + shift to
  [0, 1] at the raw rates left such items (half of them with 5 runs, up to three quarters with 2) unmoved, and
  the simulation reproduced only 0.62-0.89x the run sd it was given;
- a run shifts every item's logit by the same N(0, tau); tau is solved on a quadrature so that the run mean's sd
  is the sd simulated (``logit_scale``, ``run_sd``);
- that sd is not the point estimate: each case draws its true sd per arm from a scaled inverse chi-square around
  the assumed sd with the replicate df behind it (``_sds``). A null trial is called improved mostly where its
  noise was under-estimated; a point estimate simulates only the noise believed;
- a trial's recipe that no replicate has measured yet (one run, no changed recipe of the study measured) is
  simulated as the verdict assumed it, as noisy as the parent's. One run cannot tell, so that verdict's ``test``
  says its rate holds only under that assumption (``UNMEASURED``): a recipe noisier than its parent is called
  improved more often than stated (benchmarks/README.md gives by how much).

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
    parent_df: int = -1  # replicate df behind parent_sd (-1: parent_runs - 1)
    trial_df: int = 0  # replicate df behind trial_sd (0: the trial's recipe unmeasured, see ``_sds``)


class Rates(NamedTuple):
    improved: float
    regressed: float
    cases: int


METHODS = {
    "paired_items": "per-item paired differences plus each arm's run noise",
    "run_values": "run values, each arm's own variance",
}


UNMEASURED = "the trial recipe's own run noise unmeasured yet: its rate holds if it is no noisier than the parent's"


def test_name(v: Judgement) -> str:
    """The test behind a verdict, in words: what it compares, its t distribution's df and its level; and, where the
    trial's recipe has no replicate yet, that its rate rests on that recipe being no noisier than the parent's
    (``UNMEASURED``): one run cannot tell, and a noisier recipe is called improved more often than stated."""
    what = METHODS.get(v.method, "no noise model (unknown noise)")
    d = design_of(v)
    caveat = f"; {UNMEASURED}" if d is not None and d.trial_df == 0 else ""
    return f"{what}; Welch-Satterthwaite t ({v.df:.1f} df), {v.level * 100:g}% two-sided{caveat}"


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
    own = v.own_runs or (v.trial_runs if v.trial_runs > 1 else 0)
    trial_df = max(own - 1, 0) + v.study_df  # what measured the trial's recipe (not the parent's df it may take)
    return Design(
        p, v.parent_runs, v.trial_runs, v.own_runs, v.study_df, v.parent_sd, v.trial_sd, v.parent_df, trial_df
    )


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
        sd_p, sd_t = _sds(rng, d, s, k)
        low, high = _judge(rng, d, s, level, k, sd_p, sd_t)
        improved += int((low > s.min_effect).sum())
        regressed += int((high < 0).sum())
    return Rates(improved / CASES, regressed / CASES, CASES)


def _judge(
    rng: np.random.Generator,
    d: Design,
    s: VerdictSettings,
    level: float,
    k: int,
    sd_p: np.ndarray,
    sd_t: np.ndarray,
    runs: dict[str, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of ``k`` simulated null verdicts of design ``d``, each case with its own true run sd per arm
    (``sd_p``, ``sd_t``); ``runs`` may give the parent's, the trial's and the runs its own group adds (``extra``)
    instead of fresh draws."""
    runs = runs or {}
    parent, trial, extra = (runs.get(key) for key in ("parent", "trial", "extra"))  # drawn only where not given
    parent = _draw(rng, d, sd_p, d.parent_runs) if parent is None else parent
    trial = _draw(rng, d, sd_t, d.trial_runs) if trial is None else trial
    own_groups = [trial] if d.trial_runs > 1 else []
    if d.own_runs > d.trial_runs:  # the judged runs plus others of the same recipe (a candidate's own run)
        extra = _draw(rng, d, sd_t, d.own_runs - d.trial_runs) if extra is None else extra
        own_groups = [np.concatenate([trial, extra], axis=1)]
    study = [_draw(rng, d, sd_t, 3) for _ in range(d.study_df // 2)]
    study += [_draw(rng, d, sd_t, 2)] if d.study_df % 2 else []
    sources = [x for x in (own_groups, own_groups + study if study else []) if x]
    fn = gain if d.p is not None else value_gain
    g = fn(trial, parent, [parent], sources, s.run_sd_prior, s.run_sd_prior_df, level)
    return g["low"], g["high"]


def false_confirmations(d: Design, s: VerdictSettings) -> float:
    """The chance that a null trial becomes a candidate and is then confirmed by ``confirm_runs`` fresh runs (its
    own run, selected for looking good, joins them in its own group), at the noise ``d`` assumes."""
    return _false_confirmations(_rounded(_screening(d)), _settings_key(s))[0] / STUDY_CASES


def confirmation_rate(v: Judgement, s: VerdictSettings) -> float | None:
    """A confirmation's false-positive rate: the chance that a null candidate (a trial that changed nothing and
    was screened 'improved' against the same baseline runs) is confirmed, at the noise the confirmation assumed.
    The screening and the confirmation share the baseline runs, so this is not the fresh-runs test's own rate
    (4-6% where that said 0.7-1.1%). None when the verdict modelled no noise."""
    d = design_of(v)
    if d is None:
        return None
    hits, candidates = _false_confirmations(_rounded(_screening(d)), _settings_key(s))
    return hits / candidates if candidates else 0.0


def _screening(d: Design) -> Design:
    """The screening that made a confirmation's candidate: one run of the trial, no group of its own yet."""
    return d._replace(trial_runs=1, own_runs=0)


@lru_cache(maxsize=32)
def _false_confirmations(d: Design, skey: tuple) -> tuple[int, int]:
    """(null cases confirmed, null cases that became candidates) of ``STUDY_CASES``."""
    s = VerdictSettings(**dict(skey))
    if not s.confirm_runs:
        return 0, 0
    rng, hits, candidates = np.random.default_rng(_seed(d, skey, "confirm")), 0, 0
    fresh_d = d._replace(trial_runs=s.confirm_runs, own_runs=s.confirm_runs + 1)
    for k in _chunks(fresh_d, STUDY_CASES):
        sd_p, sd_t = _sds(rng, d, s, k)
        parent, screen = _draw(rng, d, sd_p, d.parent_runs), _draw(rng, d, sd_t, 1)
        cand = _judge(rng, d, s, s.level, k, sd_p, sd_t, {"parent": parent, "trial": screen})[0] > s.min_effect
        if not cand.any():
            continue
        n = int(cand.sum())
        candidates += n
        runs = {"parent": parent[cand], "extra": screen[cand]}
        low = _judge(rng, fresh_d, s, s.confirm_level, n, sd_p[cand], sd_t[cand], runs)[0]
        hits += int((low > s.min_effect).sum())
    return hits, candidates


def _sds(rng: np.random.Generator, d: Design, s: VerdictSettings, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each simulated case's true run sd of the parent's and of the trial's recipe, drawn from what the verdict
    knew of them rather than plugged in: a scaled inverse chi-square around the assumed sd with the replicate df
    behind it (the prior's pseudo-df where no replicate measured it). A verdict is wrong mostly where its noise
    was under-estimated; a point estimate would simulate only the noise it believed. The prior's df are not
    counted again: they shrink the estimate toward the prior sd, and a run sd above the prior (0.05 against 0.02
    with 2 baseline runs) would then be simulated too narrow twice over (stated 5% where 18% of null candidates
    were confirmed, 20% with the replicate df alone).

    A trial's recipe that no replicate has measured (one run, no changed recipe of the study measured yet) is
    simulated as the verdict assumed it: as noisy as the parent's, case by case. Nothing measured says otherwise,
    nor that it holds: the stated rate is conditional on it (``UNMEASURED``)."""
    parent_df = d.parent_runs - 1 if d.parent_df < 0 else d.parent_df
    sd_p = _posterior_sd(rng, d.parent_sd, parent_df or s.run_sd_prior_df, k)
    if d.trial_df > 0:
        return sd_p, _posterior_sd(rng, d.trial_sd, d.trial_df, k)
    ratio = d.trial_sd / d.parent_sd if d.parent_sd > 0 else 1.0  # the verdict's assumption, and no more
    return sd_p, sd_p * ratio if d.parent_sd > 0 else np.full(k, d.trial_sd)


def _posterior_sd(rng: np.random.Generator, sd: float, df: float, k: int) -> np.ndarray:
    if sd <= 0 or df <= 0:
        return np.full(k, max(sd, 0.0))
    return sd * np.sqrt(df / np.maximum(rng.chisquare(df, k), 1e-12))


def _draw(rng: np.random.Generator, d: Design, sd: np.ndarray, runs: int) -> np.ndarray:
    """``runs`` null runs per case (``sd``: each case's run sd): (k, runs, items) 0/1 results, or (k, runs) values
    without items. An item's rate is its smoothed parent rate (``smoothed``); a run shifts every item's logit by the
    same amount, scaled so that the run mean's sd is the case's sd (``logit_scale``)."""
    z = rng.standard_normal((len(sd), runs))
    if d.p is None:
        return z * sd[:, None]
    logits, grid_sd, grid_tau = _logit_table(d.p, d.parent_runs)
    tau = np.interp(sd, grid_sd, grid_tau).astype(np.float32)
    x = np.clip(logits[None, None, :] + (tau[:, None] * z.astype(np.float32))[..., None], -30.0, 30.0)
    q = 1.0 / (1.0 + np.exp(-x))
    return (rng.random(q.shape, dtype=np.float32) < q).astype(np.float32)


def smoothed(p: np.ndarray, runs: int) -> np.ndarray:
    """Items' solve rates smoothed by an empirical-Bayes Beta prior fitted over the items' observed rates (each the
    mean of ``runs`` 0/1 results): an item seen at 0 or 1 is not taken to be certain. The Beta's spread comes from
    the method of moments of the beta-binomial (the observed variance less the binomial share); with one run the
    spread cannot be told from the flips and a weak prior (2 pseudo-runs) is used."""
    p = np.clip(np.asarray(p, float), 0.0, 1.0)
    m = float(p.mean()) if p.size else 0.5
    if p.size < 2 or not 0.0 < m < 1.0:
        return np.full(p.shape, min(max(m, 0.01), 0.99))
    if runs > 1:
        rho = (runs * float(p.var(ddof=1)) / (m * (1 - m)) - 1.0) / (runs - 1)
        weight = 1.0 / min(max(rho, 1e-3), 0.999) - 1.0  # a + b of the Beta
    else:
        weight = 2.0
    runs = max(runs, 1)
    return (p * runs + m * weight) / (runs + weight)


def logit_scale(p: np.ndarray, sd: float) -> float:
    """The sd of the run-level shift on the logit scale at which the run mean of items with rates ``p`` moves with
    sd ``sd`` (the largest shift when ``sd`` is beyond what the items can move)."""
    _, grid_sd, grid_tau = _table(tuple(float(x) for x in p))
    return float(np.interp(sd, grid_sd, grid_tau))


def run_sd(p: np.ndarray, tau: float) -> float:
    """The sd of the run mean of items with rates ``p`` when every item's logit moves by N(0, tau) (quadrature)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(QUAD)
    w = weights / weights.sum()
    lp = np.log(p) - np.log1p(-p)
    means = (1.0 / (1.0 + np.exp(-(lp[None, :] + tau * nodes[:, None])))).mean(axis=1)
    return float(np.sqrt(np.sum(w * np.square(means - np.sum(w * means)))))


QUAD = 40  # Gauss-Hermite nodes for a run shift's distribution
TAU_GRID = np.concatenate([[0.0], np.geomspace(1e-4, 30.0, 240)])


@lru_cache(maxsize=64)
def _logit_table(p: tuple[float, ...], runs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(smoothed logits as float32, run sd on a grid of logit shifts, the grid) for a design's items."""
    q = smoothed(np.asarray(p), runs)
    _, grid_sd, grid_tau = _table(tuple(float(x) for x in q))
    return (np.log(q) - np.log1p(-q)).astype(np.float32), grid_sd, grid_tau


@lru_cache(maxsize=64)
def _table(p: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q = np.clip(np.asarray(p), 1e-4, 1 - 1e-4)
    lp = np.log(q) - np.log1p(-q)
    nodes, weights = np.polynomial.hermite_e.hermegauss(QUAD)
    w = weights / weights.sum()
    x = lp[None, None, :] + TAU_GRID[:, None, None] * nodes[None, :, None]
    means = (1.0 / (1.0 + np.exp(-x))).mean(axis=2)  # (taus, nodes)
    sd = np.sqrt(np.sum(w * np.square(means - (w * means).sum(axis=1, keepdims=True)), axis=1))
    return lp, np.maximum.accumulate(sd), TAU_GRID


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
