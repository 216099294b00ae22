"""Does the hypotheses strategy pay? Trials to the first *confirmed* improvement, per strategy, from poor recipes.

Each base recipe in benchmarks/recipes/ (lr far too small, lr far too large, groups of 2, a KL weight that pins
the policy, lr too small *and* groups of 2, and the default recipe's values) is searched by each strategy
(``autorl run --strategy hypotheses|optuna|random``) with several search seeds, the same trial budget and the same
trial length. Every study runs in its own fresh workspace (``autorl init``); all workspaces share one engine cache
(the base model is built once, content-hashed and locked). The baseline runs are counted apart; the budget
``--max-trials`` counts every trial after them, confirmation re-runs included (they cost what a trial costs).

Per study: "first proposal" is the position, among the strategy's own proposals (confirmation re-runs and crash
retries left out), of the first candidate that was then *confirmed*; "runs" is how many trials after the
baselines were spent until it was confirmed (its last confirmation run included, so at least 3 with 2
confirmation runs); 'never' if none within the budget. The targets are judged on proposals: counting the
confirmation runs gives every strategy the same floor of 3, which "where random needs more than 2" would never
exclude; both are printed. "best" is the objective
of the best confirmed improvement at the end (the baseline's mean when none was confirmed: the incumbent did not
move); "time" is the summed duration of all trials, baselines included.

Targets (issue "a search that pays for itself"): on every recipe, hypotheses' median first proposal is at most half of
random's where random needs more than 2, and never more than TPE's; its median "best" is at least TPE's on at
least 5 of the 6 recipes.

    python benchmarks/strategies.py [--seeds 5] [--max-trials 12] [--parallel 2]

Prints a table; writes one JSON per study and a summary to benchmarks/out/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from autorl.recipe import VerdictSettings
from autorl.states import Confirmation, Proposer, Verdict

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "benchmarks" / "recipes"
OUT = ROOT / "benchmarks" / "out"
STRATEGIES = ("hypotheses", "optuna", "random")
TARGET_VS_RANDOM = 0.5  # hypotheses' median trials to first improvement <= half of random's
RERUNS = (Proposer.CONFIRM, Proposer.RETRY)  # runs the verdict or triage adds: not proposals of the strategy


def _cli(ws: Path, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "autorl.cli", "-C", str(ws), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def make_workspace(work: Path, cache: Path, recipe: Path, name: str) -> Path:
    """A fresh workspace holding ``recipe``, its engine cache linked to the shared one."""
    ws = work / name
    subprocess.run(
        [sys.executable, "-m", "autorl.cli", "init", str(ws)],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )
    (ws / ".autorl").mkdir(exist_ok=True)
    (ws / ".autorl" / "cache").symlink_to(cache, target_is_directory=True)
    shutil.copy(recipe, ws / "recipes" / recipe.name)
    return ws


def run_study(work: Path, cache: Path, recipe: Path, strategy: str, seed: int, max_trials: int) -> dict:
    """One study; its trials, first improvement and best objective."""
    ws = make_workspace(work, cache, recipe, f"{recipe.stem}-{strategy}-s{seed}")
    default = VerdictSettings().baseline_repeats
    repeats = int((yaml.safe_load(recipe.read_text()).get("verdict") or {}).get("baseline_repeats", default))
    t0 = time.time()
    proc = _cli(
        ws,
        "run",
        f"recipes/{recipe.name}",
        "--strategy",
        strategy,
        "--seed",
        str(seed),
        "--max-trials",
        str(max_trials + repeats),
        "--budget",
        "2h",
        "--quiet",
    )
    trials = json.loads(_cli(ws, "ledger", "--json").stdout or "[]")
    result = summarize(trials, repeats)
    result.update(
        recipe=recipe.stem,
        strategy=strategy,
        seed=seed,
        wall_s=round(time.time() - t0, 1),
        exit_code=proc.returncode,
        diagnosis_1=_diagnosis(ws),
        trials=trials,
    )
    if proc.returncode not in (0, 130):
        result["stderr_tail"] = proc.stderr[-2000:]
    return result


def _diagnosis(ws: Path) -> dict | None:
    proc = _cli(ws, "diagnose", "1", "--json")
    return json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else None


def summarize(trials: list[dict], repeats: int) -> dict:
    """Trials to the first confirmed improvement (1-based, after the baselines), best confirmed objective, time.
    ``trials`` are the rows of `autorl ledger --json` (plain dicts: their states are the enums' words)."""
    base = [t for t in trials if t.get("proposer") == Proposer.BASELINE]
    search = [t for t in trials if t.get("proposer") != Proposer.BASELINE]
    base_values = [t["objective"] for t in base if t.get("objective") is not None]
    base_mean = statistics.mean(base_values) if base_values else None
    confirmed = [
        t for t in search if t.get("confirmation") == Confirmation.CONFIRMED and t.get("objective") is not None
    ]
    first = min((_confirmed_at(t, search) for t in confirmed), default=None)
    proposed = [t for t in search if t.get("proposer") not in RERUNS]
    first_proposal = min((proposed.index(t) + 1 for t in confirmed if t in proposed), default=None)
    best = max((t["objective"] for t in confirmed), default=base_mean)
    runs = max((_runs_mean(t, search) for t in confirmed), default=base_mean)
    return {
        "baseline_objective": base_mean,
        "search_trials": len(search),
        "first_confirmed": first,
        "first_confirmed_proposal": first_proposal,
        "best_confirmed": best,
        "best_confirmed_runs": runs,
        "n_confirmed": len(confirmed),
        "n_candidates": sum(t.get("verdict") == Verdict.IMPROVED for t in search),
        "trial_time_s": round(sum(t.get("duration_s") or 0 for t in trials), 1),
        "verdicts": [t.get("verdict") for t in search],
        "hypotheses": [t.get("hypothesis") for t in search],
    }


def _runs_mean(candidate: dict, search: list[dict]) -> float:
    """The mean objective of a confirmed recipe over its own run and its confirmation runs (less selected)."""
    values = [candidate["objective"]] + [
        t["objective"] for t in search if t.get("confirms") == candidate["number"] and t.get("objective") is not None
    ]
    return statistics.mean(values)


def _confirmed_at(candidate: dict, search: list[dict]) -> int:
    """Position (1-based, among the trials after the baselines) of the candidate's last confirmation run."""
    numbers = [t["number"] for t in search]
    runs = [t["number"] for t in search if t.get("confirms") == candidate["number"]] or [candidate["number"]]
    return numbers.index(max(runs)) + 1


def table(results: list[dict], max_trials: int) -> list[dict]:
    """One row per recipe x strategy: median and per-seed trials to first confirmed improvement, best, time."""
    rows = []
    for recipe in sorted({r["recipe"] for r in results}):
        for strategy in STRATEGIES:
            mine = sorted(
                (r for r in results if r["recipe"] == recipe and r["strategy"] == strategy), key=lambda r: r["seed"]
            )
            if mine:
                rows.append(_row(recipe, strategy, mine, max_trials))
    return rows


def _row(recipe: str, strategy: str, mine: list[dict], max_trials: int) -> dict:
    firsts = [r["first_confirmed"] for r in mine]
    ranked = [f if f is not None else max_trials + 1 for f in firsts]  # 'never' ranks after the budget
    med = statistics.median(ranked)
    props = [r.get("first_confirmed_proposal") for r in mine]
    med_p = statistics.median(p if p is not None else max_trials + 1 for p in props)
    best = [r["best_confirmed"] for r in mine if r["best_confirmed"] is not None]
    runs = [r["best_confirmed_runs"] for r in mine if r.get("best_confirmed_runs") is not None]
    return {
        "recipe": recipe,
        "strategy": strategy,
        "median_first": f"{med:g}" if med <= max_trials else "never",
        "median_rank": med,
        "per_seed": ["never" if f is None else f for f in firsts],
        "median_first_proposal": f"{med_p:g}" if med_p <= max_trials else "never",
        "median_rank_proposal": med_p,
        "per_seed_proposal": ["never" if p is None else p for p in props],
        "best_median": statistics.median(best) if best else None,
        "best_max": max(best) if best else None,
        "runs_median": statistics.median(runs) if runs else None,
        "trial_time_s": round(sum(r["trial_time_s"] for r in mine), 1),
        "baseline": statistics.median(r["baseline_objective"] for r in mine),
    }


def verdicts(rows: list[dict]) -> dict[str, dict]:
    """Per recipe: does hypotheses meet the targets against random and optuna?"""
    out = {}
    for recipe in sorted({r["recipe"] for r in rows}):
        by = {r["strategy"]: r for r in rows if r["recipe"] == recipe}
        if set(STRATEGIES) <= set(by):
            h, o, rnd = by["hypotheses"], by["optuna"], by["random"]
            out[recipe] = {
                "half_of_random": _half(h["median_rank_proposal"], rnd["median_rank_proposal"]),
                "no_worse_than_optuna": h["median_rank_proposal"] <= o["median_rank_proposal"],
                "half_of_random_runs": _half(h["median_rank"], rnd["median_rank"]),
                "no_worse_than_optuna_runs": h["median_rank"] <= o["median_rank"],
                "best_at_least_optuna": (h["best_median"] or 0) >= (o["best_median"] or 0),
                "runs_at_least_optuna": (h["runs_median"] or 0) >= (o["runs_median"] or 0),
            }
    return out


def _half(mine: float, random: float) -> bool:
    """At most half of random's trials, where random needs more than 2."""
    return random <= 2 or mine <= TARGET_VS_RANDOM * random


def print_table(rows: list[dict], checks: dict[str, dict]) -> None:
    print(
        f"{'recipe':<13} {'strategy':<11} {'baseline':>8} {'proposals':>9}  {'per seed':<24} {'runs':>5} "
        f"{'best med':>8} {'best max':>8} {'3-run med':>9} {'time s':>7}"
    )
    for r in rows:
        seeds = " ".join(str(x) for x in r["per_seed_proposal"])
        print(
            f"{r['recipe']:<13} {r['strategy']:<11} {r['baseline'] or 0:>8.3f} {r['median_first_proposal']:>9}  "
            f"{seeds:<24} {r['median_first']:>5} {r['best_median'] or 0:>8.3f} {r['best_max'] or 0:>8.3f} "
            f"{r['runs_median'] or 0:>9.3f} {r['trial_time_s']:>7.0f}"
        )
    for recipe, c in checks.items():
        print(
            f"{recipe}: first <= 1/2 random (where random > 2): {c['half_of_random']} (runs: "
            f"{c['half_of_random_runs']}); first <= optuna: {c['no_worse_than_optuna']} (runs: "
            f"{c['no_worse_than_optuna_runs']}); best >= optuna: {c['best_at_least_optuna']} "
            f"(3-run mean: {c['runs_at_least_optuna']})"
        )
    wins = sum(c["best_at_least_optuna"] for c in checks.values())
    runs = sum(c["runs_at_least_optuna"] for c in checks.values())
    print(f"best >= optuna on {wins} of {len(checks)} recipes, 3-run mean on {runs} (target: 5 of 6)")


def markdown(rows: list[dict], checks: dict[str, dict]) -> str:
    """The table as Markdown, one line per recipe: each strategy's median first (per seed), best, 3-run mean."""
    out = [
        "| recipe | baseline | "
        + " | ".join(f"{s}: first proposal (per seed) / runs / best / 3-run / time" for s in STRATEGIES)
        + " | targets: first ≤ ½ random (random > 2); ≤ TPE; best ≥ TPE |",
        "|---" * (len(STRATEGIES) + 3) + "|",
    ]
    for recipe in sorted({r["recipe"] for r in rows}):
        by = {r["strategy"]: r for r in rows if r["recipe"] == recipe}
        cells = [_cell(by[s]) if s in by else "-" for s in STRATEGIES]
        c = checks.get(recipe, {})
        marks = (
            "; ".join(
                "met" if c.get(k) else "not met"
                for k in ("half_of_random", "no_worse_than_optuna", "best_at_least_optuna")
            )
            if c
            else "-"
        )
        out.append(f"| {recipe} | {next(iter(by.values()))['baseline']:.3f} | " + " | ".join(cells) + f" | {marks} |")
    return "\n".join(out)


def _cell(r: dict) -> str:
    seeds = " ".join(str(x) for x in r["per_seed_proposal"])
    return (
        f"**{r['median_first_proposal']}** ({seeds}) / {r['median_first']} / {r['best_median']:.3f} / "
        f"{r['runs_median']:.3f} / "
        f"{r['trial_time_s'] / 60:.0f} min"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="*", default=None, help="Recipe names in benchmarks/recipes (default: all).")
    parser.add_argument("--strategies", nargs="*", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--seeds", type=int, default=5, help="Search seeds 0..N-1 per recipe x strategy.")
    parser.add_argument("--seed-start", type=int, default=0, help="First search seed (runs seeds START..N-1).")
    parser.add_argument(
        "--from-json",
        nargs="*",
        default=None,
        help="Build the table from these per-study JSON files instead of running studies.",
    )
    parser.add_argument(
        "--max-trials", type=int, default=12, help="Trials after the baselines (confirmation runs included)."
    )
    parser.add_argument("--parallel", type=int, default=2, help="Studies at once (each trial uses 1 thread).")
    parser.add_argument("--work", default=None, help="Folder for the workspaces (default: a temp dir, removed).")
    args = parser.parse_args()
    if args.from_json is not None:
        loaded = [json.loads(Path(f).read_text()) for f in args.from_json]
        report([{**r, **summarize(r["trials"], 0)} for r in loaded], args)  # recomputed from the stored trials
        return
    recipes = sorted(RECIPES.glob("*.yaml")) if not args.recipes else [RECIPES / f"{n}.yaml" for n in args.recipes]
    # seed-major: any prefix of the jobs is balanced across recipes and strategies
    jobs = [(r, s, k) for k in range(args.seed_start, args.seeds) for r in recipes for s in args.strategies]
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="autorl-strategies-"))
    cache = work / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    results = []

    def job(spec):
        recipe, strategy, seed = spec
        res = run_study(work, cache, recipe, strategy, seed, args.max_trials)
        (OUT / f"strategies-{stamp}-{recipe.stem}-{strategy}-s{seed}.json").write_text(json.dumps(res, indent=1))
        print(
            f"{recipe.stem} {strategy} seed {seed}: first confirmed {res['first_confirmed'] or 'never'}, "
            f"best {res['best_confirmed']}, {res['wall_s']} s, hypotheses {res['hypotheses']}",
            flush=True,
        )
        return res

    try:
        with ThreadPoolExecutor(max(1, args.parallel)) as pool:
            results = list(pool.map(job, jobs))
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    report(results, args, stamp)


def report(results: list[dict], args, stamp: str | None = None) -> None:
    """Print the table and the target checks; write the summary JSON."""
    rows = table(results, args.max_trials)
    checks = verdicts(rows)
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"strategies-{stamp}.json").write_text(
        json.dumps({"max_trials": args.max_trials, "rows": rows, "checks": checks}, indent=1)
    )
    print_table(rows, checks)
    print(markdown(rows, checks))


if __name__ == "__main__":
    main()
