"""The detached monitor of a promoted full run: ``python -m autorl.promote.fullrun``.

Launched by ``autorl promote`` in its own session so the user can log out. It
runs the full-run recipe on its backend, follows the eval protocol of seed 004
§7/§9 — greedy pass@1 on the ID and OOD probes at every eval, early stop when
the OOD value stays below its best beyond the eval's noise (autorl.judge.earlystop),
the checkpoint to keep (the last eval's, unless an earlier one beats it beyond
noise: ``keep_checkpoint``; its step, value, why, and the weights the embedded
engine saved for it, or the checkpoint folder that eval read) recorded, train/eval
divergence flagged — and records everything in the ledger, the results commit and
tag ``attempt-MM-end``. A backend that saves checkpoints as it trains
(``Backend.checkpoint_glob``) has each evaluated as it appears
(``autorl.promote.ckpt_evals``), so the early stop has evals to watch.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autorl.backends.base import Backend, TrialSpec, get_backend, planned_steps
from autorl.engine.config import KEPT_FILE
from autorl.errors import UserError, one_line
from autorl.judge import verdict
from autorl.judge.earlystop import Kept, drop_stop, keep_checkpoint
from autorl.ledger import Ledger
from autorl.metrics import RunMetrics
from autorl.promote.ckpt_evals import CheckpointEvals
from autorl.recipe import Recipe, load_recipe
from autorl.runs.lifecycle import Attempt, close_attempt, follow, launch, watch_run
from autorl.runs.watch import Outcome, Stop, Watch
from autorl.states import TrialStatus
from autorl.workspace import Workspace

OOD_KEY = "eval/ood/greedy_pass@1"
Records = list[dict[str, Any]]


def ood_drop_stop(evals: Records, key: str = OOD_KEY) -> Stop | None:
    """Stop when ``key`` dropped beyond its noise below its best, with patience (autorl.judge.earlystop)."""
    d = drop_stop(evals, key)
    return Stop(TrialStatus.EARLY_STOPPED, d.reason) if d is not None else None


def kept_eval(evals: Records, recipe: Recipe) -> Kept | None:
    """The eval whose checkpoint the full run keeps (``autorl.judge.earlystop.keep_checkpoint``)."""
    return keep_checkpoint(evals, recipe.objective.metric, recipe.objective.direction == "maximize")


def run_full(ws: Workspace, ledger: Ledger, number: int) -> dict[str, Any]:
    """Run full run ``number`` (opened by promote) to its end, with the OOD early stop; record and close it."""
    row = ledger.trial(number)
    study = ledger.study(study_id=row.study_id)
    a = Attempt.of(ws, row)
    assert study.recipe_path is not None  # every study is made with its recipe's path
    recipe = load_recipe(a.worktree / study.recipe_path)
    spec = TrialSpec(attempt=a.name, recipe=recipe, worktree=a.worktree, run_dir=a.run_dir, cache_dir=ws.cache)
    backend = get_backend(recipe.backend)
    evals = checkpoint_evals(backend, spec)

    def on_records(records: Records, m: RunMetrics) -> Stop | None:
        ledger.add_metrics(a.row_id, records)
        return ood_drop_stop(m.evals) if any(r.get("type") == "eval" for r in records) else None

    backend.prepare(recipe, ws.cache, a.run_dir / "prepare")  # as a study's: its Ray head, the shared caches
    try:
        try:
            handle = launch(backend, spec)
        except UserError as exc:  # refused before it ran (preflight): recorded and closed, as a study's trial is
            return _record(ws, ledger, a, recipe, Outcome(TrialStatus.CONFIG_ERROR, None, reason=one_line(exc)))
        if handle.pid is not None:  # a Ray job has none: the row keeps the monitor's, which `status` checks
            ledger.update_trial(a.row_id, pid=handle.pid)
        watch = watch_run(handle, recipe, timeout_s=float("inf"), on_records=on_records)
        if evals is not None:  # the checkpoints' evals reach the OOD stop as the run's own records do
            watch.external = lambda: _feed(watch, evals.poll(), on_records)
        out = follow(watch)
        if evals is not None and out.status == TrialStatus.COMPLETE:
            _drain(evals, out, lambda records: ledger.add_metrics(a.row_id, records))
    finally:
        if evals is not None:
            evals.cancel()
        backend.close()
    return _record(ws, ledger, a, recipe, out)


def checkpoint_evals(backend: Backend, spec: TrialSpec) -> CheckpointEvals | None:
    """The evaluator of the checkpoints the run saves as it trains (``autorl.promote.ckpt_evals``); None when the
    backend saves none or evaluates the run itself."""
    pattern, plan = backend.checkpoint_glob(spec), backend.eval_plan(spec)
    if not pattern or plan is None:
        return None
    return CheckpointEvals(pattern, plan, planned_steps(spec.recipe), Path(spec.run_dir) / "ckpt-evals")


def _feed(watch: Watch, records: Records, on_records: Callable[[Records, RunMetrics], Stop | None]) -> Stop | None:
    if not records:
        return None
    watch.metrics.extend(records)
    return on_records(records, watch.metrics)


def _drain(evals: CheckpointEvals, out: Outcome, add: Callable[[Records], None], limit_s: float = 1800.0) -> None:
    """Evaluate the checkpoints left when the run ended (its final model has had its own eval)."""
    deadline = time.time() + limit_s
    while evals.busy(run_ended=True) and time.time() < deadline:
        records = evals.poll(run_ended=True)
        if records:
            add(records)
            out.metrics.extend(records)
        time.sleep(0.2)
    out.metrics.evals.sort(key=lambda e: e.get("step") or 0)  # by step again, for the flags that read a trend


def _record(ws: Workspace, ledger: Ledger, a: Attempt, recipe: Recipe, out: Outcome) -> dict[str, Any]:
    m = out.metrics
    kept = kept_eval(m.evals, recipe)
    step, value = (kept.step, kept.value) if kept is not None else (None, None)
    ended = (TrialStatus.COMPLETE, TrialStatus.EARLY_STOPPED, TrialStatus.CONFIG_ERROR)
    status = out.status if out.status in ended else TrialStatus.CRASH
    flags = [
        f.model_dump() for f in verdict.flags(m.steps, m.evals, m.summary, planned_steps(recipe), abort=recipe.abort)
    ]
    finished = time.time()
    result = {
        "status": status,
        "reason": out.reason,
        "objective": value,
        "exit_code": out.exit_code,
        "finished": finished,
        "duration_s": out.wall_s,
        "flags": flags,
        "best_checkpoint": {
            **_checkpoint(m, step, value, recipe.objective.metric, a.run_dir),
            "why": kept.why if kept is not None else None,
        },
    }
    best = f"kept {recipe.objective.metric} {value:.4f} at step {step}" if value is not None else "no eval"
    reason = best + (f"; {out.reason}" if out.reason else "")
    message = f"{a.name}: full run {status}, {best}\n\n{out.reason}"
    values = {
        "status": status,
        "objective": value,
        "reason": reason,
        "exit_code": out.exit_code,
        "finished": finished,
        "duration_s": out.wall_s,
        "flags": flags,
    }
    close_attempt(ws, ledger, a, values, result, message, event="full-run-end")
    return result


def _checkpoint(
    m: RunMetrics, step: int | None, value: float | None, metric: str, run_dir: Path | None = None
) -> dict[str, Any]:
    """The kept eval, with the path of its saved weights: the ones the backend kept for that step (the embedded
    engine keeps its best eval's and its last eval's), else the checkpoint that eval read (``autorl.evaluate`` names
    it in its record: a full run's saved model), when it is still there. A run stopped early was killed before its
    summary: the engine's marks are also read from ``kept.json`` beside its weights in ``run_dir``."""
    sources = (m.summary or {}, _kept_marks(run_dir))
    saved = [marks.get(k) or {} for marks in sources for k in ("best_checkpoint", "last_checkpoint")]
    path = next((s.get("path") for s in saved if s.get("step") == step and s.get("metric") == metric), None)
    if path is None:
        read = next((e.get("checkpoint") for e in m.evals if e.get("step") == step and e.get(metric) == value), None)
        path = read if read and Path(read).exists() else None
    return {"step": step, "value": value, "metric": metric, "weights": path}


def _kept_marks(run_dir: Path | None) -> dict[str, Any]:
    """The embedded engine's record of which evals its saved weights hold; {} when there is none or it is unreadable."""
    try:
        marks = json.loads((Path(run_dir) / KEPT_FILE).read_text()) if run_dir is not None else {}
    except (OSError, ValueError):
        return {}
    return marks if isinstance(marks, dict) else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autorl.promote.fullrun", description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--number", type=int, required=True)
    args = ap.parse_args(argv)
    ws = Workspace.open(args.root, args.ledger)
    result = run_full(ws, Ledger(ws.ledger_path), args.number)
    print(json.dumps(result, default=str), flush=True)
    return 0 if result["status"] not in (TrialStatus.CRASH, TrialStatus.CONFIG_ERROR) else 1


if __name__ == "__main__":
    raise SystemExit(main())
