"""Where the search does not go back: regions its pruner or triage closed, and hypotheses that stopped paying.

Two rules, their thresholds in ``autorl/data/rules/revisit.yaml`` (docs/hypotheses.md, "Where the search does not
go back"):

- **Closed regions** (``Closures``). Optuna's studies do not carry the lesson across them: a hypothesis gets a
  fresh study whenever the incumbent moves, and its random start-up trials fall again where thirty trials were
  pruned. So the lesson is read from the ledger, which every study shares. A side of one numeric key is closed
  when at least ``closed.trials`` trials lay beyond every trial that held up against the confirmed incumbent on
  that key, differed from the runs that ended well only there, and every one of them was pruned, regressed or
  crashed on its values. ``StudyView.ask`` does not run a proposal inside one unless every ask fell in one, and
  then says so.
- **Rested hypotheses** (``rested``). A hypothesis whose last ``rest.after`` finished trials since the confirmed
  incumbent gained nothing is rested until a new incumbent is confirmed: the one that paid twice does not take the
  rest of the night.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from pydantic import BaseModel, ConfigDict, Field

from autorl import loading
from autorl.data import shipped
from autorl.judge import triage
from autorl.ledger import Trial
from autorl.recipe import SearchParam
from autorl.states import Confirmation, Kind, Proposer, TrialStatus, Verdict


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClosedRule(_Model):
    """When a side of a key is closed."""

    trials: int = Field(
        ge=1,
        description="Trials beyond every one that held up against the incumbent, each pruned, regressed or crashed "
        "on its values, that close the side they lie on.",
    )


class RestRule(_Model):
    """When a hypothesis is rested."""

    after: int = Field(ge=1, description="Finished trials since the confirmed incumbent with no gain.")


class RevisitTable(_Model):
    """The whole rules file."""

    closed: ClosedRule
    rest: RestRule


def load_table(path: str | Path | None = None) -> RevisitTable:
    """The revisit rules (default: the shipped table), validated (``autorl.loading``)."""
    return loading.load_table(
        path or shipped("rules", "revisit.yaml"), RevisitTable, "revisit rules", "docs/hypotheses.md"
    )


# ---------------------------------------------------------------- closed regions

IGNORED = ("seed",)
"""Numeric keys that never make a region: a run's seed is noise."""

CLOSING = (Verdict.PRUNED, Verdict.REGRESSED)
"""Verdicts that say a trial was clearly worse than its reference (the pruner's, or the verdict's own test)."""


@dataclass(frozen=True)
class Region:
    """``key`` at or beyond ``bound`` on one ``side`` (``>=`` or ``<=``), closed by the trials ``evidence``."""

    key: str
    side: str
    bound: float
    evidence: tuple[str, ...]
    held: str

    def holds(self, value: Any) -> bool:
        """Whether ``value`` lies inside the region."""
        if not _number(value):
            return False
        return value >= self.bound if self.side == ">=" else value <= self.bound

    def describe(self) -> str:
        return f"{self.key} {self.side} {self.bound:.3g}"

    def why(self) -> str:
        """One clause: what closed it."""
        shown = ", ".join(self.evidence[:4]) + (f" and {len(self.evidence) - 4} more" if len(self.evidence) > 4 else "")
        return (
            f"{self.describe()} is closed: {len(self.evidence)} trials there ({shown}) were pruned, regressed or "
            f"crashed on their values, beyond every trial that held up against {self.held}"
        )


class Closures:
    """The closed regions of one study's trials (``base``: the train values a trial without a parent modified),
    computed once per context (the non-numeric train values; ``contexts`` keeps each trial's by row id across
    instances: a trial's train values never change)."""

    def __init__(
        self,
        trials: list[Trial],
        incumbent: Trial | None,
        need: int,
        base: dict[str, Any],
        contexts: dict[int, str] | None = None,
    ):
        self.trials = [t for t in trials if t.kind == Kind.TRIAL and t.params]
        self.incumbent, self.need = incumbent, need
        self._contexts = {} if contexts is None else contexts
        self.parents: dict[int | None, dict[str, Any]] = {t.number: t.params or {} for t in self.trials}
        self.parents[None] = base
        self._regions: dict[str, list[Region]] = {}

    def regions(self, point: dict[str, Any]) -> list[Region]:
        """The closed regions among trials that ran with ``point``'s words (every non-numeric value equal)."""
        ctx = context(point)
        if ctx not in self._regions:
            mine = [t for t in self.trials if self._context(t) == ctx]
            self._regions[ctx] = closed_regions(mine, self.incumbent, self.need, self.parents)
        return self._regions[ctx]

    def _context(self, t: Trial) -> str:
        if t.id is None:
            return context(t.params or {})
        if t.id not in self._contexts:
            self._contexts[t.id] = context(t.params or {})
        return self._contexts[t.id]

    def at(self, point: dict[str, Any], keys: Iterable[str]) -> Region | None:
        """The first closed region holding ``point`` on one of ``keys``, or None."""
        keys = set(keys)
        return next((r for r in self.regions(point) if r.key in keys and r.holds(point.get(r.key))), None)

    def covers(self, space: dict[str, SearchParam], at: dict[str, Any]) -> Region | None:
        """A closed region holding every point of ``space`` (searched on top of ``at``), or None. A space with
        words among its choices is never covered: its points may run with other words."""
        if any(p.choices is not None and not all(_number(c) for c in p.choices) for p in space.values()):
            return None
        for r in self.regions(at):
            p = space.get(r.key)
            if p is None:
                continue
            edges = p.choices if p.choices is not None else [p.low, p.high]
            if all(r.holds(v) for v in edges):
                return r
        return None


