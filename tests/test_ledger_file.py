"""The ledger's file: removed, replaced, moved, damaged, on a full disk, created by several processes at once, read
by the review commands. Real SQLite files, real Optuna storage, real processes; the full disk is a real tmpfs in
a private mount namespace."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autorl.errors import LedgerError, NotFoundError
from autorl.ledger import Ledger, ledger_guard, open_read


def _ledger_with_rows(path: Path, n: int = 3) -> Ledger:
    led = Ledger(path)
    sid = led.create_study(name="s", recipe="r", strategy="random", optuna_study="s")
    for i in range(1, n + 1):
        tid = led.add_trial(study_id=sid, number=i, attempt=f"attempt-{i:02d}-x")
        led.add_metrics(tid, [{"type": "step", "step": k, "loss": 0.1 * k} for k in range(50)])
    return led


def test_a_removed_ledger_stops_every_write_and_is_never_created_again(tmp_path):
    path = tmp_path / "ledger.sqlite"
    led = _ledger_with_rows(path)
    led.file.create_optuna_tables()
    path.unlink()
    with pytest.raises(LedgerError, match="was removed while this study ran.*put the ledger back"):
        led.add_trial(study_id=1, number=9, attempt="attempt-09-x")
    with pytest.raises(LedgerError, match="was removed"):
        led.file.create_optuna_tables()
    import optuna

    with pytest.raises(Exception):  # noqa: B017 - Optuna's storage opens the file without ever creating it
        optuna.storages.RDBStorage(led.file.optuna_url())
    assert not path.exists()


def test_a_replaced_ledger_is_noticed_and_the_new_file_is_left_as_it_is(tmp_path):
    path = tmp_path / "ledger.sqlite"
    led = _ledger_with_rows(path)
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    digest = hashlib.sha256(other.read_bytes()).hexdigest()
    os.replace(other, path)
    with pytest.raises(LedgerError, match="was replaced by another file"):
        led.event(1, None, "x", "y")
    led.close(lost=True)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    wal = Path(f"{path}-wal")  # the old log is not left to be read into the new file
    assert not wal.exists() or wal.stat().st_size == 0
    conn = sqlite3.connect(path)
    assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["t"]


def test_a_ledger_moved_away_is_whole_where_it_went(tmp_path):
    """Its write-ahead log is folded into it, wherever it now is: moved back, it holds every row written."""
    path = tmp_path / "ledger.sqlite"
    led = _ledger_with_rows(path, n=5)
    aside = tmp_path / "aside.sqlite"
    os.rename(path, aside)  # the log stays behind under the old name, or goes along: either way
    with pytest.raises(LedgerError, match="was removed"):
        led.event(1, None, "x", "y")
    led.close(lost=True)
    assert not Path(f"{path}-wal").exists() or os.path.getsize(f"{path}-wal") == 0
    os.rename(aside, path)
    back = open_read(path)
    assert [t.number for t in back.trials()] == [1, 2, 3, 4, 5]
    assert back.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _corrupt_middle(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.close()
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.seek(size // 2 // 4096 * 4096)
        fh.write(b"\xa5" * 8192)


def test_a_damaged_page_anywhere_is_one_line_that_keeps_the_file(tmp_path):
    path = tmp_path / "ledger.sqlite"
    _ledger_with_rows(path, n=40).close()
    _corrupt_middle(path)
    with pytest.raises(LedgerError) as err:
        ledger_guard(path)  # a study does not start on it: every page is read, not only the header
    line = str(err.value)
    assert "is damaged" in line and "keep the file" in line and ".recover" in line
    assert not any(word in line.split() for word in ("delete", "remove", "rm"))
    led = open_read(path)  # the header reads: the review commands open it
    with pytest.raises(LedgerError, match="is damaged"):
        [led.metrics(t.id) for t in led.trials()]  # whichever query meets the damage says so in one line


def test_a_file_that_is_not_a_ledger_is_one_line_and_stays_as_it_is(tmp_path):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"these are not the bytes of a database" * 100)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    for call in (lambda: open_read(path), lambda: ledger_guard(path)):
        with pytest.raises(LedgerError, match="keep the file"):
            call()
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(LedgerError, match="not an autorl ledger"):
        open_read(other)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_a_ledger_caught_between_its_record_table_and_its_tables_is_read_as_a_ledger(tmp_path):
    """A ledger whose creation stopped (or, with an older autorl, is still going on) after its migration record
    table and before its tables: a reader finishes the migrations instead of calling it someone else's file."""
    path = tmp_path / "ledger.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE autorl_migrations (name TEXT PRIMARY KEY, applied REAL)")
    conn.commit()
    conn.close()
    led = open_read(path)
    assert led.trials() == []
    led.close()
    names = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"autorl_trials", "autorl_studies", "autorl_migrations"} <= names


def test_the_review_side_does_not_make_an_empty_file_a_ledger(tmp_path):
    """`autorl --ledger EMPTY status` turned an empty file into a 45 kB ledger with lock, WAL and shm files."""
    for name, make in (
        ("empty", lambda p: p.write_bytes(b"")),
        ("no-tables.sqlite", lambda p: sqlite3.connect(p).execute("VACUUM").connection.close()),
    ):
        path = tmp_path / name
        make(path)
        before = path.read_bytes()
        with pytest.raises(NotFoundError, match="holds no autorl ledger"):
            open_read(path)
        assert path.read_bytes() == before and sorted(
            x.name for x in tmp_path.iterdir() if x.name.startswith(name)
        ) == [name]


