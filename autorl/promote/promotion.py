"""Promote a trial's recipe to a full run, after re-validating that it still wins.

``promote(ws, ledger, number)`` in order:

1. pick the trial: the one named, or the *confirmed* recipe (fresh-seed re-runs
   agreed; see docs/triage.md) with the largest gain over the study's baseline
   (``autorl.judge.gains``: measured on its fresh-seed runs, not on the run that
   looked good, and never only the gain over its own parent, which hides what the
   recipe it builds on already gained), and say why; an unconfirmed candidate only
   with ``--force``;
2. re-validate: the trial's recipe and the baseline's, each run with R fresh
   seeds on the full eval set (``--parallel N`` of those runs at once, on the GPUs
   they fit, one backend prepared for them all as a study's is); continue only if the paired test still says
   *improved* (``--force`` overrides, and the ledger says so). Short trials
   favour fast learners; this guards against that. A trial the hack gate made
   ``suspect`` at confirmation is refused before anything runs, and the gate runs
   again on the fresh runs (``autorl.judge.hackgate``): a failed check refuses
   the promotion with exit 2, naming the check; ``--force`` launches it anyway
   with the gate's evidence on the full run's ledger row;
3. a full-run recipe (the recipe's ``full`` overrides, ``--steps`` / ``--episodes`` / ``--eval-every``)
   committed on branch ``attempt-MM-full-<slug>`` from the trial's start commit,
   tag ``attempt-MM-start``, the preflight;
4. the launch, detached (``python -m autorl.promote.fullrun``) so the user can log out;
   ``autorl status`` / ``autorl show MM`` follow it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from typing import Any

from autorl.backends.base import get_backend
from autorl.errors import AutorlError, NotFoundError, UserError
from autorl.judge import gains, hackgate, verdict
from autorl.judge.evidence import objective_value, runs_of
from autorl.ledger import Ledger, Trial
from autorl.promote.estimate import promote_plan
from autorl.promote.source import trial_recipe
from autorl.recipe import Recipe, set_train_values
from autorl.runs.lifecycle import DetachedRun, open_attempt, run_detached
from autorl.runs.watch import Outcome
from autorl.states import Confirmation, Gate, Kind, Proposer, TrialStatus, Verdict
from autorl.workspace import FULLRUN_MONITOR, Workspace

Say = Callable[[str], None]


class PromotionRefused(AutorlError):
    """Re-validation did not confirm the gain (exit 1; --force overrides)."""


class SuspectRefused(UserError):
    """The hack gate failed for the trial (exit 2, one line naming the check; --force overrides)."""


def pick_best(ledger: Ledger, study: str | None = None, force: bool = False) -> tuple[Trial, str]:
    """The best confirmed recipe of the study (default: the latest) by its gain over the baseline
    (``autorl.judge.gains``), and why it was picked; with ``force`` and nothing confirmed, the unconfirmed
    candidate with the highest lower bound over its parent."""
    st = ledger.study(study)
    best = gains.ranked(gains.study_gains(ledger, st))
    if best:
        row = ledger.trial(best[0].number)
        return row, (
            f"{row.attempt} has the largest gain over the baseline of the study's {len(best)} confirmed "
            f"recipes: {best[0].interval()}, {best[0].describe()}"
        )
    pool, kind = ledger.trials(st.id, confirmation=Confirmation.CONFIRMED, kind=Kind.TRIAL), "confirmed"
    if not pool and force:
        pool, kind = ledger.trials(st.id, verdict=Verdict.IMPROVED, kind=Kind.TRIAL), "improved (unconfirmed, --force)"
    if not pool:
        open_ = ledger.trials(st.id, confirmation=Confirmation.CANDIDATE, kind=Kind.TRIAL)
        if open_:  # a study whose budget ended before their fresh-seed runs: resuming it runs those first
            raise NotFoundError(
                f"no confirmed improvement ({len(open_)} candidates await confirmation): "
                f"`autorl run --resume --study {st.name} --budget 30m` runs their fresh-seed runs first, "
                "or pick one with `autorl promote NN --force`"
            )
        raise NotFoundError(
            f"no confirmed improvement in study {st.name}: nothing to promote"
            f"{_elsewhere(ledger, st.name)} (or pick a trial with `autorl promote NN --force`)"
        )
    row = max(pool, key=lambda t: (t.ci_low or 0.0, t.objective or 0.0))
    return row, (
        f"{row.attempt} has the highest lower bound of the gain over its parent among {len(pool)} {kind} "
        f"trials: {row.delta:+.4f} [{row.ci_low:+.3f}, {row.ci_high:+.3f}]"
    )


def _elsewhere(ledger: Ledger, name: str) -> str:
    """The other studies of the ledger that have a confirmed improvement, as a hint ('' when none has)."""
    others = [
        s.name
        for s in ledger.studies(limit=50)
        if s.name != name and ledger.trials(s.id, confirmation=Confirmation.CONFIRMED, kind=Kind.TRIAL)
    ]
    return f"; study {others[0]} has one: `autorl promote --study {others[0]}`" if others else ""


def revalidate(
    ws: Workspace,
    ledger: Ledger,
    row: Trial,
    repeats: int,
    view: Say = print,
    parallel: int = 1,
    say: Say = lambda _what: None,
) -> tuple[verdict.Judgement, hackgate.GateResult | None]:
    """Re-run the trial and the baseline with ``repeats`` fresh seeds each, up to ``parallel`` runs at once (a trial's
    run beside the baseline's of the same seed); the paired verdict, and the hack gate on those runs (None when the
    recipe turns it off). Each run's end is shown, put in the ledger as an event and ``say``-d (the promote lock's
    note, which `autorl status` reads)."""
    base_row = ledger.baselines(row.study_id)[0]
    trial, _, _ = trial_recipe(ws, ledger, row)
    base, _, _ = trial_recipe(ws, ledger, base_row)
    limit = get_backend(base.backend).trial_timeout(base, trial.train)  # the trial's, as its study gave it
    runs = [
        DetachedRun(recipe, rev, f"revalidate-{row.number:02d}-{side}-s{s}", s, limit)
        for s in (10_000 + 7 * i for i in range(repeats))
        for side, recipe, rev in (("trial", trial, _start_tag(row)), ("base", base, _start_tag(base_row)))
    ]
    ended: list[str] = []

    def on_end(run: DetachedRun, out: Outcome) -> None:
        ended.append(_ended(run, out))
        view(ended[-1])
        ledger.event(row.study_id, row.id, "revalidation-run", ended[-1].strip())
        say(f"promote of {row.attempt}: re-validating, {len(ended)} of {len(runs)} runs ended")

    outs = run_detached(ws, runs, parallel, on_end=on_end)
    t_runs, b_runs = [o.metrics for o in outs[0::2]], [o.metrics for o in outs[1::2]]
    fresh, parent = runs_of(t_runs, trial), runs_of(b_runs, trial)  # one objective on both sides: the trial's
    if fresh is None or parent is None:
        side = "the trial's" if fresh is None else "the baseline's"
        raise PromotionRefused(
            f"{row.attempt}: none of {side} re-validation runs logged {trial.objective.metric}, "
            "so there is nothing to compare: read their logs under runs/"
        )
    gate = hackgate.check(t_runs, b_runs, trial) if trial.gate.enabled else None
    return verdict.judge(fresh, parent, trial.verdict, trial.objective.direction), gate


def _start_tag(row: Trial) -> str:
    assert row.start_tag is not None  # every attempt is tagged where it starts
    return row.start_tag


def _ended(run: DetachedRun, out: Outcome) -> str:
    value = objective_value(out.metrics, run.recipe)
    return f"  {run.name}: {out.status}" + (f", objective {value:.4f}" if value is not None else ", no objective")


def full_values(
    recipe: Recipe, steps: int | None, episodes: int | None, eval_every: int | None = None
) -> dict[str, Any]:
    """Train values of the full run: the recipe's ``full`` block plus the command-line lengths and checkpoint
    evals, where the recipe's backend puts them (``Backend.full_run_values``)."""
    return get_backend(recipe.backend).full_run_values(recipe, steps, episodes, eval_every)


