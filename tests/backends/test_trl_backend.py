"""The TRL backend: the GRPOConfig mapping, the runner's pieces, and one short real run."""

from __future__ import annotations

import inspect
import json
import math
import time

import pytest

from autorl.backends.base import TrialSpec, get_backend
from autorl.backends.trl import TRL_FIELDS, TRLParams, grpo_config_kwargs
from autorl.backends.trl_runner import make_reward_func, nonfinite_key, step_record
from autorl.engine.config import EngineConfig, GRPOParams
from autorl.errors import RecipeError
from autorl.metrics import STEP_KEYS, RunMetrics
from autorl.recipe import load_recipe, validate_recipe

TRL_STEP_LOG = {
    "loss": 0.01,
    "grad_norm": 2.5,
    "learning_rate": 1e-4,
    "reward": 0.25,
    "reward_std": 0.43,
    "frac_reward_zero_std": 0.3125,
    "completions/clipped_ratio": 0.0078,
    "completions/mean_length": 3.5,
    "entropy": 0.56,
    "kl": 0.002,
    "clip_ratio/region_mean": 0.0,
    "step_time": 0.2,
    "epoch": 0.01,
}


def test_params_map_exactly_onto_a_real_grpo_config(tmp_path):
    from trl import GRPOConfig

    params = TRLParams(
        lr=3e-5,
        eps_clip=0.15,
        eps_clip_high=0.28,
        kl_coef=0.04,
        gens=4,
        batch_prompts=6,
        steps=17,
        ppo_epochs=2,
        max_new_tokens=7,
        temperature=0.9,
        loss_type="dr_grpo",
        scale_rewards=False,
        max_grad_norm=0.5,
        warmup_steps=3,
        seed=11,
    )
    cfg = GRPOConfig(**grpo_config_kwargs(params, str(tmp_path / "out"), use_cpu=True))
    for key, field in TRL_FIELDS.items():
        assert getattr(cfg, field) == getattr(params, key), field
    assert cfg.per_device_train_batch_size == 24 and cfg.generation_batch_size == 24
    assert cfg.scale_rewards == "none" and cfg.data_seed == 11
    assert cfg.use_cpu and not cfg.bf16 and not cfg.fp16 and not cfg.gradient_checkpointing
    assert cfg.lr_scheduler_type == "constant_with_warmup" and cfg.logging_steps == 1
    assert cfg.report_to == [] and cfg.save_strategy == "no" and cfg.adam_beta2 == 0.99


@pytest.mark.parametrize("model", [EngineConfig, TRLParams])
def test_shared_keys_are_declared_once(model):
    own = set(inspect.get_annotations(model))
    assert not own & set(GRPOParams.model_fields), "a key of GRPOParams is declared again"
    assert set(GRPOParams.model_fields) < set(model.model_fields)
    assert all(model.model_fields[k].description for k in model.model_fields)


def test_each_backend_keeps_its_own_defaults_and_bounds():
    assert (EngineConfig().ppo_epochs, TRLParams().ppo_epochs) == (2, 1)
    assert (EngineConfig().loss_type, TRLParams().loss_type) == ("grpo", "dapo")
    assert EngineConfig(steps=0).steps == 0
    with pytest.raises(ValueError, match="steps"):
        TRLParams(steps=0)
    with pytest.raises(ValueError, match="kl_estimator"):
        TRLParams(kl_estimator="k1")  # an engine-only key stays unknown to TRL (extra="forbid")


def test_shared_keys_of_an_engine_block_validate_for_trl():
    block = {
        k: v for k, v in EngineConfig(lr=3e-5, gens=4, seed=7).model_dump().items() if k in GRPOParams.model_fields
    }
    assert TRLParams.model_validate(block).model_dump(include=set(block)) == block


@pytest.mark.parametrize("value, expected", [(True, "group"), (False, "none"), ("batch", "batch"), ("group", "group")])
def test_scale_rewards_values(tmp_path, value, expected):
    kwargs = grpo_config_kwargs(TRLParams(scale_rewards=value), str(tmp_path))
    assert kwargs["scale_rewards"] == expected


@pytest.mark.parametrize(
    "train, needle",
    [
        ({"lr": -1}, "train.lr"),
        ({"loss_type": "cispo"}, "train.loss_type"),
        ({"beta": 0.1}, "unknown key 'train.beta'"),
        ({"task": "data.jsonl"}, "only trains on builtin:addition"),
        ({"eval_id": "x.jsonl"}, "eval_id/eval_ood are for JSONL tasks"),
        ({"gens": 1}, "train.gens"),
    ],
)
def test_bad_train_blocks_are_recipe_errors(train, needle):
    with pytest.raises(RecipeError) as info:
        validate_recipe({"backend": "trl", "train": train})
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_step_record_uses_autorl_keys():
    rec = step_record(TRL_STEP_LOG, 7)
    assert rec["type"] == "step" and rec["step"] == 7
    assert rec["reward_mean"] == 0.25 and rec["frac_zero_std_groups"] == 0.3125 and rec["truncated_rate"] == 0.0078
    assert rec["lr"] == 1e-4 and rec["entropy_mean"] == 0.56 and rec["clip_ratio"] == 0.0
    assert "reward" not in rec and "learning_rate" not in rec
    assert nonfinite_key(rec) is None
    assert nonfinite_key(step_record({**TRL_STEP_LOG, "grad_norm": float("inf")}, 8)) == "grad_norm"


