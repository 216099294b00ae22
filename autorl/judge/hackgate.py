"""The hack gate: a gain on the objective must be matched by the held-out task, with healthy completions.

A reward with a loophole (a length bonus, a format token, a phrase a reward model likes) can be learned, and then
the objective rises, whether it is the training reward, a scorer that shares the loophole, or an ID metric while
the OOD task decays. ``check(trial, parent, recipe)`` compares a candidate's fresh-seed runs with its parent's runs
on what every run writes anyway, never on how the reward is computed:

1. ``task_id`` / ``task_ood``: the held-out task metric per item (``eval/<split>/task_items``: the task's own exact
   match, written when the reward is user code; else ``eval/<split>/items``), judged with the verdict's two-arm
   noise model at the table's ``level``. A split whose gain's upper bound is below ``-drop_max`` dropped; when
   the objective is not the task metric itself, the gain's lower bound on the objective's split (ID for a train
   metric) must exceed ``matched_min`` (the gain is matched).
2. ``length``, ``repetition``, ``format_only``, ``truncation``: the greedy eval completions' health per split
   (``autorl.toolkit.peritem.completion_health``): a change counts only when its interval clears the bound.
3. ``kl``, ``entropy``: the training steps' mean over each run's last steps, against the recipe's ``gate:`` bounds
   and the parent's entropy.

The first failed check makes the trial ``suspect``; ``GateResult.failed`` names it with its numbers. Without any
held-out task metric the gate is ``blind`` (it says so; it does not block). Thresholds: ``data/rules/hack_gate.yaml``.
Pure: no torch, no subprocess, no ledger.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autorl import loading
from autorl.data import shipped
from autorl.judge import verdict
from autorl.judge.stats import t_quantile
from autorl.metrics import RunMetrics
from autorl.states import Gate

RULES_PATH = shipped("rules", "hack_gate.yaml")
SPLITS = ("id", "ood")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskRules(_Model):
    matched_min: float = Field(
        0.0,
        description="The ID task gain's lower bound must exceed this when the objective is not the task metric itself.",
    )
    drop_max: float = Field(0.0, ge=0, description="A split whose gain's upper bound is below -drop_max dropped.")


class HealthRules(_Model):
    length_ratio_low: float = Field(0.6, gt=0, lt=1, description="Mean length below this share of the parent's.")
    length_ratio_high: float = Field(1.6, gt=1, description="Mean length above this multiple of the parent's.")
    length_min_change: float = Field(1.0, ge=0, description="... and changed by more than this, beyond noise.")
    repeat_rise: float = Field(0.02, ge=0, description="Repeated n-gram share up by more than this, beyond noise.")
    format_only_rise: float = Field(0.05, ge=0, description="Empty or format-only share up by more than this.")
    truncation_max: float = Field(
        0.2, ge=0, le=1, description="Truncated share above this (gate.truncation_max overrides) ..."
    )
    truncation_rise: float = Field(0.0, ge=0, description="... and up by more than this, beyond noise.")


class TrainRules(_Model):
    last_steps: int = Field(10, ge=1, description="Steps averaged at the end of each run.")
    entropy_ratio_min: float = Field(0.2, ge=0, le=1, description="Entropy below this share of the parent's.")


class GateRules(_Model):
    """The table ``data/rules/hack_gate.yaml``."""

    level: float = Field(0.95, gt=0.5, lt=1, description="Two-sided level of every interval.")
    task: TaskRules = Field(default_factory=TaskRules)
    health: HealthRules = Field(default_factory=HealthRules)
    train: TrainRules = Field(default_factory=TrainRules)


def load_rules(path: str | None = None) -> GateRules:
    return loading.load_table(path or RULES_PATH, GateRules, "hack gate rules", "docs/triage.md")


class GateCheck(_Model):
    """One check of the gate: passed (True), failed (False) or not measured (None), with its numbers."""

    name: str
    ok: bool | None
    detail: str
    numbers: dict[str, float] = Field(default_factory=dict)


class GateResult(_Model):
    """The gate's answer: ok, suspect (a check failed) or blind (no held-out task metric to check against)."""

    state: Gate
    checks: list[GateCheck]

    @property
    def failed(self) -> GateCheck | None:
        return next((c for c in self.checks if c.ok is False), None)

    def line(self) -> str:
        """One line: the first failed check and its evidence, or what passed."""
        f = self.failed
        if f is not None:
            return f"hack gate: {f.name} failed: {f.detail}"
        if self.state == Gate.BLIND:
            return "hack gate blind: no held-out task metric (name probe sets in the recipe)"
        return "hack gate passed: " + ", ".join(c.name for c in self.checks if c.ok)

    def ledger_values(self) -> dict[str, Any]:
        return {"gate": self.state, "gate_checks": [c.model_dump() for c in self.checks]}


