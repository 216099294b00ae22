"""The file a ledger opened: which file it is, its lock, its whole-file check, how it is opened for writing
and for reading only, and how Optuna opens it."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import sqlite_utils

from autorl import locks
from autorl.errors import LedgerError, WorkspaceError, short
from autorl.ledger.errors import damaged, sqlite_code, translated_errors
from autorl.ledger.migrations import MIGRATIONS

REVIEWED = ("autorl_migrations", "autorl_studies", "autorl_trials", "autorl_events")


class LedgerFile:
    """The file a ledger opened: which file it is (``check``), its lock (``exclusive``), its whole-file check
    (``verify``) and how Optuna opens it (``optuna_url``, ``create_optuna_tables``)."""

    def __init__(self, path: Path, readonly: bool):
        self.path, self.readonly = path, readonly
        self.identity: tuple[int, int] | None = None

    def remember(self) -> None:
        """This is the file the ledger opened (its device and inode)."""
        self.identity = identity(self.path)

    @contextmanager
    def exclusive(self, what: str = "write the ledger") -> Iterator[None]:
        """The ledger's lock for the ``with`` block: one process at a time creates or migrates the ledger, creates
        Optuna's tables, numbers an attempt."""
        with locks.waiting(Path(f"{self.path}-lock"), what):
            yield

    def check(self) -> None:
        """Raise ``LedgerError`` if the path no longer names the file this ledger opened (removed, replaced)."""
        now = identity(self.path)
        if now != self.identity:
            how = "was removed" if now is None else "was replaced by another file"
            raise LedgerError(
                f"ledger {short(self.path, 200)} {how} while this study ran: the study stopped and "
                "wrote nothing more; put the ledger back, then `autorl run --resume` (a trial that "
                "was running is recovered then)"
            )

    def verify(self, db: sqlite_utils.Database) -> float:
        """``PRAGMA quick_check`` of the whole file (every page, not only the header); returns its seconds."""
        t0 = time.monotonic()
        with translated_errors(self.path):
            rows = [r[0] for r in db.execute("PRAGMA quick_check(3)").fetchall()]
        if rows != ["ok"]:
            raise damaged(self.path, "; ".join(rows)[:200])
        self.refuse_newer(db)
        return time.monotonic() - t0

    def refuse_newer(self, db: sqlite_utils.Database) -> None:
        """Raise ``LedgerError`` if the ledger records schema steps this autorl does not know: a newer autorl made
        it, and this one would misread it or write rows its schema does not hold."""
        with translated_errors(self.path):
            made = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'autorl_migrations'").fetchone()
            done = [str(r[0]) for r in db.execute("SELECT name FROM autorl_migrations")] if made else []
        unknown = sorted(set(done) - {name for name, _ in MIGRATIONS})
        if unknown:
            raise LedgerError(
                f"ledger {short(self.path, 200)} was written by a newer autorl (schema steps this one does not "
                f"know: {short(', '.join(unknown), 120)}): upgrade autorl to read or resume it, or pass another "
                "--ledger; the file is kept as it is"
            )

    def damage(self, db: sqlite_utils.Database, tables: tuple[str, ...] = REVIEWED) -> str | None:
        """What ``PRAGMA quick_check`` finds wrong in ``tables`` (the ones every review command reads; 15 ms at
        8,000 trials, where the whole file's check took 0.55 s: metric pages are checked when they are read),
        None when they are whole. A page so damaged that the check itself fails is damage too."""
        try:
            found = [str(r[0]) for table in tables for r in db.execute(f"PRAGMA quick_check({table})").fetchall()]
        except sqlite3.DatabaseError as exc:
            return str(exc)[:200]
        bad = [line for line in found if line != "ok"]
        return "; ".join(bad)[:200] if bad else None

    def partial(self, what: str) -> str:
        """The line a review command prints before what it shows of a ledger whose tables are damaged."""
        return (
            f"ledger {short(self.path, 200)} is damaged ({short(what, 200)}): what follows may be partial; keep the "
            "file; rebuild what it holds into a new one with `sqlite3 LEDGER .recover | sqlite3 recovered.sqlite` "
            "and pass that with --ledger"
        )

    def optuna_url(self) -> str:
        """The SQLAlchemy URL of this file for Optuna: it never creates the file (a removed ledger is not
        re-created empty), and is read-only for a read-only ledger."""
        mode = "ro" if self.readonly else "rw"
        return f"sqlite:///file:{quote(quote(str(self.path.resolve())))}?mode={mode}&uri=true"

    def create_optuna_tables(self) -> None:
        """Optuna's tables in this file, created by one process at a time (Optuna creates them on first use)."""
        import optuna  # lazy: a second's import the review commands never need

        optuna.logging.set_verbosity(logging.WARNING)
        with self.exclusive("create Optuna's tables"), translated_errors(self.path):
            self.check()
            storage = optuna.storages.RDBStorage(self.optuna_url(), engine_kwargs={"connect_args": {"timeout": 30}})
            storage.engine.dispose()


