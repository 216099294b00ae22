"""One trial's life, the same for a study's trials, `autorl train`, promote's re-validation and a full run.

open → commit → launch → watch → judge → close, one function each:

1. ``open_attempt``: the next attempt number, branch ``attempt-NN-slug`` at a commit, its own worktree, the recipe
   written there, a commit saying why, tag ``attempt-NN-start``, the ledger row;
2. ``launch``: the backend's preflight, plan and start, outside this process; when training exits 0 the backend's
   ``eval_plan`` (the per-item evaluator) runs next, as part of the same run;
3. ``Watch`` (``autorl.runs.watch``) follows it: the timeout, the silence watchdog, the caller's early abort and
   pruning, an external stop;
4. judging belongs to the caller and ``autorl.judge`` (a study judges against the baseline, promote re-validates,
   a full run keeps its best eval; ``autorl.judge.evidence`` assembles what a verdict compares);
5. ``close_attempt``: the results file and the research-log entry committed on the branch, tag ``attempt-NN-end``,
   the ledger row updated, the worktree removed.

``run_detached`` strings 2-3 together for runs that need no branch of their own (promote's re-validation), up to
``--parallel`` at once on one prepared backend.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autorl import gitops
from autorl.backends.base import Backend, LaunchPlan, RunHandle, TrialSpec, get_backend
from autorl.backends.forked import ForkedProcess
from autorl.errors import UserError
from autorl.ledger import Ledger, Trial
from autorl.metrics import RunMetrics
from autorl.recipe import Recipe
from autorl.runs.slots import Slots
from autorl.runs.warmrecord import warm_columns, warm_events
from autorl.runs.watch import Outcome, Stop, Watch
from autorl.workspace import Workspace

RESULTS_DIR = "results"
RESEARCH_LOG = "research_log.md"


@dataclass
class Attempt:
    """An opened attempt: its refs, files and ledger row."""

    number: int
    name: str
    worktree: Path
    run_dir: Path
    start_sha: str
    row_id: int

    @classmethod
    def of(cls, ws: Workspace, row: Trial) -> Attempt:
        """The attempt ``row`` records (one opened by ``open_attempt``, perhaps in another process)."""
        assert row.start_sha is not None  # an attempt's row is added with its start commit
        return cls(row.number, row.attempt, ws.worktrees / row.attempt, ws.runs / row.attempt, row.start_sha, row.id)


# ---- 1. open -----------------------------------------------------------------------------------------------
def open_attempt(
    ws: Workspace,
    ledger: Ledger,
    *,
    rev: str,
    slug: str,
    files: dict[str, str],
    message: str,
    changed_files: Callable[[Path], list[str]] | None = None,
    **columns: Any,
) -> Attempt:
    """Branch ``attempt-NN-slug`` at ``rev`` in a new worktree, ``files`` written, committed, tagged, ledgered.

    The commit message is ``attempt-NN-slug: <message>``. ``changed_files(worktree)`` may change the worktree
    further (apply a patch) and return the paths it touched; ``columns`` are the ledger row's other columns.
    """
    with ledger.file.exclusive("number an attempt"):  # studies sharing the workspace and ledger number one at a time
        number = gitops.free_attempt_number(
            ws.root, max(gitops.next_attempt_number(ws.root), ledger.max_number() + 1), slug
        )
        name = gitops.attempt_name(number, slug)
        wt, run_dir = ws.worktrees / name, ws.runs / name
        gitops.add_worktree(ws.root, wt, name, rev)
        for rel, text in files.items():
            (wt / rel).parent.mkdir(parents=True, exist_ok=True)
            (wt / rel).write_text(text)
        paths = list(files) + (changed_files(wt) if changed_files else [])
        sha = gitops.commit(wt, f"{name}: {message}", paths)
        gitops.tag(ws.root, gitops.start_tag(number), sha)
        row_id = ledger.add_trial(
            number=number,
            attempt=name,
            branch=name,
            start_tag=gitops.start_tag(number),
            start_sha=sha,
            started=time.time(),
            log_path=str(run_dir / "train.log"),
            metrics_path=str(run_dir / "metrics.jsonl"),
            **columns,
        )
    return Attempt(number, name, wt, run_dir, sha, row_id)


# ---- 2. launch ---------------------------------------------------------------------------------------------
def launch(
    backend: Backend,
    spec: TrialSpec,
    start: Callable[[LaunchPlan], RunHandle] | None = None,
    assign: Callable[[LaunchPlan], LaunchPlan] | None = None,
) -> TrainThenEval:
    """Preflight, plan and start one run (then its per-item eval); raises UserError when it cannot start.

    ``assign`` gives the plan its slot's resources and ``start`` starts it elsewhere (a Ray job); by default the
    plan runs as is, on the backend itself.
    """
    failed = backend.preflight(spec.recipe, spec.worktree)
    if failed:
        raise UserError(f"preflight failed, not launched: {failed}")
    plan = backend.plan(spec)
    plan = assign(plan) if assign else plan
    handle = (start or backend.start)(plan)
    evaluation = backend.eval_plan(spec)
    return TrainThenEval(handle, assign(evaluation) if evaluation and assign else evaluation)


class TrainThenEval:
    """A run handle that, once training exits 0, starts the per-item evaluation and follows it too."""

    def __init__(self, train: RunHandle, evaluation: LaunchPlan | None):
        self.current, self._next = train, evaluation
        self._pending: list[dict[str, Any]] = []  # the training run's last records, read when it exited

    @property
    def pid(self) -> int | None:
        return getattr(self.current, "pid", None)

    @property
    def job_id(self) -> str | None:
        return getattr(self.current, "job_id", None)

    def poll(self) -> int | None:
        code = self.current.poll()
        if code == 0 and self._next is not None:
            self._pending = self.current.metrics()
            self.current, self._next = ForkedProcess(self._next), None
            return None
        return code

    def metrics(self) -> list[dict[str, Any]]:
        early, self._pending = self._pending, []
        return early + self.current.metrics()

    def last_activity(self) -> float:
        return self.current.last_activity()

    def waiting(self) -> Any:
        return self.current.waiting()

    def cancel(self, grace_s: float = 5.0) -> None:
        self.current.cancel(grace_s)


# ---- 3. watch (autorl.runs.watch) ---------------------------------------------------------------------------
def watch_run(
    handle: RunHandle,
    recipe: Recipe,
    *,
    deadline: float | None = None,
    timeout_s: float | None = None,
    on_records: Callable[[list[dict[str, Any]], RunMetrics], Stop | None] | None = None,
    external: Callable[[], Stop | None] | None = None,
) -> Watch:
    """A Watch over one run with the recipe's limits: its ``timeout_s`` and its silence watchdog."""
    return Watch(
        handle,
        timeout_s=recipe.timeout_s if timeout_s is None else timeout_s,
        deadline=deadline,
        silence_s=recipe.abort.silence_s,
        on_records=on_records or (lambda recs, m: None),
        external=external or (lambda: None),
    )


