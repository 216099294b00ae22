"""The error tree. The CLI turns each into one line and an exit code.

``UserError`` (exit 2) is a mistake the user can fix: bad recipe, bad flag, not a
git repository. Anything else under ``AutorlError`` (exit 1) is a failure of the
system or an external tool. Messages name what is wrong and what to do.
``validation_line`` is the one formatter of a pydantic ValidationError; ``short`` bounds any value shown in a
message and ``one_line`` is what the CLI prints of an error: one line, bounded in length, whatever it quotes.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from typing import Any

MAX_LINE = 600  # characters of an error line, the quoted values shortened to fit


class AutorlError(Exception):
    """Base class: a failure autorl can explain in one line."""

    exit_code = 1


class UserError(AutorlError):
    """Bad input: a recipe, a flag, a path. Exit code 2; nothing was written."""

    exit_code = 2


class RecipeError(UserError):
    """A recipe file or a ``--set`` override does not validate."""


class RulesError(UserError):
    """A rules table (``autorl/data/rules/*.yaml``, or one a test or user passes) that does not load or validate."""


class WorkspaceError(UserError):
    """The workspace is not usable (not a git repository, unwritable ledger, ...)."""


class BudgetError(UserError):
    """A ``--budget`` string that cannot be parsed."""


class NotFoundError(UserError):
    """A trial, study or file the user named does not exist."""


class StudyBusyError(UserError):
    """The study is run by another controller (its lock is held)."""


class LedgerError(WorkspaceError):
    """The ledger is gone, replaced, damaged or not an autorl ledger; the line says what to do, and never to delete
    a ledger that can still be read."""


class DiskFullError(UserError):
    """No space left where the study writes (its ledger, worktrees or run folder)."""


class GitError(AutorlError):
    """A git command failed."""


class BackendError(AutorlError):
    """A backend could not plan or launch a trial."""


def validation_line(exc: Any, prefix: str = "", unknown: Callable[[tuple], str] | None = None) -> str:
    """One line naming the first invalid field of a pydantic ValidationError (an unknown key first).

    ``prefix`` is prepended to the field's path (``train`` gives ``train.lr``); ``unknown(loc)`` says what to do
    about an unknown key (default: check the spelling).
    """
    err = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    loc = ".".join(str(p) for p in err["loc"])
    loc = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
    if err["type"] == "extra_forbidden":
        return f"unknown key '{loc}': {unknown(err['loc']) if unknown else 'check the spelling'}"
    if err["type"] == "missing":
        return f"'{loc}' is missing: add it"
    msg = short(err["msg"].removeprefix("Value error, "), 300)
    got = f" (got {short_repr(err['input'])})" if "input" in err and not isinstance(err["input"], dict) else ""
    return f"{short(loc, 120)}: {msg}{got}" if loc else msg


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxlevel = 60, 60, 4, 4, 4, 2


def short_repr(value: Any) -> str:
    """``repr(value)``, bounded whatever its size or depth (only what is shown is walked)."""
    return _REPR.repr(value)


def short(value: Any, limit: int = 80) -> str:
    """``str(value)`` on one line, its middle elided beyond ``limit`` characters."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        keep = max(limit - 5, 2)
        text = f"{text[: keep * 2 // 3]} ... {text[len(text) - keep // 3 :]}"
    return " ".join(text.split()) if ("\n" in text or "\r" in text) else text


def one_line(exc: BaseException | str) -> str:
    """What the CLI prints of an error: one line of at most ``MAX_LINE`` characters (its end, what to do, kept)."""
    return short(" ".join(str(exc).split()), MAX_LINE)
