"""The GRPO loss math on small hand-computed tensors."""

import copy
import math

import pytest
import torch

from autorl.engine.config import EngineConfig
from autorl.engine.grpo import (
    ADAM_BETA1,
    Rollout,
    aggregate,
    build_reference,
    cache_logprobs,
    clipped_surrogate,
    group_advantages,
    kl_estimate,
    make_optimizer,
    token_entropy,
    update,
)
from autorl.toolkit.model import BuiltinPolicy
from autorl.toolkit.task import CharTokenizer


def test_advantages_scaled_by_group_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    adv = group_advantages(rewards, gens=4, scale=True)
    std1, std2 = math.sqrt(0.75 * 0.25 * 4 / 3), math.sqrt(4 / 3 * 0.25)  # sample std, n-1
    expected = [0.75 / std1, -0.25 / std1, -0.25 / std1, -0.25 / std1, 0.5 / std2, 0.5 / std2, -0.5 / std2, -0.5 / std2]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)


def test_advantages_unscaled_are_mean_centred():
    adv = group_advantages(torch.tensor([3.0, 1.0, 0.5, 0.5]), gens=2, scale=False)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0])


def test_zero_std_groups_get_zero_advantage():
    adv = group_advantages(torch.tensor([0.3, 0.3, 0.3, 1.0, 0.0, 0.5]), gens=3, scale=True)
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert adv[3:].abs().sum() > 0


def test_std_floor_bounds_tiny_spreads():
    adv = group_advantages(torch.tensor([0.0, 1e-7]), gens=2, scale=True, std_floor=1e-4)
    assert adv.abs().max().item() == pytest.approx(0.5e-7 / 1e-4, rel=1e-3)


def _surrogate(ratio: float, adv: float, lo: float = 0.2, hi: float = 0.2):
    logp = torch.tensor([[math.log(ratio)]])
    loss, clipped = clipped_surrogate(logp, torch.zeros(1, 1), torch.tensor([adv]), lo, hi)
    return loss.item(), bool(clipped.item())


@pytest.mark.parametrize(
    "ratio,adv,loss,clipped",
    [
        (1.0, 2.0, -2.0, False),  # on-policy
        (1.5, 2.0, -2.4, True),  # A > 0, ratio above 1+eps: capped at 1.2*A
        (0.5, 2.0, -1.0, False),  # A > 0, ratio below 1-eps: not clipped (pessimistic min keeps r*A)
        (0.5, -2.0, 1.6, True),  # A < 0, ratio below 1-eps: floored at 0.8*A
        (1.5, -2.0, 3.0, False),  # A < 0, ratio above 1+eps: unclipped, full penalty
        (1.1, 0.0, 0.0, False),  # no advantage, no loss, no clip
    ],
)
def test_clipping_both_sides(ratio, adv, loss, clipped):
    got_loss, got_clipped = _surrogate(ratio, adv)
    assert got_loss == pytest.approx(loss, rel=1e-6)
    assert got_clipped is clipped


def test_asymmetric_high_clip():
    assert _surrogate(1.25, 1.0, lo=0.2, hi=0.28) == pytest.approx((-1.25, False))
    loss, clipped = _surrogate(1.5, 1.0, lo=0.2, hi=0.28)
    assert loss == pytest.approx(-1.28) and clipped
    loss, clipped = _surrogate(0.7, -1.0, lo=0.2, hi=0.28)
    assert loss == pytest.approx(0.8) and clipped


def test_kl_estimators():
    logp, ref = torch.tensor([math.log(0.5), math.log(0.2)]), torch.tensor([math.log(0.25), math.log(0.2)])
    assert kl_estimate(logp, ref, "k1").tolist() == pytest.approx([math.log(2), 0.0])
    # k3 = ref/p - log(ref/p) - 1 = 0.5 - log(0.5) - 1
    assert kl_estimate(logp, ref, "k3").tolist() == pytest.approx([0.5 - math.log(0.5) - 1, 0.0], abs=1e-7)
    assert (kl_estimate(torch.randn(100), torch.randn(100), "k3") >= 0).all()


def test_entropy_of_uniform_and_peaked():
    ent = token_entropy(torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]))
    assert ent.tolist() == pytest.approx([math.log(4), 0.0], abs=1e-6)


