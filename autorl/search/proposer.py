"""Who proposes the next trial: baseline repeats, the queue (confirmations, crash retries), then a strategy.

Strategies (``--strategy``):

- ``optuna``: plain TPE over the recipe's search space (one Optuna study);
- ``random``: Optuna's RandomSampler over the same space (the benchmark's control);
- ``hypotheses``: the diagnosis of the latest trials ranks the hypothesis library;
  the top hypothesis' overrides are applied and Optuna searches inside its space
  (see ``autorl.search.hypotheses`` for why each hypothesis gets its own Optuna study).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from autorl.backends.base import Backend, get_backend
from autorl.judge import triage
from autorl.judge.result import TrialResult
from autorl.ledger import Ledger, Study, Trial
from autorl.recipe import Recipe, dump_values
from autorl.search.hypotheses_strategy import HypothesisStrategy
from autorl.search.optuna_study import Search, Told, study_names
from autorl.search.proposal import Proposal
from autorl.search.queue import RunQueue
from autorl.search.strategies import OptunaStrategy, Strategy
from autorl.search.view import StudyView
from autorl.states import CrashAction, Kind, TrialStatus
from autorl.states import Proposer as By
from autorl.workspace import Workspace


class Options(Protocol):
    """What the proposer reads of a run's options (``autorl.study.state.RunOptions``)."""

    @property
    def strategy(self) -> str | None: ...  # None: the default, hypotheses
    @property
    def seed(self) -> int: ...
    @property
    def parallel(self) -> int: ...


