"""The evidence a verdict rests on, assembled in one place for the study loop, promote and the pruner.

A verdict compares runs (``verdict.Runs``: each run's objective and its per-item results). Which runs stand on
each side is decided here, from the study's ledger rows:

- a trial against its **parent**: the parent's completed fresh-seed confirmation runs alone (the run that made
  it a candidate was picked for looking good, so as a reference it would make every child look worse), or the
  baseline's runs when it has no parent; the gain over the study's original baseline is reported apart;
- a **candidate's confirmation**: its fresh-seed runs alone against its parent's runs;
- the **run-to-run noise of each arm** (``verdict.Noise``): a recipe's replicate group is its runs with the same
  values (the baseline's repeats; a candidate's own run with its confirmation runs: the selected run can only
  widen their spread, never narrow it). The parent arm is the parent's group; the trial arm its own group where
  it has one (a candidate at confirmation, counted once), pooled with the groups of the study's other changed
  recipes (every other candidate's), never below the parent's;
- a running trial's **pruning references**: its parent (else the baseline), then the confirmed incumbent by its
  fresh-seed runs alone, each with the replicate groups that measure the noise at the same step;
- promote's **re-validation**: fresh runs of the trial and of the baseline, through ``runs_of``;
- the **hack gate** at confirmation (``autorl.judge.hackgate``): the candidate's fresh-seed runs against its
  parent's reference runs (the baseline's runs when it has no parent), the same two sides as the confirmation.

``objective_value`` is the one reduction of a run to its objective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from autorl.judge import calibrate, hackgate, triage, verdict
from autorl.judge.noise import arm
from autorl.judge.prune import PruneDecision, should_prune
from autorl.ledger import StudyRecords, Trial
from autorl.metrics import RunMetrics, items_key, reduce_series
from autorl.states import Confirmation, CrashCategory, Kind, Proposer, TrialStatus, Verdict


def objective_value(m: RunMetrics, recipe: Any) -> float | None:
    """The recipe's objective reduced from a run's metrics (None when the run never logged it, or logged it NaN or
    infinite: such a value is nothing to compare)."""
    o = recipe.objective
    value = reduce_series(m.series(o.metric), o.reduction, o.k, o.direction == "maximize")
    return value if value is not None and math.isfinite(value) else None


def runs_of(metrics: list[RunMetrics], recipe: Any) -> verdict.Runs | None:
    """Runs as the verdict sees them: each run's objective and per-item results (a run without the objective is
    left out; items only when every run has them); None when no run has the objective."""
    values = [objective_value(m, recipe) for m in metrics]
    keep = [(v, m) for v, m in zip(values, metrics) if v is not None]
    if not keep:
        return None
    items = [verdict.objective_items(m.evals, recipe.objective) for _, m in keep]
    return verdict.Runs(values=[v for v, _ in keep], items=items if all(items) else None)


def incumbent_row(trials: list[Trial], direction: str) -> Trial | None:
    """The best trial whose improvement was confirmed by fresh seeds (by objective), or None (the baseline)."""
    better = [(t, t.objective) for t in trials if t.confirmation == Confirmation.CONFIRMED and t.objective is not None]
    if not better:
        return None
    sign = 1 if direction == "maximize" else -1
    return max(better, key=lambda tv: sign * tv[1])[0]


class Reference(NamedTuple):
    """What a running trial must not be clearly worse than: a name, its runs, the replicate groups of its recipe
    (its run noise) and its attempt number (None: the baseline)."""

    label: str
    runs: list[RunMetrics]
    groups: list[list[RunMetrics]]
    number: int | None


# A confirmation run ending now, whose row still says running: its attempt number, status and crash category.
Ending = tuple[int, TrialStatus, CrashCategory | None]


@dataclass(frozen=True)
class ConfirmationOutcome:
    """A candidate's fresh-seed runs, judged: confirmed or rejected, why, and the judgement (None: nothing to
    judge)."""

    state: Confirmation
    reason: str
    verdict: verdict.Judgement | None
    runs: int


class Evidence:
    """One study's runs as evidence, read from its ledger rows (``autorl.ledger.StudyRecords``), each run's
    metrics read once."""

    def __init__(self, records: StudyRecords):
        self.records = records
        self._metrics: dict[int, RunMetrics] = {}
        self._ending: Ending | None = None

    def metrics(self, row: Trial) -> RunMetrics:
        if row.id not in self._metrics:
            self._metrics[row.id] = RunMetrics(self.records.metrics(row.id))
        return self._metrics[row.id]

    def baseline_runs(self) -> list[RunMetrics]:
        """The completed runs of the recipe as written (a crashed baseline's retry stands in for it)."""
        return [self.metrics(r) for r in self.records.baselines() if r.status == TrialStatus.COMPLETE]

    def _complete(self, rows: list[Trial]) -> list[RunMetrics]:
        return [self.metrics(r) for r in rows if self._status(r) == TrialStatus.COMPLETE]

    def _status(self, row: Trial) -> TrialStatus:
        """A row's status, or the one it is ending with (``confirmation``'s ``ending``) while its row says running."""
        return self._ending[1] if self._ending and row.number == self._ending[0] else row.status

    def _category(self, row: Trial) -> CrashCategory | None:
        """A row's crash category, or the one it is ending with (``confirmation``'s ``ending``)."""
        return self._ending[2] if self._ending and row.number == self._ending[0] else row.crash_category

    def _failed_on_fresh_seeds(self, rows: list[Trial]) -> list[str]:
        """How the candidate's confirmation runs that failed for a reason its recipe can cause ended (a hard
        abort, a divergence, a collapse, an out-of-memory crash); a transient crash (a hang, a lost network, a
        killed job, another process on the GPU) says nothing of the recipe and is left out, like a run the
        controller stopped."""
        out = []
        for row in rows:
            status, category = self._status(row), self._category(row)
            crashed = status == TrialStatus.CRASH
            if status == TrialStatus.PRUNED or (crashed and not triage.says_nothing_of_the_values(category)):
                out.append(f"{row.attempt} {status}" + (f" ({category})" if crashed and category else ""))
        return out

    def fresh_runs(self, number: int) -> list[RunMetrics]:
        """A candidate's completed fresh-seed confirmation runs (those the controller stopped early left out)."""
        return self._complete(self.records.confirm_runs(number, ran=True))

    def parent_runs(self, parent: int | None) -> list[RunMetrics]:
        """The parent's reference runs: its completed fresh-seed confirmation runs alone, or its own run when it has
        none (a parent is a confirmed candidate, so it has them); none for the baseline."""
        if parent is None:
            return []
        return self.fresh_runs(parent) or self._complete([self.records.trial(parent)])

    def group(self, number: int) -> list[RunMetrics]:
        """The replicate group of a candidate's recipe: its own run and its completed confirmation runs."""
        return self._complete([self.records.trial(number)]) + self.fresh_runs(number)

    def noise(self, recipe: Any, parent: int | None, candidate: int | None = None) -> verdict.Noise:
        """The replicate groups behind each arm of a verdict against ``parent``: the parent's group (None: the
        baseline's runs), the candidate's own group when one is being confirmed, and the groups of the study's other
        changed recipes (every candidate with a completed confirmation run, the parent and the candidate left out:
        each group counts once)."""
        others = [c for c in self.records.confirm_groups() if c not in (parent, candidate)]
        return verdict.Noise(
            parent=None if parent is None else _groups([self.group(parent)], recipe),
            trial=[] if candidate is None else _groups([self.group(candidate)], recipe),
            study=_groups([self.group(c) for c in others], recipe),
        )

    def credit(self, trial: RunMetrics, parent: int | None, recipe: Any) -> verdict.Credit | None:
        """The trial's verdict against its parent and its gain over the baseline (None: no completed baseline)."""
        base = runs_of(self.baseline_runs(), recipe)
        if base is None:
            return None
        own = runs_of([trial], recipe)
        if own is None:
            raise ValueError("credit needs the trial's objective: its run never logged it")
        against = runs_of(self.parent_runs(parent), recipe) or base
        noise = self.noise(recipe, parent)
        return verdict.credit(
            own,
            against,
            base,
            recipe.verdict,
            recipe.objective.direction,
            noise,
            verdict.Noise(study=noise.study),
        )

    def confirmation(self, candidate: Trial, recipe: Any, ending: Ending | None = None) -> ConfirmationOutcome | None:
        """The candidate judged on its fresh-seed runs once all of them have ended (None until then); ``ending``
        (attempt number, status, crash category) is a confirmation run ending now, whose row still says running.
        A candidate is judged on every fresh seed, not on those that survived: one that failed for a reason
        its recipe can cause rejects it."""
        self._ending = ending
        try:
            return self._confirmation(candidate, recipe)
        finally:
            self._ending = None

    def _confirmation(self, candidate: Trial, recipe: Any) -> ConfirmationOutcome | None:
        rows = self.records.confirm_runs(candidate.number, ran=True)  # a stopped one is run again
        need = recipe.verdict.confirm_runs
        if not need or len(rows) < need or any(self._status(r) == TrialStatus.RUNNING for r in rows):
            return None
        failed = self._failed_on_fresh_seeds(rows)
        if failed:
            return ConfirmationOutcome(
                Confirmation.REJECTED,
                f"{len(failed)} of its {len(rows)} fresh-seed runs failed ("
                f"{', '.join(failed)}): a recipe that fails on a fresh seed is not confirmed",
                None,
                0,
            )
        fresh = runs_of(self._complete(rows), recipe)
        base = runs_of(self.baseline_runs(), recipe)
        if fresh is None or base is None:
            return ConfirmationOutcome(Confirmation.REJECTED, "its confirmation runs did not complete", None, 0)
        parent = candidate.parent
        against = runs_of(self.parent_runs(parent), recipe) or base
        v = verdict.confirm(
            fresh, against, recipe.verdict, recipe.objective.direction, self.noise(recipe, parent, candidate.number)
        )
        state = Confirmation.CONFIRMED if v.verdict == Verdict.IMPROVED else Confirmation.REJECTED
        why = f"{len(fresh.values)} fresh-seed runs: {v.explanation}"
        return ConfirmationOutcome(state, why, v, len(fresh.values))

    def gate(self, candidate: Trial, recipe: Any) -> hackgate.GateResult | None:
        """The hack gate on a candidate's fresh-seed runs against its parent's runs (None: the recipe turns it off,
        or there is nothing to compare)."""
        fresh = self.fresh_runs(candidate.number)
        parent = self.parent_runs(candidate.parent) or self.baseline_runs()
        if not recipe.gate.enabled or not fresh or not parent:
            return None
        return hackgate.check(fresh, parent, recipe)

    def prune_references(self, parent: int | None, direction: str) -> list[Reference]:
        """What a running trial must not be clearly worse than: its parent (the baseline when it has none) and,
        once the study has one, the confirmed incumbent, each by its fresh-seed confirmation runs alone (the run
        that made it a candidate was picked for looking good). A trial clearly behind the best recipe the study
        has confirmed cannot become the next incumbent, whatever it would gain over its own parent. Each
        reference carries its recipe's replicate group (its run noise) and its attempt number (None: the
        baseline)."""
        refs = [
            Reference(
                f"its parent {self.records.trial(parent).attempt}",
                self.parent_runs(parent),
                [self.group(parent)],
                parent,
            )
            if parent is not None and self.parent_runs(parent)
            else Reference("the baseline", self.baseline_runs(), [self.baseline_runs()], None)
        ]
        best = incumbent_row(self.records.confirmed(), direction)
        if best is not None and best.number != parent and self.fresh_runs(best.number):
            refs.append(
                Reference(
                    f"the incumbent {best.attempt}",
                    self.fresh_runs(best.number),
                    [self.group(best.number)],
                    best.number,
                )
            )
        return refs

    def clearly_worse(self, record: dict, parent: int | None, recipe: Any) -> PruneDecision | None:
        """The first reference (parent, then the confirmed incumbent) an intermediate eval ``record`` is clearly
        worse than at its step (``autorl.judge.prune``), or None. The trial's run noise at that step is the
        reference's, or what the study's other changed recipes show there, whichever is larger. A trial ahead of
        its parent at that step is not stopped for trailing the incumbent: it may still end 'improved'."""
        key = items_key(recipe.objective.metric)
        if key is None or not record.get(key):
            return None
        step, sign = int(record["step"]), 1.0 if recipe.objective.direction == "maximize" else -1.0
        ahead = False
        for i, ref in enumerate(self.prune_references(parent, recipe.objective.direction)):
            at_step = items_at_step(ref.runs, key, step)
            if not at_step:
                continue
            if i == 0:
                ahead = sign * (float(np.mean(record[key])) - float(np.mean(at_step))) > 0
            elif ahead:
                return None
            others = [self.group(c) for c in self.records.confirm_groups() if c != ref.number]
            noise = verdict.Noise(parent=_at_step([*ref.groups], key, step), study=_at_step(others, key, step))
            d = should_prune(
                step, record[key], at_step, recipe.verdict, recipe.objective.direction, noise, than=ref.label
            )
            if d is not None:
                return d
        return None


def _at_step(groups: list[list[RunMetrics]], key: str, step: int) -> list[verdict.Runs]:
    """Replicate groups' per-item results at ``step`` (groups with fewer than two runs there left out)."""
    out = [items_at_step(g, key, step) for g in groups]
    return [verdict.Runs(values=[0.0] * len(g), items=g) for g in out if len(g) > 1]


class StudyErrors(NamedTuple):
    """A study's decisions and the error rates behind them (``Evidence.errors``)."""

    decisions: dict[str, int]  # verdicts by kind, confirmations by outcome, pruner stops
    baseline_sd: float | None  # the baseline's run sd (its repeats with the prior) and the replicate df behind it
    baseline_df: int
    changed_sd: float | None  # the run sd of the study's changed recipes (candidates' groups), if measured
    changed_df: int
    false_confirm: float | None  # chance a trial with no effect ends confirmed, at that noise
    expected_false: float | None  # false_confirm x trials judged
    aa: list[tuple[int, verdict.Judgement]]  # each baseline run (its index) judged against the others


JUDGED = (Verdict.IMPROVED, Verdict.REGRESSED, Verdict.FLAT)  # the verdicts a trial's test makes
DECIDED = (Confirmation.CONFIRMED, Confirmation.REJECTED)  # the confirmations fresh seeds decide


def study_errors(ev: Evidence, recipe: Any) -> StudyErrors:
    """How many decisions the study made, the false confirmations to expect at the noise it measured, and the A/A
    evidence of its baseline repeats (each run judged against the others, as a trial is)."""
    trials = [t for t in ev.records.trials(kind=Kind.TRIAL) if t.proposer not in (Proposer.BASELINE, Proposer.CONFIRM)]
    judged = [t for t in trials if t.verdict in JUDGED]
    decisions: dict[str, int] = {k: sum(t.verdict == k for t in judged) for k in JUDGED}
    decisions.update({k: sum(t.confirmation == k for t in trials) for k in DECIDED})
    decisions[Verdict.PRUNED] = sum(t.verdict == Verdict.PRUNED for t in trials)
    base = runs_of(ev.baseline_runs(), recipe)
    if base is None or len(base.values) < 2:
        return StudyErrors(decisions, None, 0, None, 0, None, None, [])
    s, items = recipe.verdict, bool(base.items)
    group = lambda r: np.asarray(r.items if items else r.values, float)  # noqa: E731
    study = [group(g) for g in ev.noise(recipe, None).study if (g.items if items else True)]
    par = arm([group(base)], s.run_sd_prior, s.run_sd_prior_df, values=not items)
    changed = arm(study, s.run_sd_prior, s.run_sd_prior_df, values=not items) if study else None
    parent_sd = math.sqrt(float(par.s2))
    changed_sd = math.sqrt(float(changed.s2)) if changed is not None else None
    p = tuple(float(x) for x in np.mean(base.items, axis=0)) if base.items else None
    design = calibrate.Design(
        p,
        len(base.values),
        1,
        0,
        int(changed.df) if changed is not None else 0,
        parent_sd,
        max(parent_sd, changed_sd or 0.0),
        int(par.df),
        int(changed.df) if changed is not None else 0,
    )
    fc = calibrate.false_confirmations(design, s)
    return StudyErrors(
        decisions, parent_sd, int(par.df), changed_sd, design.study_df, fc, fc * len(judged), _aa(base, recipe)
    )


def _aa(base: verdict.Runs, recipe: Any) -> list[tuple[int, verdict.Judgement]]:
    """Each baseline run judged against the other baseline runs: an A/A comparison the study made anyway."""
    out, n = [], len(base.values)
    for i in range(n if n > 2 else 1):  # two runs: one comparison (the other is its mirror)
        rest = [j for j in range(n) if j != i]
        pick = lambda idx: verdict.Runs(
            values=[base.values[j] for j in idx],  # noqa: E731
            items=[base.items[j] for j in idx] if base.items else None,
        )
        out.append((i, verdict.judge(pick([i]), pick(rest), recipe.verdict, recipe.objective.direction)))
    return out


def _groups(groups: list[list[RunMetrics]], recipe: Any) -> list[verdict.Runs]:
    """Replicate groups as the verdict sees them (groups of fewer than two runs with the objective left out)."""
    out = [runs_of(g, recipe) for g in groups]
    return [r for r in out if r is not None and len(r.values) > 1]


def items_at_step(runs: list[RunMetrics], key: str, step: int) -> list[list[float]]:
    """Each run's per-item results at ``step`` ([] when any run lacks them)."""
    got = [_items_at(m, key, step) for m in runs]
    items = [g for g in got if g]
    return items if got and len(items) == len(got) else []


def _items_at(m: RunMetrics, key: str, step: int) -> list[float] | None:
    for e in m.evals:
        if e.get(key) and e.get("step") == step:
            return e[key]
    return None
