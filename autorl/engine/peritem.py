"""The one implementation of the per-item eval metrics: greedy pass@1 with its items, and sampling pass@k.

Every backend's final policy is scored by these functions, over a generator of its own: the embedded engine's
live policy (``autorl.engine.evaluate``), the TRL runner's, or a saved checkpoint's (``autorl.evaluate``).
A generator is ``generate(prompts, temperature) -> [(completion_text, truncated), ...]``; a judge is
``judge(text, label, truncated) -> score`` (1.0 = correct). Records follow ``autorl.metrics``:
``eval/<split>/greedy_pass@1``, ``eval/<split>/items`` and, when k > 0, ``eval/<split>/sampling_pass@<k>``.

No torch here: the controller side imports this through ``autorl.evaluate``.
"""

from __future__ import annotations

from typing import Any, Callable

Generate = Callable[[list[str], float], list[tuple[str, bool]]]
Judge = Callable[[str, str, bool], float]


def check_sampling(k: int, temperature: float) -> None:
    """pass@k with k > 1 at temperature 0 would repeat one greedy answer k times: refuse it."""
    if k > 1 and temperature <= 0:
        raise ValueError(f"probe_k={k} needs probe_temperature > 0: k greedy samples are one sample repeated")


def correct_flags(generate: Generate, prompts: list[str], labels: list[str], temperature: float,
                  judge: Judge) -> list[int]:
    """0/1 per prompt: is the completion sampled at ``temperature`` (0 = greedy) correct?"""
    outputs = generate(prompts, temperature)
    return [int(judge(text, gold, truncated) >= 1.0) for (text, truncated), gold in zip(outputs, labels)]


def evaluate_split(generate: Generate, name: str, prompts: list[str], labels: list[str], judge: Judge,
                   k: int = 0, temperature: float = 1.0) -> dict[str, Any]:
    """The eval keys of one split: greedy pass@1, its items, and sampling pass@k when k > 0."""
    items = correct_flags(generate, prompts, labels, 0.0, judge)
    out: dict[str, Any] = {f"eval/{name}/greedy_pass@1": sum(items) / len(items), f"eval/{name}/items": items}
    if k > 0:
        check_sampling(k, temperature)
        hits = [0] * len(items)
        for _ in range(k):
            flags = correct_flags(generate, prompts, labels, temperature, judge)
            hits = [h | f for h, f in zip(hits, flags)]
        out[f"eval/{name}/sampling_pass@{k}"] = sum(hits) / len(hits)
    return out


def evaluate(generate: Generate, splits: dict[str, tuple[list[str], list[str]]], judge: Judge, k: int,
             temperature: float, step: int) -> dict[str, Any]:
    """One eval record over every split."""
    record: dict[str, Any] = {"type": "eval", "step": step}
    for name, (prompts, labels) in splits.items():
        record.update(evaluate_split(generate, name, prompts, labels, judge, k, temperature))
    return record