class Proposer:
    """Decides the next proposal from the ledger's history (``ledger.records(study)``: one study's rows)."""

    def __init__(
        self, ws: Workspace, ledger: Ledger, study: Study, base: Recipe, opts: Options, backend: Backend | None = None
    ):
        self.ws, self.study, self.opts = ws, study, opts
        self.parallel = opts.parallel  # the CLI keeps it >= 1
        assert study.id is not None  # a study read from the ledger
        self.records = ledger.records(study.id)
        self.backend = backend or get_backend(base.backend)  # its oom_retry reduces an out-of-memory retry
        self.view = StudyView(
            ws,
            self.records,
            study,
            base,
            sampler="random" if opts.strategy == By.RANDOM else "tpe",
            seed=opts.seed,
            parallel=self.parallel > 1,
        )
        self.strategy: Strategy = make_strategy(opts.strategy or "hypotheses", self.view)
        self.queue = RunQueue(self.records, self.view, self.backend, self.strategy)

    @property
    def pending(self) -> list[Proposal]:
        """Proposals queued before the strategy (confirmation runs, crash retries, one put back), in order."""
        return self.queue.pending

    @property
    def base(self) -> Recipe:
        """The study's base recipe (the strategy's view holds the same one)."""
        return self.view.base

    def rebase(self, base: Recipe) -> None:
        """Propose from ``base`` from now on (the base recipe carried a reduced baseline retry's values)."""
        self.view.base = base

    def search(self, name: str | None = None) -> Search:
        """The Optuna study ``name`` (default: the study's own), opened once."""
        return self.view.search(name)

    def recover(self) -> int:
        """Fail the trials a killed controller left RUNNING in every Optuna study of this study (per hypothesis too)."""
        url = self.records.ledger.file.optuna_url()
        names = set(study_names(url, self.view.name)) | {self.view.name}
        return sum(self.search(name).fail_running() for name in sorted(names))

    # ---- the next proposal ------------------------------------------------------------
    def next(self) -> Proposal | None:
        """The next proposal; None means 'nothing now' (e.g. wait for the baseline)."""
        if self.pending:
            return self.pending.pop(0)
        need, base = self._baseline_need()
        if need:
            return base
        if not any(r.status == TrialStatus.COMPLETE for r in self._baselines()):
            return None
        return self._fresh()

    # ---- no repeats ---------------------------------------------------------------------
    def _fresh(self) -> Proposal | None:
        """The strategy's proposal, asked again while it repeats a configuration this study already tried."""
        for k in range(REPEAT_TRIES):
            p = self.strategy.propose()
            if p is None:
                return None
            twin = self.view.tried(p.values, p.patch, p.hypothesis)
            if twin is None:
                return p
            self._skip_repeat(p, twin)
            if k == REPEAT_TRIES - 1:
                return self._deliberate_repeat(p, twin)
        return None

    def _skip_repeat(self, p: Proposal, twin: Trial) -> None:
        """Tell Optuna the repeat's outcome from the earlier trial (nothing runs) and log it."""
        told = "nothing to tell"
        if p.optuna_study is not None and p.optuna_number is not None:
            value = twin.objective if twin.status == TrialStatus.COMPLETE else None
            state = (
                Told.COMPLETE
                if value is not None
                else (Told.PRUNED if twin.status == TrialStatus.PRUNED else Told.FAIL)
            )
            self.search(p.optuna_study).tell(p.optuna_number, state, value)
            told = f"told Optuna {state}" + (f" {value:.4f}" if value is not None else "")
        self.records.event(
            None,
            "repeat",
            f"skipped {p.proposer} proposal "
            f"{dump_values(p.values) or '(baseline values)'}: already tried as {twin.attempt}; {told}",
        )

    def _deliberate_repeat(self, p: Proposal, twin: Trial) -> Proposal:
        """After REPEAT_TRIES repeats in a row: run the values once more with a fresh seed, and say so."""
        seeds = [int(r.seed or 0) for r in self.records.trials(kind=Kind.TRIAL)]
        seed = max(seeds + [0]) + 1
        what = (
            f"deliberate repeat of {twin.attempt}'s values with a fresh seed {seed}: the search proposed only "
            f"configurations already tried in {REPEAT_TRIES} asks"
        )
        values, slug = {**p.values, "seed": seed}, f"repeat-{twin.number:02d}-seed{seed}"
        if twin.number in self.baseline_numbers() and p.parent is None and not p.patch:
            # the recipe as written once more: a baseline run (its seed noise, its reference), not a test of p's idea
            return replace(
                p,
                proposer=By.BASELINE,
                hypothesis=None,
                values=values,
                slug=slug,
                why=f"{what}; counted as one more baseline run",
            )
        # every other field (the parent above all: the recipe it is judged against) stays the proposal's own
        return replace(p, values=values, why=f"{what}; {p.why}", slug=slug)

    def _baseline_need(self) -> tuple[bool, Proposal | None]:
        """(True, proposal) to run a baseline now, (True, None) to wait for one in flight."""
        rows = self._baselines()
        done, active, failed, lost = _tally(rows)
        repeats = self.base.verdict.baseline_repeats
        if done >= repeats or _given_up(done, active, failed, lost, repeats):
            return False, None
        # with --parallel N, slots that would idle until the baseline is known run more baseline repeats (seed
        # noise): every wave of baseline runs is full, the repeats rounded up to a multiple of N
        if done + active >= -(-repeats // self.parallel) * self.parallel:
            return True, None
        return True, self._baseline(len(rows), first=not rows)  # a lost run's seed is not used again

    def _baseline(self, k: int, first: bool) -> Proposal:
        seed0 = int(self.base.train.get("seed", 0) or 0)
        values = {} if k == 0 else {"seed": seed0 + k}
        why = (
            "baseline: the recipe as written"
            if k == 0
            else f"baseline repeat {k + 1} (seed {seed0 + k}) to measure seed noise"
        )
        slug = "baseline" if k == 0 else f"baseline-seed{seed0 + k}"
        if not (first and self.base.search):
            return Proposal(By.BASELINE, values, why, slug)
        search = self.search()
        number, _ = search.ask(self.base.search, fixed={key: self.base.train[key] for key in self.base.search})
        return Proposal(By.BASELINE, values, why, slug, optuna_study=search.name, optuna_number=number)

    # ---- feedback ---------------------------------------------------------------------
    def tell(self, p: Proposal, result: TrialResult, action: CrashAction | None = None) -> None:
        """Tell Optuna how the trial ended (FAIL for a crash, never a score) and queue a crash's retry.

        ``action`` is what triage decided for a crash (``retry_reduced``, ``retry_once``, ...); without one the
        category's action from the rules table applies.
        """
        if p.optuna_study is not None and p.optuna_number is not None:
            state = TOLD.get(result.status, Told.FAIL)
            self.search(p.optuna_study).tell(p.optuna_number, state, result.objective)
        if action is None and result.crash_category:
            action = triage.crash_action(result.crash_category)
        if p.retry_of is None and p.confirms is None and result.status == TrialStatus.CRASH:
            self.queue.crash_retry(p, result.number, result.crash_category, action)

    def report(self, p: Proposal, value: float, step: int) -> bool:
        """Report an intermediate value of ``p``'s Optuna trial; True when the pruner says stop."""
        if p.optuna_study is None or p.optuna_number is None:
            return False
        return self.search(p.optuna_study).report(p.optuna_number, value, step)

    # ---- the baseline -----------------------------------------------------------------------
    def _baselines(self) -> list[Trial]:
        return self.records.baselines()

    def baseline_failed(self) -> bool:
        """A baseline run failed in a way its values can cause before the baseline's repeats were complete (a later
        extra run that crashes, a slot's first-wave repeat or a deliberate repeat, leaves the baseline known), or more
        runs were lost to what they cannot cause than ran well (or than ``baseline_repeats``); until then each lost run
        is replaced by a fresh seed."""
        done, active, failed, lost = _tally(self._baselines())
        repeats = self.base.verdict.baseline_repeats
        return done < repeats and _given_up(done, active, failed, lost, repeats)

    def baseline_runs_missing(self) -> int:
        """Baseline runs still to complete before the baseline's repeats are in."""
        return max(self.base.verdict.baseline_repeats - _tally(self._baselines())[0], 0)

    def baseline_numbers(self) -> set[int | None]:
        """Attempt numbers of the study's baseline runs as proposed (a retry of one stands in for it)."""
        return {r.number for r in self.records.trials(proposer=By.BASELINE)}

    def is_baseline(self, p: Proposal) -> bool:
        """The baseline, or the retry of a crashed baseline (which stands in for it)."""
        return p.proposer == By.BASELINE or (p.proposer == By.RETRY and p.retry_of in self.baseline_numbers())

    def baseline_retry_queued(self) -> bool:
        """A crashed baseline's retry (triage's action) is waiting: it runs before the study gives up."""
        numbers = self.baseline_numbers()
        return any(p.proposer == By.RETRY and p.retry_of in numbers for p in self.pending)


TOLD: dict[str, Told] = {TrialStatus.COMPLETE: Told.COMPLETE, TrialStatus.PRUNED: Told.PRUNED}
"""What Optuna is told of a trial that ended so (FAIL for every other end: a crash is never a score)."""

FAILED = (TrialStatus.CRASH, TrialStatus.CONFIG_ERROR, TrialStatus.HANG, TrialStatus.TIMEOUT)
"""How a run ends when its values may be at fault (unless triage says the crash says nothing of them)."""

RETRIES = (CrashAction.RETRY_REDUCED, CrashAction.RETRY_ONCE)  # triage's actions that run the trial again
REPEAT_TRIES = 8  # asks for something new before a tried configuration is run again, deliberately, with a new seed


def make_strategy(name: str, view: StudyView) -> Strategy:
    """The strategy ``--strategy name`` names, over the study's view."""
    return HypothesisStrategy(view) if name == "hypotheses" else OptunaStrategy(view, label=By(name))


def _given_up(done: int, active: int, failed: bool, lost: int, repeats: int) -> bool:
    """No more baseline runs: one failed in a way its values can cause, or more were lost to what they cannot cause
    than completed or may still complete (or than the repeats asked for)."""
    return failed or lost > min(repeats, done + active)


def _tally(rows: list[Trial]) -> tuple[int, int, bool, int]:
    """Baseline runs complete; running or waiting for their retry; whether one failed (crash, config error, hang or
    timeout) in a way its values can cause; and how many were lost, after their retry, to what they cannot cause
    (``triage.says_nothing_of_the_values``: another process on the GPU, a network error, an external kill)."""
    done = sum(r.status == TrialStatus.COMPLETE for r in rows)
    ended = [r for r in rows if r.status in FAILED]
    blameless = [r for r in ended if triage.says_nothing_of_the_values(r.crash_category)]
    awaiting = sum(r.crash_action in RETRIES for r in blameless)
    active = sum(r.status == TrialStatus.RUNNING for r in rows) + awaiting
    return done, active, len(ended) > len(blameless), len(blameless) - awaiting
