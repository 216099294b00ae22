"""What a strategy sees of its study: the narrow view it proposes from.

A strategy (``autorl.search.strategies``) gets a ``StudyView`` and nothing else of the study: the base recipe,
the study's trials and their metrics, its Optuna searches (asked away from repeated crashes and closed regions:
``autorl.search.revisit``), whether a configuration was tried already, and one way to say something (a ledger
event). The proposer holds the same view and the
queue in front of the strategy (baseline repeats, confirmations, crash retries).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from autorl.judge import triage
from autorl.judge.evidence import incumbent_row
from autorl.ledger import Study, StudyRecords, Trial
from autorl.recipe import Recipe, SearchParam, dump_values
from autorl.search import revisit
from autorl.search.optuna_study import Search, Told
from autorl.states import Kind
from autorl.workspace import Workspace

AVOID_RADIUS = 0.1  # normalised distance to a repeatedly crashing point that is not sampled again
AVOID_TRIES = 10  # asks for one proposal before the last is run all the same, with the reason in its why


class Asked(NamedTuple):
    """What ``StudyView.ask`` got: the Optuna trial, its values, and why they are run although they lie next to a
    repeated crash or inside a closed region ("" when they do not)."""

    number: int
    params: dict[str, Any]
    why: str


class StudyView:
    """One running study as a strategy may see it (``records``: the study's rows)."""

    def __init__(
        self,
        ws: Workspace,
        records: StudyRecords,
        study: Study,
        base: Recipe,
        *,
        sampler: str = "tpe",
        seed: int = 0,
        parallel: bool = False,
    ):
        self.ws, self.records, self.base = ws, records, base
        if study.optuna_study is None:
            raise ValueError(f"study {study.name} has no Optuna study")
        self.name = study.optuna_study  # the study's Optuna name; a hypothesis' studies are named under it
        self._sampler, self._seed, self._parallel = sampler, seed, parallel
        self._searches: dict[str, Search] = {}
        self.rules = revisit.load_table()
        self._said: set[tuple[str, str, str]] = set()
        self._contexts: dict[int, str] = {}  # each trial's words, by row id (revisit.Closures)

    # ---- the study's rows ----------------------------------------------------------------------------------
    def trials(self, **equal: Any) -> list[Trial]:
        """The study's trials in attempt order (optionally with columns equal to values)."""
        return self.records.trials(**equal)

    def trial(self, number: int) -> Trial:
        return self.records.trial(number)

    def metrics(self, trial_id: int) -> list[dict]:
        return self.records.metrics(trial_id)

    def note(self, trial_id: int | None, kind: str, message: str) -> None:
        """A ledger event of this study (what a strategy decided and why)."""
        self.records.event(trial_id, kind, message)

    def tried(self, values: dict[str, Any], patch: str | None = None, hypothesis: str | None = None) -> Trial | None:
        """The earlier trial of this study that ran the base recipe with ``values`` (and the same patch), if any."""
        return self.records.ran({**self.base.train, **values}, hypothesis, same_hypothesis=bool(patch))

    # ---- Optuna --------------------------------------------------------------------------------------------
    def search(self, name: str | None = None, sampler: str | None = None) -> Search:
        """The Optuna study ``name`` (default: the study's own), opened once."""
        name = name or self.name
        if name not in self._searches:
            ledger = self.records.ledger
            self._searches[name] = Search(
                ledger.file.optuna_url(),
                name,
                self.base.objective.direction,
                sampler or self._sampler,
                seed=self._seed + len(self._searches),
                parallel=self._parallel,
                guard=ledger.file.check,
            )
        return self._searches[name]

    def ask(
        self,
        search: Search,
        space: dict[str, SearchParam],
        fixed: dict[str, Any] | None = None,
        at: dict[str, Any] | None = None,
        closed: bool = True,
    ) -> Asked:
        """Ask Optuna for values of ``space`` on top of the train values ``at`` (default: the base recipe's), with
        ``fixed`` enqueued first. A point next to a crash that repeated is told FAIL, one inside a closed region
        (``revisit.Closures``; unless not ``closed``) PRUNED, without running, and Optuna is asked again; after
        ``AVOID_TRIES`` asks the last is returned all the same, with why."""
        at = self.base.train if at is None else at
        closures = self.closures() if closed else None
        for k in range(AVOID_TRIES):
            number, params = search.ask(space, fixed=fixed if k == 0 else None)  # a refused probe is not enqueued again
            region = closures.at({**at, **params}, space) if closures is not None else None
            near = self._near_repeated_crash(space, params)
            if region is None and near is None:
                return Asked(number, params, "")
            if k < AVOID_TRIES - 1:
                self._refuse(search, number, params, region, near)
        why = f"run all the same: {AVOID_TRIES} asks in a row fell " + (
            f"inside closed regions, this one where {region.why()}"
            if region is not None
            else f"next to repeated crashes, this one next to {near}"
        )
        self.note(None, "closed" if region is not None else "avoided", f"{dump_values(params)}: {why}")
        return Asked(number, params, why)

    def _refuse(
        self, search: Search, number: int, params: dict[str, Any], region: revisit.Region | None, near: str | None
    ) -> None:
        """Tell Optuna how a point that is not run would have ended, and say why in the ledger."""
        if region is not None:
            search.tell(number, Told.PRUNED)
            said = (search.name, region.describe(), dump_values(params))
            if said not in self._said:  # a small space asks the same closed point many times: said once
                self._said.add(said)
                self.note(None, "closed", f"skipped {dump_values(params)}: {region.why()}; told Optuna pruned")
        else:
            search.tell(number, Told.FAIL)
            self.note(None, "avoided", f"skipped {dump_values(params)}: next to {near}, whose crash signature repeated")

    def closures(self) -> revisit.Closures:
        """The study's closed regions as its ledger stands now."""
        trials = self.trials(kind=Kind.TRIAL)
        inc = incumbent_row(trials, self.base.objective.direction)
        return revisit.Closures(trials, inc, self.rules.closed.trials, self.base.train, self._contexts)

    def _near_repeated_crash(self, space: dict[str, SearchParam], params: dict[str, Any]) -> str | None:
        rows = [r for r in self.records.crash_signatures() if triage.avoids(r.crash_category)]
        counts: dict[str | None, int] = {}
        for r in rows:
            counts[r.crash_signature] = counts.get(r.crash_signature, 0) + 1
        limit = triage.repeat_limit()  # from the rules file's repeat_limit
        for r in rows:
            if counts[r.crash_signature] >= limit and distance(space, params, r.params or {}) < AVOID_RADIUS:
                return r.attempt
        return None


def distance(space: dict[str, SearchParam], a: dict[str, Any], b: dict[str, Any]) -> float:
    """Chebyshev distance in the search space, each axis scaled to [0, 1] (log axes in log space)."""
    worst = 0.0
    for key, p in space.items():
        x, y = a.get(key), b.get(key)
        if p.choices is not None or not isinstance(x, (int, float)) or not isinstance(y, (int, float)):
            worst = max(worst, 0.0 if x == y else 1.0)
            continue
        assert p.low is not None and p.high is not None  # a range without choices has both bounds
        lo, hi = (math.log(p.low), math.log(p.high)) if p.log else (p.low, p.high)
        fx, fy = (math.log(max(x, 1e-300)), math.log(max(y, 1e-300))) if p.log else (x, y)
        worst = max(worst, abs(fx - fy) / ((hi - lo) or 1.0))
    return worst
