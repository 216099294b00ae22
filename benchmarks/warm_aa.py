"""Warm trials change nothing but the clock: an A/A benchmark of OpenRLHF trials in warm pools against cold jobs.

    python benchmarks/warm_aa.py RECIPE OUT [--runs 8] [--lanes 4] [--set KEY=VALUE ...] [--arms warm,cold]

On one GPU host with the recipe's inputs made (recipes/openrlhf-small.yaml: ``python -m
autorl.backends.openrlhf.small``), both arms through autorl's own backend, launch and watch code:

- **warm arm**: ``--lanes`` lanes at once, each a sequence of trials in warm pools (``train.warm_pool: true``):
  before every measured run its lane runs a trial at lr 1e-4 (``--poison-lr``), so that weights, optimizer or RNG
  state carried from one trial to the next would show; the measured runs are the recipe's baseline with seeds
  1..``--runs``, each with ``warm_index`` >= 1;
- **cold arm**: the same ``--runs`` baseline seeds, each its own Ray job, ``--lanes`` at once.

Then, per split, ``autorl.judge.verdict.judge`` of warm against cold on the per-item eval (the study's own
verdict: it must read flat), the same on each of the first logged steps' reward, and how many seed pairs drew an
identical first-step reward (information only). Each run's phase table (``phases.py``) and wall time go to
``OUT/summary.json`` and ``OUT/phases.md``; run folders stay under ``OUT/runs``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autorl.backends.base import TrialSpec, get_backend  # noqa: E402
from autorl.backends.openrlhf.phases import phases, read_times, start_up, table  # noqa: E402
from autorl.judge.verdict import Runs, judge  # noqa: E402
from autorl.recipe import load_recipe  # noqa: E402
from autorl.runs.lifecycle import follow, launch, watch_run  # noqa: E402
from autorl.runs.warmrecord import warm_columns  # noqa: E402

STEP_KEYS = ("reward_mean", "loss", "grad_norm")


def one(backend: Any, recipe: Any, name: str, out: Path, seed: int) -> dict[str, Any]:
    """Run one trial to its end (training, then the per-item eval); what the benchmark keeps of it."""
    run_dir = out / "runs" / name
    wt = out / "wt"
    wt.mkdir(parents=True, exist_ok=True)
    spec = TrialSpec(attempt=name, recipe=recipe, worktree=wt, run_dir=run_dir, cache_dir=out / "cache", seed=seed)
    started = time.time()
    outcome = follow(watch_run(launch(backend, spec), recipe))
    ended = time.time()
    log = run_dir / "train.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    row = phases(text, read_times(str(log) + ".times"), started, ended)
    m = outcome.metrics
    return {
        "name": name,
        "seed": seed,
        "status": str(outcome.status),
        "wall_s": round(ended - started, 1),
        "phases": row,
        "start_up_s": round(up, 1) if row and (up := start_up(row)) is not None else None,
        "warm": warm_columns(run_dir),
        "items": {split: m.items(split) for split in ("id", "ood")},
        "steps": [{k: s.get(k) for k in ("step", *STEP_KEYS)} for s in m.steps[:4]],
        "objective": m.series(recipe.objective.metric)[-1:] or None,
    }


def lanes(n_lanes: int, jobs: list[list[tuple[str, Any, int]]], backend: Any, out: Path) -> list[dict[str, Any]]:
    """Run each lane's jobs in order, the lanes side by side; the results in the order they ended."""
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def lane(items: list[tuple[str, Any, int]]) -> None:
        for name, recipe, seed in items:
            try:
                got = one(backend, recipe, name, out, seed)
            except Exception as exc:  # keep the other lanes going; the failure is in the summary
                got = {"name": name, "seed": seed, "status": f"error: {type(exc).__name__}: {exc}"}
            with lock:
                results.append(got)
                print(json.dumps({k: got.get(k) for k in ("name", "status", "wall_s", "start_up_s", "warm")}))

    threads = [threading.Thread(target=lane, args=(items,)) for items in jobs[:n_lanes]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def verdicts(warm: list[dict[str, Any]], cold: list[dict[str, Any]], recipe: Any) -> dict[str, Any]:
    """The study's verdict of warm against cold: per split on the per-item eval, and per logged step on each
    step metric's run values."""
    out: dict[str, Any] = {}
    settings, direction = recipe.verdict, recipe.objective.direction
    for split in ("id", "ood"):
        w = [r["items"][split] for r in warm if r.get("items", {}).get(split)]
        c = [r["items"][split] for r in cold if r.get("items", {}).get(split)]
        if len(w) >= 2 and len(c) >= 2:
            values = [[statistics.fmean(x) for x in arm] for arm in (w, c)]
            got = judge(Runs(values=values[0], items=w), Runs(values=values[1], items=c), settings, direction)
            out[f"eval/{split}"] = {"warm": statistics.fmean(values[0]), "cold": statistics.fmean(values[1])}
            out[f"eval/{split}"].update(got.model_dump(mode="json"))
    for i in range(4):
        for key in STEP_KEYS:
            w, c = step_values(warm, i, key), step_values(cold, i, key)
            if len(w) >= 2 and len(c) >= 2:
                got = judge(Runs(values=w), Runs(values=c), settings, "maximize")
                out[f"step{i + 1}/{key}"] = {"warm": statistics.fmean(w), "cold": statistics.fmean(c)}
                out[f"step{i + 1}/{key}"].update(got.model_dump(mode="json"))
    return out


def step_values(runs: list[dict[str, Any]], i: int, key: str) -> list[float]:
    """``key`` at the ``i``-th logged step of each run that logged it."""
    out = []
    for r in runs:
        steps = r.get("steps", [])
        if len(steps) > i and steps[i].get(key) is not None:
            out.append(float(steps[i][key]))
    return out


def identical_first_rewards(warm: list[dict[str, Any]], cold: list[dict[str, Any]]) -> dict[str, int]:
    by_seed = {r["seed"]: r for r in cold if r.get("steps")}
    pairs = [(r, by_seed[r["seed"]]) for r in warm if r.get("steps") and r["seed"] in by_seed]
    same = sum(1 for a, b in pairs if a["steps"][0].get("reward_mean") == b["steps"][0].get("reward_mean"))
    return {"pairs": len(pairs), "identical": same}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("recipe")
    p.add_argument("out")
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--lanes", type=int, default=4)
    p.add_argument("--poison-lr", type=float, default=1e-4)
    p.add_argument("--set", action="append", default=[], dest="sets")
    p.add_argument("--arms", default="warm,cold")
    args = p.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cold_recipe = load_recipe(args.recipe, args.sets)
    warm_recipe = load_recipe(args.recipe, [*args.sets, "train.warm_pool=true"])
    poison = load_recipe(args.recipe, [*args.sets, "train.warm_pool=true", f"train.lr={args.poison_lr}"])
    backend = get_backend(cold_recipe.backend)
    backend.check(warm_recipe, out)
    backend.prepare(warm_recipe, out / "cache", out / "runs")
    seeds = list(range(1, args.runs + 1))
    summary: dict[str, Any] = {"recipe": args.recipe, "sets": args.sets, "runs": args.runs, "lanes": args.lanes}
    try:
        if "warm" in args.arms:
            jobs: list[list[tuple[str, Any, int]]] = [[] for _ in range(args.lanes)]
            for i, seed in enumerate(seeds):
                jobs[i % args.lanes] += [(f"poison-{seed}", poison, 1000 + seed), (f"warm-{seed}", warm_recipe, seed)]
            t = time.time()
            summary["warm_all"] = lanes(args.lanes, jobs, backend, out)
            summary["warm_arm_s"] = round(time.time() - t, 1)
            backend.close()  # the pools hold their GPUs: the cold arm's jobs need them
            backend.prepare(warm_recipe, out / "cache", out / "runs")
        if "cold" in args.arms:
            jobs = [[] for _ in range(args.lanes)]
            for i, seed in enumerate(seeds):
                jobs[i % args.lanes].append((f"cold-{seed}", cold_recipe, seed))
            t = time.time()
            summary["cold"] = lanes(args.lanes, jobs, backend, out)
            summary["cold_arm_s"] = round(time.time() - t, 1)
    finally:
        backend.close()
    warm = [r for r in summary.get("warm_all", []) if r["name"].startswith("warm-")]
    cold = summary.get("cold", [])
    summary["verdicts"] = verdicts(warm, cold, cold_recipe)
    summary["identical_first_reward"] = identical_first_rewards(warm, cold)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    rows = {r["name"]: r["phases"] for r in [*summary.get("warm_all", []), *cold] if r.get("phases")}
    (out / "phases.md").write_text(table(rows) + "\n" if rows else "")
    for key, v in summary["verdicts"].items():
        print(key, v.get("verdict"), v.get("warm"), v.get("cold"), v.get("ci_low"), v.get("ci_high"))
    print(json.dumps(summary["identical_first_reward"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
