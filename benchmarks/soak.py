"""The soak: one long study of very short trials, watched from outside while it runs.

`autorl run --budget 24h` runs for a day. What must not grow faster than the work does: the controller's memory,
its time per trial, the ledger's size, and the time of the review commands a person runs on the grown ledger;
and nothing may leak: file descriptors, worktrees, processes, Optuna trials left RUNNING.

The trials run on the ``command`` backend: a Python script that writes what a short embedded-engine trial writes
(40 step lines of a dozen metrics, an eval every 10 steps with 64 per-item results) and exits, so a trial costs
the controller's whole path (worktree, branch, tags, Optuna ask/tell with TPE, ledger rows, the verdict, clean-up)
and almost nothing else. A row's ``s/trial`` is the wall time between two checkpoints over the trials finished
between them (the review commands run meanwhile, on the same machine); ``trial's own s`` is a trial's start to its
end as the ledger records it; ``overhead`` is the difference: what the controller spends between trials. The
embedded engine cannot be made that short: every trial is a child that imports torch
and builds its model (about six seconds of a two-core machine), which would give a few hundred trials an hour.

Every ``--sample-s`` seconds the controller's resident memory, open descriptors and live child processes, the
number of finished trials, the ledger's bytes on disk (with its write-ahead log) and the worktrees on disk are
recorded. Each time the finished trials pass a checkpoint (50, 100, 250, 500, then every 500) the review
commands ``autorl ledger``, ``autorl show N``, ``autorl status`` and ``autorl report`` are timed on the live
ledger (their memory is ``wait4``'s peak).

    python benchmarks/soak.py --minutes 60               # as many trials as fit in an hour
    python benchmarks/soak.py --trials 300 --minutes 30  # whichever bound comes first
    python benchmarks/soak.py --minutes 60 --json soak.json --keep /tmp/soak-ws
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRIAL = """import json, random, sys
out, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
with open(out, "w") as fh:
    for step in range(1, 41):
        row = {"type": "step", "step": step, "reward_mean": rng.random(), "reward_std": rng.random(),
               "loss": rng.random(), "kl": rng.random() * 0.01, "entropy": 1 + rng.random(), "grad_norm": rng.random(),
               "clip_frac": rng.random() * 0.1, "lr": 1e-3, "gen_len": 5.0, "tokens_per_s": 1e4 * rng.random(),
               "step_s": 0.01}
        fh.write(json.dumps(row) + "\\n")
        if step % 10 == 0:
            items = [int(rng.random() < 0.5) for _ in range(64)]
            fh.write(json.dumps({"type": "eval", "step": step, "eval/id/greedy_pass@1": sum(items) / 64,
                                 "eval/id/items": items}) + "\\n")
"""

RECIPE = """name: soak
backend: command
train:
  argv: ["{python}", "trial.py", "{{run_dir}}/metrics.jsonl", "{{seed}}"]
  lr: 0.001
  eps_clip: 0.2
  seed: 0
search:
  lr: {{low: 1.0e-5, high: 1.0e-1, log: true}}
  eps_clip: {{low: 0.05, high: 0.4}}
verdict: {{baseline_repeats: 2}}
timeout_s: 60
"""

REVIEW = {"ledger": ["ledger"], "show": ["show", "{n}"], "status": ["status"], "report": ["report", "--out", "{out}"]}


def git(ws: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "s",
        "GIT_AUTHOR_EMAIL": "s@s",
        "GIT_COMMITTER_NAME": "s",
        "GIT_COMMITTER_EMAIL": "s@s",
    }
    return subprocess.run(["git", *args], cwd=ws, capture_output=True, text=True, check=True, env=env).stdout


def make_workspace(root: Path) -> Path:
    ws = root / "ws"
    subprocess.run([sys.executable, "-m", "autorl.cli", "init", str(ws)], check=True, capture_output=True)
    (ws / "trial.py").write_text(TRIAL)
    (ws / "recipes" / "soak.yaml").write_text(RECIPE.format(python=sys.executable))
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "the soak's trial and recipe")
    return ws


# ---- what is measured -------------------------------------------------------------------------------------------
def rss_mib(pid: int) -> float:
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0.0
    return int(line.split()[1]) / 1024


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def descendants(pid: int) -> list[int]:
    """Live (not zombie) processes below ``pid``."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                parent[int(d.name)] = int(fields[1])
    out, frontier = [], {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier}
        out += sorted(frontier)
    return out


def naming(path: Path) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if str(path) in cmd and state != "Z":
                found.append(int(d.name))
    return found


def query(ws: Path, sql: str) -> list[tuple]:
    path = ws / "ledger.sqlite"
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def finished(ws: Path) -> tuple[int, int | None, float]:
    """Finished trials, the last one's number, and their seconds as the ledger records them (a trial's start to its
    end: its child process and the controller watching it) summed."""
    rows = query(
        ws, "SELECT count(*), max(number), sum(finished - started) FROM autorl_trials WHERE status != 'running'"
    )
    return (rows[0][0] or 0, rows[0][1], rows[0][2] or 0.0) if rows else (0, None, 0.0)


def ledger_mib(ws: Path) -> float:
    return sum(p.stat().st_size for p in ws.glob("ledger.sqlite*") if p.is_file()) / 2**20


def worktrees(ws: Path) -> int:
    d = ws / ".autorl" / "worktrees"
    return len(list(d.iterdir())) if d.is_dir() else 0


def timed(ws: Path, args: list[str]) -> tuple[float, float, int]:
    """Seconds, peak MiB and exit code of one `autorl` command."""
    t0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "autorl.cli", "-C", str(ws), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.time() - t0, usage.ru_maxrss / 1024, proc.returncode


