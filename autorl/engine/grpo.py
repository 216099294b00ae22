"""GRPO, top to bottom: config -> seeding -> model -> task -> reference -> loop.

Each step samples ``gens`` completions for each of ``batch_prompts`` prompts,
scores them, turns rewards into group-relative advantages, and runs
``ppo_epochs`` optimizer passes of the clipped surrogate over the batch (with
true gradient accumulation over ``micro_batch`` completions). Metrics go to a
JSONL file in autorl's schema (``autorl.metrics``), one flushed line at a time.

Departures from the GRPO paper (DeepSeekMath, Shao et al. 2024), on purpose:

- One rollout batch per step, reused for ``ppo_epochs`` passes; old log-probs
  are the (detached) log-probs of the first pass, taken before any optimizer step
  of this batch — no extra forward — so with ``ppo_epochs=1`` the ratio is 1 and
  clipping is inert (the paper's "single update" case).
- Log-probs are those of the sampling distribution (logits / temperature).
- Advantages divide by the group's sample std floored at 1e-4 (``scale_rewards``;
  off = Dr. GRPO); a group with equal rewards gets advantage 0.
- The KL penalty is added to the per-token loss (as the paper does) but only
  when ``kl_coef > 0``; otherwise no reference model exists. k1 or k3 estimator.
- ``asymmetric clipping`` (``eps_clip_high``, DAPO) and an entropy bonus are
  optional extras; ``dr_grpo`` aggregation divides token sums by
  ``max_new_tokens`` instead of each sequence's own length.
- AdamW betas (0.9, ``adam_beta2`` = 0.99), no weight decay, linear warmup then a
  constant lr (or ``lr_schedule: cosine`` down to ``min_lr_ratio``), gradient
  clipping at ``max_grad_norm``. Dropout is off throughout (eval mode).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autorl.engine.config import KEPT_FILE, EngineConfig
from autorl.toolkit import heartbeat
from autorl.toolkit.evalcache import base_eval, eval_key
from autorl.toolkit.model import load_policy
from autorl.toolkit.policy_eval import evaluate_split
from autorl.toolkit.reward import Reward, load_reward, score
from autorl.toolkit.task import load_task
from autorl.toolkit.warmup import SFT_SETTINGS, prepare_base, save_atomic
from autorl.workspace import write_atomically

STD_FLOOR = 1e-4
ADAM_BETA1 = 0.9


class NonFiniteError(FloatingPointError):
    """The loss, gradient norm or sampling distribution turned NaN/inf."""


# ---------------------------------------------------------------------------
# Loss math (pure functions on tensors; tests/test_loss.py checks each by hand)
# ---------------------------------------------------------------------------


def group_advantages(rewards: torch.Tensor, gens: int, scale: bool, std_floor: float = STD_FLOOR) -> torch.Tensor:
    """Reward minus its group's mean, divided by max(group std, floor) when ``scale``; equal groups give 0."""
    groups = rewards.view(-1, gens)
    centred = groups - groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True)
    if scale:
        centred = centred / std.clamp(min=std_floor)
    return torch.where(std == 0, torch.zeros_like(centred), centred).view(-1)  # NaN rewards stay NaN


def clipped_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss -min(r*A, clip(r, 1-eps_low, 1+eps_high)*A), and where the clip was active."""
    ratio = torch.exp(logp - old_logp)
    a = adv.unsqueeze(-1)
    unclipped, clipped = ratio * a, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * a
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from samples of pi: k1 = log(pi/ref), k3 = ref/pi - log(ref/pi) - 1."""
    if estimator == "k1":
        return logp - ref_logp
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each position's next-token distribution."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(token) under ``logits`` at each position."""
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    max_new_tokens: int,
    n_total: int,
    tokens_total: float = 0.0,
) -> torch.Tensor:
    """Per-token values -> scalar. grpo: each sequence's mean over its own tokens; dr_grpo: token sum /
    max_new_tokens; then summed over these sequences and divided by ``n_total`` (the whole batch), so
    micro-batch losses add up to the full-batch loss. token_mean: the token sum over ``tokens_total``, the
    completion tokens of the whole batch (each token weighs the same, whatever its sequence's length)."""
    m = mask.to(values.dtype)
    if loss_type == "token_mean":
        return (values * m).sum() / max(tokens_total, 1.0)
    sums = (values * m).sum(-1)
    per_seq = sums / m.sum(-1).clamp(min=1) if loss_type == "grpo" else sums / max_new_tokens
    return per_seq.sum() / n_total


