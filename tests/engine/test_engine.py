"""The engine's command line: config errors, the metrics file, NaN handling, custom rewards, JSONL + HF models.

The base model cache is shared by every engine test in the session (see ``engine_cache``): the
supervised warm-up runs once (about 5-9 s on two cores) and each CLI run below then takes a few seconds.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autorl.engine.config import EngineConfig
from autorl.metrics import STEP_KEYS, RunMetrics, iter_records

ROOT = Path(__file__).resolve().parents[2]
FAST = {"steps": 3, "batch_prompts": 4, "gens": 4, "eval_every": 2}


def run_cli(tmp_path: Path, config: dict, cache: Path, **env) -> tuple[subprocess.CompletedProcess, Path]:
    cfg, metrics = tmp_path / "cfg.json", tmp_path / "metrics.jsonl"
    cfg.write_text(json.dumps(config))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autorl.engine",
            "--config",
            str(cfg),
            "--metrics-out",
            str(metrics),
            "--cache-dir",
            str(cache),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )
    return proc, metrics


@pytest.mark.parametrize(
    "config,fragment",
    [
        ({"lr": -1}, "config: lr"),
        ({"learning_rate": 1e-4}, "unknown key 'learning_rate'"),
        ({"gens": 8, "batch_prompts": 3, "micro_batch": 5}, "micro_batch 5 must divide"),
        ({"model": "builtin:huge"}, "unknown built-in model"),
        ({"model": "/no/such/dir"}, "neither builtin"),
        ({"task": "/no/such/task.jsonl"}, "not found"),
        ({"reward": "no_such_module_qq:reward"}, "failed to import"),
    ],
)
def test_bad_config_is_one_line_exit_2(tmp_path, config, fragment):
    proc, metrics = run_cli(tmp_path, config, tmp_path / "cache")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in proc.stderr


def test_unreadable_config_file(tmp_path):
    (tmp_path / "cfg.json").write_text("{not json")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autorl.engine",
            "--config",
            str(tmp_path / "cfg.json"),
            "--metrics-out",
            str(tmp_path / "m.jsonl"),
            "--cache-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr and "Traceback" not in proc.stderr


def test_metrics_file_schema(tmp_path, engine_cache):
    proc, path = run_cli(tmp_path, {**FAST, "eval_k": 2}, engine_cache)
    assert proc.returncode == 0, proc.stderr
    assert "step 3/3 reward" in proc.stdout and "eval step 0" in proc.stdout
    run = RunMetrics(iter_records(path))
    assert [s["step"] for s in run.steps] == [1, 2, 3]
    for rec in run.steps:
        assert set(STEP_KEYS) <= set(rec), set(STEP_KEYS) - set(rec)
        assert all(isinstance(rec[k], (int, float)) and math.isfinite(rec[k]) for k in STEP_KEYS)
    assert [e["step"] for e in run.evals] == [0, 2, 3]
    for ev in run.evals:
        for split in ("id", "ood"):
            items = ev[f"eval/{split}/items"]
            assert len(items) == 500 and set(items) <= {0, 1}
            assert ev[f"eval/{split}/greedy_pass@1"] == pytest.approx(sum(items) / 500)
            assert 0 <= ev[f"eval/{split}/sampling_pass@2"] <= 1
    assert run.summary["status"] == "ok" and run.summary["steps_done"] == 3 and run.summary["wall_s"] > 0
    assert run.evals[0]["eval/id/greedy_pass@1"] >= EngineConfig().sft_target  # the warmed-up base


def test_every_line_is_flushed_json(tmp_path, engine_cache):
    proc, path = run_cli(tmp_path, {**FAST, "steps": 1}, engine_cache)
    lines = path.read_text().splitlines()
    assert proc.returncode == 0 and [json.loads(x)["type"] for x in lines] == ["eval", "step", "eval", "summary"]


def test_nan_reward_stops_with_exit_3(tmp_path, engine_cache):
    reward = tmp_path / "nan_reward.py"
    reward.write_text("def reward(completion, label):\n    return float('nan')\n")
    proc, path = run_cli(tmp_path, {**FAST, "reward": str(reward)}, engine_cache)
    assert proc.returncode == 3, proc.stderr
    assert "NaN" in proc.stderr and "Traceback" not in proc.stderr
    run = RunMetrics(iter_records(path))
    assert run.summary["status"] == "nan" and run.summary["steps_done"] == 0 and run.steps == []


def test_huge_lr_diverges_to_exit_3(tmp_path, engine_cache):
    proc, path = run_cli(tmp_path, {**FAST, "lr": 1e30, "steps": 6}, engine_cache)
    assert proc.returncode == 3, proc.stdout[-500:] + proc.stderr
    summary = RunMetrics(iter_records(path)).summary
    # the second optimizer pass of step 1 already sees the diverged weights (ppo_epochs 2)
    assert summary["status"] == "nan" and summary["steps_done"] < 6


def test_custom_reward_drives_training(tmp_path, engine_cache):
    """A reward that pays for short answers: the mean response length falls."""
    reward = tmp_path / "short.py"
    reward.write_text(
        "def reward(completion, label):\n    return {'reward': -len(completion), 'correctness': float(completion == label)}\n"
    )
    proc, path = run_cli(
        tmp_path,
        {"steps": 15, "batch_prompts": 16, "gens": 4, "eval_every": 0, "lr": 3e-3, "reward": str(reward)},
        engine_cache,
    )
    assert proc.returncode == 0, proc.stderr
    m = RunMetrics(iter_records(path))
    lengths = m.series("response_length_mean")
    assert sum(lengths[-3:]) / 3 < sum(lengths[:3]) / 3 - 0.3
    # the evals say what the hack gate needs: the task's own exact match per item beside the reward's judge, and
    # the greedy completions' health, whose length falls with the training's
    first, last = m.evals[0], m.evals[-1]
    for split in ("id", "ood"):
        items = last[f"eval/{split}/task_items"]
        assert len(items) == len(last[f"eval/{split}/items"]) and set(items) <= {0, 1}
        assert last[f"eval/{split}/task_pass@1"] == sum(items) / len(items)
        assert {
            f"eval/{split}/{k}"
            for k in ("length_mean", "repeat_mean", "truncated_rate", "empty_rate", "format_only_rate")
        } <= set(last)
    assert last["eval/id/length_mean"] < first["eval/id/length_mean"]


def test_the_builtin_reward_writes_no_second_task_judgement(tmp_path, engine_cache):
    """With the task's own exact match as the reward, its items are the task metric: no task_items copy."""
    proc, path = run_cli(tmp_path, {**FAST, "eval_size": 50}, engine_cache)
    assert proc.returncode == 0, proc.stderr
    last = RunMetrics(iter_records(path)).evals[-1]
    assert "eval/id/task_items" not in last and "eval/id/length_mean" in last


