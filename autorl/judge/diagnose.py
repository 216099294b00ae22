"""Bottleneck diagnosis: from a run's metric streams to named symptoms and a bottleneck.

``diagnose(steps, evals, recipe_train)`` is a pure function over the rules table
in ``autorl/data/rules/diagnosis.yaml``. Each rule computes one statistic of one
metric series (``autorl.metrics.STEP_KEYS``, ``eval/<split>/greedy_pass@1`` or a
derived share of step time), compares it with a threshold, and a symptom fires
when its conditions hold. The bottleneck is the first row of the bottleneck
table (seed 000: unstable, weak validation, stable but low accuracy, slow or
idle) that names a fired symptom. Every fired symptom carries the values and
thresholds that triggered it, so the controller can log why it chose the next
hypothesis.

    diagnosis = diagnose(run.steps, run.evals, recipe.train)
    diagnosis.bottleneck, diagnosis.names()   # 'unstable', {'loss_grad_spikes', ...}
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autorl import loading
from autorl.data import shipped
from autorl.metrics import RunMetrics, absent_keys, iter_records

RULES_PATH = shipped("rules", "diagnosis.yaml")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- rules model


class Condition(_Model):
    """One test: statistic of a metric series, compared with a threshold."""

    metric: str = Field(description="A STEP_KEYS key, 'eval/<split>/greedy_pass@1', or a derived metric name.")
    stat: str = Field(description="Statistic over the window (a key of STATS).")
    op: Literal["lt", "le", "gt", "ge", "abs_lt", "abs_gt"] = Field(
        description="Comparison of the statistic with the threshold."
    )
    threshold: float = Field(description="Threshold (multiplied by train[scale_by] when scale_by is set).")
    scale_by: str | None = Field(
        None, description="Recipe train key the threshold is a multiple of, e.g. max_grad_norm."
    )
    window: Literal["all", "head", "tail"] = Field(
        "all", description="Which points: all, or the first/last tail_fraction."
    )
    smooth: int = Field(1, ge=1, description="Moving-average width applied before the statistic.")
    floor: float = Field(1e-8, gt=0, description="Smallest denominator for rel_change and spike.")
    min_step: float = Field(0.0, ge=0, description="trailing_drops counts only drops larger than this.")
    optional: bool = Field(False, description="A missing metric skips the condition instead of failing the symptom.")
    min_points: int | None = Field(
        None, ge=1, description="Points needed before judging (default: the table's min_points)."
    )


class SymptomRule(_Model):
    """A named symptom and the conditions that make it fire."""

    description: str = Field(description="One line: what the symptom means.")
    when_all: list[Condition] = Field(default_factory=list, description="All of these must hold.")
    when_any: list[Condition] = Field(default_factory=list, description="If given, at least one of these must hold.")
    look_at: list[str] = Field(
        default_factory=list,
        description="Where to look first when it fires (recipe keys or parts of the setup, with the usual direction).",
    )


class DerivedMetric(_Model):
    """A per-step ratio of STEP_KEYS values."""

    numerator: str = Field(description="Step key on top.")
    denominator: list[str] = Field(description="Step keys summed below.")
    description: str = Field(description="What the ratio means.")


class BottleneckRule(_Model):
    """A bottleneck class and the symptoms that point to it."""

    name: str = Field(description="Bottleneck name.")
    description: str = Field(description="What the bottleneck looks like (seed 000).")
    areas: list[str] = Field(description="Where to look for a fix.")
    when_any: list[str] = Field(default_factory=list, description="Symptoms that point here.")


class DiagnosisRules(_Model):
    """The whole rules table."""

    tail_fraction: float = Field(0.25, gt=0, le=0.5, description="Share of points in the head and tail windows.")
    min_points: int = Field(4, ge=1, description="Step points a condition needs.")
    min_eval_points: int = Field(2, ge=1, description="Eval points a condition needs.")
    derived: dict[str, DerivedMetric] = Field(default_factory=dict, description="Derived per-step metrics.")
    symptoms: dict[str, SymptomRule] = Field(description="Symptom name -> rule.")
    bottlenecks: list[BottleneckRule] = Field(description="Checked in order; first match wins.")
    default: BottleneckRule = Field(description="The bottleneck when none matches.")


# ---------------------------------------------------------------- result model


class Observation(_Model):
    """A condition that held, with the numbers."""

    metric: str = Field(description="Metric the statistic was computed on.")
    stat: str = Field(description="Statistic name.")
    window: str = Field(description="all, head or tail.")
    value: float = Field(description="The statistic's value.")
    op: str = Field(description="Comparison used.")
    threshold: float = Field(description="Effective threshold (after scale_by).")
    points: int = Field(description="Points the statistic was computed over.")

    def line(self) -> str:
        return f"{self.stat}({self.metric}, {self.window}) = {self.value:.4g} {self.op} {self.threshold:.4g}"


class Symptom(_Model):
    """A fired symptom."""

    name: str = Field(description="Symptom name from the rules table.")
    description: str = Field(description="What it means.")
    evidence: list[Observation] = Field(description="The conditions that held.")
    look_at: list[str] = Field(default_factory=list, description="Where to look first (the rule's ``look_at``).")


class Diagnosis(_Model):
    """What the run's metrics say is wrong."""

    bottleneck: str = Field(description="unstable | weak_validation | stable_low_accuracy | slow_or_idle | none.")
    areas: list[str] = Field(description="Where to look (seed 000).")
    symptoms: list[Symptom] = Field(default_factory=list, description="Fired symptoms, in rules-table order.")
    steps: int = Field(0, description="Step records seen.")
    evals: int = Field(0, description="Eval records seen.")
    unavailable: list[str] = Field(
        default_factory=list, description="Symptoms not judged: a metric they need is absent."
    )

    def names(self) -> set[str]:
        """Names of the fired symptoms."""
        return {s.name for s in self.symptoms}

    def summary(self) -> str:
        """One line for logs and commit messages."""
        names = ", ".join(s.name for s in self.symptoms) or "no symptoms"
        missing = f"; not available: {', '.join(self.unavailable)}" if self.unavailable else ""
        return f"bottleneck {self.bottleneck}: {names}{missing}"