# ---------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------


def pick_device(config: EngineConfig) -> torch.device:
    """CUDA when asked or available ('auto'), else CPU with the configured thread count."""
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if not use_cuda:
        torch.set_num_threads(config.threads)
    return torch.device("cuda" if use_cuda else "cpu")


def autocast_for(config: EngineConfig, device: torch.device):
    """A context factory: bf16 autocast on CUDA ('auto') or when dtype is bfloat16, else a no-op."""
    bf16 = config.dtype == "bfloat16" or (config.dtype == "auto" and device.type == "cuda")
    if not bf16:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def seed_everything(seed: int) -> random.Random:
    """Seed torch (sampling) and return the prompt-order RNG."""
    torch.manual_seed(seed)
    return random.Random(seed)


def build_reference(policy, kl_coef: float):
    """A frozen copy of the policy's module, or None when kl_coef is 0 (no reference is built)."""
    if kl_coef <= 0:
        return None
    ref = copy.deepcopy(policy.module)
    ref.requires_grad_(False)
    return ref


class AdamW:
    """AdamW with no weight decay, with linear warmup and then a constant lr (or a cosine down to ``min_ratio`` of
    it at optimizer step ``total``): torch.optim.AdamW's update written out.

    Constructing any ``torch.optim.Optimizer`` imports ``torch._dynamo``, about a second of every trial's start-up
    on a CPU, which no early stop can save. The update is the same (tests compare it with torch's AdamW and
    LambdaLR step by step); the ``_foreach`` ops keep it one kernel per op on a GPU.
    """

    def __init__(
        self,
        params: list,
        lr: float,
        betas: tuple[float, float],
        warmup_steps: int,
        eps: float = 1e-8,
        cosine_total: int = 0,
        min_ratio: float = 0.1,
    ):
        self.params, self.base_lr, self.betas, self.warmup, self.eps = params, lr, betas, warmup_steps, eps
        self.cosine_total, self.min_ratio = cosine_total, min_ratio  # cosine_total 0: a constant lr
        self.t = 0  # optimizer steps taken (sets the warmup); each parameter counts its own updates
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.n = [0] * len(params)

    @property
    def lr(self) -> float:
        """The lr of the next step."""
        if self.t < self.warmup:
            return self.base_lr * (self.t + 1) / self.warmup
        if not self.cosine_total:
            return self.base_lr
        done = min(1.0, (self.t - self.warmup) / max(1, self.cosine_total - self.warmup))
        return self.base_lr * (self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * done)))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        lr, (b1, b2) = self.lr, self.betas
        self.t += 1
        have = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not have:
            return
        for i in have:
            self.n[i] += 1
        ps, gs = [self.params[i] for i in have], [self.params[i].grad for i in have]
        ms, vs = [self.m[i] for i in have], [self.v[i] for i in have]
        torch._foreach_lerp_(ms, gs, 1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, gs, gs, value=1 - b2)
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, [math.sqrt(1 - b2 ** self.n[i]) for i in have])
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(ps, ms, denom, [-lr / (1 - b1 ** self.n[i]) for i in have])


def make_optimizer(params: list, config: EngineConfig) -> AdamW:
    """AdamW (betas 0.9/``adam_beta2``, no weight decay) with linear warmup, then the configured schedule over the
    run's optimizer steps (``steps`` x ``ppo_epochs``)."""
    total = config.steps * config.ppo_epochs if config.lr_schedule == "cosine" else 0
    return AdamW(
        params,
        config.lr,
        (ADAM_BETA1, config.adam_beta2),
        config.warmup_steps,
        cosine_total=total,
        min_ratio=config.min_lr_ratio,
    )


# ---------------------------------------------------------------------------
# Rollout
# ---------------------------------------------------------------------------


