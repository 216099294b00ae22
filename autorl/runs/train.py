"""`autorl train`: one run of a recipe, outside any study (no git, no ledger)."""

from __future__ import annotations

import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.progress import Progress, TaskID

from autorl import gitops
from autorl.backends.base import Backend, LaunchPlan, TrialSpec, get_backend, planned_steps
from autorl.backends.ray_jobs import resolve_address
from autorl.errors import UserError, WorkspaceError, short
from autorl.loading import NotRegularFile, tail_bytes
from autorl.metrics import RunMetrics
from autorl.recipe import Overrides, Recipe, load_recipe
from autorl.runs.lifecycle import TrainThenEval, follow, watch_run
from autorl.runs.watch import Outcome
from autorl.states import TrialStatus
from autorl.workspace import RUN_DIR

# A run autorl itself stopped, and the setting that would have let it go on.
STOPPED_BY_US = {
    TrialStatus.HANG: "a run that is slow but alive needs a longer abort.silence_s (--set abort.silence_s=600)",
    TrialStatus.TIMEOUT: "a run that needs longer needs a larger timeout_s (--set timeout_s=3600)",
}


def plan_single(
    cwd: Path,
    recipe_path: Path,
    overrides: Overrides,
    metrics_out: str | None,
    dry_run: bool = False,
    ray_address: str | None = None,
) -> tuple[TrialSpec, LaunchPlan]:
    """Validate the recipe and plan its run (nothing is launched; with ``dry_run`` nothing is written either).
    ``ray_address``: the cluster the job goes to, for backends that submit Ray jobs themselves."""
    recipe = load_recipe(recipe_path, overrides)
    backend = single_backend(recipe, ray_address)
    root = _root(cwd)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = root / RUN_DIR / "train" / f"{gitops.slugify(recipe.name)}-{stamp}"
    spec = TrialSpec(
        attempt=f"train-{stamp}",
        recipe=recipe,
        worktree=cwd.resolve(),
        run_dir=run_dir,
        cache_dir=root / RUN_DIR / "cache",
    )
    if dry_run:
        plan = _dry_plan(backend, spec)
    else:
        backend.check(recipe, cwd.resolve())  # a missing file or bad flag: one line before anything starts
        _make_run_dir(run_dir)
        plan = backend.plan(spec)
    if metrics_out:
        plan = _redirect_metrics(plan, _metrics_target(Path(metrics_out), dry_run))
    return spec, plan


def _make_run_dir(run_dir: Path) -> None:
    """The run's folder made before the backend plans into it: a workspace that cannot be written (read-only, a
    file in the way, no space) is one line naming the folder."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        at = f" at {short(str(exc.filename), 200)}" if exc.filename and str(exc.filename) != str(run_dir) else ""
        raise WorkspaceError(
            f"cannot write the run folder {short(str(run_dir), 200)} ({exc.strerror or exc}{at}): make "
            f"{RUN_DIR}/ writable (or free space), or run `autorl train` from a folder you can write to"
        ) from None


def _metrics_target(path: Path, dry_run: bool) -> Path:
    """Where --metrics-out writes, checked before anything trains: a regular file it can write, or none yet (a dry
    run, which writes nothing, checks only that its folder exists). A device (/dev/null) or a FIFO is refused: a
    run must leave its records where autorl can read them back, and a FIFO would block."""
    try:
        target = path.resolve()
        mode = target.stat().st_mode if target.exists() else None
    except (OSError, RuntimeError) as exc:  # a symbolic link loop, a name too long
        raise UserError(
            f"--metrics-out {short(str(path), 200)} cannot be used ({getattr(exc, 'strerror', None) or exc}): "
            "name a file in a folder you can write to"
        ) from None
    if target.is_dir():
        raise UserError(
            f"--metrics-out {short(str(path), 200)} is a folder: name a file, such as "
            f"{short(str(path / 'metrics.jsonl'), 200)}"
        )
    if mode is not None and not stat.S_ISREG(mode):
        raise UserError(
            f"--metrics-out {short(str(path), 200)} {NotRegularFile(path, mode).strerror}: name a file (new or "
            "a regular one) in a folder you can write to"
        )
    if dry_run and not target.parent.is_dir():
        raise UserError(
            f"--metrics-out {short(str(path), 200)}: folder {short(str(target.parent), 200)} does not "
            "exist: name a file in a folder you can write to"
        )
    existed = target.exists()
    if dry_run:
        return target
    try:
        with open(target, "a"):
            pass
    except OSError as exc:
        raise UserError(
            f"--metrics-out {short(str(path), 200)} cannot be written ({exc.strerror or exc}): name a "
            "file in a folder you can write to"
        ) from None
    if not existed:
        target.unlink()
    return target


def single_backend(recipe: Recipe, ray_address: str | None) -> Backend:
    """The recipe's backend, sent to ``ray_address`` (resolved: ``local``, ``auto``, ``host:port``)."""
    backend = get_backend(recipe.backend, ray_address=resolve_address(ray_address))
    if ray_address and not backend.runs_on_ray:
        raise UserError(
            f"--ray-address: `autorl train` sends only backends that submit their own Ray jobs "
            f"(openrlhf) to a cluster, not {recipe.backend}: use `autorl run --ray-address`, which "
            "submits any backend's trials as Ray jobs"
        )
    return backend