def test_reward_function_scores_with_the_engine_and_logs_correctness():
    from autorl.toolkit.reward import load_reward
    from autorl.toolkit.task import CharTokenizer

    chars = CharTokenizer()
    fn = make_reward_func(load_reward("builtin:exact_match", True), chars.eos_id, chars.decode)
    ids = [
        chars.answer_ids("82"),
        chars.answer_ids("81"),
        [chars.index["8"], chars.pad_id, chars.index["2"], chars.eos_id],
        [chars.index["8"], chars.index["2"]],
    ]
    logged = {}
    rewards = fn(
        prompts=["37+45="] * 4,
        completions=["82", "81", "82", "82"],
        completion_ids=ids,
        answer=["82"] * 4,
        log_metric=logged.__setitem__,
        trainer_state=None,
    )
    assert rewards == [1.0, 0.0, 0.0, 1.0]  # a stray <pad> is not dropped; without <eos> the text still decides
    assert logged == {"correctness": 0.5, "degenerate_rate": 0.0}
    assert fn.__name__ == "task_reward"
    empty, repeated = [chars.eos_id], [chars.index["8"]] * 4
    fn(
        prompts=["37+45="] * 2,
        completions=["", "8888"],
        completion_ids=[empty, repeated],
        answer=["82"] * 2,
        log_metric=logged.__setitem__,
        trainer_state=None,
    )
    assert logged["degenerate_rate"] == 1.0  # EOS alone, and one token repeated to the limit


def test_plan_writes_the_validated_config_with_the_seed_override(tmp_path):
    recipe = validate_recipe({"backend": "trl", "train": {"lr": 2e-4, "steps": 3}})
    spec = TrialSpec(
        attempt="attempt-02-trl",
        recipe=recipe,
        worktree=tmp_path,
        run_dir=tmp_path / "run",
        cache_dir=tmp_path / "cache",
        seed=5,
    )
    plan = get_backend("trl").plan(spec)
    config = json.loads((tmp_path / "run" / "trl_config.json").read_text())
    assert config["lr"] == 2e-4 and config["seed"] == 5 and config["steps"] == 3
    assert plan.argv[1:3] == ["-m", "autorl.backends.trl_runner"] and plan.env["HF_HUB_OFFLINE"] == "1"
    assert plan.metrics_path == str(tmp_path / "run" / "metrics.jsonl") and plan.backend == "trl"


def test_a_missing_package_fails_the_preflight_with_how_to_install(tmp_path):
    """trl and transformers are here, so the real backend passes; a module that is not installed anywhere fails
    it before any launch, naming itself and the install command (not a run that logs 'reward 0.000 id nan')."""
    trl = get_backend("trl")
    from pathlib import Path

    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "trl-addition.yaml")
    assert trl.preflight(recipe, tmp_path) == ""
    missing = type(trl)()
    missing.requires = ("trl", "autorl_no_such_module")
    line = missing.preflight(recipe, tmp_path)
    assert (
        line.startswith("the trl backend needs autorl_no_such_module in ")
        and "pip install " in line
        and "autorl[trl]" in line
        and "not from PyPI" in line
    )


def test_trl_addition_recipe_validates():
    from pathlib import Path

    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "trl-addition.yaml")
    assert recipe.backend == "trl" and set(recipe.search) <= set(TRLParams.model_fields)


@pytest.mark.slow
def test_short_real_trl_run_writes_autorl_step_and_eval_lines(tmp_path):
    train = {
        "steps": 4,
        "batch_prompts": 8,
        "gens": 4,
        "kl_coef": 0.04,
        "eval_every": 2,
        "eval_size": 100,
        "sft_target": 0.1,
        "max_new_tokens": 4,
        "threads": 1,
    }
    recipe = validate_recipe({"backend": "trl", "train": train})
    spec = TrialSpec(
        attempt="attempt-03-trl",
        recipe=recipe,
        worktree=tmp_path,
        run_dir=tmp_path / "run",
        cache_dir=tmp_path / "cache",
    )
    backend = get_backend("trl")
    handle = backend.start(backend.plan(spec))
    records, deadline = [], time.time() + 900
    while handle.poll() is None:
        assert time.time() < deadline, "TRL run did not finish"
        records += handle.metrics()
        time.sleep(0.5)
    records += handle.metrics()
    log = (tmp_path / "run" / "train.log").read_text()
    assert handle.poll() == 0, log[-2000:]
    run = RunMetrics(records)
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4]
    expected = {
        "reward_mean",
        "reward_std",
        "correctness",
        "truncated_rate",
        "response_length_mean",
        "grad_norm",
        "kl",
        "clip_ratio",
        "entropy_mean",
        "frac_zero_std_groups",
        "lr",
        "loss",
    }
    assert expected <= set(run.steps[0]) and expected <= set(STEP_KEYS)
    assert all(0.0 <= v <= 1.0 for v in run.series("correctness"))
    assert run.series("lr") == [1e-4] * 4 and all(math.isfinite(v) for v in run.series("loss"))
    assert run.steps[0]["kl"] < 1e-6  # the KL reference is the warmed-up model, not the random init
    assert [r["step"] for r in run.evals] == [0, 2, 4]
    assert all(len(r["eval/id/items"]) == 100 for r in run.evals)
    assert run.series("eval/id/greedy_pass@1")[0] >= 0.1  # the warmed-up base reached sft_target
    assert run.summary["status"] == "ok" and run.summary["steps_done"] == 4
