"""OpenRLHF 0.10.x: step lines, absent keys, the reward wrapper's zero-std groups and the eval plan."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

from autorl.backends.base import TrialSpec
from autorl.backends.openrlhf.backend import REWARD_WRAPPER, OpenRLHFBackend
from autorl.backends.openrlhf.metrics import OpenRLHFMetricsReader, parse_step_line
from autorl.judge.abort import unavailable
from autorl.recipe import load_recipe

LINE = (
    "(PPOTrainer pid=4242) [INFO] ✨ Global step 2: {'actor_lr': 0.0001, 'kl': 0.0, 'ppo_clip_ratio': 0.0, "
    "'group_reward_std': 0.0, 'reward': 0.25, 'ppo_kl': 1e-05, 'correctness': 0.25, 'truncated': 0.5, "
    "'actor_grad_norm': 1.5, 'response_length': 4.0, 'timing/generation': 2.0, 'timing/ppo_train': 1.0, "
    "'timing/step_total': 4.0, 'rollout/num_samples': 32, 'zero_std_group': 0.75}"
)


def test_step_line_parses_through_ray_prefix():
    step, values = parse_step_line(LINE)
    assert step == 2 and values["reward"] == 0.25 and values["timing/generation"] == 2.0
    assert parse_step_line("(PPOTrainer pid=1) Global step 3: {broken") is None


def test_stdout_reader_maps_keys_and_declares_absent(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("noise\n" + LINE + "\n")
    recs = OpenRLHFMetricsReader(None, None, stdout_path=log).poll()
    assert len(recs) == 1
    rec = recs[0]
    assert rec["reward_mean"] == 0.25 and rec["grad_norm"] == 1.5 and rec["truncated_rate"] == 0.5
    assert rec["time_generate_s"] == 2.0 and rec["time_update_s"] == 1.0 and rec["frac_zero_std_groups"] == 0.75
    assert rec["tokens_per_s"] == pytest.approx(32 * 4.0 / 4.0)
    assert "time_reward_s" in rec["absent"] and "reward_mean" not in rec["absent"]


def test_absent_key_makes_rule_not_available():
    steps = [{"step": 1, "reward_mean": 0.0, "absent": ["frac_zero_std_groups"]}]
    assert unavailable(steps) == [
        "zero_std_groups: not available (frac_zero_std_groups absent from this backend's metrics)"
    ]
    assert unavailable([{"step": 1, "frac_zero_std_groups": 1.0}]) == []


def _wrapper(monkeypatch, group: int):
    monkeypatch.setenv("AUTORL_GROUP_SIZE", str(group))
    monkeypatch.setenv("AUTORL_REWARD", "builtin:exact_match")
    spec = importlib.util.spec_from_file_location("wrapper_under_test", REWARD_WRAPPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reward_wrapper_counts_zero_std_groups(monkeypatch):
    fn = _wrapper(monkeypatch, 2)
    flags = []
    for query, prompt in (
        ("<bos>1+1=2<eos>", "1+1="),
        ("<bos>1+1=3<eos>", "1+1="),
        ("<bos>2+2=5<eos>", "2+2="),
        ("<bos>2+2=5<eos>", "2+2="),
    ):
        out = fn.reward_func([query], [prompt], ["2" if prompt == "1+1=" else "4"])
        flags.append(float(out["extra_logs"]["zero_std_group"][0]))
    assert flags == [0.0, 0.0, 0.0, 2.0]  # group 1 mixed, group 2 all wrong: mean 0.5 = half the groups


def test_the_documented_reward_function_runs_through_the_wrapper(tmp_path, monkeypatch):
    """docs/openrlhf.md's example of OpenRLHF's reward_func(queries, prompts, labels), given as the recipe's reward
    file, called as OpenRLHF 0.10.4 calls it (lists of one; the query is prompt + reply as one decoded text)."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "openrlhf.md").read_text()
    blocks = [
        b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "def reward_func(queries, prompts, labels)" in b
    ]
    assert len(blocks) == 1
    user = tmp_path / "my_reward.py"
    user.write_text(blocks[0])
    monkeypatch.setenv("AUTORL_GROUP_SIZE", "2")
    monkeypatch.setenv("AUTORL_REWARD", str(user))
    spec = importlib.util.spec_from_file_location("wrapper_with_user_reward", REWARD_WRAPPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    right = module.reward_func(["<|user|>7+5=<|assistant|>12<|end|>"], ["<|user|>7+5=<|assistant|>"], ["12"])
    wrong = module.reward_func(["<|user|>7+5=<|assistant|>13<|end|>"], ["<|user|>7+5=<|assistant|>"], ["12"])
    assert float(right["rewards"][0]) == 1.0 and float(wrong["rewards"][0]) == 0.0
    assert float(right["extra_logs"]["label_in_reply"][0]) == 1.0 and "scores" in right
    assert float(right["extra_logs"]["zero_std_group"][0]) == 0.0
    assert float(wrong["extra_logs"]["zero_std_group"][0]) == 0.0  # the group 1, 0 has a spread


def test_eval_plan_runs_the_shared_evaluator(tmp_path):
    recipe = load_recipe(Path("autorl/data/recipes/openrlhf-tiny.yaml"))
    recipe = recipe.with_train(openrlhf_version="0.10.4")
    spec = TrialSpec(
        attempt="attempt-01-x", recipe=recipe, worktree=tmp_path, run_dir=tmp_path / "run", cache_dir=tmp_path / "cache"
    )
    backend = OpenRLHFBackend()
    train, ev = backend.plan(spec), backend.eval_plan(spec)
    out_dir = train.argv[train.argv.index("--ckpt.output_dir") + 1]
    assert ev.argv[1:3] == ["-m", "autorl.evaluate"]
    assert ev.argv[ev.argv.index("--model") + 1] == out_dir
    assert ev.argv[ev.argv.index("--k") + 1] == "4" and ev.argv[ev.argv.index("--step") + 1] == "4"
    assert train.argv[train.argv.index("--reward.remote_url") + 1] == str(REWARD_WRAPPER)
    # the probe prompts are encoded as OpenRLHF's rollouts encode them: no special tokens, no chat template here
    assert "--no-special-tokens" in ev.argv and "--chat-template" not in ev.argv
    chat = OpenRLHFBackend().eval_plan(spec.model_copy(update={"recipe": recipe.with_train(apply_chat_template=True)}))
    assert "--chat-template" in chat.argv


def test_planned_steps_of_a_capped_pool():
    from autorl.backends.base import planned_steps
    from autorl.data import shipped

    recipe = load_recipe(shipped("recipes/openrlhf-tiny.yaml"))
    assert planned_steps(recipe) == 4  # 32 prompts / 8 per rollout batch x 1 episode: what the real run logged
    uncapped = recipe.model_copy(update={"train": {**recipe.train, "max_samples": None}})
    assert planned_steps(uncapped) == 0


@pytest.mark.slow
def test_prepare_starts_the_study_head_and_evaluator_outside_any_trial(tmp_path, monkeypatch):
    """The Ray head and the evaluator's imports are the study's, not the first trial's: prepare starts both, the
    trials' jobs share the machine's compile caches, and close stops the head."""
    from autorl.backends import forked
    from autorl.backends.ray_jobs import PROBE_PREFIX, client

    monkeypatch.setattr(forked, "_SERVERS", {})
    for var in ("TORCH_EXTENSIONS_DIR", "VLLM_CACHE_ROOT", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))  # a variable the user set is kept
    monkeypatch.setenv("AUTORL_COMPILE_CACHE", str(tmp_path / "machine"))
    recipe = load_recipe(Path("autorl/data/recipes/openrlhf-small.yaml")).with_train(
        openrlhf_version="0.10.4", vllm_in_process=True
    )
    backend = OpenRLHFBackend()
    try:
        assert backend.prepare(recipe, tmp_path / "cache", tmp_path / "prepare") is None
        address = backend.address(None)
        listed = [j.submission_id for j in client(address).list_jobs()]
        assert len(listed) == 1 and listed[0].startswith(PROBE_PREFIX)  # only the probe the fresh head took
        assert [k[1] for k in forked._SERVERS] == [forked.EVALUATE]
        spec = TrialSpec(
            attempt="attempt-01-x",
            recipe=recipe,
            worktree=tmp_path,
            run_dir=tmp_path / "run",
            cache_dir=tmp_path / "cache",
        )
        env = backend.plan(spec).env
        shared = Path(env["TORCH_EXTENSIONS_DIR"])  # this machine's, not the workspace's: the next study finds it warm
        assert shared.name == "torch_extensions" and shared.parent.parent == tmp_path / "machine"
        assert env["VLLM_CACHE_ROOT"] == str(shared.parent / "vllm") and "TRITON_CACHE_DIR" not in env
        assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        ev = backend.eval_plan(spec)
        server = forked.server_for(ev.argv[0], forked.EVALUATE, {**os.environ, "PYTHONUNBUFFERED": "1", **ev.env})
        assert server is next(iter(forked._SERVERS.values()))  # the evaluations will fork from the warm server
    finally:
        backend.close()
        for server in forked._SERVERS.values():
            server.close()
    assert backend._head._head is None  # the backend's PrivateHead stopped its local head


