"""The per-item evaluator every backend shares: greedy pass@1 with per-item results and sampling pass@k.

One implementation judges a trial's final policy whatever trained it (the metrics themselves are
``autorl.toolkit.peritem``, which imports no torch):

- the embedded engine (and the TRL runner) call ``evaluate_split`` in-process with a generator over their
  live policy (``autorl.toolkit.policy_eval``);
- OpenRLHF, TRL checkpoints and the command backend run ``python -m autorl.evaluate`` as a second child
  process on the checkpoint the trial saved (full weights, or a LoRA adapter on its base), through vLLM
  when it is installed and Hugging Face ``generate`` otherwise; ``Backend.eval_plan`` plans that process.

A generator is ``generate(prompts, temperature) -> [(completion_text, truncated), ...]``. It encodes each prompt
as the trial's rollouts did: with ``--chat-template``, as one user turn in the tokenizer's chat template (with the
generation prompt); with ``--no-special-tokens``, without the special tokens the tokenizer would add (OpenRLHF
encodes rollout prompts so: a ``<bos>`` the tokenizer prepends is not in them). The judge is the
seed-004 exact match (``autorl.toolkit.reward``) unless the recipe names another reward. Records follow
``autorl.metrics``: ``eval/<split>/greedy_pass@1``, ``eval/<split>/items`` and, when k > 1,
``eval/<split>/sampling_pass@<k>`` (k > 0) at the recipe's temperature (never 0 with k > 1), the greedy
completions' health, and, when the judge is a custom reward, the exact match's ``eval/<split>/task_items``.

This module imports no torch at import time: the controller plans evaluations without it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autorl.errors import UserError
from autorl.toolkit.peritem import Generate, Judge, check_sampling, evaluate
from autorl.toolkit.reward import load_reward, score
from autorl.toolkit.task import TaskError, read_jsonl


class EvalError(UserError):
    """An evaluation that cannot run as configured (missing checkpoint, bad probe file, k without temperature)."""


class ProbeSettings(BaseModel):
    """The per-item evaluation of a trial's final policy; a mixin of the backends' ``train`` blocks."""

    model_config = ConfigDict(extra="forbid")

    probe_id: str | None = Field(
        None, description='JSONL file of ID probe items {"input", "label"} (relative to the worktree).'
    )
    probe_ood: str | None = Field(None, description="JSONL file of OOD probe items, same shape.")
    probe_k: int = Field(0, ge=0, description="Samples per item for sampling pass@k; 0 = greedy pass@1 only.")
    probe_temperature: float = Field(
        1.0, ge=0, description="Sampling temperature of pass@k (must be > 0 when probe_k > 1)."
    )
    probe_max_new_tokens: int | None = Field(None, ge=1, description="Completion limit; default: the training limit.")
    probe_reward: str = Field(
        "builtin:exact_match", description="Judge: the seed-004 exact match, module:function or a .py file."
    )
    probe_engine: str = Field(
        "auto", pattern="^(auto|vllm|hf)$", description="vLLM when installed (auto), or Hugging Face generate."
    )

    @model_validator(mode="after")
    def _check_probe(self) -> ProbeSettings:
        check_sampling(self.probe_k, self.probe_temperature)
        return self

    def probe_splits(self) -> dict[str, str]:
        """Split name -> JSONL path for each probe set given."""
        return {n: p for n, p in (("id", self.probe_id), ("ood", self.probe_ood)) if p}


# ---------------------------------------------------------------------------
# The judge and the probe sets
# ---------------------------------------------------------------------------


def make_judge(reward_spec: str) -> Judge:
    """The correctness judge of a reward spec (the seed-004 exact match for builtin:exact_match)."""
    reward = load_reward(reward_spec, builtin_task=False)
    return lambda text, label, truncated: score(*reward, text, label, truncated)["correctness"]


def read_probe(path: str | Path) -> tuple[list[str], list[str]]:
    """(prompts, labels) of a probe JSONL file."""
    try:
        split = read_jsonl(str(path), "probe")
    except TaskError as exc:
        raise EvalError(str(exc)) from None
    return split.prompts, split.labels


# ---------------------------------------------------------------------------
# Generators over a saved checkpoint
# ---------------------------------------------------------------------------


def checkpoint_kind(model_dir: Path) -> str:
    """'adapter' for a LoRA adapter directory, 'full' for full weights; EvalError when neither."""
    if (model_dir / "adapter_config.json").is_file():
        return "adapter"
    if (model_dir / "config.json").is_file():
        return "full"
    raise EvalError(f"no checkpoint at {model_dir}: expected a Hugging Face model or LoRA adapter directory")


def adapter_base(model_dir: Path, base: str | None) -> str:
    """The base model of a LoRA adapter: ``base`` if given, else the adapter's own record of it."""
    if base:
        return base
    recorded = json.loads((model_dir / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not recorded:
        raise EvalError(f"{model_dir} is a LoRA adapter that names no base model: pass --base")
    return recorded


def pick_engine(requested: str) -> str:
    """'vllm' when asked for or (auto) importable with a GPU, else 'hf'."""
    if requested != "auto":
        return requested
    import torch  # lazy: the controller plans evaluations without torch

    return "vllm" if importlib.util.find_spec("vllm") and torch.cuda.is_available() else "hf"


def prompt_text(tok, prompt: str, chat: bool) -> str:
    """``prompt`` as the rollouts saw it: as is, or (``chat``) one user turn in the tokenizer's chat template with
    the generation prompt."""
    if not chat:
        return prompt
    return tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)


def hf_generator(
    model_dir: Path, base: str | None, max_new_tokens: int, seed: int, chat: bool = False, special: bool = True
) -> Generate:
    """Batched Hugging Face ``generate`` over full weights or base + LoRA adapter."""
    import torch  # lazy: the controller plans evaluations without torch
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: heavy, and only an evaluation needs it

    device = "cuda" if torch.cuda.is_available() else "cpu"
    adapter = checkpoint_kind(model_dir) == "adapter"
    source = adapter_base(model_dir, base) if adapter else str(model_dir)
    loaded: Any = AutoModelForCausalLM.from_pretrained(source, torch_dtype="auto")
    model = loaded.to(device).eval()
    if adapter:
        from peft import PeftModel  # lazy: heavy, and only a LoRA adapter needs it

        model = PeftModel.from_pretrained(model, str(model_dir)).eval()
    tok = AutoTokenizer.from_pretrained(str(model_dir) if (model_dir / "tokenizer_config.json").is_file() else source)
    tok.padding_side = "left"
    if tok.pad_token is None:  # a tokenizer saved without one (seen: SmolLM2 under transformers 5.17)
        tok.pad_token = tok.eos_token
    torch.manual_seed(seed)
    return lambda prompts, temperature: _hf_generate(
        model, tok, [prompt_text(tok, p, chat) for p in prompts], temperature, max_new_tokens, special
    )


def _hf_generate(
    model, tok, prompts: list[str], temperature: float, max_new_tokens: int, special: bool = True, chunk: int = 256
) -> list[tuple[str, bool]]:
    import torch  # lazy: the controller plans evaluations without torch

    from autorl.toolkit.model import beating  # lazy: imports torch

    out: list[tuple[str, bool]] = []
    for start in range(0, len(prompts), chunk):
        batch = tok(prompts[start : start + chunk], return_tensors="pt", padding=True, add_special_tokens=special).to(
            model.device
        )
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with torch.no_grad():
            ids = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
                stopping_criteria=beating(batch["input_ids"].shape[1], max_new_tokens),
                **sampling,
            )
        new = ids[:, batch["input_ids"].shape[1] :]
        ended = (new == tok.eos_token_id).any(-1).tolist()
        out += [(t, not e) for t, e in zip(tok.batch_decode(new, skip_special_tokens=True), ended)]
    return out