@dataclass
class Rollout:
    """One step's sampled batch: full sequences, completion masks, rewards and cached log-probs."""

    ids: torch.Tensor  # (B, P+T) prompt + completion
    mask: torch.Tensor  # (B, P+T) attention mask
    completion: torch.Tensor  # (B, T)
    cmask: torch.Tensor  # (B, T) completion tokens up to and including EOS
    rewards: torch.Tensor  # (B,)
    correct: torch.Tensor  # (B,)
    truncated: torch.Tensor  # (B,)
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    time_generate_s: float = 0.0
    time_reward_s: float = 0.0


def sample_rollout(policy, task, rng: random.Random, config: EngineConfig, reward: Reward, autocast) -> Rollout:
    """Sample ``gens`` completions per prompt and score them."""
    batch = task.batch(config.batch_prompts, rng)
    prompts = [p for p in batch.prompts for _ in range(config.gens)]
    labels = [a for a in batch.labels for _ in range(config.gens)]
    t0 = time.perf_counter()
    ids, pmask = policy.encode(prompts)
    with autocast():
        comp, cmask = policy.sample(ids, pmask, config.max_new_tokens, config.temperature)
    eos = policy.tokenizer.eos_id if policy.kind == "builtin" else policy.eos_id
    truncated = ~(comp == eos).any(-1)
    t1 = time.perf_counter()
    scores = [score(*reward, t, g, bool(tr)) for t, g, tr in zip(policy.decode(comp), labels, truncated.tolist())]
    as_tensor = lambda key: torch.tensor([s[key] for s in scores], dtype=torch.float32, device=ids.device)  # noqa: E731
    return Rollout(
        torch.cat([ids, comp], 1),
        torch.cat([pmask, torch.ones_like(cmask)], 1),
        comp,
        cmask,
        as_tensor("reward"),
        as_tensor("correctness"),
        truncated.float(),
        time_generate_s=t1 - t0,
        time_reward_s=time.perf_counter() - t1,
    )


def completion_logits(module_fn, roll: Rollout, rows: slice, temperature: float) -> torch.Tensor:
    """Float logits at the positions that predict the completion tokens of ``rows``, divided by temperature."""
    t = roll.completion.shape[1]
    logits = module_fn(roll.ids[rows, :-1], roll.mask[rows, :-1])
    return logits[:, -t:].float() / temperature


def chunks(n: int, micro_batch: int) -> list[slice]:
    """Row slices of size micro_batch (all rows when 0)."""
    size = micro_batch or n
    return [slice(i, i + size) for i in range(0, n, size)]


@torch.no_grad()
def cache_logprobs(policy, ref, roll: Rollout, config: EngineConfig, autocast) -> None:
    """Reference log-probs, once, in the same micro-batches the update uses (none without a reference).

    Old log-probs need no pass of their own: the first optimizer pass records them.
    """
    roll.old_logp = None
    if ref is None:
        roll.ref_logp = None
        return
    refs = []
    for rows in chunks(len(roll.ids), config.micro_batch):
        heartbeat.beat(f"reference log-probs of sequences {rows.start + 1}-{rows.stop} of {len(roll.ids)}")
        with autocast():
            logits = completion_logits(lambda i, m: _ref_logits(policy, ref, i, m), roll, rows, config.temperature)
            refs.append(token_logprobs(logits, roll.completion[rows]))
    roll.ref_logp = torch.cat(refs)


def _ref_logits(policy, ref, ids, mask):
    live = policy.module
    policy.module = ref
    try:
        return policy.logits(ids, mask)
    finally:
        policy.module = live


# ---------------------------------------------------------------------------
# Update
# ---------------------------------------------------------------------------


