"""EngineConfig: every knob of the embedded GRPO engine, documented once.

``GRPOParams`` holds the keys shared with the other GRPO backends (TRL), declared once.

Pure pydantic (no torch) so the controller validates recipes without loading the
engine. The four keys the search tunes by default are ``lr``, ``eps_clip``,
``kl_coef`` and ``gens``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import sys
import tokenize
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autorl import loading
from autorl.errors import UserError, short
from autorl.toolkit.task import TaskError, read_jsonl

KEPT_FILE = "kept.json"  # beside a full run's saved weights: which evals best.pt and last.pt hold


class GRPOParams(BaseModel):
    """The train-block keys every GRPO backend shares, declared once.

    ``EngineConfig`` and the TRL backend's ``TRLParams`` derive from it, so a recipe moves
    between them; each adds its own keys, and declares itself the few whose type, bounds
    or default differ between backends (``steps``, ``ppo_epochs``, ``loss_type``,
    ``scale_rewards``). tests/backends/test_trl_backend.py checks that no subclass
    re-declares a key of this model.
    """

    model_config = ConfigDict(extra="forbid")
    run_length_keys: ClassVar[tuple[str, ...]] = ("steps",)  # a recipe's run of 0 of these trains nothing

    @model_validator(mode="after")
    def _check_chat(self) -> GRPOParams:
        if self.chat_template and self.model.startswith("builtin:"):
            raise ValueError(
                f"chat_template needs a Hugging Face model with a chat template; {self.model} has none: "
                "turn chat_template off or give a model directory"
            )
        return self

    # --- what to train on -------------------------------------------------
    model: str = Field(
        "builtin:tiny",
        description="'builtin:tiny' (64x2, 132k params), 'builtin:small' (256x4), "
        "'builtin:gpu' (~60M params) or a local Hugging Face model directory.",
    )
    task: str = Field(
        "builtin:addition", description='\'builtin:addition\' or a JSONL file of {"input", "label"} prompts.'
    )
    eval_id: str | None = Field(
        None, description="JSONL file of ID eval prompts (JSONL tasks only; the built-in task has its own)."
    )
    eval_ood: str | None = Field(None, description="JSONL file of OOD eval prompts (JSONL tasks only).")
    chat_template: bool = Field(
        False,
        description="Give each prompt to the model as one user turn of its chat template (a Hugging Face model "
        "that has one), encoded without special tokens, as OpenRLHF's --data.apply_chat_template does; the "
        "evaluation too.",
    )
    reward: str = Field(
        "builtin:exact_match",
        description="'builtin:exact_match', 'module:function' or a .py path (function named 'reward').",
    )
    sft_target: float = Field(
        0.4, gt=0, lt=1, description="Built-in task: the supervised warm-up stops at this greedy ID pass@1."
    )
    # --- GRPO -------------------------------------------------------------
    lr: float = Field(1e-4, ge=0, description="AdamW learning rate (peak, after warmup).")
    eps_clip: float = Field(0.2, gt=0, description="PPO ratio clip: ratios outside [1-eps, 1+eps_high] are clipped.")
    eps_clip_high: float | None = Field(
        None, gt=0, description="Upper clip (asymmetric clipping); defaults to eps_clip."
    )
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the KL penalty to the frozen reference. 0 builds no reference model."
    )
    gens: int = Field(8, ge=2, le=4096, description="Completions sampled per prompt (the GRPO group size).")
    batch_prompts: int = Field(32, ge=1, le=65536, description="Prompts per GRPO step.")
    max_new_tokens: int = Field(5, ge=1, le=65536, description="Generation length limit.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature for rollouts.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warmup, in optimizer steps.")
    # --- evaluation -------------------------------------------------------
    eval_every: int = Field(
        10, ge=0, description="Evaluate at step 0, every N steps and at the end; 0 = only at 0 and the end."
    )
    eval_size: int = Field(500, ge=1, le=1_000_000, description="Built-in task: items per eval split.")
    # --- run --------------------------------------------------------------
    seed: int = Field(0, description="Seed for sampling and init; with fixed threads a CPU run is reproducible.")
    threads: int = Field(2, ge=1, le=1024, description="torch.set_num_threads on CPU (results depend on it).")


class EngineConfig(GRPOParams):
    """One GRPO run of the embedded engine: the shared keys of ``GRPOParams`` plus the engine's own."""

    model_config = ConfigDict(extra="forbid")

    kl_estimator: Literal["k1", "k3"] = Field(
        "k3", description="Per-token KL estimator: k1 = log(p/q), k3 = q/p - log(q/p) - 1."
    )
    steps: int = Field(50, ge=0, le=10_000_000, description="GRPO steps (rollout + update).")
    ppo_epochs: int = Field(
        2,
        ge=1,
        description="Optimizer passes over each rollout batch (mu). With 1, the ratio "
        "is always 1 and clipping is inert.",
    )
    loss_type: Literal["grpo", "dr_grpo", "token_mean"] = Field(
        "grpo",
        description="'grpo': mean over each sequence's tokens; 'dr_grpo': token sum / max_new_tokens; "
        "'token_mean': every token of the batch weighs the same (OpenRLHF's token-level loss, DAPO's).",
    )
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant",
        description="After the warm-up: 'constant', or 'cosine' down to min_lr_ratio * lr at the last optimizer "
        "step (OpenRLHF's cosine_with_min_lr).",
    )
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Where the cosine schedule ends, as a share of lr.")
    adam_beta2: float = Field(
        0.99, gt=0, lt=1, description="AdamW's second-moment decay (beta1 is 0.9; OpenRLHF and DeepSpeed use 0.95)."
    )
    scale_rewards: bool = Field(True, description="Divide advantages by the group std (floored); off = Dr. GRPO.")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight.")
    micro_batch: int = Field(
        0, ge=0, description="Completions per backward pass (gradient accumulation); 0 = all at once."
    )
    eval_k: int = Field(0, ge=0, description="Sampling pass@k on the eval sets (0 = off).")
    eval_temperature: float = Field(0.6, ge=0, description="Temperature for sampling pass@k.")
    eval_max_new_tokens: int = Field(
        0,
        ge=0,
        description="Generation limit at eval; 0 = max_new_tokens. Fix it per "
        "study so a trial that changes max_new_tokens keeps the eval.",
    )
    save_best: str | None = Field(
        None,
        description="Eval metric (maximised) whose best eval's weights are saved "
        "as best.pt beside the metrics file, and the last eval's as last.pt (or "
        "best.pt when it is the best); None = save nothing.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="'auto' picks CUDA when available.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="'auto' = bf16 autocast on CUDA, float32 on CPU."
    )
    nan_check: bool = Field(True, description="Stop with exit code 3 when the loss or grad norm turns NaN/inf.")

    @model_validator(mode="after")
    def _check(self) -> EngineConfig:
        if self.eval_k > 1 and self.eval_temperature == 0:
            raise ValueError(
                "eval_k > 1 with eval_temperature 0 samples the same answer k times: set eval_temperature > 0 "
                "or eval_k to 1"
            )
        if self.micro_batch and (self.batch_prompts * self.gens) % self.micro_batch:
            raise ValueError(
                f"micro_batch {self.micro_batch} must divide batch_prompts*gens = {self.batch_prompts * self.gens}"
            )
        return self


