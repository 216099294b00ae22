"""One trial of a study through the lifecycle (``autorl.runs.lifecycle``): prepared, launched, closed.

- ``prepare``: the proposal's values written into the study's recipe text (the backend's ``trial_values`` may add
  what keeps the eval protocol fixed), that recipe validated once, the attempt opened (branch, worktree, the
  hypothesis' patch, a commit saying why, tag, ledger row);
- ``launch``: the backend's preflight, plan and start in the trial's slot, then a ``Watch`` whose callback is the
  trial's ``TrialMonitor``; a trial that never started is its ``Outcome`` at once;
- ``close``: the results file and research-log entry committed, tag ``attempt-NN-end``, the ledger row updated.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from autorl import gitops
from autorl.backends.base import TrialSpec
from autorl.errors import RecipeError, UserError
from autorl.judge import calibrate
from autorl.judge.result import TrialResult
from autorl.ledger import Trial
from autorl.recipe import Recipe, dump_values, recipe_from_text, set_train_values
from autorl.runs import lifecycle
from autorl.runs.slots import Slots
from autorl.runs.watch import Outcome, Stop, Watch
from autorl.search.proposal import Proposal
from autorl.states import TrialStatus
from autorl.study.monitor import TrialMonitor
from autorl.study.state import StudyState, TrialContext


def prepare(s: StudyState, p: Proposal) -> TrialContext:
    """Open the attempt: branch, worktree, the proposal's recipe and patch committed, tag, ledger row."""
    values = s.backend.trial_values(p.values, s.base)
    text = set_train_values(s.base_text, values) if values else s.base_text
    recipe, error = (s.base, None) if text == s.base_text else _recipe_of(text, s.recipe_rel)
    patch_error: list[str] = []
    a = lifecycle.open_attempt(
        s.ws,
        s.ledger,
        rev=_base_sha(s),
        slug=p.slug,
        files={s.recipe_rel: text},
        message=commit_message(p, s.base.train),
        changed_files=lambda wt: _apply_patch(wt, p, patch_error),
        study_id=s.id,
        proposer=p.proposer,
        hypothesis=p.hypothesis,
        why=p.why,
        changed=p.values,
        params=recipe.train if recipe else None,
        seed=(recipe.train.get("seed") if recipe else None),
        optuna_number=p.optuna_number,
        retry_of=p.retry_of,
        parent=p.parent,
        confirms=p.confirms,
    )
    s.view.trial_start(a.name, p.why)
    return TrialContext(p, a, recipe, error or (patch_error[0] if patch_error else None))


def _base_sha(s: StudyState) -> str:
    assert s.row.base_sha is not None  # every study is made at its base commit
    return s.row.base_sha


def _recipe_of(text: str, source: str) -> tuple[Recipe | None, str | None]:
    try:
        return recipe_from_text(text, source), None
    except RecipeError as exc:
        return None, str(exc)


def _apply_patch(wt: Path, p: Proposal, errors: list[str]) -> list[str]:
    """Apply the hypothesis' patch; one that is missing or does not apply fails this trial, not the study."""
    if not p.patch:
        return []
    patch = Path(p.patch)
    if not patch.is_file():
        errors.append(f"patch {patch} of hypothesis {p.hypothesis} not found: add it to patches/ or fix the hypothesis")
        return []
    try:
        return gitops.apply_patch(wt, patch)
    except Exception as exc:  # git apply's refusal, whatever its wrapper: the trial records it
        first = next((x.strip() for x in str(exc).splitlines() if "error:" in x), str(exc).splitlines()[0])
        errors.append(
            f"patch {patch.name} of hypothesis {p.hypothesis} does not apply to the study's base commit "
            f"({first[:160]}): update the patch or the hypothesis"
        )
        return []