def test_python_api_returns_summary(tmp_path, engine_cache):
    from autorl.engine.grpo import run

    lines: list[str] = []
    summary = run(EngineConfig(**{**FAST, "steps": 2}), tmp_path / "m.jsonl", engine_cache, log=lines.append)
    assert summary["status"] == "ok" and summary["steps_done"] == 2
    assert any(x.startswith("step 2/2") for x in lines)


@pytest.mark.slow
def test_jsonl_task_with_hf_model(tmp_path):
    """The Hugging Face path: a local Llama dir, a JSONL task, math exact match, left-padded prompts."""
    from autorl.toolkit.hf_tiny import save_llama

    model = save_llama(tmp_path / "llama")
    rows = [{"input": f"{a}+{b}=", "label": str(a + b)} for a, b in [(1, 2), (13, 4), (120, 5), (7, 70)]]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "ood.jsonl").write_text(json.dumps({"input": "999+1=", "label": "1,000"}))
    config = {
        "model": str(model),
        "task": str(tmp_path / "train.jsonl"),
        "eval_ood": str(tmp_path / "ood.jsonl"),
        "steps": 2,
        "batch_prompts": 2,
        "gens": 3,
        "max_new_tokens": 4,
        "eval_every": 1,
        "micro_batch": 2,
    }
    proc, path = run_cli(tmp_path, config, tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = RunMetrics(iter_records(path))
    assert len(run.steps) == 2 and len(run.items("id")) == 4 and len(run.items("ood")) == 1
    assert not list((tmp_path / "cache").glob("base-*.pt"))  # no warm-up for JSONL tasks


def test_best_checkpoint_weights_are_saved_and_load(tmp_path, engine_cache):
    import torch

    from autorl.engine.grpo import run

    config = EngineConfig(**{**FAST, "steps": 4, "save_best": "eval/ood/greedy_pass@1", "eval_max_new_tokens": 6})
    summary = run(config, tmp_path / "m.jsonl", engine_cache, log=lambda _: None)
    best = summary["best_checkpoint"]
    evals = RunMetrics(iter_records(tmp_path / "m.jsonl")).evals
    values = [e["eval/ood/greedy_pass@1"] for e in evals]
    assert best["value"] == max(values) and best["step"] == evals[values.index(max(values))]["step"]
    state = torch.load(best["path"])
    assert Path(best["path"]) == tmp_path / "best.pt" and all(torch.is_tensor(v) for v in state.values())
    assert not (tmp_path / "best.tmp").exists() and not (tmp_path / "last.tmp").exists()
    last = summary["last_checkpoint"]  # the last eval's weights: best.pt when it is the best, else last.pt
    assert last["step"] == evals[-1]["step"] == 4 and last["value"] == values[-1]
    assert Path(last["path"]) == tmp_path / ("best.pt" if last["step"] == best["step"] else "last.pt")
    assert (tmp_path / "last.pt").exists() == (last["step"] != best["step"])
    assert torch.load(last["path"]).keys() == state.keys()
    kept = json.loads((tmp_path / "kept.json").read_text())  # the same marks beside the weights, for a killed run
    assert kept == {"best_checkpoint": best, "last_checkpoint": last}


def test_the_last_evals_weights_are_saved_apart_when_an_earlier_eval_was_best(tmp_path):
    """keep_weights on its own, with evals that fall: best.pt keeps the best eval's weights, last.pt the last's, and
    a later new best takes last.pt's place (one save an eval)."""
    import torch

    from autorl.engine.grpo import keep_weights

    class Policy:
        def __init__(self):
            self.module = torch.nn.Linear(2, 1)

    config = EngineConfig(**{**FAST, "save_best": "eval/id/greedy_pass@1"})
    state: dict = {"best_path": tmp_path / "best.pt", "policy": Policy()}
    for step, value in ((0, 0.5), (8, 0.4)):
        keep_weights(state, config, {"step": step, "eval/id/greedy_pass@1": value})
    assert state["best_checkpoint"]["step"] == 0 and state["last_checkpoint"]["step"] == 8
    assert Path(state["last_checkpoint"]["path"]).name == "last.pt" and (tmp_path / "last.pt").exists()
    state["policy"].module.weight.data.fill_(3.0)
    keep_weights(state, config, {"step": 16, "eval/id/greedy_pass@1": 0.7})
    assert state["best_checkpoint"] == state["last_checkpoint"] and not (tmp_path / "last.pt").exists()
    assert torch.load(tmp_path / "best.pt")["weight"].eq(3.0).all()
    keep_weights(state, config, {"step": 24})  # an eval without the metric saves nothing
    assert state["last_checkpoint"]["step"] == 16


def test_a_trial_never_imports_torch_dynamo(tmp_path, engine_cache):
    """torch.optim.Optimizer imports torch._dynamo when one is built: about a second of every trial's start-up on a
    CPU, which no early stop can save. A trial (config, model, optimizer, steps, evals) must not load it."""
    cfg, metrics = tmp_path / "cfg.json", tmp_path / "metrics.jsonl"
    cfg.write_text(json.dumps({**FAST, "steps": 2, "kl_coef": 0.05, "warmup_steps": 2}))
    code = (
        "import sys; from autorl.engine.__main__ import main; "
        f"rc = main(['--config', {str(cfg)!r}, '--metrics-out', {str(metrics)!r}, '--cache-dir', {str(engine_cache)!r}]); "
        "print('dynamo loaded:', 'torch._dynamo' in sys.modules); sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "step 2/2 reward" in proc.stdout
    assert "dynamo loaded: False" in proc.stdout, proc.stdout[-300:]
