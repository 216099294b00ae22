"""The fault soak: one long study of short trials on the command backend, with faults injected at random, resumed
after each, watched from outside.

`benchmarks/soak.py` measures a study left alone; `benchmarks/reliability.py` hits one fault each on a fresh
study. This one runs for hours on the same study while faults arrive at random intervals (exponential, mean
``--mean-fault-s``, the first after a minute), each one of:

- ``kill-trial``: SIGKILL of a running trial's process (the trial must end as a crash and the study go on);
- ``kill-controller``: SIGKILL of the controller, then ``autorl run --resume`` at once;
- ``term-controller``: SIGTERM of the controller (a scheduler's polite stop), then ``--resume``;
- ``disk-full``: the workspace's file system filled for ``--disk-full-s`` seconds (a tmpfs the soak mounts;
  inside a private mount namespace when not run as root), then freed; a controller that stopped on it is resumed.

A controller that exits on its own (no fault of ours) is counted as ``unplanned`` and resumed. Every
``--sample-s`` seconds the live controller's memory, descriptors and children, the finished trials and the
ledger's size are recorded; every ``--window-min`` minutes a row of the table: trials in the window, wall seconds
per trial, the trials' own seconds (start to end in the ledger) and the difference, the controller's overhead.
At the end the controller is interrupted (SIGINT) and the study is checked as `reliability.py` checks a fault:
trials lost (a start tag with no finished row), duplicates (numbers, branches or Optuna trials twice), processes
left naming the workspace, Optuna trials left RUNNING, rows left running, the ledger's integrity check, and
whether ``autorl ledger`` and ``autorl status`` still read it in one go.

    python benchmarks/fault_soak.py --minutes 180 --json fault-soak.json
    python benchmarks/fault_soak.py --minutes 20 --mean-fault-s 60      # a short run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability as rel  # noqa: E402  (beside this file: workspace, ledger and process helpers)
import soak as plain  # noqa: E402  (beside this file: a process's memory, descriptors and children)

RECIPE = """name: fault-soak
backend: command
train:
  argv: ["{python}", "trial.py", "{{run_dir}}/metrics.jsonl", "{{seconds}}", "{{seed}}"]
  seconds: {seconds}
  lr: 0.001
  seed: 0
search:
  lr: {{low: 1.0e-5, high: 1.0e-1, log: true}}
