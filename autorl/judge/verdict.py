"""Verdicts: is a trial better than the baseline by more than the noise? And is the run healthy?

``judge`` compares one trial with the baseline (run several times with different seeds) and
returns improved / regressed / flat with a 95% interval for the gain. ``flags`` reads one
run's metrics for the failure modes that a good objective value can hide (seed 004 §6, §12).
Crashes are judged by the controller (see autorl.judge.triage), not here.

Pure numpy; the t quantile comes from ``autorl.judge.stats``.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autorl.judge.stats import t_quantile

Z95 = 1.959963984540054  # two-sided 95% normal quantile
UNKNOWN_NOISE_REL = 0.10  # one run each and no per-item results: |gain| must exceed 10% of the values


class Verdict(BaseModel):
    """How a trial compares with the baseline on the objective."""

    model_config = ConfigDict(extra="forbid")

    verdict: Literal["improved", "regressed", "flat"] = Field(description="improved iff ci_low > min_effect; regressed iff ci_high < 0; else flat.")
    delta: float = Field(description="Gain in the objective's better direction (trial - baseline when maximizing, baseline - trial when minimizing).")
    ci_low: float = Field(description="Lower end of the 95% interval for the gain.")
    ci_high: float = Field(description="Upper end of the 95% interval for the gain.")
    method: str = Field(description="paired_bootstrap, paired_bootstrap+seed_var, repeats_t or unknown_noise.")
    n: int = Field(description="Paired items (bootstrap methods) or runs (repeat-based methods).")
    explanation: str = Field(description="One line a person can read.")


class Flag(BaseModel):
    """A health problem seen in one run's metrics."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="train_eval_divergence, length_collapse, high_truncation, no_training or short_run.")
    evidence: str = Field(description="The numbers that raised it.")


# ---------------------------------------------------------------------------- judge

def judge(trial_items: list[list[int]] | None, baseline_items: list[list[int]] | None,
          trial_values: list[float], baseline_values: list[float], min_effect: float,
          direction: str, n_boot: int, seed: int) -> Verdict:
    """Compare a trial with the baseline.

    With per-item 0/1 results (one list per run, same items in the same order), the gain is
    the mean over items of (trial's per-item mean - baseline's per-item mean) and its interval
    is a paired percentile bootstrap over items. Item resampling already covers the per-item
    coin flips that differ between seeds, but not a shift of a whole run (a seed that trains
    a slightly better or worse model on every item). That run-level variance is estimated from
    the baseline repeats by a one-way random-effects split: the variance of the repeats' means,
    minus the part explained by per-item flips (mean per-item variance across repeats / n).
    Its standard error for the comparison, sqrt(var_run * (1/trial_runs + 1/baseline_runs)),
    is added in quadrature to each side of the bootstrap interval (independent sources). This
    avoids counting the per-item flips twice, which widening by the raw sd of the repeats
    would do, and keeps the power to see a real 15-point gain on 200 items with two repeats.
    With one baseline run the run-level term is unknown and left out (the method says so).

    Without per-item results: a pooled two-sample t-interval over the run values when either
    side has repeats ('repeats_t'); with one run each the noise is unknown and the gain must
    exceed UNKNOWN_NOISE_REL of the values ('unknown_noise'). ``direction='minimize'`` flips
    the sign so that a positive gain is always better.
    """
    sign = _sign(direction)
    pair = _item_arrays(trial_items, baseline_items)
    if pair is not None:
        delta, low, high, method, note = _paired(pair[0], pair[1], sign, n_boot, seed)
        n = pair[0].shape[1]
    else:
        delta, low, high, method, note = _from_values(trial_values, baseline_values, sign)
        n = len(trial_values) + len(baseline_values)
    verdict = "improved" if low > min_effect else "regressed" if high < 0 else "flat"
    text = _explain(verdict, delta, low, high, method, n, min_effect, note)
    return Verdict(verdict=verdict, delta=delta, ci_low=low, ci_high=high, method=method, n=n, explanation=text)


