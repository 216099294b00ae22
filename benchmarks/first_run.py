"""A new user's first study: `autorl init`, then `autorl run --budget 10m` on the embedded default.

Reports, per search seed: trials, verdict counts, how many trials were judged improved and how many of those
the confirmation accepted, the best gain, and how much of the budget the study used (controller start to exit,
and first trial opened to last trial judged).

    python benchmarks/first_run.py --seed 0                 # one study, 10 minutes
    python benchmarks/first_run.py --seed 0 1 2 3 4         # the five-seed figure
    python benchmarks/first_run.py --seed 0 --budget 3m     # a quick check
    python benchmarks/first_run.py --seed 0 --cache DIR     # reuse a warmed-up engine cache (skips the warm-up)
    python benchmarks/first_run.py --seed 0 --budget 5m --set steps=8 --set eval_every=4   # budget use, short trials

The warm-up of the built-in base model happens before the first trial and is not charged to any trial;
with --cache it is skipped, as on a user's second study.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autorl.ledger import Ledger, Trial
from autorl.states import Confirmation, Kind, Verdict


def cli(ws: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autorl.cli", "-C", str(ws), *args], capture_output=True, text=True)


def one_study(seed: int, budget: str, root: Path, cache: Path | None, sets: list[str]) -> dict:
    ws = root / f"seed{seed}"
    r = cli(root, "init", str(ws))
    if r.returncode:
        raise SystemExit(r.stderr)
    if cache is not None:
        (ws / ".autorl").mkdir(exist_ok=True)
        os.symlink(cache.resolve(), ws / ".autorl" / "cache")
    t0 = time.time()
    r = cli(ws, "run", "--budget", budget, "--seed", str(seed), "--quiet", *[x for kv in sets for x in ("--set", kv)])
    wall = time.time() - t0
    if r.returncode:
        raise SystemExit(f"seed {seed}: exit {r.returncode}: {r.stderr.strip()}")
    return summarize(ws, seed, wall)


def summarize(ws: Path, seed: int, wall: float) -> dict:
    ledger = Ledger(ws / "ledger.sqlite")
    trials = ledger.trials(kind=Kind.TRIAL)
    study = ledger.study()
    counts: dict[str, int] = {}
    for t in trials:
        key = str(t.verdict or t.status)
        counts[key] = counts.get(key, 0) + 1
    improved = [t for t in trials if t.verdict == Verdict.IMPROVED]
    confirmed = sum(t.confirmation == Confirmation.CONFIRMED for t in improved)  # a candidate is not confirmed yet
    starts = [t.started for t in trials if t.started]
    ends = [t.finished for t in trials if t.finished]
    best = max(improved, key=lambda t: t.ci_low or 0.0, default=None)
    budget_s = study.budget_s or 0.0
    return {
        "seed": seed,
        "trials": len(trials),
        "counts": counts,
        "improved": len(improved),
        "confirmed": confirmed,
        "best": None
        if best is None
        else {
            "attempt": best.attempt,
            "delta": best.delta,
            "changed": best.changed or {},
            "ci": [best.ci_low, best.ci_high],
        },
        "budget_s": budget_s,
        "wall_s": round(wall, 1),
        "trials_span_s": round(max(ends) - min(starts), 1) if starts and ends else 0.0,
        "used": round(wall / budget_s, 3) if budget_s else 0.0,
        "first_confirmed_s": _first_confirmed_s(trials, starts),
        "workspace": str(ws),
    }


def _first_confirmed_s(trials: list[Trial], starts: list[float]) -> float | None:
    """Seconds from the first trial's start until the first improvement was confirmed (its last re-run ended)."""
    ends = [
        max([t.finished for t in trials if t.confirms == c.number and t.finished], default=0)
        for c in trials
        if c.confirmation == Confirmation.CONFIRMED
    ]
    ends = [e for e in ends if e]
    return round(min(ends) - min(starts), 1) if ends and starts else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, nargs="+", default=[0], help="Search seeds (one study each).")
    ap.add_argument("--budget", default="10m", help="Budget of each study (default 10m).")
    ap.add_argument("--cache", type=Path, help="A warmed-up engine cache to reuse.")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Passed to `autorl run --set` (e.g. steps=8 for a machine too loaded for the default).",
    )
    ap.add_argument("--out", type=Path, help="Write the results as JSON here.")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="autorl-first-run-"))
    results = []
    for seed in args.seed:
        res = one_study(seed, args.budget, root, args.cache, args.set)
        results.append(res)
        print(
            f"seed {seed}: {res['trials']} trials {res['counts']}; {res['improved']} improved, "
            f"{res['confirmed']} confirmed; "
            f"best {res['best']}; first confirmed after {res['first_confirmed_s']} s; "
            f"budget used {res['used']:.0%} ({res['wall_s']} s of {res['budget_s']:.0f} s)",
            flush=True,
        )
    hits = sum(r["improved"] > 0 for r in results)
    confirmed = sum(bool(r["confirmed"]) for r in results)
    print(f"studies with an improvement: {hits} of {len(results)}; with a confirmed one: {confirmed}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