def _dry_plan(backend: Backend, spec: TrialSpec) -> LaunchPlan:
    """The plan as it would be, made in a scratch folder (a backend's plan writes its config files there)."""
    with tempfile.TemporaryDirectory(prefix="autorl-dry-") as tmp:
        plan = backend.plan(spec.model_copy(update={"run_dir": Path(tmp)}))
    return LaunchPlan.model_validate_json(plan.model_dump_json().replace(tmp, str(spec.run_dir)))


def describe(spec: TrialSpec, plan: LaunchPlan, ray_address: str | None) -> dict[str, Any]:
    """The dry run's answer: the launch plan, and for a backend that submits a Ray job, what that job gets."""
    job = single_backend(spec.recipe, ray_address).describe_job(spec, plan)
    return {**plan.model_dump(), **({"job": job} if job else {})}


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
    backend = single_backend(recipe, plan.ray_address)
    backend.prepare_single(recipe, spec.cache_dir, spec.run_dir / "prepare")  # outside the run's timeout
    if Path(plan.metrics_path).is_file():  # --metrics-out of an earlier run: this run's records only
        Path(plan.metrics_path).write_bytes(b"")
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


def _result(plan: LaunchPlan, out: Outcome, recipe: Recipe) -> dict[str, Any]:
    final = out.metrics.evals[-1] if out.metrics.evals else {}
    evals = {k: v for k, v in final.items() if k.startswith("eval/") and not k.endswith("items")}
    res: dict[str, Any] = {
        "status": out.status,
        "exit_code": out.exit_code,
        "steps": len(out.metrics.steps),
        "final_eval": evals,
        "wall_s": round(out.wall_s, 2),
        "metrics_path": plan.metrics_path,
        "log_path": plan.log_path,
    }
    if out.exit_code or out.status in STOPPED_BY_US:
        try:
            res["log_tail"] = tail_bytes(plan.log_path, 64 << 10).decode(errors="replace").splitlines()[-5:]
        except OSError as exc:
            res["log_tail"] = [f"(the log {plan.log_path} cannot be read: {exc.strerror or exc})"]
    if out.status in STOPPED_BY_US:
        res["stopped"] = f"{out.reason}; {STOPPED_BY_US[out.status]}"
    return res


class _Progress:
    """A rich progress bar on a TTY, plain lines otherwise."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.quiet, self._last = total, quiet, 0.0
        self.rich: Progress | None = None
        self.task: TaskID | None = None
        if not quiet and sys.stdout.isatty():
            self.rich = Progress()
            self.task = self.rich.add_task("training", total=total or None)
            self.rich.start()

    def update(self, m: RunMetrics) -> None:
        step = m.steps[-1] if m.steps else {}
        ev = m.evals[-1] if m.evals else {}
        desc = f"reward {step.get('reward_mean', 0):.3f} id {ev.get('eval/id/greedy_pass@1', float('nan')):.3f}"
        if self.rich is not None and self.task is not None:
            self.rich.update(self.task, completed=step.get("step", 0), description=desc)
        elif not self.quiet and (time.time() - self._last > 2 or step.get("step") == self.total):
            self._last = time.time()
            print(f"step {step.get('step', 0)}/{self.total} {desc}", flush=True)
        return None

    def close(self) -> None:
        if self.rich is not None:
            self.rich.stop()
