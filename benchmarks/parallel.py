"""Trials per hour on this machine: `--parallel 1` vs `--parallel 2`, one torch thread per trial, same budget.

Both arms run the default recipe (shortened by --steps) with `--strategy random` and the
same seed, each in its own fresh workspace that shares one warmed-up base-model cache.
Counted: trials that finished inside the budget (complete, pruned or crash).

    python benchmarks/parallel.py [--budget 3m] [--steps 40]
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
    done = [x for x in rows if x["status"] in ("complete", "pruned", "crash")]
    span = max(x["finished"] for x in done) - min(x["started"] for x in rows)
    return {"parallel": parallel, "trials_done": len(done), "span_s": span, "trials_per_hour": len(done) / span * 3600}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="3m")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    parse_duration(args.budget)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cache = root / "cache"
        warm = cli(
            "train",
            str(Path(__file__).resolve().parents[1] / "recipes" / "default.yaml"),
            "--set",
            "steps=1",
            "--set",
            "threads=1",
            cwd=root,
        )
        assert warm.returncode == 0, warm.stderr
        (root / ".autorl" / "cache").rename(cache)
        results = [arm(root, cache, p, args.budget, args.steps) for p in (1, 2)]
    results.append({"speedup": results[1]["trials_per_hour"] / results[0]["trials_per_hour"]})
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