def follow(w: Watch, poll_s: float = 0.1) -> Outcome:
    """Step a Watch until the run ends (blocking)."""
    while (out := w.step()) is None:
        time.sleep(poll_s)
    return out


@dataclass
class DetachedRun:
    """One run that needs no branch of its own: ``recipe`` at commit ``rev`` with ``seed``, named ``name``."""

    recipe: Recipe
    rev: str
    name: str
    seed: int | None = None
    timeout_s: float | None = None  # None: the recipe's own


def run_detached(
    ws: Workspace,
    runs: list[DetachedRun],
    parallel: int = 1,
    on_end: Callable[[DetachedRun, Outcome], None] = lambda run, out: None,
) -> list[Outcome]:
    """Runs in throwaway detached worktrees (no branch, no ledger row), up to ``parallel`` at once, on one backend
    prepared as a study's is (its local Ray head, shared compile caches, evaluator): a run starts only while the
    GPUs it occupies are free (``Slots``). The outcomes, in the order of ``runs``."""
    backend = get_backend(runs[0].recipe.backend)
    backend.prepare(runs[0].recipe, ws.cache, ws.runs / "prepare")
    slots = Slots(parallel, None)
    try:
        return _pool(ws, backend, slots, runs, on_end)
    finally:
        backend.close()
        slots.close()


