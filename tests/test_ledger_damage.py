"""Every review and run command on every kind of ledger damage: the command works on what is intact, or says in one
line what is wrong and what to do; a review that can still show part of a damaged ledger says so first, in one line
with the `.recover` advice, and exits 1; nothing is ever written into a damaged ledger and no traceback is shown.

The ledger is a real study's (tests/study_ledger.py), damaged the way a disk, a copy or another program damages it:
truncated, pages overwritten at its start, middle and end, the write-ahead log lost or taken from another ledger, a
schema from a newer autorl, a file another process holds locked, a read-only folder (a read-only bind mount in a
private mount namespace). The real CLI in a child process; each command on its own copy of the workspace.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autorl.ledger import Ledger
from tests.study_ledger import git_workspace

PAGE = 4096
STARTED = ("resuming study", "preparing backend", "study ")  # a run's first lines once its study has started
REVIEW = [
    ("ledger",),
    ("ledger", "--json"),
    ("status",),
    ("show", "5"),
    ("diagnose",),
    ("triage",),
    ("hypotheses",),
    ("report", "--out", "{root}/report"),
    ("clean", "--dry-run"),
    ("promote", "--dry-run"),
]
RUN = [
    ("run", "--resume", "--budget", "1s"),
    ("run", "--study", "another", "--budget", "1s", "--max-trials", "1"),
]
COMMANDS = REVIEW + RUN


# ---- kinds of damage: each takes the workspace's ledger and damages it -----------------------------------------
def _checkpointed(path: Path) -> bytearray:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.close()
    return bytearray(path.read_bytes())


def _overwrite(path: Path, where: Callable[[int], int], pages: int = 2) -> None:
    data = _checkpointed(path)
    at = where(len(data) // PAGE) * PAGE
    data[at : at + pages * PAGE] = b"\xa5" * (pages * PAGE)
    path.write_bytes(bytes(data[: max(len(data), at)]))


def truncated(path: Path) -> None:
    data = _checkpointed(path)
    path.write_bytes(bytes(data[: len(data) // 2 // PAGE * PAGE]))


def truncated_in_header(path: Path) -> None:
    path.write_bytes(bytes(_checkpointed(path)[:60]))


def start(path: Path) -> None:
    _overwrite(path, lambda n: 0)


def middle(path: Path) -> None:
    _overwrite(path, lambda n: n // 2)


def end(path: Path) -> None:
    _overwrite(path, lambda n: n - 2)


def trial_rows(path: Path) -> None:
    """The cells of the page holding a trial's row (the table every review reads), its page header kept."""
    data = _checkpointed(path)
    at = data.find(b"attempt-08")
    assert at > 0
    first = (at // PAGE) * PAGE + 16
    data[first : first + PAGE - 16] = b"\x7f" * (PAGE - 16)
    path.write_bytes(bytes(data))


UNCHECKPOINTED = textwrap.dedent("""
    import os, sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE IF NOT EXISTS padding (x BLOB)")
    for _ in range(int(sys.argv[2])):
        conn.execute("INSERT INTO padding VALUES (randomblob(3000))")
    conn.execute("UPDATE autorl_trials SET why = 'written in the log' WHERE number = 5")
    os._exit(0)  # no close: the write-ahead log stays beside the file, not folded into it
""")


def _unfolded_log(path: Path, rows: int = 30) -> None:
    subprocess.run([sys.executable, "-c", UNCHECKPOINTED, str(path), str(rows)], check=True, timeout=60)
    assert Path(f"{path}-wal").stat().st_size > 0


def wal_lost(path: Path) -> None:
    _unfolded_log(path)
    Path(f"{path}-wal").unlink()


def wal_foreign(path: Path) -> None:
    """The write-ahead log of another ledger (other rows, written by a child that never folded it) put beside this
    one, as a copy of a ledger's folder taken while another study ran does."""
    other = path.parent.parent / "other.sqlite"
    led = Ledger(other)
    sid = led.create_study(name="other", recipe="r", strategy="random", optuna_study="other")
    for i in range(1, 30):
        led.add_trial(study_id=sid, number=i, attempt=f"attempt-{i:02d}-other")
    led.close()
    _unfolded_log(other, rows=60)
    _checkpointed(path)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    shutil.copy(f"{other}-wal", f"{path}-wal")


def newer_schema(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO autorl_migrations VALUES ('0099_from_the_future', 0)")
    conn.execute("ALTER TABLE autorl_trials ADD COLUMN future_column TEXT")
    conn.commit()
    conn.close()


def locked(path: Path) -> None:
    """Nothing here: the lock is held while the command runs (``run_damaged``)."""


def readonly_folder(path: Path) -> None:
    """Nothing here: the folder is mounted read-only while the command runs (``run_damaged``)."""


DAMAGE: dict[str, Callable[[Path], None]] = {
    f.__name__: f
    for f in (
        truncated,
        truncated_in_header,
        start,
        middle,
        end,
        trial_rows,
        wal_lost,
        wal_foreign,
        newer_schema,
        locked,
        readonly_folder,
    )
}

LOCK_HOLDER = textwrap.dedent("""
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    conn.execute("BEGIN EXCLUSIVE")
    conn.execute("UPDATE autorl_trials SET why = why")
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    conn.execute("COMMIT")
    conn.close()
""")


def command(kind: str, ws: Path, cmd: tuple[str, ...], root: Path, timeout: float) -> subprocess.CompletedProcess:
    """``autorl -C ws CMD`` on the workspace's ledger (damaged already), with the lock held or the folder mounted
    read-only where ``kind`` says; a command still running after ``timeout`` s is stopped (rc -9, its output kept)."""
    path = ws / "ledger.sqlite"
    argv = [sys.executable, "-m", "autorl.cli", "-C", str(ws), *(a.format(root=root) for a in cmd)]
    holder = None
    if kind == "locked":
        holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(path), "3"], stdout=subprocess.PIPE)
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
    if kind == "readonly_folder":
        if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
            pytest.skip("no private mount namespace here (unshare -rm refused)")
        mount = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
        argv = ["unshare", "-rm", "sh", "-c", mount, "sh", str(ws), *argv]
    out, err = root / "stdout", root / "stderr"
    try:
        with open(out, "w") as o, open(err, "w") as e:
            proc = subprocess.Popen(argv, stdout=o, stderr=e, text=True, start_new_session=True)
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                if cmd[0] == "run" and any(s in out.read_text() for s in STARTED):
                    break  # the study started: that is all a run here must show
                time.sleep(0.3)
            rc = proc.poll()
            if rc is None:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=60)
                rc = -9
        return subprocess.CompletedProcess(argv, rc, out.read_text(), err.read_text())
    finally:
        if holder is not None:
            holder.wait(timeout=60)


