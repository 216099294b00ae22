"""Tasks: the prompts GRPO trains on and the held-out sets it is judged on.

``builtin:addition`` is two-number addition over a 15-symbol character
vocabulary (``<pad> <bos> <eos> 0-9 + =``): the prompt ``<bos>37+45=`` asks for
``82<eos>``. The ID split is a, b in [10, 99] (8100 problems; a fixed shuffle
holds ``eval_size`` of them out for evaluation, the rest are training prompts).
The OOD split holds every problem whose first operand ends in ``OOD_DIGIT`` (7):
the same format, but a digit in a position the model never trains on (nor warms
up on) — it has seen 7 only as the second operand's digit and in sums, so it
must compose; the base model solves a minority of them, which makes OOD a signal
that can rise and fall. Every prompt has the same length, so no padding is needed.

A JSONL task is a file of ``{"input": ..., "label": ...}`` lines, with optional
ID/OOD eval files of the same shape.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from autorl import loading
from autorl.errors import UserError

EVAL_SEED = 1234  # the held-out shuffle never changes with the run's seed
OOD_DIGIT = 7  # problems whose first operand ends in this digit are held out as the OOD split
JSONL_MAX_BYTES = 1 << 30  # a task or eval JSONL file: read whole, into memory
TASK_VERSION = 2  # bump when the built-in task changes (invalidates cached base models)


class TaskError(UserError):
    """A task name or task file that cannot be used."""


class CharTokenizer:
    """Character tokenizer of the built-in task: one id per symbol, <bos> prepended."""

    SYMBOLS = ["<pad>", "<bos>", "<eos>", *"0123456789", "+", "="]

    def __init__(self):
        self.index = {s: i for i, s in enumerate(self.SYMBOLS)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.vocab_size = len(self.SYMBOLS)

    def encode(self, text: str) -> list[int]:
        return [self.bos_id] + [self.index[c] for c in text]

    def answer_ids(self, text: str) -> list[int]:
        return [self.index[c] for c in text] + [self.eos_id]

    def decode(self, ids: list[int]) -> str:
        """Text up to the first <eos>; <pad> and <bos> show as themselves (they never match a label)."""
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            out.append(self.SYMBOLS[i])
        return "".join(out)


@dataclass
class Split:
    """Prompts and labels of one evaluation split, in fixed order."""

    prompts: list[str]
    labels: list[str]


@dataclass
class Task:
    """Training prompts plus the named eval splits ('id', optionally 'ood')."""

    name: str
    train: Split
    evals: dict[str, Split] = field(default_factory=dict)
    tokenizer: CharTokenizer | None = None

    def batch(self, n: int, rng: random.Random) -> Split:
        """``n`` training prompts drawn with replacement-free sampling from ``rng``."""
        idx = (
            rng.sample(range(len(self.train.prompts)), n)
            if n <= len(self.train.prompts)
            else [rng.randrange(len(self.train.prompts)) for _ in range(n)]
        )
        return Split([self.train.prompts[i] for i in idx], [self.train.labels[i] for i in idx])

    @property
    def builtin(self) -> bool:
        return self.name.startswith("builtin:")


def addition_task(eval_size: int) -> Task:
    """The built-in addition task with ``eval_size`` items per eval split."""
    every = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    pairs = [p for p in every if p[0] % 10 != OOD_DIGIT]
    ood = [p for p in every if p[0] % 10 == OOD_DIGIT]
    random.Random(EVAL_SEED).shuffle(pairs)
    random.Random(EVAL_SEED + 1).shuffle(ood)
    if eval_size >= len(pairs) // 2:
        raise TaskError(f"eval_size {eval_size} leaves too few training prompts: use eval_size < {len(pairs) // 2}")
    as_split = lambda ps: Split([f"{a}+{b}=" for a, b in ps], [str(a + b) for a, b in ps])  # noqa: E731
    ood = ood[:eval_size]
    return Task(
        "builtin:addition",
        as_split(pairs[eval_size:]),
        {"id": as_split(pairs[:eval_size]), "ood": as_split(ood)},
        CharTokenizer(),
    )


def read_jsonl(path: str, what: str) -> Split:
    """A split from a JSONL file of {"input", "label"} objects; a file that is not there, not a regular file, not
    UTF-8 or larger than ``JSONL_MAX_BYTES`` is one ``TaskError`` line naming it (and where it stops being UTF-8)."""
    p = Path(path)
    if not p.is_file():
        raise TaskError(f'{what} file {p} not found: give a JSONL file of {{"input", "label"}} lines')
    prompts, labels = [], []
    for n, line in enumerate(loading.read_utf8(p, TaskError, f"{what} file", JSONL_MAX_BYTES).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompts.append(str(row["input"]))
            labels.append(str(row["label"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise TaskError(f"{p} line {n}: expected a JSON object with 'input' and 'label'") from None
    if not prompts:
        raise TaskError(f'{p} has no items: add {{"input", "label"}} lines')
    return Split(prompts, labels)


def load_task(name: str, eval_size: int, eval_id: str | None, eval_ood: str | None) -> Task:
    """The task named by the config ('builtin:addition' or a JSONL path)."""
    if name == "builtin:addition":
        if eval_id or eval_ood:
            raise TaskError(
                "eval_id/eval_ood are for JSONL tasks: builtin:addition has its own eval splits, remove them"
            )
        return addition_task(eval_size)
    if name.startswith("builtin:"):
        raise TaskError(f"unknown built-in task '{name}': use builtin:addition or a JSONL file")
    train = read_jsonl(name, "task")
    evals = {
        "id": read_jsonl(eval_id, "eval_id") if eval_id else Split(train.prompts[:eval_size], train.labels[:eval_size])
    }
    if eval_ood:
        evals["ood"] = read_jsonl(eval_ood, "eval_ood")
    return Task(name, train, evals)
