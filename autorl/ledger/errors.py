"""Any SQLite failure on a ledger is one line that says what it means and what to do (``ledger_error``), and
never to delete a ledger that can still be read."""

from __future__ import annotations

import functools
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from autorl.errors import DiskFullError, LedgerError, short


# ---- any SQLite failure is one line ------------------------------------------------------------------------------
def sqlite_code(exc: BaseException) -> str:
    """SQLite's error name (Python >= 3.11 gives it), else one read from the message."""
    name = getattr(exc, "sqlite_errorname", None)
    if name:
        return name
    text = str(exc).lower()
    for needle, code in (
        ("disk is full", "SQLITE_FULL"),
        ("malformed", "SQLITE_CORRUPT"),
        ("not a database", "SQLITE_NOTADB"),
        ("readonly", "SQLITE_READONLY"),
        ("locked", "SQLITE_BUSY"),
        ("disk i/o", "SQLITE_IOERR"),
        ("unable to open", "SQLITE_CANTOPEN"),
    ):
        if needle in text:
            return code
    return "SQLITE_ERROR"


def ledger_error(path: Path, exc: BaseException) -> Exception:
    """The one line that says what a SQLite failure on the ledger at ``path`` means, and what to do."""
    code, msg, where = sqlite_code(exc), short(exc, 120), short(path, 200)
    if code == "SQLITE_FULL" or (code.startswith("SQLITE_IOERR") and free_bytes(path) < (1 << 20)):
        return disk_full(path)
    if code.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return damaged(path, msg)
    if code == "SQLITE_READONLY_DBMOVED":
        return LedgerError(
            f"ledger {where} was moved or removed while in use ({msg}): put it back, then `autorl run --resume`"
        )
    if code.startswith("SQLITE_READONLY"):
        return LedgerError(
            f"ledger {where} cannot be written ({msg}): check the permissions of the file and its "
            "folder, or pass another --ledger"
        )
    if code.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return LedgerError(
            f"ledger {where} stayed locked by another process for 30 s ({msg}): try again once it is done"
        )
    if code.startswith("SQLITE_CANTOPEN"):
        return LedgerError(
            f"ledger {where} cannot be opened ({msg}): check that its folder exists and is "
            "writable, or pass another --ledger"
        )
    return LedgerError(
        f"ledger {where}: SQLite failed ({code}: {msg}): the ledger is kept as it is; check the disk, then try again"
    )


def damaged(path: Path, what: str) -> LedgerError:
    where = short(path, 200)
    return LedgerError(
        f"ledger {where} is damaged ({what}): keep the file; rebuild what it holds into a new one "
        "with `sqlite3 LEDGER .recover | sqlite3 recovered.sqlite` and pass that with --ledger "
        "(or --ledger NEW.sqlite to start afresh)"
    )


def disk_full(path: Path) -> DiskFullError:
    free = free_bytes(path)
    return DiskFullError(
        f"no space left on the disk of {short(path, 200)} ({_size(free)} free): free some space, then "
        "run the command again (a stopped study goes on with `autorl run --resume`; its ledger is "
        "kept)"
    )


def free_bytes(path: Path) -> int:
    """Bytes free to this user on the file system of ``path`` (or of the nearest folder above it that exists)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return 1 << 62


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


@contextmanager
def translated_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise ledger_error(path, exc) from None
    except OSError as exc:
        if exc.errno == 28:  # ENOSPC
            raise disk_full(path) from None
        raise


def _translating(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        with translated_errors(self.path if hasattr(self, "path") else self.ledger.path):
            return fn(self, *args, **kwargs)

    return wrapper


def translate_all(cls: type) -> None:
    """Every public method of ``cls`` turns a SQLite failure into its one line."""
    for name, fn in list(vars(cls).items()):
        if callable(fn) and not name.startswith("_") and name != "tx":
            setattr(cls, name, _translating(fn))
