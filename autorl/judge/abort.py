"""Early abort: stop a trial whose first steps already show it cannot learn (seed 004 §12).

``check_abort`` is called by the controller on the live step stream (every poll, with all
steps so far) and returns the first rule that trips, or None. Thresholds come from the
recipe's ``abort`` block (autorl.recipe.AbortRules); the rules themselves are the table
``WINDOW_RULES`` below. A tripped trial is recorded as PRUNED, not as a crash.

Rules:

- ``nonfinite``: any step value is NaN/inf: immediate.
- ``reward_stuck_zero`` / ``reward_stuck_one``: reward_mean within ``reward_stuck_eps`` of 0
  (data or reward bug, or a collapse on the first update) or of 1 (the task is too easy) on
  each of the first ``window`` steps. Every window rule also accepts the window that starts
  at step 2, because step 1 is sampled before any update.
- ``grad_norm_zero``: grad_norm == 0 on each of the first ``window`` steps (frozen weights).
- ``zero_std_groups``: frac_zero_std_groups == 1 on each of the first ``window`` steps: every
  group's rewards are equal, so every advantage is 0 and nothing is learned.
- ``truncation``: truncated_rate > ``truncated_rate`` on each of the first ``window`` steps.
- ``clip_ratio``: clip_ratio > ``clip_ratio`` on each of the first ``window`` steps (LR too high).
- ``grad_explosion``: grad_norm >= ``grad_norm_factor`` x max_grad_norm on ``window``
  consecutive steps anywhere after step 1. Not on one step: seed 004 §6 reports 100-400x
  spikes in runs that went on learning (the fix there is eps_clip, not a kill), and §12
  treats only "consistently > 100x" as a run that barely updates. Step 1 is excluded because
  the first update's norm is routinely large. Skipped when max_grad_norm is None.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from autorl.metrics import absent_keys
from autorl.recipe import AbortRules

NONFINITE_STRINGS = ("nan", "NaN", "inf", "-inf", "Infinity", "-Infinity")


class AbortDecision(BaseModel):
    """Why a trial is being stopped early."""

    model_config = ConfigDict(extra="forbid")

    rule: str = Field(description="Name of the rule that tripped.")
    reason: str = Field(description="One line: what was seen and what it usually means.")
    step: int | None = Field(None, description="Step at which it tripped.")
    values: list[float] = Field(default_factory=list, description="The values that tripped it (one per step of the window).")


# name, metric key, test on one value (given thresholds), reason (formatted with n and limit).
WindowTest = Callable[[float, AbortRules], bool]
WINDOW_RULES: list[tuple[str, str, WindowTest, str]] = [
    ("reward_stuck_zero", "reward_mean", lambda v, r: abs(v) <= r.reward_stuck_eps,
     "reward_mean stuck at 0 over the first {n} steps: a data or reward bug"),
    ("reward_stuck_one", "reward_mean", lambda v, r: abs(v - 1.0) <= r.reward_stuck_eps,
     "reward_mean stuck at 1 over the first {n} steps: the prompts are too easy to learn from"),
    ("grad_norm_zero", "grad_norm", lambda v, r: v == 0.0,
     "grad_norm is 0 over the first {n} steps: the weights are frozen or the loss is detached"),
    ("zero_std_groups", "frac_zero_std_groups", lambda v, r: v >= 1.0,
     "every group has equal rewards over the first {n} steps: all advantages are 0 (raise gens or temperature)"),
    ("truncation", "truncated_rate", lambda v, r: v > r.truncated_rate,
     "truncated_rate above {limit} over the first {n} steps: raise max_new_tokens"),
    ("clip_ratio", "clip_ratio", lambda v, r: v > r.clip_ratio,
     "clip_ratio above {limit} from the start ({n} steps): the learning rate is too high"),
]
_LIMITS = {"truncation": "truncated_rate", "clip_ratio": "clip_ratio"}


def check_abort(steps: list[dict], rules: AbortRules, max_grad_norm: float | None) -> AbortDecision | None:
    """The first early-abort rule the steps so far trip, or None (also when rules are disabled)."""
    if not rules.enabled or not steps:
        return None
    found = _nonfinite(steps)
    if found:
        return found
    for name, key, test, reason in WINDOW_RULES:
        found = _first_window(steps, rules, name, key, test, reason)
        if found:
            return found
    return _grad_explosion(steps, rules, max_grad_norm)


def unavailable(steps: list[dict], max_grad_norm: float | None = None) -> list[str]:
    """One line per rule that cannot fire because its backend declares the rule's key absent."""
    gone = absent_keys(steps)
    keyed = [(name, key) for name, key, _, _ in WINDOW_RULES]
    keyed += [("grad_explosion", "grad_norm")] if max_grad_norm else []
    return [f"{name}: not available ({key} absent from this backend's metrics)" for name, key in keyed if key in gone]


def _is_nonfinite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    return isinstance(value, str) and value in NONFINITE_STRINGS


def _nonfinite(steps: list[dict]) -> AbortDecision | None:
    for row in steps:
        for key, value in row.items():
            if _is_nonfinite(value):
                return AbortDecision(rule="nonfinite", reason=f"{key} is {value} at step {row.get('step')}: training diverged",
                                     step=row.get("step"), values=[float(value)])
    return None


def _number(row: dict, key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _first_window(steps: list[dict], rules: AbortRules, name: str, key: str, test: WindowTest, reason: str) -> AbortDecision | None:
    """The rule holds on each of the first ``window`` steps, counted from step 1 or from step 2.

    Step 1 is sampled before any update, so a run that collapses with its first update (lr far
    too high: reward 0, grad norm 0 and all-equal groups from step 2 on) is caught too —
    seed 004 §12's "stuck at 0 beyond step 1".
    """
    for start in (0, 1):
        window = steps[start:start + rules.window]
        if len(window) < rules.window:
            return None
        values = [_number(row, key) for row in window]
        if all(v is not None for v in values) and all(test(v, rules) for v in values):
            limit = getattr(rules, _LIMITS.get(name, "window"))
            text = reason.format(n=rules.window, limit=limit)
            return AbortDecision(rule=name, reason=text, step=window[-1].get("step"), values=values)
    return None


def _grad_explosion(steps: list[dict], rules: AbortRules, max_grad_norm: float | None) -> AbortDecision | None:
    if not max_grad_norm:
        return None
    limit = rules.grad_norm_factor * max_grad_norm
    run: list[float] = []
    for i, row in enumerate(steps):
        g = _number(row, "grad_norm")
        if i == 0 or row.get("step") == 1 or g is None or g < limit:
            run = []
            continue
        run.append(g)
        if len(run) >= rules.window:
            text = (f"grad_norm >= {rules.grad_norm_factor:g} x max_grad_norm ({limit:g}) on {len(run)} consecutive steps: "
                    "updates are clipped to nothing; lower lr or tighten eps_clip")
            return AbortDecision(rule="grad_explosion", reason=text, step=row.get("step"), values=run)
    return None
