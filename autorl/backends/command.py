"""The command backend: run any training script, with recipe values filled into its command line.

The recipe's ``train`` block holds the command as a template and the values to
put in it::

    backend: command
    train:
      argv: [accelerate, launch, scripts/train.py, --learning-rate, "{lr}", --output-dir, "{run_dir}/out"]
      metrics: "{run_dir}/out"
      metrics_format: trainer_state
      lr: 1.0e-5

Every ``{name}`` names a key of ``train`` (structural fields included), or one
of the values autorl always provides: ``run_dir``, ``seed``, ``cache_dir``,
``attempt`` and ``worktree``. A Python format spec is allowed (``{lr:.1e}``).
By default the command runs without a shell: a string template is split
shell-style first and each value lands in exactly one argument. With
``shell: true`` the template is one string given to ``/bin/sh -c`` and every
value is ``shlex.quote``-d, so a value can never add a command.

With ``checkpoint`` (where the script saves its final Hugging Face model or LoRA adapter) and a probe set
(``probe_id`` / ``probe_ood``), ``eval_plan`` runs the shared per-item evaluator (``python -m autorl.evaluate``)
on that checkpoint once the command exits 0, so the verdict has per-item results whatever the script logs.
A script that exits 0 without saving there ends the trial as a crash whose root cause names the path.
"""

from __future__ import annotations

import os
import shlex
import string
import sys
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from autorl import gitops
from autorl.backends.base import Backend, LaunchPlan, LocalProcess, OomKnob, TrialSpec
from autorl.backends.readers import Reader, make_reader
from autorl.errors import RecipeError
from autorl.evaluate import ProbeSettings, eval_argv

# Values every template may use besides the train keys; filled in by plan().
PROVIDED_KEYS = ("run_dir", "seed", "cache_dir", "attempt", "worktree")

_STRUCTURAL = (
    "argv",
    "shell",
    "env",
    "cwd",
    "metrics",
    "metrics_format",
    "metric_map",
    "checkpoint",
    "checkpoint_base",
    "checkpoints",
    *ProbeSettings.model_fields,
)