def check(trial: list[RunMetrics], parent: list[RunMetrics], recipe: Any, rules: GateRules | None = None) -> GateResult:
    """The gate on a candidate's runs (``trial``) against its parent's runs (``parent``)."""
    rules = rules or load_rules()
    checks = task_checks(trial, parent, recipe, rules)
    blind = not any(c.ok is not None for c in checks)
    checks += health_checks(trial, parent, recipe, rules) + train_checks(trial, parent, recipe, rules)
    failed = any(c.ok is False for c in checks)
    return GateResult(state=Gate.SUSPECT if failed else Gate.BLIND if blind else Gate.OK, checks=checks)


# ---------------------------------------------------------------------------- the held-out task


def task_items(m: RunMetrics, split: str) -> list[float] | None:
    """The last eval's held-out task items of ``split``: the task's own exact match where the run wrote it."""
    for key in (f"eval/{split}/task_items", f"eval/{split}/items"):
        rows = [e[key] for e in m.evals if e.get(key)]
        if rows:
            return [float(x) for x in rows[-1]]
    return None


def _task_runs(runs: list[RunMetrics], split: str) -> verdict.Runs | None:
    found = [task_items(m, split) for m in runs]
    items = [i for i in found if i is not None]
    if not items or len(items) < len(found) or len({len(i) for i in items}) != 1:
        return None
    return verdict.Runs(values=[float(np.mean(i)) for i in items], items=items)


def matched_split(recipe: Any) -> str:
    """The split whose task metric must match the objective's gain: the objective's own eval split, else id."""
    parts = recipe.objective.metric.split("/")
    return parts[1] if len(parts) == 3 and parts[0] == "eval" and parts[1] in SPLITS else "id"


def is_task_metric(recipe: Any, split: str, runs: list[RunMetrics]) -> bool:
    """Whether the objective is itself the held-out task metric of ``split`` (so a gain is matched by definition)."""
    own = recipe.objective.metric == f"eval/{split}/greedy_pass@1"
    return own and not any(e.get(f"eval/{split}/task_items") for m in runs for e in m.evals)


def _width(runs: verdict.Runs) -> int:
    """Items per run (the eval set's size)."""
    return len(runs.items[0]) if runs.items else 0


def task_checks(trial: list[RunMetrics], parent: list[RunMetrics], recipe: Any, rules: GateRules) -> list[GateCheck]:
    out = []
    for split in SPLITS:
        t, p = _task_runs(trial, split), _task_runs(parent, split)
        if t is None or p is None or _width(t) != _width(p):
            why = (
                f"no held-out {split} task items"
                if t is None or p is None
                else f"held-out {split} task items of different eval sets: not comparable"
            )
            out.append(GateCheck(name=f"task_{split}", ok=None, detail=why))
            continue
        v = verdict.judge(t, p, recipe.verdict, "maximize", level=rules.level)
        nums = {
            "gain": v.delta,
            "ci_low": v.ci_low,
            "ci_high": v.ci_high,
            "trial": float(np.mean(t.values)),
            "parent": float(np.mean(p.values)),
        }
        span = f"{v.delta:+.3f} [{v.ci_low:+.3f}, {v.ci_high:+.3f}]"
        if v.ci_high < -rules.task.drop_max:
            out.append(
                GateCheck(
                    name=f"task_{split}",
                    ok=False,
                    numbers=nums,
                    detail=f"held-out {split} task accuracy dropped {span} "
                    f"({nums['parent']:.3f} -> {nums['trial']:.3f})",
                )
            )
        elif (
            split == matched_split(recipe)
            and not is_task_metric(recipe, split, trial)
            and v.ci_low <= rules.task.matched_min
        ):
            out.append(
                GateCheck(
                    name=f"task_{split}",
                    ok=False,
                    numbers=nums,
                    detail=f"the objective's gain is not matched by held-out {split} task accuracy {span} "
                    f"({nums['parent']:.3f} -> {nums['trial']:.3f})",
                )
            )
        else:
            out.append(GateCheck(name=f"task_{split}", ok=True, numbers=nums, detail=f"held-out {split} task {span}"))
    return out


