"""Direction-aware moves: step a knob several times the way the diagnosis points, and exploit what worked.

The rules are data (``autorl/data/rules/moves.yaml``, documented there). This module holds the pure parts:
loading the table, stepping one value inside the recipe's limits, reading the current chain of move trials
from the ledger rows, choosing the next move, and the re-centred space a validated hypothesis is exploited in.
``autorl.search.hypotheses_strategy`` calls them before it ranks the hypothesis library.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard

from pydantic import BaseModel, ConfigDict, Field

from autorl import loading
from autorl.data import shipped
from autorl.ledger import Trial
from autorl.recipe import SearchParam
from autorl.search.hypotheses import HypothesisParam
from autorl.states import Proposer, TrialStatus, Verdict

PROPOSER = Proposer.MOVE
"""The ledger's ``proposer`` for a move trial (its ``hypothesis`` column names the idea it tests)."""

BROKEN = (Verdict.REGRESSED, Verdict.CRASH, Verdict.PRUNED)
"""Verdicts that say a step overshot: the next step starts from the last good point of the chain."""

HALF = 0.5
"""Power of the factor for the bisecting step, when the full step would repeat a tried configuration."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Move(_Model):
    """One row: when ``symptom`` fires, step ``key`` by ``factor``."""

    symptom: str = Field(description="Diagnosis symptom that points the way.")
    key: str = Field(description="Train key to step.")
    factor: float = Field(gt=0, description="Multiplier per step (below 1 steps down).")
    max_steps: int = Field(ge=1, description="Steps of this row in one chain.")
    hypothesis: str = Field(description="Library hypothesis the step tests.")


class Exploit(_Model):
    """How a validated hypothesis is exploited around the incumbent."""

    ratio: float = Field(gt=1, description="Relative ranges become incumbent x [1/ratio, ratio].")


class Gallop(_Model):
    """How far the next step goes after a step that did nothing measurable."""

    share: float = Field(
        gt=0,
        lt=1,
        description="'Nothing measurable': |gain| below this share of the interval's half-width, verdict flat.",
    )
    power: float = Field(gt=1, description="The next step's factor is the row's factor to this power.")


class MoveTable(_Model):
    """The whole rules file."""

    moves: list[Move]
    exploit: Exploit
    gallop: Gallop


def load_table(path: str | Path | None = None) -> MoveTable:
    """The moves table (default: the shipped one), validated (``autorl.loading``)."""
    return loading.load_table(path or shipped("rules", "moves.yaml"), MoveTable, "move rules", "docs/hypotheses.md")


# ---------------------------------------------------------------- one step


def step(value: Any, factor: float, limit: SearchParam | None) -> Any:
    """``value`` x ``factor`` inside ``limit``, or None when it cannot move that way (0, a bound, no choice)."""
    if not _number(value) or value == 0 or factor == 1:
        return None
    target = value * factor
    if limit is not None and limit.choices is not None:
        return _snap(value, target, limit.choices)
    if isinstance(value, int):
        target = round(target) if round(target) != value else value + (1 if factor > 1 else -1)
    else:
        target = written(target)
    if limit is not None and limit.low is not None and limit.high is not None:
        target = min(max(target, limit.low), limit.high)
    return None if target == value or target <= 0 else target


DIGITS = 3
"""Significant digits of a stepped float: the value is committed as a person writes it (5e-07 x 10 x 10 is 5e-05,
not 4.9999999999999996e-05; a bisecting step gives 1.58e-05, not 1.5811388300841898e-05)."""


def written(x: float) -> float:
    """``x`` to ``DIGITS`` significant digits."""
    return float(f"{x:.{DIGITS}g}")


def _snap(value: float, target: float, choices: list) -> Any:
    """The choice nearest ``target`` (in log space) among those strictly on the move's side of ``value``."""
    side = [c for c in choices if _number(c) and (c - value) * (target - value) > 0]
    if not side:
        return None
    return min(side, key=lambda c: abs(math.log(max(c, 1e-12)) - math.log(target)))