class CommandParams(ProbeSettings):
    """The ``train`` block of a command recipe. Extra keys are placeholder values."""

    model_config = ConfigDict(extra="allow")
    run_length_keys: ClassVar[tuple[str, ...]] = ("steps", "num_episodes", "max_epochs")  # the scripts' usual names

    argv: list[str] | str = Field(
        description="The command template: a list of arguments, or one string (split shell-style, or run by /bin/sh "
        "when shell is true). '{key}' is replaced by train.key."
    )
    shell: bool = Field(
        False, description="Run the template through /bin/sh -c; every substituted value is shell-quoted."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment variables added for the run; values are templates too."
    )
    cwd: str = Field(".", description="Working directory, relative to the trial's worktree.")
    metrics: str = Field(
        "{run_dir}/metrics.jsonl",
        description="Metrics file or directory, relative to cwd (template; '{run_dir}' allowed). Ignored for "
        "stdout_dicts.",
    )
    metrics_format: Literal["jsonl", "tensorboard", "trainer_state", "stdout_dicts"] = Field(
        "jsonl",
        description="How the script logs: JSONL lines, TensorBoard events, trainer_state.json, or printed dicts on "
        "stdout.",
    )
    metric_map: dict[str, str] = Field(
        default_factory=dict,
        description="Script key -> autorl key, on top of the TRL defaults (e.g. {'rewards/em/mean': 'correctness'}).",
    )
    seed: int = Field(0, description="Seed, available as '{seed}'; a baseline repeat overrides it.")
    lr: float | None = Field(None, ge=0, description="Learning rate, available as '{lr}'.")
    eps_clip: float | None = Field(None, gt=0, description="PPO clip epsilon, available as '{eps_clip}'.")
    kl_coef: float | None = Field(None, ge=0, description="KL coefficient, available as '{kl_coef}'.")
    gens: int | None = Field(None, ge=1, description="Completions per prompt, available as '{gens}'.")
    checkpoint: str | None = Field(
        None,
        description=(
            "Where the script saves its final Hugging Face model or LoRA adapter, relative to cwd (template; "
            "'{run_dir}' allowed). With probe_id/probe_ood, autorl evaluates it per item after training."
        ),
    )
    checkpoint_base: str | None = Field(
        None,
        description=(
            "Base model of a LoRA adapter checkpoint, a path relative to cwd or a hub name (template); default: "
            "the adapter's own record of it."
        ),
    )
    checkpoints: str | None = Field(
        None,
        description=(
            "A glob of the Hugging Face checkpoint folders the script saves as it trains, relative to cwd (template; "
            "e.g. '{run_dir}/out/checkpoint-*', the step being the last number of a folder's name). With probe sets, "
            "a promoted full run evaluates each as it appears: its OOD early stop watches them and the best is kept."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> CommandParams:
        if self.shell and not isinstance(self.argv, str) and len(self.argv) != 1:
            raise ValueError("shell: true takes the command as one string: write argv as a string")
        if not self.shell and not self.argv:
            raise ValueError("argv is empty: give the command to run")
        if Path(self.cwd).is_absolute():
            raise ValueError(f"cwd '{self.cwd}' must be relative to the worktree")
        for key, value in (self.model_extra or {}).items():
            if not isinstance(value, (str, int, float, bool)) and value is not None:
                raise ValueError(f"train.{key} must be a scalar to be used in the command (got {type(value).__name__})")
        missing = sorted(set(template_fields(self)) - set(self.values()) - set(PROVIDED_KEYS))
        if missing:
            raise ValueError(
                f"the command uses '{{{missing[0]}}}', which names no train key with a value: add {missing[0]} to "
                f"train or fix the placeholder"
            )
        _check_eval(self)
        return self

    def values(self) -> dict[str, Any]:
        """Every train key with a value (structural fields and extras), for the templates."""
        data = self.model_dump(exclude=set(_STRUCTURAL))
        return {k: v for k, v in data.items() if v is not None}

    def templates(self) -> list[str]:
        """Every string that is filled in: argv, env values, the metrics path and the checkpoint paths."""
        argv = [self.argv] if isinstance(self.argv, str) else list(self.argv)
        paths = [t for t in (self.checkpoint, self.checkpoint_base, self.checkpoints) if t]
        return argv + list(self.env.values()) + [self.metrics] + paths


def _check_eval(params: CommandParams) -> None:
    """Probe sets need a checkpoint to evaluate and their own completion limit (one eval protocol per study); the
    checkpoints a run saves as it trains need a probe set to be evaluated on."""
    splits = params.probe_splits()
    if splits and not params.checkpoint:
        raise ValueError(
            f"probe_{next(iter(splits))} needs checkpoint: name where the script saves its final model "
            "(the evaluator runs on it)"
        )
    if params.checkpoints and not splits:
        raise ValueError(
            "checkpoints needs a probe set (probe_id or probe_ood): a full run evaluates each checkpoint on it"
        )
    if splits and params.probe_max_new_tokens is None:
        raise ValueError(
            "probe sets need probe_max_new_tokens: the evaluation's completion limit, fixed for the "
            "study whatever the command's own limit is"
        )


def template_fields(params: CommandParams) -> list[str]:
    """The placeholder names used by the command, env and metrics templates."""
    names = []
    for text in params.templates():
        try:
            names += [field for _, field, _, _ in _parse(text) if field is not None]
        except RecipeError as exc:
            raise ValueError(str(exc)) from None
    return names


def render(template: str, values: dict[str, Any], quote: bool = False) -> str:
    """Fill ``{name}`` / ``{name:spec}`` placeholders; ``quote`` shell-quotes each value."""
    out = []
    for literal, field, spec, conversion in _parse(template):
        out.append(literal)
        if field is None:
            continue
        if field not in values:
            raise RecipeError(
                f"the command uses '{{{field}}}', which names no train key with a value: add {field} to train or "
                f"fix the placeholder"
            )
        value = values[field]
        value = repr(value) if conversion == "r" else str(value) if conversion == "s" else value
        text = format(value, spec or "")
        out.append(shlex.quote(text) if quote else text)
    return "".join(out)


def _parse(template: str) -> list[tuple[str, str | None, str | None, str | None]]:
    try:
        return list(string.Formatter().parse(template))
    except ValueError as exc:
        raise RecipeError(f"command template {template!r}: {exc} (write literal braces as '{{{{' and '}}}}')") from None


class CommandRun(LocalProcess):
    """A LocalProcess whose reader is told when the run has exited (to release held-back steps)."""

    _reader: Reader

    def metrics(self) -> list[dict[str, Any]]:
        recs = self._reader(final=self.proc.poll() is not None)
        if recs:
            self._activity = time.time()
        return recs


class CommandBackend(Backend):
    """Plans and starts a recipe's own command; metrics come back through a reader."""

    name = "command"
    # A script's keys are its own: these are the names training scripts commonly give the same knobs.
    oom_knobs = (
        OomKnob(
            ("micro_batch", "micro_train_batch_size", "per_device_train_batch_size"),
            whole={"micro_batch": ("batch_prompts", "gens")},
            keeps={"per_device_train_batch_size": "gradient_accumulation_steps"},
        ),
        OomKnob(("gens", "n_samples_per_prompt", "num_generations"), floor=2),
        OomKnob(("max_new_tokens", "generate_max_len", "max_completion_length")),
    )
    work_keys = (
        "steps",
        "gens",
        "batch_prompts",
        "ppo_epochs",
        "max_new_tokens",
        "rollout_batch_size",
        "num_episodes",
        "max_samples",
    )
    steps_key, episodes_key, grad_clip_key = "max_steps", "num_episodes", "max_grad_norm"

    def plan(self, spec: TrialSpec) -> LaunchPlan:
        params = spec.recipe.params
        run_dir = Path(spec.run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        values = {**params.values(), **_provided(spec, params, run_dir)}
        cwd = (Path(spec.worktree) / params.cwd).resolve()
        log_path = run_dir / "train.log"
        metrics = log_path if params.metrics_format == "stdout_dicts" else cwd / render(params.metrics, values)
        env = {
            **self.extra_env,
            "AUTORL_RUN_DIR": str(run_dir),
            "AUTORL_SEED": str(values["seed"]),
            **{k: render(v, values) for k, v in params.env.items()},
        }
        return LaunchPlan(
            argv=_argv(params, values),
            env=env,
            cwd=str(cwd),
            log_path=str(log_path),
            metrics_path=str(metrics),
            metrics_format=params.metrics_format,
            metric_map=dict(params.metric_map),
            backend=self.name,
            shell=params.shell,
        )

    def start(self, plan: LaunchPlan) -> CommandRun:
        reader = make_reader(plan.metrics_format, plan.metrics_path, plan.metric_map)
        return CommandRun(plan, reader)

    def check(self, recipe: Any, root: Path) -> None:
        """Fail before launch, with one line, when a probe set named by the recipe is not there."""
        for name, path in recipe.params.probe_splits().items():
            problem = _probe_problem(Path(root), path)
            if problem:
                raise RecipeError(f"train.probe_{name}: {path} {problem}")

    def checkpoint_glob(self, spec: TrialSpec) -> str | None:
        """The recipe's ``checkpoints`` glob, filled in and absolute; None without it or without probe sets."""
        params = spec.recipe.params
        if not (params.checkpoints and params.probe_splits()):
            return None
        values, cwd = _filled(spec)
        return str(cwd / render(params.checkpoints, values))

    def eval_plan(self, spec: TrialSpec) -> LaunchPlan | None:
        """``python -m autorl.evaluate`` on ``checkpoint`` after the command exits 0; None without checkpoint
        or probe sets.

        Its output goes to the end of ``train.log``, so a missing checkpoint is the root cause triage reads.
        """
        params = spec.recipe.params
        if not (params.checkpoint and params.probe_splits()):
            return None
        run_dir = Path(spec.run_dir).resolve()
        values, cwd = _filled(spec)
        base = render(params.checkpoint_base, values) if params.checkpoint_base else None
        argv = eval_argv(
            sys.executable,
            cwd / render(params.checkpoint, values),
            run_dir / "eval.jsonl",
            _probe(params, Path(spec.worktree)),
            params.probe_max_new_tokens or 0,
            base,
            self.planned_steps(spec.recipe),
            values["seed"],
        )
        env = {
            **self.extra_env,
            "AUTORL_RUN_DIR": str(run_dir),
            **{k: render(v, values) for k, v in params.env.items()},
        }
        return LaunchPlan(
            argv=argv,
            env=env,
            cwd=str(cwd),
            log_path=str(run_dir / "train.log"),
            metrics_path=str(run_dir / "eval.jsonl"),
            backend=self.name,
        )


def _filled(spec: TrialSpec) -> tuple[dict[str, Any], Path]:
    """The values the eval's templates are filled with, and the command's working directory (absolute)."""
    params = spec.recipe.params
    values = {**params.values(), **_provided(spec, params, Path(spec.run_dir).resolve())}
    return values, (Path(spec.worktree) / params.cwd).resolve()


def _probe_problem(root: Path, path: str) -> str:
    """Why a probe set would be missing from a trial's worktree ('' when it is there)."""
    if not (root / path).is_file():
        return "not found (relative to the repository root)"
    inside = not Path(path).is_absolute()
    if inside and gitops.show_file(root, "HEAD", os.path.normpath(path)) is None:
        return "is not committed: trials run in git worktrees of your commits, so commit it first"
    return ""


def _probe(params: CommandParams, worktree: Path) -> ProbeSettings:
    """The recipe's probe settings, probe set paths made absolute (they are relative to the worktree)."""
    probe = ProbeSettings(**{k: getattr(params, k) for k in ProbeSettings.model_fields})
    paths = {f"probe_{n}": str((worktree / p).resolve()) for n, p in probe.probe_splits().items()}
    return probe.model_copy(update=paths)


def _provided(spec: TrialSpec, params: CommandParams, run_dir: Path) -> dict[str, Any]:
    seed = spec.seed if spec.seed is not None else params.seed
    return {
        "run_dir": str(run_dir),
        "seed": seed,
        "cache_dir": str(Path(spec.cache_dir).resolve()),
        "attempt": spec.attempt,
        "worktree": str(Path(spec.worktree).resolve()),
    }


def _argv(params: CommandParams, values: dict[str, Any]) -> list[str]:
    if params.shell:
        template = params.argv if isinstance(params.argv, str) else params.argv[0]
        return [render(template, values, quote=True)]
    tokens = shlex.split(params.argv) if isinstance(params.argv, str) else params.argv
    return [render(token, values) for token in tokens]