# ---------------------------------------------------------------- statistics


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _split(xs: list[float], fraction: float) -> tuple[list[float], list[float]]:
    k = max(1, math.ceil(len(xs) * fraction))
    return xs[:k], xs[-k:]


def _delta(xs: list[float], c: Condition, fraction: float) -> float:
    head, tail = _split(xs, fraction)
    return _mean(tail) - _mean(head)


def _rel_change(xs: list[float], c: Condition, fraction: float) -> float:
    head, _ = _split(xs, fraction)
    return _delta(xs, c, fraction) / max(abs(_mean(head)), c.floor)


def _spike(xs: list[float], c: Condition, fraction: float) -> float:
    mags = [abs(x) for x in xs]
    median = statistics.median(mags)
    return max(mags) / median if median >= c.floor else 0.0  # no typical level, no spike


def _max_drop(xs: list[float], c: Condition, fraction: float) -> float:
    best, drop = -math.inf, 0.0
    for x in xs:
        best = max(best, x)
        drop = max(drop, best - x)
    return drop


def _trailing_drops(xs: list[float], c: Condition, fraction: float) -> float:
    n = 0
    for prev, cur in zip(reversed(xs[:-1]), reversed(xs[1:])):
        if prev - cur <= c.min_step:
            break
        n += 1
    return float(n)


def _frac_nonfinite(xs: list[float], c: Condition, fraction: float) -> float:
    return sum(not math.isfinite(x) for x in xs) / len(xs)


STATS: dict[str, Callable[[list[float], Condition, float], float]] = {
    "mean": lambda xs, c, f: _mean(xs),
    "max": lambda xs, c, f: max(xs),
    "min": lambda xs, c, f: min(xs),
    "last": lambda xs, c, f: xs[-1],
    "delta": _delta,
    "rel_change": _rel_change,
    "spike": _spike,
    "max_drop": _max_drop,
    "trailing_drops": _trailing_drops,
    "frac_nonfinite": _frac_nonfinite,
}
"""Statistic name -> function(series, condition, tail_fraction)."""