# ---- what each command must do ------------------------------------------------------------------------------------
PARTIAL = "what follows may be partial"
RECOVER = "sqlite3 LEDGER .recover | sqlite3 recovered.sqlite"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"


@pytest.fixture(scope="module")
def study_ws(tmp_path_factory) -> Path:
    return git_workspace(tmp_path_factory.mktemp("study") / "ws")


def _outcome(kind: str, template: Path, cmd: tuple[str, ...], tmp: Path) -> tuple[subprocess.CompletedProcess, bool]:
    """The command on its own copy of the workspace, its ledger damaged as ``kind`` says; whether the ledger's
    bytes were left as they were."""
    root = tmp / f"{kind}-{'-'.join(cmd).replace('/', '_').replace('{', '').replace('}', '')}"
    ws = root / "ws"
    shutil.copytree(template, ws, symlinks=True)
    DAMAGE[kind](ws / "ledger.sqlite")
    before = _digest(ws / "ledger.sqlite")
    r = command(kind, ws, cmd, root, timeout=180)
    return r, _digest(ws / "ledger.sqlite") == before


def check(kind: str, cmd: tuple[str, ...], r: subprocess.CompletedProcess, kept: bool) -> None:
    """What a command on a damaged ledger may do: work (exit 0, nothing on stderr: every page it read was whole); show part of it after one
    line that says so with the `.recover` advice (exit 1); or say in one line what is wrong and what to do (exit
    2; after the partial line where it met more damage than the check found). A run either is refused in one line
    or starts its study on a ledger that reads whole; no traceback ever, and a damaged ledger is never written."""
    err = [line for line in r.stderr.splitlines() if line.strip()]
    what = f"{kind} / {' '.join(cmd)}: rc {r.returncode}\n{r.stderr[-2000:]}\n{r.stdout[-500:]}"
    assert "Traceback" not in r.stderr + r.stdout, what
    if cmd[0] == "run" and r.returncode in (-9, 0, 1):
        assert any(s in r.stdout for s in STARTED), what
        assert kind in WHOLE | {"wal_foreign"}, what  # a study starts only on a file whose every page checks
        return
    if kind in WHOLE and cmd[0] != "run":
        assert r.returncode == 0 and not err, what  # a ledger that reads whole is read
    if r.returncode == 0:
        assert not err, what  # every page it read was whole (SQLite checks each page it reads)
    elif r.returncode == 1:
        assert cmd[0] != "run" and len(err) == 1 and err[0].startswith("autorl: warning: ledger "), what
        assert PARTIAL in err[0] and RECOVER in err[0] and r.stdout.strip(), what
    else:
        assert r.returncode == 2, what
        assert 1 <= len(err) <= 2 and err[-1].startswith("autorl: error: "), what
        assert len(err) == 1 or (PARTIAL in err[0] and "is damaged" in err[1]), what
        assert not any(w in err[-1].split() for w in ("delete", "remove", "rm")), what
        if "is damaged" in err[-1]:
            assert RECOVER in err[-1] and "keep the file" in err[-1], what
    if kind not in WHOLE or r.returncode:
        assert kept, f"{what}\nthe damaged ledger was written"


