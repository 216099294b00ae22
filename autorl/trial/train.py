"""`autorl train`: one run of a recipe, outside any study (no git, no ledger)."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from autorl import gitops
from autorl.backends.base import LaunchPlan, TrialSpec, get_backend, planned_steps
from autorl.errors import WorkspaceError
from autorl.metrics import RunMetrics
from autorl.recipe import Overrides, load_recipe
from autorl.trial.lifecycle import TrainThenEval, follow, watch_run
from autorl.trial.watch import Outcome
from autorl.workspace import RUN_DIR


def plan_single(cwd: Path, recipe_path: Path, overrides: Overrides, metrics_out: str | None,
                dry_run: bool = False) -> tuple[TrialSpec, LaunchPlan]:
    """Validate the recipe and plan its run (nothing is launched; with ``dry_run`` nothing is written either)."""
    recipe = load_recipe(recipe_path, overrides)
    root = _root(cwd)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = root / RUN_DIR / "train" / f"{gitops.slugify(recipe.name)}-{stamp}"
    spec = TrialSpec(attempt=f"train-{stamp}", recipe=recipe, worktree=cwd.resolve(), run_dir=run_dir,
                     cache_dir=root / RUN_DIR / "cache")
    if dry_run:
        plan = _dry_plan(spec)
    else:
        backend = get_backend(recipe.backend)
        backend.check(recipe, cwd.resolve())  # a missing file or bad flag: one line before anything starts
        plan = backend.plan(spec)
    if metrics_out:
        plan = _redirect_metrics(plan, Path(metrics_out).resolve())
    return spec, plan


def _dry_plan(spec: TrialSpec) -> LaunchPlan:
    """The plan as it would be, made in a scratch folder (a backend's plan writes its config files there)."""
    with tempfile.TemporaryDirectory(prefix="autorl-dry-") as tmp:
        plan = get_backend(spec.recipe.backend).plan(spec.model_copy(update={"run_dir": Path(tmp)}))
    return LaunchPlan.model_validate_json(plan.model_dump_json().replace(tmp, str(spec.run_dir)))


def _root(cwd: Path) -> Path:
    try:
        return gitops.repo_root(cwd)
    except WorkspaceError:
        return cwd.resolve()


def _redirect_metrics(plan: LaunchPlan, target: Path) -> LaunchPlan:
    argv = [str(target) if a == plan.metrics_path else a for a in plan.argv]
    return plan.model_copy(update={"argv": argv, "metrics_path": str(target)})


def run_single(spec: TrialSpec, plan: LaunchPlan, quiet: bool = False) -> dict[str, Any]:
    """Launch the plan (then the backend's per-item eval), show progress, return a summary; timeout_s applies."""
    recipe = spec.recipe
    backend = get_backend(recipe.backend)
    handle = TrainThenEval(backend.start(plan), backend.eval_plan(spec))
    bar = _Progress(planned_steps(recipe), quiet)
    try:
        out = follow(watch_run(handle, recipe, on_records=lambda recs, m: bar.update(m)))
    except KeyboardInterrupt:
        handle.cancel()
        raise
    finally:
        bar.close()
    return _result(plan, out, recipe)


def _result(plan: LaunchPlan, out: Outcome, recipe) -> dict[str, Any]:
    final = out.metrics.evals[-1] if out.metrics.evals else {}
    evals = {k: v for k, v in final.items() if k.startswith("eval/") and not k.endswith("items")}
    res = {"status": out.status, "exit_code": out.exit_code, "steps": len(out.metrics.steps), "final_eval": evals,
           "wall_s": round(out.wall_s, 2), "metrics_path": plan.metrics_path, "log_path": plan.log_path}
    if out.exit_code:
        res["log_tail"] = Path(plan.log_path).read_text(errors="replace").splitlines()[-5:]
    return res


class _Progress:
    """A rich progress bar on a TTY, plain lines otherwise."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.quiet, self._last = total, quiet, 0.0
        self.rich = None
        if not quiet and sys.stdout.isatty():
            from rich.progress import Progress

            self.rich = Progress()
            self.task = self.rich.add_task("training", total=total or None)
            self.rich.start()

    def update(self, m: RunMetrics) -> None:
        step = m.steps[-1] if m.steps else {}
        ev = m.evals[-1] if m.evals else {}
        desc = f"reward {step.get('reward_mean', 0):.3f} id {ev.get('eval/id/greedy_pass@1', float('nan')):.3f}"
        if self.rich is not None:
            self.rich.update(self.task, completed=step.get("step", 0), description=desc)
        elif not self.quiet and (time.time() - self._last > 2 or step.get("step") == self.total):
            self._last = time.time()
            print(f"step {step.get('step', 0)}/{self.total} {desc}", flush=True)
        return None

    def close(self) -> None:
        if self.rich is not None:
            self.rich.stop()
