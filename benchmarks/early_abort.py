"""Early abort's saving: the same random-search study with and without it, over several seeds.

Each seed runs two real `autorl run --strategy random` studies on the embedded task, in
fresh workspaces that share one engine cache:

- ``abort``: the recipe's ``abort.enabled`` and ``abort.pruner`` on (the default: the hard rules and the
  noise-aware pruner, which stops a trial clearly worse than the baseline, or than the confirmed incumbent once
  there is one, at the same eval step);
- ``none``: both off, so every trial runs to its last step.

The search space is wide enough to include learning rates that collapse the policy
(lr log-uniform in [1e-5, 3e-2]). The baseline starts far too low (lr 1e-6; the default recipe starts at 5e-7),
so the sweep has real improvements to find and confirm: with a baseline that no draw beats (lr 1e-4 before),
the best objective was a baseline run in every seed and "the same best" checked nothing. Optuna's RandomSampler
ignores results, so for one
seed both arms test the same values; the script checks that the lr sequences match (while both arms confirm
the same candidates they launch the same trials). The verdict settings are the defaults: 5 baseline runs, which
the pruner's noise estimate rests on, and 3 fresh-seed confirmation runs per candidate; neither arm may stop
those. Evals come every quarter of the steps, the default recipe's cadence (10 of 40).
Trials run with ``threads: 1``: on a shared 2-core box, two torch threads per trial
ran about 5x slower than one (spin-waiting under contention). Per seed it prints the best objective, the sum of trial
durations (ledger duration_s,
not study wall clock: the machine is shared), the trials pruned and the saving, over all trials and over the
searched trials alone (the baseline runs are the pruner's reference: no arm can stop them). Then the verdicts
that the trials stopped with early abort got in the arm without it: a stopped trial that would have been
'improved' (or confirmed) is a find the pruner lost.

    python benchmarks/early_abort.py [--seeds 0 1 2] [--trials 20] [--steps 48] [--keep DIR]
    python benchmarks/early_abort.py --report DIR [--seeds ...]   # the table again, from kept workspaces
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from autorl.ledger import Ledger
from autorl.states import Confirmation, Proposer, TrialStatus, Verdict

SPACE = {"lr": {"low": 1.0e-5, "high": 3.0e-2, "log": True}}
BASE_LR = 1.0e-6  # far too low, as in the default recipe: the sweep has something to find


def bench_recipe(steps: int, abort_on: bool, base_lr: float = BASE_LR) -> dict:
    """The benchmark's recipe: a short embedded trial, lr searched, early abort on or off."""
    train = {
        "model": "builtin:tiny",
        "task": "builtin:addition",
        "lr": base_lr,
        "gens": 8,
        "batch_prompts": 16,
        "steps": steps,
        "eval_every": max(1, steps // 4),
        "seed": 0,
        "threads": 1,
        "device": "cpu",
    }
    return {
        "name": "early-abort-bench",
        "backend": "embedded",
        "train": train,
        "search": SPACE,
        "objective": {"metric": "eval/id/greedy_pass@1", "direction": "maximize", "reduction": "last"},
        "abort": {"enabled": abort_on, "pruner": abort_on},
        "timeout_s": 300,
    }


def make_workspace(root: Path, cache: Path, recipe: dict) -> Path:
    """A fresh workspace with the recipe written and the shared engine cache linked in."""
    subprocess.run([sys.executable, "-m", "autorl.cli", "init", str(root)], check=True, capture_output=True)
    (root / "recipes" / "bench.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    (root / ".autorl").mkdir(exist_ok=True)
    os.symlink(cache, root / ".autorl" / "cache")
    return root


def run_study(ws: Path, seed: int, trials: int) -> None:
    argv = [
        sys.executable,
        "-m",
        "autorl.cli",
        "-C",
        str(ws),
        "run",
        "recipes/bench.yaml",
        "--strategy",
        "random",
        "--seed",
        str(seed),
        "--max-trials",
        str(trials),
        "--budget",
        "3h",
        "--quiet",
    ]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"study in {ws} failed (exit {r.returncode}): {r.stderr.strip()[-500:]}")


def study_result(ws: Path) -> dict:
    """Best objective, trial-time sum, pruned count, lr sequence and abort reasons of one study."""
    rows = Ledger(ws / "ledger.sqlite").trials()
    values = [r.objective for r in rows if r.objective is not None]
    sweep = [r for r in rows if r.proposer not in (Proposer.BASELINE, Proposer.CONFIRM)]
    pruned = [r for r in rows if r.status == TrialStatus.PRUNED]
    return {
        "best": max(values) if values else None,
        "trial_s": sum(r.duration_s or 0 for r in rows),
        "sweep_s": sum(r.duration_s or 0 for r in sweep),
        "pruned": len(pruned),
        "confirmed": sum(r.confirmation == Confirmation.CONFIRMED for r in rows),
        "incumbent": max((r.objective for r in rows if r.confirmation == Confirmation.CONFIRMED), default=None),
        "lrs": [round((r.params or {})["lr"], 10) for r in sweep],
        "verdicts": [r.verdict for r in sweep],
        "confirmations": [r.confirmation for r in sweep],
        "by": sorted({_pruned_by(r.reason or "") for r in pruned}),
    }


def _pruned_by(reason: str) -> str:
    """'early abort (rule)' or 'noise-aware pruner': what stopped a pruned trial."""
    return reason.split(":")[0]


def run_seed(base: Path, cache: Path, seed: int, trials: int, steps: int, base_lr: float) -> dict:
    for arm, on in (("abort", True), ("none", False)):
        ws = make_workspace(base / f"seed{seed}-{arm}", cache, bench_recipe(steps, on, base_lr))
        run_study(ws, seed, trials)
    return seed_result(base, seed)


def seed_result(base: Path, seed: int) -> dict:
    """Both arms of one seed, compared: the same lrs, and what the stopped trials did when left to run."""
    out = {arm: study_result(base / f"seed{seed}-{arm}") for arm in ("abort", "none")}
    a, n = out["abort"], out["none"]
    out["same_proposals"] = a["lrs"][: len(n["lrs"])] == n["lrs"][: len(a["lrs"])]
    out["stopped_then"] = [v for va, v in zip(a["verdicts"], n["verdicts"]) if va == Verdict.PRUNED]
    out["stopped_confirmed"] = sum(
        c == Confirmation.CONFIRMED for va, c in zip(a["verdicts"], n["confirmations"]) if va == Verdict.PRUNED
    )
    return out


def warm_cache(cache: Path, steps: int) -> None:
    """Build the embedded base model once (not timed), so no study pays for it."""
    ws = make_workspace(Path(tempfile.mkdtemp(prefix="warm-")), cache, bench_recipe(steps, True))
    argv = [sys.executable, "-m", "autorl.cli", "-C", str(ws), "train", "recipes/bench.yaml", "--set", "steps=1"]
    # the base model's warm-up is no trial: on a loaded machine it takes longer than a trial's timeout_s
    subprocess.run([*argv, "--set", "timeout_s=1800"], check=True, capture_output=True)


def print_table(results: dict[int, dict]) -> None:
    head = (
        f"{'seed':>4} | {'best (abort)':>12} | {'best (none)':>11} | {'incumbent (abort / none)':>24} | "
        f"{'trial s (abort)':>15} | "
        f"{'trial s (none)':>14} | {'pruned':>6} | {'saving':>6} | {'sweep saving':>12} | same lrs | confirmed"
    )
    print(head)
    print("-" * len(head))
    for seed, r in results.items():
        a, n = r["abort"], r["none"]
        print(
            f"{seed:>4} | {a['best']:>12.4f} | {n['best']:>11.4f} | {_num(a['incumbent']):>11} / "
            f"{_num(n['incumbent']):<10} | {a['trial_s']:>15.1f} | {n['trial_s']:>14.1f} | "
            f"{a['pruned']:>6} | {_saving(a, n, 'trial_s'):>6.1%} | {_saving(a, n, 'sweep_s'):>12.1%} | "
            f"{r['same_proposals']} | {a['confirmed']} / {n['confirmed']}"
        )
    tot = {
        k: {arm: sum(r[arm][k] for r in results.values()) for arm in ("abort", "none")} for k in ("trial_s", "sweep_s")
    }
    same_best = sum(abs(r["abort"]["best"] - r["none"]["best"]) < 1e-9 for r in results.values())
    then = [v for r in results.values() for v in r["stopped_then"]]
    same_inc = sum(r["abort"]["incumbent"] == r["none"]["incumbent"] for r in results.values())
    print(
        f"total trial seconds: {tot['trial_s']['abort']:.1f} with early abort vs {tot['trial_s']['none']:.1f} without "
        f"({_saving(tot['trial_s']['abort'], tot['trial_s']['none']):.1%} saved; the searched trials alone, baseline "
        f"runs left out: {_saving(tot['sweep_s']['abort'], tot['sweep_s']['none']):.1%}); "
        f"same best objective in {same_best}/{len(results)} seeds, the same confirmed incumbent in "
        f"{same_inc}/{len(results)}"
    )
    confirmed = sum(r["stopped_confirmed"] for r in results.values())
    print(
        f"the {len(then)} stopped trials' verdicts when left to run (the arm without early abort): "
        + ", ".join(
            f"{k} {then.count(k)}"
            for k in (Verdict.IMPROVED, Verdict.FLAT, Verdict.REGRESSED, Verdict.CRASH)
            if k in then
        )
        + f"; confirmed {confirmed}"
    )
    for seed, r in results.items():
        print(f"seed {seed}: pruned by {r['abort']['by'] or '-'}; lrs {[f'{x:.2g}' for x in r['abort']['lrs']]}")


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _saving(a, n, key: str | None = None) -> float:
    """1 - time with early abort / time without (of two numbers, or of one key of two study results)."""
    a, n = (a[key], n[key]) if key else (a, n)
    return 1 - a / n if n else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--trials", type=int, default=20, help="--max-trials of every study (baseline runs included)")
    ap.add_argument("--steps", type=int, default=48, help="GRPO steps per trial")
    ap.add_argument("--keep", type=Path, help="Keep the workspaces in this folder (default: a temp folder, removed)")
    ap.add_argument("--base-lr", type=float, default=BASE_LR, help="The recipe's lr (the baseline's)")
    ap.add_argument("--report", type=Path, help="Print the table again from a --keep folder (runs nothing)")
    args = ap.parse_args()
    if args.report:
        missing = [
            str(d)
            for seed in args.seeds
            for arm in ("abort", "none")
            if not (d := args.report / f"seed{seed}-{arm}" / "ledger.sqlite").is_file()
        ]
        if missing:
            ap.error(
                f"--report {args.report}: no study ledger at {missing[0]}: give the --keep folder of a run "
                "and the seeds it ran (--seeds)"
            )
        print_table({seed: seed_result(args.report, seed) for seed in args.seeds})
        return
    tmp = tempfile.TemporaryDirectory(prefix="early-abort-")
    base = args.keep or Path(tmp.name)
    base.mkdir(parents=True, exist_ok=True)
    cache = base / "engine-cache"
    cache.mkdir(exist_ok=True)
    warm_cache(cache, args.steps)
    load0, t0 = os.getloadavg()[0], time.time()
    results = {seed: run_seed(base, cache, seed, args.trials, args.steps, args.base_lr) for seed in args.seeds}
    print_table(results)
    print(
        f"wall {time.time() - t0:.0f} s; 1-min load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end "
        f"on {os.cpu_count()} cores"
    )
    tmp.cleanup()


if __name__ == "__main__":
    main()
