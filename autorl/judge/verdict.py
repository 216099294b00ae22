"""Verdicts: is a trial better than the recipe it modifies by more than the noise? And is the run healthy?

``judge`` compares a trial's runs with its parent's runs (the recipe it modifies: the baseline,
or the incumbent it was built on) on exactly the objective and returns improved / regressed /
flat with an interval for the gain. One "improved" run is only a **candidate**: ``confirm``
judges fresh-seed re-runs of it, and only a confirmed improvement counts (docs/triage.md
explains why). ``credit`` gives both the verdict against the parent and the gain over the
original baseline. ``flags`` reads one run's metrics for the failure modes that a good
objective value can hide (seed 004 §6, §12). Crashes are judged by autorl.judge.triage.

The statistics (a per-item paired test plus a run-level noise term for each arm, each with a prior,
Student's t with Welch-Satterthwaite df) live in ``autorl.judge.noise``; this module turns them into
verdicts. ``Noise`` names the replicate runs behind each arm.
"""

from __future__ import annotations

import math
from typing import Literal, TypedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autorl.judge.noise import gain, value_gain
from autorl.metrics import items_key
from autorl.recipe import AbortRules, Objective, VerdictSettings
from autorl.states import Verdict

FULL_SIGHT_REPEATS = 3  # with fewer parent runs the verdict says what it cannot see


class Runs(BaseModel):
    """One recipe's runs (different seeds) as the verdict sees them."""

    model_config = ConfigDict(extra="forbid")

    values: list[float] = Field(description="The objective of each run.")
    items: list[list[float]] | None = Field(
        None, description="Per run, the per-item results that reduce to the objective (same items, same order)."
    )


class Noise(BaseModel):
    """Replicate runs that measure each arm's run-to-run noise, besides the runs a verdict compares."""

    model_config = ConfigDict(extra="forbid")

    parent: list[Runs] | None = Field(
        None, description="Groups of runs of the parent's recipe (None: the parent's runs judged are the group)."
    )
    trial: list[Runs] = Field(
        default_factory=list,
        description="Groups of runs of the trial's own recipe (e.g. its confirmation runs with "
        "the run that made it a candidate); none: the trial's runs judged, if 2+.",
    )
    study: list[Runs] = Field(
        default_factory=list,
        description="Groups of runs of the study's other changed recipes: what a trial's run "
        "noise looks like here, pooled with the trial's own.",
    )


class Judgement(BaseModel):
    """How a trial compares with its parent on the objective: its verdict and the numbers behind it."""

    model_config = ConfigDict(extra="forbid")

    verdict: Literal[Verdict.IMPROVED, Verdict.REGRESSED, Verdict.FLAT] = Field(
        description="improved iff ci_low > min_effect; regressed iff ci_high < 0; else flat."
    )
    delta: float = Field(
        description="Gain in the objective's better direction (trial - parent when maximizing, parent - trial when "
        "minimizing)."
    )
    ci_low: float = Field(description="Lower end of the interval for the gain.")
    ci_high: float = Field(description="Upper end of the interval for the gain.")
    level: float = Field(0.95, description="Two-sided confidence level of the interval.")
    method: str = Field(
        description="paired_items (per-item paired test + run noise), run_values (t over run values) or unknown_noise."
    )
    n: int = Field(description="Paired items (paired_items) or runs (the others).")
    df: float = Field(0.0, description="Degrees of freedom of the t quantile used.")
    parent_sd: float | None = Field(
        None,
        description="Run-level sd assumed for the parent's recipe (its replicates with the prior); None if "
        "not modelled.",
    )
    parent_df: int = Field(0, description="Replicate degrees of freedom behind parent_sd (besides the prior).")
    trial_sd: float | None = Field(
        None,
        description="Run-level sd assumed for the trial's recipe: the parent's, or larger where the trial's own "
        "replicates or the study's other changed recipes measured more; None if not modelled.",
    )
    trial_df: int = Field(0, description="Replicate degrees of freedom behind trial_sd (besides the prior).")
    trial_noise: str = Field(
        "", description="Where trial_sd comes from: 'the parent's', 'its own runs' or 'the study's changed recipes'."
    )
    parent_runs: int = Field(0, description="Parent runs compared.")
    trial_runs: int = Field(0, description="Trial runs compared.")
    own_runs: int = Field(0, description="Runs in the trial's own replicate group (0: none beyond those compared).")
    study_df: int = Field(0, description="Replicate df of the study's other changed recipes behind trial_sd.")
    parent_rates: list[float] | None = Field(
        None, exclude=True, description="Per-item solve rates of the parent runs (what a calibration simulates)."
    )
    blind: str = Field(
        "", description="What this verdict cannot see (e.g. too few parent runs to measure seed noise), or empty."
    )
    explanation: str = Field(description="One line a person can read.")


