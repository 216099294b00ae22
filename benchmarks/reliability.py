"""The reliability suite: the faults a hostile user and a busy machine bring, run for real, one table.

Every fault runs the real `autorl` command in child processes on a real workspace (git, SQLite, Optuna, the
command backend running a short Python trial). Per fault it prints:

- ``exit``: the exit code of the command the fault hit (the refused command, or the controller that noticed);
- ``lines``: lines that command wrote on stderr (the target is one, and no traceback);
- ``s``: seconds from the fault to that command's exit (for a refused command, its whole run);
- ``MiB``: the peak resident memory of that command (``wait4``'s ``ru_maxrss``);
- ``lost``: trials lost: a trial whose start tag is in git but whose ledger row is missing or still marked
  running after the study ends or is resumed, plus trials opened after the fault wrote to a ledger nobody will
  read (their work is gone);
- ``dup``: duplicate attempts: two ledger rows or two ``attempt-NN-*`` branches with one number, or one Optuna
  trial recorded twice;
- ``orphans``: processes left alive afterwards whose command line names the workspace.

Target: each fault ends in one line and exit code 2 (or a clean resume: exit 0), 0 lost, 0 duplicates,
0 orphans, refused within 5 s and 500 MiB.

    python benchmarks/reliability.py                 # every fault
    python benchmarks/reliability.py --only disk     # the faults whose name contains 'disk'
    python benchmarks/reliability.py --json out.json

The disk faults put the workspace on a small tmpfs: mounted directly when run as root, else inside a private
mount namespace (``unshare -rm``); where neither is allowed they are reported as not run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

TRIAL = """import json, random, sys, time
out, seconds, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
random.seed(seed)
t0 = time.time()
with open(out, "w") as fh:
    step = 0
    while time.time() - t0 < seconds:
        step += 1
        fh.write(json.dumps({"type": "step", "step": step, "reward_mean": 0.5, "loss": 0.1}) + "\\n")
        fh.flush()
        time.sleep(0.1)
    items = [int(random.random() < 0.5) for _ in range(100)]
    fh.write(json.dumps({"type": "eval", "step": step + 1, "eval/id/greedy_pass@1": sum(items) / 100,
                         "eval/id/items": items}) + "\\n")
"""

RECIPE = """name: rel
backend: command
train:
  argv: ["{python}", "trial.py", "{{run_dir}}/metrics.jsonl", "{{seconds}}", "{{seed}}"]
  seconds: {seconds}
  lr: 0.001
  seed: 0
search:
  lr: {{low: 1.0e-5, high: 1.0e-1, log: true}}
