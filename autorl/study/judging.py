"""A finished trial judged: its status and objective, its flags, and then one of

- a crash's diagnosis (``autorl.study.crash``), also for a run that exited 0 but is broken (``autorl.judge.silent``:
  NaN metrics, collapsed output, no step, a constant reward; never scored);
- pruned (early abort or the noise-aware pruner);
- the verdict against its parent, with the gain over the baseline apart (``autorl.judge.evidence`` assembles the
  runs, ``autorl.judge.verdict`` judges them); an improvement is only a candidate until fresh seeds confirm it
  (``confirm``), and a confirmed one must pass the hack gate (``gated``) or it is suspect. The baseline's runs and
  confirmation runs get no verdict of their own.
"""

from __future__ import annotations

import time
from typing import Any

from autorl.judge import calibrate, silent, triage, verdict
from autorl.judge.evidence import objective_value
from autorl.judge.result import TrialResult
from autorl.ledger import Trial
from autorl.metrics import RunMetrics
from autorl.recipe import Recipe
from autorl.runs.watch import Outcome
from autorl.search.proposal import Proposal
from autorl.states import Confirmation, CrashCategory, Gate, Proposer, TrialStatus, Verdict
from autorl.study import crash
from autorl.study.state import StudyState, TrialContext

CONFIG_ERROR_REMEDY = "fix the recipe or the environment named in the reason; the trial never trained"


def result_row(s: StudyState, ctx: TrialContext, outcome: Outcome) -> dict[str, Any]:
    """The ledger columns of a finished trial (``TrialResult``'s fields)."""
    recipe = ctx.recipe or s.base
    m = outcome.metrics
    nonfinite = m.has_nonfinite()
    status, reason, objective = outcome.status, outcome.reason, None
    quiet = (
        silent.check(m.steps, m.summary, crash.train_log(ctx), s.backend.planned_steps(recipe), evals=m.evals)
        if status == TrialStatus.COMPLETE
        else None
    )
    if quiet:  # exited 0 but broken (NaN metrics, collapsed output, no step, a constant reward): never scored
        status = TrialStatus.CRASH
    if status == TrialStatus.COMPLETE:  # a run that logged NaN/inf is never scored, even with exit 0
        objective = objective_value(m, recipe)
        if objective is None:
            status, reason = TrialStatus.CRASH, f"exited 0 without the objective metric {recipe.objective.metric}"
            quiet = silent.missing_objective(m.steps, m.evals, recipe.objective.metric)
    columns: dict[str, Any] = {
        "finished": time.time(),
        "duration_s": outcome.wall_s,
        "exit_code": outcome.exit_code,
        "status": status,
        "reason": reason,
        # set when the attempt opened; the result rewrites every column it has
        "parent": ctx.proposal.parent,
        "confirms": ctx.proposal.confirms,
        "objective": objective,
        "flags": [
            f.model_dump()
            for f in verdict.flags(m.steps, m.evals, m.summary, s.backend.planned_steps(recipe), abort=recipe.abort)
        ],
    }
    columns.update(_by_status(s, ctx, outcome, status, objective, nonfinite, quiet))
    return columns


def _by_status(
    s: StudyState,
    ctx: TrialContext,
    outcome: Outcome,
    status: TrialStatus,
    objective: float | None,
    nonfinite: str | None,
    quiet: silent.SilentFailure | None,
) -> dict[str, Any]:
    """The columns that depend on how the trial ended: a crash's triage (or the silent failure that made a run
    that exited 0 one), a prune, or the verdict."""
    if status == TrialStatus.CONFIG_ERROR:
        return {
            "verdict": Verdict.CRASH,
            "crash_category": CrashCategory.CONFIG_ERROR,
            "root_cause": outcome.reason,
            "crash_signature": triage.signature(CrashCategory.CONFIG_ERROR, outcome.reason),
            "remedy": CONFIG_ERROR_REMEDY,
        }
    if status in (TrialStatus.CRASH, TrialStatus.HANG, TrialStatus.TIMEOUT):
        return {
            "status": TrialStatus.CRASH,
            "verdict": Verdict.CRASH,
            **(quiet.fields() if quiet else crash.diagnose(ctx, outcome, nonfinite, s.ws)),
        }
    if status == TrialStatus.PRUNED:
        if (outcome.abort or {}).get("rule") == "nonfinite":
            return {
                "verdict": Verdict.PRUNED,
                **crash.diagnose(ctx, outcome, nonfinite or "step", s.ws),
                "reason": outcome.reason,
            }
        return {"verdict": Verdict.PRUNED}
    p = ctx.proposal
    if status == TrialStatus.COMPLETE and p.proposer != Proposer.CONFIRM and not s.proposer.is_baseline(p):
        assert objective is not None  # a complete trial has its objective (else it is a crash)
        return compare(s, p, outcome.metrics, ctx.recipe or s.base, objective)
    return {}