EDGE = 1e-9
"""Relative tolerance of a comparison with a threshold: a statistic within it of the threshold counts as equal to it,
so float arithmetic (0.55 - 0.5 = 0.050000000000000044) never decides a symptom against a 0.05 threshold."""


def _above(v: float, t: float) -> bool:
    return v - t > EDGE * abs(t)


def _below(v: float, t: float) -> bool:
    return t - v > EDGE * abs(t)


OPS: dict[str, Callable[[float, float], bool]] = {
    "lt": _below,
    "le": lambda v, t: v - t <= EDGE * abs(t),
    "gt": _above,
    "ge": lambda v, t: t - v <= EDGE * abs(t),
    "abs_lt": lambda v, t: _below(abs(v), t),
    "abs_gt": lambda v, t: _above(abs(v), t),
}

WINDOWED_STATS = {"mean", "max", "min", "last", "spike", "frac_nonfinite"}
"""Statistics that honour ``window``; the others compare head with tail themselves."""


# ---------------------------------------------------------------- loading


def load_rules(path: Path = RULES_PATH) -> DiagnosisRules:
    """The rules table, validated (cached per file version)."""
    return loading.load_table(path, DiagnosisRules, "diagnosis rules", "docs/hypotheses.md", _unknown_names)


def _unknown_names(rules: DiagnosisRules) -> str | None:
    """A symptom on a statistic that does not exist, or a bottleneck naming a symptom that does not."""
    for name, rule in rules.symptoms.items():
        for cond in rule.when_all + rule.when_any:
            if cond.stat not in STATS:
                return f"symptoms.{name}: unknown stat '{cond.stat}': use one of {sorted(STATS)}"
    for row in rules.bottlenecks:
        unknown = set(row.when_any) - set(rules.symptoms)
        if unknown:
            return f"bottleneck {row.name} names unknown symptoms {sorted(unknown)}"
    return None


def bottleneck_symptoms(name: str, rules: DiagnosisRules | None = None) -> set[str]:
    """The symptoms that point to bottleneck ``name`` (empty for the default)."""
    rules = rules or load_rules()
    return next((set(b.when_any) for b in rules.bottlenecks if b.name == name), set())


def symptom_names(rules: DiagnosisRules | None = None) -> list[str]:
    """Every symptom the diagnosis can emit, in table order."""
    return list((rules or load_rules()).symptoms)


def bottleneck_names(rules: DiagnosisRules | None = None) -> list[str]:
    """Every bottleneck the diagnosis can emit, the default last."""
    rules = rules or load_rules()
    return [b.name for b in rules.bottlenecks] + [rules.default.name]


# ---------------------------------------------------------------- evaluation


def _value(rec: dict[str, Any], key: str) -> float | None:
    v = rec.get(key)
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v.strip().lower() in ("nan", "inf", "-inf", "+inf"):
        return float(v)
    return None


def _derived(rec: dict[str, Any], d: DerivedMetric) -> float | None:
    parts = [_value(rec, k) for k in d.denominator]
    below = [p for p in parts if p is not None]
    top = _value(rec, d.numerator)
    if top is None or len(below) < len(parts) or sum(below) <= 0:
        return None
    return top / sum(below)


def series(metric: str, steps: list[dict], evals: list[dict], rules: DiagnosisRules) -> list[float]:
    """Values of ``metric`` in record order (step, eval or derived)."""
    if metric in rules.derived:
        vals = [_derived(r, rules.derived[metric]) for r in steps]
    else:
        vals = [_value(r, metric) for r in (evals if metric.startswith("eval/") else steps)]
    return [v for v in vals if v is not None]


def _smooth(xs: list[float], width: int) -> list[float]:
    """Moving averages of ``width`` points; none when the series is shorter (its threshold was set for the
    average: the raw points are noisier, so a short run cannot be judged by it)."""
    if width <= 1:
        return xs
    if len(xs) < width:
        return []
    return [_mean(xs[i - width + 1 : i + 1]) for i in range(width - 1, len(xs))]


