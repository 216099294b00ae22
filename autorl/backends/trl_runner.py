"""Child process of the TRL backend: one GRPOTrainer run, metrics in autorl's schema.

    python -m autorl.backends.trl_runner --config CFG.json --metrics-out M.jsonl --cache-dir DIR

The task, the reward, the evaluation and the supervised warm-up are the embedded
engine's (``autorl.engine``), so a TRL trial and an embedded trial of the same
recipe are judged on the same items. ``builtin:<size>`` models are Hugging Face
``LlamaForCausalLM``s of the engine's sizes over the task's character vocabulary
(``autorl.toolkit.hf_tiny``); they are initialised once per cache directory,
warmed up by the engine's ``prepare_base`` and saved again as a directory.

A ``TrainerCallback`` turns each of TRL's log dicts into a step line (keys
renamed by ``TRL_METRIC_MAP``) and runs the engine's greedy evaluation at step
0, every ``eval_every`` steps and at the end. Exit codes follow the engine: 0
done, 2 a user mistake, 3 stopped on a NaN/inf loss or gradient norm, 1 other.

torch, transformers, trl and datasets are imported only inside the functions that run the trial, so a bad config
is refused (exit 2) without loading them.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autorl.backends.readers import DEFAULT_METRIC_MAP, to_record
from autorl.backends.trl import TRLParams, grpo_config_kwargs
from autorl.engine.config import EngineConfig
from autorl.toolkit import child
from autorl.toolkit.reward import Reward, load_reward, score
from autorl.toolkit.task import CharTokenizer, load_task

REWARD_NAME = "task_reward"  # the reward function's __name__, hence TRL's "rewards/task_reward/mean"
TRL_METRIC_MAP = dict(DEFAULT_METRIC_MAP)
NAN_KEYS = ("loss", "grad_norm")  # autorl keys whose NaN/inf stops the run
BUILTIN_FORMAT = 1  # bump when the built-in HF model layout changes (new cache directory)


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------


def engine_config(params: TRLParams, model: str) -> EngineConfig:
    """The EngineConfig the engine's warm-up and evaluation read (same task, model and lengths)."""
    return EngineConfig(
        model=model,
        task=params.task,
        eval_id=params.eval_id,
        eval_ood=params.eval_ood,
        reward=params.reward,
        sft_target=params.sft_target,
        max_new_tokens=params.max_new_tokens,
        eval_size=params.eval_size,
        seed=params.seed,
        threads=params.threads,
        eval_every=params.eval_every,
    )


# ---------------------------------------------------------------------------
# The built-in model as a Hugging Face model
# ---------------------------------------------------------------------------


def builtin_model_dir(size: str, cache_dir: Path) -> Path:
    """A Hugging Face directory (config, initial weights, tokenizer) for ``builtin:<size>``, made once."""
    from autorl.toolkit.hf_tiny import save_llama  # lazy: torch, once the child's config is valid
    from autorl.toolkit.model import BUILTIN_SIZES, ModelError  # lazy: torch, once the child's config is valid
    from autorl.toolkit.warmup import SFT_SETTINGS  # lazy: torch, once the child's config is valid

    if size not in BUILTIN_SIZES:
        raise ModelError(
            f"unknown built-in model 'builtin:{size}': use one of " + ", ".join(f"builtin:{s}" for s in BUILTIN_SIZES)
        )
    target = cache_dir / f"trl-builtin-{size}-v{BUILTIN_FORMAT}"
    return saved_once(target, lambda tmp: save_llama(tmp, size, seed=SFT_SETTINGS["seed"]))