def compare(s: StudyState, p: Proposal, m: RunMetrics, recipe: Recipe, value: float) -> dict[str, Any]:
    """The verdict against the parent (what counts) and the gain over the baseline (reported apart)."""
    c = s.evidence.credit(m, p.parent, recipe)
    if c is None:
        return {"verdict": Verdict.FLAT, "reason": "no completed baseline to compare with"}
    v, gap = c.vs_parent, gap_to_best(s, value, recipe)
    whom = f"parent {p.parent:02d}" if p.parent is not None else "the baseline"
    note = f" vs {whom}" + (f"; {c.vs_baseline.delta:+.4f} over the baseline" if p.parent is not None else "")
    note += f"; {gap:+.4f} vs the best so far" if gap is not None else ""
    out: dict[str, Any] = {
        "verdict": v.verdict,
        "delta": v.delta,
        "ci_low": v.ci_low,
        "ci_high": v.ci_high,
        "method": v.method,
        "n_items": v.n,
        "reason": v.explanation + note,
        "gap_to_best": gap,
        "gain_vs_baseline": c.vs_baseline.delta,
        **calibrate.columns(v, recipe.verdict),
    }
    if v.verdict == Verdict.IMPROVED:
        out["confirmation"] = Confirmation.CANDIDATE
    return out


def gap_to_best(s: StudyState, value: float, recipe: Recipe) -> float | None:
    """The objective against the best earlier trial of the study (positive = better)."""
    sign = 1 if recipe.objective.direction == "maximize" else -1
    best = s.records.best_objective(maximize=sign > 0)
    return None if best is None else sign * (value - best)


def confirmation_note(s: StudyState, candidate: int, run: TrialResult) -> str | None:
    """What the candidate's confirmation will say once confirmation run ``run`` (ending now: its row still says
    running) is closed, with its error rate, for that run's end commit; None while other confirmation runs are
    pending."""
    row = s.records.trial(candidate)
    c = s.evidence.confirmation(row, s.base, ending=(run.number, run.status, run.crash_category))
    if c is None:
        return None
    if c.verdict is None:
        return f"{row.attempt}: {c.state}: {c.reason}"
    rate = calibrate.describe(calibrate.columns(c.verdict, s.base.verdict, confirmation=True), prefix="confirm_")
    return f"{row.attempt}: {c.state} by {c.reason}" + (f"\nconfirmation error rate: {rate}" if rate else "")


def gated(s: StudyState, row: Trial, state: Confirmation, reason: str) -> tuple[Confirmation, str, dict[str, Any]]:
    """A confirmed candidate through the hack gate (``autorl.judge.hackgate``): suspect when a check fails, with
    the gate's columns for the ledger; any other state passes through unchanged."""
    gate = s.evidence.gate(row, s.base) if state == Confirmation.CONFIRMED else None
    if gate is None:
        return state, reason, {}
    s.view.study(f"{row.attempt}: {gate.line()}")
    if gate.state == Gate.SUSPECT:
        return Confirmation.SUSPECT, f"{reason}; {gate.line()}", gate.ledger_values()
    return state, reason, gate.ledger_values()


def confirm(s: StudyState, candidate: int) -> None:
    """When all of a candidate's confirmation runs have ended: confirmed, rejected or (confirmed, but the hack gate
    failed) suspect, in the ledger."""
    row = s.records.trial(candidate)
    c = s.evidence.confirmation(row, s.base)
    if c is None:
        return
    stats = calibrate.columns(c.verdict, s.base.verdict, confirmation=True) if c.verdict is not None else {}
    state, reason, gate = gated(s, row, Confirmation(c.state), c.reason)
    s.ledger.set_confirmation(candidate, state, reason, **stats, **gate)
    if c.verdict is not None:
        v = c.verdict
        s.view.study(
            f"{row.attempt}: {state} by {c.runs} fresh-seed runs (gain {v.delta:+.4f}, "
            f"{verdict.pct(v.level)} CI [{v.ci_low:+.4f}, {v.ci_high:+.4f}])"
        )
