"""The base model of the built-in task: a deterministic supervised warm-up, cached.

A freshly initialised model cannot add, so GRPO would see only zero rewards.
Before the first trial the engine trains the model on the task's training
problems (answer tokens only; AdamW, batch 128, fixed seed and thread count)
and stops at the first evaluation (every 25 steps) whose greedy ID pass@1
reaches ``sft_target``. On the tiny model that takes 200-450 steps and a few
seconds and leaves GRPO a base of roughly 40-60 %.

The result is cached as ``<cache-dir>/base-<hash>.pt``, the hash covering the
model, task, eval size, target, device type and these settings. It is written
to a temporary file and moved into place with ``os.replace``; a lock file makes
a second concurrent run wait and then reuse it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import TypedDict

import torch
import torch.nn.functional as F

from autorl.toolkit.policy_eval import correct_flags
from autorl.toolkit.task import TASK_VERSION


class SftSettings(TypedDict):
    """What the supervised warm-up runs with (hashed into the cached base's key)."""

    batch: int
    eval_every: int
    max_steps: int
    seed: int
    threads: int
    betas: tuple[float, float]
    max_grad_norm: float
    version: int


SFT_SETTINGS: SftSettings = {
    "batch": 128,
    "eval_every": 25,
    "max_steps": 3000,
    "seed": 0,
    "threads": 2,
    "betas": (0.9, 0.98),
    "max_grad_norm": 1.0,
    "version": 1,
}
# (largest parameter count, SFT learning rate): wider models need a smaller lr
SFT_LR_BY_SIZE = [(300_000, 3e-3), (5_000_000, 1e-3), (float("inf"), 3e-4)]


def sft_lr(n_params: int) -> float:
    """The warm-up learning rate for a model of ``n_params`` parameters."""
    return next(lr for limit, lr in SFT_LR_BY_SIZE if n_params <= limit)


def base_key(config, device_type: str) -> str:
    """Hash of everything that determines the warmed-up weights."""
    model_id = config.model
    if not model_id.startswith("builtin:"):
        model_id = str(Path(model_id).resolve()) + (Path(model_id) / "config.json").read_text()
    blob = json.dumps(
        [model_id, config.task, TASK_VERSION, config.eval_size, config.sft_target, device_type, SFT_SETTINGS],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _training_tensors(policy, task, device):
    rows = [
        policy.tokenizer.encode(p) + policy.tokenizer.answer_ids(a)
        if policy.kind == "builtin"
        else policy.tok(p)["input_ids"] + policy.answer_ids(a)
        for p, a in zip(task.train.prompts, task.train.labels)
    ]
    prompt_len = len(policy.encode(task.train.prompts[:1])[0][0])
    width = max(map(len, rows))
    pad = policy.tokenizer.pad_id if policy.kind == "builtin" else policy.pad_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    targets = ids[:, 1:].clone()
    targets[:, : prompt_len - 1] = -100
    lengths = torch.tensor([len(r) for r in rows])
    targets[torch.arange(width - 1)[None, :] >= (lengths[:, None] - 1)] = -100
    return ids.to(device), targets.to(device)


def supervised_warmup(
    policy, task, config, judge, log=print, max_steps: int = SFT_SETTINGS["max_steps"], temperature: float = 0.0
) -> dict:
    """Train ``policy`` in place until ID pass@1 >= config.sft_target (or ``max_steps``); return what happened.

    The check samples at ``temperature``: 0 (greedy, the built-in task's base) or a rollout temperature, for a
    base whose sampled answers must already earn GRPO a reward."""
    torch.manual_seed(SFT_SETTINGS["seed"])
    rng = random.Random(SFT_SETTINGS["seed"])
    ids, targets = _training_tensors(policy, task, policy.device)
    params = [p for p in policy.module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        params, lr=sft_lr(sum(p.numel() for p in params)), betas=SFT_SETTINGS["betas"], weight_decay=0.0
    )
    split, score, step, t0 = task.evals["id"], 0.0, 0, time.time()
    mode = "greedy" if temperature == 0 else f"T={temperature:g} sampled"
    while step < max_steps:
        idx = torch.tensor(rng.sample(range(len(ids)), SFT_SETTINGS["batch"]), device=ids.device)
        mask = torch.ones_like(ids[idx, :-1], dtype=torch.bool)
        logits = policy.logits(ids[idx, :-1], mask)
        loss = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), targets[idx].reshape(-1), ignore_index=-100
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, SFT_SETTINGS["max_grad_norm"])
        opt.step()
        step += 1
        if step % SFT_SETTINGS["eval_every"] == 0:
            flags = correct_flags(policy, split.prompts, split.labels, config.max_new_tokens, temperature, judge)
            score = sum(flags) / len(flags)
            log(f"warm-up step {step}: {mode} ID pass@1 {score:.3f}")
            if score >= config.sft_target:
                break
    log(f"warm-up: {step} steps, {mode} ID pass@1 {score:.3f}, {time.time() - t0:.1f} s")
    return {"sft_steps": step, "sft_pass@1": score}


def save_atomic(state: dict, path: Path) -> None:
    """``torch.save`` in one step: a reader (or a kill) sees the old file or the new, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def prepare_base(policy, task, config, cache_dir: str | Path, judge, log=print) -> Path:
    """Load the cached warmed-up weights into ``policy``, building them first if missing."""
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"base-{base_key(config, policy.device.type)}.pt"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            threads = torch.get_num_threads()
            torch.set_num_threads(SFT_SETTINGS["threads"])
            try:
                info = supervised_warmup(policy, task, config, judge, log)
            finally:
                torch.set_num_threads(threads)
            save_atomic({"state_dict": policy.module.state_dict(), **info}, path)
    state = torch.load(path, map_location=policy.device, weights_only=True)
    policy.module.load_state_dict(state["state_dict"])
    return path