def test_grpo_vs_dr_grpo_normalisation():
    values = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    # grpo: per-sequence means 2 and 4, then their mean
    assert aggregate(values, mask, "grpo", max_new_tokens=4, n_total=2).item() == pytest.approx(3.0)
    # dr_grpo: token sums 6 and 4 over max_new_tokens 4, then the mean
    assert aggregate(values, mask, "dr_grpo", max_new_tokens=4, n_total=2).item() == pytest.approx((1.5 + 1.0) / 2)
    # halves of a batch add up to the whole
    halves = sum(aggregate(values[i : i + 1], mask[i : i + 1], "grpo", 4, n_total=2) for i in range(2))
    assert halves.item() == pytest.approx(3.0)


def _toy_rollout(policy, tokens_per_seq: int = 4, n: int = 8) -> Rollout:
    torch.manual_seed(3)
    prompts = torch.cat([torch.ones(n, 1, dtype=torch.long), torch.randint(3, 13, (n, 4))], 1)
    comp = torch.randint(2, 15, (n, tokens_per_seq))
    cmask = torch.ones_like(comp, dtype=torch.bool)
    cmask[::3, -1] = False
    ids = torch.cat([prompts, comp], 1)
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 0, 1, 1])
    return Rollout(ids, torch.ones_like(ids, dtype=torch.bool), comp, cmask, rewards, rewards, torch.zeros(n))


def _grads_after_one_pass(micro_batch: int, loss_type: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    policy = BuiltinPolicy("tiny", CharTokenizer(), torch.device("cpu"))
    config = EngineConfig(
        micro_batch=micro_batch,
        batch_prompts=2,
        gens=4,
        ppo_epochs=1,
        lr=0.0,
        kl_coef=0.1,
        loss_type=loss_type,
        max_grad_norm=1e9,
        entropy_coef=0.01,
    )
    roll = _toy_rollout(policy)
    ref = build_reference(policy, config.kl_coef)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.01 * torch.randn_like(p))
    cache_logprobs(policy, ref, roll, config, _nullcontext)
    params = list(policy.module.parameters())
    opt = make_optimizer(params, config)  # lr 0: the gradients are looked at, the weights stay
    adv = group_advantages(roll.rewards, 4, True)
    update(policy, params, opt, roll, adv, config, _nullcontext)
    return [p.grad.clone() for p in params]


def _nullcontext():
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_gradient_accumulation_equals_one_big_batch(loss_type):
    full = _grads_after_one_pass(0, loss_type)
    for micro in (2, 4):
        accumulated = _grads_after_one_pass(micro, loss_type)
        for a, b in zip(full, accumulated):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert sum(g.abs().sum() for g in full) > 0


def test_kl_coef_zero_builds_no_reference():
    policy = BuiltinPolicy("tiny", CharTokenizer(), torch.device("cpu"))
    assert build_reference(policy, 0.0) is None
    ref = build_reference(policy, 0.05)
    assert ref is not policy.module and not any(p.requires_grad for p in ref.parameters())


def test_ratio_is_one_with_a_single_epoch():
    policy = BuiltinPolicy("tiny", CharTokenizer(), torch.device("cpu"))
    config = EngineConfig(batch_prompts=2, gens=4, ppo_epochs=1, lr=1e-3, micro_batch=4)
    roll = _toy_rollout(policy)
    cache_logprobs(policy, None, roll, config, _nullcontext)
    params = list(policy.module.parameters())
    opt = make_optimizer(params, config)
    stats = update(policy, params, opt, roll, group_advantages(roll.rewards, 4, True), config, _nullcontext)
    assert stats["log_ratio_abs_max"] == 0.0 and stats["clip_ratio"] == 0.0
    config2 = config.model_copy(update={"ppo_epochs": 3})
    cache_logprobs(policy, None, roll, config2, _nullcontext)
    stats2 = update(policy, params, opt, roll, group_advantages(roll.rewards, 4, True), config2, _nullcontext)
    assert stats2["log_ratio_abs_max"] > 0  # later passes are off-policy