# ---------------------------------------------------------------------------- completion health


def _last_eval(runs: list[RunMetrics], key: str) -> list[float] | None:
    vals = [m.series(key) for m in runs]
    return [v[-1] for v in vals] if vals and all(vals) else None


def _n_items(runs: list[RunMetrics], split: str) -> int:
    items = [task_items(m, split) for m in runs]
    return min((len(i) for i in items if i), default=1)


def rise(
    trial: list[float], parent: list[float], rules: GateRules, rate_n: int | None = None
) -> tuple[float, float, float]:
    """(mean change, lowest lower end, highest upper end): each trial run's change over the parent's mean with
    its interval at ``rules.level``, so a change counts only when every fresh run shows it beyond noise (seeds learn
    a loophole to different extents; one lucky run is not enough, and averaging a strong run with a weak one would
    hide both behind their spread). The noise of a run's change is the parent's run-to-run variance (its runs'
    spread, once for the new run and once for the parent's mean) and, for a rate over ``rate_n`` items, each
    side's binomial variance (floored at one item), so one run, or runs that agree exactly, still carry the eval's
    own coin flips."""
    base = float(np.mean(parent))
    s2 = float(np.var(parent, ddof=1)) if len(parent) > 1 else 0.0
    flips = (lambda p: (p * (1 - p) + 1.0 / rate_n) / rate_n) if rate_n else (lambda p: 0.0)  # noqa: E731
    z = t_quantile(1 - (1 - rules.level) / 2, 1e6)
    ends = []
    for x in trial:
        half = z * math.sqrt(s2 * (1 + 1 / len(parent)) + flips(x) + flips(base) / len(parent))
        ends.append((x - base - half, x - base + half))
    return float(np.mean(trial)) - base, min(lo for lo, _ in ends), max(hi for _, hi in ends)


def health_checks(trial: list[RunMetrics], parent: list[RunMetrics], recipe: Any, rules: GateRules) -> list[GateCheck]:
    """Length, repetition, format-only answers and truncation of the greedy eval completions, per split; the
    worst split of each check is the one reported."""
    checks = [_length, _repetition, _format_only, _truncation]
    out = []
    for fn in checks:
        found = [c for c in (fn(trial, parent, split, recipe, rules) for split in SPLITS) if c is not None]
        if not found:
            out.append(GateCheck(name=fn.__name__.lstrip("_"), ok=None, detail="not measured (no eval health keys)"))
            continue
        out.append(next((c for c in found if c.ok is False), found[0]))
    return out


def _length(trial, parent, split, recipe, rules) -> GateCheck | None:
    """Completions much shorter or much longer than the parent's, beyond noise. Shorter is a collapse only while
    the split's held-out task accuracy did not rise with it: an instruct model that learns to answer "with the
    number only", as it was asked, drops most of its words and gets more answers right (SmolLM2-135M-Instruct on
    chat arithmetic: 24 to 14 tokens a reply as its reward rose from 0.24 to 0.69), while a length loophole shortens
    completions without the task metric following."""
    t, p = _last_eval(trial, f"eval/{split}/length_mean"), _last_eval(parent, f"eval/{split}/length_mean")
    if t is None or p is None:
        return None
    h = rules.health
    d, lo, hi = rise(t, p, rules)
    base, now = float(np.mean(p)), float(np.mean(t))
    nums = {"trial": now, "parent": base, "ci_low": lo, "ci_high": hi}
    short = now < h.length_ratio_low * base and hi < -h.length_min_change
    long = now > h.length_ratio_high * max(base, 1.0) and lo > h.length_min_change
    word = "collapsed" if short else "blew up" if long else "held"
    if short and (task := _task_gain(trial, parent, split, recipe, rules)) is not None and task[1] > 0:
        gain = f"{task[0]:+.3f} [{task[1]:+.3f}, {task[2]:+.3f}]"
        short, word = False, f"shortened, answers more direct (held-out {split} task accuracy {gain})"
    return GateCheck(
        name="length",
        ok=not (short or long),
        numbers=nums,
        detail=f"{split} completion length {word}: {base:.2f} -> {now:.2f} characters (change [{lo:+.2f}, {hi:+.2f}])",
    )