def check_files(config: EngineConfig, cwd: Path) -> str | None:
    """The first problem with the files a config names (relative to ``cwd``), or None.

    Runs on the controller side before launch, without importing torch or running the user's code: a task file
    must be a JSONL file the engine can read (UTF-8, one {"input", "label"} object a line), and a custom reward
    must be found (its packages are located, not imported) and compile.
    """
    for field in ("task", "eval_id", "eval_ood"):
        value = getattr(config, field)
        if value and not value.startswith("builtin:"):
            if not (cwd / value).is_file():
                return f"train.{field}: file {value} not found (relative to {cwd}): give an existing JSONL path"
            try:
                read_jsonl(str(cwd / value), field)
            except TaskError as exc:
                return f"train.{field}: {exc}"
    if not config.model.startswith("builtin:") and not (cwd / config.model / "config.json").is_file():
        return (
            f"train.model: {config.model} is not a local Hugging Face model directory (no config.json): "
            "give one or builtin:tiny"
        )
    return _check_reward(config.reward, cwd)


SOURCE_MAX_BYTES = 16 << 20  # a reward's Python source (and each package __init__ on its way)


def _check_reward(spec: str, cwd: Path) -> str | None:
    if spec.startswith("builtin:"):
        return None
    if spec.endswith(".py"):
        path = cwd / spec
        if not path.is_file():
            return f"train.reward: file {spec} not found (relative to {cwd}): give an existing .py path"
        return _compiles(path, cwd)
    if ":" not in spec:
        return f"train.reward: '{spec}' is neither module:function nor a .py file"
    module = spec.split(":", 1)[0]
    try:
        files = _module_files(module, cwd)
    except _ImportFailed as exc:
        return f"train.reward: looking up module {module} failed ({exc}): fix the package or use a .py path"
    if files is None:
        return f"train.reward: module {module} not found (from {cwd}): check the name or use a .py path"
    return next((p for p in (_compiles(f, cwd) for f in files) if p), None)