class Credit(BaseModel):
    """A trial's verdict against its parent, and its gain over the study's original baseline."""

    model_config = ConfigDict(extra="forbid")

    vs_parent: Judgement = Field(description="The verdict that counts: against the recipe the trial modifies.")
    vs_baseline: Judgement = Field(description="Reported separately: the gain over the original baseline.")


class Flag(BaseModel):
    """A health problem seen in one run's metrics."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="train_eval_divergence, length_collapse, high_truncation, no_training or short_run.")
    evidence: str = Field(description="The numbers that raised it.")


# ---------------------------------------------------------------------------- objective items


def objective_items(evals: list[dict], objective: Objective) -> list[float] | None:
    """Per-item results that reduce to the objective as ``reduction`` reduces the metric, or None.

    Only a greedy pass@1 objective has per-item results (``eval/<split>/items``): ``last`` takes
    the last eval's items, ``best`` the items of the best eval chosen without looking at them
    (``best_items``), ``mean_last_k`` the per-item mean over the last k evals. Any other metric
    (sampling pass@k, a train metric) has none: the verdict then judges the run values.
    """
    key = items_key(objective.metric)
    if key is None:
        return None
    rows = [e for e in evals if isinstance(e.get(objective.metric), (int, float)) and e.get(key)]
    if not rows:
        return None
    rows = [r for r in rows if len(r[key]) == len(rows[-1][key])]  # the eval set's size, should it ever change
    if objective.reduction == "best":
        return best_items(np.asarray([r[key] for r in rows], float), objective.direction == "maximize")
    if objective.reduction == "mean_last_k":
        rows = rows[-objective.k :]
    else:
        rows = rows[-1:]
    return [float(x) for x in np.mean(np.asarray([r[key] for r in rows], float), axis=0)]


def best_items(evals: np.ndarray, maximize: bool) -> list[float]:
    """Per-item results of the best of K evals (``evals``: K x items), each item taken from the eval that the
    *other* half of the items ranks best (cross-fitting).

    Taking all items from the eval whose mean is best would judge the very coin flips that made it look best:
    the maximum of K noisy evals is biased upward, more for a run with more evals, so a trial that evaluates
    more often than its parent would gain on noise alone. Items at even positions are taken from the eval the
    odd ones rank best, and the reverse; with one eval or one item it is that eval.
    """
    k, n = evals.shape
    if k == 1 or n < 2:
        return [float(x) for x in evals[int(np.argmax(evals.mean(axis=1) * (1 if maximize else -1)))]]
    sign = 1.0 if maximize else -1.0
    out = np.empty(n)
    for half in (0, 1):
        mine, other = np.arange(half, n, 2), np.arange(1 - half, n, 2)
        pick = int(np.argmax(sign * evals[:, other].mean(axis=1)))
        out[mine] = evals[pick, mine]
    return [float(x) for x in out]


# ---------------------------------------------------------------------------- judge


def judge(
    trial: Runs,
    parent: Runs,
    settings: VerdictSettings,
    direction: str,
    noise: Noise | None = None,
    level: float | None = None,
) -> Judgement:
    """Compare a trial's runs with its parent's runs.

    With per-item results on both sides: the gain is the mean over items of the per-item
    difference of run means; its variance the paired items' flips plus each arm's run-level shift
    (``autorl.judge.noise``): the parent's from the parent's replicates (``noise.parent``, else the
    parent runs), the trial's the larger of that and what its own replicates (``noise.trial``, else
    its runs when there are two or more) or the study's changed recipes (``noise.study``) measured.
    Without per-item results: the same on the run values (``run_values``).
    ``direction='minimize'`` flips the sign so that a positive gain is always better.
    """
    sign = _sign(direction)
    level = settings.level if level is None else level
    if not trial.values or not parent.values:
        raise ValueError("judge needs at least one trial value and one parent value")
    noise = noise or Noise()
    arms = _arm_groups(trial, parent, noise)
    arrays = _item_arrays(trial, parent, arms)
    if arrays is not None:
        return _paired(*arrays, sign, settings, level, len(parent.values))
    return _from_values(trial, parent, arms, sign, settings, level)


def confirm(
    fresh: Runs, parent: Runs, settings: VerdictSettings, direction: str, noise: Noise | None = None
) -> Judgement:
    """Judge a candidate's fresh-seed re-runs alone against its parent at ``confirm_level``.

    The run that made it a candidate is left out of the gain: it was selected for looking good, so it
    would bias the confirmation. Its recipe's own run noise is measured by ``noise.trial`` (the caller
    passes the fresh runs with that run: selected for a high value, it can only widen the spread) or,
    without it, by the fresh runs alone.
    """
    return judge(fresh, parent, settings, direction, noise, level=settings.confirm_level)


def credit(
    trial: Runs,
    parent: Runs,
    baseline: Runs,
    settings: VerdictSettings,
    direction: str,
    noise: Noise | None = None,
    baseline_noise: Noise | None = None,
) -> Credit:
    """The verdict against the parent (what counts) and, separately, the gain over the baseline."""
    vs_parent = judge(trial, parent, settings, direction, noise)
    vs_base = vs_parent if parent == baseline else judge(trial, baseline, settings, direction, baseline_noise or noise)
    return Credit(vs_parent=vs_parent, vs_baseline=vs_base)


def _sign(direction: str) -> float:
    if direction not in ("maximize", "minimize"):
        raise ValueError(f"direction must be 'maximize' or 'minimize', got {direction!r}")
    return 1.0 if direction == "maximize" else -1.0


def _arm_groups(trial: Runs, parent: Runs, noise: Noise) -> tuple[list[Runs], list[Runs], list[Runs]]:
    """(the parent's groups, the trial's own groups, the study's groups) with the defaults filled in."""
    own = noise.trial or ([trial] if len(trial.values) > 1 else [])
    return (noise.parent if noise.parent is not None else [parent]), own, noise.study


_Arrays = tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray], list[np.ndarray]]


