"""The metric schema every backend is mapped onto, and the JSONL reader.

A run's metrics file holds one JSON object per line, flushed as written:

- ``{"type": "step", "step": k, <STEP_KEYS>...}`` once per training step;
- ``{"type": "eval", "step": k, "eval/<split>/greedy_pass@1": v,
  "eval/<split>/items": [0, 1, ...], ...}`` at each evaluation (the per-item
  list is in eval-set order, so two runs can be compared item by item);
- ``{"type": "summary", ...}`` once at the end.

A step record may list under ``"absent"`` the ``STEP_KEYS`` its backend cannot give (OpenRLHF logs no
reward timing, for instance): rules that need such a key report "not available" instead of never firing.

``STEP_KEYS`` and ``EVAL_KEYS`` are the one place each key is documented; the
README's metric table is generated from them (``autorl metrics-doc``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

STEP_KEYS: dict[str, str] = {
    "step": "GRPO step, from 1.",
    "reward_mean": "Mean reward of the step's sampled completions.",
    "reward_std": "Std of those rewards.",
    "correctness": "Fraction of completions judged correct by the reward's exact match.",
    "truncated_rate": "Fraction of completions that hit max_new_tokens without EOS.",
    "response_length_mean": "Mean completion length in tokens (EOS included).",
    "grad_norm": "Gradient norm before clipping (mean over the step's optimizer steps).",
    "kl": "Mean per-token KL to the reference (0 when kl_coef is 0 and no reference is built).",
    "clip_ratio": "Fraction of completion tokens whose ratio was clipped.",
    "entropy_mean": "Mean per-token entropy of the policy on its completions.",
    "advantage_mean": "Mean advantage.",
    "advantage_std": "Std of advantages.",
    "advantage_abs_max": "Largest |advantage|.",
    "log_ratio_abs_max": "Largest |log(pi/pi_old)| over completion tokens.",
    "log_ratio_abs_p99": "99th percentile of |log(pi/pi_old)|.",
    "ratio_max": "Largest pi/pi_old.",
    "frac_zero_std_groups": "Fraction of groups whose rewards are all equal (zero advantage, no signal).",
    "degenerate_rate": "Fraction of completions that are empty (EOS first) or one token repeated up to the length "
    "limit: a collapsed policy.",
    "lr": "Learning rate at this step.",
    "loss": "The step's total loss.",
    "tokens_per_s": "Generated tokens per second of step wall time.",
    "time_generate_s": "Seconds spent sampling.",
    "time_reward_s": "Seconds spent scoring.",
    "time_update_s": "Seconds spent in forward/backward/optimizer.",
}

EVAL_KEYS: dict[str, str] = {
    "eval/<split>/greedy_pass@1": "Greedy (temperature 0) exact-match accuracy on the split (id, ood).",
    "eval/<split>/sampling_pass@<k>": "Fraction of items with at least one correct of k samples at eval_temperature.",
    "eval/<split>/items": "Per-item greedy correctness (0/1) in eval-set order.",
    "eval/<split>/task_pass@1": "Greedy accuracy by the task's own exact match, written when the reward (the eval's "
    "judge) is user code: the held-out metric the hack gate holds a gain against.",
    "eval/<split>/task_items": "Per-item correctness by the task's own exact match (0/1), in eval-set order.",
    "eval/<split>/length_mean": "Mean length of the greedy completions (characters).",
    "eval/<split>/repeat_mean": "Mean share of a greedy completion's n-grams that repeat an earlier one (3-grams of "
    "words, or of characters in a short completion).",
    "eval/<split>/truncated_rate": "Share of greedy completions cut at the length limit.",
    "eval/<split>/empty_rate": "Share of empty greedy completions.",
    "eval/<split>/format_only_rate": "Share of greedy completions that are only format (markup, tags, punctuation; "
    "no content).",
}

SUMMARY_KEYS: dict[str, str] = {
    "steps_done": "Training steps completed.",
    "wall_s": "Run wall time in seconds.",
    "status": "'ok', 'nan' (stopped on NaN) or 'error'.",
}


SHARES: frozenset[str] = frozenset(
    {
        "correctness",
        "truncated_rate",
        "clip_ratio",
        "frac_zero_std_groups",
        "degenerate_rate",
        "eval/<split>/greedy_pass@1",
        "eval/<split>/sampling_pass@<k>",
        "eval/<split>/task_pass@1",
        "eval/<split>/repeat_mean",
        "eval/<split>/truncated_rate",
        "eval/<split>/empty_rate",
        "eval/<split>/format_only_rate",
    }
)
"""The schema keys whose values are shares (a pass rate, a fraction of completions): they lie in [0, 1]."""


def schema_key(key: str) -> str:
    """The schema's name of a metric key: ``eval/ood/sampling_pass@8`` is ``eval/<split>/sampling_pass@<k>``."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != "eval":
        return key
    name = re.sub(r"pass@\d+$", "pass@<k>", parts[2]) if parts[2].startswith("sampling_") else parts[2]
    return f"eval/<split>/{name}"


