"""The embedded engine against TRL's GRPOTrainer on the same model, task and batch (CPU).

Both train one Hugging Face LlamaForCausalLM of the builtin:tiny size (64 x 2,
132k params, the 15-symbol character tokenizer) saved to a temp dir and warmed
up once with the engine's supervised warm-up; both then run the same number of
GRPO steps with 32 prompts x 8 completions, max 5 new tokens, temperature 1,
lr 1e-4 constant, one optimizer pass per batch, no KL, 'grpo' loss (per-sequence
mean) and group-std-scaled advantages. Greedy ID pass@1 on the same 500
held-out problems is measured every 10 steps by the same function.

A third arm runs the engine on its built-in model of the same shape and size
(builtin:tiny, pure PyTorch with its own KV-cache sampler, warmed up by the
engine itself). Prints steps/s and generated tokens/s of each (training time
only, evals excluded), the ratios, and the learning curves, as one JSON line
prefixed RESULT. Target: engine >= 2x TRL.

    python benchmarks/engine_vs_trl.py [--steps 50] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from autorl.engine.config import EngineConfig  # noqa: E402
from autorl.engine.grpo import run  # noqa: E402
from autorl.toolkit.hf_tiny import save_llama  # noqa: E402
from autorl.toolkit.model import HFPolicy  # noqa: E402
from autorl.toolkit.policy_eval import evaluate_split  # noqa: E402
from autorl.toolkit.reward import string_exact_match  # noqa: E402
from autorl.toolkit.task import addition_task  # noqa: E402
from autorl.toolkit.warmup import prepare_base  # noqa: E402

SHARED = {
    "batch_prompts": 32,
    "gens": 8,
    "max_new_tokens": 5,
    "temperature": 1.0,
    "lr": 1e-4,
    "ppo_epochs": 1,
    "kl_coef": 0.0,
    "loss_type": "grpo",
    "scale_rewards": True,
    "eval_every": 10,
    "threads": 2,
    "device": "cpu",
}


def judge(text: str, label: str, truncated: bool) -> float:
    return string_exact_match(text, label)["correctness"]


def warmed_model(work: Path, cache: Path) -> Path:
    """A tiny Llama dir whose weights are the engine's warmed-up base."""
    path = save_llama(work / "llama", "tiny")
    torch.set_num_threads(2)
    policy = HFPolicy(str(path), torch.device("cpu"))
    prepare_base(policy, addition_task(500), EngineConfig(model=str(path)), cache, judge)
    policy.module.save_pretrained(path)
    return path


def run_engine(model: Path | str, cache: Path, steps: int, seed: int, work: Path) -> dict:
    config = EngineConfig(model=str(model), steps=steps, seed=seed, **SHARED)
    run(config, work / "engine.jsonl", cache, log=lambda m: None)
    recs = [json.loads(x) for x in (work / "engine.jsonl").read_text().splitlines()]
    steps_ = [r for r in recs if r["type"] == "step"]
    train_s = sum(r["time_generate_s"] + r["time_reward_s"] + r["time_update_s"] for r in steps_)
    tokens = sum(r["tokens_per_s"] * (r["time_generate_s"] + r["time_reward_s"] + r["time_update_s"]) for r in steps_)
    curve = [(r["step"], r["eval/id/greedy_pass@1"]) for r in recs if r["type"] == "eval"]
    return {"steps_per_s": len(steps_) / train_s, "tokens_per_s": tokens / train_s, "train_s": train_s, "curve": curve}


def run_trl(model: Path, steps: int, seed: int, work: Path) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    task = addition_task(500)
    policy = HFPolicy(str(model), torch.device("cpu"))
    counted = {"tokens": 0, "eval_s": 0.0}

    def exact_match(completions, answer, completion_ids, **kw):
        counted["tokens"] += sum(len(c) for c in completion_ids)
        return [float(c == a) for c, a in zip(completions, answer)]

    curve = []

    class Eval(TrainerCallback):
        def _eval(self, step, model):
            t0 = time.perf_counter()
            policy.module = model
            curve.append(
                (
                    step,
                    evaluate_split(policy, "id", task.evals["id"], SHARED["max_new_tokens"], judge)[
                        "eval/id/greedy_pass@1"
                    ],
                )
            )
            counted["eval_s"] += time.perf_counter() - t0

        def on_train_begin(self, args, state, control, model=None, **kw):
            self._eval(0, model)

        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step % SHARED["eval_every"] == 0 or state.global_step == steps:
                self._eval(state.global_step, model)

    data = Dataset.from_dict({"prompt": task.train.prompts, "answer": task.train.labels})
    cfg = GRPOConfig(
        output_dir=str(work / "trl"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to="none",
        num_generations=SHARED["gens"],
        per_device_train_batch_size=SHARED["batch_prompts"] * SHARED["gens"],
        max_completion_length=SHARED["max_new_tokens"],
        temperature=SHARED["temperature"],
        learning_rate=SHARED["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        loss_type="grpo",
        scale_rewards="group",
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=steps,
        save_strategy="no",
        logging_steps=10,
        seed=seed,
        activation_checkpointing=False,
    )
    trainer = GRPOTrainer(
        model=policy.module,
        processing_class=policy.tok,
        reward_funcs=exact_match,
        train_dataset=data,
        args=cfg,
        callbacks=[Eval()],
    )
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0 - counted["eval_s"]
    return {
        "steps_per_s": steps / train_s,
        "tokens_per_s": counted["tokens"] / train_s,
        "train_s": train_s,
        "curve": curve,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = warmed_model(work, work / "cache")
        engine = run_engine(model, work / "cache", args.steps, args.seed, work)
        builtin = run_engine("builtin:tiny", work / "cache", args.steps, args.seed, work)
        trl = run_trl(model, args.steps, args.seed, work)
    result = {
        "setup": {**SHARED, "steps": args.steps, "seed": args.seed, "model": "LlamaForCausalLM 64x2 (132,352 params)"},
        "engine": engine,
        "engine_builtin": builtin,
        "trl": trl,
        "speedup_steps_per_s": engine["steps_per_s"] / trl["steps_per_s"],
        "speedup_tokens_per_s": engine["tokens_per_s"] / trl["tokens_per_s"],
        "builtin_speedup_steps_per_s": builtin["steps_per_s"] / trl["steps_per_s"],
        "target_speedup": 2.0,
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
