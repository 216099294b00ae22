"""Evaluation: greedy pass@1 (with per-item results) and sampling pass@k on a split."""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from autorl.engine.task import Split

EVAL_CHUNK = 512  # prompts per generate call


def correct_flags(policy, prompts: list[str], labels: list[str], max_new_tokens: int, temperature: float,
                  judge: Callable[[str, str, bool], float], autocast=contextlib.nullcontext) -> list[int]:
    """0/1 per prompt: is the completion sampled at ``temperature`` (0 = greedy) correct?"""
    flags: list[int] = []
    eos = torch.tensor(_eos_id(policy))
    for start in range(0, len(prompts), EVAL_CHUNK):
        chunk, gold = prompts[start:start + EVAL_CHUNK], labels[start:start + EVAL_CHUNK]
        ids, mask = policy.encode(chunk)
        with autocast():
            tokens, _ = policy.sample(ids, mask, max_new_tokens, temperature)
        truncated = ~(tokens == eos.to(tokens.device)).any(-1)
        texts = policy.decode(tokens)
        flags += [int(judge(t, g, bool(tr)) >= 1.0) for t, g, tr in zip(texts, gold, truncated.tolist())]
    return flags


def _eos_id(policy) -> int:
    return policy.tokenizer.eos_id if policy.kind == "builtin" else policy.eos_id


def evaluate_split(policy, name: str, split: Split, max_new_tokens: int, judge, k: int = 0,
                   temperature: float = 0.6, autocast=contextlib.nullcontext) -> dict:
    """The eval keys of one split: greedy pass@1, its items, and sampling pass@k when k > 0."""
    items = correct_flags(policy, split.prompts, split.labels, max_new_tokens, 0.0, judge, autocast)
    out = {f"eval/{name}/greedy_pass@1": sum(items) / len(items), f"eval/{name}/items": items}
    if k > 0:
        hits = [0] * len(items)
        for _ in range(k):
            flags = correct_flags(policy, split.prompts, split.labels, max_new_tokens, temperature, judge, autocast)
            hits = [h | f for h, f in zip(hits, flags)]
        out[f"eval/{name}/sampling_pass@{k}"] = sum(hits) / len(hits)
    return out