verdict: {{baseline_repeats: 1, confirm_runs: 0}}
abort: {{silence_s: 60}}
timeout_s: 120
"""

TARGET_S, TARGET_MIB = 5.0, 500.0


@dataclass
class Result:
    fault: str
    exit: int | None = None
    lines: int = 0
    seconds: float = 0.0
    mib: float = 0.0
    lost: int = 0
    dup: int = 0
    orphans: int = 0
    want: tuple[int, ...] = (2,)
    first_line: str = ""
    note: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def met(self) -> bool:
        return (
            self.exit in self.want
            and self.lines <= 1
            and self.lost == 0
            and self.dup == 0
            and self.orphans == 0
            and self.seconds <= TARGET_S
            and self.mib <= TARGET_MIB
            and not self.notes
        )


# ---- running the command -------------------------------------------------------------------------------------
@dataclass
class Done:
    code: int
    out: str
    err: str
    seconds: float
    mib: float


def start(*args: str, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "autorl.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )


def wait(proc: subprocess.Popen, since: float | None = None, timeout: float = 300) -> Done:
    """Wait for ``proc`` (its peak memory from wait4); seconds counted from ``since`` (default: now)."""
    t0 = time.time() if since is None else since
    deadline = time.time() + timeout
    status, usage = 0, None
    while time.time() < deadline:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.02)
    else:
        proc.kill()
        pid, status, usage = os.wait4(proc.pid, 0)
    seconds = time.time() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    out, err = proc.stdout.read(), proc.stderr.read()
    return Done(proc.returncode, out, err, seconds, usage.ru_maxrss / 1024 if usage else 0.0)


def cli(*args: str, timeout: float = 300) -> Done:
    t0 = time.time()
    return wait(start(*args), t0, timeout)


def stderr_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


# ---- a workspace ---------------------------------------------------------------------------------------------
def git(ws: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "u",
        "GIT_AUTHOR_EMAIL": "u@u",
        "GIT_COMMITTER_NAME": "u",
        "GIT_COMMITTER_EMAIL": "u@u",
    }
    return subprocess.run(["git", *args], cwd=ws, capture_output=True, text=True, check=True, env=env).stdout


def make_workspace(root: Path, seconds: float = 1.0) -> Path:
    ws = root / "ws"
    r = cli("init", str(ws))
    assert r.code == 0, r.err
    (ws / "trial.py").write_text(TRIAL)
    (ws / "recipes" / "rel.yaml").write_text(RECIPE.format(python=sys.executable, seconds=seconds))
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "the trial script and its recipe")
    return ws


def run_args(ws: Path, *extra: str) -> list[str]:
    return ["-C", str(ws), "run", "recipes/rel.yaml", "--strategy", "random", "--budget", "10m", "--quiet", *extra]


def trials(ws: Path, ledger: Path | None = None) -> list[dict]:
    path = ledger or ws / "ledger.sqlite"
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM autorl_trials ORDER BY number")]
    except sqlite3.DatabaseError:
        return []
    finally:
        conn.close()


def wait_running(ws: Path, after: int = 0, timeout: float = 120) -> dict:
    """The first trial numbered above ``after`` whose process is running."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            rows = [t for t in trials(ws) if t["status"] == "running" and t["pid"] and t["number"] > after]
        except sqlite3.OperationalError:
            rows = []
        if rows:
            return rows[0]
        time.sleep(0.1)
    raise AssertionError(f"no trial above {after} started running in {timeout} s")


def start_numbers(ws: Path) -> list[int]:
    tags = git(ws, "tag", "--list", "attempt-*-start").split()
    return sorted(int(m.group(1)) for m in (re.match(r"attempt-(\d+)-start$", t) for t in tags) if m)


def lost_and_dup(ws: Path, ledger: Path | None = None) -> tuple[int, int]:
    rows = trials(ws, ledger)
    numbers = [r["number"] for r in rows]
    recorded = {r["number"] for r in rows if r["status"] != "running"}
    lost = sum(1 for n in start_numbers(ws) if n not in recorded)
    branches = [
        m.group(1)
        for m in (
            re.match(r"attempt-(\d+)-", b.strip(" *+")) for b in git(ws, "branch", "--list", "attempt-*").splitlines()
        )
        if m
    ]
    optuna = [
        (r["study_id"], r["optuna_number"])
        for r in rows
        if r["optuna_number"] is not None and r["proposer"] not in ("retry", "confirm")
    ]
    dup = (len(numbers) - len(set(numbers))) + (len(branches) - len(set(branches))) + (len(optuna) - len(set(optuna)))
    return lost, dup


