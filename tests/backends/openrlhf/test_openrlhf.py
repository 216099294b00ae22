"""OpenRLHF backend: autorl's argv against the real train_ppo_ray flag definitions of 0.9.3 and 0.11.2."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest_openrlhf import NEW_VERSION, OLD_VERSION, parser_from_source, site_093, site_new, wheel_dir  # noqa: F401

from autorl.backends.base import TrialSpec
from autorl.backends.openrlhf.backend import NOT_FLAGS, OpenRLHFBackend, OpenRLHFParams, build_argv
from autorl.backends.openrlhf.flags import FLAG_BY_FIELD, FLAGS, flag_for, is_dotted
from autorl.errors import RecipeError
from autorl.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[3]
CLI = "openrlhf/cli/train_ppo_ray.py"


def _parse(site: Path, argv: list[str]):
    assert argv[1:3] == ["-m", "openrlhf.cli.train_ppo_ray"]
    return parser_from_source(site / CLI).parse_args(argv[3:])


@pytest.fixture(scope="module")
def patched_093(site_093, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("patched") / "site"
    shutil.copytree(site_093 / "openrlhf", site / "openrlhf")
    subprocess.run(
        ["patch", "-p1", "-d", str(site), "-i", str(ROOT / "patches/offload_cli.patch")],
        check=True,
        capture_output=True,
    )
    return site


def _recipe_params(name: str, **changes) -> OpenRLHFParams:
    train = load_recipe(ROOT / f"recipes/{name}.yaml").train
    return OpenRLHFParams.model_validate({**train, **changes})


def test_20b_recipe_parses_with_093(site_093):
    params = _recipe_params("gpt-oss-20b-openrlhf-0.9.3")
    ns = _parse(site_093, build_argv(params, "attempt-01-x", "/tb"))
    assert ns.actor_learning_rate == pytest.approx(5e-7)
    assert ns.eps_clip == pytest.approx(0.1) and ns.init_kl_coef == pytest.approx(0.001)
    assert ns.n_samples_per_prompt == 8 and ns.advantage_estimator == "dr_grpo"
    assert ns.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert ns.vllm_num_engines == 2 and ns.vllm_tensor_parallel_size == 2 and ns.zero_stage == 3
    assert ns.generate_max_len == 4096 and ns.remote_rm_url == "reward_func_em.py"
    assert ns.use_tensorboard == "/tb" and ns.wandb_run_name == "attempt-01-x"
    assert ns.colocate_actor_ref and ns.ref_num_gpus_per_node == 4 and ns.disable_ds_ckpt


def test_120b_offload_needs_the_patched_cli(site_093, patched_093):
    argv = build_argv(_recipe_params("gpt-oss-120b-openrlhf-0.9.3"), "a", "/tb")
    with pytest.raises(argparse_error()):
        _parse(site_093, argv)
    ns = _parse(patched_093, argv)
    assert ns.offload and ns.adam_offload and ns.gradient_checkpointing_use_reentrant


def argparse_error():
    import argparse

    return (argparse.ArgumentError, SystemExit)


def test_newest_release_gets_dotted_flags(site_new):
    params = _recipe_params(
        "gpt-oss-20b",
        openrlhf_version=NEW_VERSION,
        prompt_max_len=None,
        generate_max_len=None,
        max_len=5120,
        max_new_tokens=4096,
        extra_args=["--vllm.enforce_eager"],
    )
    ns = vars(_parse(site_new, build_argv(params, "run", "/tb")))
    assert ns["actor.adam.lr"] == pytest.approx(5e-7) and ns["actor.eps_clip"] == pytest.approx(0.1)
    assert ns["algo.kl.init_coef"] == pytest.approx(0.001) and ns["rollout.n_samples_per_prompt"] == 8
    assert ns["rollout.max_new_tokens"] == 4096 and ns["data.max_len"] == 5120
    assert ns["ds.lora.target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert ns["logger.tensorboard_dir"] == "/tb" and ns["vllm.enforce_eager"]


@pytest.mark.parametrize("site_name,version", [("patched_093", OLD_VERSION), ("site_new", NEW_VERSION)])
def test_every_table_flag_exists_in_the_real_cli(request, site_name, version):
    known = {o for a in parser_from_source(request.getfixturevalue(site_name) / CLI)._actions for o in a.option_strings}
    for rule in FLAGS:
        try:
            flag = flag_for(rule.field, version)
        except RecipeError:
            continue
        assert flag in known, f"{rule.field} -> {flag} is not a flag of openrlhf {version}"


def test_every_param_has_a_flag_or_is_autorl_only():
    assert set(OpenRLHFParams.model_fields) - NOT_FLAGS <= set(FLAG_BY_FIELD)


@pytest.mark.parametrize(
    "field,value,version",
    [
        ("prompt_max_len", 1024, "0.9.8"),
        ("generate_max_len", 2048, NEW_VERSION),
        ("max_new_tokens", 2048, OLD_VERSION),
        ("offload", True, "0.10.2"),
    ],
)
def test_unsupported_field_names_field_and_version(field, value, version):
    changes = {"prompt_max_len": None, "generate_max_len": None, "openrlhf_version": version, field: value}
    params = _recipe_params("gpt-oss-20b-openrlhf-0.9.3", **changes)
    with pytest.raises(RecipeError, match=rf"train\.{field} .*openrlhf {version}"):
        build_argv(params, "r", "/tb")


def test_dialect_boundary():
    assert not is_dotted("0.10.1.post2") and is_dotted("0.10.2") and is_dotted("0.11.2")
    with pytest.raises(RecipeError):
        is_dotted("latest")


def test_missing_version_is_a_recipe_error_without_openrlhf():
    params = _recipe_params("gpt-oss-20b-openrlhf-0.9.3", openrlhf_version=None)
    with pytest.raises(RecipeError, match="openrlhf_version"):
        build_argv(params, "r", "/tb")


def test_eval_dataset_without_reward_is_rejected():
    with pytest.raises(ValueError, match="reward_func"):
        OpenRLHFParams(pretrain="m", prompt_data="p.jsonl", eval_dataset="e.jsonl")


def test_plan(tmp_path):
    recipe = load_recipe(ROOT / "recipes/gpt-oss-20b-openrlhf-0.9.3.yaml")
    spec = TrialSpec(
        attempt="attempt-03-lr",
        recipe=recipe,
        worktree=tmp_path / "wt",
        run_dir=tmp_path / "run",
        cache_dir=tmp_path / "cache",
        seed=7,
    )
    plan = OpenRLHFBackend(ray_address="http://10.0.0.1:8265").plan(spec)
    assert plan.argv[:3] == ["python", "-m", "openrlhf.cli.train_ppo_ray"]
    assert plan.argv[plan.argv.index("--seed") + 1] == "7"
    assert plan.cwd == str(tmp_path / "wt") and plan.metrics_format == "openrlhf"
    assert plan.env["METRICS_LOG_DIR"] == str((tmp_path / "run" / "metrics").resolve())
    assert plan.metrics_path.endswith("metrics/training_metrics.jsonl")
    assert plan.env["AUTORL_TENSORBOARD_DIR"].endswith("tensorboard/attempt-03-lr")
    assert plan.metric_map == {"eval_default_pass1": "eval/ood/greedy_pass@1"}
    assert plan.ray_address == "http://10.0.0.1:8265" and not (tmp_path / "run").exists()


def test_gpus_needed_counts_reference_only_when_separate():
    base = dict(
        pretrain="m", prompt_data="p", actor_num_gpus_per_node=4, vllm_num_engines=2, vllm_tensor_parallel_size=2
    )
    assert OpenRLHFParams(**base, kl_coef=0.0).gpus_needed() == 8
    assert OpenRLHFParams(**base, kl_coef=0.01).gpus_needed() == 12
    assert OpenRLHFParams(**base, kl_coef=0.01, colocate_actor_ref=True).gpus_needed() == 8