def vllm_generator(
    model_dir: Path,
    base: str | None,
    max_new_tokens: int,
    seed: int,
    chat: bool = False,
    special: bool = True,
    gpu_memory_utilization: float = 0.3,
) -> Generate:
    """vLLM over full weights or base + LoRA adapter (one engine, eager, small memory share)."""
    from vllm import LLM, SamplingParams  # lazy: heavy, and only an evaluation through vLLM needs it

    adapter = checkpoint_kind(model_dir) == "adapter"
    llm = LLM(
        model=adapter_base(model_dir, base) if adapter else str(model_dir),
        seed=seed,
        enforce_eager=True,
        gpu_memory_utilization=gpu_memory_utilization,
        enable_lora=adapter,
    )
    lora = None
    if adapter:
        from vllm.lora.request import LoRARequest  # lazy: heavy, and only an adapter through vLLM needs it

        lora = LoRARequest("trial", 1, str(model_dir))

    def generate(prompts: list[str], temperature: float) -> list[tuple[str, bool]]:
        params = SamplingParams(temperature=temperature, max_tokens=max_new_tokens, seed=None)
        tok = llm.get_tokenizer()
        ids = [
            {"prompt_token_ids": tok(prompt_text(tok, p, chat), add_special_tokens=special)["input_ids"]}
            for p in prompts
        ]
        results = llm.generate(ids, params, lora_request=lora, use_tqdm=False)
        return [(r.outputs[0].text, r.outputs[0].finish_reason == "length") for r in results]

    return generate