def saved_once(target: Path, write: Callable[[Path], Any]) -> Path:
    """``target`` as a directory filled by ``write(tmp)`` once: locked, then moved into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():
            tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=target.name + ".tmp"))
            try:
                write(tmp)
                os.replace(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _save_policy(policy, path: Path) -> None:
    policy.module.save_pretrained(path)
    policy.tok.save_pretrained(path)


def load_base(params: TRLParams, task, reward: Reward, cache_dir: Path, device, log) -> Any:
    """The engine's HFPolicy for the run: a local directory, or the warmed-up built-in model.

    The warmed-up built-in model is saved as its own directory, because TRL
    builds the KL reference model from the policy's ``name_or_path``.
    """
    from autorl.toolkit.model import HFPolicy, ModelError  # lazy: torch, once the child's config is valid
    from autorl.toolkit.warmup import prepare_base  # lazy: torch, once the child's config is valid

    if not params.model.startswith("builtin:"):
        if not (Path(params.model) / "config.json").is_file():
            raise ModelError(
                f"model '{params.model}' is neither builtin:<size> nor a directory with config.json: fix the model path"
            )
        return HFPolicy(params.model, device, chat=params.chat_template)
    init_dir = builtin_model_dir(params.model.split(":", 1)[1], cache_dir)
    policy = _builtin_policy(HFPolicy(str(init_dir), device), task)
    judge = lambda text, label, tr: score(*reward, text, label, tr)["correctness"]  # noqa: E731
    base = prepare_base(policy, task, engine_config(params, str(init_dir)), cache_dir, judge, log)
    warm_dir = saved_once(cache_dir / f"trl-{base.stem}", lambda tmp: _save_policy(policy, tmp))
    return _builtin_policy(HFPolicy(str(warm_dir), device), task)


def _builtin_policy(policy, task):
    policy.decode = lambda tokens: [task.tokenizer.decode(row) for row in tokens.tolist()]  # the engine's decoding
    return policy


# ---------------------------------------------------------------------------
# Reward and metrics
# ---------------------------------------------------------------------------


def degenerate(ids: list[int], eos_id: int) -> bool:
    """A completion that is empty (EOS first) or one token repeated up to the length limit."""
    if eos_id in ids:
        return ids.index(eos_id) == 0
    return len(ids) > 1 and len(set(ids)) == 1


def completion_text(completion: Any) -> str:
    """A completion as text: TRL gives a conversational prompt's completion as its assistant message."""
    return str(completion[-1]["content"]) if isinstance(completion, list) else str(completion)


def make_reward_func(reward: Reward, eos_id: int, decode_ids: Callable[[list[int]], str] | None) -> Callable:
    """A TRL reward function over the dataset's ``answer`` column, using the engine's scorer.

    ``decode_ids`` (built-in task) re-decodes completion ids exactly as the
    engine does, so a stray ``<pad>`` or ``<bos>`` is never silently dropped.
    Correctness is logged beside the reward through TRL's ``log_metric``.
    """

    def task_reward(prompts, completions, completion_ids, answer, log_metric=None, **_: Any) -> list[float]:
        scores = []
        for text, ids, label in zip(completions, completion_ids, answer):
            ids = list(ids)
            text = decode_ids(ids) if decode_ids else completion_text(text)
            scores.append(score(*reward, text, label, eos_id not in ids))
        if log_metric is not None and scores:
            log_metric("correctness", sum(s["correctness"] for s in scores) / len(scores))
            log_metric("degenerate_rate", sum(degenerate(list(ids), eos_id) for ids in completion_ids) / len(scores))
        return [s["reward"] for s in scores]

    task_reward.__name__ = REWARD_NAME
    return task_reward


def step_record(logs: dict[str, Any], step: int) -> dict[str, Any]:
    """A TRL training log dict as an autorl step record."""
    rec = to_record({k: v for k, v in logs.items() if v is not None}, TRL_METRIC_MAP, step)
    rec.update(type="step", step=step)
    return rec


def nonfinite_key(rec: dict[str, Any]) -> str | None:
    """The first of ``NAN_KEYS`` that is NaN/inf in a step record."""
    for key in NAN_KEYS:
        value = rec.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            return key
    return None


