"""``OpenRLHFParams``: the ``train`` block of an OpenRLHF recipe, validated with the recipe.

Its own module, below both users: the backend (``backend.py``) turns it into a ``train_ppo_ray`` argv, and the
preflight (``preflight.py``), which the backend runs before each launch, checks it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from autorl.evaluate import ProbeSettings


class OpenRLHFParams(ProbeSettings):
    """The ``train`` block of an OpenRLHF recipe. None means: leave OpenRLHF's default."""

    model_config = ConfigDict(extra="forbid")
    run_length_keys: ClassVar[tuple[str, ...]] = ("num_episodes",)

    openrlhf_version: str | None = Field(
        None, description="OpenRLHF version on the cluster; default: the installed package's."
    )
    pretrain: str = Field(description="Base model: HF name or path (the actor and the vLLM engines load it).")
    lr: float = Field(5e-7, gt=0, description="Actor learning rate (peak, after warmup).")
    eps_clip: float = Field(0.2, gt=0, lt=1, description="PPO ratio clip range [1-eps, 1+eps].")
    kl_coef: float = Field(0.001, ge=0, description="KL coefficient (init_kl_coef); > 0 loads a reference model.")
    gens: int = Field(8, ge=2, description="Completions per prompt (n_samples_per_prompt), the GRPO group size.")
    advantage_estimator: Literal["group_norm", "dr_grpo"] = Field(
        "group_norm", description="GRPO (r-mean)/std, or Dr. GRPO r-mean."
    )
    use_kl_loss: bool = Field(False, description="Put KL in the actor loss instead of the reward.")
    kl_estimator: Literal["k1", "k2", "k3"] | None = Field(None, description="KL estimator; k3 with use_kl_loss.")
    entropy_loss_coef: float | None = Field(
        0.0, description="Entropy loss coefficient; 0 logs entropy without using it."
    )
    lora_rank: int = Field(0, ge=0, description="LoRA rank; 0 trains the full model.")
    lora_alpha: int | None = Field(None, ge=1, description="LoRA alpha (seed 004: 2 x rank).")
    target_modules: list[str] | None = Field(None, description="LoRA target modules (attention-only for MoE).")
    vllm_num_engines: int = Field(1, ge=1, description="vLLM rollout engines.")
    vllm_tensor_parallel_size: int = Field(1, ge=1, description="GPUs per vLLM engine.")
    vllm_gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="vLLM GPU memory fraction.")
    zero_stage: Literal[0, 1, 2, 3] | None = Field(None, description="DeepSpeed ZeRO stage.")
    param_dtype: Literal["bf16", "fp16"] | None = Field(None, description="Training dtype.")
    attn_implementation: str | None = Field(
        None,
        description="Actor attention (eager, sdpa, flash_attention_2, or a kernels repo id); gpt-oss needs one that "
        "keeps its attention sinks: eager or kernels-community/vllm-flash-attn3.",
    )
    offload: bool = Field(
        False,
        description="ZeRO-3 parameter offload to CPU: a patched flag (patches/offload_cli.patch on 0.9.3, "
        "offload_cli_0.10.4.patch on 0.10.4; `autorl patches apply`).",
    )
    adam_offload: bool = Field(False, description="Offload Adam states to CPU.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward.")
    gradient_checkpointing_use_reentrant: bool = Field(False, description="Reentrant checkpointing (ZeRO-3 + offload).")
    prompt_max_len: int | None = Field(None, ge=1, description="Prompt token limit (OpenRLHF < 0.9.8).")
    generate_max_len: int | None = Field(None, ge=1, description="Generation token limit (OpenRLHF < 0.9.8).")
    max_len: int | None = Field(None, ge=1, description="Prompt + response token limit (OpenRLHF >= 0.9.8).")
    max_new_tokens: int | None = Field(None, ge=1, description="Generation token limit (OpenRLHF >= 0.9.8).")
    rollout_batch_size: int = Field(16, ge=1, description="Prompts per rollout (global step).")
    micro_rollout_batch_size: int | None = Field(None, ge=1, description="Prompts per micro rollout batch.")
    train_batch_size: int = Field(16, ge=1, description="Global training batch size.")
    micro_train_batch_size: int = Field(1, ge=1, description="Per-GPU micro batch.")
    num_episodes: int = Field(1, ge=1, description="Passes over the prompt pool.")
    max_samples: int | None = Field(None, ge=1, description="Cap on prompts read from prompt_data (the trial's pool).")
    lr_warmup_ratio: float = Field(0.03, ge=0, lt=1, description="Fraction of total steps of linear warmup.")
    max_norm: float | None = Field(None, gt=0, description="Gradient clipping norm.")
    temperature: float | None = Field(None, ge=0, description="Rollout sampling temperature.")
    seed: int | None = Field(None, description="Training seed.")
    prompt_data: str = Field(description="Prompt dataset: JSONL path (relative to the worktree) or HF name.")
    input_key: str = Field("input", description="Prompt key in prompt_data rows.")
    label_key: str | None = Field("label", description="Answer key passed to the reward function.")
    apply_chat_template: bool = Field(False, description="Wrap prompts with the tokenizer's chat template.")
    reward_func: str | None = Field(
        None,
        description="'builtin:exact_match' (seed 004), a reward_func .py file (relative to the worktree) or a URL: "
        "--remote_rm_url. Files and the builtin go through autorl's wrapper, which also logs zero-std groups.",
    )
    eval_dataset: str | None = Field(None, description="Eval prompts (needs reward_func).")
    eval_steps: int | None = Field(None, description="Evaluate every this many steps (-1 never).")
    eval_temperature: float | None = Field(0.0, ge=0, description="Eval sampling temperature; 0 is greedy.")
    eval_n_samples_per_prompt: int | None = Field(1, ge=1, description="Eval samples per prompt.")
    eval_split_names: dict[str, str] = Field(
        default_factory=lambda: {"default": "ood"},
        description="Eval rows' datasource -> autorl split name (eval/<split>/...).",
    )
    save_path: str | None = Field(None, description="Final model directory.")
    ckpt_path: str | None = Field(None, description="Checkpoint directory.")
    save_steps: int | None = Field(None, description="Checkpoint every this many steps (-1 never).")
    max_ckpt_num: int | None = Field(None, ge=1, description="Checkpoints kept.")
    disable_ds_ckpt: bool = Field(False, description="Skip DeepSpeed's own checkpoint files.")
    save_hf_ckpt: bool = Field(False, description="Also write HF-format checkpoints.")
    checkpoint_gb: float | None = Field(
        None, gt=0, description="Expected size of one checkpoint (preflight disk check); default estimated."
    )
    tensorboard_dir: str | None = Field(None, description="TensorBoard root; default <run_dir>/tensorboard.")
    logging_steps: int | None = Field(None, ge=1, description="Log every this many steps.")
    actor_num_nodes: int = Field(1, ge=1, description="Nodes for the actor.")
    actor_num_gpus_per_node: int = Field(1, ge=1, description="Actor GPUs per node.")
    ref_num_nodes: int | None = Field(None, ge=1, description="Nodes for the reference model; default actor's.")
    ref_num_gpus_per_node: int | None = Field(None, ge=1, description="Reference GPUs per node; default actor's.")
    colocate_actor_ref: bool = Field(False, description="Reference model shares the actor's GPUs.")
    colocate_all: bool = Field(False, description="Actor, reference and vLLM engines share the same GPUs (sleep mode).")
    pool_size: int | None = Field(
        None, ge=1, description="Prompt pool size when prompt_data is not a local file (preflight)."
    )
    entrypoint_num_gpus: float = Field(
        0, ge=0, description="GPUs Ray reserves for the driver itself (the actors get their own)."
    )
    vllm_in_process: bool = Field(
        False,
        description="Run each vLLM engine's core in its Ray actor's own process "
        "(VLLM_ENABLE_V1_MULTIPROCESSING=0): no second process to spawn "
        "and import at every start.",
    )
    warm_pool: bool = Field(
        False,
        description="Run trials in warm pools: Ray jobs that keep the driver and vLLM engines between trials with "
        "the same engine settings (OpenRLHF 0.10.4, colocate_all, local Ray head; docs/warm-trials.md).",
    )
    extra_args: list[str] = Field(default_factory=list, description="Extra train_ppo_ray words, appended as given.")

    @model_validator(mode="after")
    def _check(self) -> OpenRLHFParams:
        if self.eval_dataset and not self.reward_func:
            raise ValueError("eval_dataset needs reward_func (OpenRLHF scores eval samples with it)")
        if self.lora_rank and self.lora_alpha is None:
            self.lora_alpha = 2 * self.lora_rank
        return self

    def gpus_needed(self) -> int:
        """Actor GPUs plus vLLM GPUs (reference GPUs too unless colocated or there is no reference)."""
        actor = self.actor_num_nodes * self.actor_num_gpus_per_node
        ref = 0 if self.colocate_actor_ref or self.kl_coef == 0 else self._ref_gpus()
        vllm = self.vllm_num_engines * self.vllm_tensor_parallel_size
        return max(actor, ref, vllm) if self.colocate_all else actor + ref + vllm

    def _ref_gpus(self) -> int:
        return (self.ref_num_nodes or self.actor_num_nodes) * (
            self.ref_num_gpus_per_node or self.actor_num_gpus_per_node
        )