def _sign(direction: str) -> float:
    if direction not in ("maximize", "minimize"):
        raise ValueError(f"direction must be 'maximize' or 'minimize', got {direction!r}")
    return 1.0 if direction == "maximize" else -1.0


def _item_arrays(trial: list[list[int]] | None, base: list[list[int]] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """Trial and baseline per-item results as (runs, items) arrays, or None if unusable."""
    if not trial or not base:
        return None
    lengths = {len(run) for run in trial} | {len(run) for run in base}
    if len(lengths) != 1 or 0 in lengths:
        return None
    return np.asarray(trial, dtype=float), np.asarray(base, dtype=float)


def _paired(t: np.ndarray, b: np.ndarray, sign: float, n_boot: int, seed: int) -> tuple[float, float, float, str, str]:
    d = sign * (t.mean(axis=0) - b.mean(axis=0))
    delta = float(d.mean())
    boots = _bootstrap_means(d, n_boot, seed)
    lo, hi = (float(x) for x in np.percentile(boots, [2.5, 97.5]))
    if b.shape[0] < 2:
        return delta, lo, hi, "paired_bootstrap", "seed-to-seed variance not measured (one baseline run)"
    var_run = _run_variance(b)
    extra = Z95 * math.sqrt(var_run * (1.0 / t.shape[0] + 1.0 / b.shape[0]))
    low = delta - math.hypot(delta - lo, extra)
    high = delta + math.hypot(hi - delta, extra)
    note = f"run-level sd {math.sqrt(var_run):.3g} from {b.shape[0]} baseline runs added"
    return delta, low, high, "paired_bootstrap+seed_var", note


def _bootstrap_means(d: np.ndarray, n_boot: int, seed: int, chunk: int = 256) -> np.ndarray:
    """Means of ``n_boot`` resamples (with replacement) of ``d``, drawn in chunks to bound memory."""
    rng = np.random.default_rng(seed)
    n = d.shape[0]
    out = np.empty(n_boot)
    for start in range(0, n_boot, chunk):
        size = min(chunk, n_boot - start)
        out[start:start + size] = d[rng.integers(0, n, size=(size, n))].mean(axis=1)
    return out


def _run_variance(b: np.ndarray) -> float:
    """Variance of a whole run's shift, net of per-item flips (one-way random effects, >= 0)."""
    n = b.shape[1]
    between = float(np.var(b.mean(axis=1), ddof=1))
    flips = float(np.var(b, axis=0, ddof=1).mean()) / n
    return max(0.0, (between - flips) * n / max(n - 1, 1))


def _from_values(trial: list[float], base: list[float], sign: float) -> tuple[float, float, float, str, str]:
    if not trial or not base:
        raise ValueError("judge needs at least one trial value and one baseline value")
    t, b = sign * np.asarray(trial, float), sign * np.asarray(base, float)
    delta = float(t.mean() - b.mean())
    df = (len(t) - 1) + (len(b) - 1)
    if df > 0:
        ss = float(((t - t.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum())
        se = math.sqrt(ss / df) * math.sqrt(1 / len(t) + 1 / len(b))
        half = t_quantile(0.975, df) * se
        return delta, delta - half, delta + half, "repeats_t", f"no per-item results; pooled sd over {df} df"
    margin = UNKNOWN_NOISE_REL * max(abs(t[0]), abs(b[0]))
    note = f"noise unknown (one run each, no per-item results): gain must exceed {UNKNOWN_NOISE_REL:.0%} of the values"
    return delta, delta - margin, delta + margin, "unknown_noise", note


def _explain(verdict: str, delta: float, low: float, high: float, method: str, n: int, min_effect: float, note: str) -> str:
    why = {
        "improved": f"lower bound above min_effect {min_effect:g}",
        "regressed": "upper bound below 0",
        "flat": f"interval reaches 0 or min_effect {min_effect:g}",
    }[verdict]
    return f"{verdict}: gain {delta:+.4g}, 95% CI [{low:+.4g}, {high:+.4g}] ({method}, n={n}; {note}); {why}"


# ---------------------------------------------------------------------------- flags

FLAG_LIMITS = {
    "divergence_reward_rise": 0.02,   # train reward_mean: mean of the last half minus the first half
    "divergence_eval_drops": 2,       # consecutive drops of eval/ood/greedy_pass@1 (seed 004 §12)
    "divergence_metric": "eval/ood/greedy_pass@1",
    "length_collapse_ratio": 0.5,     # last-quarter mean length below this fraction of the first quarter's
    "truncation_rate": 0.5,           # truncated_rate above this ...
    "truncation_run": 5,              # ... for this many consecutive steps (or all steps of a shorter run)
}


def flags(steps: list[dict], evals: list[dict], summary: dict | None, recipe_steps: int) -> list[Flag]:
    """Health flags for one finished run (each check returns a Flag or None)."""
    checks = [
        lambda: _divergence(steps, evals),
        lambda: _length_collapse(steps),
        lambda: _high_truncation(steps),
        lambda: _training_done(steps, summary, recipe_steps),
    ]
    return [f for f in (check() for check in checks) if f is not None]


def _series(rows: list[dict], key: str) -> list[float]:
    out = []
    for row in rows:
        v = row.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def _divergence(steps: list[dict], evals: list[dict]) -> Flag | None:
    rewards = _series(steps, "reward_mean")
    metric = FLAG_LIMITS["divergence_metric"]
    held_out = _series(evals, metric)
    drops = FLAG_LIMITS["divergence_eval_drops"]
    if len(rewards) < 4 or len(held_out) < drops + 1:
        return None
    half = len(rewards) // 2
    rise = float(np.mean(rewards[-half:]) - np.mean(rewards[:half]))
    tail = held_out[-(drops + 1):]
    falling = all(b < a for a, b in zip(tail, tail[1:]))
    if rise <= FLAG_LIMITS["divergence_reward_rise"] or not falling:
        return None
    path = " -> ".join(f"{v:.3g}" for v in tail)
    return Flag(name="train_eval_divergence", evidence=f"train reward_mean rose {rise:+.3g} (first vs last half) while {metric} fell {path}")


def _length_collapse(steps: list[dict]) -> Flag | None:
    lengths = _series(steps, "response_length_mean")
    if len(lengths) < 4:
        return None
    k = max(1, len(lengths) // 4)
    early, late = float(np.mean(lengths[:k])), float(np.mean(lengths[-k:]))
    if early <= 0 or late >= FLAG_LIMITS["length_collapse_ratio"] * early:
        return None
    return Flag(name="length_collapse", evidence=f"response_length_mean fell from {early:.4g} (first {k} steps) to {late:.4g} (last {k}), {late / early - 1:+.0%}")


def _high_truncation(steps: list[dict]) -> Flag | None:
    rates = _series(steps, "truncated_rate")
    limit = FLAG_LIMITS["truncation_rate"]
    need = min(FLAG_LIMITS["truncation_run"], len(rates))
    longest = run = 0
    for r in rates:
        run = run + 1 if r > limit else 0
        longest = max(longest, run)
    if len(rates) < 2 or longest < need:
        return None
    return Flag(name="high_truncation", evidence=f"truncated_rate > {limit:g} for {longest} consecutive steps (max {max(rates):.2f}): raise max_new_tokens or penalise length")


def _training_done(steps: list[dict], summary: dict | None, recipe_steps: int) -> Flag | None:
    done = summary.get("steps_done") if summary else None
    done = len(steps) if not isinstance(done, int) else max(done, len(steps))
    status = summary.get("status") if summary else None
    if recipe_steps <= 0 or done >= recipe_steps:
        return None
    if done == 0:
        return Flag(name="no_training", evidence=f"0 of {recipe_steps} training steps ran (summary status {status!r}): the result is the untrained model")
    if status == "ok":
        return Flag(name="short_run", evidence=f"only {done} of {recipe_steps} training steps ran, yet the run reported status 'ok'")
    return None