def promote(
    ws: Workspace,
    ledger: Ledger,
    number: int | None,
    *,
    steps: int | None = None,
    episodes: int | None = None,
    eval_every: int | None = None,
    repeats: int = 2,
    parallel: int = 1,
    dry_run: bool = False,
    force: bool = False,
    view: Say = print,
    study: str | None = None,
) -> dict[str, Any]:
    """Re-validate trial NN (or the best of ``study``, default the latest), then commit and launch its full run
    detached. ``ledger`` may be read-only: every check reads it, and the ledger is opened for writing only once they
    have passed and the promote lock is held (a refusal writes nothing, but the hack gate's, which is recorded)."""
    row, why = (ledger.trial(number), "named on the command line") if number else pick_best(ledger, study, force)
    if row.kind != Kind.TRIAL or row.status != TrialStatus.COMPLETE:
        raise UserError(f"{row.attempt} did not complete as a trial ({row.status}): promote a completed trial")
    recorded = _recorded_gate(row)
    if recorded is not None and recorded.state == Gate.SUSPECT:
        with closing(Ledger(ws.ledger_path)) as writable:
            refuse_suspect(writable, row, recorded, force, "at confirmation")
    view(f"promoting {row.attempt}: {why}")
    recipe, text, rel = trial_recipe(ws, ledger, row)
    check_promotable(recipe, row)
    values = full_values(recipe, steps, episodes, eval_every)
    full = recipe.with_train(**values)
    planned = promote_plan(ledger, row, recipe.train, full.train, recipe.backend, repeats, parallel)
    for line in planned.lines(repeats, parallel) if planned else []:
        view(line)
    if dry_run:
        out = {"attempt": row.attempt, "why": why, "full_values": values, "train": full.train}
        return {**out, "plan": planned.model_dump() if planned else None}
    lock = ws.lock_promote(f"promote of {row.attempt}: re-validating, {2 * repeats} runs, {parallel} at once")
    try:
        ledger = Ledger(ws.ledger_path)  # every check passed, the lock held: from here on promote records
        check, gate = revalidate(ws, ledger, row, repeats, view, parallel, say=lock.say)
        view(
            f"re-validation against the baseline: {check.verdict}, {check.delta:+.3f} "
            f"({verdict.pct(check.level)} interval [{check.ci_low:+.3f}, {check.ci_high:+.3f}])"
        )
        if gate is not None:
            view(f"re-validation {gate.line()}")
        refuse_suspect(ledger, row, gate, force, "on the re-validation runs")
        if check.verdict != Verdict.IMPROVED and not force:
            ledger.event(row.study_id, row.id, "promote-refused", check.explanation)
            raise PromotionRefused(
                f"{row.attempt} no longer beats the baseline ({check.explanation}); use --force to promote anyway"
            )
        return _launch_full(ws, ledger, row, text, rel, values, why, check, force, evidence(_recorded_gate(row), gate))
    finally:
        lock.release()


