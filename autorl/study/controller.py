"""The study loop: propose, commit, launch, watch, judge, record — until the budget ends.

One trial, in order (each step a module of ``autorl.study``):

1. propose — ``Proposer.next``: the baseline first (``baseline_repeats`` seeds), then queued confirmation runs and
   crash retries, then the strategy (hypotheses, plain Optuna TPE, or random); a proposal whose planned duration
   (``plan``) does not fit in the budget left is not started;
2. prepare — ``attempts.prepare``: worktree at the study's base commit, branch ``attempt-NN-slug``, the recipe
   edited in place, a commit saying why, tag ``attempt-NN-start``;
3. execute — ``attempts.launch``: the backend starts the run outside this process; its ``Watch`` follows it with
   the trial's ``monitor`` (early abort, the pruner), the timeout and the budget;
4. finish — ``judging``: objective and verdict against the parent, or crash diagnosis; ``crash``: triage's action;
   Optuna told; ``attempts.close``: results file and research-log entry committed, tag ``attempt-NN-end``,
   worktree removed; a candidate's confirmation runs queued, a carried base recipe taken up.

The study is opened by ``opening`` (and ``recovery`` on ``--resume``); what the parts share is a ``StudyState``.
While it runs, the loop checks at every turn that the ledger is still the file it opened, and now and then that
every page of it reads (``recovery.LedgerWatch``). However the loop ends — the budget, a stop, a lost ledger, a
full disk, a bug — ``recovery.shut_down`` stops what still runs and closes the study, each step on its own, and
the error that ended it is the one told. The controller never imports torch: trials are child processes or Ray
jobs.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from autorl.budget import format_duration
from autorl.judge.result import TrialResult
from autorl.present.live import PlainView
from autorl.runs import plan
from autorl.runs.slots import Slots
from autorl.runs.watch import Outcome, Stop, Watch
from autorl.search.proposal import Proposal
from autorl.states import Confirmation, Kind, TrialStatus
from autorl.study import attempts, carry, crash, judging, opening, recovery
from autorl.study.state import Running, RunOptions, StudyState, TrialContext
from autorl.workspace import Workspace


def budget_spent(prepared_s: float, budget_s: float, backend: str, launched: int) -> str:
    """Why a study whose budget ran out ended: where the backend's first preparation (a fresh workspace's base
    model) took most of it and no trial started, that is said, with what to do."""
    if launched or prepared_s < 0.5 * budget_s:
        return "the budget is spent"
    return (
        f"the budget is spent: preparing backend {backend} took {prepared_s:.0f} s of {format_duration(budget_s)} "
        "(what it built is kept: `autorl run --resume` with `--budget 10m` more starts trials at once)"
    )


class Controller:
    """Runs one study in one workspace: up to ``parallel`` trials in flight until the budget, a stop or the cap."""

    def __init__(self, ws: Workspace, opts: RunOptions, view: PlainView | None = None):
        self.ws, self.opts, self.view = ws, opts, view or PlainView()
        self.stop_reason: Stop | None = None
        self.crash_stop = False  # the stop is triage's (a crash that stops the study): `autorl run` exits 1
        self.prepared_s = 0.0  # the backend's preparation, which the budget counts
        self.started = time.time()
        self.deadline = self.started + opts.budget_s
        self.slots: Slots | None = None
        self.running: Running = {}  # slot -> the trial in flight there
        self._held: Proposal | None = None  # the proposal last put back for not fitting (logged once)
        self.ended_by = ""  # why the loop ended, in words (the run's last line)
        self.ran_here = False  # a trial of this session completed: later trials no longer start cold

    def run(self) -> dict[str, Any]:
        self.s = self._setup()
        self.deadline = self.started + self.opts.budget_s  # a resumed session's budget is known once it is opened
        old = _install_signals(self._on_signal)
        failure: BaseException | None = None
        try:
            self._loop()
            self.ended_by = self._why_ended()
            recovery.release_unstarted(self.s)
            self._session_end()
        except BaseException as exc:
            failure = recovery.stop_error(self.s, exc)
            if failure is exc:
                raise
            raise failure from None
        finally:
            _restore_signals(old)
            recovery.shut_down(self.s, self.running, self.slots, failure)
        return self.summary()

    def _setup(self) -> StudyState:
        """Every input checked first (``opening``); then the carried base recipe, orphans, the resumed queue. A step
        that fails once the study's row is written marks it stopped with the reason."""
        s = opening.open_study(self.ws, self.opts, self.view)
        try:
            carry.carry_base(s)
            self.slots = Slots(self.opts.parallel, self.opts.ray_address)
            recovery.recover(s)
            if self.opts.resume:
                recovery.requeue(s)
            self.prepared_s = opening.prepare_backend(s)
            self.watch = recovery.LedgerWatch(s.ledger)
        except BaseException as exc:
            failure = recovery.stop_error(s, exc)
            recovery.shut_down(s, {}, self.slots, failure)
            if failure is exc:
                raise
            raise failure from None
        self.view.study(
            f"study {s.row.name}: {self.opts.strategy}, budget {format_duration(self.opts.budget_s)}, "
            f"backend {s.base.backend}, recipe {s.recipe_rel}"
        )
        return s

    def _session_end(self) -> None:
        """The session's end, in the ledger: what it used of the budget is counted up to here on `--resume`."""
        took = time.time() - self.started
        self.s.records.event(None, opening.SESSION_END, f"session ended after {format_duration(took)}: {self.ended_by}")

    # ---- the loop -------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        """Keep up to ``parallel`` trials in flight; finish each as it ends. Each turn first checks the ledger."""
        running, slots = self.running, self._slots()
        self.launched, self.done_before = 0, len(self.s.records.trials(kind=Kind.TRIAL))
        while True:
            self.watch.step()
            opened = self._fill(running, slots)
            if not running and not opened:  # a trial that failed before launch is finished: ask again
                break
            for slot, (ctx, watch) in list(running.items()):
                out = watch.step()
                if out is not None:
                    self.finish(ctx, out)
                    del running[slot]
                    slots.release(slot)
            time.sleep(0.05 if running else 0)

    def _slots(self) -> Slots:
        assert self.slots is not None  # made by _setup, before the loop
        return self.slots

    def _fill(self, running: Running, slots: Slots) -> int:
        """Start trials in the free slots; returns how many were opened (launched, or finished at once)."""
        opened = 0
        need = self.s.backend.gpus_per_run(self.s.base)
        for slot in [k for k in range(self.opts.parallel) if k not in running]:
            if not self._may_start() or not slots.fits(need):  # a trial waits for its GPUs, never for Ray
                break
            proposal = self.s.proposer.next()
            if proposal is None:
                break
            if not self._fits(proposal):
                self._hold(proposal)
                smaller = self.s.proposer.queue.fitting_confirmation(proposal, self._fits)
                if smaller is None:
                    break
                proposal = smaller
            ctx = attempts.prepare(self.s, proposal)
            self.launched += 1
            opened += 1
            started = self._launch(ctx, slots, slot) if ctx.error is None else None
            if isinstance(started, Watch):
                running[slot] = (ctx, started)
                slots.hold(slot, need)
            else:
                self.finish(ctx, started or Outcome(TrialStatus.CONFIG_ERROR, None, ctx.error or "not launched"))
        return opened

    def _launch(self, ctx: TrialContext, slots: Slots, slot: int) -> Watch | Outcome:
        return attempts.launch(
            self.s,
            ctx,
            slots,
            slot,
            None if self.opts.allow_overrun else self.deadline,
            lambda: self.stop_reason,
            lambda: (time.time() - self.started, self.deadline - time.time()),
        )

    def _may_start(self) -> bool:
        proposer = self.s.proposer
        if self.stop_reason is not None or (proposer.baseline_failed() and not proposer.baseline_retry_queued()):
            return False
        if self.opts.max_trials is not None and self.done_before + self.launched >= self.opts.max_trials:
            return False
        return time.time() < self.deadline

    # ---- the budget -----------------------------------------------------------------------------------------
    def _fits(self, p: Proposal) -> bool:
        left = self.deadline - time.time()
        return left > 0 and (self.opts.allow_overrun or left >= self.expected_trial_s(p))

    def expected_trial_s(self, p: Proposal | None = None) -> float:
        """What trial ``p`` is planned to take (autorl.runs.plan): this study's finished trials scaled by its work,
        times a margin measured on them; the trial's timeout (``Backend.trial_timeout``) is the hard cap."""
        return self._estimate(p).seconds

    def _estimate(self, p: Proposal | None) -> plan.Estimate:
        keys, rules = self.s.backend.work_keys, plan.rules()  # the plan reads no more than the last window
        took = plan.recent(self.s.records, keys, rules)
        changed = p.values if p is not None else {}
        values, cap = {**self.s.base.train, **changed}, self.s.backend.trial_timeout(self.s.base, changed)
        return plan.expected(took, plan.work(values, keys), cap, self.opts.budget_s, rules, cold=not self.ran_here)

    def _why_ended(self) -> str:
        """Why the loop stopped starting trials, for the run's last line (a study ending early says why)."""
        left = self.deadline - time.time()
        if self.stop_reason is not None:
            return self.stop_reason.reason
        if self.opts.max_trials is not None and self.done_before + self.launched >= self.opts.max_trials:
            return f"--max-trials {self.opts.max_trials} reached"
        if left <= 0:
            return budget_spent(self.prepared_s, self.opts.budget_s, self.s.base.backend, self.launched)
        if self.s.proposer.baseline_failed():
            return "the baseline failed"
        if self._held is not None:
            return (
                f"the next trial ({self._held.slug}) is planned at {self._estimate(self._held).describe()}, "
                f"more than the {format_duration(left)} left of the budget (--allow-overrun starts it anyway)"
            )
        return "the strategy has nothing left to propose"

    def _hold(self, p: Proposal) -> None:
        """A proposal that does not fit goes back to the front of the queue (a trial ending may still free time)."""
        self.s.proposer.pending.insert(0, p)
        if p is not self._held:
            self._held = p
            self.s.records.event(
                None,
                "budget",
                f"next trial {p.slug} not started: planned at "
                f"{self._estimate(p).describe()}, {max(self.deadline - time.time(), 0):.0f} s left",
            )

    # ---- one finished trial ---------------------------------------------------------------------------------
    def finish(self, ctx: TrialContext, outcome: Outcome) -> None:
        """Judge, decide a crash's action, tell the proposer, close the attempt; then what the result sets off."""
        s, a, p = self.s, ctx.attempt, ctx.proposal
        result = TrialResult(number=a.number, **judging.result_row(s, ctx, outcome))
        self.ran_here = self.ran_here or outcome.status == TrialStatus.COMPLETE
        action = crash.decide(s, ctx, result)
        note = carry.carry_note(s, p, a.number, result)
        if action or note:
            result = result.model_copy(
                update={
                    "crash_action": action.kind if action else None,
                    "reason": "; ".join(x for x in (result.reason, note) if x),
                }
            )
        s.proposer.tell(p, result, action.kind if action else None)
        settles = judging.confirmation_note(s, p.confirms, result) if p.confirms is not None else None
        attempts.close(s, ctx, outcome, result, settles)
        if result.confirmation == Confirmation.CANDIDATE and s.base.verdict.confirm_runs > 0:
            s.proposer.queue.confirmation_runs(p, a.number, s.base.verdict.confirm_runs)
        if p.confirms is not None:
            judging.confirm(s, p.confirms)
        if action:
            stop = crash.act(s, ctx, action)  # recorded whatever else stops the study
            if stop is not None and self.stop_reason is None:
                self.stop_reason, self.crash_stop = stop, True
        if note:
            self.view.line(f"{a.name}: {note}")
            carry.carry_base(s)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stop_reason = Stop(TrialStatus.INTERRUPTED, f"stopped by {signal.Signals(signum).name}")
        self.crash_stop = False

    def summary(self) -> dict[str, Any]:
        trials = self.s.records.trials()
        counts: dict[str, int] = {}
        for t in trials:
            key = t.verdict or t.status
            counts[key] = counts.get(key, 0) + 1
        stop = self.stop_reason
        return {
            "study": self.s.row.name,
            "trials": len(trials),
            "counts": counts,
            "ended_by": self.ended_by,
            "wall_s": time.time() - self.started,
            "stopped_by": stop.reason if stop else None,
            "stop_status": (crash.CRASH_STOP if self.crash_stop else stop.status) if stop else None,
            "baseline_failed": self.s.proposer.baseline_failed(),
        }


Handler = Callable[[int, FrameType | None], Any]


def _install_signals(handler: Handler) -> dict[signal.Signals, Any]:
    """Ctrl-C, a scheduler's SIGTERM and a closed terminal's SIGHUP stop the study at the next step of its loop (a
    SIGHUP that ``nohup`` ignores stays ignored)."""
    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue
        old[sig] = signal.signal(sig, handler)
    return old


def _restore_signals(old: dict[signal.Signals, Any]) -> None:
    for sig, h in old.items():
        signal.signal(sig, h)
