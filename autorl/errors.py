"""The error tree. The CLI turns each into one line and an exit code.

``UserError`` (exit 2) is a mistake the user can fix: bad recipe, bad flag, not a
git repository. Anything else under ``AutorlError`` (exit 1) is a failure of the
system or an external tool. Messages name what is wrong and what to do.
"""


class AutorlError(Exception):
    """Base class: a failure autorl can explain in one line."""

    exit_code = 1


class UserError(AutorlError):
    """Bad input: a recipe, a flag, a path. Exit code 2; nothing was written."""

    exit_code = 2


class RecipeError(UserError):
    """A recipe file or a ``--set`` override does not validate."""


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


class LedgerError(AutorlError):
    """The ledger could not be read or written."""
