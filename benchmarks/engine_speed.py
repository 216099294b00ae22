"""Wall time of one default embedded-engine trial, as the controller would launch it.

The trial's config is the train block of recipes/default.yaml when that file
exists, else EngineConfig's defaults (50 steps, 32 prompts x 8, ppo_epochs 2).
The base model is built into the cache first (not timed). Each repeat times the
trial both ways, one after the other: forked from the fork server with torch
imported already (how the embedded backend starts trials), and as a fresh
``python -m autorl.engine`` process (how it starts one the server cannot serve).
Model load, every eval and the final eval are included in both. Target: <= 10 s
on a 2-core CPU.

    python benchmarks/engine_speed.py [--repeats 3] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autorl.backends import forked  # noqa: E402
from autorl.backends.base import LaunchPlan  # noqa: E402

TARGET_S = 10.0


def default_train_block() -> dict:
    recipe = ROOT / "recipes" / "default.yaml"
    if recipe.is_file():
        return dict((yaml.safe_load(recipe.read_text()) or {}).get("train") or {})
    return {}


def one_trial(config: dict, cache: Path, work: Path, fresh: bool = False) -> tuple[float, dict]:
    """Wall time of one trial from launch to exit, and its metrics."""
    cfg, metrics = work / "cfg.json", work / "metrics.jsonl"
    cfg.write_text(json.dumps(config))
    argv = [
        sys.executable,
        "-m",
        "autorl.engine",
        "--config",
        str(cfg),
        "--metrics-out",
        str(metrics),
        "--cache-dir",
        str(cache),
    ]
    plan = LaunchPlan(
        argv=argv,
        cwd=str(ROOT),
        log_path=str(work / "train.log"),
        metrics_path=str(metrics),
        env={"AUTORL_BENCH_FRESH": "1"} if fresh else {},
    )  # a variable the server lacks: a fresh process
    t0 = time.perf_counter()
    handle = forked.ForkedProcess(plan)
    assert isinstance(handle.proc, forked.ForkedChild) != fresh
    while handle.poll() is None:
        time.sleep(0.01)
    wall = time.perf_counter() - t0
    assert handle.poll() == 0, (work / "train.log").read_text()[-500:]
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    return wall, {
        "summary": lines[-1],
        "steps": [x for x in lines if x["type"] == "step"],
        "evals": [x for x in lines if x["type"] == "eval"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", default=None, help="Reuse a base-model cache (default: a temp dir).")
    args = parser.parse_args()
    config = default_train_block()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cache = Path(args.cache_dir) if args.cache_dir else work / "cache"
        warm_s, _ = one_trial({**config, "steps": 0}, cache, work)  # builds the base once, starts the server
        walls, fresh_walls, last = [], [], {}
        for _ in range(args.repeats):
            wall, last = one_trial(config, cache, work)
            walls.append(wall)
            fresh_walls.append(one_trial(config, cache, work, fresh=True)[0])
    steps = last["steps"]
    median = statistics.median(walls)
    result = {
        "config": config or "EngineConfig defaults",
        "warmup_and_base_eval_s": round(warm_s, 2),
        "trial_wall_s": [round(w, 2) for w in walls],
        "trial_wall_median_s": round(median, 2),
        "fresh_process_wall_s": [round(w, 2) for w in fresh_walls],
        "fresh_process_median_s": round(statistics.median(fresh_walls), 2),
        "engine_wall_s": last["summary"]["wall_s"],
        "steps": len(steps),
        "s_per_step": round(
            sum(s["time_generate_s"] + s["time_reward_s"] + s["time_update_s"] for s in steps) / max(1, len(steps)), 4
        ),
        "final_id_pass@1": last["evals"][-1].get("eval/id/greedy_pass@1"),
        "target_s": TARGET_S,
        "meets_target": median <= TARGET_S,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
