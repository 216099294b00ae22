"""The TRL backend: one trial = one ``GRPOTrainer`` run in a child process.

``TRLParams`` is the recipe's ``train`` block: it derives from the embedded engine's
``GRPOParams`` (``lr``, ``eps_clip``, ``kl_coef``, ``gens`` ...), so recipes move between
the two backends and each shared key is declared once. ``grpo_config_kwargs`` maps it
onto TRL's ``GRPOConfig`` field names (``TRL_FIELDS`` is the table);
``autorl.backends.trl_runner`` builds the model, the task and the trainer and writes
metrics in autorl's schema.

This module does not import trl or torch: recipes validate without them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from autorl.backends.base import Backend, LaunchPlan, OomKnob, TrialSpec
from autorl.engine.config import GRPOParams
from autorl.install import install_advice

# TRLParams key -> GRPOConfig field (values copied as they are).
TRL_FIELDS: dict[str, str] = {
    "lr": "learning_rate",
    "eps_clip": "epsilon",
    "eps_clip_high": "epsilon_high",
    "kl_coef": "beta",
    "gens": "num_generations",
    "steps": "max_steps",
    "max_new_tokens": "max_completion_length",
    "temperature": "temperature",
    "loss_type": "loss_type",
    "max_grad_norm": "max_grad_norm",
    "warmup_steps": "warmup_steps",
    "seed": "seed",
    "ppo_epochs": "num_iterations",
}

# GRPOConfig fields autorl always sets: TRL's GPU-leaning defaults off, logging every
# step, no checkpoints, AdamW betas as in the embedded engine.
TRL_FIXED: dict[str, Any] = {
    "bf16": False,
    "fp16": False,
    # TRL turns checkpointing on by default; gradient_checkpointing is the name every transformers 5.x
    # accepts (activation_checkpointing only exists from 5.23).
    "gradient_checkpointing": False,
    "lr_scheduler_type": "constant_with_warmup",
    "report_to": "none",
    "save_strategy": "no",
    "eval_strategy": "no",
    "logging_steps": 1,
    "disable_tqdm": True,
    "adam_beta2": 0.99,
    "weight_decay": 0.0,
    "dataloader_num_workers": 0,
}

SCALE_REWARDS = {True: "group", False: "none", "group": "group", "batch": "batch", "none": "none"}


class TRLParams(GRPOParams):
    """The ``train`` block of a TRL recipe: the keys shared with the embedded engine, plus TRL's own."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(50, ge=1, description="Optimizer steps (GRPOConfig.max_steps).")
    ppo_epochs: int = Field(
        1,
        ge=1,
        description="Optimizer steps per generated batch (GRPOConfig.num_iterations); with 1 clipping is inert.",
    )
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = Field(
        "dapo", description="TRL loss normalisation (GRPOConfig.loss_type)."
    )
    scale_rewards: bool | Literal["group", "batch", "none"] = Field(
        True,
        description="Divide advantages by the group std (true/'group'), the batch std ('batch'), "
        "or not (false/'none').",
    )

    @model_validator(mode="after")
    def _check(self) -> TRLParams:
        if self.model.startswith("builtin:") and self.task != "builtin:addition":
            raise ValueError(
                f"{self.model} only trains on builtin:addition: use a Hugging Face model directory for JSONL tasks"
            )
        if self.task == "builtin:addition" and (self.eval_id or self.eval_ood):
            raise ValueError(
                "eval_id/eval_ood are for JSONL tasks: builtin:addition has its own eval splits, remove them"
            )
        return self


def grpo_config_kwargs(params: TRLParams, output_dir: str, use_cpu: bool = True) -> dict[str, Any]:
    """Keyword arguments for ``trl.GRPOConfig`` that run ``params``."""
    kwargs = {field: getattr(params, key) for key, field in TRL_FIELDS.items()}
    kwargs.update(TRL_FIXED)
    kwargs.update(
        output_dir=output_dir,
        use_cpu=use_cpu,
        data_seed=params.seed,
        per_device_train_batch_size=params.batch_prompts * params.gens,
        scale_rewards=SCALE_REWARDS[params.scale_rewards],
    )
    return kwargs


class TRLBackend(Backend):
    """Plans ``python -m autorl.backends.trl_runner`` on the trial's train block."""

    name = "trl"
    oom_knobs = (OomKnob(("gens",), floor=2), OomKnob(("max_new_tokens",)))  # the batch is batch_prompts x gens
    work_keys = ("steps", "gens", "batch_prompts", "ppo_epochs", "max_new_tokens")
    grad_clip_key = "max_grad_norm"
    requires = ("torch", "trl", "transformers", "datasets")
    """Modules the runner imports; missing ones fail the preflight, before any launch, with how to install them."""

    def preflight(self, recipe: Any, worktree: Path) -> str:
        """Each module the runner needs must be importable by this Python (looked up, not imported): a missing
        transformers otherwise showed up only after launch, as a run that logged nothing."""
        missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
        if not missing:
            return ""
        return (
            f"the trl backend needs {', '.join(missing)} in {sys.executable}: install them with "
            f"{install_advice('trl')} (torch first, as the README says)"
        )

    def plan(self, spec: TrialSpec) -> LaunchPlan:
        run_dir = Path(spec.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        params = spec.recipe.params.model_copy(update={"seed": spec.seed} if spec.seed is not None else None)
        config_path = run_dir / "trl_config.json"
        config_path.write_text(json.dumps(params.model_dump(mode="json"), indent=1, sort_keys=True))
        metrics = run_dir / "metrics.jsonl"
        argv = [
            sys.executable,
            "-m",
            "autorl.backends.trl_runner",
            "--config",
            str(config_path),
            "--metrics-out",
            str(metrics),
            "--cache-dir",
            str(spec.cache_dir),
        ]
        env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **self.extra_env}
        return LaunchPlan(
            argv=argv,
            env=env,
            cwd=str(spec.worktree),
            log_path=str(run_dir / "train.log"),
            metrics_path=str(metrics),
            backend=self.name,
        )
