"""The backend protocol: how the controller launches and stops one trial.

Lifecycle, per trial, all called from the controller process:

1. ``plan(spec)`` -> ``LaunchPlan``: pure; writes nothing but the files the run
   needs under ``spec.run_dir``; ``autorl train --dry-run`` prints it.
2. ``start(plan)`` -> ``RunHandle``: launches the trial outside the controller's
   process (a child process group, or a Ray job) and returns at once.
3. The controller polls ``handle.poll()`` and ``handle.metrics()`` until the run
   exits, and calls ``handle.cancel()`` on early abort, timeout, budget end or
   Ctrl-C.

Backends that run a local command share ``LocalProcess``; a backend only needs a
``plan``. Metrics always come back in autorl's schema (``autorl.metrics``).
"""

from __future__ import annotations

import importlib
import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from autorl.backends.registry import BACKENDS
from autorl.errors import UserError
from autorl.metrics import JsonlTail

WARM_FILE = "warm.json"  # left in a run folder by a backend whose run went to a warm process: {"pool", "index", ...}
WARM_RETIRED_FILE = "warm-retired.jsonl"  # a line {"pool", "reason", "trials"} per pool retired by that run


class TrialSpec(BaseModel):
    """Everything a backend needs to plan one trial."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    attempt: str = Field(description="Attempt name, e.g. 'attempt-07-lr-3e-4'.")
    recipe: Any = Field(description="The validated autorl.recipe.Recipe for this trial.")
    worktree: Path = Field(description="Directory the trial runs in (its commit's checkout).")
    run_dir: Path = Field(description="Where logs, metrics and run files go.")
    cache_dir: Path = Field(description="Workspace cache (base models, datasets).")
    seed: int | None = Field(None, description="Seed override for this trial (baseline repeats).")


class LaunchPlan(BaseModel):
    """A command to run, exactly: argv (no shell), env additions, cwd."""

    model_config = ConfigDict(extra="forbid")

    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str
    log_path: str
    metrics_path: str
    metrics_format: str = Field("jsonl", description="jsonl | tensorboard | trainer_state | stdout_dicts | openrlhf")
    metric_map: dict[str, str] = Field(default_factory=dict, description="Rename the script's keys onto autorl's.")
    backend: str = "embedded"
    shell: bool = Field(False, description="Run through /bin/sh (only when the recipe asks; values are quoted).")
    ray_address: str | None = None
    resources: dict[str, float] = Field(default_factory=dict)
    cpus: list[int] | None = Field(None, description="Pin the local process to these CPUs (parallel slots).")
    pool_key: str | None = Field(
        None, description="Trials with the same key may share a warm process (None: each its own; docs/warm-trials.md)."
    )


class RunHandle(Protocol):
    def poll(self) -> int | None:
        """Exit code when finished, else None."""

    def cancel(self, grace_s: float = 5.0) -> None:
        """SIGTERM (or stop the job), then SIGKILL after ``grace_s``."""

    def metrics(self) -> list[dict[str, Any]]:
        """New metric records since the last call, in autorl's schema."""

    def last_activity(self) -> float:
        """time.time() of the last output or metric (for the hang watchdog)."""

    def waiting(self) -> Any:
        """What a silent run waits for on its cluster (``ray_demand.Waiting``), or None: a local run waits for none."""


def work(values: Mapping[str, Any], keys: Iterable[str]) -> float:
    """The product of the positive numeric values of ``keys`` (a backend's ``work_keys``; one absent counts 1): how
    much a run of these values does, relative to another's (``autorl.runs.plan``, ``Backend.trial_timeout``)."""
    out = 1.0
    for key in keys:
        v = values.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            out *= float(v)
    return out