def _item_arrays(trial: Runs, parent: Runs, arms: tuple[list[Runs], list[Runs], list[Runs]]) -> _Arrays | None:
    """Trial and parent per-item results as (runs, items) arrays plus each arm's item groups, or None."""
    if not trial.items or not parent.items:
        return None
    lengths = {len(run) for run in trial.items} | {len(run) for run in parent.items}
    if len(lengths) != 1 or 0 in lengths:
        return None

    def arrays(groups: list[Runs]) -> list[np.ndarray]:
        return [
            np.asarray(g.items, float)
            for g in groups
            if g.items and len(g.items) > 1 and {len(r) for r in g.items} == lengths
        ]

    parent_groups, own, study = (arrays(g) for g in arms)
    return np.asarray(trial.items, float), np.asarray(parent.items, float), parent_groups, own, study


def _sources(own: list, study: list) -> list[list]:
    """The trial arm's alternatives: its own replicates alone, and pooled with the study's changed recipes."""
    return [x for x in (own, own + study if study else []) if x]


def _paired(
    t: np.ndarray,
    p: np.ndarray,
    parent_groups,
    own,
    study,
    sign: float,
    s: VerdictSettings,
    level: float,
    parent_runs: int,
) -> Judgement:
    if _noise_unknown(sum(x.shape[0] - 1 for x in parent_groups + own + study), s):
        delta = float(sign * (t.mean(axis=0) - p.mean(axis=0)).mean())
        return _unknown(
            delta,
            t.shape[1],
            level,
            s,
            "one run each, no prior run sd: the items' flips alone would take the run-to-run noise for zero",
        )
    g = gain(
        sign * t,
        sign * p,
        [sign * x for x in parent_groups],
        [[sign * x for x in src] for src in _sources(own, study)],
        s.run_sd_prior,
        s.run_sd_prior_df,
        level,
    )
    arms = {
        **_arm_fields(g, own, study),
        **_design(t.shape[0], parent_runs, own, study),
        "parent_rates": [float(x) for x in p.mean(axis=0)],
    }
    blind = _blind(parent_runs, arms["parent_df"], s)
    return _verdict(
        float(g["delta"]),
        float(g["low"]),
        float(g["high"]),
        level,
        "paired_items",
        t.shape[1],
        float(g["df"]),
        s,
        arms,
        blind,
        _noise_note(g, arms, s),
    )


