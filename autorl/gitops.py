"""Git for commit-scoped trials: worktrees, attempt branches, start/end tags, on GitPython.

Every ref name comes from :func:`slugify` / :func:`attempt_name`. A study never
touches the user's working tree, index or current branch: each trial gets its
own ``git worktree`` under ``.autorl/worktrees/`` at the study's base commit, a
commit made there goes through that worktree's own index, and an existing ref is
never overwritten (git refuses, and we check first). Every git failure surfaces
as one line in a :class:`GitError` (or :class:`WorkspaceError` for a bad workspace).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import git

from autorl.errors import GitError, WorkspaceError, short
from autorl.ledger.errors import disk_full, free_bytes

_SLUG_MAX = 40
_AUTORL = {"NAME": "autorl", "EMAIL": "autorl@localhost"}
_NO_REF = (git.BadName, git.BadObject, ValueError, IndexError)


def slugify(text: str, max_len: int = _SLUG_MAX) -> str:
    """The one sanitiser for ref names: [a-z0-9-], no leading/trailing/double '-'."""
    s = re.sub(r"(\d)e([-+])(\d)", lambda m: m[1] + ("em" if m[2] == "-" else "ep") + m[3], text.lower())
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    s = re.sub(r"-{2,}", "-", s)[:max_len].strip("-")
    return s or "trial"


def attempt_name(number: int, slug: str) -> str:
    return f"attempt-{number:02d}-{slugify(slug)}"


def start_tag(number: int) -> str:
    return f"attempt-{number:02d}-start"


def end_tag(number: int) -> str:
    return f"attempt-{number:02d}-end"


# ---- opening a repository and turning git failures into one line -------------------------
@contextmanager
def _open(root: Path) -> Iterator[git.Repo]:
    """The repository at ``root`` (a worktree opens as itself); closed afterwards."""
    try:
        repo = git.Repo(root, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise GitError(f"{root} is not a git repository") from None
    try:
        yield repo
    except git.GitCommandError as exc:
        if _disk_is_full(root, exc):  # git names only the file it could not write ("couldn't write '...lock'")
            raise disk_full(Path(root)) from None
        raise GitError(f"git {_verb(exc)} failed: {_last_line(exc)}") from None
    finally:
        repo.close()


FULL_BELOW = 64 * 1024  # bytes free under which a failed git write is the disk's doing


def _disk_is_full(root: Path, exc: git.GitCommandError) -> bool:
    """Whether a failed git command failed for want of space: git says so, or the disk has (almost) none left."""
    text = str(exc.stderr or "") + str(exc.stdout or "")
    return "No space left on device" in text or free_bytes(root) < FULL_BELOW


def _verb(exc: git.GitCommandError) -> str:
    argv = exc.command if isinstance(exc.command, list) else str(exc.command).split()
    return " ".join(str(a) for a in argv[1:4])


def _last_line(exc: git.GitCommandError) -> str:
    text = str(exc.stderr or exc.stdout or "").strip()
    text = text.removeprefix("stderr: '").removeprefix("stdout: '").removesuffix("'")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {exc.status}"


# ---- repository and refs --------------------------------------------------------------------
def repo_root(path: str | Path) -> Path:
    """The top level of the git repository (or worktree) containing ``path``."""
    p = Path(path)
    problem = path_problem(p)
    if problem:
        raise WorkspaceError(f"{short(str(p), 200)} {problem}: pass an existing workspace with -C DIR")
    if not p.is_dir():
        raise WorkspaceError(f"{p} is not a directory: pass an existing workspace with -C DIR")
    refuse_bare(p)
    try:
        with git.Repo(p, search_parent_directories=True) as repo:
            top = repo.working_tree_dir
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        top = None
    if top is None:
        raise WorkspaceError(
            f"{p.resolve()} is not a git repository: name your workspace with `autorl -C DIR ...`, "
            f"or make this one with `autorl init {p}`"
        )
    return Path(top).resolve()


def refuse_bare(path: Path) -> None:
    """A folder in a bare repository (one with no working tree: a clone's origin) is one line: a study needs a
    working tree, and a workspace made inside it would put a repository in the repository's own git folder."""
    try:
        with git.Repo(path, search_parent_directories=True) as repo:
            bare = Path(repo.git_dir) if repo.bare else None
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return
    if bare:
        raise WorkspaceError(f"{bare} is a bare git repository (no working tree): clone it and run autorl in the clone")


def path_problem(path: Path) -> str | None:
    """What makes ``path`` unusable before it is even opened, as the end of a sentence naming it ('is a symbolic
    link loop', 'cannot be used (File name too long)'); None when it exists or merely does not exist yet."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return "is a symbolic link loop" if exc.errno == errno.ELOOP else f"cannot be used ({exc.strerror or exc})"
    return None


def init_repo(root: Path) -> None:
    """``git init`` at ``root`` (an existing repository is left as it is)."""
    try:
        git.Repo.init(root).close()
    except git.GitCommandError as exc:
        raise WorkspaceError(
            f"cannot make a git repository at {root}: {_last_line(exc)}; pass a folder you can write to"
        ) from None


def common_dir(root: Path) -> Path:
    """The git directory shared by the repository and all its worktrees (absolute)."""
    with _open(root) as repo:
        return Path(repo.common_dir).resolve()


def has_commits(root: Path) -> bool:
    with _open(root) as repo:
        return repo.head.is_valid()


def head_sha(root: Path) -> str:
    with _open(root) as repo:
        if not repo.head.is_valid():
            raise WorkspaceError(f"{root} has no commits yet: commit your recipe first (git add -A && git commit)")
        return repo.head.commit.hexsha


def _resolves(repo: git.Repo, ref: str) -> bool:
    try:
        repo.rev_parse(ref)
    except _NO_REF:
        return False
    return True


def ref_exists(root: Path, ref: str) -> bool:
    with _open(root) as repo:
        return _resolves(repo, ref)


MAX_ATTEMPT = 10**9 - 1  # attempt numbers autorl gives; a ref with a larger one is not autorl's


ATTEMPT_REF = re.compile(r"attempt-\d+(-[a-z0-9]+)*")
"""The shape of every ref a study makes (``attempt_name``, ``start_tag``, ``end_tag``): the only refs autorl deletes."""


def checked_out_branches(root: Path) -> set[str]:
    """Branches checked out in any worktree of the repository (the user's own included): never deleted."""
    with _open(root) as repo:
        text = repo.git.worktree("list", "--porcelain")
    return {
        line.split(" ", 1)[1].removeprefix("refs/heads/") for line in text.splitlines() if line.startswith("branch ")
    }


def delete_attempt_refs(root: Path, branches: list[str], tags: list[str]) -> None:
    """Delete a study's attempt branches and tags (each name must have the shape of ``ATTEMPT_REF``; a branch
    checked out anywhere is refused by git, so filter those out first with ``checked_out_branches``)."""
    bad = [n for n in (*branches, *tags) if not ATTEMPT_REF.fullmatch(n)]
    if bad:
        raise GitError(f"refusing to delete {bad[0]}: autorl deletes only its own attempt-NN refs")
    with _open(root) as repo:
        if branches:
            repo.git.branch("-D", "--", *branches)
        if tags:
            repo.git.tag("-d", *tags)


def next_attempt_number(root: Path, floor: int = 0) -> int:
    """One past the highest attempt-NN in any branch or tag (and past ``floor``). A ref whose number has more than
    nine digits is not one of autorl's and is passed over, whatever the repository holds."""
    with _open(root) as repo:
        names, where = set(_branch_and_tag_names(repo)), str(repo.common_dir)
    seen = _HIGHEST.get(where)
    if seen is not None and seen[0] <= names:  # refs were only added since: only the new names are read
        top = max([seen[1], *(_attempt_number(n) for n in names - seen[0])])
    else:
        top = max([0, *(_attempt_number(n) for n in names)])
    _HIGHEST[where] = (names, top)
    return max(top, floor) + 1


_HIGHEST: dict[str, tuple[set[str], int]] = {}  # per repository: the ref names last read, and their highest number


def _holds_a_ref(folder: Path) -> bool:
    """A folder of loose refs (a name with '/') that still holds one: an emptied one names no ref."""
    return any(p.is_file() for p in folder.rglob("*"))


def _attempt_number(name: str) -> int:
    m = re.match(r"attempt-(\d{1,9})(?!\d)", name)
    return int(m.group(1)) if m else 0


def _branch_and_tag_names(repo: git.Repo) -> list[str]:
    """Every branch and tag name as far as its first '/' (all an attempt number needs), read from the ref folders
    and ``packed-refs`` as they lie: a study adds three refs a trial, and building a GitPython object for each of
    thousands at every trial was a growing share of its time. A repository that keeps its refs otherwise
    (reftable) is listed through GitPython."""
    common = Path(repo.common_dir)
    folders = [common / "refs" / "heads", common / "refs" / "tags"]
    if (common / "reftable").exists() or not all(f.is_dir() for f in folders):
        return [r.name for r in (*repo.heads, *repo.tags)]
    names = [
        entry.name
        for folder in folders
        for entry in os.scandir(folder)
        if not entry.is_dir() or _holds_a_ref(Path(entry.path))
    ]
    try:
        packed = (common / "packed-refs").read_text(errors="replace").splitlines()
    except FileNotFoundError:
        packed = []
    for line in packed:
        ref = line.partition(" ")[2]
        if ref.startswith(("refs/heads/", "refs/tags/")):
            names.append(ref.split("/", 2)[2])
    return names


def free_attempt_number(root: Path, number: int, slug: str) -> int:
    """``number``, or the next one whose branch ``attempt-NN-slug`` and tags ``attempt-NN-start``/``-end`` are all
    free (a branch or tag someone made by hand is never overwritten, and never stops a study)."""
    with _open(root) as repo:
        while any(
            _resolves(repo, ref)
            for ref in (
                f"refs/heads/{attempt_name(number, slug)}",
                f"refs/tags/{start_tag(number)}",
                f"refs/tags/{end_tag(number)}",
            )
        ):
            number += 1
    if number > MAX_ATTEMPT:
        raise GitError(f"attempt numbers are used up to {MAX_ATTEMPT} in {root}: start a new workspace")
    return number


def refs(root: Path) -> dict[str, str]:
    """Every branch and tag by short name with the commit it points at (tags peeled)."""
    with _open(root) as repo:
        out = {}
        for ref in (*repo.heads, *repo.tags):
            try:
                out[ref.name] = ref.commit.hexsha
            except _NO_REF:
                continue
        return out


# ---- worktrees -------------------------------------------------------------------------------
def add_worktree(root: Path, path: Path, branch: str, base: str) -> None:
    """A new worktree on a new branch at ``base``; refuses an existing branch."""
    with _open(root) as repo:
        if _resolves(repo, f"refs/heads/{branch}"):
            raise GitError(f"branch {branch} already exists; refusing to overwrite it")
        path.parent.mkdir(parents=True, exist_ok=True)
        repo.git.worktree("add", "-q", "-b", branch, str(path), base)


def add_detached_worktree(root: Path, path: Path, rev: str) -> None:
    """A throwaway worktree with a detached HEAD at ``rev`` (no branch is created)."""
    with _open(root) as repo:
        path.parent.mkdir(parents=True, exist_ok=True)
        repo.git.worktree("add", "-q", "--detach", str(path), rev)


def remove_worktree(root: Path, path: Path) -> None:
    """Remove a trial worktree (its branch and tags stay); a missing one is not an error."""
    with _open(root) as repo:
        if path.exists():
            _quietly(repo.git.worktree, "remove", "--force", str(path))
        _quietly(repo.git.worktree, "prune")


def _quietly(fn, *args: str) -> None:
    try:
        fn(*args)
    except git.GitCommandError:
        pass


# ---- commits, tags, patches ------------------------------------------------------------------
def commit(worktree: Path, message: str, paths: list[str], *, as_autorl: bool = False) -> str:
    """Stage ``paths`` (even ignored ones) in the worktree's own index and commit; returns the SHA.

    The commit is made even when nothing changed. Identity: git's environment variables,
    else the user's configured one, else autorl <autorl@localhost> (always, with ``as_autorl``).
    """
    with _open(worktree) as repo:
        _stage(repo, paths)
        author, committer = _actors(repo, as_autorl)
        return repo.index.commit(message, author=author, committer=committer).hexsha


def _stage(repo: git.Repo, paths: list[str]) -> None:
    """``git add -f``: present paths are added, vanished tracked ones are staged as removed."""
    if repo.working_tree_dir is None:
        raise GitError(f"{repo.git_dir} is a bare repository: nothing to stage")
    top = Path(repo.working_tree_dir)
    present = [p for p in paths if (top / p).exists() or (top / p).is_symlink()]
    gone = [p for p in paths if p not in present]
    if present:
        repo.index.add(present, force=True)
    if gone:
        repo.index.remove(gone, r=True)


def _has_identity(repo: git.Repo) -> bool:
    return bool(repo.config_reader().get_value("user", "email", default=""))


def _actors(repo: git.Repo, as_autorl: bool) -> tuple[git.Actor | None, git.Actor | None]:
    """None (GitPython reads env and config) when the user has an identity, else autorl's."""
    if _has_identity(repo) and not as_autorl:
        return None, None
    return _autorl_actor("AUTHOR"), _autorl_actor("COMMITTER")


def _autorl_actor(role: str) -> git.Actor:
    env = _identity_env(role)
    return git.Actor(env[f"GIT_{role}_NAME"], env[f"GIT_{role}_EMAIL"])


def _identity_env(role: str) -> dict[str, str]:
    """autorl's identity for ``role``, where git's own environment variables don't set one."""
    return {f"GIT_{role}_{k}": os.environ.get(f"GIT_{role}_{k}", v) for k, v in _AUTORL.items()}


def tag(root: Path, name: str, sha: str, message: str | None = None) -> None:
    """Tag ``sha`` (annotated when ``message`` is given); refuses an existing tag."""
    with _open(root) as repo:
        if _resolves(repo, f"refs/tags/{name}"):
            raise GitError(f"tag {name} already exists; refusing to overwrite it")
        env = _identity_env("COMMITTER") if message and not _has_identity(repo) else {}
        with repo.git.custom_environment(**env):
            repo.create_tag(name, ref=sha, message=message)


def apply_patch(worktree: Path, patch: Path) -> list[str]:
    """Apply a patch file in the worktree (not its index); returns the paths it touches."""
    with _open(worktree) as repo:
        stat = repo.git.apply("--numstat", str(patch))
        repo.git.apply(str(patch))
    return [line.split("\t")[-1] for line in stat.splitlines() if line.strip()]


# ---- reading ---------------------------------------------------------------------------------
def diff(root: Path, a: str, b: str, paths: list[str] | None = None) -> str:
    with _open(root) as repo:
        return repo.git.diff(a, b, "--", *(paths or [])).strip()


def show_file(root: Path, rev: str, path: str) -> str | None:
    """The text of ``path`` at ``rev``, or None when either does not exist."""
    with _open(root) as repo:
        try:
            blob = repo.commit(rev).tree / path
        except (*_NO_REF, KeyError):
            return None
        if blob.type != "blob":
            return None
        return blob.data_stream.read().decode("utf-8", errors="replace")