def evidence(recorded: hackgate.GateResult | None, fresh: hackgate.GateResult | None) -> hackgate.GateResult | None:
    """The gate a full run records: a suspect one first (what --force overrode), else the re-validation's."""
    suspect = [g for g in (recorded, fresh) if g is not None and g.state == Gate.SUSPECT]
    return suspect[0] if suspect else fresh or recorded


def _recorded_gate(row: Trial) -> hackgate.GateResult | None:
    """The hack gate the trial's confirmation recorded in the ledger (None: it never ran)."""
    if not row.gate:
        return None
    return hackgate.GateResult.model_validate({"state": row.gate, "checks": row.gate_checks or []})


def refuse_suspect(ledger: Ledger, row: Trial, gate: hackgate.GateResult | None, force: bool, when: str) -> None:
    """Refuse a trial the hack gate failed, in one line naming the check (exit 2), unless ``force``; forced, the
    ledger records it."""
    if gate is None or gate.state != Gate.SUSPECT:
        return
    failed = gate.failed
    name, detail = (failed.name, failed.detail) if failed else ("unknown", "no check recorded")
    if force:
        ledger.event(row.study_id, row.id, "promote-forced-suspect", f"hack gate {when}: {name}: {detail}")
        return
    ledger.event(row.study_id, row.id, "promote-refused", f"hack gate {when}: {name}: {detail}")
    raise SuspectRefused(
        f"{row.attempt} is suspect: hack gate check '{name}' failed {when} ({detail}); "
        f"promote it anyway with `autorl promote {row.number} --force`"
    )