def launch(
    s: StudyState,
    ctx: TrialContext,
    slots: Slots,
    slot: int,
    deadline: float | None,
    external: Callable[[], Stop | None],
    clock: Callable[[], tuple[float, float]],
) -> Watch | Outcome:
    """Start the trial on its backend in ``slot``; a Watch over it, or the Outcome if it never started."""
    recipe, a = ctx.recipe, ctx.attempt
    assert recipe is not None  # a trial without a valid recipe has its error, and is never launched
    spec = TrialSpec(attempt=a.name, recipe=recipe, worktree=a.worktree, run_dir=a.run_dir, cache_dir=s.ws.cache)
    try:
        handle = lifecycle.launch(
            s.backend,
            spec,
            start=lambda plan: slots.start(s.backend, plan),
            assign=lambda plan: slots.assign(plan, slot, recipe, s.backend.runs_on_ray),
        )
    except UserError as exc:
        return Outcome(TrialStatus.CONFIG_ERROR, None, str(exc))
    try:
        s.ledger.update_trial(a.row_id, pid=handle.pid, job_id=handle.job_id, job_address=slots.address)
        monitor = TrialMonitor(s, ctx, recipe, clock)
        timeout_s = s.backend.trial_timeout(s.base, ctx.proposal.values)
        return lifecycle.watch_run(
            handle, recipe, deadline=deadline, timeout_s=timeout_s, on_records=monitor.on_records, external=external
        )
    except BaseException:
        handle.cancel(grace_s=2.0)  # started, but the study cannot follow it (a lost ledger): no orphan
        raise


def close(s: StudyState, ctx: TrialContext, outcome: Outcome, result: TrialResult, note: str | None = None) -> None:
    """Commit the results file and the research-log entry, tag the end, update the ledger row; show the verdict.
    ``note`` ends the commit message (a last confirmation run's: what it confirmed, with its error rate)."""
    a, p = ctx.attempt, ctx.proposal
    final = outcome.metrics.evals[-1] if outcome.metrics.evals else None
    summary = {
        "attempt": a.name,
        "proposer": p.proposer,
        "hypothesis": p.hypothesis,
        "why": p.why,
        "changed": p.values,
        **result.ledger_values(),
        "final_eval": _strip_items(final),
    }
    rate = calibrate.describe(result.model_dump())
    message = f"{a.name}: {result.headline()}\n\n{result.reason}" + (f"\n\nerror rate: {rate}" if rate else "")
    message += f"\n\n{note}" if note else ""
    lifecycle.close_attempt(
        s.ws, s.ledger, a, result.ledger_values(), summary, message, log_entry=log_entry(ctx, result)
    )
    s.view.verdict(Trial(number=a.number, attempt=a.name, **result.ledger_values()))


def commit_message(p: Proposal, base: dict[str, Any]) -> str:
    changes = (
        "\n".join(f"- {k}: {base.get(k)!r} -> {v!r}" for k, v in p.values.items()) or "- none (the recipe as written)"
    )
    hyp = f"hypothesis: {p.hypothesis}\n" if p.hypothesis else ""
    return f"{p.why}\n\nproposer: {p.proposer}\n{hyp}changed values (previous -> tested):\n{changes}\n"


def log_entry(ctx: TrialContext, r: TrialResult) -> str:
    p = ctx.proposal
    lines = [
        f"\n## {ctx.attempt.name}\n",
        f"- proposer: {p.proposer}" + (f", hypothesis {p.hypothesis}" if p.hypothesis else ""),
        f"- why: {p.why}",
        f"- changed: {dump_values(p.values) or 'nothing (baseline)'}",
        f"- status: {r.status}; verdict: {r.headline() if r.verdict else '-'}",
    ]
    if r.ci_low is not None:
        lines.append(f"- 95% interval for delta: [{r.ci_low:+.4f}, {r.ci_high:+.4f}] ({r.method})")
    if r.crash_category:
        lines.append(f"- crash: {r.crash_category}: `{r.root_cause}`; remedy: {r.remedy}")
    for f in r.flags:
        lines.append(f"- flag {f['name']}: {f['evidence']}")
    return "\n".join(lines) + "\n"


def _strip_items(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    return {k: v for k, v in rec.items() if not k.endswith("items")} if rec else None
