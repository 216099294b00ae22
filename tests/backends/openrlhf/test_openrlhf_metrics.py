"""OpenRLHF metrics: real TensorBoard event files with OpenRLHF's tag names, plus the patch's JSONL."""

from __future__ import annotations

import json
import re

import pytest
from conftest_openrlhf import site_093, wheel_dir  # noqa: F401

from autorl.backends.openrlhf.metrics import TRAIN_KEYS, OpenRLHFMetricsReader

torch_tb = pytest.importorskip("torch.utils.tensorboard")
EVAL_MAP = {"eval_default_pass1": "eval/ood/greedy_pass@1"}


def _write_step(writer, step: int, reward: float) -> None:
    """What OpenRLHF's TensorboardLogger.log_train writes for one global step (0.9.3, GRPO, no critic)."""
    logs = {
        "policy_loss": -0.1 * step,
        "actor_lr": 1e-6,
        "reward": reward,
        "kl": 0.01,
        "ppo_clip_ratio": 0.05,
        "response_length": 300.0 + step,
        "truncated": 0.25,
        "group_reward_std": 0.4,
        "has_boxed": 0.9,
    }
    for key, value in logs.items():
        writer.add_scalar(f"train/{key}", value, step)
    writer.add_text("train/generated_samples", "sample | 1.0", step)
    writer.flush()


def test_openrlhf_source_uses_these_tags_and_keys(site_093):
    logger = (site_093 / "openrlhf/utils/logging_utils.py").read_text()
    assert 'add_scalar(f"train/{k}"' in logger and 'add_scalar(f"eval/{k}"' in logger
    assert "os.path.join(args.use_tensorboard, args.wandb_run_name)" in logger
    sources = "".join(p.read_text() for p in (site_093 / "openrlhf/trainer").rglob("*.py"))
    sources += (site_093 / "openrlhf/models/loss.py").read_text()
    for key in (
        "reward",
        "ppo_clip_ratio",
        "response_length",
        "truncated",
        "group_reward_std",
        "policy_loss",
        "actor_lr",
    ):
        assert re.search(rf'"{key}"', sources), key
    assert 'f"eval_{datasource}_pass1"' in sources


def test_tensorboard_steps_map_onto_autorl_names(tmp_path):
    run = tmp_path / "tb" / "attempt-01"
    writer = torch_tb.SummaryWriter(log_dir=str(run))
    reader = OpenRLHFMetricsReader(run, tmp_path / "none.jsonl", EVAL_MAP)
    _write_step(writer, 1, 0.25)
    assert reader.poll() == []  # step 1 may still be growing
    _write_step(writer, 2, 0.5)
    writer.add_scalar("eval/eval_default_pass1", 0.31, 2)
    writer.flush()
    first = reader.poll()
    assert [r["step"] for r in first] == [1]
    rec = first[0]
    assert rec["type"] == "step" and rec["reward_mean"] == 0.25 and rec["clip_ratio"] == pytest.approx(0.05)
    assert rec["loss"] == pytest.approx(-0.1) and rec["response_length_mean"] == 301.0
    assert rec["truncated_rate"] == 0.25 and rec["lr"] == pytest.approx(1e-6) and rec["has_boxed"] == pytest.approx(0.9)
    assert "generated_samples" not in rec
    rest = reader.flush()
    assert [(r["type"], r["step"]) for r in rest] == [("step", 2), ("eval", 2)]
    assert rest[1]["eval/ood/greedy_pass@1"] == pytest.approx(0.31)
    assert reader.poll() == [] and reader.flush() == []
    writer.close()


def test_jsonl_merges_into_the_same_step(tmp_path):
    run = tmp_path / "tb" / "r"
    writer = torch_tb.SummaryWriter(log_dir=str(run))
    _write_step(writer, 1, 0.5)
    jsonl = tmp_path / "metrics" / "training_metrics.jsonl"
    jsonl.parent.mkdir()
    row = {
        "type": "step",
        "step": 1,
        "time": 1.0,
        "grad_norm": 3.5,
        "advantage_mean": 0.0,
        "advantage_std": 0.9,
        "advantage_max": 1.5,
        "advantage_min": -2.0,
        "log_ratio_max": 0.4,
        "log_ratio_min": -0.7,
        "entropy_mean": 1.2,
        "policy_loss": -0.1,
    }
    jsonl.write_text(json.dumps(row) + "\n" + '{"type": "step", "step": 2, "grad')  # torn last line
    recs = OpenRLHFMetricsReader(run, jsonl, EVAL_MAP).poll()
    assert len(recs) == 1  # the JSONL line marks step 1 complete
    rec = recs[0]
    assert rec["grad_norm"] == 3.5 and rec["advantage_abs_max"] == 2.0 and rec["log_ratio_abs_max"] == 0.7
    assert rec["reward_mean"] == 0.5 and rec["entropy_mean"] == 1.2 and "time" not in rec
    writer.close()


def test_jsonl_only_and_eval_lines(tmp_path):
    jsonl = tmp_path / "training_metrics.jsonl"
    lines = [
        {"type": "step", "step": 1, "reward": 0.1},
        {"type": "eval", "step": 1, "eval_default_pass1": 0.4},
        {"type": "step", "step": 2, "reward": 0.2},
    ]
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    recs = OpenRLHFMetricsReader(None, jsonl, EVAL_MAP).poll()
    assert [(r["type"], r["step"]) for r in recs] == [("step", 1), ("eval", 1), ("step", 2)]
    assert recs[0]["reward_mean"] == 0.1 and recs[1]["eval/ood/greedy_pass@1"] == 0.4


def test_missing_sources_read_as_nothing(tmp_path):
    assert OpenRLHFMetricsReader(tmp_path / "no-tb", tmp_path / "no.jsonl").poll() == []


def test_train_key_targets_are_autorl_names():
    from autorl.metrics import STEP_KEYS

    assert set(TRAIN_KEYS.values()) - set(STEP_KEYS) == {"group_reward_std"}