def _design(trial_runs: int, parent_runs: int, own: list, study: list) -> dict:
    """The shape of the test (runs per arm, replicate groups), which its calibration simulates."""
    return {
        "trial_runs": trial_runs,
        "parent_runs": parent_runs,
        "own_runs": max((len(x) for x in own), default=0),
        "study_df": sum(len(x) - 1 for x in study),
    }


def _arm_fields(g: dict, own: list, study: list) -> dict:
    """Each arm's sd and replicate df, and where the trial's came from, from a ``gain`` result."""
    parent_df, trial_df = int(g["df_parent"]), int(g["df_trial"])
    if bool(g["same"]):
        source = "the parent's"
    else:
        own_df = sum(len(x) - 1 for x in own)
        source = "its own runs" if trial_df == own_df else "the study's changed recipes"
    return {
        "parent_sd": math.sqrt(float(g["s2_parent"])),
        "parent_df": parent_df,
        "trial_sd": math.sqrt(float(g["s2_trial"])),
        "trial_df": trial_df,
        "trial_noise": source,
    }


def _noise_note(g: dict, arms: dict, s: VerdictSettings) -> str:
    return (
        f"run-level sd: parent {arms['parent_sd']:.3g} (raw replicate estimate {float(g['s2_raw_parent']):+.2g} "
        f"over {arms['parent_df']} df), trial {arms['trial_sd']:.3g} ({arms['trial_noise']}, {arms['trial_df']} "
        f"df); prior {s.run_sd_prior:g} x {s.run_sd_prior_df:g} df"
    )


def _blind(parent_runs: int, run_df: int, s: VerdictSettings) -> str:
    if run_df == 0:
        return f"run-to-run noise not measured (one parent run): the prior sd {s.run_sd_prior:g} stands in for it"
    if parent_runs < FULL_SIGHT_REPEATS and run_df < FULL_SIGHT_REPEATS - 1:
        return f"run-to-run noise rests on {run_df} replicate df: calibrated only from {FULL_SIGHT_REPEATS} parent runs"
    return ""


def _from_values(
    trial: Runs,
    parent: Runs,
    arms: tuple[list[Runs], list[Runs], list[Runs]],
    sign: float,
    s: VerdictSettings,
    level: float,
) -> Judgement:
    """t interval over run values: each arm's variance from its groups' values, shrunk toward the prior run sd."""
    parent_groups, own, study = (
        [sign * np.asarray(g.values, float) for g in groups if len(g.values) > 1] for groups in arms
    )
    t, b = sign * np.asarray(trial.values, float), sign * np.asarray(parent.values, float)
    delta, n = float(t.mean() - b.mean()), len(t) + len(b)
    if _noise_unknown(sum(len(x) - 1 for x in parent_groups + own + study), s):
        return _unknown(delta, n, level, s, "one run each, no per-item results, no prior run sd")
    g = value_gain(t, b, parent_groups, _sources(own, study), s.run_sd_prior, s.run_sd_prior_df, level)
    fields = {**_arm_fields(g, own, study), **_design(len(t), len(b), own, study)}
    note = "no per-item results; " + _noise_note(g, fields, s)
    return _verdict(
        delta,
        float(g["low"]),
        float(g["high"]),
        level,
        "run_values",
        n,
        float(g["df"]),
        s,
        fields,
        _blind(len(b), fields["parent_df"], s),
        note,
    )


def _noise_unknown(replicate_df: int, s: VerdictSettings) -> bool:
    """No replicate measures the run-to-run noise and no prior stands in for it (the recipe switched it off)."""
    return replicate_df + s.run_sd_prior_df <= 0 or (replicate_df == 0 and s.run_sd_prior == 0)


def _unknown(delta: float, n: int, level: float, s: VerdictSettings, why: str) -> Judgement:
    return _verdict(
        delta,
        -math.inf,
        math.inf,
        level,
        "unknown_noise",
        n,
        0.0,
        s,
        {},
        "run-to-run noise unknown: no verdict other than flat is possible",
        f"noise unknown ({why})",
    )


def _verdict(delta, low, high, level, method, n, df, s: VerdictSettings, arms: dict, blind, note) -> Judgement:
    verdict = Verdict.IMPROVED if low > s.min_effect else Verdict.REGRESSED if high < 0 else Verdict.FLAT
    text = _explain(verdict, delta, low, high, level, method, n, s.min_effect, note + (f"; {blind}" if blind else ""))
    return Judgement(
        verdict=verdict,
        delta=delta,
        ci_low=low,
        ci_high=high,
        level=level,
        method=method,
        n=n,
        df=df,
        blind=blind,
        explanation=text,
        **arms,
    )


