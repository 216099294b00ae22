"""Trial starts inside a budget: how long the next trial will take, from what it is and what trials took.

A trial the budget would cut wastes its time, so the controller starts one only when its expected duration fits
in the budget left. The expectation scales this study's observed durations by the next trial's work (the product
of its size keys, steps x gens x prompts ..., which its backend names in ``work_keys``; the planning table is
``autorl/data/rules/plan.yaml``):

- a trial's start-up (from its start to its first logged step: processes, a Ray job's runtime env, model load) is
  taken as fixed, the mean over those trials, and only the rest is scaled by work: on one GPU a 16-step OpenRLHF
  trial is about 90 s of start-up and 50 s of steps, so twice the samples per prompt is not twice the trial;
- durations (past start-up, where every trial has it) are fitted as ``fixed + per_unit x work`` over the last
  ``window`` finished trials (least squares; with one work level only, their mean, so a smaller trial is never
  planned shorter than what was seen);
- above the largest observed work the fit grows in proportion (an upper bound: the fixed part does not grow);
- the margin is a high quantile of observed/predicted over those trials, each predicted from the others (leave
  one out), so it is as wide as this study's own noise and model error; never below 1;
- the study's first trial paid what only the first trial pays (cold imports and caches, a first compile, a Ray
  job's first package), so it plans nothing once later trials have finished; while it is the only one, its
  duration is the plan and those one-time costs are the margin (a first margin on top of them ended an 8-minute
  GPU study after its baseline, with 4 minutes left);
- the trial's timeout stays the hard cap (``timeout_s`` scaled by its work, ``Backend.trial_timeout``); before
  any trial finished it is all there is (capped at half the budget, so a short study still runs the trials that
  tell how long trials take).

Pure functions: the controller passes the history and the next trial's resolved values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from autorl import loading
from autorl.backends.base import work
from autorl.data import shipped
from autorl.ledger import StudyRecords, Trial
from autorl.states import TrialStatus

RULES_PATH = shipped("rules", "plan.yaml")


class PlanRules(BaseModel):
    """The planning table (autorl/data/rules/plan.yaml)."""

    model_config = ConfigDict(extra="forbid")

    window: int = Field(ge=1, description="Finished trials (most recent) that plan the next start.")
    quantile: float = Field(gt=0, le=1, description="Quantile of observed/predicted taken as the margin.")
    min_for_margin: int = Field(ge=2, description="Trials needed before the margin is measured.")
    first_margin: float = Field(ge=1, description="The margin until then.")
    overhead_s: float = Field(ge=0, description="Seconds around a trial that its own times do not cover.")


def rules() -> PlanRules:
    """The planning table, validated (``autorl.loading``)."""
    return loading.load_table(RULES_PATH, PlanRules, "planning rules", "docs/architecture.md")


@dataclass(frozen=True)
class Took:
    """One finished trial: its work and how long it took, opened to judged."""

    work: float
    seconds: float
    first: bool = False  # the study's first trial: it paid the study's one-time start-up
    startup: float | None = None  # seconds from its start to its first logged step (None: not known)


@dataclass(frozen=True)
class Estimate:
    """The next trial's planned duration and how it was reached."""

    seconds: float
    predicted: float | None  # the fit's duration for this work (None before any trial finished)
    margin: float
    basis: int  # finished trials it rests on
    first_only: bool = False  # it rests on the study's first trial alone
    cold_s: float = 0.0  # the cold start-up added for a trial that starts before anything ran in this session

    def describe(self) -> str:
        if self.predicted is None:
            return f"{self.seconds:.0f} s (timeout_s or half the budget: no trial has finished yet)"
        if self.first_only:
            return f"{self.seconds:.0f} s (what the study's first trial took, one-time start-up included, + overhead)"
        cold = f" + {self.cold_s:.0f} s cold start-up" if self.cold_s else ""
        return (
            f"{self.seconds:.0f} s ({self.predicted:.1f} s from {self.basis} finished trials "
            f"x margin {self.margin:.2f}{cold} + overhead)"
        )