# ---------------------------------------------------------------------------
# python -m autorl.evaluate
# ---------------------------------------------------------------------------


def eval_argv(
    python: str,
    model: str | Path,
    metrics_out: str | Path,
    probe: ProbeSettings,
    max_new_tokens: int,
    base: str | None = None,
    step: int = 0,
    seed: int = 0,
    chat: bool = False,
    special: bool = True,
) -> list[str]:
    """The ``python -m autorl.evaluate`` argv that evaluates ``model`` on ``probe``'s sets."""
    argv = [
        python,
        "-m",
        "autorl.evaluate",
        "--model",
        str(model),
        "--metrics-out",
        str(metrics_out),
        "--max-new-tokens",
        str(probe.probe_max_new_tokens or max_new_tokens),
        "--k",
        str(probe.probe_k),
        "--temperature",
        repr(probe.probe_temperature),
        "--reward",
        probe.probe_reward,
        "--engine",
        probe.probe_engine,
        "--step",
        str(step),
        "--seed",
        str(seed),
    ]
    for name, path in probe.probe_splits().items():
        argv += [f"--{name}", path]
    return (
        argv
        + (["--base", base] if base else [])
        + (["--chat-template"] if chat else [])
        + ([] if special else ["--no-special-tokens"])
    )


def retarget_argv(argv: list[str], model: str | Path, step: int, metrics_out: str | Path) -> list[str]:
    """An ``eval_argv`` for another checkpoint of the same run: its ``--model``, ``--step`` and ``--metrics-out``."""
    out = list(argv)
    for flag, value in (("--model", model), ("--step", step), ("--metrics-out", metrics_out)):
        out[out.index(flag) + 1] = str(value)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m autorl.evaluate", description="Per-item evaluation of a checkpoint.")
    p.add_argument("--model", required=True, help="Hugging Face model directory or LoRA adapter directory.")
    p.add_argument("--base", help="Base model of a LoRA adapter (default: the adapter's record of it).")
    p.add_argument("--id", help="ID probe JSONL.")
    p.add_argument("--ood", help="OOD probe JSONL.")
    p.add_argument("--metrics-out", required=True, help="Metrics JSONL to append the eval record to.")
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--k", type=int, default=0, help="Samples per item for sampling pass@k (0: greedy only).")
    p.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature of pass@k.")
    p.add_argument("--reward", default="builtin:exact_match")
    p.add_argument("--engine", choices=["auto", "vllm", "hf"], default="auto")
    p.add_argument("--step", type=int, default=0, help="Training step the checkpoint was saved at.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--chat-template",
        action="store_true",
        help="Wrap each prompt in the tokenizer's chat template (as one user turn), as the rollouts did.",
    )
    p.add_argument(
        "--no-special-tokens",
        dest="special",
        action="store_false",
        help="Encode prompts without the tokenizer's special tokens (a <bos> it would prepend), as "
        "OpenRLHF's rollouts do.",
    )
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate the checkpoint and append its eval record; returns the record."""
    splits = {n: read_probe(p) for n, p in (("id", args.id), ("ood", args.ood)) if p}
    if not splits:
        raise EvalError("no probe set given: pass --id and/or --ood JSONL files")
    try:
        check_sampling(args.k, args.temperature)
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    model_dir = Path(args.model)
    checkpoint_kind(model_dir)
    engine = pick_engine(args.engine)
    make = vllm_generator if engine == "vllm" else hf_generator
    generate = make(model_dir, args.base, args.max_new_tokens, args.seed, chat=args.chat_template, special=args.special)
    task_judge = None if args.reward == "builtin:exact_match" else make_judge("builtin:exact_match")
    record = evaluate(generate, splits, make_judge(args.reward), args.k, args.temperature, args.step, task_judge)
    record["checkpoint"] = str(model_dir.resolve())  # what was read: a full run keeps it as its best weights
    write_records([record], args.metrics_out)
    return {**record, "engine": engine}


def write_records(records: Iterable[dict[str, Any]], path: str | Path) -> None:
    """Append records as metrics JSONL, flushed."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with Path(path).open("a") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        record = run(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in record.items() if k.endswith("greedy_pass@1"))
    print(f"eval step {record['step']} ({record['engine']}): greedy pass@1 {summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
