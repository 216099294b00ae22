"""The noise model behind every verdict, vectorised so the calibration benchmark runs the same code.

A run's result on item j is y_rj in [0, 1] (0/1 for greedy correctness). The model is

    y_rj = p_j + effect + u_r + e_rj,    u_r ~ N(0, s2_arm)  (a whole run's shift: its seed),

with e_rj the per-item coin flips. Each side of a comparison is an **arm** with its own run-level
variance: the trial's recipe and its parent's recipe need not be equally sensitive to the seed (a
baseline that barely trains moves less from seed to seed than a trial that learns). The gain of T
trial runs over R parent runs is the mean over items of the per-item difference of run means. Its
variance has three parts:

- the per-item flips, estimated by the paired item differences: var_j(d_j) / n, with n - 1 df;
- the trial's run shift, s2_trial / T, and the parent's, s2_parent / R, which item resampling cannot see.

An arm's ``s2`` comes from replicate groups of its recipe by the method of moments of a one-way
random-effects model: within each group the variance of the run means minus the flips' share (mean
per-item variance across the group's runs / n). The raw estimate may be negative and is not clipped;
it is combined with a prior (``prior_sd`` with ``prior_df`` pseudo degrees of freedom, a scaled
inverse chi-square prior) and only the combination is floored at 0. With no replicates the prior
alone speaks, with its own few degrees of freedom.

The parent arm is estimated from the parent's groups. The trial arm is never assumed quieter than the
parent: it is the larger of the parent's estimate and each of ``trial_sources`` (the trial's own
replicates where it has them; the study's replicate groups of other changed recipes), so a study
whose trials turn out noisier than their parent widens every later interval. The degrees of freedom
of the whole variance come from Welch-Satterthwaite (Behrens-Fisher), and the interval uses
Student's t.

Arrays carry any leading batch axes: a group is (..., runs, items); results are (...,).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from autorl.judge.stats import t_quantile

DF_STEP = 4  # degrees of freedom are rounded DOWN to 1/DF_STEP before the t quantile (conservative)
DF_MAX = 10_000.0


class Arm(NamedTuple):
    """One arm's run-level variance: the estimate (prior combined), its sampling variance, the replicate df behind
    it and the raw (unclipped) replicate estimate. Fields are arrays over the batch axes."""

    s2: np.ndarray
    var: np.ndarray
    df: np.ndarray
    s2_raw: np.ndarray


def run_noise(groups: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """Pooled (s2_raw, ms_between, df) over replicate groups of shape (..., runs, items).

    ``s2_raw`` is the unclipped method-of-moments run-level variance; ``ms_between`` the pooled
    variance of a run mean (run shift plus flips), which sets how uncertain ``s2_raw`` is.
    """
    s2_sum, ms_sum, df = 0.0, 0.0, 0
    for g in groups:
        k, n = g.shape[-2], g.shape[-1]
        if k < 2 or n < 1:
            continue
        ms = np.var(g.mean(axis=-1), axis=-1, ddof=1)
        flips = np.var(g, axis=-2, ddof=1).mean(axis=-1) / n
        s2_sum = s2_sum + (k - 1) * (ms - flips)
        ms_sum = ms_sum + (k - 1) * ms
        df += k - 1
    if df == 0:
        return np.asarray(0.0), np.asarray(0.0), 0
    return np.asarray(s2_sum / df), np.asarray(ms_sum / df), df


def value_noise(groups: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """Pooled (s2, s2, df) of run values over groups of shape (..., runs): the within-group variance of the values
    (there are no per-item flips to take out). The shape matches ``run_noise``."""
    ss, df = 0.0, 0
    for g in groups:
        k = g.shape[-1]
        if k < 2:
            continue
        ss = ss + np.var(g, axis=-1, ddof=1) * (k - 1)
        df += k - 1
    if df == 0:
        return np.asarray(0.0), np.asarray(0.0), 0
    return np.asarray(ss / df), np.asarray(ss / df), df


def posterior_s2(
    s2_raw: np.ndarray, ms: np.ndarray, df: int, prior_sd: float, prior_df: float
) -> tuple[np.ndarray, np.ndarray]:
    """(s2_run, var_of_s2_run): the data's estimate shrunk toward the prior, floored at 0 only here."""
    total = prior_df + df
    if total <= 0:
        return np.zeros_like(np.asarray(s2_raw, float)), np.zeros_like(np.asarray(s2_raw, float))
    s2 = np.maximum(0.0, (prior_df * prior_sd**2 + df * s2_raw) / total)
    var = (2.0 * prior_df * prior_sd**4 + 2.0 * df * np.square(ms)) / total**2
    return s2, var


def arm(groups: list[np.ndarray], prior_sd: float, prior_df: float, values: bool = False) -> Arm:
    """An arm's run-level variance from its replicate groups ((..., runs, items), or (..., runs) with ``values``)."""
    s2_raw, ms, df = (value_noise if values else run_noise)(groups)
    s2, var = posterior_s2(s2_raw, ms, df, prior_sd, prior_df)
    if values:  # a scaled inverse chi-square posterior: its own df, prior's and data's together
        var = 2.0 * np.square(s2) / max(prior_df + df, 1e-9)
    return Arm(s2, var, np.full(np.shape(s2), float(df)), s2_raw * np.ones_like(s2))


