"""OpenRLHF's command-line dialects: which flag each autorl field becomes, per version.

``train_ppo_ray`` changed its flags twice (read from the released wheels):

- up to 0.9.7, flat flags with ``--prompt_max_len`` / ``--generate_max_len``;
- 0.9.8 dropped those two for ``--max_len`` (prompt + response) and ``--max_new_tokens``;
- 0.10.2 renamed every flag to a dotted name (``--actor_learning_rate`` became
  ``--actor.adam.lr``) with no aliases; 0.10.1 is the last flat release.

``FLAGS`` is the one table of that mapping. A field set in a recipe that the
target version has no flag for is a :class:`~autorl.errors.RecipeError` before
anything launches, naming the field, the version and what to use instead.

A flag that only a shipped patch adds (``offload``: ``--offload`` from ``offload_cli.patch`` on the flat CLI,
``--ds.param_offload`` from ``offload_cli_0.10.4.patch`` on 0.10.4) names the one dotted release its patch was
written against (``patched``); other dotted releases have no such flag.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from autorl.errors import RecipeError

DOTTED_SINCE = (0, 10, 2)
NEW_LENGTHS_SINCE = (0, 9, 8)


class Flag(NamedTuple):
    """One field's flag: flat and dotted spellings, and the versions that accept it."""

    field: str
    flat: str | None
    dotted: str | None
    since: tuple[int, ...] | None = None
    until: tuple[int, ...] | None = None
    hint: str = ""
    patched: tuple[int, ...] | None = None  # the dotted flag exists only in this release, through a shipped patch


FLAGS: list[Flag] = [
    Flag("pretrain", "--pretrain", "--actor.model_name_or_path"),
    Flag("lr", "--actor_learning_rate", "--actor.adam.lr"),
    Flag("lr_warmup_ratio", "--lr_warmup_ratio", "--actor.lr_warmup_ratio"),
    Flag("max_norm", "--max_norm", "--actor.max_norm"),
    Flag("eps_clip", "--eps_clip", "--actor.eps_clip"),
    Flag("kl_coef", "--init_kl_coef", "--algo.kl.init_coef"),
    Flag("use_kl_loss", "--use_kl_loss", "--algo.kl.use_loss"),
    Flag("kl_estimator", "--kl_estimator", "--algo.kl.estimator"),
    Flag("gens", "--n_samples_per_prompt", "--rollout.n_samples_per_prompt"),
    Flag("advantage_estimator", "--advantage_estimator", "--algo.advantage.estimator"),
    Flag("entropy_loss_coef", "--entropy_loss_coef", "--actor.entropy_coef"),
    Flag("lora_rank", "--lora_rank", "--ds.lora.rank"),
    Flag("lora_alpha", "--lora_alpha", "--ds.lora.alpha"),
    Flag("target_modules", "--target_modules", "--ds.lora.target_modules"),
    Flag("vllm_num_engines", "--vllm_num_engines", "--vllm.num_engines"),
    Flag("vllm_tensor_parallel_size", "--vllm_tensor_parallel_size", "--vllm.tensor_parallel_size"),
    Flag("vllm_gpu_memory_utilization", "--vllm_gpu_memory_utilization", "--vllm.gpu_memory_utilization"),
    Flag("zero_stage", "--zero_stage", "--ds.zero_stage"),
    Flag("param_dtype", "--param_dtype", "--ds.param_dtype"),
    Flag("attn_implementation", "--attn_implementation", "--ds.attn_implementation"),
    Flag(
        "offload",
        "--offload",
        "--ds.param_offload",
        hint="only the flat CLI (0.9.3) patched by patches/offload_cli.patch and 0.10.4 patched by "
        "patches/offload_cli_0.10.4.patch have it; use 0.10.4, or remove offload (keep adam_offload)",
        patched=(0, 10, 4),
    ),
    Flag("adam_offload", "--adam_offload", "--ds.adam_offload"),
    Flag("gradient_checkpointing", "--gradient_checkpointing", "--actor.gradient_checkpointing_enable"),
    Flag(
        "gradient_checkpointing_use_reentrant",
        "--gradient_checkpointing_use_reentrant",
        "--actor.gradient_checkpointing_reentrant",
    ),
    Flag("prompt_max_len", "--prompt_max_len", None, until=NEW_LENGTHS_SINCE, hint="use max_len (prompt + response)"),
    Flag("generate_max_len", "--generate_max_len", None, until=NEW_LENGTHS_SINCE, hint="use max_new_tokens"),
    Flag("max_len", "--max_len", "--data.max_len", since=NEW_LENGTHS_SINCE, hint="use prompt_max_len"),
    Flag(
        "max_new_tokens",
        "--max_new_tokens",
        "--rollout.max_new_tokens",
        since=NEW_LENGTHS_SINCE,
        hint="use generate_max_len",
    ),
    Flag("rollout_batch_size", "--rollout_batch_size", "--rollout.batch_size"),
    Flag("micro_rollout_batch_size", "--micro_rollout_batch_size", "--rollout.micro_batch_size"),
    Flag("train_batch_size", "--train_batch_size", "--train.batch_size"),
    Flag("micro_train_batch_size", "--micro_train_batch_size", "--train.micro_batch_size"),
    Flag("num_episodes", "--num_episodes", "--train.num_episodes"),
    Flag("max_samples", "--max_samples", "--data.max_samples"),
    Flag("temperature", "--temperature", "--rollout.temperature"),
    Flag("seed", "--seed", "--train.seed"),
    Flag("prompt_data", "--prompt_data", "--data.prompt_dataset"),
    Flag("input_key", "--input_key", "--data.input_key"),
    Flag("label_key", "--label_key", "--data.label_key"),
    Flag("apply_chat_template", "--apply_chat_template", "--data.apply_chat_template"),
    Flag("reward_func", "--remote_rm_url", "--reward.remote_url"),
    Flag("eval_dataset", "--eval_dataset", "--eval.dataset"),
    Flag("eval_steps", "--eval_steps", "--eval.steps"),
    Flag("eval_temperature", "--eval_temperature", "--eval.temperature"),
    Flag("eval_n_samples_per_prompt", "--eval_n_samples_per_prompt", "--eval.n_samples_per_prompt"),
    Flag("save_path", "--save_path", "--ckpt.output_dir"),
    Flag("ckpt_path", "--ckpt_path", "--ckpt.path"),
    Flag("save_steps", "--save_steps", "--ckpt.save_steps"),
    Flag("max_ckpt_num", "--max_ckpt_num", "--ckpt.max_num"),
    Flag("disable_ds_ckpt", "--disable_ds_ckpt", "--ckpt.disable_ds"),
    Flag("save_hf_ckpt", "--save_hf_ckpt", "--ckpt.save_hf"),
    Flag("tensorboard_dir", "--use_tensorboard", "--logger.tensorboard_dir"),
    Flag("run_name", "--wandb_run_name", "--logger.wandb.run_name"),
    Flag("logging_steps", "--logging_steps", "--logger.logging_steps"),
    Flag("actor_num_nodes", "--actor_num_nodes", "--actor.num_nodes"),
    Flag("actor_num_gpus_per_node", "--actor_num_gpus_per_node", "--actor.num_gpus_per_node"),
    Flag("ref_num_nodes", "--ref_num_nodes", "--ref.num_nodes"),
    Flag("ref_num_gpus_per_node", "--ref_num_gpus_per_node", "--ref.num_gpus_per_node"),
    Flag("colocate_actor_ref", "--colocate_actor_ref", "--train.colocate_actor_ref"),
    Flag("colocate_all", "--colocate_all_models", "--train.colocate_all"),
]

