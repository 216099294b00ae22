"""The inputs of the small GPU recipe, made offline: a warm-started Llama, prompts and probe sets.

``python -m autorl.backends.openrlhf.small DIR [--size small|test] [--seed N] [--device auto|cpu|cuda]``
writes, deterministically for a seed and device:

- ``DIR/prompts.jsonl``: three-digit additions ``"123+456="`` -> ``"579"`` for GRPO (the ID range);
- ``DIR/probe_id.jsonl`` / ``DIR/probe_ood.jsonl``: 500 held-out items each. OOD items are those whose first
  operand ends in 7, a digit in a position the model never trains on (the embedded task's design): it must
  compose what it learnt, so OOD can rise and fall with the policy;
- ``DIR/model``: a Llama (``small``: 8 layers, hidden 512, head_dim 64 for vLLM's kernels, about 34 M
  parameters with the 15-symbol character tokenizer) warmed up by supervised training on ID items disjoint from
  the probes, with the embedded engine's warm-up (AdamW, batch 128, ID pass@1 checked every 25 steps), stopped
  at the first check where answers *sampled at the rollout temperature* (``--temperature``, 1.0) reach
  ``--target`` (0.25), so that GRPO groups have rewards that differ. The tokenizer adds no ``<bos>``: OpenRLHF
  encodes rollout prompts without special tokens, and a model warmed up with ``<bos>`` before every prompt (an
  earlier version of this file) sampled right 35 % of the time in its warm-up check but 4 % in its GRPO rollouts,
  so almost every group had one reward and a study found nothing. A GRPO study then has real headroom on greedy
  pass@1, the objective.

``--size test`` is a 2-layer stand-in for CPU tests. Needs torch, transformers and tokenizers; no network.
Nothing is rewritten when ``DIR/model/config.json`` exists; ``DIR/warmup.json`` records how it was made.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from autorl.backends.openrlhf.tiny import SYMBOLS, tokenizer
from autorl.toolkit.reward import load_reward, score
from autorl.toolkit.task import Split, Task

SIZES = {"small": {"hidden": 512, "layers": 8, "heads": 8}, "test": {"hidden": 64, "layers": 2, "heads": 2}}
COUNTS = {"prompts": 4096, "probe_id": 500, "probe_ood": 500, "sft": 60000}
OOD_DIGIT = 7  # first operands ending in this digit are held out of training: the OOD probe set
MAX_NEW_TOKENS = 6  # "1998" + <eos> fits with one to spare
DATA_SEED = 2026  # the item split never changes with the warm-up seed


def split_items(seed: int = DATA_SEED) -> dict[str, list[dict[str, str]]]:
    """Disjoint item lists: GRPO prompts, ID and OOD probes, and the supervised warm-up set."""
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()

    def draw(n: int, ood: bool) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        while len(out) < n:
            a, b = rng.randint(100, 999), rng.randint(100, 999)
            if (a % 10 == OOD_DIGIT) != ood or (a, b) in seen:
                continue
            seen.add((a, b))
            out.append({"input": f"{a}+{b}=", "label": str(a + b)})
        return out

    probe_id, probe_ood = draw(COUNTS["probe_id"], False), draw(COUNTS["probe_ood"], True)
    return {
        "probe_id": probe_id,
        "probe_ood": probe_ood,
        "prompts": draw(COUNTS["prompts"], False),
        "sft": draw(COUNTS["sft"], False),
    }


def build_llama(size: str, seed: int):
    """A randomly initialised LlamaForCausalLM of ``size`` over the character vocabulary (float32)."""
    import torch  # lazy: torch, once the arguments are checked
    from transformers import LlamaConfig, LlamaForCausalLM  # lazy: heavy, once the arguments are checked

    dims = SIZES[size]
    config = LlamaConfig(
        vocab_size=len(SYMBOLS),
        hidden_size=dims["hidden"],
        intermediate_size=4 * dims["hidden"],
        num_hidden_layers=dims["layers"],
        num_attention_heads=dims["heads"],
        num_key_value_heads=dims["heads"],
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def warm_up(
    model_dir: Path, items: dict, target: float, temperature: float, seed: int, device: str, max_steps: int, log=print
) -> dict:
    """Supervised warm-up of the model saved at ``model_dir`` with the embedded engine's routine, in place."""
    import torch  # lazy: torch, once the arguments are checked

    from autorl.toolkit.model import HFPolicy  # lazy: torch, once the arguments are checked
    from autorl.toolkit.policy_eval import correct_flags  # lazy: torch, once the arguments are checked
    from autorl.toolkit.warmup import SFT_SETTINGS, supervised_warmup  # lazy: torch, once the arguments are checked

    torch.manual_seed(seed)
    torch.set_num_threads(SFT_SETTINGS["threads"])
    torch.use_deterministic_algorithms(True, warn_only=True)
    policy = HFPolicy(str(model_dir), torch.device(device))
    policy.module.set_attn_implementation("eager")  # a deterministic backward on every device
    as_split = lambda rows: Split([r["input"] for r in rows], [r["label"] for r in rows])  # noqa: E731
    task = Task("small-addition", as_split(items["sft"]), {"id": as_split(items["probe_id"])})
    reward = load_reward("builtin:exact_match", builtin_task=True)
    judge = lambda text, label, truncated: score(*reward, text, label, truncated)["correctness"]  # noqa: E731
    settings = argparse.Namespace(max_new_tokens=MAX_NEW_TOKENS, sft_target=target)
    info = supervised_warmup(policy, task, settings, judge, log, max_steps, temperature)
    split = task.evals["id"]
    greedy = correct_flags(policy, split.prompts, split.labels, MAX_NEW_TOKENS, 0.0, judge)
    policy.module.to(torch.bfloat16).save_pretrained(model_dir)
    return {**info, "greedy_pass@1": sum(greedy) / len(greedy), "check_temperature": temperature}