@dataclass(frozen=True)
class OomKnob:
    """A train key that grows memory, as an OOM retry reduces it: halved, never below ``floor``.

    ``keys`` are its spellings (the first one the train block has as an integer is reduced); ``whole`` names, per
    key, the keys whose product a value of 0 stands for ('all at once'), made explicit before it is halved;
    ``keeps`` names, per key, a key that doubles as it halves, so the effective batch stays the same."""

    keys: tuple[str, ...]
    floor: int = 1
    whole: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    keeps: Mapping[str, str] = field(default_factory=dict)

    def reduce(self, train: Mapping[str, Any]) -> dict[str, int] | None:
        """The overrides that halve this knob in ``train``, or None when it is absent or at its floor."""
        key = next((k for k in self.keys if isinstance(train.get(k), int) and not isinstance(train.get(k), bool)), None)
        if key is None:
            return None
        value = train[key]
        if value == 0 and key in self.whole:
            value = _product(train, self.whole[key])
            if value % 2:
                return None
        new = max(self.floor, value // 2)
        if new >= value:
            return None
        out = {key: new}
        if key in self.keeps:
            out[self.keeps[key]] = int(train.get(self.keeps[key], 1)) * 2
        return out


def _product(train: Mapping[str, Any], keys: tuple[str, ...]) -> int:
    out = 1
    for key in keys:
        out *= int(train.get(key, 0))
    return out


class Backend:
    """What every backend is: a name, how to plan and start one trial, and optional hooks with defaults.

    Called by the trial lifecycle (``autorl.trial``), in this order:

    - ``check(recipe, root)`` once per study, before anything is written: raise ``RecipeError`` for a recipe this
      backend cannot run (missing files, a flag the installed version lacks);
    - ``prepare(recipe, cache_dir, run_dir)`` once per study, outside every trial's timeout: build what all trials
      share (the embedded base model); returns an exit code or None;
    - ``warnings(recipe, root)`` once per study, after ``check``: lines the study prints and then runs anyway;
    - ``preflight(recipe, worktree)`` before each launch: the failed checks as one line ('' when all pass);
    - ``plan(spec)`` then ``start(plan)`` for each run;
    - ``eval_plan(spec)`` after a training run that exited 0: the per-item evaluation of the policy it trained
      (``python -m autorl.evaluate`` on its checkpoint), run as a second child process whose eval records join the
      trial's metrics; None when the training run already evaluates per item (the embedded engine);
    - ``close()`` once at the end of the study (stop a Ray head this backend started).

    ``runs_on_ray`` says that ``start`` submits a Ray job itself (the lifecycle then never wraps it in one).

    What only a backend knows about its own ``train`` keys, so that nothing outside ``backends/`` names them:

    - ``oom_knobs``, read by ``oom_retry``: what an out-of-memory retry reduces, in order;
    - ``work_keys``: the keys whose values multiply a trial's duration (``autorl.runs.plan`` scales by them);
    - ``steps_key`` / ``episodes_key``: where ``autorl promote --steps`` / ``--episodes`` go (``full_run_values``);
    - ``grad_clip_key``: the gradient clipping norm, which the grad-explosion abort rule scales by;
    - ``trial_values``: a proposal's values as the trial runs them (the embedded engine pins its eval length);
    - ``planned_steps``: the last step a run logs;
    - ``held_out``: the held-out splits a run evaluates per item (what the hack gate checks a gain against).
    """

    name = "base"
    runs_on_ray = False
    oom_knobs: tuple[OomKnob, ...] = ()
    work_keys: tuple[str, ...] = ("steps",)
    steps_key: str | None = "steps"
    episodes_key: str | None = None
    grad_clip_key: str | None = None

    def __init__(self, ray_address: str | None = None, extra_env: dict[str, str] | None = None):
        self.ray_address = ray_address
        self.extra_env = extra_env or {}

    def check(self, recipe: Any, root: Path) -> None:
        """Raise RecipeError naming what is wrong; the default accepts every recipe."""

    def prepare(self, recipe: Any, cache_dir: Path, run_dir: Path) -> int | None:
        """Build what every trial shares; the default has nothing to build."""
        return None

    def prepare_single(self, recipe: Any, cache_dir: Path, run_dir: Path) -> int | None:
        """What one run outside a study (`autorl train`) builds before its timeout starts; the default nothing (a
        backend whose ``prepare`` starts services a single run does not need keeps it so)."""
        return None

    def preflight(self, recipe: Any, worktree: Path) -> str:
        """The failed pre-launch checks as one line; the default has none."""
        return ""

    def warnings(self, recipe: Any, root: Path) -> list[str]:
        """What may make ``recipe`` learn less than it could, one line each, told once at the study's start (the
        study still runs); the default has none."""
        return []

    def describe_job(self, spec: TrialSpec, plan: LaunchPlan) -> dict | None:
        """What a Ray job of this backend gets (Python, runtime env, files, eval); None when it submits no job."""
        return None

    def plan(self, spec: TrialSpec) -> LaunchPlan:
        raise NotImplementedError

    def planned_steps(self, recipe: Any) -> int:
        """The last training step a run of ``recipe`` logs (0 when unknown); the default reads ``train.steps``."""
        return int(recipe.train.get("steps") or 0)

    def held_out(self, recipe: Any) -> list[str]:
        """The held-out splits a run of ``recipe`` evaluates per item (the hack gate's task metric): the probe sets
        it names (``probe_id`` / ``probe_ood``); for the GRPO backends that train on a ``task``, the built-in task's
        own ID and OOD splits, or a JSONL task's ``eval_id`` / ``eval_ood`` files (without ``eval_id`` its ID eval
        is its first training prompts, not held out)."""
        train = recipe.train
        probes = [n for n in ("id", "ood") if train.get(f"probe_{n}")]
        if probes or "task" not in train:
            return probes
        if str(train["task"]).startswith("builtin:"):
            return ["id", "ood"]
        return [n for n in ("id", "ood") if train.get(f"eval_{n}")]

    def start(self, plan: LaunchPlan) -> RunHandle:
        """Launch outside the controller's process and return at once; the default is a local process group."""
        return LocalProcess(plan)

    def eval_plan(self, spec: TrialSpec) -> LaunchPlan | None:
        """The per-item evaluation run after training; the default: the training run evaluates itself."""
        return None

    def checkpoint_glob(self, spec: TrialSpec) -> str | None:
        """A glob of the checkpoint folders the run saves as it trains (a folder's step: the last number in its
        name), which a promoted full run evaluates with ``eval_plan``'s evaluator as they appear, so its OOD early
        stop has evals to watch and its best checkpoint is kept; the default: none (the run evaluates itself)."""
        return None

    def close(self) -> None:
        """Release what the backend holds across trials; the default holds nothing."""

    # ---- what only the backend knows about its train keys --------------------------------------------------------
    def oom_retry(self, train: Mapping[str, Any], changed: Iterable[str] = ()) -> dict[str, Any] | None:
        """The train overrides of one retry after an out-of-memory crash, or None when nothing can be reduced.

        The first of ``oom_knobs`` that can go lower is halved, except that a knob this trial changed against its
        parent (``changed``) goes first: undo the most recent memory-expanding change before abandoning the axis."""
        moved = set(changed)
        for knob in sorted(self.oom_knobs, key=lambda k: not moved & set(k.keys)):
            out = knob.reduce(train)
            if out:
                return out
        return None

    def trial_timeout(self, base: Any, values: Mapping[str, Any]) -> float:
        """The wall-clock limit of a trial of study recipe ``base`` that changes ``values``: the recipe's
        ``timeout_s`` is for the recipe as written, and a trial whose ``work_keys`` multiply its work by k gets k
        times it (never less). A search that reaches gens 32 from gens 8 runs four times the rollouts a step: on a
        real H200 such a trial took 512 s in a warm pool and would have needed about 690 s cold, past a recipe's
        600 s set for gens 8. A hang is still the silence watchdog's to catch."""
        full = {**base.train, **values}
        return float(base.timeout_s) * max(1.0, work(full, self.work_keys) / work(base.train, self.work_keys))

    def trial_values(self, values: dict[str, Any], base: Any) -> dict[str, Any]:
        """The train values a trial of study recipe ``base`` runs with when a proposal changes ``values``;
        the default: exactly those."""
        return values

    def full_run_values(
        self, recipe: Any, steps: int | None, episodes: int | None, eval_every: int | None = None
    ) -> dict[str, Any]:
        """Train values of a promoted full run: the recipe's ``full`` block, then the lengths asked for, then what
        evaluates its checkpoints every ``eval_every`` steps (``checkpoint_eval_values``)."""
        values = dict(recipe.full)
        if eval_every is not None:
            values.update(self.checkpoint_eval_values(eval_every))
        for asked, key, flag in ((steps, self.steps_key, "--steps"), (episodes, self.episodes_key, "--episodes")):
            if asked is None:
                continue
            if key is None:
                raise UserError(
                    f"the {self.name} backend has no run length that {flag} sets: "
                    f"use {'--episodes' if flag == '--steps' else '--steps'} or the recipe's full block"
                )
            values[key] = asked
        return values

    def checkpoint_eval_values(self, every: int) -> dict[str, Any]:
        """Train values that make a full run evaluate its checkpoints every ``every`` steps (``autorl promote
        --eval-every``); a backend that cannot says so in one line."""
        raise UserError(
            f"the {self.name} backend has no setting that evaluates a full run's checkpoints as it trains: drop "
            "--eval-every (the full run is still evaluated at its end)"
        )

    def gpus_per_run(self, recipe: Any) -> float:
        """GPUs of the host one run of ``recipe`` occupies while it runs: parallel trials start only while that many
        are free, instead of a job waiting for GPUs (or failing) once started. The default: none counted (the slots
        give a local run its own GPU)."""
        return 0.0

    def max_grad_norm(self, recipe: Any) -> float | None:
        """The gradient clipping norm of ``recipe`` (None when the backend has none or leaves its default)."""
        return recipe.train.get(self.grad_clip_key) if self.grad_clip_key else None


class LocalProcess:
    """A child process in its own process group; stdout+stderr to the log file."""

    def __init__(self, plan: LaunchPlan, reader: Callable[[], list[dict]] | None = None):
        self.plan = plan
        Path(plan.log_path).parent.mkdir(parents=True, exist_ok=True)
        self._log = open(plan.log_path, "ab", buffering=0)
        self.proc = self._launch(plan, {**os.environ, "PYTHONUNBUFFERED": "1", **plan.env})
        self.pid = self.proc.pid
        self._reader = reader or JsonlTail(plan.metrics_path).poll
        self._activity = time.time()
        self._log_size = 0

    def _launch(self, plan: LaunchPlan, env: dict[str, str]) -> Any:
        """Start the process (in its own session, pinned to ``plan.cpus``); returns its ``Popen``."""
        cpus = plan.cpus
        return subprocess.Popen(
            plan.argv if not plan.shell else ["/bin/sh", "-c", plan.argv[0]],
            cwd=plan.cwd,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and not self._log.closed:
            self._log.close()
        return code

    def metrics(self) -> list[dict[str, Any]]:
        recs = self._reader()
        if recs:
            self._activity = time.time()
        return recs

    def last_activity(self) -> float:
        size = _size(self.plan.log_path)
        if size != self._log_size:
            self._log_size, self._activity = size, time.time()
        return self._activity

    def waiting(self) -> None:
        return None

    def cancel(self, grace_s: float = 5.0) -> None:
        kill_group(self.pid, grace_s, self.proc.poll)
        self.proc.wait()
        self.poll()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def gpu_count() -> int:
    """GPUs nvidia-smi lists on this host (0 where nvidia-smi is absent, fails or hangs)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        proc = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in proc.stdout.splitlines() if line.startswith("GPU ")) if proc.returncode == 0 else 0


def kill_group(pid: int, grace_s: float, poll: Callable[[], int | None] | None = None) -> None:
    """SIGTERM the process group of ``pid``, then SIGKILL it after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.time() + wait
        while time.time() < deadline:
            if poll is not None and poll() is not None and not _group_alive(pid):
                return
            if poll is None and not _group_alive(pid):
                return
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def planned_steps(recipe: Any) -> int:
    """The last training step a run of ``recipe`` logs, as its backend plans it (0 when unknown)."""
    return get_backend(recipe.backend).planned_steps(recipe)


def get_backend(name: str, **options: Any) -> Backend:
    """Instantiate a backend by name (imports it lazily)."""
    module, _, attr = BACKENDS[name].backend.partition(":")
    return getattr(importlib.import_module(module), attr)(**options)