verdict: {{baseline_repeats: 2}}
abort: {{silence_s: 60}}
timeout_s: 120
"""

FAULTS = ("kill-trial", "kill-controller", "term-controller", "disk-full")


class Soak:
    def __init__(self, root: Path, args: argparse.Namespace):
        self.root, self.args = root, args
        self.mnt = root / "mnt"
        self.ws = self.mnt / "ws"
        self.rng = random.Random(args.seed)
        self.proc: subprocess.Popen | None = None
        self.log = open(root / "controller.log", "a")
        self.events: list[dict] = []
        self.samples: list[dict] = []
        self.starts = 0
        self.t0 = time.time()

    # ---- the controller -----------------------------------------------------------------------------------
    def start(self, resume: bool) -> None:
        tail = ["--resume"] if resume else ["recipes/soak.yaml", "--strategy", "optuna", "--budget", "24h"]
        argv = [sys.executable, "-m", "autorl.cli", "-C", str(self.ws), "run", *tail, "--study", "soak"]
        argv += ["--parallel", str(self.args.parallel), "--quiet"]
        self.log.write(f"== {self.now():.0f} s: {'resume' if resume else 'start'}\n")
        self.log.flush()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1

    def wait_exit(self, timeout: float = 120.0) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def now(self) -> float:
        return time.time() - self.t0

    def event(self, kind: str, **kw) -> None:
        e = {"t": round(self.now(), 1), "fault": kind, **kw}
        self.events.append(e)
        print(json.dumps(e), flush=True)

    # ---- the faults ---------------------------------------------------------------------------------------
    def kill_trial(self) -> None:
        running = [t for t in rel.trials(self.ws) if t["status"] == "running" and t["pid"]]
        if not running:
            self.event("kill-trial", note="no trial running")
            return
        t = self.rng.choice(running)
        try:
            os.kill(t["pid"], signal.SIGKILL)
            self.event("kill-trial", trial=t["number"])
        except ProcessLookupError:
            self.event("kill-trial", trial=t["number"], note="already gone")

    def stop_controller(self, sig: int, kind: str) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.wait_exit()
        if code is None:  # a polite stop that did not stop: not what the fault tests, so end it
            self.proc.kill()
            code = self.proc.wait()
            self.event(kind, exit=code, note="did not stop in 120 s: killed")
        else:
            self.event(kind, exit=code)
        self.start(resume=True)

    def disk_full(self) -> None:
        assert self.proc is not None
        t0 = time.time()
        filler = rel._fill(self.mnt)
        time.sleep(self.args.disk_full_s)
        code = self.proc.poll()
        line = _last_line(self.root / "controller.log")
        filler.unlink()
        self.event("disk-full", exit=code, held_s=round(time.time() - t0, 1), last_line=line if code else None)
        if code is not None:
            self.start(resume=True)

    # ---- measuring ----------------------------------------------------------------------------------------
    def sample(self) -> None:
        pid = self.proc.pid if self.proc else 0
        n, _, own = _finished(self.ws)
        self.samples.append(
            {
                "t": round(self.now(), 1),
                "trials": n,
                "trial_s_sum": round(own, 1),
                "rss_mib": round(plain.rss_mib(pid), 1),
                "fds": plain.open_fds(pid),
                "children": len(plain.descendants(pid)) if pid else 0,
                "ledger_mib": round(sum(p.stat().st_size for p in self.ws.glob("ledger.sqlite*")) / 2**20, 2),
            }
        )

    def run(self) -> dict:
        self.start(resume=False)
        end = self.t0 + self.args.minutes * 60
        next_fault = time.time() + 60
        next_sample = time.time()
        while time.time() < end:
            time.sleep(1)
            if self.proc is not None and self.proc.poll() is not None:  # it stopped with no fault of ours
                self.event("unplanned", exit=self.proc.returncode, last_line=_last_line(self.root / "controller.log"))
                self.start(resume=True)
            if time.time() >= next_sample:
                self.sample()
                next_sample += self.args.sample_s
            if time.time() >= next_fault:
                kind = self.rng.choice(self.args.faults)
                {"kill-trial": self.kill_trial, "disk-full": self.disk_full}.get(
                    kind, lambda k=kind: self.stop_controller(_SIGNALS[k], k)
                )()
                next_fault = time.time() + max(10.0, self.rng.expovariate(1 / self.args.mean_fault_s))
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        final_exit = self.wait_exit(300)
        self.sample()
        return {"final_exit": final_exit, "wall_s": round(self.now(), 1), **self.checks()}

    def checks(self) -> dict:
        lost, dup = rel.lost_and_dup(self.ws)
        reads = {}
        for cmd in (["ledger"], ["status"]):  # output to a file: a pipe read only at exit would fill and block
            t0 = time.time()
            with open(self.root / f"{cmd[0]}.out", "w") as out:
                d = subprocess.run(
                    [sys.executable, "-m", "autorl.cli", "-C", str(self.ws), *cmd],
                    stdout=out,
                    stderr=subprocess.PIPE,
                    text=True,
                    timeout=600,
                )
            lines = rel.stderr_lines(d.stderr)
            reads[cmd[0]] = {"exit": d.returncode, "lines_on_stderr": len(lines), "s": round(time.time() - t0, 1)}
        return {
            "trials": _finished(self.ws)[0],
            "lost": lost,
            "dup": dup,
            "orphans": rel.orphans(self.ws, grace_s=10.0),
            "optuna_running": _one(self.ws, "SELECT count(*) FROM trials WHERE state = 'RUNNING'"),
            "rows_running": _one(self.ws, "SELECT count(*) FROM autorl_trials WHERE status = 'running'"),
            "crashes": _one(self.ws, "SELECT count(*) FROM autorl_trials WHERE status = 'crash'"),
            "integrity": _one(self.ws, "PRAGMA integrity_check"),
            "controller_starts": self.starts,
            "reads": reads,
        }


_SIGNALS = {"kill-controller": signal.SIGKILL, "term-controller": signal.SIGTERM}


def _last_line(path: Path) -> str:
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip() and not x.startswith("== ")]
    return lines[-1][:200] if lines else ""


def _finished(ws: Path) -> tuple[int, int | None, float]:
    rows = [t for t in rel.trials(ws) if t["status"] != "running"]
    own = sum((t["finished"] or 0) - (t["started"] or 0) for t in rows if t["finished"] and t["started"])
    return len(rows), max((t["number"] for t in rows), default=None), own


def _one(ws: Path, sql: str):
    try:
        conn = sqlite3.connect(f"file:{ws / 'ledger.sqlite'}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute(sql).fetchone()[0]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return f"error: {exc}"


def windows(samples: list[dict], events: list[dict], minutes: float, parallel: int) -> list[dict]:
    """One row per window of ``minutes``: trials finished, slot seconds per trial (``parallel`` x wall seconds over
    the trials), the trials' own seconds, and their difference, the controller's overhead a trial (faults and
    resumes included); the controller's peak memory and last descriptor count in the window, and its faults."""
    rows, width = [], minutes * 60
    last, inside = (samples[0] if samples else None), []
    for s in samples[1:]:
        inside.append(s)
        if last is None or s["t"] - last["t"] < width and s is not samples[-1]:
            continue
        n = s["trials"] - last["trials"]
        live = [x for x in inside if x["rss_mib"] > 0]  # samples with a controller alive
        rows.append(
            {
                "from_min": round(last["t"] / 60, 1),
                "to_min": round(s["t"] / 60, 1),
                "trials": n,
                "slot_s_per_trial": round(parallel * (s["t"] - last["t"]) / n, 3) if n else None,
                "trial_s": round((s["trial_s_sum"] - last["trial_s_sum"]) / n, 3) if n else None,
                "rss_mib": max((x["rss_mib"] for x in live), default=0.0),
                "fds": live[-1]["fds"] if live else -1,
                "ledger_mib": s["ledger_mib"],
                "faults": sum(last["t"] <= e["t"] < s["t"] for e in events),
            }
        )
        last, inside = s, []
    return rows


