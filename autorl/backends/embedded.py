"""The embedded backend: runs ``python -m autorl.engine`` as a child process.

Trials are forked from a server that has imported torch once (``autorl.backends.forked``); a trial it cannot
serve exactly starts as a fresh process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from autorl.backends import forked
from autorl.backends.base import Backend, LaunchPlan, OomKnob, TrialSpec
from autorl.engine.config import check_files
from autorl.errors import BackendError, RecipeError, short


class EmbeddedBackend(Backend):
    """Plans a run of the embedded GRPO engine on the trial's resolved recipe."""

    name = "embedded"
    oom_knobs = (
        OomKnob(("micro_batch",), whole={"micro_batch": ("batch_prompts", "gens")}),  # 0 = all at once
        OomKnob(("gens",), floor=2),
        OomKnob(("max_new_tokens",)),
    )
    work_keys = ("steps", "gens", "batch_prompts", "ppo_epochs", "max_new_tokens")
    grad_clip_key = "max_grad_norm"

    def trial_values(self, values: dict[str, Any], base) -> dict[str, Any]:
        """A trial that changes the generation limit keeps the study's eval limit (the eval protocol is fixed)."""
        if "max_new_tokens" not in values or base.train.get("eval_max_new_tokens"):
            return values
        return {**values, "eval_max_new_tokens": base.train.get("max_new_tokens")}

    def full_run_values(
        self, recipe, steps: int | None, episodes: int | None, eval_every: int | None = None
    ) -> dict[str, Any]:
        """The generic full-run values; a maximised eval objective also keeps its best and last evals' weights."""
        values = super().full_run_values(recipe, steps, episodes, eval_every)
        o = recipe.objective
        if o.direction == "maximize" and o.metric.startswith("eval/"):
            values["save_best"] = o.metric
        return values

    def checkpoint_eval_values(self, every: int) -> dict[str, Any]:
        """The engine evaluates its own weights every ``eval_every`` steps, on the recipe's held-out items."""
        return {"eval_every": every}

    def check(self, recipe, root: Path) -> None:
        """Fail before launch, with one line, when the recipe names files that are not there."""
        problem = check_files(recipe.params, Path(root))
        if problem:
            raise RecipeError(problem)

    def plan(self, spec: TrialSpec) -> LaunchPlan:
        self.check(spec.recipe, spec.worktree)
        run_dir = Path(spec.run_dir)
        config = spec.recipe.params.model_copy(update={"seed": spec.seed} if spec.seed is not None else None)
        config_path = run_dir / "engine_config.json"  # the child validates it once, as an EngineConfig
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            config_path.write_text(json.dumps(config.model_dump(mode="json"), indent=1, sort_keys=True))
        except OSError as exc:  # the cause is kept: a study tells a full disk or a path in the way from it
            raise BackendError(
                f"cannot write the run folder {short(str(run_dir), 200)} ({exc.strerror or exc}"
                f"{f' at {short(str(exc.filename), 200)}' if exc.filename else ''}): make it writable "
                "(or free space) and retry"
            ) from exc
        argv = [
            sys.executable,
            "-m",
            "autorl.engine",
            "--config",
            str(config_path),
            "--metrics-out",
            str(run_dir / "metrics.jsonl"),
            "--cache-dir",
            str(spec.cache_dir),
        ]
        plan = LaunchPlan(
            argv=argv,
            env=dict(self.extra_env),
            cwd=str(spec.worktree),
            log_path=str(run_dir / "train.log"),
            metrics_path=str(run_dir / "metrics.jsonl"),
            backend=self.name,
        )
        return plan

    def start(self, plan: LaunchPlan) -> forked.ForkedProcess:
        """A child process of the fork server (or a fresh one where the server cannot serve it exactly)."""
        return forked.ForkedProcess(plan)

    def prepare_single(self, recipe, cache_dir: Path, run_dir: Path) -> int | None:
        """`autorl train` builds the cached base model first too: a fresh workspace's warm-up (minutes on a busy
        two-core machine) once ran inside the run and used up its ``timeout_s``."""
        return self.prepare(recipe, cache_dir, run_dir)

    def prepare(self, recipe, cache_dir: Path, run_dir: Path, timeout_s: float = 1800.0) -> int | None:
        """Build the cached base model once, before any trial (so no trial's timeout pays for it).

        Runs the engine with ``steps: 0`` in a child process; returns its exit code. A failure
        is not fatal here: the first trial then fails with the real error and is triaged.
        """
        forked.server_for(sys.executable)  # start the fork server now: its imports overlap this build
        params = {**recipe.train, "steps": 0, "eval_every": 0}
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg = run_dir / "prepare_config.json"
        cfg.write_text(json.dumps(params, indent=1, sort_keys=True))
        argv = [
            sys.executable,
            "-m",
            "autorl.engine",
            "--config",
            str(cfg),
            "--metrics-out",
            str(run_dir / "prepare_metrics.jsonl"),
            "--cache-dir",
            str(cache_dir),
        ]
        with open(run_dir / "prepare.log", "ab") as log:
            try:
                return subprocess.run(
                    argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout_s
                ).returncode
            except subprocess.TimeoutExpired:
                return -1