def context(params: dict[str, Any]) -> str:
    """The words of a train block (every non-numeric value), as one comparable string."""
    return json.dumps({k: v for k, v in params.items() if not _number(v)}, sort_keys=True, default=str)


def closed_regions(
    trials: list[Trial], incumbent: Trial | None, need: int, parents: dict[int | None, dict[str, Any]]
) -> list[Region]:
    """The closed sides of each numeric key among ``trials`` (one context), judged against ``incumbent``; a closing
    trial counts for the one key it changed from its parent (``parents``: train values by attempt number, None the
    base recipe's), the only one it can be blamed on."""
    held = [t for t in trials if _ended_well(t) and _held(t, incumbent)]
    blamed: dict[str, list[Trial]] = {}
    for t in trials:
        key = _changed_key(t, parents.get(t.parent)) if _closing(t) else None
        if key is not None:
            blamed.setdefault(key, []).append(t)
    label = incumbent.attempt if incumbent is not None else "the baseline"
    out = []
    for key, (lo, hi) in _hull(held).items():
        for side, beyond in ((">=", lambda v, hi=hi: v > hi), ("<=", lambda v, lo=lo: v < lo)):
            found = [t for t in blamed.get(key, []) if _number(v := (t.params or {}).get(key)) and beyond(v)]
            if len(found) >= need:
                values = [(t.params or {})[key] for t in found]
                bound = min(values) if side == ">=" else max(values)
                out.append(Region(key, side, bound, tuple(t.attempt for t in found), label))
    return out


def _ended_well(t: Trial) -> bool:
    """Ran to its end and was not judged worse than its parent (a baseline or confirmation run has no verdict)."""
    return t.status == TrialStatus.COMPLETE and t.verdict not in CLOSING


def _held(t: Trial, incumbent: Trial | None) -> bool:
    """Held up against the incumbent: the incumbent itself, its confirmation runs, or a trial that ended well after
    it (the pruner measured it against the incumbent as it ran). Before any incumbent: every trial that ended
    well."""
    if incumbent is None:
        return True
    return t.number == incumbent.number or t.confirms == incumbent.number or (t.number or 0) > (incumbent.number or 0)


def _closing(t: Trial) -> bool:
    """Pruned, regressed, or crashed in a way its values can cause (triage: not another process, not transient)."""
    if t.status == TrialStatus.PRUNED or t.verdict in CLOSING:
        return True
    return t.verdict == Verdict.CRASH and not triage.says_nothing_of_the_values(t.crash_category)


def _hull(trials: list[Trial]) -> dict[str, tuple[float, float]]:
    """Per numeric key (the seed left out), the lowest and highest value ``trials`` ran with."""
    out: dict[str, tuple[float, float]] = {}
    for t in trials:
        for k, v in (t.params or {}).items():
            if _number(v) and k not in IGNORED:
                lo, hi = out.get(k, (v, v))
                out[k] = (min(lo, v), max(hi, v))
    return out


def _changed_key(t: Trial, parent: dict[str, Any] | None) -> str | None:
    """The one numeric key (the seed aside) whose value ``t`` changed from its parent's, or None (none, or more)."""
    if parent is None:
        return None
    mine = t.params or {}
    moved = [k for k in set(mine) | set(parent) if k not in IGNORED and mine.get(k) != parent.get(k)]
    return moved[0] if len(moved) == 1 and _number(mine.get(moved[0])) else None


def _number(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# ---------------------------------------------------------------- rested hypotheses

TESTS = (Proposer.HYPOTHESIS, Proposer.MOVE)
"""Proposers whose trials test a hypothesis (confirmation runs and crash retries re-run one)."""


@dataclass(frozen=True)
class Rest:
    """A rested hypothesis: the trials that gained nothing since ``since`` (the incumbent's attempt)."""

    hypothesis: str
    trials: tuple[str, ...]
    since: str

    def why(self) -> str:
        return (
            f"{self.hypothesis} rested: its last {len(self.trials)} trials ({', '.join(self.trials)}) gained nothing "
            f"over {self.since}; it re-opens when a new incumbent is confirmed"
        )


def rested(trials: list[Trial], hypotheses: Iterable[str], incumbent: Trial | None, after: int) -> dict[str, Rest]:
    """The hypotheses among ``hypotheses`` whose last ``after`` finished trials since ``incumbent`` (None: the
    baseline, all of them) gained nothing: none improved, and none is a candidate still being confirmed."""
    since = incumbent.number if incumbent is not None else 0
    label = f"the confirmed incumbent {incumbent.attempt}" if incumbent is not None else "the baseline"
    out = {}
    for hid in hypotheses:
        mine = [
            t
            for t in trials
            if t.hypothesis == hid
            and t.kind == Kind.TRIAL
            and t.proposer in TESTS
            and t.confirms is None
            and (t.number or 0) > (since or 0)
        ]
        if any(_gained(t) for t in mine):
            continue
        done = [t for t in mine if t.verdict is not None]
        if len(done) >= after:
            out[hid] = Rest(hid, tuple(t.attempt for t in done[-after:]), label)
    return out


def _gained(t: Trial) -> bool:
    """Improved over its parent, confirmed or still waiting for its fresh-seed runs (not rejected or suspect)."""
    return t.verdict == Verdict.IMPROVED and t.confirmation not in (Confirmation.REJECTED, Confirmation.SUSPECT)
