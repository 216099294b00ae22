"""Early abort: stop a trial whose first steps already show it cannot learn (seed 004 §12).

``check_abort`` is called by the controller on the live step stream (every poll, with all
steps so far) and returns the first rule that trips, or None. Thresholds come from the
recipe's ``abort`` block (autorl.recipe.AbortRules); the window rules themselves are the data
table ``autorl/data/rules/abort.yaml`` (``load_window_rules``, read on first use). A tripped trial is recorded as
PRUNED, not as a crash.

Rules:

- ``nonfinite``: any step value is NaN/inf: immediate.
- ``reward_collapse``: reward_mean within ``reward_stuck_eps`` of 0 on ``collapse_window``
  consecutive steps anywhere after step 1, once step 1 reached ``collapse_from``: the policy
  collapsed and no group has a learning signal left (a ``start: any`` row of the table).
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
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autorl import loading
from autorl.data import shipped
from autorl.metrics import absent_keys
from autorl.recipe import AbortRules

RULES_PATH = shipped("rules", "abort.yaml")


NONFINITE_STRINGS = ("nan", "NaN", "inf", "-inf", "Infinity", "-Infinity")


class AbortDecision(BaseModel):
    """Why a trial is being stopped early."""

    model_config = ConfigDict(extra="forbid")

    rule: str = Field(description="Name of the rule that tripped.")
    reason: str = Field(description="One line: what was seen and what it usually means.")
    step: int | None = Field(None, description="Step at which it tripped.")
    values: list[float] = Field(
        default_factory=list, description="The values that tripped it (one per step of the window)."
    )


class WindowRule(BaseModel):
    """One row of autorl/data/rules/abort.yaml."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Rule name, reported as the abort's rule.")
    metric: str = Field(description="Step metric the test reads.")
    op: Literal["near", "eq", "ge", "gt"] = Field(description="near: |v - around| <= limit; eq; ge; gt.")
    limit: float | str = Field(description="A number, or the name of a threshold in the recipe's abort block.")
    around: float = Field(0.0, description="Centre for op 'near'.")
    start: Literal["first", "any"] = Field(
        "first", description="first: the first steps (from step 1 or 2); any: consecutive steps anywhere after step 1."
    )
    window: int | str | None = Field(
        None, description="Steps the test must hold: a number, a threshold name, or None for the abort block's window."
    )
    had: float | str | None = Field(
        None,
        description="The rule applies only if the metric's step-1 value reached this (a collapse needs a level "
        "to fall from): a number or a threshold name.",
    )
    reason: str = Field(description="One line; {n} is the window, {limit} the limit, {had} step 1's value.")

    def threshold(self, rules: AbortRules, name: float | str | None = None) -> float:
        value = self.limit if name is None else name
        return float(getattr(rules, value)) if isinstance(value, str) else float(value)

    def steps(self, rules: AbortRules) -> int:
        return rules.window if self.window is None else int(self.threshold(rules, self.window))

    def holds(self, v: float, rules: AbortRules) -> bool:
        lim = self.threshold(rules)
        return {"near": abs(v - self.around) <= lim, "eq": v == lim, "ge": v >= lim, "gt": v > lim}[self.op]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rules: list[WindowRule]


def load_window_rules(path: Path | None = None) -> list[WindowRule]:
    """The window rules table (default: the packaged autorl/data/rules/abort.yaml), validated."""
    return loading.load_table(path or RULES_PATH, _Table, "abort rules", "docs/triage.md", _unknown_threshold).rules


def _unknown_threshold(table: _Table) -> str | None:
    """A rule that names a threshold the recipe's abort block does not have."""
    for rule in table.rules:
        for name in (rule.limit, rule.window, rule.had):
            if isinstance(name, str) and name not in AbortRules.model_fields:
                return f"rule {rule.name} names threshold '{name}', which the recipe's abort block does not have"
    return None


def check_abort(steps: list[dict], rules: AbortRules, max_grad_norm: float | None) -> AbortDecision | None:
    """The first early-abort rule the steps so far trip, or None (also when rules are disabled)."""
    if not rules.enabled or not steps:
        return None
    found = _nonfinite(steps)
    if found:
        return found
    for rule in load_window_rules():
        found = _first_window(steps, rules, rule) if rule.start == "first" else _any_window(steps, rules, rule)
        if found:
            return found
    return _grad_explosion(steps, rules, max_grad_norm)


def unavailable(steps: list[dict], max_grad_norm: float | None = None) -> list[str]:
    """One line per rule that cannot fire because its backend declares the rule's key absent."""
    gone = absent_keys(steps)
    keyed = [(rule.name, rule.metric) for rule in load_window_rules()]
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
                return AbortDecision(
                    rule="nonfinite",
                    reason=f"{key} is {value} at step {row.get('step')}: training diverged",
                    step=row.get("step"),
                    values=[float(value)],
                )
    return None


def _number(row: dict, key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _first_window(steps: list[dict], rules: AbortRules, rule: WindowRule) -> AbortDecision | None:
    """The rule holds on each of the first ``window`` steps, counted from step 1 or from step 2.

    Step 1 is sampled before any update, so a run that collapses with its first update (lr far
    too high: reward 0, grad norm 0 and all-equal groups from step 2 on) is caught too —
    seed 004 §12's "stuck at 0 beyond step 1".
    """
    for start in (0, 1):
        found = _window_at(steps, start, rules, rule)
        if found or len(steps) < start + rule.steps(rules):
            return found
    return None


def _any_window(steps: list[dict], rules: AbortRules, rule: WindowRule) -> AbortDecision | None:
    """The rule holds on ``window`` consecutive steps anywhere after step 1, and step 1 reached ``had``."""
    first = _number(steps[0], rule.metric)
    if rule.had is not None and (first is None or first < rule.threshold(rules, rule.had)):
        return None
    n, run = rule.steps(rules), 0
    for i in range(1, len(steps)):
        v = _number(steps[i], rule.metric)
        run = run + 1 if v is not None and rule.holds(v, rules) else 0
        if run >= n:
            return _window_at(steps, i - n + 1, rules, rule)
    return None


def _window_at(steps: list[dict], start: int, rules: AbortRules, rule: WindowRule) -> AbortDecision | None:
    """The decision if the rule holds on each of the ``window`` steps from index ``start``, else None."""
    n = rule.steps(rules)
    window = steps[start : start + n]
    values = [_number(row, rule.metric) for row in window]
    if len(window) < n or any(v is None or not rule.holds(v, rules) for v in values):
        return None
    had = _number(steps[0], rule.metric)
    text = rule.reason.format(n=n, limit=f"{rule.threshold(rules):g}", had=f"{had:g}" if had is not None else "?")
    return AbortDecision(rule=rule.name, reason=text, step=window[-1].get("step"), values=values)


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
            text = (
                f"grad_norm >= {rules.grad_norm_factor:g} x max_grad_norm ({limit:g}) on {len(run)} consecutive steps: "
                "updates are clipped to nothing; lower lr or tighten eps_clip"
            )
            return AbortDecision(rule="grad_explosion", reason=text, step=row.get("step"), values=run)
    return None