def history(rows: list[Trial], keys: Iterable[str], first_end: float | None = None) -> list[Took]:
    """The finished trials of ledger ``rows`` in start order, as ``Took``; every trial that started before the
    study's first one ended ran cold (``--parallel`` starts several at once: each paid the one-time start-up), and
    so did every trial that built a warm pool (``warm_index`` 0), whenever it ran.
    ``first_end`` is when the study's first trial ended, where ``rows`` are not all its trials (the controller
    passes only the last ``window`` finished ones); by default, the earliest end among ``rows``."""
    started = sorted(((r.started, r) for r in rows if r.started is not None), key=lambda x: x[0])
    ends = [r.finished for _, r in started if r.finished is not None]
    end = min(ends, default=math.inf) if first_end is None else first_end
    return [
        Took(
            work(r.params or {}, keys),
            r.finished - start,
            start < end or r.warm_index == 0,  # a warm pool's first trial built the pool: a cold start too
            r.first_step - start if r.first_step else None,
        )
        for start, r in started
        if r.status == TrialStatus.COMPLETE and r.finished is not None
    ]


def recent(records: StudyRecords, keys: Iterable[str], r: PlanRules | None = None) -> list[Took]:
    """The history a study's next run is planned from: its last ``window`` finished trials, each marked cold or not
    against the study's first end (what the controller plans a trial with, and a promote its runs)."""
    window = (r or rules()).window
    return history(records.finished(last=window), keys, first_end=records.first_end())


def fit(obs: list[Took]) -> tuple[float, float]:
    """(fixed, per_unit) by least squares, both kept >= 0; one work level gives (mean, 0)."""
    n = len(obs)
    mw, ms = sum(o.work for o in obs) / n, sum(o.seconds for o in obs) / n
    var = sum((o.work - mw) ** 2 for o in obs)
    if var <= (1e-9 * mw) ** 2 * n:
        return ms, 0.0
    per = sum((o.work - mw) * (o.seconds - ms) for o in obs) / var
    if per <= 0:
        return ms, 0.0
    if ms - per * mw < 0:
        return 0.0, sum(o.work * o.seconds for o in obs) / sum(o.work**2 for o in obs)
    return ms - per * mw, per


def predict(obs: list[Took], w: float) -> float:
    """Seconds for work ``w``: the trials' mean start-up when each has one, plus the fit of the rest up to the
    largest observed work, in proportion beyond it."""
    startups = [o.startup for o in obs if o.startup is not None]
    if len(startups) == len(obs):
        start = sum(startups) / len(obs)
        return start + _scaled([Took(o.work, max(o.seconds - s, 0.0)) for o, s in zip(obs, startups)], w)
    return _scaled(obs, w)


def _scaled(obs: list[Took], w: float) -> float:
    fixed, per = fit(obs)
    top = max(o.work for o in obs)
    at = fixed + per * min(w, top)
    return at * (w / top if w > top else 1.0)


def margin(obs: list[Took], r: PlanRules) -> float:
    """The ``quantile`` of observed/predicted, each trial predicted from the others; at least 1."""
    if len(obs) < r.min_for_margin:
        return r.first_margin
    ratios = sorted(o.seconds / max(predict(obs[:i] + obs[i + 1 :], o.work), 1e-9) for i, o in enumerate(obs))
    return max(1.0, ratios[min(len(ratios), math.ceil(r.quantile * len(ratios))) - 1])


def expected(
    history: list[Took],
    next_work: float,
    timeout_s: float,
    budget_s: float,
    r: PlanRules | None = None,
    cold: bool = False,
) -> Estimate:
    """The next trial's planned duration, never above ``timeout_s`` (the hard per-trial limit). ``cold``: the trial
    starts before any trial of this session has ended (a resumed study's first wave, whose warm pools and processes
    are gone): the cold trials' start-up beyond the steady ones' is added (``cold_extra``)."""
    r = r or rules()
    obs = history[-r.window :]
    if not obs:
        return Estimate(min(timeout_s, budget_s / 2), None, 1.0, 0)
    steady = [o for o in obs if not o.first]
    if not steady:
        pred = predict(obs, next_work)
        return Estimate(min(timeout_s, pred + r.overhead_s), pred, 1.0, len(obs), first_only=True)
    pred, m = predict(steady, next_work), margin(steady, r)
    extra = cold_extra(history) if cold else 0.0
    return Estimate(min(timeout_s, pred * m + extra + r.overhead_s), pred, m, len(steady), cold_s=extra)


def cold_extra(history: list[Took]) -> float:
    """What a cold start costs beyond a steady one: the mean start-up of the trials that started cold less that of
    the others (0 when either is unknown). A resumed SmolLM2 study in warm pools: 212 s against 30 s."""
    cold = [o.startup for o in history if o.first and o.startup is not None]
    warm = [o.startup for o in history if not o.first and o.startup is not None]
    if not cold or not warm:
        return 0.0
    return max(sum(cold) / len(cold) - sum(warm) / len(warm), 0.0)