def check_promotable(recipe: Recipe, row: Trial) -> None:
    """Re-validation compares per-item eval results, so the objective must be an ``eval/<split>/<metric>`` key."""
    parts = recipe.objective.metric.split("/")
    if len(parts) != 3 or parts[0] != "eval":
        raise UserError(
            f"{row.attempt}'s objective {recipe.objective.metric!r} is not an eval/<split>/<metric> "
            "key, so re-validation has no per-item eval to compare: set objective.metric to one "
            "(e.g. eval/id/greedy_pass@1) for the study"
        )


def _launch_full(
    ws: Workspace,
    ledger: Ledger,
    row: Trial,
    text: str,
    rel: str,
    values: dict[str, Any],
    why: str,
    check: verdict.Judgement,
    force: bool,
    gate: hackgate.GateResult | None = None,
) -> dict[str, Any]:
    forced = " (forced: re-validation did not confirm)" if force and check.verdict != Verdict.IMPROVED else ""
    if gate is not None and gate.state == Gate.SUSPECT:
        forced += f" (forced: {gate.line()})"
    message = (
        f"full run promoted from {row.attempt}{forced}\n\n{why}\nre-validation: {check.explanation}\n"
        + (f"{gate.line()}\n" if gate is not None else "")
        + "".join(f"- {k}: {v!r}\n" for k, v in values.items())
    )
    a = open_attempt(
        ws,
        ledger,
        rev=_start_tag(row),
        slug=f"full-{row.attempt.split('-', 2)[-1]}",
        files={rel: set_train_values(text, values)},
        message=message,
        study_id=row.study_id,
        proposer=Proposer.PROMOTE,
        hypothesis=row.hypothesis,
        kind=Kind.FULL,
        promoted_from=row.number,
        why=f"{why}; re-validation {check.verdict} {check.delta:+.4f}{forced}",
        changed=values,
        delta=check.delta,
        ci_low=check.ci_low,
        ci_high=check.ci_high,
        method=check.method,
        n_items=check.n,
        **(gate.ledger_values() if gate is not None else {}),
    )
    pid = spawn_full_run(ws, a.number)
    ledger.update_trial(a.row_id, event="full-run-launched", pid=pid, reason=f"monitor pid {pid}")
    return {
        "attempt": a.name,
        "number": a.number,
        "promoted_from": row.number,
        "trial_branch": row.branch,  # the confirmed values at trial length: what a next study goes on from
        "recipe_path": rel,
        "monitor_pid": pid,
        "revalidation": check.model_dump(),
        "forced": bool(forced),
        "gate": gate.line() if gate is not None else None,
    }


def spawn_full_run(ws: Workspace, number: int) -> int:
    """Start the detached monitor of full run ``number`` (survives the user logging out)."""
    log = ws.runs / f"fullrun-{number:02d}.monitor.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                FULLRUN_MONITOR,
                "--root",
                str(ws.root),
                "--ledger",
                str(ws.ledger_path),
                "--number",
                str(number),
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=ws.root,
        )
    ws.record_monitor(number, proc.pid)
    return proc.pid