def open_write(path: Path) -> sqlite_utils.Database:
    check_path(path)
    conn = sqlite3.connect(str(path), timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    return sqlite_utils.Database(conn)


def check_path(path: Path) -> None:
    if path.exists() and not path.is_file():
        raise WorkspaceError(f"ledger path {short(path, 200)} is not a file: pass --ledger FILE")
    if path.is_symlink() and not path.exists():
        raise WorkspaceError(
            f"ledger path {short(path, 200)} is a link to nothing: point it at your ledger, or pass --ledger FILE"
        )
    if not path.parent.is_dir():
        raise WorkspaceError(
            f"ledger directory {short(path.parent, 200)} does not exist: create it or pass another --ledger"
        )


def open_readonly(path: Path) -> sqlite_utils.Database:
    """A read-only connection. Where SQLite cannot make the shared-memory file a WAL reader needs (a full disk,
    a read-only folder) and no write-ahead log is waiting, the file is read as it is on disk (``immutable``)."""
    check_path(path)
    with translated_errors(path):
        for extra in ("", "&immutable=1"):
            conn = sqlite3.connect(
                f"file:{quote(str(path.resolve()))}?mode=ro{extra}",
                uri=True,
                timeout=30,
                isolation_level=None,
                check_same_thread=False,
            )
            try:
                conn.execute("PRAGMA busy_timeout=30000")
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.OperationalError as exc:
                conn.close()
                if extra or _has_wal(path) or sqlite_code(exc) not in _CANNOT_READ_IN_PLACE:
                    raise
                continue
            _check_is_ledger(conn, path)
            return sqlite_utils.Database(conn)
    raise AssertionError("unreachable")


_CANNOT_READ_IN_PLACE = (
    "SQLITE_CANTOPEN",
    "SQLITE_IOERR",
    "SQLITE_FULL",
    "SQLITE_READONLY",
    "SQLITE_IOERR_SHMSIZE",
    "SQLITE_IOERR_SHMOPEN",
    "SQLITE_READONLY_CANTINIT",
    "SQLITE_IOERR_WRITE",
    "SQLITE_IOERR_TRUNCATE",
    "SQLITE_IOERR_SHMMAP",
)


def _has_wal(path: Path) -> bool:
    try:
        return os.path.getsize(f"{path}-wal") > 0
    except OSError:
        return False


def _check_is_ledger(conn: sqlite3.Connection, path: Path) -> None:
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}
    if names and not names & {"autorl_trials", "autorl_migrations"}:  # migrations alone: a ledger still being made
        conn.close()
        raise LedgerError(
            f"{short(path, 200)} is a SQLite file but not an autorl ledger (no autorl_trials table): "
            "pass your ledger with --ledger FILE"
        )


def whole_file_damage(path: Path) -> str | None:
    """What ``PRAGMA quick_check`` of the whole file finds wrong (every page, 0.55 s at 8,000 trials: run where a
    command already failed on what it read), None when it is whole or cannot be read to say."""
    try:
        db = open_readonly(path)
    except Exception:  # noqa: BLE001 - no answer is no claim of damage; the command's own failure stands
        return None
    try:
        rows = [str(r[0]) for r in db.execute("PRAGMA quick_check(3)").fetchall()]
    except sqlite3.DatabaseError as exc:
        return str(exc)[:200]
    finally:
        db.conn.close()
    return None if rows == ["ok"] else "; ".join(rows)[:200]


def identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
