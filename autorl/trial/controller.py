"""The study loop: propose, commit, launch, watch, judge, record — until the budget ends.

One trial, in order (each step is one function below):

1. ``propose``  — the baseline first (``baseline_repeats`` seeds), then OOM retries,
   then the strategy (hypotheses, plain Optuna TPE, or random) picks values; a proposal
   whose planned duration (``autorl.trial.plan``) does not fit in the budget left is not started;
2. ``prepare``  — worktree at the study's base commit, branch ``attempt-NN-slug``,
   the recipe edited in place, a commit saying why, tag ``attempt-NN-start``;
3. ``execute``  — the backend launches the run outside this process; ``runner.watch``
   follows its metrics, applies early abort and the pruner, the timeout, the budget;
4. ``finish``   — objective, verdict against the baseline (``verdict.judge``) or crash
   diagnosis (``triage.classify``), Optuna told, one ledger transaction, results
   file and research-log entry committed on the branch, tag ``attempt-NN-end``,
   worktree removed.

The controller never imports torch: trials are child processes or Ray jobs.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autorl import gitops
from autorl.backends.base import TrialSpec, get_backend, kill_group
from autorl.budget import format_duration
from autorl.errors import RecipeError, UserError
from autorl.judge import silent, triage, verdict
from autorl.judge.abort import check_abort
from autorl.judge.prune import should_prune
from autorl.ledger import Ledger, ledger_guard
from autorl.metrics import RunMetrics
from autorl.present.live import PlainView
from autorl.recipe import (Recipe, apply_override, check_base, dump_values, editable_text, read_recipe_text,
                           recipe_from_text, set_train_values, validate_recipe)
from autorl.search.hypotheses_strategy import incumbent_row, library_for
from autorl.search.proposal import Proposal
from autorl.search.proposer import Proposer
from autorl.trial import lifecycle, plan
from autorl.trial.result import TrialResult
from autorl.trial.slots import Slots, stop_job
from autorl.trial.watch import Outcome, Stop, Watch
from autorl.workspace import Workspace, default_recipe_source


@dataclass
class RunOptions:
    """What `autorl run` was asked to do."""

    recipe_path: Path | None = None
    overrides: list[str] = field(default_factory=list)
    budget_s: float = 3600.0
    max_trials: int | None = None
    strategy: str | None = None  # None: hypotheses for a new study, the study's own on --resume
    resume: bool = False
    study_name: str | None = None
    allow_overrun: bool = False
    seed: int = 0
    parallel: int = 1
    ray_address: str | None = None


@dataclass
class TrialContext:
    """A prepared trial: the proposal, its opened attempt and its recipe (None with the error if invalid)."""

    proposal: Proposal
    attempt: lifecycle.Attempt
    recipe: Recipe | None
    error: str | None = None


class Controller:
    """Runs one study in one workspace."""

    def __init__(self, ws: Workspace, opts: RunOptions, view: PlainView | None = None):
        self.ws, self.opts, self.view = ws, opts, view or PlainView()
        self.stop_reason: Stop | None = None
        self.started = time.time()
        self.deadline = self.started + opts.budget_s
        self._backends: dict[str, Any] = {}
        self._held: Proposal | None = None  # the proposal last put back for not fitting (logged once)

    # ---- the loop -------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self._setup()
        old = _install_signals(self._on_signal)
        try:
            self._loop()
            self._release_unstarted()
        finally:
            _restore_signals(old)
            self._close_backends()
            self.ledger.update_study(self.study["id"], status="stopped")
            self.view.close()
        return self.summary()

    def _setup(self) -> None:
        """Check every input first (recipe, flags, hypothesis files, patches); only then write the ledger and git."""
        ledger_guard(self.ws.ledger_path)
        resumed = self._resumed_study()
        base_recipe, text, rel = self._base_recipe()
        self.base = base_recipe or validate_recipe(_yaml(resumed["recipe"]), source=resumed["recipe_path"])
        self._check_library(self.base)
        self.ws.ensure_ignored()
        self.ledger = Ledger(self.ws.ledger_path)
        self.study = self._open_study(base_recipe, text, rel)
        self.base_text, self.recipe_rel = self.study["recipe"], self.study["recipe_path"]
        self.proposer = Proposer(self.ws, self.ledger, self.study, self.base, self.opts)
        self._carry_base()
        self.slots = Slots(self.opts.parallel, self.opts.ray_address)
        self._recover()
        if self.opts.resume:
            self._requeue()
        self._prepare()
        self.view.study(f"study {self.study['name']}: {self.opts.strategy}, budget {format_duration(self.opts.budget_s)}, "
                        f"backend {self.base.backend}, recipe {self.recipe_rel}")

    def _resumed_study(self) -> dict | None:
        """On --resume: the study row, with the study's own settings taken over (a conflicting flag is an error)."""
        if not self.opts.resume:
            self.opts.strategy = self.opts.strategy or "hypotheses"
            return None
        if not self.ws.ledger_path.exists():
            raise UserError(f"no ledger at {self.ws.ledger_path} to resume: start a study with `autorl run`")
        study = Ledger(self.ws.ledger_path).study(self.opts.study_name)
        check_resume_flags(self.opts, study)
        self.opts.strategy = study["strategy"]
        return study

    def _check_library(self, recipe: Recipe) -> None:
        """Load the workspace's hypothesis library (and its patches) now, so a bad file stops the study unwritten."""
        if self.opts.strategy == "hypotheses":
            library_for(self.ws, recipe.backend)

    def _prepare(self) -> None:
        """Let the backend build what every trial shares (the embedded base model) outside any trial."""
        backend = self._backend(self.base.backend)
        t0 = time.time()
        code = backend.prepare(self.base, self.ws.cache, self.ws.runs / "prepare")
        if code is not None:
            self.ledger.event(self.study["id"], None, "prepare", f"exit {code} in {time.time() - t0:.1f} s")

    def _loop(self) -> None:
        """Keep up to ``parallel`` trials in flight; finish each as it ends."""
        running: dict[int, _Running] = {}
        self.launched, self.done_before = 0, len(self.ledger.trials(self.study["id"], kind="trial"))
        while True:
            opened = self._fill(running)
            if not running and not opened:  # a trial that failed before launch is finished: ask again
                break
            for slot, r in list(running.items()):
                out = r.watch.step()
                if out is not None:
                    self.finish(r.ctx, out)
                    del running[slot]
            time.sleep(0.05 if running else 0)

    def _fill(self, running: dict[int, "_Running"]) -> int:
        """Start trials in the free slots; returns how many were opened (launched, or finished at once)."""
        opened = 0
        for slot in [s for s in range(self.opts.parallel) if s not in running]:
            if not self._may_start():
                break
            proposal = self.proposer.next()
            if proposal is None:
                break
            if not self._fits(proposal):
                self._hold(proposal)
                break
            ctx = self.prepare(proposal)
            self.launched += 1
            opened += 1
            r = self.launch(ctx, slot) if ctx.error is None else None
            if isinstance(r, _Running):
                running[slot] = r
            else:
                self.finish(ctx, r or Outcome("config-error", None, ctx.error or "not launched"))
        return opened

    def _may_start(self) -> bool:
        if self.stop_reason is not None or (self.proposer.baseline_failed() and not self._baseline_retry_queued()):
            return False
        if self.opts.max_trials is not None and self.done_before + self.launched >= self.opts.max_trials:
            return False
        return time.time() < self.deadline

    def _baseline_retry_queued(self) -> bool:
        """A crashed baseline's retry (triage's action) is waiting: it runs before the study gives up."""
        numbers = self._baseline_numbers()
        return any(p.proposer == "retry" and p.retry_of in numbers for p in self.proposer.pending)

    def _baseline_numbers(self) -> set[int]:
        return {r["number"] for r in self.ledger.trials(self.study["id"], proposer="baseline")}

    def _is_baseline(self, p: Proposal) -> bool:
        """The baseline, or the retry of a crashed baseline (which stands in for it)."""
        return p.proposer == "baseline" or (p.proposer == "retry" and p.retry_of in self._baseline_numbers())

    def _fits(self, p: Proposal) -> bool:
        left = self.deadline - time.time()
        return left > 0 and (self.opts.allow_overrun or left >= self.expected_trial_s(p))

    def expected_trial_s(self, p: Proposal | None = None) -> float:
        """What trial ``p`` is planned to take (autorl.trial.plan): this study's finished trials scaled by its work,
        times a margin measured on them; the recipe's ``timeout_s`` is the hard cap."""
        return self._estimate(p).seconds

    def _estimate(self, p: Proposal | None) -> plan.Estimate:
        took = [plan.Took(plan.work(r.get("params") or {}), r["finished"] - r["started"])
                for r in self.ledger.trials(self.study["id"], kind="trial", status="complete")
                if r.get("finished") is not None and r.get("started") is not None]
        values = {**self.base.train, **(p.values if p is not None else {})}
        return plan.expected(took, plan.work(values), self.base.timeout_s, self.opts.budget_s)

    def _hold(self, p: Proposal) -> None:
        """A proposal that does not fit goes back to the front of the queue (a trial ending may still free time)."""
        self.proposer.pending.insert(0, p)
        if p is not self._held:
            self._held = p
            self.ledger.event(self.study["id"], None, "budget", f"next trial {p.slug} not started: planned at "
                              f"{self._estimate(p).describe()}, {max(self.deadline - time.time(), 0):.0f} s left")

    def _release_unstarted(self) -> None:
        """Proposals drawn but never started are not trials: each is logged, and its Optuna trial (if any) is told
        FAIL rather than left RUNNING, with its values enqueued again so that a resumed study proposes them first."""
        for p in self.proposer.pending:
            note = "; `autorl run --resume` runs it first" if p.proposer in ("confirm", "retry") else ""
            if p.optuna_study is not None and p.optuna_number is not None:
                note = self.proposer.search(p.optuna_study).release(p.optuna_number, again=p.proposer != "baseline")
            self.ledger.event(self.study["id"], None, "not-started",
                              f"{p.proposer} proposal {p.slug} not started when the study stopped{note}")
        self.proposer.pending.clear()

    # ---- study and recovery -----------------------------------------------------
    def _base_recipe(self) -> tuple[Recipe, str, str]:
        if self.opts.resume:
            return None, "", ""  # type: ignore[return-value]
        path = self.opts.recipe_path or _workspace_default(self.ws)
        source = read_recipe_text(path)  # read once: the validated model and the committed text both come from it
        recipe = recipe_from_text(source, path, self.opts.overrides)
        check_base(recipe, path)
        self._backend(recipe.backend).check(recipe, self.ws.root)
        text = _apply_text_overrides(editable_text(source), self.opts.overrides)
        try:
            rel = self.ws.rel(Path(path))
        except ValueError:
            rel = f"recipes/{Path(path).name}"
        return recipe, text, rel

    def _open_study(self, recipe: Recipe | None, text: str, rel: str) -> dict:
        if self.opts.resume:
            study = self.ledger.study(self.opts.study_name)
            self.ledger.update_study(study["id"], status="running")
            return study
        name = self.opts.study_name or f"{gitops.slugify(recipe.name)}-{time.strftime('%Y%m%d-%H%M%S')}"
        if self.ledger.has_study(name):
            raise UserError(f"study {name} exists already: continue it with `autorl run --resume --study {name}`")
        sid = self.ledger.create_study(name=name, recipe_path=rel, recipe=text, base_sha=gitops.head_sha(self.ws.root),
                                       strategy=self.opts.strategy, budget_s=self.opts.budget_s, optuna_study=name)
        return self.ledger.study(study_id=sid)

    def _recover(self) -> None:
        """After a kill: stop orphaned runs, mark their trials interrupted, clean worktrees."""
        for row in self.ledger.trials(self.study["id"], status="running"):
            if row.get("pid"):
                kill_group(int(row["pid"]), grace_s=2.0)
            if row.get("job_id") and row.get("job_address"):
                stop_job(row["job_address"], row["job_id"])
            self.ledger.update_trial(row["id"], event="recovered", status="interrupted", finished=time.time(),
                                     reason="the controller stopped during this trial; recovered on resume")
            gitops.remove_worktree(self.ws.root, self.ws.worktrees / row["attempt"])
        self.proposer.recover()

    def _requeue(self) -> None:
        """On resume: judge candidates whose confirmation runs all ended, then queue again the confirmations and
        crash retries the stopped controller had queued but not run (they run before anything new)."""
        for row in self.ledger.open_candidates(self.study["id"]):
            self._maybe_confirm(row["number"])
        queued = self.proposer.requeue()
        if queued:
            line = (f"resume: {len(queued)} queued run(s) the stopped study had not run go first: "
                    + ", ".join(p.slug for p in queued))
            self.ledger.event(self.study["id"], None, "requeued", line)
            self.view.line(line)

    # ---- the base recipe: what the recipe as written needed to run at all ------------------------------------
    def _carry_base(self) -> None:
        """Build trials from the recipe as written plus what its reduced baseline retries changed: after the
        baseline ran out of memory and its retry with a smaller value worked, every later trial (and baseline
        repeat) starts from that value. Derived from the ledger's rows and kept on the study (``base_changes``),
        so a resumed study, or one stopped between the retry's end and this record, carries it too."""
        changes, lines = {}, []
        for row in self.ledger.baselines(self.study["id"]):
            carried, line = self._carried_by(row)
            changes.update(carried)
            lines += [line] if carried else []
        if not changes:
            return
        if changes != (self.study.get("base_changes") or {}):
            self.ledger.set_base_changes(self.study["id"], changes, lines[-1])
            self.study = self.ledger.study(study_id=self.study["id"])
        self.base_text = set_train_values(self.study["recipe"], changes)
        self.base = validate_recipe(_yaml(self.base_text), source=self.recipe_rel)
        self.proposer.base = self.base

    def _carried_by(self, row: dict) -> tuple[dict[str, Any], str]:
        """What a completed retry of a crashed baseline changed against it (nothing for any other row), and the
        line that says so."""
        if row.get("proposer") != "retry" or row.get("status") != "complete" or row.get("retry_of") is None:
            return {}, ""
        crashed = self.ledger.trial(row["retry_of"])
        before = crashed.get("params") or {}
        changes = {k: v for k, v in (row.get("params") or {}).items() if k != "seed" and before.get(k) != v}
        if not changes:  # a retry with the same values (a transient crash) changes nothing
            return {}, ""
        line = (f"the study's base recipe now has {dump_values(changes)} instead of "
                f"{dump_values({k: before.get(k) for k in changes})}: {crashed['attempt']} crashed "
                f"({crashed.get('crash_category')}) and {row['attempt']}, its reduced retry, completed; "
                "later trials and baseline repeats start from it")
        return changes, line

    def _carry_note(self, ctx: TrialContext, result: TrialResult) -> str:
        """The line a completed reduced retry of the baseline adds to its own reason."""
        if result.status != "complete" or ctx.proposal.retry_of is None or not self._is_baseline(ctx.proposal):
            return ""
        row = {**self.ledger.trial(ctx.attempt.number), "status": result.status}
        return self._carried_by(row)[1]

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stop_reason = Stop("interrupted", f"stopped by {signal.Signals(signum).name}")

    # ---- one trial (the lifecycle in autorl.trial.lifecycle) ------------------------------------------------
    def prepare(self, p: Proposal) -> TrialContext:
        """Open the attempt: branch, worktree, the proposal's recipe and patch committed, tag, ledger row."""
        values = _fixed_eval_protocol(p.values, self.base)
        text = set_train_values(self.base_text, values) if values else self.base_text
        recipe, error = self._recipe_of(text)
        patch_error: list[str] = []
        a = lifecycle.open_attempt(
            self.ws, self.ledger, rev=self.study["base_sha"], slug=p.slug, files={self.recipe_rel: text},
            message=_commit_message(p, self.base.train), changed_files=lambda wt: self._apply_patch(wt, p, patch_error),
            study_id=self.study["id"], proposer=p.proposer, hypothesis=p.hypothesis, why=p.why, changed=p.values,
            params=recipe.train if recipe else None, seed=(recipe.train.get("seed") if recipe else None),
            optuna_number=p.optuna_number, retry_of=p.retry_of, parent=p.parent, confirms=p.confirms)
        self.view.trial_start(a.name, p.why)
        return TrialContext(p, a, recipe, error or (patch_error[0] if patch_error else None))

    def _recipe_of(self, text: str) -> tuple[Recipe | None, str | None]:
        try:
            return validate_recipe(_yaml(text), source=self.recipe_rel), None
        except RecipeError as exc:
            return None, str(exc)

    def _apply_patch(self, wt: Path, p: Proposal, errors: list[str]) -> list[str]:
        """Apply the hypothesis' patch; one that is missing or does not apply fails this trial, not the study."""
        if not p.patch:
            return []
        patch = Path(p.patch)
        if not patch.is_file():
            errors.append(f"patch {patch} of hypothesis {p.hypothesis} not found: "
                          "add it to patches/ or fix the hypothesis")
            return []
        try:
            return gitops.apply_patch(wt, patch)
        except Exception as exc:  # git apply's refusal, whatever its wrapper: the trial records it
            first = next((x.strip() for x in str(exc).splitlines() if "error:" in x), str(exc).splitlines()[0])
            errors.append(f"patch {patch.name} of hypothesis {p.hypothesis} does not apply to the study's base commit "
                          f"({first[:160]}): update the patch or the hypothesis")
            return []

    def launch(self, ctx: TrialContext, slot: int = 0) -> "_Running | Outcome":
        """Start the trial on its backend; a Watch over it, or the Outcome if it never started."""
        recipe, a = ctx.recipe, ctx.attempt
        backend = self._backend(recipe.backend)
        spec = TrialSpec(attempt=a.name, recipe=recipe, worktree=a.worktree, run_dir=a.run_dir, cache_dir=self.ws.cache)
        try:
            handle = lifecycle.launch(backend, spec, start=lambda plan: self.slots.start(backend, plan),
                                      assign=lambda plan: self.slots.assign(plan, slot, recipe))
        except UserError as exc:
            return Outcome("config-error", None, str(exc))
        self.ledger.update_trial(a.row_id, pid=handle.pid, job_id=handle.job_id, job_address=self.slots.address)
        state = _WatchState(ctx, self, time.time())
        w = lifecycle.watch_run(handle, recipe, deadline=None if self.opts.allow_overrun else self.deadline,
                                on_records=state.on_records, external=lambda: self.stop_reason)
        return _Running(ctx, w)

    def planned_steps(self, recipe: Recipe) -> int:
        """The last step a run of ``recipe`` logs, from this study's backend instance (0 when unknown)."""
        return self._backend(recipe.backend).planned_steps(recipe)

    def _backend(self, name: str):
        """One backend instance per study (a Ray head, if any, is started once)."""
        if name not in self._backends:
            self._backends[name] = get_backend(name, ray_address=self.opts.ray_address)
        return self._backends[name]

    def _close_backends(self) -> None:
        for b in self._backends.values():
            b.close()
        if getattr(self, "slots", None) is not None:
            self.slots.close()

    def finish(self, ctx: TrialContext, outcome: Outcome) -> None:
        a, p = ctx.attempt, ctx.proposal
        result = TrialResult(number=a.number, **self._judge(ctx, outcome))
        action = self._crash_action(ctx, result)
        carry = self._carry_note(ctx, result)
        if action or carry:
            result = result.model_copy(update={"crash_action": action.kind if action else None,
                                               "reason": "; ".join(x for x in (result.reason, carry) if x)})
        self.proposer.tell(p, result, action.kind if action else None)
        final = outcome.metrics.evals[-1] if outcome.metrics.evals else None
        summary = {"attempt": a.name, "proposer": p.proposer, "hypothesis": p.hypothesis, "why": p.why,
                   "changed": p.values, **result.ledger_values(), "final_eval": _strip_items(final)}
        message = f"{a.name}: {result.headline()}\n\n{result.reason}"
        lifecycle.close_attempt(self.ws, self.ledger, a, result.ledger_values(), summary, message,
                                log_entry=_log_entry(ctx, result))
        self.view.verdict({"attempt": a.name, **result.ledger_values()})
        if result.confirmation == "candidate" and self.base.verdict.confirm_runs > 0:
            self.proposer.queue_confirmation(p, a.number, self.base.verdict.confirm_runs)
        if p.confirms is not None:
            self._maybe_confirm(p.confirms)
        if action:
            self._act(ctx, action)
        if carry:
            self.view.line(f"{a.name}: {carry}")
            self._carry_base()

    def _crash_action(self, ctx: TrialContext, r: TrialResult) -> triage.Action | None:
        """What to do about a crashed trial (``triage.decide_action``, rules in crash_rules.yaml)."""
        if r.verdict != "crash" or not r.crash_category:
            return None
        d = triage.Diagnosis(category=r.crash_category, root_cause_line=r.root_cause or "", remedy=r.remedy or "",
                             signature=r.crash_signature or "")
        earlier = self.ledger.trials(self.study["id"], verdict="crash", crash_signature=d.signature)
        p = ctx.proposal
        return triage.decide_action(d, is_baseline=self._is_baseline(p), retries_so_far=int(p.retry_of is not None),
                                    signature_count=len(earlier) + 1, run_dir=ctx.attempt.run_dir,
                                    log_text=_read(ctx.attempt.run_dir / "train.log"))

    def _act(self, ctx: TrialContext, action: triage.Action) -> None:
        """Record what was done and why (ledger event, live view); a stop ends the study."""
        reason = action.reason + self._baseline_note(ctx.proposal, action)
        line = f"{ctx.attempt.name}: {action.kind}: {reason}"
        self.ledger.event(self.study["id"], ctx.attempt.row_id, "crash-action", line)
        self.view.line(line)
        if action.kind == "stop" and self.stop_reason is None:
            self.stop_reason = Stop("crash-stop", f"{ctx.attempt.name}: {action.reason}")

    def _baseline_note(self, p: Proposal, action: triage.Action) -> str:
        """What a crash of the baseline means for the study: retried first, else the end of it."""
        if not self._is_baseline(p) or action.kind == "stop":
            return ""
        if action.kind.startswith("retry") and self._baseline_retry_queued():
            return "; the baseline is retried before the study goes on"
        return "; the baseline failed, so the study ends here"

    # ---- judging -------------------------------------------------------------------
    def _judge(self, ctx: TrialContext, outcome: Outcome) -> dict[str, Any]:
        now = time.time()
        row: dict[str, Any] = {"finished": now, "duration_s": outcome.wall_s, "exit_code": outcome.exit_code,
                               "status": outcome.status, "reason": outcome.reason,
                               # set when the attempt opened; the result rewrites every column it has
                               "parent": ctx.proposal.parent, "confirms": ctx.proposal.confirms}
        recipe = ctx.recipe or self.base
        m = outcome.metrics
        nonfinite = m.has_nonfinite()
        quiet = silent.check(m.steps, m.summary, _read(ctx.attempt.run_dir / "train.log"), self.planned_steps(recipe),
                             evals=m.evals) if outcome.status == "complete" else None
        if quiet:  # exited 0 but broken (NaN metrics, collapsed output, no step, a constant reward): never scored
            row.update(status="crash")
        if row["status"] == "complete":  # a run that logged NaN/inf is never scored, even with exit 0
            row["objective"] = lifecycle.objective_value(m, recipe)
            if row["objective"] is None:
                row.update(status="crash", reason=f"exited 0 without the objective metric {recipe.objective.metric}")
        row["flags"] = [f.model_dump() for f in verdict.flags(m.steps, m.evals, m.summary, self.planned_steps(recipe),
                                                                  abort=recipe.abort)]
        if row["status"] == "config-error":
            row.update(verdict="crash", crash_category="config_error", root_cause=outcome.reason,
                       crash_signature=triage.signature("config_error", outcome.reason),
                       remedy="fix the recipe or the environment named in the reason; nothing was launched")
        elif row["status"] in ("crash", "hang", "timeout"):
            row.update(status="crash", verdict="crash", **(quiet.fields() if quiet else self._diagnose(ctx, outcome, nonfinite)))
        elif row["status"] == "pruned":
            row["verdict"] = "pruned"
            if (outcome.abort or {}).get("rule") == "nonfinite":
                row.update({**self._diagnose(ctx, outcome, nonfinite or "step"), "reason": outcome.reason})
        elif row["status"] == "complete" and ctx.proposal.proposer != "confirm" and not self._is_baseline(ctx.proposal):
            row.update(self._compare(ctx.proposal, m, recipe, row["objective"]))
        return row

    def _diagnose(self, ctx: TrialContext, outcome: Outcome, nonfinite: str | None) -> dict[str, Any]:
        log = _read(ctx.attempt.run_dir / "train.log")
        watchdog = {"hang": "silence", "timeout": "timeout"}.get(outcome.status)
        d = triage.classify(log, exit_code=outcome.exit_code, watchdog=watchdog, metrics_nonfinite=nonfinite)
        return {"crash_category": d.category, "crash_signature": d.signature, "root_cause": d.root_cause_line,
                "remedy": d.remedy, "reason": outcome.reason or f"{d.category}: {d.root_cause_line[:120]}"}

    def _compare(self, p: Proposal, m: RunMetrics, recipe: Recipe, value: float) -> dict[str, Any]:
        """The verdict against the parent (what counts) and the gain over the baseline (reported apart)."""
        base = self._runs(self.proposer.baseline_runs(), recipe)
        if base is None:
            return {"verdict": "flat", "reason": "no completed baseline to compare with"}
        parent = self._runs(self._parent_metrics(p.parent), recipe) or base
        trial = self._runs([m], recipe)
        noise = self._noise(recipe, p.parent)
        c = verdict.credit(trial, parent, base, recipe.verdict, recipe.objective.direction, noise)
        v, gap = c.vs_parent, self._gap_to_best(value, recipe)
        whom = f"parent {p.parent:02d}" if p.parent is not None else "the baseline"
        note = f" vs {whom}" + (f"; {c.vs_baseline.delta:+.4f} over the baseline" if p.parent is not None else "")
        note += f"; {gap:+.4f} vs the best so far" if gap is not None else ""
        out = {"verdict": v.verdict, "delta": v.delta, "ci_low": v.ci_low, "ci_high": v.ci_high, "method": v.method,
               "n_items": v.n, "reason": v.explanation + note, "gap_to_best": gap,
               "gain_vs_baseline": c.vs_baseline.delta}
        if v.verdict == "improved":
            out["confirmation"] = "candidate"
        return out

    def _runs(self, metrics: list[RunMetrics], recipe: Recipe) -> verdict.Runs | None:
        values = [lifecycle.objective_value(m, recipe) for m in metrics]
        keep = [(v, m) for v, m in zip(values, metrics) if v is not None]
        if not keep:
            return None
        items = [verdict.objective_items(m.evals, recipe.objective) for _, m in keep]
        return verdict.Runs(values=[v for v, _ in keep], items=items if all(items) else None)

    def _metrics(self, row: dict) -> RunMetrics:
        cache = self.__dict__.setdefault("_metrics_cache", {})
        if row["id"] not in cache:
            cache[row["id"]] = RunMetrics(self.ledger.metrics(row["id"]))
        return cache[row["id"]]

    def _parent_metrics(self, parent: int | None) -> list[RunMetrics]:
        """The parent's runs: its own and its completed confirmation runs (none for the baseline)."""
        if parent is None:
            return []
        rows = [self.ledger.trial(parent), *self.ledger.confirm_runs(self.study["id"], parent)]
        return [self._metrics(r) for r in rows if r["status"] == "complete"]

    def prune_references(self, parent: int | None) -> list[tuple[str, list[RunMetrics], list[RunMetrics]]]:
        """What a running trial must not be clearly worse than, as (name, runs, replicate runs for the noise):
        its parent (the baseline when it has none) and, once the study has one, the confirmed incumbent, by its
        fresh-seed confirmation runs alone (the run that made it a candidate was picked for looking good). A
        trial clearly behind the best recipe the study has confirmed cannot become the next incumbent, whatever
        it would gain over its own parent. The baseline's runs are the noise replicates of any other reference."""
        baseline, runs = self.proposer.baseline_runs(), self._parent_metrics(parent)
        refs = [(f"its parent {self.ledger.trial(parent)['attempt']}", runs, baseline) if runs
                else ("the baseline", baseline, [])]
        best = incumbent_row(self.ledger.trials(self.study["id"], kind="trial"), self.base.objective.direction)
        if best is not None and best["number"] != parent:
            fresh = [self._metrics(r) for r in self.ledger.confirm_runs(self.study["id"], best["number"], ran=True)
                     if r["status"] == "complete"]
            if fresh:
                refs.append((f"the incumbent {best['attempt']}", fresh, baseline))
        return refs

    def _noise(self, recipe: Recipe, parent: int | None) -> list[list[list[float]]]:
        """Replicate groups for the run-noise estimate: the baseline (if not the parent) and confirmation groups."""
        groups = [] if parent is None else [self.proposer.baseline_runs()]
        groups += [[self._metrics(r) for r in rows] for rows in self.ledger.confirm_groups(self.study["id"]).values()]
        out = []
        for runs in groups:
            items = [verdict.objective_items(m.evals, recipe.objective) for m in runs]
            if len(items) > 1 and all(items):
                out.append(items)
        return out

    def _maybe_confirm(self, candidate: int) -> None:
        """When all of a candidate's confirmation runs have ended: confirmed or rejected, in the ledger."""
        rows = self.ledger.confirm_runs(self.study["id"], candidate, ran=True)  # a stopped one is run again
        need = self.base.verdict.confirm_runs
        if not need or len(rows) < need or any(r["status"] == "running" for r in rows):
            return
        row, recipe = self.ledger.trial(candidate), self.base
        fresh = self._runs([self._metrics(r) for r in rows if r["status"] == "complete"], recipe)
        base = self._runs(self.proposer.baseline_runs(), recipe)
        if fresh is None or base is None:
            self.ledger.set_confirmation(candidate, "rejected", "its confirmation runs did not complete")
            return
        parent = self._runs(self._parent_metrics(row.get("parent")), recipe) or base
        noise = self._noise(recipe, row.get("parent"))
        v = verdict.confirm(fresh, parent, recipe.verdict, recipe.objective.direction, noise)
        state = "confirmed" if v.verdict == "improved" else "rejected"
        self.ledger.set_confirmation(candidate, state, f"{len(fresh.values)} fresh-seed runs: {v.explanation}")
        self.view.study(f"{row['attempt']}: {state} by {len(fresh.values)} fresh-seed runs (gain {v.delta:+.4f}, "
                        f"{verdict.pct(v.level)} CI [{v.ci_low:+.4f}, {v.ci_high:+.4f}])")

    def _gap_to_best(self, value: float, recipe: Recipe) -> float | None:
        """The objective against the best earlier trial of the study (positive = better)."""
        done = [t["objective"] for t in self.ledger.scored(self.study["id"])]
        if not done:
            return None
        sign = 1 if recipe.objective.direction == "maximize" else -1
        return sign * (value - (max(done) if sign > 0 else min(done)))

    def summary(self) -> dict[str, Any]:
        trials = self.ledger.trials(self.study["id"])
        counts: dict[str, int] = {}
        for t in trials:
            key = t.get("verdict") or t.get("status")
            counts[key] = counts.get(key, 0) + 1
        return {"study": self.study["name"], "trials": len(trials), "counts": counts,
                "wall_s": time.time() - self.started, "stopped_by": self.stop_reason.reason if self.stop_reason else None,
                "stop_status": self.stop_reason.status if self.stop_reason else None}


