"""Preflight: cheap checks of an OpenRLHF recipe before any GPU is touched (seed 004).

``preflight(recipe)`` returns one :class:`PreflightCheck` per question, each with the
numbers behind its answer:

- ``steps``: total optimizer steps = pool x n_samples // train_batch x episodes
  (OpenRLHF's ``max_steps``; pool = lines of the prompt file, capped by max_samples);
- ``lr_at_step_20``: the LR under linear warmup + ``cosine_with_min_lr`` (min_lr =
  0.1 x target) must reach 30 % of the target by step 20, else a short trial
  never trains at the LR it claims to test (seed 004 §7): the highest LR of its
  first 20 steps counts, so the cosine's fall late in a run of 21-40 steps is not
  read as a starved warm-up; a run of 20 steps or fewer must train at >= 30 % of
  the target on average over its steps;
- ``disk:<path>``: free space at save_path and ckpt_path vs the expected checkpoints;
- ``patches``: every ``patches/*.patch`` written for the installed openrlhf and needed by this recipe (a patch
  marked ``needed for train.offload`` only where the recipe sets ``offload``) is applied
  (``ok=None``, not checked, where openrlhf is not installed);
- ``gpus``: actor + reference + vLLM engines x TP vs GPUs visible here;
- ``files``: the recipe's own files (``prompt_data``, ``eval_dataset``, ``reward_func``) exist in the worktree,
  where the value is a path (it has a file suffix or a leading ``./`` or ``/``); a Hub dataset name
  (``org/name``) or a URL is not checked here (``ok=None``).

The scheduler maths and the step count are pure functions, tested on their own.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from autorl.backends.base import gpu_count
from autorl.backends.openrlhf.params import OpenRLHFParams
from autorl.backends.openrlhf.patches import DEFAULT_DIR, needed_by, site_packages_of
from autorl.backends.openrlhf.patches import check as patch_states

LR_CHECK_STEP = 20
LR_MIN_FRACTION = 0.30
MIN_LR_RATIO = 0.1
LORA_CKPT_GB = 0.1
GB = 1024**3


class PreflightCheck(BaseModel):
    """One preflight answer."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="What was checked, e.g. lr_at_step_20.")
    ok: bool | None = Field(description="True pass, False fail, None not checked here.")
    detail: str = Field(description="The numbers behind the answer.")


def total_steps(pool: int, n_samples: int, train_batch: int, episodes: int) -> int:
    """OpenRLHF's scheduler length: pool x n_samples // train_batch x episodes."""
    return pool * n_samples // train_batch * episodes


def lr_at(step: int, total: int, target: float, warmup_ratio: float, min_ratio: float = MIN_LR_RATIO) -> float:
    """LR at ``step`` under linear warmup (ceil(total x ratio) steps) then cosine down to min_ratio x target."""
    warmup = math.ceil(total * warmup_ratio)
    if step < warmup:
        return target * step / max(1, warmup)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return target * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def lr_reached(total: int, warmup_ratio: float) -> tuple[float, str]:
    """The LR fraction a trial trains at: the highest it reaches by step 20, or its mean over a run of 20 steps or
    fewer. The check is for a warm-up too long for the run (seed 004: the LR must reach meaningful values within
    the step budget); in a run of 21-40 steps the cosine has already come down by step 20 (a 28-step run at 28 % of
    its target there), which is the schedule doing its job after the LR was reached, not a starved trial."""
    if total > LR_CHECK_STEP:
        peak = max(lr_at(step, total, 1.0, warmup_ratio) for step in range(LR_CHECK_STEP + 1))
        return peak, f"by step {LR_CHECK_STEP}"
    mean = sum(lr_at(step, total, 1.0, warmup_ratio) for step in range(total)) / max(1, total)
    return mean, f"mean over all {total} steps"


def pool_size(params: OpenRLHFParams, worktree: Path) -> tuple[int | None, str]:
    """Prompts per episode and where the number came from."""
    path = worktree / params.prompt_data
    if path.is_file():
        with path.open("rb") as fh:
            lines = sum(1 for line in fh if line.strip())
        source = f"{lines} lines in {params.prompt_data}"
    elif params.pool_size:
        lines, source = params.pool_size, "train.pool_size"
    else:
        return None, f"{params.prompt_data} is not a local file and train.pool_size is unset"
    if params.max_samples and params.max_samples < lines:
        return params.max_samples, f"{source}, capped by max_samples={params.max_samples}"
    return lines, source


def check_schedule(params: OpenRLHFParams, worktree: Path) -> list[PreflightCheck]:
    """The step count and the LR reached at step 20."""
    pool, source = pool_size(params, worktree)
    if pool is None:
        return [
            PreflightCheck(name="steps", ok=None, detail=source),
            PreflightCheck(name="lr_at_step_20", ok=None, detail=source),
        ]
    total = total_steps(pool, params.gens, params.train_batch_size, params.num_episodes)
    steps = PreflightCheck(
        name="steps",
        ok=total > 0,
        detail=f"{pool} prompts ({source}) x {params.gens} samples // "
        f"{params.train_batch_size} train batch x {params.num_episodes} episodes = {total} steps",
    )
    frac, where = lr_reached(total, params.lr_warmup_ratio)
    warmup = math.ceil(total * params.lr_warmup_ratio)
    detail = (
        f"LR {where} = {frac * params.lr:.3g} = {frac:.0%} of target {params.lr:.3g} "
        f"(warmup {warmup} of {total} steps, need >= {LR_MIN_FRACTION:.0%})"
    )
    if frac < LR_MIN_FRACTION:
        detail += ": lower lr_warmup_ratio or shrink the pool (max_samples)"
    return [steps, PreflightCheck(name="lr_at_step_20", ok=frac >= LR_MIN_FRACTION, detail=detail)]


