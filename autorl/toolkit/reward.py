"""Rewards: the built-in exact match and the loader for custom reward functions.

The built-in reward for JSONL tasks is exact match after answer extraction and
normalisation (the pipeline of the OpenRLHF playbook's reward section):

1. If gpt-oss channel markers are present, keep the final message only.
2. Take the last ``\\boxed{...}`` (nested braces allowed); else the last number.
3. Normalise both answer and label: strip enclosing ``$...$`` / ``\\(...\\)``,
   unwrap ``\\text{} \\textbf{} \\mathrm{} \\mathbf{}``, ``\\dfrac``/``\\tfrac`` ->
   ``\\frac``, collapse whitespace, drop commas inside numbers, leading zeros and
   a trailing period.
4. Equal strings match; otherwise two numbers match within 1e-6 (relative above 1).

For ``builtin:addition`` the reward is plain exact match of the decoded
completion (up to EOS) with the label.

A custom reward is ``module:function`` or a ``.py`` file with a function
``reward(completion, label) -> float | dict``; a dict carries ``reward`` plus any
diagnostics (``correctness`` is used for the correctness metric when present).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autorl.errors import UserError


class RewardError(UserError):
    """A custom reward that cannot be imported or returns something unusable."""


RewardFn = Callable[..., Any]
Reward = tuple[RewardFn, bool]  # what load_reward returns: the function, and whether it is a built-in

WRAPPERS = ("text", "textbf", "mathrm", "mathbf")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
ENCLOSINGS = (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
NORMALISERS: list[tuple[re.Pattern, str]] = [
    (re.compile(r"\\[dt]frac"), r"\\frac"),
    (re.compile(r"\s+"), " "),
    (re.compile(r"(?<=\d),(?=\d{3}(?!\d))"), ""),
    (re.compile(r"^(-?)0+(?=\d)"), r"\1"),
    (re.compile(r"\.$"), ""),
]
HARMONY_FINAL = re.compile(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|end\|>|<\|return\|>|$)", re.S)


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}``, braces balanced; None if there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def extract_answer(text: str) -> tuple[str | None, str]:
    """(answer, method): method is 'boxed', 'last_number' or 'none'."""
    finals = HARMONY_FINAL.findall(text)
    if finals:
        text = finals[-1]
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, "boxed"
    numbers = NUMBER.findall(text)
    return (numbers[-1], "last_number") if numbers else (None, "none")


def _unwrap(text: str) -> str:
    pattern = re.compile(r"\\(?:" + "|".join(WRAPPERS) + r")\{([^{}]*)\}")
    while True:
        new = pattern.sub(r"\1", text)
        if new == text:
            return new
        text = new


def _strip_enclosing(text: str) -> str:
    for left, right in ENCLOSINGS:
        if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
            return text[len(left) : len(text) - len(right)].strip()
    return text


def normalise(text: str) -> str:
    """The comparable form of an answer or label."""
    text = _strip_enclosing(text.strip())
    text = _unwrap(text)
    for pattern, repl in NORMALISERS:
        text = pattern.sub(repl, text.strip())
    return text.strip()


def _as_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def answers_match(answer: str, label: str) -> bool:
    """Normalised strings equal, or both numbers within 1e-6 (relative above 1)."""
    a, b = normalise(answer), normalise(label)
    if a == b:
        return True
    x, y = _as_number(a), _as_number(b)
    return x is not None and y is not None and abs(x - y) <= 1e-6 * max(1.0, abs(y))


def math_exact_match(completion: str, label: str, truncated: bool = False) -> dict[str, float]:
    """Built-in reward for JSONL tasks: 1.0 if the extracted answer matches the label."""
    answer, method = extract_answer(completion)
    correct = answer is not None and answers_match(answer, label)
    return {
        "reward": float(correct),
        "correctness": float(correct),
        "has_answer": float(bool(answer)),
        "has_boxed": float(method == "boxed"),
        "parse_method": {"boxed": 2.0, "last_number": 1.0, "none": 0.0}[method],
        "truncated": float(truncated),
    }


def string_exact_match(completion: str, label: str, truncated: bool = False) -> dict[str, float]:
    """Built-in reward for builtin:addition: the completion (up to EOS) equals the label."""
    correct = completion == label
    return {
        "reward": float(correct),
        "correctness": float(correct),
        "has_answer": float(bool(completion)),
        "has_boxed": 0.0,
        "parse_method": 1.0 if completion else 0.0,
        "truncated": float(truncated),
    }


def _from_file(path: Path) -> RewardFn:
    spec = importlib.util.spec_from_file_location(f"autorl_reward_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise RewardError(f"reward file {path} cannot be loaded as Python: give a .py file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "reward", None)):
        raise RewardError(f"reward file {path} defines no function 'reward': add def reward(completion, label)")
    return module.reward


def _from_module(spec: str) -> RewardFn:
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"reward '{spec}': module {module_name} has no function '{attr}'")
    return fn


def load_reward(spec: str, builtin_task: bool) -> Reward:
    """(function, is_builtin) for a reward spec; import failures become one-line RewardErrors."""
    if spec == "builtin:exact_match":
        return (string_exact_match if builtin_task else math_exact_match), True
    if spec.startswith("builtin:"):
        raise RewardError(f"unknown built-in reward '{spec}': use builtin:exact_match, module:function or a .py file")
    try:
        if spec.endswith(".py"):
            if not Path(spec).is_file():
                raise RewardError(f"reward file {spec} not found: give an existing .py path")
            return _from_file(Path(spec)), False
        if ":" not in spec:
            raise RewardError(f"reward '{spec}' is neither module:function nor a .py file")
        return _from_module(spec), False
    except RewardError:
        raise
    except Exception as exc:  # any import-time failure of user code
        raise RewardError(f"reward '{spec}' failed to import: {type(exc).__name__}: {exc}") from None


def score(fn: RewardFn, is_builtin: bool, completion: str, label: str, truncated: bool) -> dict[str, float]:
    """One completion's reward dict (``reward``, ``correctness`` and diagnostics)."""
    out = fn(completion, label, truncated) if is_builtin else fn(completion, label)
    if isinstance(out, dict):
        if "reward" not in out:
            raise RewardError("a custom reward returned a dict without 'reward': include the scalar reward")
        out = {k: float(v) for k, v in out.items() if isinstance(v, (int, float, bool))}
    elif isinstance(out, (int, float, bool)):
        out = {"reward": float(out)}
    else:
        raise RewardError(f"a custom reward returned {type(out).__name__}: return a float or a dict with 'reward'")
    out.setdefault("correctness", float(out["reward"] >= 1.0) if math.isfinite(out["reward"]) else 0.0)
    out.setdefault("truncated", float(truncated))
    return out