FLAG_BY_FIELD: dict[str, Flag] = {f.field: f for f in FLAGS}


def parse_version(text: str) -> tuple[int, int, int]:
    """``'0.10.1.post2'`` -> ``(0, 10, 1)``; a bad string is a RecipeError."""
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not m:
        raise RecipeError(f"openrlhf_version {text!r} is not a version: write it like 0.9.3")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def is_dotted(version: str) -> bool:
    """Whether ``version`` uses the dotted flag dialect (0.10.2 and later)."""
    return parse_version(version) >= DOTTED_SINCE


def flag_for(field: str, version: str) -> str:
    """The flag for ``field`` under ``version``, or RecipeError naming field and version."""
    rule = FLAG_BY_FIELD[field]
    v = parse_version(version)
    dotted = v >= DOTTED_SINCE
    name = rule.dotted if dotted else rule.flat
    too_old = rule.since is not None and v < rule.since
    too_new = rule.until is not None and v >= rule.until
    unpatched = dotted and rule.patched is not None and v != rule.patched
    if name is None or too_old or too_new or unpatched:
        hint = f": {rule.hint}" if rule.hint else ""
        raise RecipeError(f"train.{field} is not supported by openrlhf {version}{hint}")
    return name


def to_args(field: str, value: Any, version: str) -> list[str]:
    """argv words for one field: nothing for None/False, the bare flag for True, else flag + values."""
    if value is None or value is False:
        return []
    flag = flag_for(field, version)
    if value is True:
        return [flag]
    if isinstance(value, (list, tuple)):
        return [flag, *(str(v) for v in value)]
    return [flag, _render(value)]


def _render(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)