def _compiles(path: Path, cwd: Path) -> str | None:
    """What is wrong with the Python source at ``path`` (not a readable file, not in its declared encoding, does
    not compile), or None. Compiled, never run."""
    try:
        data = loading.read_bytes(path, UserError, "train.reward: file", SOURCE_MAX_BYTES)
    except UserError as exc:
        return str(exc)
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        name = "UTF-8" if exc.encoding.lower().replace("_", "-").startswith("utf-8") else exc.encoding
        return (
            f"train.reward: {path} is not {name} text (line {line}, byte {exc.start}): save it as UTF-8 "
            "(or declare its encoding in a '# -*- coding: NAME -*-' line)"
        )
    except (SyntaxError, LookupError) as exc:  # an encoding line naming no codec
        return f"train.reward: {path}: {short(exc, 200)}: fix its '# -*- coding: NAME -*-' line"
    try:
        compile(data, str(path), "exec")
    except (SyntaxError, ValueError) as exc:
        lineno = getattr(exc, "lineno", None)
        at = f" line {lineno}" if lineno else ""
        msg = getattr(exc, "msg", None) or short(exc, 200)
        shown = path.relative_to(cwd) if path.is_relative_to(cwd) else path
        return f"train.reward: {shown}{at} does not compile ({msg}): fix the reward"
    return None


class _ImportFailed(Exception):
    """Importing a reward module's parent package (to find the module) raised or exited."""


def _module_files(module: str, cwd: Path) -> list[Path] | None:
    """The Python source files of ``module`` as the engine would import it (cwd first on the path): each package's
    ``__init__.py`` on the way, then the module's own file (a compiled module has none); None when it is not found.

    Located on the file system, without importing anything: checking a recipe runs none of the user's code. Only a
    name that no path entry holds (a top-level one a custom finder serves, or ``os.path``, which its imported
    package holds) falls back to ``importlib``, whose import of a parent package is contained: what it raises, or
    a ``SystemExit``, is ``_ImportFailed``."""
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    path: list[str] = [str(cwd), *sys.path]
    files: list[Path] = []
    for i in range(len(parts)):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), path)
        if spec is None:  # a name no path entry holds: a custom finder's, or a module its package has imported
            parent = ".".join(parts[:i])
            return _found_by_import(module, cwd) if i == 0 or parent in sys.modules else None
        if spec.origin and spec.has_location:
            files.append(Path(spec.origin))
        elif i == len(parts) - 1:
            return None  # a namespace package: no file to take a function from
        path = list(spec.submodule_search_locations or [])
        if i < len(parts) - 1 and not path:  # a module where a package is named (os.path: os is imported)
            return _found_by_import(module, cwd) if ".".join(parts[: i + 1]) in sys.modules else None
    return [f for f in files if f.suffix == ".py"]


def _found_by_import(module: str, cwd: Path) -> list[Path] | None:
    sys.path.insert(0, str(cwd))
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    except (Exception, SystemExit) as exc:
        raise _ImportFailed(f"{type(exc).__name__}: {short(exc, 200)}") from None
    finally:
        sys.path.remove(str(cwd))
    if spec is None or spec.origin is None:  # not there, or a namespace package
        return None
    origin = spec.origin  # "built-in", "frozen": found, with no source to compile
    return [Path(origin)] if origin.endswith(".py") and Path(origin).is_file() else []
