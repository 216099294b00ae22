"""Verdicts: is a trial better than the recipe it modifies by more than the noise? And is the run healthy?

``judge`` compares a trial's runs with its parent's runs (the recipe it modifies: the baseline,
or the incumbent it was built on) on exactly the objective and returns improved / regressed /
flat with an interval for the gain. One "improved" run is only a **candidate**: ``confirm``
judges fresh-seed re-runs of it, and only a confirmed improvement counts (docs/triage.md
explains why). ``credit`` gives both the verdict against the parent and the gain over the
original baseline. ``flags`` reads one run's metrics for the failure modes that a good
objective value can hide (seed 004 §6, §12). Crashes are judged by autorl.judge.triage.

The statistics (a per-item paired test plus a pooled run-level noise term with a prior, Student's
t with Satterthwaite df) live in ``autorl.judge.noise``; this module turns them into verdicts.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autorl.judge.noise import gain, posterior_s2, t_quantiles
from autorl.recipe import AbortRules, Objective, VerdictSettings

FULL_SIGHT_REPEATS = 3  # with fewer parent runs the verdict says what it cannot see


class Runs(BaseModel):
    """One recipe's runs (different seeds) as the verdict sees them."""

    model_config = ConfigDict(extra="forbid")

    values: list[float] = Field(description="The objective of each run.")
    items: list[list[float]] | None = Field(
        None, description="Per run, the per-item results that reduce to the objective (same items, same order).")


class Verdict(BaseModel):
    """How a trial compares with its parent on the objective."""

    model_config = ConfigDict(extra="forbid")

    verdict: Literal["improved", "regressed", "flat"] = Field(
        description="improved iff ci_low > min_effect; regressed iff ci_high < 0; else flat.")
    delta: float = Field(
        description="Gain in the objective's better direction (trial - parent when maximizing, parent - trial when "
                    "minimizing).")
    ci_low: float = Field(description="Lower end of the interval for the gain.")
    ci_high: float = Field(description="Upper end of the interval for the gain.")
    level: float = Field(0.95, description="Two-sided confidence level of the interval.")
    method: str = Field(
        description="paired_items (per-item paired test + run noise), run_values (t over run values) or unknown_noise.")
    n: int = Field(description="Paired items (paired_items) or runs (the others).")
    df: float = Field(0.0, description="Degrees of freedom of the t quantile used.")
    run_sd: float | None = Field(
        None, description="Run-level sd used (prior combined with the pooled replicates), None if not modelled.")
    run_df: int = Field(0, description="Replicate degrees of freedom behind run_sd (besides the prior).")
    blind: str = Field(
        "", description="What this verdict cannot see (e.g. too few parent runs to measure seed noise), or empty.")
    explanation: str = Field(description="One line a person can read.")


class Credit(BaseModel):
    """A trial's verdict against its parent, and its gain over the study's original baseline."""

    model_config = ConfigDict(extra="forbid")

    vs_parent: Verdict = Field(description="The verdict that counts: against the recipe the trial modifies.")
    vs_baseline: Verdict = Field(description="Reported separately: the gain over the original baseline.")