def _number(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# ---------------------------------------------------------------- the chain


def chain(trials: list[Trial], since: int | None = None) -> list[Trial]:
    """The finished move trials numbered ``since`` (the incumbent) or later, oldest first: the steps taken from
    the current incumbent. Trials of other proposers in between (a ranked hypothesis, confirmation runs) do not
    end it; a new incumbent starts a new chain."""
    return [
        t
        for t in trials
        if t.proposer == PROPOSER and t.status != TrialStatus.RUNNING and (since is None or (t.number or 0) >= since)
    ]


def chain_start(links: list[Trial]) -> Trial | None:
    """The last trial of the chain that did not overshoot (None: start at the incumbent)."""
    return next((t for t in reversed(links) if t.verdict not in BROKEN and t.status == TrialStatus.COMPLETE), None)


def steps_taken(links: list[Trial], start: dict[str, Any]) -> dict[str, int]:
    """Per key, how many trials of the chain moved it (each against the point before it)."""
    taken: dict[str, int] = {}
    before = start
    for t in links:
        params = t.params or {}
        for key in params:
            if params.get(key) != before.get(key):
                taken[key] = taken.get(key, 0) + 1
        if t.verdict not in BROKEN:
            before = params
    return taken


# ---------------------------------------------------------------- the next move


def applicable(
    table: MoveTable, fired: set[str], core: set[str], library: set[str], taken: dict[str, int]
) -> list[Move]:
    """Rows whose symptom fired and points to the diagnosed bottleneck (``core``), one per key (table order),
    whose hypothesis is in the library and whose steps are not used up."""
    rows, keys = [], set()
    for m in table.moves:
        if m.symptom in fired and m.symptom in core and m.hypothesis in library and m.key not in keys:
            keys.add(m.key)
            if taken.get(m.key, 0) < m.max_steps:
                rows.append(m)
    return rows


def momentum(
    table: MoveTable, links: list[Trial], start: dict[str, Any], library: set[str], taken: dict[str, int]
) -> list[Move]:
    """Rows the chain's last good step applied, when that step helped (improved, or flat with a positive
    gain): keep going that way even though its own diagnosis no longer names the symptom (a +0.03 at lr x10
    ends "flat learning" but is not the best lr yet)."""
    last = chain_start(links)
    if last is None or last.verdict not in (Verdict.IMPROVED, Verdict.FLAT) or (last.delta or 0) <= 0:
        return []
    before = _point_before(links, last, start)
    after = last.params or {}
    return [
        m
        for m in table.moves
        if m.hypothesis in library
        and taken.get(m.key, 0) < m.max_steps
        and _moved_along(before.get(m.key), after.get(m.key), m.factor)
    ]


def _point_before(links: list[Trial], last: Trial, start: dict[str, Any]) -> dict[str, Any]:
    earlier = [t for t in links if (t.number or 0) < (last.number or 0) and t.verdict not in BROKEN]
    return (earlier[-1].params or {}) if earlier else start


def _moved_along(old: Any, new: Any, factor: float) -> bool:
    return _number(old) and _number(new) and old != new and (new - old) * (factor - 1) > 0


def no_effect(link: Trial | None, gallop: Gallop) -> bool:
    """The chain's last step was flat with a gain far inside its interval: it changed nothing measurable."""
    if link is None or link.verdict != Verdict.FLAT:
        return False
    delta, low, high = link.delta, link.ci_low, link.ci_high
    if not (_number(delta) and _number(low) and _number(high)):
        return False
    return abs(delta) < gallop.share * (high - low) / 2


def next_move(
    rows: list[Move],
    point: dict[str, Any],
    limits: dict[str, SearchParam],
    tried: Callable[[dict[str, Any]], bool],
    first: float = 1.0,
) -> tuple[dict[str, Any], list[Move]] | None:
    """The values to set (every applicable row stepped from ``point``) and the rows applied. The step is the
    factor to the power ``first`` (above 1 after a step that did nothing: a galloping step), then the plain
    factor; a full step that was tried already is halved once (a bisection towards the overshoot); None when
    none is new."""
    for power in dict.fromkeys((first, 1.0, HALF)):
        values, applied = {}, []
        for m in rows:
            v = step(point.get(m.key), m.factor**power, limits.get(m.key))
            if v is not None:
                values[m.key] = v
                applied.append(m)
        if values and not tried({**point, **values}):
            return values, applied
    return None


def describe(applied: list[Move], point: dict[str, Any], values: dict[str, Any]) -> str:
    """``flat_learning: lr 1e-07 -> 1e-06 (h13-flat-learning)``, one per applied row."""
    return "; ".join(
        f"{m.symptom}: {m.key} {point.get(m.key):.3g} -> {values[m.key]:.3g} ({m.hypothesis})" for m in applied
    )


# ---------------------------------------------------------------- exploitation


def recentre(search: dict[str, HypothesisParam], incumbent: dict[str, Any], ratio: float) -> dict[str, HypothesisParam]:
    """A hypothesis' search spec with each relative range re-centred on the incumbent: x [1/ratio, ratio].

    Keys whose incumbent value is 0 or not a number keep their own range (there is nothing to centre on).
    """
    out = {}
    for key, spec in search.items():
        value = incumbent.get(key)
        if spec.scale is not None and _number(value) and value > 0:
            spec = spec.model_copy(update={"scale": (1.0 / ratio, ratio)})
        out[key] = spec
    return out