def write_inputs(
    root: Path,
    size: str = "small",
    seed: int = 0,
    target: float = 0.25,
    temperature: float = 1.0,
    device: str = "auto",
    max_steps: int = 3000,
) -> Path:
    """Prompts, probes and the warmed-up model under ``root`` (a model already there is kept)."""
    root.mkdir(parents=True, exist_ok=True)
    items = split_items()
    for name in ("prompts", "probe_id", "probe_ood"):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items[name]))
    model_dir = root / "model"
    if (model_dir / "config.json").is_file():
        return root
    device = _device(device)
    t0 = time.time()
    build_llama(size, seed).save_pretrained(model_dir)
    tokenizer().save_pretrained(model_dir)
    info = warm_up(model_dir, items, target, temperature, seed, device, max_steps)
    record = {
        **info,
        "size": size,
        "seed": seed,
        "target": target,
        "device": device,
        "params": _params(model_dir),
        "seconds": round(time.time() - t0, 1),
    }
    (root / "warmup.json").write_text(json.dumps(record, indent=1) + "\n")
    return root


def _device(requested: str) -> str:
    if requested != "auto":
        return requested
    import torch  # lazy: torch, once the arguments are checked

    return "cuda" if torch.cuda.is_available() else "cpu"


def _params(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    h, layers, v = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    return layers * (4 * h * h + 3 * h * config["intermediate_size"] + 2 * h) + v * h + h


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, set before CUDA starts
    p = argparse.ArgumentParser(prog="python -m autorl.backends.openrlhf.small", description=__doc__.split("\n")[0])
    p.add_argument("dir", nargs="?", default="/tmp/autorl-openrlhf-small")
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.25, help="Stop the warm-up at this ID pass@1 ...")
    p.add_argument(
        "--temperature", type=float, default=1.0, help="... of answers sampled at this temperature (0: greedy)."
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--max-steps", type=int, default=3000, help="Warm-up steps at most.")
    args = p.parse_args(argv)
    if not 0 < args.target < 1 or args.temperature < 0 or args.max_steps < 1:
        print("error: --target must be in (0, 1), --temperature >= 0 and --max-steps >= 1", file=sys.stderr)
        return 2
    print(
        write_inputs(Path(args.dir), args.size, args.seed, args.target, args.temperature, args.device, args.max_steps)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