def _explain(
    verdict: Verdict,
    delta: float,
    low: float,
    high: float,
    level: float,
    method: str,
    n: int,
    min_effect: float,
    note: str,
) -> str:
    why = {
        Verdict.IMPROVED: f"lower bound above min_effect {min_effect:g}",
        Verdict.REGRESSED: "upper bound below 0",
        Verdict.FLAT: f"interval reaches 0 or min_effect {min_effect:g}",
    }[verdict]
    return f"{verdict}: gain {delta:+.4g}, {pct(level)} CI [{low:+.4g}, {high:+.4g}] ({method}, n={n}; {note}); {why}"


def pct(level: float) -> str:
    """A confidence level as people write it: 0.95 -> '95%', 0.975 -> '97.5%' (not rounded to '98%')."""
    return f"{level * 100:g}%"


# ---------------------------------------------------------------------------- flags


class FlagLimits(TypedDict):
    """The thresholds of the health flags (``FLAG_LIMITS``)."""

    divergence_reward_rise: float
    divergence_eval_drops: int
    divergence_metric: str
    length_collapse_ratio: float
    truncation_run: int


FLAG_LIMITS: FlagLimits = {
    "divergence_reward_rise": 0.02,  # train reward_mean: mean of the last half minus the first half
    "divergence_eval_drops": 2,  # consecutive drops of eval/ood/greedy_pass@1 (seed 004 §12)
    "divergence_metric": "eval/ood/greedy_pass@1",
    "length_collapse_ratio": 0.5,  # last-quarter mean length below this fraction of the first quarter's
    "truncation_run": 5,  # steps in a row (or all of a shorter run) above abort.truncated_rate
}


def flags(
    steps: list[dict], evals: list[dict], summary: dict | None, recipe_steps: int, abort: AbortRules | None = None
) -> list[Flag]:
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
    tail = held_out[-(drops + 1) :]
    falling = all(b < a for a, b in zip(tail, tail[1:]))
    if rise <= FLAG_LIMITS["divergence_reward_rise"] or not falling:
        return None
    path = " -> ".join(f"{v:.3g}" for v in tail)
    return Flag(
        name="train_eval_divergence",
        evidence=f"train reward_mean rose {rise:+.3g} (first vs last half) while {metric} fell {path}",
    )


def _length_collapse(steps: list[dict]) -> Flag | None:
    lengths = _series(steps, "response_length_mean")
    if len(lengths) < 4:
        return None
    k = max(1, len(lengths) // 4)
    early, late = float(np.mean(lengths[:k])), float(np.mean(lengths[-k:]))
    if early <= 0 or late >= FLAG_LIMITS["length_collapse_ratio"] * early:
        return None
    return Flag(
        name="length_collapse",
        evidence=f"response_length_mean fell from {early:.4g} (first {k} steps) to {late:.4g} (last {k}), "
        f"{late / early - 1:+.0%}",
    )


def _high_truncation(steps: list[dict], limit: float) -> Flag | None:
    rates = _series(steps, "truncated_rate")
    need = min(FLAG_LIMITS["truncation_run"], len(rates))
    longest = run = 0
    for r in rates:
        run = run + 1 if r > limit else 0
        longest = max(longest, run)
    if len(rates) < 2 or longest < need:
        return None
    return Flag(
        name="high_truncation",
        evidence=f"truncated_rate > {limit:g} for {longest} consecutive steps (max {max(rates):.2f}): raise "
        f"max_new_tokens or penalise length",
    )


def _training_done(steps: list[dict], summary: dict | None, recipe_steps: int) -> Flag | None:
    done = summary.get("steps_done") if summary else None
    done = len(steps) if not isinstance(done, int) else max(done, len(steps))
    status = summary.get("status") if summary else None
    if recipe_steps <= 0 or done >= recipe_steps:
        return None
    if done == 0:
        return Flag(
            name="no_training",
            evidence=f"0 of {recipe_steps} training steps ran (summary status {status!r}): the result is the "
            f"untrained model",
        )
    if status == "ok":
        return Flag(
            name="short_run",
            evidence=f"only {done} of {recipe_steps} training steps ran, yet the run reported status 'ok'",
        )
    return None