@dataclass
class _Running:
    ctx: TrialContext
    watch: Watch


class _WatchState:
    """Per-trial callback for ``runner.watch``: ledger, view, early abort, pruner."""

    def __init__(self, ctx: TrialContext, ctl: Controller, start: float):
        self.ctx, self.ctl, self.start = ctx, ctl, start
        self.recipe = ctx.recipe

    def on_records(self, records: list[dict], metrics: RunMetrics) -> Stop | None:
        self.ctl.ledger.add_metrics(self.ctx.attempt.row_id, records)
        self._show(metrics)
        rules = self.recipe.abort
        if rules.enabled and not self.ctl._is_baseline(self.ctx.proposal):
            d = check_abort(metrics.steps, rules, self.recipe.train.get("max_grad_norm"))
            if d is not None:
                seen = ", ".join(f"{v:.4g}" for v in d.values)
                return Stop("pruned", f"early abort ({d.rule}): {d.reason} (step {d.step}; values {seen})", d.model_dump())
        return self._prune(records)

    def _prune(self, records: list[dict]) -> Stop | None:
        """Stop when an intermediate eval is clearly worse than the parent's at the same step (autorl.judge.prune)."""
        p = self.ctx.proposal
        key, last = self.recipe.objective.metric, self.ctl.planned_steps(self.recipe)
        for rec in records:  # the final eval is the result, not an intermediate value: never pruned on it
            if rec.get("type") != "eval" or not isinstance(rec.get(key), (int, float)):
                continue
            if not 0 < rec.get("step", 0) < (last or 1e18):
                continue
            self.ctl.proposer.report(p, rec[key], int(rec["step"]))  # Optuna's NopPruner: for the dashboard only
            if self.recipe.abort.pruner and p.proposer != "confirm" and not self.ctl._is_baseline(p):
                d = self._clearly_worse(rec)
                if d is not None:
                    detail = {"rule": "clearly_worse", **d.model_dump()}
                    return Stop("pruned", f"noise-aware pruner: {d.reason}", detail)
        return None

    def _clearly_worse(self, rec: dict):
        """The first reference (parent, then the confirmed incumbent) this eval is clearly worse than, or None."""
        items_key = _items_key(self.recipe.objective.metric)
        if items_key is None or not rec.get(items_key):
            return None
        step = int(rec["step"])
        for label, runs, replicates in self.ctl.prune_references(self.ctx.proposal.parent):
            at_step = _all_at(runs, items_key, step)
            if not at_step:
                continue
            noise = _all_at(replicates, items_key, step)
            d = should_prune(step, rec[items_key], at_step, self.recipe.verdict, self.recipe.objective.direction,
                             [noise] if len(noise) > 1 else [], than=label)
            if d is not None:
                return d
        return None

    def _show(self, m: RunMetrics) -> None:
        last = m.steps[-1] if m.steps else {}
        evals = m.series(self.recipe.objective.metric)
        now = time.time()
        self.ctl.view.progress(self.ctx.attempt.name, int(last.get("step", 0)), self.ctl.planned_steps(self.recipe),
                               last.get("reward_mean"), evals[-1] if evals else None,
                               now - self.ctl.started, self.ctl.deadline - now)


