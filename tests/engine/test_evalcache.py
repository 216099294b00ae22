"""The step-0 eval measured once per base model and eval setting: real engine runs on the CPU sharing a cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from autorl.engine.config import EngineConfig
from autorl.engine.grpo import run
from autorl.metrics import RunMetrics, iter_records
from autorl.toolkit.evalcache import TRAIN_ONLY, eval_key

FAST = {"steps": 1, "batch_prompts": 4, "gens": 4, "eval_every": 0}


def _cache(tmp_path: Path, engine_cache: Path) -> Path:
    """A cache of its own holding the shared warmed-up base (so the eval cache starts empty)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for base in engine_cache.glob("base-*.pt"):
        shutil.copy(base, cache / base.name)
    return cache


def _run(tmp_path: Path, cache: Path, name: str, **values) -> tuple[dict, list[str]]:
    lines: list[str] = []
    out = tmp_path / f"{name}.jsonl"
    run(EngineConfig(**{**FAST, **values}), out, cache, log=lines.append)
    return RunMetrics(iter_records(out)).evals[0], lines


def test_a_second_run_from_the_same_base_reads_the_step0_eval_and_says_so(tmp_path, engine_cache):
    cache = _cache(tmp_path, engine_cache)
    first, lines1 = _run(tmp_path, cache, "a", lr=1e-4)
    second, lines2 = _run(tmp_path, cache, "b", lr=3e-3, gens=2, seed=7)  # values that act only once training starts
    assert "base_eval_cache" not in first and not any("from the cache" in x for x in lines1)
    assert second.pop("base_eval_cache") == eval_key(EngineConfig(**FAST), "cpu")
    assert second == first  # item for item
    assert any("step-0 eval read from the cache" in x for x in lines2)
    assert len(list(cache.glob("eval0-*.json"))) == 1


def test_what_changes_the_eval_changes_the_key(tmp_path):
    base = EngineConfig(**FAST)
    key = eval_key(base, "cpu")
    assert key == eval_key(EngineConfig(**{**FAST, "lr": 0.5, "kl_coef": 0.1, "steps": 9}), "cpu")
    for changed in ({"max_new_tokens": 7}, {"eval_size": 100}, {"threads": 1}, {"eval_k": 4}, {"sft_target": 0.3}):
        assert eval_key(EngineConfig(**{**FAST, **changed}), "cpu") != key, changed
    assert eval_key(base, "cuda") != key
    sampled = {**FAST, "eval_k": 4}
    assert eval_key(EngineConfig(**sampled, seed=1), "cpu") != eval_key(EngineConfig(**sampled, seed=2), "cpu")
    assert not TRAIN_ONLY - set(EngineConfig.model_fields)  # every listed setting exists


def test_an_eval_file_edited_in_place_is_measured_again(tmp_path):
    ids = tmp_path / "id.jsonl"
    ids.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = lambda: EngineConfig(model=str(model), task=str(ids), eval_id=str(ids))  # noqa: E731
    before = eval_key(cfg(), "cpu")
    ids.write_text(json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n")
    assert eval_key(cfg(), "cpu") != before
    (model / "config.json").write_text('{"changed": true}')  # new weights or config: a new size or time
    assert eval_key(cfg(), "cpu") not in (before, None)


def test_a_damaged_cache_entry_is_measured_again(tmp_path, engine_cache):
    cache = _cache(tmp_path, engine_cache)
    first, _ = _run(tmp_path, cache, "a")
    (entry,) = cache.glob("eval0-*.json")
    entry.write_text('{"type": "eval", "ste')
    again, lines = _run(tmp_path, cache, "b")
    assert "base_eval_cache" not in again and again == first
    assert json.loads(entry.read_text())["step"] == 0  # kept again, whole
