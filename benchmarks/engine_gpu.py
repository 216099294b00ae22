"""The embedded engine on one CUDA GPU: generated tokens/s and peak memory, next to TRL.

Three runs of the same GRPO batch (64 prompts x 8 completions, max 5 new tokens,
bf16 autocast, ppo_epochs 1, no KL) on the addition task:

- ``engine_builtin``: the engine with builtin:gpu (512 x 16, 50.3 M params);
- ``engine_hf``: the engine with a LlamaForCausalLM of the same shape (HF path);
- ``trl``: TRL's GRPOTrainer (bf16) on that same Llama.

Each engine run first builds its warmed-up base (not timed; ``sft_target`` is
set low because only throughput is measured here). Peak memory is
``torch.cuda.max_memory_allocated`` over the timed run only. Needs torch,
transformers, trl and pydantic (the engine config uses it); no optuna or
ray. Prints one JSON object.

    python benchmarks/engine_gpu.py [--steps 30] [--skip-trl]
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

SHARED = {
    "batch_prompts": 64,
    "gens": 8,
    "max_new_tokens": 5,
    "temperature": 1.0,
    "lr": 1e-5,
    "ppo_epochs": 1,
    "kl_coef": 0.0,
    "eval_every": 0,
    "eval_size": 500,
    "device": "cuda",
    "sft_target": 0.05,
}


def engine_run(model: str, steps: int, work: Path) -> dict:
    from autorl.engine.config import EngineConfig
    from autorl.engine.grpo import run

    cache = work / "cache"
    run(EngineConfig(model=model, steps=0, **SHARED), work / "warm.jsonl", cache, log=lambda m: None)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    summary = run(EngineConfig(model=model, steps=steps, **SHARED), work / "m.jsonl", cache, log=lambda m: None)
    wall = time.perf_counter() - t0
    recs = [json.loads(x) for x in (work / "m.jsonl").read_text().splitlines()]
    st = [r for r in recs if r["type"] == "step"][2:]  # the first steps include CUDA warm-up
    train_s = sum(r["time_generate_s"] + r["time_reward_s"] + r["time_update_s"] for r in st)
    tokens = sum(r["tokens_per_s"] * (r["time_generate_s"] + r["time_reward_s"] + r["time_update_s"]) for r in st)
    return {
        "status": summary["status"],
        "steps_timed": len(st),
        "s_per_step": train_s / max(1, len(st)),
        "tokens_per_s": tokens / max(train_s, 1e-9),
        "generate_s_per_step": sum(r["time_generate_s"] for r in st) / max(1, len(st)),
        "update_s_per_step": sum(r["time_update_s"] for r in st) / max(1, len(st)),
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "run_wall_s": wall,
    }


def trl_run(model_dir: Path, steps: int, work: Path) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from autorl.toolkit.task import addition_task

    task = addition_task(SHARED["eval_size"])
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    counted = {"tokens": 0, "t_start": None, "tokens_at_start": 0}

    def exact_match(completions, answer, completion_ids, **kw):
        counted["tokens"] += sum(len(c) for c in completion_ids)
        return [float(c == a) for c, a in zip(completions, answer)]

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:  # skip CUDA warm-up, as for the engine
                torch.cuda.synchronize()
                counted["t_start"], counted["tokens_at_start"] = time.perf_counter(), counted["tokens"]
                torch.cuda.reset_peak_memory_stats()

    data = Dataset.from_dict({"prompt": task.train.prompts, "answer": task.train.labels})
    cfg = GRPOConfig(
        output_dir=str(work / "trl"),
        bf16=True,
        report_to="none",
        num_generations=SHARED["gens"],
        per_device_train_batch_size=SHARED["batch_prompts"] * SHARED["gens"],
        max_completion_length=SHARED["max_new_tokens"],
        temperature=SHARED["temperature"],
        learning_rate=SHARED["lr"],
        lr_scheduler_type="constant",
        beta=0.0,
        loss_type="grpo",
        max_steps=steps,
        save_strategy="no",
        logging_steps=10,
        gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(
        model=model, processing_class=tok, reward_funcs=exact_match, train_dataset=data, args=cfg, callbacks=[Clock()]
    )
    t0 = time.perf_counter()
    trainer.train()
    torch.cuda.synchronize()
    end = time.perf_counter()
    timed = max(1, steps - 2)
    # the last step's tokens were counted before its update finished, so the window is steps 3..steps
    return {
        "steps_timed": timed,
        "s_per_step": (end - counted["t_start"]) / timed,
        "tokens_per_s": (counted["tokens"] - counted["tokens_at_start"]) / (end - counted["t_start"]),
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "run_wall_s": end - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--skip-trl", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device: this benchmark needs a GPU"}))
        sys.exit(1)
    from autorl.toolkit.hf_tiny import save_llama
    from autorl.toolkit.model import BUILTIN_SIZES

    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "setup": {**SHARED, "steps": args.steps},
        "model_shape": BUILTIN_SIZES["gpu"],
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        result["engine_builtin"] = engine_run("builtin:gpu", args.steps, work / "builtin")
        model_dir = save_llama(work / "llama", "gpu")
        result["engine_hf"] = engine_run(str(model_dir), args.steps, work / "hf")
        try:
            import trl  # noqa: F401
        except ImportError:
            result["trl"] = {"skipped": "trl is not installed on this machine"}
            args.skip_trl = True
        if not args.skip_trl:
            result["trl"] = trl_run(model_dir, args.steps, work / "trl_run")
            result["speedup_tokens_per_s_builtin_vs_trl"] = (
                result["engine_builtin"]["tokens_per_s"] / result["trl"]["tokens_per_s"]
            )
            result["speedup_tokens_per_s_hf_vs_trl"] = (
                result["engine_hf"]["tokens_per_s"] / result["trl"]["tokens_per_s"]
            )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
