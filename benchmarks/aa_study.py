"""A/A study: trials that differ from the baseline only in the seed, judged with the default settings.

A real `autorl run --strategy random` on the embedded engine, in a fresh workspace: the default recipe
(recipes/default.yaml with its baseline repeats; one torch thread and a 900 s timeout so a loaded box does not
time runs out) with a search space holding only ``seed``. No trial is
better or worse than the baseline by construction, so every "improved" (candidate or confirmed),
"regressed" and pruned trial is a false call unless a hard rule names a cause. Prints the counts and,
for each such trial, its reason.

    python benchmarks/aa_study.py [--trials 30] [--keep DIR] [--cache DIR]
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

from autorl.data import shipped
from autorl.ledger import Ledger
from autorl.recipe import VerdictSettings
from autorl.states import Confirmation, Proposer, TrialStatus, Verdict


def aa_recipe() -> dict:
    recipe = yaml.safe_load(shipped("recipes", "default.yaml").read_text())
    recipe["name"] = "aa-seed-only"
    recipe["search"] = {"seed": {"low": 1, "high": 1_000_000, "int": True}}
    recipe["train"]["threads"] = 1  # speed only: two torch threads per run crawl on a loaded 2-core box
    recipe["timeout_s"] = 900  # the default 60 s killed a baseline at step 29 under load
    return recipe


def run(ws: Path, trials: int, cache: Path | None) -> None:
    subprocess.run([sys.executable, "-m", "autorl.cli", "init", str(ws)], check=True, capture_output=True)
    (ws / "recipes" / "aa.yaml").write_text(yaml.safe_dump(aa_recipe(), sort_keys=False))
    if cache is not None:  # reuse a built engine cache (the base model's warm-up)
        (ws / ".autorl").mkdir(exist_ok=True)
        os.symlink(cache.resolve(), ws / ".autorl" / "cache")
    argv = [
        sys.executable,
        "-m",
        "autorl.cli",
        "-C",
        str(ws),
        "run",
        "recipes/aa.yaml",
        "--strategy",
        "random",
        "--max-trials",
        str(trials),
        "--budget",
        "6h",
        "--quiet",
    ]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"study failed (exit {r.returncode}): {r.stderr.strip()[-500:]}")


def report(ws: Path) -> None:
    rows = Ledger(ws / "ledger.sqlite").trials()
    trials = [r for r in rows if r.proposer not in (Proposer.BASELINE, Proposer.CONFIRM)]
    count = lambda f: sum(1 for r in trials if f(r))  # noqa: E731
    print(
        f"baseline runs {sum(r.proposer == Proposer.BASELINE for r in rows)}, trials {len(trials)}, "
        f"confirmation runs {sum(r.proposer == Proposer.CONFIRM for r in rows)}"
    )
    print(
        f"improved (candidate, any outcome) {count(lambda r: r.verdict == Verdict.IMPROVED)}; "
        f"confirmed {count(lambda r: r.confirmation == Confirmation.CONFIRMED)}; "
        f"regressed {count(lambda r: r.verdict == Verdict.REGRESSED)}; "
        f"flat {count(lambda r: r.verdict == Verdict.FLAT)}; "
        f"pruned {count(lambda r: r.status == TrialStatus.PRUNED)}; crash {count(lambda r: r.verdict == Verdict.CRASH)}"
    )
    for r in trials:
        if r.verdict in (Verdict.IMPROVED, Verdict.REGRESSED, Verdict.PRUNED, Verdict.CRASH):
            print(f"  {r.attempt}: {r.verdict} {r.confirmation or ''} {(r.reason or '')[:240]}")
    deltas = [r.delta for r in trials if r.delta is not None]
    if deltas:
        print(
            f"gain vs baseline over {len(deltas)} trials: mean {sum(deltas) / len(deltas):+.4f}, "
            f"min {min(deltas):+.4f}, max {max(deltas):+.4f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=30, help="trials besides the baseline runs and confirmations")
    ap.add_argument("--keep", type=Path, help="keep the workspace here (default: a temp folder)")
    ap.add_argument("--cache", type=Path, help="an engine cache to reuse (skips the base model's warm-up)")
    args = ap.parse_args()
    ws = args.keep or Path(tempfile.mkdtemp(prefix="aa-study-"))
    t0, load0 = time.time(), os.getloadavg()[0]
    repeats = VerdictSettings(**(aa_recipe().get("verdict") or {})).baseline_repeats
    run(ws, args.trials + repeats, args.cache)
    report(ws)
    print(f"wall {time.time() - t0:.0f} s; load {load0:.1f} -> {os.getloadavg()[0]:.1f}; workspace {ws}")


if __name__ == "__main__":
    main()