def louder(a: Arm, b: Arm) -> tuple[Arm, np.ndarray]:
    """Elementwise the arm with the larger run variance, and where ``b`` was taken."""
    took = b.s2 > a.s2
    return Arm(*(np.where(took, y, x) for x, y in zip(a, b))), took


def trial_arm(parent: Arm, sources: list[Arm]) -> tuple[Arm, np.ndarray]:
    """The trial's arm: the parent's unless a source with replicate df says the trial's recipe is noisier;
    returns the arm and where it is still the parent's (the two terms are then one estimate)."""
    out, same = parent, np.ones(np.shape(parent.s2), bool)
    for src in sources:
        out, took = louder(out, src)
        same = same & ~(took & (src.df > 0))
    return out, same


def satterthwaite(var: np.ndarray, denom: np.ndarray) -> np.ndarray:
    df = np.where(denom > 0, 2.0 * np.square(var) / np.where(denom > 0, denom, 1.0), DF_MAX)
    return np.clip(df, 1.0, DF_MAX)


def gain(
    t: np.ndarray,
    p: np.ndarray,
    parent_groups: list[np.ndarray],
    trial_sources: list[list[np.ndarray]],
    prior_sd: float,
    prior_df: float,
    level: float,
) -> dict[str, np.ndarray]:
    """Gain of trial runs ``t`` (..., T, n) over parent runs ``p`` (..., R, n): delta, se, df, low, high and each
    arm's run variance.

    ``parent_groups`` are the replicate groups of the parent's recipe (usually ``p`` itself);
    ``trial_sources`` lists alternative sets of groups that measure the trial's recipe (or recipes like it); the
    trial arm is the loudest of them and the parent's.
    """
    n, T, R = t.shape[-1], t.shape[-2], p.shape[-2]
    d = t.mean(axis=-2) - p.mean(axis=-2)
    delta = d.mean(axis=-1)
    flips = np.var(d, axis=-1, ddof=1) / n if n > 1 else np.zeros_like(delta)
    par = arm(parent_groups, prior_sd, prior_df)
    tri, same = trial_arm(par, [arm(g, prior_sd, prior_df) for g in trial_sources if g])
    var = tri.s2 / T + par.s2 / R + flips
    run_var = np.where(same, (1.0 / T + 1.0 / R) ** 2 * par.var, tri.var / T**2 + par.var / R**2)
    df = satterthwaite(var, run_var + 2.0 * np.square(flips) / max(n - 1, 1))
    half = t_quantiles(0.5 + level / 2.0, df) * np.sqrt(var)
    return {
        "delta": delta,
        "se": np.sqrt(var),
        "df": df,
        "low": delta - half,
        "high": delta + half,
        "s2_trial": tri.s2,
        "s2_parent": par.s2,
        "df_trial": tri.df,
        "df_parent": par.df,
        "s2_raw_parent": par.s2_raw,
        "s2_raw_trial": tri.s2_raw,
        "same": same,
    }


def value_gain(
    t: np.ndarray,
    p: np.ndarray,
    parent_groups: list[np.ndarray],
    trial_sources: list[list[np.ndarray]],
    prior_sd: float,
    prior_df: float,
    level: float,
) -> dict[str, np.ndarray]:
    """``gain`` for run values alone (no per-item results): ``t`` (..., T), ``p`` (..., R); each arm's variance is
    the within-group variance of its groups' values, with the prior."""
    T, R = t.shape[-1], p.shape[-1]
    delta = t.mean(axis=-1) - p.mean(axis=-1)
    par = arm(parent_groups, prior_sd, prior_df, values=True)
    tri, same = trial_arm(par, [arm(g, prior_sd, prior_df, values=True) for g in trial_sources if g])
    var = tri.s2 / T + par.s2 / R
    run_var = np.where(same, (1.0 / T + 1.0 / R) ** 2 * par.var, tri.var / T**2 + par.var / R**2)
    df = satterthwaite(var, run_var)
    half = t_quantiles(0.5 + level / 2.0, df) * np.sqrt(var)
    return {
        "delta": delta,
        "se": np.sqrt(var),
        "df": df,
        "low": delta - half,
        "high": delta + half,
        "s2_trial": tri.s2,
        "s2_parent": par.s2,
        "df_trial": tri.df,
        "df_parent": par.df,
        "s2_raw_parent": par.s2_raw,
        "s2_raw_trial": tri.s2_raw,
        "same": same,
    }


def t_quantiles(p: float, df: np.ndarray) -> np.ndarray:
    """Student's t quantile for an array of df, each df rounded down to 1/DF_STEP (never narrower)."""
    df = np.floor(np.asarray(df, float) * DF_STEP + 1e-9) / DF_STEP  # 3.9999999 is 4, not 3.75
    keys, inverse = np.unique(np.maximum(df, 1.0 / DF_STEP), return_inverse=True)
    values = np.array([_t_cached(p, float(k)) for k in keys])
    return values[inverse].reshape(df.shape)


@lru_cache(maxsize=8192)
def _t_cached(p: float, df: float) -> float:
    if df >= DF_MAX:
        return math.sqrt(2.0) * _erfinv(2.0 * p - 1.0)
    return t_quantile(p, df)


def _erfinv(y: float) -> float:
    lo, hi = 0.0, 6.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if math.erf(mid) < y else (lo, mid)
    return 0.5 * (lo + hi)