class StepStats:
    """Accumulates the update's diagnostics over micro-batches and epochs."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.log_ratios: list[torch.Tensor] = []
        self.old_logps: list[torch.Tensor] = []

    def add(self, **values: float | torch.Tensor) -> None:
        for k, v in values.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)

    def result(self, epochs: int, tokens: float, first_tokens: float) -> dict[str, float]:
        lr_abs = torch.cat(self.log_ratios) if self.log_ratios else torch.zeros(1)
        return {
            "loss": self.sums.get("loss", 0.0) / epochs,
            "grad_norm": self.sums.get("grad_norm", 0.0) / epochs,
            "kl": self.sums.get("kl", 0.0) / tokens,
            "clip_ratio": self.sums.get("clipped", 0.0) / tokens,
            "entropy_mean": self.sums.get("entropy", 0.0) / first_tokens,
            "log_ratio_abs_max": float(lr_abs.max()),
            "log_ratio_abs_p99": float(torch.quantile(lr_abs, 0.99)),
            "ratio_max": float(torch.exp(lr_abs.max())),
        }


def micro_batch_loss(
    policy, roll: Rollout, adv: torch.Tensor, rows: slice, config: EngineConfig, stats: StepStats, first_epoch: bool
) -> torch.Tensor:
    """The loss of one micro-batch (already divided by the full batch size); records diagnostics."""
    logits = completion_logits(policy.logits, roll, rows, config.temperature)
    logp, mask = token_logprobs(logits, roll.completion[rows]), roll.cmask[rows]
    if first_epoch:
        old = logp.detach()
        stats.old_logps.append(old)
    else:
        assert roll.old_logp is not None, "the first epoch records the old log-probs"
        old = roll.old_logp[rows]
    per_token, clipped = clipped_surrogate(
        logp, old, adv[rows], config.eps_clip, config.eps_clip_high or config.eps_clip
    )
    if roll.ref_logp is not None:
        kl = kl_estimate(logp, roll.ref_logp[rows], config.kl_estimator)
        per_token = per_token + config.kl_coef * kl
        stats.add(kl=(kl.detach() * mask).sum())
    with contextlib.nullcontext() if config.entropy_coef > 0 else torch.no_grad():
        entropy = token_entropy(logits)
    if config.entropy_coef > 0:
        per_token = per_token - config.entropy_coef * entropy
    loss = aggregate(per_token, mask, config.loss_type, config.max_new_tokens, len(roll.ids), float(roll.cmask.sum()))
    stats.add(clipped=(clipped & mask).sum(), loss=loss.detach())
    if first_epoch:
        stats.add(entropy=(entropy.detach() * mask).sum())
    stats.log_ratios.append((logp.detach() - old).abs()[mask].float().cpu())
    return loss


def optimizer_pass(policy, params, opt, roll, adv, config, stats, autocast, first_epoch: bool) -> None:
    """One optimizer step over the whole batch, accumulating gradients over micro-batches."""
    opt.zero_grad()
    total = 0.0
    for rows in chunks(len(roll.ids), config.micro_batch):
        heartbeat.beat(f"updating on sequences {rows.start + 1}-{rows.stop} of {len(roll.ids)}")
        with autocast():
            loss = micro_batch_loss(policy, roll, adv, rows, config, stats, first_epoch)
        loss.backward()
        total += float(loss.detach())
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
    if config.nan_check and not (math.isfinite(total) and math.isfinite(grad_norm)):
        raise NonFiniteError(f"loss {total} / grad_norm {grad_norm}")
    stats.add(grad_norm=grad_norm)
    opt.step()


def update(policy, params, opt, roll: Rollout, adv: torch.Tensor, config: EngineConfig, autocast) -> dict:
    """``ppo_epochs`` optimizer passes over the rollout; returns the step's update diagnostics."""
    stats = StepStats()
    for epoch in range(config.ppo_epochs):
        optimizer_pass(policy, params, opt, roll, adv, config, stats, autocast, epoch == 0)
        if epoch == 0:
            roll.old_logp = torch.cat(stats.old_logps)
    tokens = float(roll.cmask.sum())
    return stats.result(config.ppo_epochs, tokens * config.ppo_epochs, tokens)


# ---------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------