def value_range(key: str) -> tuple[float, float] | None:
    """The range a metric's values lie in: (0, 1) for a share (``SHARES``); None when the schema sets none (a
    reward, a loss, a length)."""
    return (0.0, 1.0) if schema_key(key) in SHARES else None


ABSENT = "absent"


def absent_keys(steps: Iterable[dict[str, Any]]) -> set[str]:
    """The step keys the records declare their backend cannot give."""
    return {k for rec in steps for k in rec.get(ABSENT, ()) if isinstance(k, str)}


def declare_absent(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with every schema step key it lacks listed under ``absent``."""
    return {**row, ABSENT: sorted(k for k in STEP_KEYS if k not in row)}


def iter_records(path: str | Path) -> Iterable[dict[str, Any]]:
    """All complete JSON lines of a metrics file (a torn last line is skipped)."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    with p.open() as fh:
        for line in fh:
            rec = parse_line(line)
            if rec is not None:
                out.append(rec)
    return out


def parse_line(line: str) -> dict[str, Any] | None:
    """One metrics line, or None if blank or torn."""
    line = line.strip()
    if not line:
        return None
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        return None
    return rec if isinstance(rec, dict) else None


class JsonlTail:
    """Reads new complete lines of a growing JSONL file, remembering its offset."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0
        self._partial = ""

    def poll(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open() as fh:
            fh.seek(self.offset)
            chunk = fh.read()
            self.offset = fh.tell()
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()
        return [r for r in (parse_line(x) for x in lines) if r is not None]


class RunMetrics:
    """The records of one run, split by type, with small accessors."""

    def __init__(self, records: Iterable[dict[str, Any]] = ()):
        self.steps: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.summary: dict[str, Any] | None = None
        self.extend(records)

    def extend(self, records: Iterable[dict[str, Any]]) -> None:
        for rec in records:
            kind = rec.get("type", "step")
            if kind == "eval":
                self.evals.append(rec)
            elif kind == "summary":
                self.summary = rec
            else:
                self.steps.append(rec)

    def series(self, key: str) -> list[float]:
        """Values of ``key`` over steps, or over evals for ``eval/...`` keys."""
        rows = self.evals if key.startswith("eval/") else self.steps
        return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]

    def items(self, split: str, index: int = -1) -> list[int] | None:
        """Per-item eval results of ``split`` at eval ``index`` (last by default)."""
        rows = [r for r in self.evals if f"eval/{split}/items" in r]
        return list(rows[index][f"eval/{split}/items"]) if rows else None

    def has_nonfinite(self) -> str | None:
        """The first step key that is NaN/inf, as 'key@step', or None."""
        for rec in self.steps:
            for k, v in rec.items():
                if isinstance(v, float) and not math.isfinite(v):
                    return f"{k}@{rec.get('step')}"
                if v in ("nan", "NaN", "inf", "-inf"):
                    return f"{k}@{rec.get('step')}"
        return None


def items_key(metric: str) -> str | None:
    """The per-item key of a greedy pass@1 eval metric (``eval/<split>/items``), else None: only those have
    per-item results."""
    parts = metric.split("/")
    return f"eval/{parts[1]}/items" if len(parts) == 3 and parts[0] == "eval" and parts[2] == "greedy_pass@1" else None


def reduce_series(values: list[float], reduction: str, k: int = 3, maximize: bool = True) -> float | None:
    """One number from a metric series: last, best, or mean of the last k."""
    if not values:
        return None
    if reduction == "last":
        return values[-1]
    if reduction == "best":
        return max(values) if maximize else min(values)
    tail = values[-k:]
    return sum(tail) / len(tail)


def markdown_table() -> str:
    """The metric glossary as a Markdown table (docs/metrics.md is generated from this)."""
    rows = ["| key | kind | meaning |", "|---|---|---|"]
    for kind, table in (("step", STEP_KEYS), ("eval", EVAL_KEYS), ("summary", SUMMARY_KEYS)):
        rows += [f"| `{k}` | {kind} | {v} |" for k, v in table.items()]
    return "\n".join(rows) + "\n"
