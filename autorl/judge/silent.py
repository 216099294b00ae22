"""Silent failures: a run that exits 0 and is still broken.

``check(steps, summary, log_text, planned_steps)`` reads a completed run's metric records (the
schema of ``autorl/metrics.py``) and its log, and returns the first failure that holds, in this
order (thresholds and remedies in ``autorl/data/rules/silent.yaml``):

1. ``no_training``: not one training step ran, while the recipe asked for some;
2. ``nonfinite``: a step's loss, grad norm, KL, reward (or any other key), or an eval's value, is
   NaN/inf, which makes the run ``nan_divergence`` however it exited;
3. ``output_collapse``: on each of the last steps the completions are empty or one token
   repeated (``degenerate_rate``, else an empty mean length, else near-zero entropy with every
   completion cut at the limit);
4. ``reward_constant``: ``reward_mean`` is identically 0 (or 1) from the first step.

Each comes back as a ``SilentFailure`` with a triage category, a root-cause line (a log line
when the log shows it, else the metric evidence), a remedy and a signature, so the controller
records the trial as a crash and ``triage.decide_action`` decides what to do. Pure: no torch,
no subprocess, no ledger.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autorl import loading
from autorl.data import shipped
from autorl.judge import triage
from autorl.states import CrashCategory

RULES_PATH = shipped("rules", "silent.yaml")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SilentRule(_Model):
    category: CrashCategory = Field(description="The triage category the failure is recorded as.")
    remedy: str = Field(description="One line: what to do about it.")


class NonfiniteRule(SilentRule):
    keys: list[str] = Field(default_factory=list, description="Keys named first when several turn non-finite.")


class CollapseRule(SilentRule):
    last_steps: int = Field(3, ge=1, description="The collapse must hold on each of the last this many steps.")
    degenerate_rate: float = Field(0.9, gt=0, le=1, description="Share of empty or repeated-token completions.")
    empty_length: float = Field(1.0, ge=0, description="response_length_mean at most this: empty completions.")
    entropy_max: float = Field(0.01, ge=0, description="Entropy below this ...")
    truncated_min: float = Field(
        0.99, ge=0, le=1, description="... with truncated_rate at least this: one token repeated."
    )


class ConstantRule(SilentRule):
    min_steps: int = Field(3, ge=1, description="Fewer steps are too little evidence.")
    values: list[float] = Field(default_factory=lambda: [0.0, 1.0], description="Constant rewards that mean no signal.")
    eps: float = Field(1e-6, ge=0, description="Tolerance around those values.")


class SilentRules(_Model):
    no_training: SilentRule
    nonfinite: NonfiniteRule
    output_collapse: CollapseRule
    reward_constant: ConstantRule
    no_objective: SilentRule


class SilentFailure(_Model):
    """One broken run that exited 0."""

    check: str = Field(description="no_training, nonfinite, output_collapse, reward_constant or no_objective.")
    category: CrashCategory = Field(description="The triage category it is recorded as.")
    root_cause_line: str = Field(description="The log line that shows it, else the metric evidence.")
    remedy: str = Field(description="One line: what to do about it.")
    step: int | None = Field(None, description="The step where it shows (first bad step), if any.")

    def fields(self) -> dict[str, Any]:
        """The trial row's crash columns."""
        return {
            "crash_category": self.category,
            "root_cause": self.root_cause_line,
            "remedy": self.remedy,
            "crash_signature": triage.signature(self.category, self.root_cause_line),
            "reason": f"exited 0 but {self.check.replace('_', ' ')}: {self.root_cause_line[:160]}",
        }


def load_rules() -> SilentRules:
    """The shipped silent-failure table, validated (``autorl.loading``)."""
    return loading.load_table(RULES_PATH, SilentRules, "silent-failure rules", "docs/triage.md")


def check(
    steps: list[dict],
    summary: dict | None = None,
    log_text: str = "",
    planned_steps: int = 0,
    evals: list[dict] | None = None,
    rules: SilentRules | None = None,
) -> SilentFailure | None:
    """The first silent failure of a completed run, or None when it looks healthy."""
    rules = rules or load_rules()
    lines = triage.log_lines(log_text)
    for probe in (_no_training, _nonfinite, _collapse, _constant_reward):
        found = probe(steps, summary, evals or [], lines, planned_steps, rules)
        if found is not None:
            return found
    return None


KEYS_NAMED = 12  # a missing objective's root cause names at most this many of the keys the run did log


