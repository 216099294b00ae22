"""The one implementation of the per-item eval metrics: greedy pass@1 with its items, and sampling pass@k.

Every backend's final policy is scored by these functions, over a generator of its own: the embedded engine's
live policy (``autorl.toolkit.policy_eval``), the TRL runner's, or a saved checkpoint's (``autorl.evaluate``).
A generator is ``generate(prompts, temperature) -> [(completion_text, truncated), ...]``; a judge is
``judge(text, label, truncated) -> score`` (1.0 = correct). Records follow ``autorl.metrics``:
``eval/<split>/greedy_pass@1``, ``eval/<split>/items`` and, when k > 0, ``eval/<split>/sampling_pass@<k>``.

Every eval also states what the greedy completions look like (``completion_health``: length, repeated n-grams,
truncation, answers that are only format), and, given a ``task_judge`` independent of the recipe's reward (the
task's exact match when the reward is user code), the per-item task correctness ``eval/<split>/task_items`` and
``eval/<split>/task_pass@1``: the held-out metrics the hack gate (``autorl.judge.hackgate``) holds a reward's gain
against, whatever the reward computes.

No torch here: the controller side imports this through ``autorl.evaluate``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Generate = Callable[[list[str], float], list[tuple[str, bool]]]
Judge = Callable[[str, str, bool], float]

NGRAM = 3  # the n of the repeated n-gram share: words when a completion has enough of them, else characters
FORMAT_ONLY = re.compile(r"\\[A-Za-z]+|<\|?[^<>]*\|?>|[^0-9A-Za-z]")  # markup, tags and punctuation: format, no content


def repeat_share(text: str, n: int = NGRAM) -> float:
    """The share of a completion's n-grams that repeat an earlier one (0: none repeated; words when there are 2n
    of them, else characters)."""
    words = text.split()
    units = words if len(words) >= 2 * n else list(text)
    grams = [tuple(units[i : i + n]) for i in range(len(units) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def format_only(text: str) -> bool:
    """A non-empty completion with no content once markup, tags and punctuation are taken out (``\\boxed{}``,
    ``=``, ``<answer></answer>``): an answer that is only format."""
    return bool(text.strip()) and not FORMAT_ONLY.sub("", text).strip()


def completion_health(name: str, outputs: list[tuple[str, bool]]) -> dict[str, float]:
    """What the greedy completions of a split look like: mean length (characters), the mean share of repeated
    n-grams, the share cut at the limit, and the shares that are empty or only format."""
    n = max(len(outputs), 1)
    return {
        f"eval/{name}/length_mean": sum(len(t) for t, _ in outputs) / n,
        f"eval/{name}/repeat_mean": sum(repeat_share(t) for t, _ in outputs) / n,
        f"eval/{name}/truncated_rate": sum(bool(tr) for _, tr in outputs) / n,
        f"eval/{name}/empty_rate": sum(not t.strip() for t, _ in outputs) / n,
        f"eval/{name}/format_only_rate": sum(format_only(t) for t, _ in outputs) / n,
    }


def check_sampling(k: int, temperature: float) -> None:
    """pass@k with k > 1 at temperature 0 would repeat one greedy answer k times: refuse it."""
    if k > 1 and temperature <= 0:
        raise ValueError(f"probe_k={k} needs probe_temperature > 0: k greedy samples are one sample repeated")


def correct_flags(
    generate: Generate, prompts: list[str], labels: list[str], temperature: float, judge: Judge
) -> list[int]:
    """0/1 per prompt: is the completion sampled at ``temperature`` (0 = greedy) correct?"""
    return judged(generate(prompts, temperature), labels, judge)


def judged(outputs: list[tuple[str, bool]], labels: list[str], judge: Judge) -> list[int]:
    """0/1 per completion: does ``judge`` call it correct?"""
    return [int(judge(text, gold, truncated) >= 1.0) for (text, truncated), gold in zip(outputs, labels)]


def evaluate_split(
    generate: Generate,
    name: str,
    prompts: list[str],
    labels: list[str],
    judge: Judge,
    k: int = 0,
    temperature: float = 1.0,
    task_judge: Judge | None = None,
) -> dict[str, Any]:
    """The eval keys of one split: greedy pass@1, its items, the greedy completions' health, the task's own
    per-item correctness when ``task_judge`` is given, and sampling pass@k when k > 0."""
    outputs = generate(prompts, 0.0)
    items = judged(outputs, labels, judge)
    out: dict[str, Any] = {
        f"eval/{name}/greedy_pass@1": sum(items) / len(items),
        f"eval/{name}/items": items,
        **completion_health(name, outputs),
    }
    if task_judge is not None:
        task = judged(outputs, labels, task_judge)
        out.update({f"eval/{name}/task_pass@1": sum(task) / len(task), f"eval/{name}/task_items": task})
    if k > 0:
        check_sampling(k, temperature)
        hits = [0] * len(items)
        for _ in range(k):
            flags = correct_flags(generate, prompts, labels, temperature, judge)
            hits = [h | f for h, f in zip(hits, flags)]
        out[f"eval/{name}/sampling_pass@{k}"] = sum(hits) / len(hits)
    return out


def evaluate(
    generate: Generate,
    splits: dict[str, tuple[list[str], list[str]]],
    judge: Judge,
    k: int,
    temperature: float,
    step: int,
    task_judge: Judge | None = None,
) -> dict[str, Any]:
    """One eval record over every split."""
    record: dict[str, Any] = {"type": "eval", "step": step}
    for name, (prompts, labels) in splits.items():
        record.update(evaluate_split(generate, name, prompts, labels, judge, k, temperature, task_judge))
    return record