# ---- helpers -----------------------------------------------------------------------------
def check_resume_flags(opts: RunOptions, study: dict) -> None:
    """--resume continues the study as it was started: a flag that would change it is an error."""
    if opts.overrides:
        raise UserError(f"--set does not apply on --resume: study {study['name']} keeps its recipe; "
                        "start a new study to change values")
    if opts.recipe_path is not None:
        raise UserError("--resume continues a study with its own recipe: drop the RECIPE argument")
    if opts.strategy and opts.strategy != study["strategy"]:
        raise UserError(f"study {study['name']} uses --strategy {study['strategy']}: drop --strategy "
                        f"{opts.strategy}, or start a new study with it")


def _fixed_eval_protocol(values: dict[str, Any], base: Recipe) -> dict[str, Any]:
    """A trial that changes the generation limit keeps the study's eval limit (the eval protocol is fixed)."""
    if base.backend != "embedded" or "max_new_tokens" not in values or base.train.get("eval_max_new_tokens"):
        return values
    return {**values, "eval_max_new_tokens": base.train.get("max_new_tokens")}


def _items_key(metric: str) -> str | None:
    parts = metric.split("/")
    return f"eval/{parts[1]}/items" if len(parts) == 3 and parts[0] == "eval" and parts[2] == "greedy_pass@1" else None