def missing_objective(
    steps: list[dict], evals: list[dict], metric: str, rules: SilentRules | None = None
) -> SilentFailure | None:
    """A run that exited 0 and logged records, none of them with ``metric`` (a finite value of it is no failure, a
    NaN one is ``nonfinite``'s): the recipe names a key its backend does not log. None when it logged nothing (no
    evidence of a name) or the key is there."""
    rows = evals if metric.startswith("eval/") else steps
    if not rows or any(metric in r for r in rows):
        return None
    logged = sorted({k for r in rows for k in r if k not in ("type", "step") and not k.endswith("/items")})
    close = difflib.get_close_matches(metric, logged, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    shown = ", ".join(logged[:KEYS_NAMED]) + (
        f" and {len(logged) - KEYS_NAMED} more" if len(logged) > KEYS_NAMED else ""
    )
    kind = "eval" if rows is evals else "step"
    line = f"no {kind} record has the objective metric {metric}{hint}; they have: {shown or 'no values'}"
    c = (rules or load_rules()).no_objective
    return SilentFailure(
        check="no_objective", category=c.category, root_cause_line=line, remedy=c.remedy.format(metric=metric)
    )


def _no_training(steps, summary, evals, lines, planned, rules) -> SilentFailure | None:
    """No step record and no steps done, while the recipe asked for some and the metrics were read
    (a summary or an eval record exists: unreadable metrics are not evidence of anything)."""
    done = summary.get("steps_done") if summary else None
    if steps or planned <= 0 or (summary is None and not evals) or (isinstance(done, int) and done > 0):
        return None
    c = rules.no_training
    line = f"0 of {planned} training steps ran (summary steps_done {done!r}), yet the run exited 0"
    return SilentFailure(check="no_training", category=c.category, root_cause_line=line, remedy=c.remedy)


def _nonfinite(steps, summary, evals, lines, planned, rules) -> SilentFailure | None:
    """The first step (then eval) record with a NaN/inf value; its root line is the first log line that shows one
    of the record's bad keys (the schema's main keys tried first), else the metric record itself. A NaN eval is
    as fatal as a NaN step: the verdict would compare it (a NaN baseline run makes every gain NaN, an infinite
    trial value an infinite one)."""
    c = rules.nonfinite
    for kind, rec in [("step", r) for r in steps] + [("eval", r) for r in evals]:
        bad = [k for k, v in rec.items() if _is_nonfinite(v)]
        if bad:
            bad.sort(key=lambda k: c.keys.index(k) if k in c.keys else len(c.keys))
            step = rec.get("step")
            line = next((hit for hit in (_log_line(lines, k) for k in bad) if hit), None)
            where = f"step {step}" if kind == "step" else f"eval at step {step}"
            return SilentFailure(
                check="nonfinite",
                category=c.category,
                remedy=c.remedy,
                root_cause_line=line or f"{where}: {bad[0]} = {rec[bad[0]]} (metrics record)",
                step=step if isinstance(step, int) else None,
            )
    return None


def _is_nonfinite(v: Any) -> bool:
    if isinstance(v, float):
        return not math.isfinite(v)
    return isinstance(v, str) and v.strip().lower() in ("nan", "inf", "-inf", "+inf", "infinity", "-infinity")


_KEY_ALIASES = {"reward_mean": "reward", "grad_norm": "grad", "entropy_mean": "entropy"}


def _log_line(lines: list[str], key: str) -> str | None:
    """The first log line that shows ``key`` (or its short name) as NaN/inf, if the log has one."""
    names = [key, _KEY_ALIASES.get(key, key)]
    pattern = re.compile(rf"(?i)\b(?:{'|'.join(map(re.escape, names))})\w*['\"]?\s*[:= ]\s*['\"]?[-+]?(?:nan|inf)\b")
    return next((raw.rstrip() for raw in lines if pattern.search(raw)), None)


def _tail(steps: list[dict], key: str, n: int) -> list[float] | None:
    """``key`` on each of the last ``n`` steps, or None when any of them lacks it."""
    tail = steps[-n:]
    values = [float(v) for v in (r.get(key) for r in tail) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return values if len(tail) >= n and len(values) == len(tail) else None


def _collapse(steps, summary, evals, lines, planned, rules) -> SilentFailure | None:
    """Empty or one-token completions on each of the last steps: ``degenerate_rate`` where the
    backend gives it, an EOS-only mean length, else (no ``degenerate_rate``) near-zero entropy with
    every completion cut at the length limit."""
    c = rules.output_collapse
    n = min(c.last_steps, len(steps))
    if n == 0:
        return None
    first = steps[-n].get("step")
    where = f"on each of the last {n} steps (from step {first})"
    rate, length = _tail(steps, "degenerate_rate", n), _tail(steps, "response_length_mean", n)
    if rate and all(v >= c.degenerate_rate for v in rate):
        return _collapsed(c, f"degenerate_rate >= {c.degenerate_rate:g} {where}: {_fmt(rate)}", first)
    if length and all(v <= c.empty_length for v in length):
        return _collapsed(
            c, f"response_length_mean <= {c.empty_length:g} token (EOS only) {where}: {_fmt(length)}", first
        )
    entropy, cut = _tail(steps, "entropy_mean", n), _tail(steps, "truncated_rate", n)
    if (
        rate is None
        and entropy
        and cut
        and all(e <= c.entropy_max for e in entropy)
        and all(t >= c.truncated_min for t in cut)
    ):
        why = (
            f"entropy_mean <= {c.entropy_max:g} with every completion cut at the limit (truncated_rate "
            f">= {c.truncated_min:g}) {where}: one token repeated"
        )
        return _collapsed(c, why, first)
    return None


def _collapsed(c: CollapseRule, evidence: str, step: Any) -> SilentFailure:
    line = f"completions collapsed to empty or one repeated token: {evidence}"
    return SilentFailure(
        check="output_collapse",
        category=c.category,
        root_cause_line=line,
        remedy=c.remedy,
        step=step if isinstance(step, int) else None,
    )


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in values)


def _constant_reward(steps, summary, evals, lines, planned, rules) -> SilentFailure | None:
    c = rules.reward_constant
    rewards = [r.get("reward_mean") for r in steps]
    if len(rewards) < c.min_steps or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in rewards):
        return None
    for value in c.values:
        if all(abs(v - value) <= c.eps for v in rewards):
            line = (
                f"reward_mean was {value:g} on all {len(rewards)} steps from step {steps[0].get('step')}: "
                f"no group ever had a reward to learn from"
            )
            return SilentFailure(
                check="reward_constant",
                category=c.category,
                root_cause_line=line,
                remedy=c.remedy.format(value=value),
                step=steps[0].get("step"),
            )
    return None
