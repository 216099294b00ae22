"""The error tree. The CLI turns each into one line and an exit code.

``UserError`` (exit 2) is a mistake the user can fix: bad recipe, bad flag, not a
git repository. Anything else under ``AutorlError`` (exit 1) is a failure of the
system or an external tool. Messages name what is wrong and what to do.
``validation_line`` is the one formatter of a pydantic ValidationError.
"""

from __future__ import annotations

from typing import Any, Callable


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
    msg = err["msg"].removeprefix("Value error, ")
    got = f" (got {err['input']!r})" if "input" in err and not isinstance(err["input"], dict) else ""
    return f"{loc}: {msg}{got}" if loc else msg
