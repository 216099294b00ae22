"""Does a change leave what a study decides untouched? One seeded study of the embedded default, run by two
checkouts of autorl, and their ledgers compared column by column.

    python benchmarks/same_ledger.py OLD_CHECKOUT NEW_CHECKOUT [--trials 12] [--seed 0]

Each checkout runs `autorl run --seed SEED --max-trials TRIALS --budget 60m` in a fresh workspace, with its own
package first on PYTHONPATH (the interpreter and the installed dependencies are this one's). What is compared is
every column a study decides: who proposed each trial and why, the values it ran, its seed, status, verdict,
objective, gain and interval, confirmation, crash triage, the hack gate, the error rates. What cannot be equal
is left out: times, durations, commit SHAs, paths, process and job ids, and the row revisions. The events'
kinds and messages are compared too (times left out, and durations inside a message read "N s"). It prints the
differences (none: "identical") and exits 1 when there are any.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

SECONDS = re.compile(r"\b\d+(\.\d+)? s\b")  # a duration inside an event's message ("exit 0 in 13.7 s")
NOT_DECIDED = {
    "id", "study_id", "start_sha", "end_sha", "started", "finished", "duration_s", "first_step", "log_path",
    "metrics_path", "pid", "job_id", "job_address", "rev",
}  # fmt: skip


def run_study(checkout: Path, root: Path, trials: int, seed: int) -> Path:
    """A fresh workspace under ``root`` and one seeded study in it, run by ``checkout``'s autorl."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "GIT_AUTHOR_DATE": "2026-01-01T00:00:00",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00"}  # fmt: skip
    ws = root / "ws"

    def cli(*args: str) -> None:
        r = subprocess.run([sys.executable, "-m", "autorl.cli", *args], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{checkout}: autorl {' '.join(args)} exited {r.returncode}: {r.stderr[-600:]}")

    cli("init", str(ws))
    cli("-C", str(ws), "run", "--seed", str(seed), "--max-trials", str(trials), "--budget", "60m", "--quiet")
    return ws / "ledger.sqlite"


def decided(ledger: Path) -> tuple[list[dict], list[tuple]]:
    """The trial columns a study decides, in attempt order, and its events' kinds and messages."""
    db = sqlite3.connect(ledger)
    db.row_factory = sqlite3.Row
    trials = [
        {k: row[k] for k in row.keys() if k not in NOT_DECIDED}
        for row in db.execute("SELECT * FROM autorl_trials ORDER BY number")
    ]
    events = [
        (r["kind"], SECONDS.sub("N s", r["message"] or ""))
        for r in db.execute("SELECT kind, message FROM autorl_events ORDER BY id")
    ]
    return trials, events


def differences(old: tuple[list[dict], list[tuple]], new: tuple[list[dict], list[tuple]]) -> list[str]:
    out = []
    if len(old[0]) != len(new[0]):
        out.append(f"trials: {len(old[0])} before, {len(new[0])} after")
    for a, b in zip(old[0], new[0]):
        out += [f"trial {a['number']:02d} {k}: {a[k]!r} -> {b.get(k)!r}" for k in a if a[k] != b.get(k)]
    if old[1] != new[1]:
        out.append(f"events differ: {len(old[1])} before, {len(new[1])} after")
        out += [f"  event {i}: {x!r} -> {y!r}" for i, (x, y) in enumerate(zip(old[1], new[1])) if x != y][:10]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [decided(run_study(c.resolve(), Path(tmp) / name, args.trials, args.seed))
                for name, c in (("old", args.old), ("new", args.new))]  # fmt: skip
    diff = differences(*rows)
    summary = {"trials": len(rows[1][0]), "events": len(rows[1][1]), "differences": len(diff)}
    print("\n".join(diff) if diff else "identical", json.dumps(summary), sep="\n")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