def table(rows: list[dict]) -> str:
    out = [
        "| minutes | trials | slot s/trial | trial's own s | overhead s | controller peak MiB | fds | ledger MiB | "
        "faults |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r["trials"]:
            out.append(
                f"| {r['from_min']:.0f}-{r['to_min']:.0f} | 0 | - | - | - | {r['rss_mib']:.0f} | {r['fds']} | "
                f"{r['ledger_mib']:.1f} | {r['faults']} |"
            )
            continue
        out.append(
            f"| {r['from_min']:.0f}-{r['to_min']:.0f} | {r['trials']} | {r['slot_s_per_trial']:.2f} | "
            f"{r['trial_s']:.2f} | {r['slot_s_per_trial'] - r['trial_s']:.2f} | {r['rss_mib']:.0f} | {r['fds']} | "
            f"{r['ledger_mib']:.1f} | {r['faults']} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=180.0, help="how long the soak runs (default 180)")
    ap.add_argument("--mean-fault-s", type=float, default=240.0, help="mean seconds between faults (default 240)")
    ap.add_argument("--disk-full-s", type=float, default=60.0, help="how long the disk stays full (default 60)")
    ap.add_argument("--trial-s", type=float, default=2.0, help="seconds a trial runs (default 2)")
    ap.add_argument("--parallel", type=int, default=2, help="trials at once (default 2)")
    ap.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples (default 10)")
    ap.add_argument("--window-min", type=float, default=10.0, help="minutes per table row (default 10)")
    ap.add_argument("--size", default="2g", help="the tmpfs the workspace lives on (default 2g)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fault schedule")
    ap.add_argument("--faults", default=",".join(FAULTS), help="the kinds of fault to draw from (default: all)")
    ap.add_argument("--json", default=None, help="write events, samples, windows and checks here")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.faults = [f for f in args.faults.split(",") if f]
    if not args.faults or set(args.faults) - set(FAULTS):
        ap.error(f"--faults: name one or more of {', '.join(FAULTS)}")
    if os.geteuid() != 0 and not args.inner:  # a tmpfs needs a mount: become root of a private namespace
        os.execvp("unshare", ["unshare", "-rm", sys.executable, __file__, *sys.argv[1:], "--inner"])
    with tempfile.TemporaryDirectory(prefix="fault-soak-") as tmp:
        root = Path(tmp)
        soak = Soak(root, args)
        if not rel._mount_tmpfs(soak.mnt, args.size):
            sys.exit("fault_soak: could not mount a tmpfs for the workspace (needs root or unshare -rm)")
        try:
            rel.make_workspace(soak.mnt, seconds=args.trial_s)
            (soak.ws / "recipes" / "soak.yaml").write_text(RECIPE.format(python=sys.executable, seconds=args.trial_s))
            rel.git(soak.ws, "add", "-A")
            rel.git(soak.ws, "commit", "-qm", "the fault soak's recipe")
            result = soak.run()
        finally:
            for pid in rel.naming(soak.mnt):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            rel._umount(soak.mnt)
        rows = windows(soak.samples, soak.events, args.window_min, args.parallel)
        counts = {k: sum(e["fault"] == k for e in soak.events) for k in (*FAULTS, "unplanned")}
        print(table(rows))
        print(json.dumps({"faults": counts, **result}, indent=1))
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {"faults": counts, **result, "events": soak.events, "windows": rows, "samples": soak.samples},
                    indent=1,
                )
            )


if __name__ == "__main__":
    main()
