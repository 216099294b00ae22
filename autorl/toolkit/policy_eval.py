"""Evaluation of the engine's live policy through the shared per-item metrics (``autorl.toolkit.peritem``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from autorl.toolkit import peritem as shared
from autorl.toolkit.task import Split

EVAL_CHUNK = 512  # prompts per generate call


def policy_generator(policy, max_new_tokens: int, autocast=contextlib.nullcontext) -> shared.Generate:
    """``generate(prompts, temperature)`` over the engine's policy (builtin or Hugging Face)."""
    eos = torch.tensor(_eos_id(policy))

    def generate(prompts: list[str], temperature: float) -> list[tuple[str, bool]]:
        out: list[tuple[str, bool]] = []
        for start in range(0, len(prompts), EVAL_CHUNK):
            ids, mask = policy.encode(prompts[start : start + EVAL_CHUNK])
            with autocast():
                tokens, _ = policy.sample(ids, mask, max_new_tokens, temperature)
            truncated = ~(tokens == eos.to(tokens.device)).any(-1)
            out += list(zip(policy.decode(tokens), truncated.tolist()))
        return out

    return generate


def _eos_id(policy) -> int:
    return policy.tokenizer.eos_id if policy.kind == "builtin" else policy.eos_id


def correct_flags(
    policy,
    prompts: list[str],
    labels: list[str],
    max_new_tokens: int,
    temperature: float,
    judge: Callable[[str, str, bool], float],
    autocast=contextlib.nullcontext,
) -> list[int]:
    """0/1 per prompt: is the completion sampled at ``temperature`` (0 = greedy) correct?"""
    generate = policy_generator(policy, max_new_tokens, autocast)
    return shared.correct_flags(generate, prompts, labels, temperature, judge)


def evaluate_split(
    policy,
    name: str,
    split: Split,
    max_new_tokens: int,
    judge,
    k: int = 0,
    temperature: float = 0.6,
    autocast=contextlib.nullcontext,
    task_judge=None,
) -> dict:
    """The eval keys of one split: greedy pass@1, its items, the completions' health, the task's own per-item
    correctness (with ``task_judge``), and sampling pass@k when k > 0."""
    generate = policy_generator(policy, max_new_tokens, autocast)
    return shared.evaluate_split(generate, name, split.prompts, split.labels, judge, k, temperature, task_judge)