def _all_at(runs: list[RunMetrics], key: str, step: int) -> list[list[float]]:
    """Each run's per-item results at ``step`` ([] when any run lacks them)."""
    got = [_items_at(m, key, step) for m in runs]
    return got if got and all(got) else []


def _items_at(m: RunMetrics, key: str, step: int) -> list[float] | None:
    for e in m.evals:
        if e.get("step") == step and e.get(key):
            return e[key]
    return None


def _workspace_default(ws: Workspace) -> Path:
    local = ws.root / "recipes" / "default.yaml"
    return local if local.is_file() else default_recipe_source()


def _apply_text_overrides(text: str, overrides: list[str]) -> str:
    """Bake ``--set`` overrides into the recipe text the study commits.

    Train values are edited in place (comments kept); any other key rewrites the
    file from its parsed form.
    """
    if not overrides:
        return text
    import yaml

    data: dict = {}
    for item in overrides:
        apply_override(data, item)
    if set(data) == {"train"}:
        return set_train_values(text, data["train"])
    full = yaml.safe_load(text) or {}
    for item in overrides:
        apply_override(full, item)
    return yaml.safe_dump(full, sort_keys=False)


def _yaml(text: str) -> dict:
    import yaml

    return yaml.safe_load(text)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _strip_items(rec: dict | None) -> dict | None:
    return {k: v for k, v in rec.items() if not k.endswith("/items")} if rec else None


