"""Preflight checks: step count, LR at step 20, disk, patches, GPUs; each passing and failing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest_openrlhf import site_093, wheel_dir  # noqa: F401

from autorl.backends.openrlhf.backend import OpenRLHFParams
from autorl.backends.openrlhf.patches import apply
from autorl.backends.openrlhf.preflight import (
    check_disk,
    check_gpus,
    check_patches,
    check_schedule,
    lr_at,
    preflight,
    total_steps,
)
from autorl.recipe import validate_recipe

ROOT = Path(__file__).resolve().parents[3]


def _params(**kw) -> OpenRLHFParams:
    base = dict(
        pretrain="m",
        prompt_data="data/pool.jsonl",
        gens=8,
        train_batch_size=16,
        num_episodes=1,
        lr=5e-7,
        lr_warmup_ratio=0.05,
    )
    return OpenRLHFParams(**{**base, **kw})


def _pool(tmp_path: Path, n: int) -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data/pool.jsonl").write_text("".join('{"input": "q", "label": "1"}\n' for _ in range(n)))
    return tmp_path


def test_total_steps_matches_seed_formula():
    assert total_steps(400, 8, 16, 1) == 200
    assert total_steps(50000, 8, 16, 20) == 500000


def test_lr_schedule_shape():
    assert lr_at(0, 200, 1.0, 0.05) == 0.0
    assert lr_at(5, 200, 1.0, 0.05) == pytest.approx(0.5)
    assert lr_at(10, 200, 1.0, 0.05) == pytest.approx(1.0)
    assert lr_at(200, 200, 1.0, 0.05) == pytest.approx(0.1)


def test_schedule_passes_on_a_short_pool(tmp_path):
    steps, lr = check_schedule(_params(), _pool(tmp_path, 400))
    assert steps.ok and "= 200 steps" in steps.detail and "400 lines" in steps.detail
    assert lr.ok and "100% of target" in lr.detail  # warm-up done at step 10: the target is reached


def test_schedule_fails_on_a_long_pool(tmp_path):
    _, lr = check_schedule(_params(pool_size=50000, prompt_data="hub/name", num_episodes=20), tmp_path)
    assert lr.ok is False and "warmup 25000 of 500000" in lr.detail and "lr_warmup_ratio" in lr.detail


def test_a_short_run_whose_cosine_has_come_down_by_step_20_passes(tmp_path):
    """Seen on a GPU study: gens 14 made 512 x 14 // 256 = 28 steps, whose LR at step 20 is 28 % of its target
    after a one-step warm-up; the trial trains at its LR from step 1, so it is not the starved warm-up the check
    is for (it was refused as a config error, a crash the search caused itself)."""
    params = _params(gens=14, train_batch_size=256, max_samples=512, lr=8.64e-6, lr_warmup_ratio=0.03)
    steps, lr = check_schedule(params, _pool(tmp_path, 1047))
    assert "= 28 steps" in steps.detail
    assert lr_at(20, 28, 1.0, 0.03) < 0.30  # what the check used to read
    assert lr.ok and "by step 20" in lr.detail and "100% of target" in lr.detail


def test_a_warm_up_longer_than_20_steps_still_fails_however_long_the_run(tmp_path):
    """The starved warm-up itself: 20 % of 200 steps is 40 steps of warm-up, so step 20 is at half the target
    (passes), and 50 % of 200 steps puts step 20 at a fifth of it (fails)."""
    _, half = check_schedule(_params(lr_warmup_ratio=0.2), _pool(tmp_path, 400))
    _, fifth = check_schedule(_params(lr_warmup_ratio=0.5), _pool(tmp_path, 400))
    assert half.ok and "50% of target" in half.detail
    assert fifth.ok is False and "20% of target" in fifth.detail and "warmup 100 of 200" in fifth.detail


def test_max_samples_caps_the_pool(tmp_path):
    steps, _ = check_schedule(_params(max_samples=100), _pool(tmp_path, 400))
    assert "= 50 steps" in steps.detail and "capped by max_samples=100" in steps.detail


def test_unknown_pool_is_not_checked(tmp_path):
    steps, lr = check_schedule(_params(prompt_data="hub/name"), tmp_path)
    assert steps.ok is None and lr.ok is None


def test_disk(tmp_path):
    free_gb = shutil.disk_usage(tmp_path).free / 1024**3
    ok = check_disk(_params(save_path="out", ckpt_path="ck/deep", lora_rank=8), tmp_path)
    assert [c.ok for c in ok] == [True, True] and "3 x 0.10 GB" in ok[1].detail
    big = check_disk(_params(ckpt_path="ck", checkpoint_gb=free_gb * 2, max_ckpt_num=2), tmp_path)
    assert big[0].ok is False and "GB free" in big[0].detail
    assert check_disk(_params(ckpt_path="ck", pretrain="hub/model"), tmp_path)[0].ok is None


def test_patches_check(site_093, tmp_path):
    site = tmp_path / "site"
    shutil.copytree(site_093 / "openrlhf", site / "openrlhf")
    before = check_patches(ROOT / "patches", site)
    assert before.ok is False and "0/" in before.detail
    apply(ROOT / "patches", site)
    assert check_patches(ROOT / "patches", site).ok is True
    assert check_patches(ROOT / "patches", None).ok is None


def test_gpus():
    params = _params(actor_num_gpus_per_node=4, vllm_num_engines=2, vllm_tensor_parallel_size=2, kl_coef=0.0)
    assert check_gpus(params, 8).ok and "need 8" in check_gpus(params, 8).detail
    assert check_gpus(params, 0).ok is False


def test_preflight_on_a_recipe(tmp_path):
    recipe = validate_recipe({"backend": "openrlhf", "train": {"pretrain": "m", "prompt_data": "data/pool.jsonl"}})
    checks = {c.name: c for c in preflight(recipe, worktree=_pool(tmp_path, 64), site_packages=None, visible=0)}
    assert set(checks) == {"steps", "lr_at_step_20", "patches", "gpus", "files"}
    assert checks["steps"].ok and checks["patches"].ok is None and checks["gpus"].ok is False
    assert checks["files"].ok and checks["files"].detail == "data/pool.jsonl found"


def test_files_the_recipe_names_must_exist(tmp_path):
    from autorl.backends.openrlhf.preflight import check_files

    params = _params(prompt_data="data/pool.jsonl", eval_dataset="data/probe.jsonl", reward_func="reward_em.py")
    miss = check_files(params, _pool(tmp_path, 8))
    assert miss.ok is False
    assert (
        "eval_dataset: data/probe.jsonl; reward_func: reward_em.py" in miss.detail and "prompt_data" not in miss.detail
    )
    hub = check_files(_params(prompt_data="openai/gsm8k", reward_func="builtin:exact_match"), tmp_path)
    assert hub.ok is None


def test_the_shipped_gpt_oss_recipes_say_which_files_are_yours(tmp_path):
    from autorl.data import shipped
    from autorl.recipe import load_recipe

    for name in ("gpt-oss-20b.yaml", "gpt-oss-120b.yaml"):
        path = shipped("recipes", name)
        checks = {c.name: c for c in preflight(load_recipe(path), worktree=tmp_path, site_packages=None, visible=8)}
        assert checks["files"].ok is False and "data/sft_rl_pool_400.jsonl" in checks["files"].detail
        assert "you provide" in path.read_text()


def test_a_run_shorter_than_twenty_steps_is_judged_on_its_mean_lr(tmp_path):
    # 32 prompts x 4 samples // 32 = 4 steps, one of warmup: LR 0, 1, 0.775, 0.325 of target -> mean 52 %
    _, lr = check_schedule(_params(gens=4, train_batch_size=32, lr_warmup_ratio=0.03), _pool(tmp_path, 32))
    assert lr.ok and "mean over all 4 steps" in lr.detail and "52% of target" in lr.detail
    _, longer = check_schedule(_params(gens=4, train_batch_size=4, lr_warmup_ratio=0.03), _pool(tmp_path, 32))
    assert "by step 20" in longer.detail  # 32 steps: the seed's check of the first 20


def test_colocated_models_share_their_gpus():
    apart = _params(vllm_num_engines=1, kl_coef=0.0)
    together = apart.model_copy(update={"colocate_all": True})
    assert check_gpus(apart, 1).ok is False and "need 2" in check_gpus(apart, 1).detail
    assert check_gpus(together, 1).ok and "need 1" in check_gpus(together, 1).detail
    with_ref = _params(actor_num_gpus_per_node=2, vllm_num_engines=4, kl_coef=0.01, colocate_all=True)
    assert with_ref.gpus_needed() == 4