def naming(path: Path) -> list[int]:
    """Live processes (not zombies) whose command line names ``path``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next((x for x in (d / "status").read_text().splitlines() if x.startswith("State:")), "")
        except OSError:
            continue
        if str(path) in cmd and "zombie" not in state:
            found.append(int(d.name))
    return found


def orphans(ws: Path, grace_s: float = 3.0) -> int:
    """Processes whose command line names the workspace, once ``grace_s`` has passed."""
    deadline = time.time() + grace_s
    while True:
        found = naming(ws)
        if not found or time.time() > deadline:
            return len(found)
        time.sleep(0.2)


def record(res: Result, done: Done) -> Result:
    lines = stderr_lines(done.err)
    res.exit, res.lines, res.seconds, res.mib = done.code, len(lines), done.seconds, done.mib
    res.first_line = lines[0][:200] if lines else ""
    if "Traceback" in done.err:
        res.notes.append("traceback")
    return res


# ---- the faults -----------------------------------------------------------------------------------------------
def resume_while_running(root: Path) -> Result:
    """`autorl run --resume` while the study's controller runs a trial: refused; the first study goes on."""
    ws = make_workspace(root, seconds=3.0)
    first = start(*run_args(ws, "--study", "rel", "--max-trials", "3"))
    row = wait_running(ws)
    res = record(
        Result("resume while its controller runs"),
        cli("-C", str(ws), "run", "--resume", "--study", "rel", "--budget", "1m"),
    )
    done = wait(first)
    if done.code != 0:
        res.notes.append(f"the first controller exited {done.code}: {stderr_lines(done.err)[-1:]}")
    mine = next((t for t in trials(ws) if t["number"] == row["number"]), {})
    if mine.get("status") != "complete":
        res.notes.append(f"the running trial ended {mine.get('status')}")
    res.lost, res.dup = lost_and_dup(ws)
    res.orphans = orphans(ws)
    return res


def three_at_once(root: Path) -> Result:
    """Three new studies started at once on a fresh workspace and ledger: all run, each ends stopped."""
    ws = make_workspace(root, seconds=0.5)
    t0 = time.time()
    procs = [start(*run_args(ws, "--max-trials", "2")) for _ in range(3)]
    dones = [wait(p, t0) for p in procs]
    worst = max(dones, key=lambda d: (d.code != 0, len(stderr_lines(d.err))))
    res = record(Result("three new studies at once, fresh ledger", want=(0,)), worst)
    res.seconds = 0.0  # not a refusal: nothing to time
    rows = trials(ws)
    studies = _studies(ws)
    if len(rows) != 6:
        res.notes.append(f"{len(rows)} trials of 6")
    if [s["status"] for s in studies] != ["stopped"] * 3:
        res.notes.append(f"studies: {[(s['name'], s['status']) for s in studies]}")
    res.lost, res.dup = lost_and_dup(ws)
    res.orphans = orphans(ws)
    return res


def _studies(ws: Path) -> list[dict]:
    try:
        conn = sqlite3.connect(f"file:{ws / 'ledger.sqlite'}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM autorl_studies ORDER BY id")]
    except sqlite3.DatabaseError:
        return []


def _mid_study(root: Path, seconds: float = 2.0, max_trials: int = 4) -> tuple[Path, subprocess.Popen, dict]:
    ws = make_workspace(root, seconds=seconds)
    proc = start(*run_args(ws, "--study", "rel", "--max-trials", str(max_trials)))
    first = wait_running(ws)
    row = wait_running(ws, after=first["number"])  # the second trial: the study has a history
    time.sleep(0.5)
    return ws, proc, row


def _resume(ws: Path, res: Result, max_trials: int = 4) -> None:
    done = cli("-C", str(ws), "run", "--resume", "--study", "rel", "--max-trials", str(max_trials), "--quiet")
    if done.code != 0:
        res.notes.append(f"resume exited {done.code}: {stderr_lines(done.err)[-1:]}")


def ledger_removed(root: Path) -> Result:
    """`rm ledger.sqlite` while a trial runs: the controller stops at once and writes nothing more anywhere."""
    ws, proc, row = _mid_study(root)
    ledger = ws / "ledger.sqlite"
    before = start_numbers(ws)
    t0 = time.time()
    ledger.unlink()
    res = record(Result("ledger removed mid-study"), wait(proc, t0))
    if ledger.exists():
        res.notes.append("a new ledger file appeared at the path")
    res.lost = len(set(start_numbers(ws)) - set(before))  # attempts opened into a ledger nobody will read
    res.orphans = orphans(ws)
    return res


def move_db(src: Path, dst: Path) -> None:
    """Rename an SQLite file with its -wal and -shm companions."""
    for suffix in ("", "-wal", "-shm"):
        if Path(str(src) + suffix).exists():
            os.rename(Path(str(src) + suffix), Path(str(dst) + suffix))