def review(ws: Path, n: int | None, out: Path) -> dict:
    got = {}
    for name, args in REVIEW.items():
        if name == "show" and n is None:
            continue
        s, mib, code = timed(ws, [a.format(n=n, out=out) for a in args])
        got[name] = {"s": round(s, 2), "mib": round(mib), "exit": code}
    return got


# ---- the soak ---------------------------------------------------------------------------------------------------
def checkpoints(limit: int) -> list[int]:
    marks = [50, 100, 250, 500] + list(range(1000, limit + 1, 500))
    return [m for m in marks if m <= limit]


def soak(ws: Path, minutes: float, trials: int, sample_s: float) -> dict:
    argv = [
        sys.executable,
        "-m",
        "autorl.cli",
        "-C",
        str(ws),
        "run",
        "recipes/soak.yaml",
        "--strategy",
        "optuna",
        "--study",
        "soak",
        "--budget",
        f"{minutes:g}m",
        "--max-trials",
        str(trials),
        "--quiet",
    ]
    log = open(ws.parent / "controller.log", "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    t0, samples, rows, marks = time.time(), [], [], checkpoints(trials)
    last = {"t": t0, "n": 0, "child_s": 0.0}
    while proc.poll() is None:
        time.sleep(sample_s)
        if proc.poll() is not None:  # a sample of a process that has ended measures nothing
            break
        n, number, child_s = finished(ws)
        s = {
            "t": round(time.time() - t0, 1),
            "trials": n,
            "rss_mib": round(rss_mib(proc.pid), 1),
            "fds": open_fds(proc.pid),
            "children": len(descendants(proc.pid)),
            "ledger_mib": round(ledger_mib(ws), 2),
            "worktrees": worktrees(ws),
        }
        samples.append(s)
        if marks and n >= marks[0]:
            while marks and n >= marks[0]:
                marks.pop(0)
            now = t0 + s["t"]  # the window runs from one checkpoint's sample to the next (reviews included)
            window = (now - last["t"]) / max(n - last["n"], 1)
            own = (child_s - last["child_s"]) / max(n - last["n"], 1)
            rows.append(
                {
                    **s,
                    "s_per_trial": round(window, 3),
                    "trial_s": round(own, 3),
                    "trial_s_sum": child_s,
                    "review": review(ws, number, ws.parent / f"report-{n}"),
                }
            )
            last = {"t": now, "n": n, "child_s": child_s}
            print(json.dumps(rows[-1]), flush=True)
    log.close()
    return {"exit": proc.returncode, "wall_s": round(time.time() - t0, 1), "samples": samples, "rows": rows}


def leaks(ws: Path) -> dict:
    """What the study left once its controller ended."""
    time.sleep(2)
    listed = git(ws, "worktree", "list", "--porcelain").count("worktree ") - 1  # the main working tree is one
    return {
        "optuna_running": (query(ws, "SELECT count(*) FROM trials WHERE state = 'RUNNING'") or [(None,)])[0][0],
        "autorl_running": (query(ws, "SELECT count(*) FROM autorl_trials WHERE status = 'running'") or [(None,)])[0][0],
        "worktree_dirs": worktrees(ws),
        "git_worktrees": listed,
        "processes": len(naming(ws)),
        "refs": len(git(ws, "for-each-ref").splitlines()),
        "integrity": (query(ws, "PRAGMA quick_check") or [("?",)])[0][0],
    }


def table(result: dict) -> str:
    head = (
        "| trials | min | s/trial | trial's own s | overhead s | controller MiB | fds | ledger MiB | `ledger` s | "
        "`show` s | `status` s | `report` s |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    out = [head]
    for r in result["rows"]:
        v = r["review"]
        out.append(
            f"| {r['trials']} | {r['t'] / 60:.1f} | {r['s_per_trial']:.3f} | {r['trial_s']:.3f} | "
            f"{r['s_per_trial'] - r['trial_s']:.3f} | "
            f"{r['rss_mib']:.0f} | {r['fds']} | {r['ledger_mib']:.1f} | {v['ledger']['s']:.2f} | "
            f"{v.get('show', {}).get('s', float('nan')):.2f} | {v['status']['s']:.2f} | {v['report']['s']:.2f} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="the study's budget (default 60)")
    ap.add_argument("--trials", type=int, default=100_000, help="stop after this many trials")
    ap.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--json", default=None, help="write every sample and row here")
    ap.add_argument("--keep", default=None, help="keep the workspace: copy it here at the end")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        ws = make_workspace(Path(tmp))
        result = soak(ws, args.minutes, args.trials, args.sample_s)
        result["leaks"] = leaks(ws)
        result["final"] = {
            "trials": finished(ws)[0],
            "ledger_mib": round(ledger_mib(ws), 2),
            "review": review(ws, finished(ws)[1], Path(tmp) / "report-final"),
        }
        result["controller_tail"] = (Path(tmp) / "controller.log").read_text(errors="replace")[-2000:]
        if args.keep:
            shutil.copytree(ws, args.keep, symlinks=True)
    print(table(result))
    print(json.dumps({k: result[k] for k in ("exit", "wall_s", "leaks", "final")}, indent=1))
    peak = max((s["rss_mib"] for s in result["samples"]), default=0)
    print(
        f"controller peak RSS {peak:.0f} MiB; "
        f"fds first/last {result['samples'][0]['fds'] if result['samples'] else '?'}"
        f"/{result['samples'][-1]['fds'] if result['samples'] else '?'}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    main()
