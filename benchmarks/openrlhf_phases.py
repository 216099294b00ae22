"""Where each OpenRLHF trial of a workspace spent its time (autorl/backends/openrlhf/phases.py), as a table.

    python benchmarks/openrlhf_phases.py WORKSPACE [--last N]     # trials of the workspace's ledger
    python benchmarks/openrlhf_phases.py --log RUN_DIR/train.log --started T --seconds S   # one run

Each trial's run folder holds the job log and its arrival-time sidecar; the ledger holds when the trial started
and finished on the controller's clock. A trial of a warm pool is labelled with its place in the pool (``w0`` built
the pool; ``w1`` and on came after a reset), so the two kinds read apart.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autorl.backends.openrlhf.phases import phases, read_times, table  # noqa: E402


def one(log: Path, started: float, ended: float) -> dict[str, float]:
    return phases(log.read_text(errors="replace"), read_times(str(log) + ".times"), started, ended)


def from_workspace(ws: Path, last: int | None) -> dict[str, dict[str, float]]:
    with sqlite3.connect(f"file:{ws / 'ledger.sqlite'}?mode=ro", uri=True) as db:
        columns = {r[1] for r in db.execute("PRAGMA table_info(autorl_trials)")}
        warm = "warm_index" if "warm_index" in columns else "NULL"  # a ledger from before warm pools
        rows = db.execute(
            f"SELECT number, attempt, started, finished, {warm} FROM autorl_trials "
            "WHERE started IS NOT NULL AND finished IS NOT NULL ORDER BY number"
        ).fetchall()
    out = {}
    for number, attempt, started, finished, index in rows[-last:] if last else rows:
        log = ws / ".autorl" / "runs" / attempt / "train.log"
        if log.is_file() and (got := one(log, started, finished)):
            # a warm pool's first trial (w0) pays the start-up; the later ones (w1, w2 ...) do not
            out[f"{number:02d}" + (f" w{index}" if index is not None else "")] = got
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("workspace", nargs="?")
    p.add_argument("--last", type=int)
    p.add_argument("--log")
    p.add_argument("--started", type=float)
    p.add_argument("--seconds", type=float)
    args = p.parse_args()
    if args.log:
        rows = {Path(args.log).parent.name: one(Path(args.log), args.started, args.started + args.seconds)}
    elif args.workspace:
        rows = from_workspace(Path(args.workspace), args.last)
    else:
        p.error("give a workspace or --log with --started and --seconds")
    if not rows:
        print("no trial with a job log and its arrival times", file=sys.stderr)
        return 2
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
