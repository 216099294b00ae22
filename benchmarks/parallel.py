"""Trials per hour on this machine: `--parallel 1` vs `--parallel 2`, one torch thread per trial, same budget.

Both arms run the default recipe (shortened by --steps) with `--strategy random` and the
same seed, each in its own fresh workspace that shares one warmed-up base-model cache.
Counted: trials that finished inside the budget (complete, pruned or crash).

    python benchmarks/parallel.py [--budget 3m] [--steps 40] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from autorl.budget import parse_duration
from autorl.ledger import Ledger
from autorl.states import TrialStatus


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autorl.cli", *args], capture_output=True, text=True, cwd=cwd)


def arm(root: Path, cache: Path, parallel: int, budget: str, steps: int) -> dict:
    ws = root / f"ws-p{parallel}"
    assert cli("init", str(ws)).returncode == 0
    (ws / ".autorl").mkdir(exist_ok=True)
    os.symlink(cache, ws / ".autorl" / "cache")
    r = cli(
        "-C",
        str(ws),
        "run",
        "--budget",
        budget,
        "--parallel",
        str(parallel),
        "--strategy",
        "random",
        "--quiet",
        "--set",
        "threads=1",
        "--set",
        f"steps={steps}",
        "--set",
        "timeout_s=60",
    )
    assert r.returncode == 0, r.stderr
    rows = Ledger(ws / "ledger.sqlite").trials()
    done = [x for x in rows if x.status in (TrialStatus.COMPLETE, TrialStatus.PRUNED, TrialStatus.CRASH)]
    if not done:  # a budget too short (or a machine too loaded) for one trial to end
        return {"parallel": parallel, "trials_done": 0, "span_s": None, "trials_per_hour": 0.0}
    span = max(x.finished for x in done if x.finished) - min(x.started for x in rows if x.started)
    return {"parallel": parallel, "trials_done": len(done), "span_s": span, "trials_per_hour": len(done) / span * 3600}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="3m")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--cache", type=Path, help="a warmed-up engine cache to reuse (skips the base model's warm-up)")
    args = ap.parse_args()
    parse_duration(args.budget)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cache = root / "cache"
        if args.cache is not None:
            cache = args.cache.resolve()
        else:
            warm = cli(
                "train",
                str(Path(__file__).resolve().parents[1] / "recipes" / "default.yaml"),
                "--set",
                "steps=1",
                "--set",
                "threads=1",
                "--set",
                "timeout_s=1800",  # the base model's warm-up, not a trial: a loaded machine may take minutes
                cwd=root,
            )
            assert warm.returncode == 0, warm.stderr
            (root / ".autorl" / "cache").rename(cache)
        results = [arm(root, cache, p, args.budget, args.steps) for p in (1, 2)]
    one, two = results[0]["trials_per_hour"], results[1]["trials_per_hour"]
    results.append({"speedup": two / one if one else None})
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
