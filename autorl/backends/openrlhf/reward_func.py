"""The reward function autorl gives OpenRLHF (``--reward.remote_url`` names this file).

OpenRLHF 0.10.x loads ``reward_func(queries, prompts, labels)`` from the file and calls it once per sample
inside the vLLM engine actor. This wrapper scores with ``AUTORL_REWARD``: ``builtin:exact_match`` (the
seed-004 exact match on the completion, ``autorl.toolkit.reward``) or the path of a user reward file in
OpenRLHF's own format. On top it counts GRPO groups whose rewards are all equal: when the
``AUTORL_GROUP_SIZE``-th sample of a prompt is scored, that sample logs ``zero_std_group`` =
group size x (1 if the group's rewards are all equal else 0) and every other sample logs 0, so the step
mean OpenRLHF prints is the fraction of zero-std groups (exact with one vLLM engine, whose actor sees every
sample of a group; with several engines a group split across them is not counted).
"""

import importlib.util
import os
import sys
import threading
from pathlib import Path

import torch

try:  # installed, or shipped with the job on a cluster (its py_modules)
    import autorl  # noqa: F401
except ImportError:  # loaded by path from an installed autorl that is not on this Python's path
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from autorl.toolkit.reward import math_exact_match  # noqa: E402

GROUP_SIZE = int(os.environ.get("AUTORL_GROUP_SIZE", "0"))
_LOCK = threading.Lock()
_GROUPS: dict[str, list[float]] = {}


def _load_user(path: str):
    spec = importlib.util.spec_from_file_location("autorl_user_reward", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"reward file {path} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reward_func


SPEC = os.environ.get("AUTORL_REWARD", "builtin:exact_match")
USER = None if SPEC.startswith("builtin:") else _load_user(SPEC)


def completion_of(query: str, prompt: str) -> str:
    """The generated part of OpenRLHF's decoded query (prompt + response)."""
    at = query.rfind(prompt) if prompt else -1
    return query[at + len(prompt) :] if at >= 0 else query


def _builtin(queries, prompts, labels) -> dict:
    scores = [math_exact_match(completion_of(q, p), str(lab))["reward"] for q, p, lab in zip(queries, prompts, labels)]
    rewards = torch.tensor(scores, dtype=torch.float32)
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"correctness": rewards.clone()}}


def _group_flag(prompt: str, reward: float) -> float:
    """group size x all-equal when this sample completes its group, else 0."""
    with _LOCK:
        group = _GROUPS.setdefault(prompt, [])
        group.append(reward)
        if len(group) < GROUP_SIZE:
            return 0.0
        del _GROUPS[prompt]
    return float(GROUP_SIZE) * float(max(group) == min(group))


def reward_func(queries, prompts, labels):
    out = USER(queries, prompts, labels) if USER else _builtin(queries, prompts, labels)
    if GROUP_SIZE > 1:
        rewards = torch.as_tensor(out["rewards"], dtype=torch.float32).flatten().tolist()
        flags = [_group_flag(p, r) for p, r in zip(prompts, rewards)]
        out.setdefault("extra_logs", {})["zero_std_group"] = torch.tensor(flags)
    return out