Active = dict[int, tuple[int, Watch, Path]]  # slot -> (index of the run, its Watch, its worktree)


def _pool(
    ws: Workspace,
    backend: Backend,
    slots: Slots,
    runs: list[DetachedRun],
    on_end: Callable[[DetachedRun, Outcome], None],
) -> list[Outcome]:
    outcomes: dict[int, Outcome] = {}
    waiting = list(range(len(runs)))
    active: Active = {}
    try:
        while waiting or active:
            for slot, (i, w, _wt) in list(active.items()):
                if (out := w.step()) is not None:
                    outcomes[i] = out
                    _end_detached(ws, slots, slot, active)
                    on_end(runs[i], out)
            free = [k for k in range(slots.n) if k not in active]
            while waiting and free and slots.fits(need := backend.gpus_per_run(runs[waiting[0]].recipe)):
                slot, i = free.pop(0), waiting.pop(0)
                active[slot] = (i, *_start_detached(ws, backend, slots, slot, runs[i]))
                slots.hold(slot, need)
            time.sleep(0.1)
    finally:
        for slot, (_i, w, _wt) in list(active.items()):  # interrupted: nothing left running
            w.handle.cancel()
            _end_detached(ws, slots, slot, active)
    return [outcomes[i] for i in range(len(runs))]


def _start_detached(ws: Workspace, backend: Backend, slots: Slots, slot: int, run: DetachedRun) -> tuple[Watch, Path]:
    wt = ws.worktrees / run.name
    gitops.remove_worktree(ws.root, wt)
    gitops.add_detached_worktree(ws.root, wt, run.rev)
    spec = TrialSpec(
        attempt=run.name, recipe=run.recipe, worktree=wt, run_dir=ws.runs / run.name, cache_dir=ws.cache, seed=run.seed
    )
    try:
        handle = launch(
            backend,
            spec,
            start=lambda plan: slots.start(backend, plan),
            assign=lambda plan: slots.assign(plan, slot, run.recipe, backend.runs_on_ray),
        )
    except BaseException:
        gitops.remove_worktree(ws.root, wt)
        raise
    return watch_run(handle, run.recipe, timeout_s=run.timeout_s), wt


def _end_detached(ws: Workspace, slots: Slots, slot: int, active: Active) -> None:
    _i, _w, wt = active.pop(slot)
    slots.release(slot)
    gitops.remove_worktree(ws.root, wt)


# ---- 5. close ----------------------------------------------------------------------------------------------
def close_attempt(
    ws: Workspace,
    ledger: Ledger,
    a: Attempt,
    values: dict[str, Any],
    summary: dict[str, Any],
    message: str,
    log_entry: str = "",
    event: str = "trial-end",
) -> str:
    """Commit the results (and a research-log entry), tag the end, set ``values`` on the ledger row, remove the
    worktree."""
    results = a.worktree / RESULTS_DIR / f"{a.name}.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(summary, indent=1, sort_keys=True, default=str) + "\n")
    paths = [str(results.relative_to(a.worktree))]
    if log_entry:
        log = a.worktree / RESEARCH_LOG
        log.write_text(_read(log) + log_entry)
        paths.append(RESEARCH_LOG)
    sha = gitops.commit(a.worktree, message, paths)
    gitops.tag(ws.root, gitops.end_tag(a.number), sha)
    values = {**warm_columns(a.run_dir), **values}
    ledger.update_trial(
        a.row_id,
        event=event,
        more_events=warm_events(a.run_dir),
        **values,
        end_tag=gitops.end_tag(a.number),
        end_sha=sha,
        pid=None,
    )
    gitops.remove_worktree(ws.root, a.worktree)
    return sha


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