def _commit_message(p: Proposal, base: dict[str, Any]) -> str:
    changes = "\n".join(f"- {k}: {base.get(k)!r} -> {v!r}" for k, v in p.values.items()) or "- none (the recipe as written)"
    hyp = f"hypothesis: {p.hypothesis}\n" if p.hypothesis else ""
    return f"{p.why}\n\nproposer: {p.proposer}\n{hyp}changed values (previous -> tested):\n{changes}\n"


def _log_entry(ctx: TrialContext, r: TrialResult) -> str:
    p = ctx.proposal
    lines = [f"\n## {ctx.attempt.name}\n", f"- proposer: {p.proposer}" + (f", hypothesis {p.hypothesis}" if p.hypothesis else ""),
             f"- why: {p.why}", f"- changed: {dump_values(p.values) or 'nothing (baseline)'}",
             f"- status: {r.status}; verdict: {r.headline() if r.verdict else '-'}"]
    if r.ci_low is not None:
        lines.append(f"- 95% interval for delta: [{r.ci_low:+.4f}, {r.ci_high:+.4f}] ({r.method})")
    if r.crash_category:
        lines.append(f"- crash: {r.crash_category}: `{r.root_cause}`; remedy: {r.remedy}")
    for f in r.flags:
        lines.append(f"- flag {f['name']}: {f['evidence']}")
    return "\n".join(lines) + "\n"

def _install_signals(handler) -> dict:
    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        old[sig] = signal.signal(sig, handler)
    return old


def _restore_signals(old: dict) -> None:
    for sig, h in old.items():
        signal.signal(sig, h)