class Flag(BaseModel):
    """A health problem seen in one run's metrics."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="train_eval_divergence, length_collapse, high_truncation, no_training or short_run.")
    evidence: str = Field(description="The numbers that raised it.")


# ---------------------------------------------------------------------------- objective items

def objective_items(evals: list[dict], objective: Objective) -> list[float] | None:
    """Per-item results that reduce to the objective exactly as ``reduction`` reduces the metric, or None.

    Only a greedy pass@1 objective has per-item results (``eval/<split>/items``): ``last`` takes
    the last eval's items, ``best`` the items of the eval where the metric is best (the same
    selection the objective makes, on both sides), ``mean_last_k`` the per-item mean over the
    last k evals. Any other metric (sampling pass@k, a train metric) has none: the verdict then
    judges the run values.
    """
    parts = objective.metric.split("/")
    if len(parts) != 3 or parts[0] != "eval" or parts[2] != "greedy_pass@1":
        return None
    key = f"eval/{parts[1]}/items"
    rows = [e for e in evals if isinstance(e.get(objective.metric), (int, float)) and e.get(key)]
    if not rows:
        return None
    if objective.reduction == "best":
        sign = 1.0 if objective.direction == "maximize" else -1.0
        rows = [max(rows, key=lambda e: sign * e[objective.metric])]
    elif objective.reduction == "mean_last_k":
        rows = rows[-objective.k:]
    else:
        rows = rows[-1:]
    return [float(x) for x in np.mean(np.asarray([r[key] for r in rows], float), axis=0)]


# ---------------------------------------------------------------------------- judge

def judge(trial: Runs, parent: Runs, settings: VerdictSettings, direction: str,
          noise: list[list[list[float]]] | None = None, level: float | None = None) -> Verdict:
    """Compare a trial's runs with its parent's runs.

    With per-item results on both sides: the gain is the mean over items of the per-item
    difference of run means, its variance the paired items' flips plus the run-level shift,
    estimated from the parent's repeats and the ``noise`` groups (other replicate runs of the
    study, as per-run item lists) with the recipe's prior (``autorl.judge.noise``). Without
    them: a t interval over the run values (``run_values``). ``direction='minimize'`` flips the
    sign so that a positive gain is always better.
    """
    sign = _sign(direction)
    level = settings.level if level is None else level
    if not trial.values or not parent.values:
        raise ValueError("judge needs at least one trial value and one parent value")
    arrays = _item_arrays(trial.items, parent.items, noise or [])
    if arrays is not None:
        return _paired(*arrays, sign, settings, level, len(parent.values))
    return _from_values(trial.values, parent.values, sign, settings, level)


def confirm(fresh: Runs, parent: Runs, settings: VerdictSettings, direction: str,
            noise: list[list[list[float]]] | None = None) -> Verdict:
    """Judge a candidate's fresh-seed re-runs alone against its parent at ``confirm_level``.

    The run that made it a candidate is left out: it was selected for looking good, so it
    would bias the confirmation. The fresh runs are also a replicate group for the run noise.
    """
    groups = [*(noise or []), *([fresh.items] if fresh.items and len(fresh.items) > 1 else [])]
    return judge(fresh, parent, settings, direction, groups, level=settings.confirm_level)


def credit(trial: Runs, parent: Runs, baseline: Runs, settings: VerdictSettings, direction: str,
           noise: list[list[list[float]]] | None = None) -> Credit:
    """The verdict against the parent (what counts) and, separately, the gain over the baseline."""
    vs_parent = judge(trial, parent, settings, direction, noise)
    vs_base = vs_parent if parent == baseline else judge(trial, baseline, settings, direction, noise)
    return Credit(vs_parent=vs_parent, vs_baseline=vs_base)


def _sign(direction: str) -> float:
    if direction not in ("maximize", "minimize"):
        raise ValueError(f"direction must be 'maximize' or 'minimize', got {direction!r}")
    return 1.0 if direction == "maximize" else -1.0


def _item_arrays(trial, parent, noise) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]] | None:
    """Trial and parent per-item results as (runs, items) arrays plus the noise groups, or None."""
    if not trial or not parent:
        return None
    lengths = {len(run) for run in trial} | {len(run) for run in parent}
    if len(lengths) != 1 or 0 in lengths:
        return None
    groups = [np.asarray(g, float) for g in noise if g and {len(r) for r in g} == lengths and len(g) > 1]
    return np.asarray(trial, float), np.asarray(parent, float), groups


def _paired(t: np.ndarray, p: np.ndarray, groups: list[np.ndarray], sign: float, s: VerdictSettings,
            level: float, parent_runs: int) -> Verdict:
    g = gain(sign * t, sign * p, [sign * p, *groups], s.run_sd_prior, s.run_sd_prior_df, level)
    delta, low, high = float(g["delta"]), float(g["low"]), float(g["high"])
    run_df = int(g["df_run"])
    blind = _blind(parent_runs, run_df, s)
    note = (f"run-level sd {math.sqrt(float(g['s2_run'])):.3g} (raw replicate estimate {float(g['s2_raw']):+.2g} "
            f"over {run_df} df, prior {s.run_sd_prior:g} x {s.run_sd_prior_df:g} df)")
    return _verdict(delta, low, high, level, "paired_items", t.shape[1], float(g["df"]), s,
                    math.sqrt(float(g["s2_run"])), run_df, blind, note)


def _blind(parent_runs: int, run_df: int, s: VerdictSettings) -> str:
    if run_df == 0:
        return f"run-to-run noise not measured (one parent run): the prior sd {s.run_sd_prior:g} stands in for it"
    if parent_runs < FULL_SIGHT_REPEATS and run_df < FULL_SIGHT_REPEATS - 1:
        return f"run-to-run noise rests on {run_df} replicate df: calibrated only from {FULL_SIGHT_REPEATS} parent runs"
    return ""


def _from_values(trial: list[float], parent: list[float], sign: float, s: VerdictSettings, level: float) -> Verdict:
    """t interval over run values: pooled variance of the runs, shrunk toward the prior run sd."""
    t, b = sign * np.asarray(trial, float), sign * np.asarray(parent, float)
    delta = float(t.mean() - b.mean())
    df_data = (len(t) - 1) + (len(b) - 1)
    ss = float(((t - t.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum())
    s2_raw = ss / df_data if df_data else 0.0
    if df_data + s.run_sd_prior_df <= 0 or (df_data == 0 and s.run_sd_prior == 0):
        note = "noise unknown (one run each, no per-item results, no prior run sd)"
        return _verdict(delta, -math.inf, math.inf, level, "unknown_noise", len(t) + len(b), 0.0, s, None, 0,
                        "run-to-run noise unknown: no verdict other than flat is possible", note)
    s2, _ = posterior_s2(np.asarray(s2_raw), np.asarray(s2_raw), df_data, s.run_sd_prior, s.run_sd_prior_df)
    df = df_data + s.run_sd_prior_df
    half = float(t_quantiles(0.5 + level / 2.0, np.asarray(df))) * math.sqrt(float(s2) * (1 / len(t) + 1 / len(b)))
    blind = _blind(len(b), df_data, s)
    note = f"no per-item results; run sd {math.sqrt(float(s2)):.3g} from {df_data} df + prior"
    return _verdict(delta, delta - half, delta + half, level, "run_values", len(t) + len(b), float(df), s,
                    math.sqrt(float(s2)), df_data, blind, note)


def _verdict(delta, low, high, level, method, n, df, s: VerdictSettings, run_sd, run_df, blind, note) -> Verdict:
    verdict = "improved" if low > s.min_effect else "regressed" if high < 0 else "flat"
    text = _explain(verdict, delta, low, high, level, method, n, s.min_effect, note + (f"; {blind}" if blind else ""))
    return Verdict(verdict=verdict, delta=delta, ci_low=low, ci_high=high, level=level, method=method, n=n, df=df,
                   run_sd=run_sd, run_df=run_df, blind=blind, explanation=text)


def _explain(verdict: str, delta: float, low: float, high: float, level: float, method: str, n: int,
             min_effect: float, note: str) -> str:
    why = {
        "improved": f"lower bound above min_effect {min_effect:g}",
        "regressed": "upper bound below 0",
        "flat": f"interval reaches 0 or min_effect {min_effect:g}",
    }[verdict]
    return f"{verdict}: gain {delta:+.4g}, {pct(level)} CI [{low:+.4g}, {high:+.4g}] ({method}, n={n}; {note}); {why}"


def pct(level: float) -> str:
    """A confidence level as people write it: 0.95 -> '95%', 0.975 -> '97.5%' (not rounded to '98%')."""
    return f"{level * 100:g}%"


# ---------------------------------------------------------------------------- flags

FLAG_LIMITS = {
    "divergence_reward_rise": 0.02,   # train reward_mean: mean of the last half minus the first half
    "divergence_eval_drops": 2,       # consecutive drops of eval/ood/greedy_pass@1 (seed 004 §12)
    "divergence_metric": "eval/ood/greedy_pass@1",
    "length_collapse_ratio": 0.5,     # last-quarter mean length below this fraction of the first quarter's
    "truncation_run": 5,              # steps in a row (or all of a shorter run) above abort.truncated_rate
}


def flags(steps: list[dict], evals: list[dict], summary: dict | None, recipe_steps: int,
          abort: AbortRules | None = None) -> list[Flag]:
    """Health flags for one finished run (each check returns a Flag or None).

    The truncation threshold is the one early abort uses: ``abort.truncated_rate`` of the
    recipe's abort block (its default when ``abort`` is None), so it lives in one place.
    """
    abort = abort or AbortRules()
    checks = [
        lambda: _divergence(steps, evals),
        lambda: _length_collapse(steps),
        lambda: _high_truncation(steps, abort.truncated_rate),
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


def _high_truncation(steps: list[dict], limit: float) -> Flag | None:
    rates = _series(steps, "truncated_rate")
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