def test_hf_checkpoints_a_full_run_evaluates_land_in_the_run_folder(tmp_path):
    """With `save_hf_ckpt` (a recipe's full block) OpenRLHF 0.10 writes `<ckpt.path>/global_step<N>_hf` every
    save_steps; the path is the run folder's (the job runs in an upload, where a relative one would be lost), and
    the full run's checkpoint evaluator retargets the trial's own eval plan at each one."""
    from autorl.promote.ckpt_evals import retarget, saved

    recipe = load_recipe(Path("autorl/data/recipes/openrlhf-tiny.yaml")).with_train(openrlhf_version="0.10.4")
    spec = TrialSpec(
        attempt="attempt-05-full-x",
        recipe=recipe.with_train(save_steps=2, save_hf_ckpt=True, disable_ds_ckpt=True),
        worktree=tmp_path,
        run_dir=tmp_path / "run",
        cache_dir=tmp_path / "cache",
    )
    backend = OpenRLHFBackend()
    argv = backend.plan(spec).argv
    ckpt = str((tmp_path / "run" / "ckpt").resolve())
    assert argv[argv.index("--ckpt.path") + 1] == ckpt and argv[argv.index("--ckpt.save_steps") + 1] == "2"
    assert "--ckpt.save_hf" in argv and "--ckpt.disable_ds" in argv
    assert backend.checkpoint_glob(spec) == ckpt + "/global_step*_hf"
    for step in (4, 2):
        (Path(ckpt) / f"global_step{step}_hf").mkdir(parents=True)
    (Path(ckpt) / "_actor").mkdir()  # DeepSpeed's own folder is no HF checkpoint
    found = saved(backend.checkpoint_glob(spec))
    assert [(s, p.name) for s, p in found] == [(2, "global_step2_hf"), (4, "global_step4_hf")]
    ev = retarget(backend.eval_plan(spec), found[0][1], 2, tmp_path / "e.jsonl", tmp_path / "e.log")
    assert ev.argv[ev.argv.index("--model") + 1] == str(found[0][1]) and ev.argv[ev.argv.index("--step") + 1] == "2"
    assert ev.metrics_path == str(tmp_path / "e.jsonl")
    assert OpenRLHFBackend().checkpoint_glob(spec.model_copy(update={"recipe": recipe})) is None  # none saved