def checkpoint_gb(params: OpenRLHFParams, worktree: Path) -> float | None:
    """Expected size of one checkpoint: the recipe's number, LoRA's ~0.1 GB, or the local base model's size."""
    if params.checkpoint_gb:
        return params.checkpoint_gb
    if params.lora_rank:
        return LORA_CKPT_GB
    model = Path(params.pretrain) if Path(params.pretrain).is_absolute() else worktree / params.pretrain
    if model.is_dir():
        return sum(f.stat().st_size for f in model.rglob("*") if f.is_file()) / GB
    return None


def check_disk(params: OpenRLHFParams, worktree: Path) -> list[PreflightCheck]:
    """Free space at save_path (one model) and ckpt_path (max_ckpt_num checkpoints)."""
    size = checkpoint_gb(params, worktree)
    wanted = [("save_path", params.save_path, 1), ("ckpt_path", params.ckpt_path, params.max_ckpt_num or 3)]
    out = []
    for field, path, copies in wanted:
        if not path:
            continue
        if size is None:
            out.append(
                PreflightCheck(name=f"disk:{field}", ok=None, detail="checkpoint size unknown: set train.checkpoint_gb")
            )
            continue
        free = shutil.disk_usage(_existing_parent(worktree / path)).free / GB
        need = size * copies
        out.append(
            PreflightCheck(
                name=f"disk:{field}",
                ok=free >= need,
                detail=f"{path}: {free:.1f} GB free, need {need:.1f} GB ({copies} x {size:.2f} GB)",
            )
        )
    return out


def _existing_parent(path: Path) -> Path:
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path


def check_patches(
    patches_dir: Path, site_packages: Path | None, params: OpenRLHFParams | None = None
) -> PreflightCheck:
    """Every patch the recipe's ``params`` need (None: every patch) applied to the installed openrlhf (None where it
    is not installed)."""
    if site_packages is None:
        return PreflightCheck(name="patches", ok=None, detail="openrlhf is not installed here: not checked")
    states = [
        s
        for s in patch_states(patches_dir, site_packages)
        if s.state != "other version" and needed_by(Path(patches_dir) / s.name, params)
    ]
    if not states:
        return PreflightCheck(
            name="patches",
            ok=None,
            detail=f"no patch in {patches_dir} that this recipe needs targets the openrlhf in {site_packages}",
        )
    missing = [f"{s.name} ({s.state})" for s in states if s.state != "applied"]
    detail = f"{len(states) - len(missing)}/{len(states)} applied in {site_packages}"
    if missing:
        detail += f"; not applied: {', '.join(missing)}: run `autorl patches apply`"
    return PreflightCheck(name="patches", ok=not missing, detail=detail)


def gpus_visible() -> int:
    """GPUs nvidia-smi lists here (0 where nvidia-smi is absent or fails)."""
    return gpu_count()


LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".arrow", ".txt", ".py")


def check_files(params: OpenRLHFParams, worktree: Path) -> PreflightCheck:
    """The recipe's own files that are missing from the worktree (a recipe example names files a team provides)."""
    named = {k: getattr(params, k) for k in ("prompt_data", "eval_dataset", "reward_func")}
    paths = {k: v for k, v in named.items() if v and _is_path(v)}
    missing = [f"{k}: {v}" for k, v in paths.items() if not (worktree / v).is_file()]
    if missing:
        return PreflightCheck(
            name="files",
            ok=False,
            detail=f"not found in {worktree}: {'; '.join(missing)}: add your files "
            "there (the recipe names them, autorl ships none) or change "
            "those keys",
        )
    if not paths:
        return PreflightCheck(
            name="files", ok=None, detail="no local file named (Hub datasets and URLs are not checked here)"
        )
    return PreflightCheck(name="files", ok=True, detail=", ".join(paths.values()) + " found")


def _is_path(value: str) -> bool:
    if value.startswith(("builtin:", "http://", "https://")):
        return False
    return value.startswith(("./", "/", "../")) or value.lower().endswith(LOCAL_SUFFIXES)


def check_gpus(params: OpenRLHFParams, visible: int) -> PreflightCheck:
    """GPUs the run places (actor, reference, vLLM) vs GPUs visible."""
    need = params.gpus_needed()
    detail = (
        f"need {need} (actor {params.actor_num_nodes * params.actor_num_gpus_per_node} + "
        f"vLLM {params.vllm_num_engines} x TP {params.vllm_tensor_parallel_size}"
        f"{'' if params.colocate_actor_ref or params.kl_coef == 0 else ' + reference'}"
        f"{', colocated' if params.colocate_all else ''}), {visible} visible"
    )
    return PreflightCheck(name="gpus", ok=visible >= need, detail=detail)


def preflight(
    recipe,
    worktree: str | Path = ".",
    patches_dir: str | Path | None = None,
    site_packages: str | Path | None = "auto",
    visible: int | None = None,
) -> list[PreflightCheck]:
    """All checks for an OpenRLHF ``recipe`` (an ``autorl.recipe.Recipe``)."""
    params = recipe.params
    root = Path(worktree)
    site = site_packages_of() if site_packages == "auto" else (Path(site_packages) if site_packages else None)
    local = root / "patches"  # a workspace's own patches, where it has any (`autorl init` makes the folder empty)
    patches = Path(patches_dir) if patches_dir else (local if any(local.glob("*.patch")) else DEFAULT_DIR)
    return [
        *check_schedule(params, root),
        *check_disk(params, root),
        check_patches(patches, site, params),
        check_gpus(params, gpus_visible() if visible is None else visible),
        check_files(params, root),
    ]