def _prepare(xs: list[float], cond: Condition, fraction: float) -> list[float]:
    if cond.stat != "frac_nonfinite":
        xs = [x for x in xs if math.isfinite(x)]
    xs = _smooth(xs, cond.smooth)
    if cond.stat in WINDOWED_STATS and cond.window != "all" and xs:
        head, tail = _split(xs, fraction)
        xs = head if cond.window == "head" else tail
    return xs


def _threshold(cond: Condition, train: dict[str, Any]) -> float | None:
    if cond.scale_by is None:
        return cond.threshold
    base = train.get(cond.scale_by)
    return cond.threshold * float(base) if isinstance(base, (int, float)) else None


def evaluate(
    cond: Condition, steps: list[dict], evals: list[dict], train: dict, rules: DiagnosisRules
) -> Observation | Literal[False] | None:
    """Observation if the condition holds, False if it does not, None if it cannot be judged."""
    raw = series(cond.metric, steps, evals, rules)
    need = cond.min_points or (rules.min_eval_points if cond.metric.startswith("eval/") else rules.min_points)
    xs = _prepare(raw, cond, rules.tail_fraction)
    threshold = _threshold(cond, train)
    if len(raw) < need or not xs or threshold is None:
        return None
    value = STATS[cond.stat](xs, cond, rules.tail_fraction)
    if not OPS[cond.op](value, threshold):
        return False
    return Observation(
        metric=cond.metric,
        stat=cond.stat,
        window=cond.window,
        value=value,
        op=cond.op,
        threshold=threshold,
        points=len(xs),
    )


def _fire(
    rule: SymptomRule, steps: list[dict], evals: list[dict], train: dict, rules: DiagnosisRules
) -> list[Observation] | None:
    evidence: list[Observation] = []
    for cond in rule.when_all:
        got = evaluate(cond, steps, evals, train, rules)
        if got is False or (got is None and not cond.optional):
            return None
        if got is not None:
            evidence.append(got)
    if rule.when_any:
        hits = [
            e for e in (evaluate(c, steps, evals, train, rules) for c in rule.when_any) if isinstance(e, Observation)
        ]
        if not hits:
            return None
        evidence += hits
    return evidence or None


def diagnose(
    steps: list[dict], evals: list[dict], recipe_train: dict, rules: DiagnosisRules | None = None
) -> Diagnosis:
    """Symptoms and bottleneck of one run from its step and eval records."""
    rules = rules or load_rules()
    fired = []
    for name, rule in rules.symptoms.items():
        evidence = _fire(rule, steps, evals, recipe_train, rules)
        if evidence:
            fired.append(Symptom(name=name, description=rule.description, evidence=evidence, look_at=rule.look_at))
    names = {s.name for s in fired}
    row = next((b for b in rules.bottlenecks if names & set(b.when_any)), rules.default)
    return Diagnosis(
        bottleneck=row.name,
        areas=list(row.areas),
        symptoms=fired,
        steps=len(steps),
        evals=len(evals),
        unavailable=not_judged(steps, rules),
    )


def cond_keys(cond: Condition, rules: DiagnosisRules) -> set[str]:
    """The step keys one condition reads (a derived metric's inputs)."""
    d = rules.derived.get(cond.metric)
    return {d.numerator, *d.denominator} if d else {cond.metric}


def not_judged(steps: list[dict], rules: DiagnosisRules) -> list[str]:
    """'symptom (keys)' for each symptom that needs a key the run's backend declares absent.

    A symptom needs every key of its required ``when_all`` conditions, and at least one ``when_any`` condition
    whose keys are all present.
    """
    gone = absent_keys(steps)
    out = []
    for name, rule in rules.symptoms.items():
        required = [cond_keys(c, rules) & gone for c in rule.when_all if not c.optional]
        options = [cond_keys(c, rules) & gone for c in rule.when_any]
        missing = set().union(*required) | (set().union(*options) if options and all(options) else set())
        if missing:
            out.append(f"{name} ({', '.join(sorted(missing))})")
    return out


def diagnose_run(metrics_path: str | Path, recipe_train: dict) -> Diagnosis:
    """``diagnose`` on a run's metrics.jsonl file."""
    run = RunMetrics(iter_records(metrics_path))
    return diagnose(run.steps, run.evals, recipe_train)
