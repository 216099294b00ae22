"""Metric readers: each format read incrementally into autorl's record schema."""

from __future__ import annotations

import json
import math
import os

import pytest

from autorl.backends.readers import DEFAULT_METRIC_MAP, make_reader, parse_dict_line, record_kind, to_record
from autorl.errors import RecipeError


def append(path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def test_jsonl_reader_returns_only_new_complete_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    read = make_reader("jsonl", path, {"my_acc": "eval/id/greedy_pass@1"})
    assert read() == []
    append(
        path,
        json.dumps({"global_step": 1, "reward": 0.5}) + "\n" + json.dumps({"global_step": 2, "kl": 0.1}) + '\n{"glo',
    )
    assert read() == [{"type": "step", "step": 1, "reward_mean": 0.5}, {"type": "step", "step": 2, "kl": 0.1}]
    append(path, 'bal_step": 3, "loss": 0.2}\n' + json.dumps({"step": 3, "eval_my": 1.0, "my_acc": 0.4}) + "\n")
    assert read() == [
        {"type": "step", "step": 3, "loss": 0.2},
        {"type": "eval", "step": 3, "eval_my": 1.0, "eval/id/greedy_pass@1": 0.4},
    ]
    append(path, json.dumps({"reward": 0.7}) + "\n" + json.dumps({"type": "summary", "status": "ok"}) + "\n")
    assert read() == [
        {"type": "step", "step": 4, "reward_mean": 0.7},
        {"type": "summary", "step": 4, "steps_done": 4, "status": "ok"},
    ]
    assert read() == []


def test_jsonl_reader_keeps_autorl_schema_lines_as_they_are(tmp_path):
    path = tmp_path / "m.jsonl"
    rec = {"type": "eval", "step": 10, "eval/id/greedy_pass@1": 0.5, "eval/id/items": [1, 0]}
    path.write_text(json.dumps(rec) + "\n")
    assert make_reader("jsonl", path)() == [rec]


def write_state(path, history) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"global_step": history[-1]["step"], "log_history": history}))


def test_trainer_state_reader_emits_new_entries_when_the_file_changes(tmp_path):
    state = tmp_path / "trainer_state.json"
    read = make_reader("trainer_state", state)
    assert read() == []
    history = [{"loss": 0.3, "learning_rate": 1e-5, "step": 1}, {"loss": 0.2, "learning_rate": 1e-5, "step": 2}]
    write_state(state, history)
    assert [(r["step"], r["loss"], r["lr"]) for r in read()] == [(1, 0.3, 1e-5), (2, 0.2, 1e-5)]
    assert read() == []
    history += [{"eval_loss": 0.25, "step": 2}, {"loss": 0.1, "step": 3}, {"train_runtime": 9.5, "step": 3}]
    write_state(state, history)
    new = read()
    assert [(r["type"], r["step"]) for r in new] == [("eval", 2), ("step", 3), ("summary", 3)]
    assert new[-1]["wall_s"] == 9.5 and new[-1]["steps_done"] == 3


def test_trainer_state_reader_follows_the_newest_checkpoint_and_skips_torn_files(tmp_path):
    read = make_reader("trainer_state", tmp_path)
    write_state(
        tmp_path / "checkpoint-2" / "trainer_state.json", [{"reward": 0.1, "step": 1}, {"reward": 0.2, "step": 2}]
    )
    assert [r["reward_mean"] for r in read()] == [0.1, 0.2]
    torn = tmp_path / "checkpoint-4" / "trainer_state.json"
    torn.parent.mkdir()
    torn.write_text('{"log_history": [{"reward": 0.1, "st')
    os.utime(torn, ns=(10**19, 10**19))  # newest, but not valid JSON yet
    assert read() == []
    write_state(torn, [{"reward": 0.1, "step": 1}, {"reward": 0.2, "step": 2}, {"reward": 0.4, "step": 4}])
    os.utime(torn, ns=(2 * 10**19, 2 * 10**19))
    assert [(r["step"], r["reward_mean"]) for r in read()] == [(4, 0.4)]


def test_stdout_reader_parses_printed_dicts_between_progress_bars(tmp_path):
    log = tmp_path / "train.log"
    read = make_reader("stdout_dicts", log)
    append(log, "Loading checkpoint shards: 100%\n{'model': 'Qwen/Qwen2.5-7B', 'learning_rate': 1e-05}\n")
    append(log, "\r 10%|#   | 1/10 [00:01<00:09]{'loss': '0.5', 'reward': '0.25', 'grad_norm': 1.5}\n")
    append(log, "{'loss': nan, 'reward': 0.5, 'kl': inf, 'learning_rate': '1e-05'}\n{'eval_rew")
    first = read()
    assert first[0] == {"type": "step", "step": 1, "loss": 0.5, "reward_mean": 0.25, "grad_norm": 1.5}
    assert first[1]["step"] == 2 and math.isnan(first[1]["loss"]) and first[1]["kl"] == math.inf
    assert first[1]["lr"] == 1e-05
    append(log, "ard': 0.8, 'epoch': 1.0}\n{'train_runtime': 12.0, 'train_loss': 0.3}")
    assert read() == [{"type": "eval", "step": 2, "eval_reward": 0.8, "epoch": 1.0}]
    assert read(final=True) == [{"type": "summary", "step": 2, "steps_done": 2, "wall_s": 12.0, "train_loss": 0.3}]


def test_tensorboard_reader_groups_tags_per_step_and_reads_incrementally(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "runs" / "x"))
    read = make_reader("tensorboard", tmp_path, {"eval/acc": "eval/id/greedy_pass@1"})
    assert read() == []
    for step in (1, 2):
        writer.add_scalar("train/reward", 0.25 * step, step)
        writer.add_scalar("train/learning_rate", 1e-4, step)
    writer.add_scalar("eval/acc", 0.5, 2)
    writer.flush()
    assert read() == [{"type": "step", "step": 1, "reward_mean": 0.25, "lr": pytest.approx(1e-4)}]
    released = read()  # nothing new: the writer is quiet, so step 2 is complete
    assert [(r["type"], r["step"]) for r in released] == [("step", 2), ("eval", 2)]
    assert released[1]["eval/id/greedy_pass@1"] == 0.5
    writer.add_scalar("train/reward", 1.0, 3)
    writer.flush()
    assert read() == []
    assert read(final=True) == [{"type": "step", "step": 3, "reward_mean": 1.0}]
    writer.close()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("{'a': 1}", {"a": 1}),
        ("  {'a': -inf, 'b': [nan]}  ", {"a": "-inf", "b": ["nan"]}),
        ("50%|###| 5/10{'loss': '0.1'}", {"loss": "0.1"}),
        ("{1, 2}", None),
        ("{'a': __import__('os')}", None),
        ("plain text", None),
        ("{'unterminated': 1", None),
    ],
)
def test_parse_dict_line(text, expected):
    assert parse_dict_line(text) == expected


def test_recipe_map_overrides_the_trl_defaults():
    rec = to_record(
        {"reward": 0.3, "rewards/em/mean": 0.2},
        {**DEFAULT_METRIC_MAP, "reward": "shaped", "rewards/em/mean": "correctness"},
        5,
    )
    assert rec == {"type": "step", "step": 5, "shaped": 0.3, "correctness": 0.2}
    assert record_kind({"eval_loss": 1}) == "eval" and record_kind({"train_runtime": 1}) == "summary"
    assert record_kind({"loss": 1}) == "step"


def test_unknown_format_is_a_recipe_error(tmp_path):
    with pytest.raises(RecipeError, match="metrics_format 'csv' is unknown"):
        make_reader("csv", tmp_path)