class MetricsWriter:
    """Writes one JSON object per line and flushes it at once."""

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(path, "w")

    def write(self, record: dict) -> None:
        self.fh.write(json.dumps(record, allow_nan=True) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def rollout_metrics(roll: Rollout, adv: torch.Tensor, gens: int) -> dict[str, float]:
    """Reward, length and advantage statistics of a rollout."""
    groups = roll.rewards.view(-1, gens)
    return {
        "reward_mean": float(roll.rewards.mean()),
        "reward_std": float(roll.rewards.std(correction=0)),
        "correctness": float(roll.correct.mean()),
        "truncated_rate": float(roll.truncated.mean()),
        "response_length_mean": float(roll.cmask.sum(-1).float().mean()),
        "advantage_mean": float(adv.mean()),
        "advantage_std": float(adv.std(correction=0)),
        "advantage_abs_max": float(adv.abs().max()),
        "frac_zero_std_groups": float((groups.std(dim=1) == 0).float().mean()),
        "degenerate_rate": degenerate_rate(roll),
    }


def degenerate_rate(roll: Rollout) -> float:
    """Fraction of completions that are empty (EOS first) or one token repeated up to the length limit."""
    empty = (roll.cmask.sum(-1) <= 1) & (roll.truncated == 0)
    same = ((roll.completion == roll.completion[:, :1]) | ~roll.cmask.bool()).all(-1)
    repeated = (roll.truncated > 0) & same & (roll.completion.shape[1] > 1)
    return float((empty | repeated).float().mean())


def run_eval(policy, task, config: EngineConfig, reward: Reward, autocast, step: int) -> dict:
    """An eval record over every split of the task. A reward that is user code also gets the task's own exact
    match per item (``task_items``): a held-out measure its loopholes cannot reach."""
    judge = lambda text, label, tr: score(*reward, text, label, tr)["correctness"]  # noqa: E731
    exact = None if reward[1] else load_reward("builtin:exact_match", task.builtin)
    task_judge = None if exact is None else (lambda text, label, tr: score(*exact, text, label, tr)["correctness"])
    record: dict[str, Any] = {"type": "eval", "step": step}
    tokens = config.eval_max_new_tokens or config.max_new_tokens
    for name, split in task.evals.items():
        record.update(
            evaluate_split(
                policy, name, split, tokens, judge, config.eval_k, config.eval_temperature, autocast, task_judge
            )
        )
    return record


def keep_weights(state: dict, config: EngineConfig, rec: dict) -> None:
    """With ``config.save_best``, one save an eval: a new best eval's weights as best.pt, any other eval's as last.pt,
    each written atomically. So best.pt holds the best eval's weights and ``last_checkpoint`` names
    the file with the last eval's: a full run keeps the last unless an earlier eval beats it beyond noise
    (autorl.judge.earlystop.keep_checkpoint). Both marks are also written to kept.json beside them."""
    value = rec.get(config.save_best) if config.save_best else None
    if not isinstance(value, (int, float)):
        return
    best = state.get("best_checkpoint")
    new_best = best is None or value > best["value"]
    path = Path(state["best_path"])
    path = path if new_best else path.with_name("last.pt")
    save_atomic(state["policy"].module.state_dict(), path)
    mark = {"step": rec["step"], "metric": config.save_best, "value": float(value), "path": str(path)}
    state["last_checkpoint"] = mark
    if new_best:  # the last eval's weights are best.pt's now
        state["best_checkpoint"] = mark
        path.with_name("last.pt").unlink(missing_ok=True)
    # beside the weights too: a run stopped early is killed before it writes its summary
    marks = {k: state[k] for k in ("best_checkpoint", "last_checkpoint")}
    write_atomically(path.with_name(KEPT_FILE), json.dumps(marks))


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def grpo_step(step: int, state: dict, config: EngineConfig) -> dict:
    """Sample, score, compute advantages and update; the step's metric record."""
    policy, autocast = state["policy"], state["autocast"]
    t0 = time.perf_counter()
    roll = sample_rollout(policy, state["task"], state["rng"], config, state["reward"], autocast)
    t1 = time.perf_counter()
    adv = group_advantages(roll.rewards, config.gens, config.scale_rewards)
    cache_logprobs(policy, state["ref"], roll, config, autocast)
    lr = state["opt"].lr
    upd = update(policy, state["params"], state["opt"], roll, adv, config, autocast)
    t2 = time.perf_counter()
    return {
        "type": "step",
        "step": step,
        **rollout_metrics(roll, adv, config.gens),
        **upd,
        "lr": lr,
        "kl": upd["kl"] if state["ref"] is not None else 0.0,
        "tokens_per_s": float(roll.cmask.sum()) / (t2 - t0),
        "time_generate_s": roll.time_generate_s,
        "time_reward_s": roll.time_reward_s,
        "time_update_s": t2 - t1,
    }


def setup(config: EngineConfig, cache_dir: str | Path, log) -> dict:
    """Device, task, reward, base model, reference and optimizer: everything the loop needs."""
    device = pick_device(config)
    task = load_task(config.task, config.eval_size, config.eval_id, config.eval_ood)
    reward = load_reward(config.reward, task.builtin)
    torch.manual_seed(SFT_SETTINGS["seed"])  # the base model's init does not depend on the run's seed
    policy = load_policy(config.model, task.tokenizer, device, chat=config.chat_template)
    policy.module.eval()
    if task.builtin:
        judge = lambda text, label, tr: score(*reward, text, label, tr)["correctness"]  # noqa: E731
        prepare_base(policy, task, config, cache_dir, judge, log)
    rng = seed_everything(config.seed)
    params = [p for p in policy.module.parameters() if p.requires_grad]
    opt = make_optimizer(params, config)
    return {
        "policy": policy,
        "task": task,
        "reward": reward,
        "ref": build_reference(policy, config.kl_coef),
        "rng": rng,
        "params": params,
        "opt": opt,
        "autocast": autocast_for(config, device),
        "eval0_key": eval_key(config, device.type),  # the step-0 eval is measured once per base and eval setting
        "cache_dir": cache_dir,
    }


def _progress(rec: dict, steps: int) -> str:
    return (
        f"step {rec['step']}/{steps} reward {rec['reward_mean']:.3f} kl {rec['kl']:.4f} "
        f"clip {rec['clip_ratio']:.3f} grad {rec['grad_norm']:.3f} {rec['tokens_per_s']:.0f} tok/s"
    )


def _eval_line(rec: dict) -> str:
    parts = [f"{k.split('/')[1]} {v:.3f}" for k, v in rec.items() if k.endswith("greedy_pass@1")]
    return f"eval step {rec['step']}: greedy pass@1 " + ", ".join(parts)


def train_loop(config: EngineConfig, state: dict, writer: MetricsWriter, log) -> int:
    """Steps 1..config.steps with evals at 0 (kept in the cache: the same base on the same items), every
    eval_every and the end; returns steps done."""

    def evaluate(step: int) -> None:
        measure = lambda: run_eval(state["policy"], state["task"], config, state["reward"], state["autocast"], step)  # noqa: E731
        rec = base_eval(state["eval0_key"], state["cache_dir"], measure, log) if step == 0 else measure()
        writer.write(rec)
        log(_eval_line(rec))
        keep_weights(state, config, rec)

    evaluate(0)
    done = state["done"] = 0
    for step in range(1, config.steps + 1):
        rec = grpo_step(step, state, config)
        writer.write(rec)
        log(_progress(rec, config.steps))
        done = state["done"] = step
        if (config.eval_every and step % config.eval_every == 0) or step == config.steps:
            evaluate(step)
    return done


def run(config: EngineConfig, metrics_out: str | Path, cache_dir: str | Path, log=None) -> dict:
    """Run GRPO as configured, writing metrics to ``metrics_out``; returns the summary record.

    A NaN/inf loss, gradient norm or sampling distribution ends the run with
    status 'nan' (the CLI exits 3). User mistakes raise UserError subclasses.
    """
    log = log or (lambda msg: print(msg, flush=True))
    t0 = time.time()
    writer = MetricsWriter(metrics_out)
    state: dict = {"done": 0, "best_path": Path(metrics_out).parent / "best.pt"}
    summary: dict[str, Any] = {"type": "summary", "steps_done": 0, "wall_s": 0.0, "status": "ok"}
    try:
        state.update(setup(config, cache_dir, log))
        summary["steps_done"] = train_loop(config, state, writer, log)
    except FloatingPointError as exc:
        summary["status"] = "nan"
        summary["steps_done"] = state.get("done", 0)
        log(f"stopped: non-finite values at step {summary['steps_done'] + 1} ({exc}); lower lr or check the reward")
    except BaseException:
        summary.update(status="error", wall_s=round(time.time() - t0, 3))
        writer.write(summary)
        writer.close()
        raise
    summary["wall_s"] = round(time.time() - t0, 3)
    for kept in ("best_checkpoint", "last_checkpoint"):
        if state.get(kept):
            summary[kept] = state[kept]
    writer.write(summary)
    writer.close()
    return summary
