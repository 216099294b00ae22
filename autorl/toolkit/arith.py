"""Chat arithmetic for a small instruct model: questions of mixed difficulty as one user turn, generated
deterministically, with an ID probe and an OOD probe phrased differently.

The reply is read by one rule, the built-in exact match's (``autorl.toolkit.reward``): the last number in it (or a
``\\boxed{}``) must equal the label. The reward during training and the per-item eval both use it, and both see the
question through the model's chat template (OpenRLHF's ``--data.apply_chat_template``; autorl's evaluator with
``--chat-template``), so what is rewarded and what is measured are the same thing.

Items (each question once):

- ``easy``: ``a + b``, ``a - b`` (never negative), ``a * b`` with a, b in 0..12;
- ``carry``: ``a + b`` and ``a - b`` with a in 13..49 and b in 1..9.

An item whose answer equals its last operand is left out (for ``8 - 4``, a reply that only repeats the question
would end in the right number). The ID phrasing is ``What is a + b? Answer with the number only.``.

Files (``write_task``):

- ``prompts.jsonl``: every ID item once, shuffled: the GRPO prompt pool (a trial takes the first ``max_samples``);
- ``probe_id.jsonl``: 500 items of that pool, as the playbook's ID probe set is drawn from the training pool;
- ``probe_ood.jsonl``: 500 items phrased as the model never trains on: half ``a + b = ?``, half word problems
  (``Tom has 3 apples and gets 4 more. How many apples does he have now?``) over the easy items.

Measured on SmolLM2-135M-Instruct (4-bit weights, greedy, at most 32 new tokens, on a CPU): one-digit sums 0.75,
products 0.52, differences 0.56; two-digit plus one-digit 0.15, minus 0.06; ``= ?`` phrasing 0.24; word problems
0.42-0.71 with 64 tokens. Sampled at temperature 0.7, groups of 8 one-digit questions almost never all agree, so
GRPO has something to learn from; at temperature 1.0 the model rambles (45-90 % of replies hit the length cap).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import NamedTuple

DATA_SEED = 2026  # the item split never changes with a trial's seed
PROBE_SIZE = 500
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
NAMES = ["Tom", "Anna", "Sam", "Mia", "Ben", "Lily", "Max", "Emma", "Leo", "Zoe"]
SHE = {"Anna", "Mia", "Lily", "Emma", "Zoe"}
THINGS = ["apples", "pencils", "marbles", "stickers", "books", "cookies", "cards", "toys"]


class Item(NamedTuple):
    """One question: its operands, operator and kind."""

    a: int
    op: str
    b: int
    kind: str

    @property
    def answer(self) -> int:
        return OPS[self.op](self.a, self.b)

    def ask(self) -> str:
        """The ID phrasing."""
        return f"What is {self.a} {self.op} {self.b}? Answer with the number only."

    def equation(self) -> str:
        """An OOD phrasing: the bare equation."""
        return f"{self.a} {self.op} {self.b} = ?"

    def story(self, rng: random.Random) -> str:
        """An OOD phrasing: a word problem."""
        name, thing = rng.choice(NAMES), rng.choice(THINGS)
        who = "she" if name in SHE else "he"
        if self.op == "+":
            return f"{name} has {self.a} {thing} and gets {self.b} more. How many {thing} does {who} have now?"
        if self.op == "-":
            return f"{name} has {self.a} {thing} and gives away {self.b}. How many {thing} does {who} have left?"
        return f"{name} has {self.a} bags with {self.b} {thing} in each bag. How many {thing} does {who} have in total?"


def items() -> list[Item]:
    """Every item of the task, in a fixed order."""
    easy = [Item(a, op, b, "easy") for op in OPS for a in range(13) for b in range(13)]
    carry = [Item(a, op, b, "carry") for op in "+-" for a in range(13, 50) for b in range(1, 10)]
    return [i for i in easy + carry if i.answer >= 0 and i.answer != i.b]


def row(item: Item, prompt: str) -> dict[str, str]:
    return {"input": prompt, "label": str(item.answer), "kind": item.kind}


def splits(seed: int = DATA_SEED) -> dict[str, list[dict[str, str]]]:
    """The prompt pool and the two probe sets (see the module's docstring)."""
    rng = random.Random(seed)
    pool = items()
    rng.shuffle(pool)
    probe_id = rng.sample(pool, PROBE_SIZE)
    easy = [i for i in pool if i.kind == "easy"]
    half = PROBE_SIZE // 2
    ood = [row(i, i.equation()) for i in rng.sample(pool, half)]
    ood += [row(i, i.story(rng)) for i in rng.sample(easy, PROBE_SIZE - half)]
    return {
        "prompts": [row(i, i.ask()) for i in pool],
        "probe_id": [row(i, i.ask()) for i in probe_id],
        "probe_ood": ood,
    }


def write_task(root: Path, seed: int = DATA_SEED) -> dict[str, int]:
    """Write the three JSONL files under ``root``; returns each file's item count."""
    root.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, rows in splits(seed).items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        counts[name] = len(rows)
    return counts