WHOLE = {
    "wal_lost",
    "locked",
    "readonly_folder",
}  # the file reads whole (a lost log is an older ledger, not a torn one)


FAST = [
    ("trial_rows", ("ledger",)),
    ("trial_rows", ("status",)),
    ("end", ("report", "--out", "{root}/report")),
    ("start", ("ledger",)),
    ("truncated", ("run", "--resume", "--budget", "1s")),
    ("newer_schema", ("status",)),
    ("newer_schema", ("run", "--resume", "--budget", "1s")),
    ("locked", ("ledger", "--json")),
    ("wal_foreign", ("status",)),  # was a TypeError traceback: rows of another file read as this one's
]


def test_a_few_commands_on_damaged_ledgers_say_what_they_show(study_ws, tmp_path):
    """One of each outcome, fast: partial (exit 1 after one line), refused in one line (exit 2), read whole."""
    with ThreadPoolExecutor(len(FAST)) as pool:
        runs = list(pool.map(lambda kc: (kc, *_outcome(kc[0], study_ws, kc[1], tmp_path)), FAST))
    codes = {}
    for (kind, cmd), r, kept in runs:
        check(kind, cmd, r, kept)
        codes[kind, cmd[0]] = r.returncode
    assert codes["trial_rows", "ledger"] == codes["trial_rows", "status"] == 1  # shown, said to be partial
    assert codes["newer_schema", "status"] == codes["newer_schema", "run"] == 2  # refused: upgrade autorl
    assert codes["locked", "ledger"] == 0  # waited for the lock, then read


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_every_command_on_every_damage_says_what_it_shows(kind, study_ws, tmp_path):
    with ThreadPoolExecutor(6) as pool:
        runs = list(pool.map(lambda cmd: (cmd, *_outcome(kind, study_ws, cmd, tmp_path)), COMMANDS))
    for cmd, r, kept in runs:
        check(kind, cmd, r, kept)


REPORT_ON_FULL_DISK = textwrap.dedent("""\
    set -u
    mount -t tmpfs -o size=2m tmpfs "$1" || exit 97
    shift
    out="$MNT/report"
    if [ "$KEEP_OLD" = 1 ]; then "$@" --out "$out" > /dev/null || exit 98; fi
    find "$out" -type f -exec sha256sum {} + 2>/dev/null | sort > "$MNT/../before.txt"
    avail=$(df --output=avail -B1 "$MNT" | tail -1)
    head -c "$((avail - 4096))" /dev/zero > "$MNT/fill" 2>/dev/null
    "$@" --out "$out" > "$MNT/../stdout" 2> "$MNT/../stderr"
    echo $? > "$MNT/../rc"
    find "$out" -type f -exec sha256sum {} + 2>/dev/null | sort > "$MNT/../after.txt"
""")


@pytest.mark.slow
@pytest.mark.parametrize("keep_old", [False, True], ids=["fresh", "over-an-old-report"])
def test_a_report_on_a_full_disk_says_so_in_one_line_and_loses_no_report(keep_old, study_ws, tmp_path):
    """`autorl report --out DIR` where DIR's disk is full (a 2 MiB tmpfs filled to 4 KiB): the report is written,
    or one line says the disk is full and names what to do, exit 2; a report already there is left whole."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no private mount namespace here (unshare -rm refused)")
    ws = tmp_path / "ws"
    shutil.copytree(study_ws, ws, symlinks=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    argv = [sys.executable, "-m", "autorl.cli", "-C", str(ws), "report"]
    env = {**os.environ, "MNT": str(mnt), "KEEP_OLD": "1" if keep_old else "0"}
    r = subprocess.run(["unshare", "-rm", "sh", "-c", REPORT_ON_FULL_DISK, "sh", str(mnt), *argv], env=env, timeout=300)
    assert r.returncode == 0, "the full-disk harness did not run"
    rc = int((tmp_path / "rc").read_text())
    err = [line for line in (tmp_path / "stderr").read_text().splitlines() if line.strip()]
    before, after = (tmp_path / "before.txt").read_text(), (tmp_path / "after.txt").read_text()
    assert "Traceback" not in "\n".join(err)
    if keep_old:  # the new report is made beside the old one first: 4 KiB cannot hold it
        assert rc == 2
    if rc == 0:
        assert not err and "index.html" in after
    else:
        assert rc == 2 and len(err) == 1 and err[0].startswith("autorl: error: "), err
        assert "space" in err[0] and "--out" in err[0], err
        if keep_old:
            assert after == before and "index.html" in before  # the old report is still whole
        else:
            assert after.strip() == ""  # nothing half-written
