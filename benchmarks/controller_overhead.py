"""Controller overhead per trial, and `autorl ledger` speed, with a backend that does nothing.

Each trial runs a command that only writes one eval line (so the whole path — worktree,
branch, commits, tags, Optuna ask/tell, ledger writes, verdict, results commit, cleanup —
is exercised). Overhead = the controller's time per trial minus the child's own wall time
(as the child measures it, so the child interpreter's start-up counts as overhead).
Measured twice: in a fresh workspace, and with 1,000 trials already in the ledger (and
1,000 attempt refs in git). Then `autorl ledger --json` over those 1,000+ trials, and a
check that it imports no torch.

    python benchmarks/controller_overhead.py [--trials 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autorl.ledger import Ledger
from autorl.states import Proposer, TrialStatus, Verdict

NOOP = """import json, sys, random, time
t0 = time.time()
random.seed(int(sys.argv[2]))
items = [random.random() < 0.5 for _ in range(200)]
with open(sys.argv[1], "w") as fh:
    fh.write(json.dumps({"type": "step", "step": 1, "reward_mean": 0.5}) + "\\n")
    fh.write(json.dumps({"type": "eval", "step": 1, "eval/id/greedy_pass@1": sum(items) / 200,
                         "eval/id/items": [int(x) for x in items]}) + "\\n")
    fh.write(json.dumps({"type": "summary", "wall_s": time.time() - t0}) + "\\n")
"""

RECIPE = """name: noop
backend: command
train:
  argv: ["{python}", "noop.py", "{{run_dir}}/metrics.jsonl", "{{seed}}"]
  lr: 0.001
  seed: 0
search:
  lr: {{low: 1.0e-5, high: 1.0e-1, log: true}}
verdict: {{baseline_repeats: 1, bootstrap: 200}}
timeout_s: 30
"""


def cli(ws: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autorl.cli", "-C", str(ws), *args], capture_output=True, text=True)


def make_workspace(root: Path) -> Path:
    ws = root / "ws"
    assert cli(root, "init", str(ws)).returncode == 0
    (ws / "noop.py").write_text(NOOP)
    (ws / "recipes" / "noop.yaml").write_text(RECIPE.format(python=sys.executable))
    subprocess.run(["git", "add", "-A"], cwd=ws, check=True)
    subprocess.run(["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "noop"], cwd=ws, check=True)
    return ws


def study(ws: Path, trials: int) -> dict:
    t0 = time.perf_counter()
    r = cli(
        ws, "run", "recipes/noop.yaml", "--strategy", "optuna", "--max-trials", str(trials), "--budget", "1h", "--quiet"
    )
    wall = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr
    child = sum(child_walls(ws, trials))
    return {"trials": trials, "wall_s": wall, "child_s": child, "overhead_per_trial_s": (wall - child) / trials}


def child_walls(ws: Path, trials: int) -> list[float]:
    """The noop child's own wall time per trial (from its summary line), last ``trials`` trials."""
    led = Ledger(ws / "ledger.sqlite")
    rows = led.trials()[-trials:]
    return [next((m["wall_s"] for m in led.metrics(r.id) if m.get("type") == "summary"), 0.0) for r in rows]


def per_trial_overheads(ws: Path, trials: int) -> list[float]:
    """Per-trial overhead from the ledger: gap between consecutive trial ends minus the child's time."""
    rows = json.loads(cli(ws, "ledger", "--json", "--last", str(trials)).stdout)
    led = Ledger(ws / "ledger.sqlite")
    full = [led.trial(r["number"]) for r in rows]
    walls = child_walls(ws, trials)
    return [b.finished - a.finished - w for a, b, w in zip(full, full[1:], walls[1:])]


def fill_ledger(ws: Path, n: int) -> None:
    """n synthetic finished trials (rows, metrics and attempt refs), as a long study leaves behind."""
    led = Ledger(ws / "ledger.sqlite")
    sid = led.create_study(
        name="old-study",
        recipe_path="recipes/noop.yaml",
        recipe="",
        base_sha="",
        strategy="optuna",
        budget_s=0,
        optuna_study="old-study",
    )
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ws, capture_output=True, text=True).stdout.strip()
    refs = []
    for i in range(1, n + 1):
        tid = led.add_trial(
            study_id=sid,
            number=i,
            attempt=f"attempt-{i:02d}-old",
            branch=f"attempt-{i:02d}-old",
            proposer=Proposer.OPTUNA,
            params={"lr": 1e-3},
            changed={"lr": 1e-3},
            started=time.time(),
        )
        led.add_metrics(tid, [{"type": "step", "step": s, "reward_mean": 0.5} for s in range(1, 21)])
        led.update_trial(
            tid,
            status=TrialStatus.COMPLETE,
            verdict=Verdict.FLAT,
            objective=0.5,
            delta=0.0,
            duration_s=1.0,
            finished=time.time(),
        )
        refs.append(f"create refs/heads/attempt-{i:02d}-old {head}\n")
    subprocess.run(["git", "update-ref", "--stdin"], cwd=ws, input="".join(refs), text=True, check=True)


def ledger_speed(ws: Path) -> dict:
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        r = cli(ws, "ledger", "--json")
        times.append(time.perf_counter() - t0)
    rows = len(json.loads(r.stdout))
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, autorl.cli as c; c.main(['-C', sys.argv[1], 'ledger', '--json']);"
            " print('TORCH', 'torch' in sys.modules, file=sys.stderr)",
            str(ws),
        ],
        capture_output=True,
        text=True,
    )
    return {
        "rows": rows,
        "median_s": statistics.median(times),
        "max_s": max(times),
        "imports_torch": "TORCH True" in probe.stderr,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ws = make_workspace(Path(tmp))
        fresh = study(ws, args.trials)
        fresh["median_gap_s"] = statistics.median(per_trial_overheads(ws, args.trials))
    with tempfile.TemporaryDirectory() as tmp:
        ws = make_workspace(Path(tmp))
        fill_ledger(ws, 1000)
        big = study(ws, args.trials)
        big["median_gap_s"] = statistics.median(per_trial_overheads(ws, args.trials))
        speed = ledger_speed(ws)
    print(json.dumps({"fresh": fresh, "with_1000_trials": big, "ledger_command": speed}, indent=1))


if __name__ == "__main__":
    main()