def ledger_moved(root: Path) -> Result:
    """The ledger moved away mid-study, then put back: the controller stopped; --resume recovers everything."""
    ws, proc, row = _mid_study(root)
    ledger = ws / "ledger.sqlite"
    aside = root / "aside.sqlite"
    t0 = time.time()
    move_db(ledger, aside)
    res = record(Result("ledger moved away mid-study, put back, resumed"), wait(proc, t0))
    move_db(aside, ledger)
    _resume(ws, res)
    res.lost, res.dup = lost_and_dup(ws)
    res.orphans = orphans(ws)
    return res


def ledger_replaced(root: Path) -> Result:
    """Another ledger copied over this one mid-study: the controller stops and writes nothing into it."""
    ws, proc, row = _mid_study(root)
    ledger = ws / "ledger.sqlite"
    other = root / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    t0 = time.time()
    os.replace(other, ledger)
    res = record(Result("ledger replaced by another file mid-study"), wait(proc, t0))
    conn = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    if tables != {"t"}:
        res.notes.append(f"the replacing file was written to: {sorted(tables)[:5]}")
    res.orphans = orphans(ws)
    return res


def ledger_corrupted(root: Path) -> Result:
    """Garbage written over the middle of the ledger mid-study: noticed, one line; the review commands say so in
    one line that never suggests deleting the file."""
    ws, proc, row = _mid_study(root, seconds=6.0)
    ledger = ws / "ledger.sqlite"
    conn = sqlite3.connect(ledger, timeout=30)  # SQLite checkpoints on its own every 1000 pages: one now, so that
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # the pages hit live in the file, not the log
    conn.close()
    size = ledger.stat().st_size
    t0 = time.time()
    with open(ledger, "r+b") as fh:
        fh.seek(max(size // 2 - 8192, 4096) // 4096 * 4096)
        fh.write(os.urandom(16384))
    res = record(Result("ledger corrupted mid-study"), wait(proc, t0, timeout=120))
    review = cli("-C", str(ws), "ledger")
    lines = stderr_lines(review.err)
    if review.code != 0 and (len(lines) != 1 or re.search(r"\b(delete|remove|rm)\b", review.err)):
        res.notes.append(f"`autorl ledger` after: {review.err.strip()[:200]}")
    res.orphans = orphans(ws)
    return res


def kill9_then_resume(root: Path) -> Result:
    """kill -9 of the controller mid-trial, then --resume at once: the dead holder's lock is taken over."""
    ws, proc, row = _mid_study(root)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    res = record(
        Result("kill -9 of the controller, then --resume", want=(0,)),
        cli("-C", str(ws), "run", "--resume", "--study", "rel", "--max-trials", "4", "--quiet"),
    )
    res.seconds = 0.0
    res.lost, res.dup = lost_and_dup(ws)
    res.orphans = orphans(ws)
    return res


# ---- a full disk ------------------------------------------------------------------------------------------------
def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _fill(path: Path) -> Path:
    """Fill the file system of ``path`` with one file, until it refuses."""
    filler = path / "filler.bin"
    chunk = b"\0" * (1 << 16)
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(chunk)
        except OSError:
            pass
    try:
        with open(filler, "ab") as fh:
            while True:
                fh.write(b"\0")
                fh.flush()
    except OSError:
        pass
    return filler


def _on_tmpfs(root: Path, size: str, body: Callable[[Path], Result], name: str) -> Result:
    mnt = root / "mnt"
    if not _mount_tmpfs(mnt, size):
        return _in_namespace(name, root) if os.geteuid() != 0 else Result(name, note="not run: tmpfs mount refused")
    try:
        return body(mnt)
    finally:
        for pid in naming(mnt):  # what the fault left there (counted as orphans already), so that it unmounts
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _umount(mnt)


def _in_namespace(name: str, root: Path) -> Result:
    """Run one disk fault as root of a private user and mount namespace (``unshare -rm``)."""
    out = root / "result.json"
    r = subprocess.run(
        ["unshare", "-rm", sys.executable, __file__, "--inner", name, "--json", str(out)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0 or not out.exists():
        return Result(name, note=f"not run: unshare -rm refused ({(r.stderr.strip().splitlines() or ['?'])[-1][:80]})")
    return Result(**{k: (tuple(v) if k == "want" else v) for k, v in json.loads(out.read_text())[0].items()})


def disk_full_mid_study(root: Path) -> Result:
    """The disk fills up while a trial runs: one line, exit 2; the review commands still read the ledger; after
    space is freed, --resume recovers the trial."""

    def body(mnt: Path) -> Result:
        ws, proc, row = _mid_study(mnt, seconds=4.0)
        t0 = time.time()
        filler = _fill(mnt)
        res = record(Result("disk full mid-trial, freed, resumed"), wait(proc, t0))
        for cmd in (["ledger"], ["status"], ["show", str(row["number"])]):
            review = cli("-C", str(ws), *cmd)
            if review.code != 0:
                res.notes.append(f"`autorl {cmd[0]}` on the full disk: {review.code} {review.err.strip()[:160]}")
        filler.unlink()
        _resume(ws, res)
        res.lost, res.dup = lost_and_dup(ws)
        res.orphans = orphans(ws)
        return res

    return _on_tmpfs(root, "64m", body, "disk full mid-trial, freed, resumed")


def disk_full_at_start(root: Path) -> Result:
    """A study started on a full disk: one line, exit 2, nothing half-written."""

    def body(mnt: Path) -> Result:
        ws = make_workspace(mnt)
        refs = git(ws, "for-each-ref")
        filler = _fill(mnt)
        res = record(Result("study started on a full disk"), cli(*run_args(ws, "--max-trials", "2")))
        filler.unlink()
        if git(ws, "for-each-ref") != refs:
            res.notes.append("refs were written")
        if (ws / "ledger.sqlite").exists() and trials(ws):
            res.notes.append("trials were written")
        res.orphans = orphans(ws)
        return res

    return _on_tmpfs(root, "32m", body, "study started on a full disk")


# ---- hostile input -------------------------------------------------------------------------------------------
def _bomb(levels: int = 9, width: int = 10) -> str:
    """A YAML alias bomb: ``width ** levels`` values from a few hundred bytes."""
    lines = ['a0: &a0 "lol"']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines)


def _flow_bomb(levels: int = 9, width: int = 10) -> str:
    out = '&a0 "lol"'
    for i in range(1, levels + 1):
        out = f"&a{i} [" + ", ".join([out] + [f"*a{i - 1}"] * (width - 1)) + "]"
    return out


HOSTILE_RECIPES: dict[str, str] = {
    "alias bomb in description": "name: x\nbackend: command\n"
    + _bomb().replace("a9: &a9", "description: &a9")
    + "\ntrain: {argv: [echo]}\n",
    "alias bomb in a train value": "name: x\nbackend: command\n" + _bomb() + "\ntrain: {argv: [echo], lr: *a9}\n",
    "self-referencing alias": "name: x\nbackend: command\ndescription: &a [*a]\ntrain: {argv: [echo]}\n",
    "nesting 100,000 deep": "name: x\ndescription: " + "[" * 100_000 + "]" * 100_000 + "\n",
    "nesting 1,200 deep (blocks)": "name: x\nd:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 1200)),
    "a 1,000,000-digit integer": "name: x\ntrain: {lr: " + "9" * 1_000_000 + "}\n",
    "an integer beyond 64 bits": "name: x\nbackend: command\ntrain: {argv: [echo], seed: 99999999999999999999}\n",
    "a float that overflows": "name: x\ntrain: {lr: 1e999}\n",
    "duplicate keys": "name: x\ntrain:\n  lr: 0.1\n  lr: 0.2\n",
    "an impossible date": "name: 2024-99-99\n",
    "a 1 MB key": "name: x\ntrain: {" + "k" * 1_000_000 + ": 1}\n",
    "a 64 MB file": "",  # written below, without holding it in memory twice
    "not UTF-8": "",
    "!!binary garbage": "name: !!binary '%%%'\n",
    "a Python object tag": "name: !!python/object/apply:os.system ['true']\n",
}

HOSTILE_HYPOTHESIS = (
    "---\nid: h99-bomb\n" + _bomb().replace("a9: &a9", "title: &a9") + "\npriority: 1\nbackends: [command]\n---\nbody\n"
)

HOSTILE_FLAGS: dict[str, list[str]] = {
    "--set alias bomb": ["--set", "description=" + _flow_bomb()],
    "--set 100 kB number": ["--set", "lr=" + "9" * 100_000],
    "--set key 5,000 levels deep": ["--set", "a." * 5000 + "b=1"],
    "--seed 2**70": ["--seed", str(2**70)],
    "--study with a newline": ["--study", "a\nb"],
    "--study of 10,000 characters": ["--study", "s" * 10_000],
    "--budget of 5,000 digits": ["--budget", "9" * 5000],
    "--parallel 10**9": ["--parallel", str(10**9)],
}


def hostile_inputs(root: Path) -> list[Result]:
    ws = make_workspace(root)
    git(ws, "tag", "clean")
    out = []
    for name, text in HOSTILE_RECIPES.items():
        path = ws / "recipes" / "bad.yaml"
        if name == "a 64 MB file":
            with open(path, "w") as fh:
                fh.write("name: x\ndescription: |\n")
                line = "  " + "x" * 1022 + "\n"
                for _ in range(64 * 1024):
                    fh.write(line)
        elif name == "not UTF-8":
            path.write_bytes(b"name: \xff\xfe\n")
        else:
            path.write_text(text)
        res = record(
            Result(f"recipe: {name}"),
            cli(*run_args(ws, "recipes/bad.yaml")[:3], "recipes/bad.yaml", "--budget", "1m", "--max-trials", "1"),
        )
        out.append(_nothing_written(ws, res))
        path.unlink()
    hyp = ws / "hypotheses" / "h99-bomb.md"
    hyp.write_text(HOSTILE_HYPOTHESIS)
    res = record(
        Result("hypothesis file: alias bomb in the title"),
        cli("-C", str(ws), "run", "recipes/rel.yaml", "--strategy", "hypotheses", "--budget", "1m"),
    )
    out.append(_nothing_written(ws, res))
    res = record(Result("`autorl hypotheses` with that file"), cli("-C", str(ws), "hypotheses"))
    out.append(res)
    hyp.unlink()
    for name, args in HOSTILE_FLAGS.items():
        res = record(Result(f"flag: {name}"), cli(*run_args(ws), *args))
        out.append(_nothing_written(ws, res))
    return out


def _nothing_written(ws: Path, res: Result) -> Result:
    if (ws / "ledger.sqlite").exists():
        res.notes.append("a ledger was written")
        for p in ws.glob("ledger.sqlite*"):
            p.unlink()
    branches = git(ws, "for-each-ref", "--format=%(refname)", "refs/heads/attempt-*", "refs/tags/attempt-*").split()
    if branches:
        res.notes.append("a branch or tag was written")
        for ref in branches:
            git(ws, "update-ref", "-d", ref)
    res.orphans = orphans(ws, grace_s=0)
    return res


def hostile_git(root: Path) -> Result:
    """Whatever the repository holds already (odd tags and branches, huge numbers) never breaks a study."""
    ws = make_workspace(root, seconds=0.3)
    head = git(ws, "rev-parse", "HEAD").strip()
    blob = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"], cwd=ws, input="x", capture_output=True, text=True
    ).stdout.strip()
    for tag in (
        "attempt-99999999999999999999999-x",
        "attempt-" + "9" * 5000,
        "attempt-01-start",
        "attempt-1e99",
        "attempt-ü-ü",
    ):
        subprocess.run(["git", "tag", tag, head], cwd=ws, capture_output=True)
    git(ws, "tag", "attempt-03-blob", blob)
    git(ws, "branch", "attempt-02-mine", head)
    git(ws, "branch", "attempt-04-lr-0-001", head)
    theirs = set(start_numbers(ws))
    res = record(Result("odd refs already in the repository", want=(0,)), cli(*run_args(ws, "--max-trials", "2")))
    res.seconds = 0.0
    rows = trials(ws)
    if len(rows) != 2 or any(r["status"] != "complete" for r in rows):
        res.notes.append(f"trials: {[(r['number'], r['status']) for r in rows]}")
    if any(r["number"] in theirs or r["number"] in (2, 3, 4) for r in rows):
        res.notes.append(f"a trial took a number the repository had: {[r['number'] for r in rows]}")
    recorded = {r["number"] for r in rows}
    res.lost = sum(1 for n in start_numbers(ws) if n not in recorded and n not in theirs)
    res.orphans = orphans(ws)
    return res


def run_dir_states(root: Path) -> list[Result]:
    """The workspace's .autorl as a file, a link to nothing, a link to a file: one line each."""
    ws = make_workspace(root)
    out = []
    (root / "afile").write_text("x")
    states: dict[str, Callable[[Path], object]] = {
        ".autorl is a file": lambda p: p.write_text("x"),
        ".autorl is a dangling link": lambda p: p.symlink_to(root / "nowhere"),
        ".autorl is a link to a file": lambda p: p.symlink_to(root / "afile"),
        ".autorl/worktrees is a file": lambda p: (p.mkdir(), (p / "worktrees").write_text("x")),
        ".autorl/runs is a dangling link": lambda p: (p.mkdir(), (p / "runs").symlink_to(root / "nowhere")),
        ".autorl/locks is a file": lambda p: (p.mkdir(), (p / "locks").write_text("x")),
    }
    for name, make in states.items():
        run_dir = ws / ".autorl"
        if run_dir.is_symlink() or run_dir.is_file():
            run_dir.unlink()
        elif run_dir.exists():
            shutil.rmtree(run_dir)
        make(run_dir)
        res = record(Result(name), cli(*run_args(ws, "--max-trials", "1")))
        out.append(_nothing_written(ws, res))
    return out


_INNER = {"disk full mid-trial, freed, resumed": "disk-mid", "study started on a full disk": "disk-start"}

FAULTS: dict[str, Callable[[Path], Result | list[Result]]] = {
    "resume": resume_while_running,
    "three": three_at_once,
    "removed": ledger_removed,
    "moved": ledger_moved,
    "replaced": ledger_replaced,
    "corrupted": ledger_corrupted,
    "kill9": kill9_then_resume,
    "disk-mid": disk_full_mid_study,
    "disk-start": disk_full_at_start,
    "hostile-input": hostile_inputs,
    "hostile-git": hostile_git,
    "run-dir": run_dir_states,
}


def run_fault(name: str) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix=f"rel-{name}-") as tmp:
        try:
            got = FAULTS[name](Path(tmp))
        except Exception as exc:  # the suite reports a fault it could not even run
            got = Result(name, note=f"harness failed: {exc.__class__.__name__}: {str(exc)[:160]}", notes=["harness"])
        return got if isinstance(got, list) else [got]


def table(results: list[Result]) -> str:
    head = (
        "| fault | exit | lines | s | MiB | lost | dup | orphans | met | first line / note |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = []
    for r in results:
        text = "; ".join([r.first_line.replace("|", "\\|")[:140], *r.notes, r.note]).strip("; ")
        rows.append(
            f"| {r.fault} | {r.exit} | {r.lines} | {r.seconds:.2f} | {r.mib:.0f} | {r.lost} | {r.dup} | "
            f"{r.orphans} | {'yes' if r.met else 'NO'} | {text} |"
        )
    return "\n".join([head, *rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="run the faults whose key contains one of these")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--inner", default=None, help=argparse.SUPPRESS)  # one disk fault, inside unshare -rm
    args = ap.parse_args()
    if args.inner:
        results = run_fault(_INNER[args.inner])
    else:
        keys = [k for k in FAULTS if args.only is None or any(o in k for o in args.only)]
        results = [r for k in keys for r in run_fault(k)]
        print(table(results))
        print(f"\n{sum(r.met for r in results)} of {len(results)} faults meet the target")
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "met": r.met} for r in results], indent=1))


if __name__ == "__main__":
    main()
