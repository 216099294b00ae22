"""The noise model behind every verdict, vectorised so the calibration benchmark runs the same code.

A run's result on item j is y_rj in [0, 1] (0/1 for greedy correctness). The model is

    y_rj = p_j + effect + u_r + e_rj,    u_r ~ N(0, s2_run)  (a whole run's shift: its seed),

with e_rj the per-item coin flips. The gain of T trial runs over R parent runs is the mean over
items of the per-item difference of run means. Its variance has two parts:

- the per-item flips, estimated by the paired item differences: var_j(d_j) / n, with n - 1 df;
- the run-level shift, c * s2_run with c = 1/T + 1/R, which item resampling cannot see.

``s2_run`` is pooled over every group of replicate runs the caller has (the baseline's repeats,
a candidate's confirmation runs, ...) by the method of moments of a one-way random-effects
model: within each group the variance of the run means minus the flips' share (mean per-item
variance across the group's runs / n). The raw estimate may be negative and is not clipped;
it is combined with a prior (``prior_sd`` with ``prior_df`` pseudo degrees of freedom, a
scaled inverse chi-square prior) and only the combination is floored at 0. With no replicates
the prior alone speaks, with its own few degrees of freedom. The degrees of freedom of the
whole variance come from Welch-Satterthwaite, and the interval uses Student's t.

Arrays carry any leading batch axes: a group is (..., runs, items); results are (...,).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from autorl.judge.stats import t_quantile

DF_STEP = 4  # degrees of freedom are rounded DOWN to 1/DF_STEP before the t quantile (conservative)
DF_MAX = 10_000.0


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


def posterior_s2(s2_raw: np.ndarray, ms: np.ndarray, df: int, prior_sd: float, prior_df: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(s2_run, var_of_s2_run): the data's estimate shrunk toward the prior, floored at 0 only here."""
    total = prior_df + df
    if total <= 0:
        return np.zeros_like(np.asarray(s2_raw, float)), np.zeros_like(np.asarray(s2_raw, float))
    s2 = np.maximum(0.0, (prior_df * prior_sd ** 2 + df * s2_raw) / total)
    var = (2.0 * prior_df * prior_sd ** 4 + 2.0 * df * np.square(ms)) / total ** 2
    return s2, var


def gain(t: np.ndarray, p: np.ndarray, groups: list[np.ndarray], prior_sd: float, prior_df: float,
         level: float) -> dict[str, np.ndarray]:
    """Gain of trial runs ``t`` (..., T, n) over parent runs ``p`` (..., R, n): delta, se, df, low, high.

    ``groups`` are the replicate groups that estimate the run-level noise (usually ``p`` itself
    and any other repeats in the study).
    """
    n, c = t.shape[-1], 1.0 / t.shape[-2] + 1.0 / p.shape[-2]
    d = t.mean(axis=-2) - p.mean(axis=-2)
    delta = d.mean(axis=-1)
    flips = np.var(d, axis=-1, ddof=1) / n if n > 1 else np.zeros_like(delta)
    s2_raw, ms, df_run = run_noise(groups)
    s2, var_s2 = posterior_s2(s2_raw, ms, df_run, prior_sd, prior_df)
    var = c * s2 + flips
    denom = c * c * var_s2 + 2.0 * np.square(flips) / max(n - 1, 1)
    df = np.where(denom > 0, 2.0 * np.square(var) / np.where(denom > 0, denom, 1.0), DF_MAX)
    df = np.clip(df, 1.0, DF_MAX)
    half = t_quantiles(0.5 + level / 2.0, df) * np.sqrt(var)
    return {"delta": delta, "se": np.sqrt(var), "df": df, "low": delta - half, "high": delta + half,
            "s2_run": s2, "s2_raw": s2_raw * np.ones_like(delta), "df_run": np.full_like(delta, df_run)}


def t_quantiles(p: float, df: np.ndarray) -> np.ndarray:
    """Student's t quantile for an array of df, each df rounded down to 1/DF_STEP (never narrower)."""
    df = np.floor(np.asarray(df, float) * DF_STEP) / DF_STEP
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