def make_callback(writer, evaluate: Callable[[int], dict], eval_every: int, log):
    """The TrainerCallback that writes step lines and runs evaluations."""
    from transformers import TrainerCallback  # lazy: heavy, once the child's config is valid

    class AutorlMetrics(TrainerCallback):
        """Step lines from on_log; greedy evals at 0, every eval_every and the end."""

        def __init__(self):
            self.status, self.last_eval = "ok", None

        def _eval(self, step: int) -> None:
            if self.last_eval != step:
                rec = evaluate(step)
                writer.write(rec)
                self.last_eval = step
                log(f"eval step {step}: " + ", ".join(f"{k} {v:.3f}" for k, v in rec.items() if k.endswith("pass@1")))

        def on_train_begin(self, args, state, control, **kwargs):
            self._eval(0)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "train_runtime" in logs:
                return
            rec = step_record(logs, state.global_step)
            writer.write(rec)
            bad = nonfinite_key(rec)
            if bad:
                self.status, control.should_training_stop = "nan", True
                log(f"stopped: {bad} is {rec[bad]} at step {rec['step']}; lower lr or check the reward")
            elif eval_every and state.global_step % eval_every == 0:
                self._eval(state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            if self.status == "ok":
                self._eval(state.global_step)

    return AutorlMetrics()


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def build_trainer(params: TRLParams, policy, task, reward, callback, output_dir: Path):
    """GRPOTrainer on the task's training prompts, with the mapped GRPOConfig."""
    import torch  # lazy: torch, once the child's config is valid
    from datasets import Dataset  # lazy: heavy, once the child's config is valid
    from trl import GRPOConfig, GRPOTrainer  # lazy: heavy, once the child's config is valid

    decode_ids = CharTokenizer().decode if params.model.startswith("builtin:") else None
    config = GRPOConfig(**grpo_config_kwargs(params, str(output_dir), use_cpu=not torch.cuda.is_available()))
    prompts: list[Any] = task.train.prompts
    if params.chat_template:  # conversational rows: TRL applies the tokenizer's chat template, as OpenRLHF does
        prompts = [[{"role": "user", "content": p}] for p in prompts]
    data = Dataset.from_dict({"prompt": prompts, "answer": task.train.labels})
    return GRPOTrainer(
        model=policy.module,
        reward_funcs=[make_reward_func(reward, policy.eos_id, decode_ids)],
        args=config,
        train_dataset=data,
        processing_class=policy.tok,
        callbacks=[callback],
    )


def run(params: TRLParams, metrics_out: str | Path, cache_dir: str | Path, log=None) -> dict:
    """Run GRPOTrainer as configured, writing autorl metrics to ``metrics_out``; the summary record."""
    import torch  # lazy: torch, once the child's config is valid

    from autorl.engine.grpo import MetricsWriter, run_eval  # lazy: torch, once the child's config is valid

    log = log or (lambda msg: print(msg, flush=True))
    t0, writer = time.time(), MetricsWriter(metrics_out)
    summary: dict[str, Any] = {"type": "summary", "steps_done": 0, "wall_s": 0.0, "status": "error"}
    try:
        torch.set_num_threads(params.threads)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        task = load_task(params.task, params.eval_size, params.eval_id, params.eval_ood)
        reward = load_reward(params.reward, task.builtin)
        policy = load_base(params, task, reward, Path(cache_dir), device, log)
        eval_cfg = engine_config(params, params.model)
        callback = make_callback(
            writer, lambda step: _evaluate(run_eval, policy, task, eval_cfg, reward, step), params.eval_every, log
        )
        trainer = build_trainer(params, policy, task, reward, callback, Path(metrics_out).parent / "trl_out")
        trainer.train()
        summary.update(status=callback.status, steps_done=trainer.state.global_step)
    finally:
        summary["wall_s"] = round(time.time() - t0, 3)
        writer.write(summary)
        writer.close()
    return summary


def _evaluate(run_eval, policy, task, eval_cfg, reward, step: int) -> dict:
    was_training = policy.module.training
    policy.module.eval()
    try:
        return run_eval(policy, task, eval_cfg, reward, contextlib.nullcontext, step)
    finally:
        policy.module.train(was_training)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return child.main("autorl.backends.trl_runner", "Run one GRPO trial with TRL.", TRLParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