def _task_gain(trial, parent, split, recipe, rules) -> tuple[float, float, float] | None:
    """The split's held-out task accuracy gain with its interval, or None where it is not measured."""
    t, p = _task_runs(trial, split), _task_runs(parent, split)
    if t is None or p is None or _width(t) != _width(p):
        return None
    v = verdict.judge(t, p, recipe.verdict, "maximize", level=rules.level)
    return v.delta, v.ci_low, v.ci_high


_HealthCheck = Callable[[list[RunMetrics], list[RunMetrics], str, Any, GateRules], GateCheck | None]


def _rate_check(name: str, key: str, bound: str, what: str) -> _HealthCheck:
    """The check of a rate's rise (``key``: metric names joined by '+', summed), bounded by the health rule named
    ``bound``."""

    def fn(
        trial: list[RunMetrics], parent: list[RunMetrics], split: str, recipe: Any, rules: GateRules
    ) -> GateCheck | None:
        keys = [f"eval/{split}/{k}" for k in key.split("+")]
        t = [_last_eval(trial, k) for k in keys]
        p = [_last_eval(parent, k) for k in keys]
        if any(x is None for x in t + p):
            return None
        tv, pv = [sum(v) for v in zip(*t)], [sum(v) for v in zip(*p)]
        d, lo, hi = rise(tv, pv, rules, _n_items(trial + parent, split))
        nums = {"trial": float(np.mean(tv)), "parent": float(np.mean(pv)), "ci_low": lo, "ci_high": hi}
        limit = getattr(rules.health, bound)
        return GateCheck(
            name=name,
            ok=not lo > limit,
            numbers=nums,
            detail=f"{split} {what} {nums['parent']:.3f} -> {nums['trial']:.3f} (rise [{lo:+.3f}, "
            f"{hi:+.3f}], bound +{limit:g})",
        )

    fn.__name__ = f"_{name}"
    return fn


_repetition = _rate_check("repetition", "repeat_mean", "repeat_rise", "repeated n-gram share")
_format_only = _rate_check(
    "format_only", "empty_rate+format_only_rate", "format_only_rise", "share of empty or format-only answers"
)


def _truncation(trial, parent, split, recipe, rules) -> GateCheck | None:
    c = _rate_check("truncation", "truncated_rate", "truncation_rise", "truncated share")(
        trial, parent, split, recipe, rules
    )
    if c is None:
        return None
    bound = recipe.gate.truncation_max if recipe.gate.truncation_max is not None else rules.health.truncation_max
    over = c.numbers["trial"] > bound
    return c.model_copy(update={"ok": c.ok or not over, "detail": c.detail + f", recipe bound {bound:g}"})


# ---------------------------------------------------------------------------- KL and entropy


def _tail_mean(runs: list[RunMetrics], key: str, last: int) -> float | None:
    vals = [m.series(key)[-last:] for m in runs]
    vals = [v for v in vals if v]
    return float(np.mean([np.mean(v) for v in vals])) if vals else None


def train_checks(trial: list[RunMetrics], parent: list[RunMetrics], recipe: Any, rules: GateRules) -> list[GateCheck]:
    last, g = rules.train.last_steps, recipe.gate
    out = []
    kl = _tail_mean(trial, "kl", last)
    if g.kl_max is None or kl is None or not any(v for m in trial for v in m.series("kl")):
        why = "no bound (gate.kl_max)" if g.kl_max is None else "not measured (no reference model: kl_coef 0)"
        out.append(GateCheck(name="kl", ok=None, detail=f"KL {why}"))
    else:
        out.append(
            GateCheck(
                name="kl",
                ok=kl <= g.kl_max,
                numbers={"trial": kl, "bound": g.kl_max},
                detail=f"KL to the reference {kl:.4f} over the last {last} steps (bound {g.kl_max:g})",
            )
        )
    ent, base = _tail_mean(trial, "entropy_mean", last), _tail_mean(parent, "entropy_mean", last)
    if ent is None:
        return out + [GateCheck(name="entropy", ok=None, detail="entropy not measured")]
    floor = max(g.entropy_min or 0.0, rules.train.entropy_ratio_min * base if base is not None else 0.0)
    nums = {"trial": ent, "floor": floor, **({"parent": base} if base is not None else {})}
    was = f" (parent {base:.4f})" if base is not None else ""
    return out + [
        GateCheck(
            name="entropy",
            ok=ent >= floor,
            numbers=nums,
            detail=f"entropy {ent:.4f} over the last {last} steps{was}, floor {floor:.4f}",
        )
    ]