def _schedule(warmup: int, cosine_total: int, min_ratio: float = 0.1):
    """The lr factor at optimizer step t, written from the definitions (linear warm-up to 1, then 1 or a cosine
    that reaches min_ratio at step cosine_total)."""

    def factor(t: int) -> float:
        if t < warmup:
            return (t + 1) / warmup
        if not cosine_total:
            return 1.0
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * (t - warmup) / (cosine_total - warmup)))

    return factor


@pytest.mark.parametrize(
    "warmup, schedule, beta2", [(0, "constant", 0.99), (3, "constant", 0.99), (1, "cosine", 0.95), (3, "cosine", 0.99)]
)
def test_adamw_takes_the_same_steps_as_torchs_adamw_with_lambdalr(warmup, schedule, beta2):
    """The engine's AdamW (no torch.optim.Optimizer: that imports torch._dynamo) against torch's AdamW + LambdaLR,
    10 steps on the tiny model with random gradients (one parameter left without a gradient at step 4)."""
    torch.manual_seed(0)
    ours_model = BuiltinPolicy("tiny", CharTokenizer(), torch.device("cpu")).module
    theirs_model = copy.deepcopy(ours_model)
    ours, theirs = list(ours_model.parameters()), list(theirs_model.parameters())
    start = [a.detach().clone() for a in ours]
    config = EngineConfig(lr=3e-3, warmup_steps=warmup, lr_schedule=schedule, adam_beta2=beta2, steps=10, ppo_epochs=1)
    opt = make_optimizer(ours, config)
    ref = torch.optim.AdamW(theirs, lr=config.lr, betas=(ADAM_BETA1, beta2), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(ref, _schedule(warmup, 10 if schedule == "cosine" else 0))
    for step in range(10):
        assert opt.lr == pytest.approx(ref.param_groups[0]["lr"])
        for a, b in zip(ours, theirs):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        if step == 4:
            ours[0].grad = theirs[0].grad = None
        opt.step()
        ref.step()
        sched.step()
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert all((a - s0).abs().max() > 1e-3 for a, s0 in zip(ours, start))  # every parameter moved


def test_the_cosine_schedule_is_openrlhfs_after_the_warm_up():
    """lr_schedule: cosine follows transformers' cosine_with_min_lr (what OpenRLHF schedules with) from the end of
    the warm-up to the last step, where it reaches min_lr_ratio; 16 steps of 2 epochs are 32 optimizer steps."""
    transformers = pytest.importorskip("transformers")
    config = EngineConfig(lr=1e-6, warmup_steps=1, lr_schedule="cosine", steps=16, ppo_epochs=2)
    p = torch.nn.Parameter(torch.zeros(3))
    opt = make_optimizer([p], config)
    ref = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.lr)
    sched = transformers.get_scheduler(
        "cosine_with_min_lr",
        ref,
        num_warmup_steps=1,
        num_training_steps=32,
        scheduler_specific_kwargs={"min_lr_rate": 0.1},
    )
    ours, theirs = [], []
    for _ in range(32):
        ours.append(opt.lr)
        theirs.append(ref.param_groups[0]["lr"])
        p.grad = torch.ones(3)
        opt.step()
        sched.step()
    assert theirs[0] == 0.0 and ours[0] == pytest.approx(1e-6)  # its warm-up starts at 0, ours at lr / warmup_steps
    assert ours[1:] == pytest.approx(theirs[1:], rel=1e-9)
    assert ours[-1] == pytest.approx(1e-7, rel=0.03) and opt.lr == pytest.approx(1e-7)  # min_lr_ratio at the end


def test_token_mean_weighs_every_token_of_the_batch_the_same():
    """Two micro-batches of one sequence each: 3 tokens of value 1 and 1 token of value 5. token_mean over the
    batch's 4 tokens is (3 + 5) / 4 = 2 in total; grpo averages each sequence first: (1 + 5) / 2 = 3."""
    values = [torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([[5.0, 0.0, 0.0]])]
    masks = [torch.tensor([[True, True, True]]), torch.tensor([[True, False, False]])]
    token = sum(float(aggregate(v, m, "token_mean", 3, 2, tokens_total=4.0)) for v, m in zip(values, masks))
    grpo = sum(float(aggregate(v, m, "grpo", 3, 2)) for v, m in zip(values, masks))
    assert token == pytest.approx(2.0) and grpo == pytest.approx(3.0)