def test_a_new_ledger_never_shows_its_record_table_without_its_tables(tmp_path, monkeypatch):
    """Creation commits the record table with the first migration: a reader at any commit sees nothing or both."""
    path, connect = tmp_path / "ledger.sqlite", sqlite3.connect
    seen: list[set[str]] = []

    def look(statement: str) -> None:  # called as each statement starts: a COMMIT shows what the last one left
        if statement.strip().upper() == "COMMIT":
            peek = connect(path)
            seen.append({r[0] for r in peek.execute("SELECT name FROM sqlite_master WHERE type = 'table'")})
            peek.close()

    def traced(*args, **kwargs):
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(look)
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced)
    Ledger(path).close()
    assert len(seen) >= 2
    assert all("autorl_trials" in names for names in seen if "autorl_migrations" in names), seen


def test_the_review_side_reads_without_writing(tmp_path):
    path = tmp_path / "ledger.sqlite"
    _ledger_with_rows(path).close()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    led = open_read(path)
    assert len(led.trials()) == 3
    with pytest.raises(LedgerError, match="cannot be written"):
        led.event(None, None, "x", "y")
    led.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    with pytest.raises(NotFoundError):
        open_read(tmp_path / "none.sqlite")
    assert not (tmp_path / "none.sqlite").exists()


CREATE = textwrap.dedent("""
    import sys
    from autorl.ledger import Ledger
    led = Ledger(sys.argv[1])
    led.file.create_optuna_tables()
    import optuna
    optuna.create_study(study_name=sys.argv[2], storage=led.file.optuna_url())
    print("ok")
""")


def test_several_processes_create_one_fresh_ledger_and_optunas_tables_at_once(tmp_path):
    for attempt in range(2):
        path = tmp_path / f"ledger{attempt}.sqlite"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CREATE, str(path), f"s{i}"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(4)
        ]
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 and o.strip() == "ok" for p, (o, _) in zip(procs, outs)), [e for _, e in outs]
        led = open_read(path)
        assert led.db.execute("SELECT count(*) FROM studies").fetchone()[0] == 4


FULL = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from autorl.errors import DiskFullError
    from autorl.ledger import Ledger, open_read, ledger_guard
    mnt = Path(sys.argv[1])
    path = mnt / "ledger.sqlite"
    led = Ledger(path)
    sid = led.create_study(name="s", recipe="r", strategy="random", optuna_study="s")
    tid = led.add_trial(study_id=sid, number=1, attempt="attempt-01-x")
    with open(mnt / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"0" * 65536)
        except OSError:
            pass
    try:
        for k in range(10000):
            led.add_metrics(tid, [{"type": "step", "step": k, "text": "x" * 4000}])
        print("no error")
    except DiskFullError as exc:
        print("full:", exc)
    os.system(f"sync")
    try:
        ledger_guard(path)
        print("guard passed")
    except DiskFullError as exc:
        print("guard:", exc)
    print("rows:", len(open_read(path).trials()))
""")


def _unshare_tmpfs(script: str, tmp_path: Path, size: str = "2m") -> str:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("no private mount namespace here (unshare -rm refused)")
    code = tmp_path / "script.py"
    code.write_text(script)
    r = subprocess.run(
        [
            "unshare",
            "-rm",
            "sh",
            "-c",
            f'mount -t tmpfs -o size={size} tmpfs "$1" && "$2" "$3" "$1"',
            "sh",
            str(mnt),
            sys.executable,
            str(code),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_full_disk_is_one_line_and_the_ledger_still_reads(tmp_path):
    out = _unshare_tmpfs(FULL, tmp_path)
    assert "full: no space left on the disk of" in out and "free some space" in out, out
    assert "guard: no space left" in out  # a study does not start there
    assert "rows: 1" in out  # the review commands read it on the full disk
    assert "delete" not in out


def _corrupt_trial_page(path: Path, marker: bytes) -> None:
    """Overwrite the cells of the page that holds ``marker`` (a trial row's text), leaving its header."""
    data = bytearray(path.read_bytes())
    page = 4096
    at = data.find(marker)
    assert at > 0, "the marker is in the file"
    start = (at // page) * page + 16
    data[start : start + page - 16] = b"\x7f" * (page - 16)
    path.write_bytes(bytes(data))


def test_a_review_opens_a_ledger_with_the_damage_its_tables_show(tmp_path):
    """The review commands read the ledger without a study's whole-file check: open_read checks the tables every
    review reads (trials, studies, events) and says what it found, so a command can say it shows part of a damaged
    ledger before it shows it; an intact ledger says nothing."""
    path = tmp_path / "ledger.sqlite"
    _ledger_with_rows(path, n=40).close()
    assert open_read(path).damage is None
    _corrupt_trial_page(path, b"attempt-20")
    led = open_read(path)
    assert led.damage is not None and len(led.damage) <= 200
