"""Git for commit-scoped trials: worktrees, attempt branches, start/end tags.

Every ref name comes from :func:`slugify` / :func:`attempt_name`. A study never
touches the user's working tree, index or current branch: each trial gets its
own ``git worktree`` under ``.autorl/worktrees/`` at the study's base commit, and
an existing ref is never overwritten (git refuses, and we check first).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from autorl.errors import GitError, WorkspaceError

_SLUG_MAX = 40
_IDENTITY = ["-c", "user.name=autorl", "-c", "user.email=autorl@localhost"]


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


def git(root: Path, *args: str, check: bool = True, identity: bool = False) -> str:
    """Run git with an argv list (never a shell) and return stdout."""
    argv = ["git", *(_IDENTITY if identity else []), *args]
    proc = subprocess.run(argv, cwd=root, capture_output=True, text=True)
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise GitError(f"git {' '.join(args[:3])} failed: {msg[-1] if msg else proc.returncode}")
    return proc.stdout.strip()


def repo_root(path: str | Path) -> Path:
    """The top level of the git repository containing ``path``."""
    p = Path(path)
    if not p.is_dir():
        raise WorkspaceError(f"{p} is not a directory: pass an existing workspace with -C DIR")
    proc = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=p, capture_output=True, text=True)
    if proc.returncode != 0:
        raise WorkspaceError(f"{p.resolve()} is not a git repository: run `autorl init {p}` first")
    return Path(proc.stdout.strip())


def head_sha(root: Path) -> str:
    sha = git(root, "rev-parse", "--verify", "-q", "HEAD", check=False)
    if not sha:
        raise WorkspaceError(f"{root} has no commits yet: commit your recipe first (git add -A && git commit)")
    return sha


def current_branch(root: Path) -> str:
    return git(root, "symbolic-ref", "-q", "--short", "HEAD", check=False) or git(root, "rev-parse", "HEAD")


def next_attempt_number(root: Path, floor: int = 0) -> int:
    """One past the highest attempt-NN in any branch or tag (and past ``floor``)."""
    refs = git(root, "for-each-ref", "--format=%(refname:short)", "refs/heads/attempt-*", "refs/tags/attempt-*")
    nums = [int(m.group(1)) for m in (re.match(r"attempt-(\d+)", r) for r in refs.split()) if m]
    return max(nums + [floor]) + 1


def ref_exists(root: Path, ref: str) -> bool:
    return bool(git(root, "rev-parse", "--verify", "-q", ref, check=False))


def add_worktree(root: Path, path: Path, branch: str, base: str) -> None:
    """A new worktree on a new branch at ``base``; refuses an existing branch."""
    if ref_exists(root, f"refs/heads/{branch}"):
        raise GitError(f"branch {branch} already exists; refusing to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    git(root, "worktree", "add", "-q", "-b", branch, str(path), base)


def commit(worktree: Path, message: str, paths: list[str]) -> str:
    """Stage ``paths`` in the worktree and commit; returns the new SHA."""
    git(worktree, "add", "-f", "--", *paths)
    git(worktree, "commit", "-q", "--allow-empty", "-m", message, identity=_needs_identity(worktree))
    return git(worktree, "rev-parse", "HEAD")


def _needs_identity(root: Path) -> bool:
    return not git(root, "config", "user.email", check=False)


def tag(root: Path, name: str, sha: str, message: str | None = None) -> None:
    if ref_exists(root, f"refs/tags/{name}"):
        raise GitError(f"tag {name} already exists; refusing to overwrite it")
    if message:
        git(root, "tag", "-a", name, sha, "-m", message, identity=_needs_identity(root))
    else:
        git(root, "tag", name, sha)


def remove_worktree(root: Path, path: Path) -> None:
    """Remove a trial worktree (its branch and tags stay)."""
    if path.exists():
        git(root, "worktree", "remove", "--force", str(path), check=False)
    git(root, "worktree", "prune", check=False)


def diff(root: Path, a: str, b: str, paths: list[str] | None = None) -> str:
    return git(root, "diff", a, b, "--", *(paths or []))


def show_file(root: Path, rev: str, path: str) -> str | None:
    out = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def is_tracked_clean(root: Path, rel: str) -> bool:
    """True when ``rel`` is committed at HEAD and unmodified in the working tree."""
    tracked = git(root, "ls-files", "--error-unmatch", "--", rel, check=False)
    if not tracked:
        return False
    return not git(root, "status", "--porcelain", "--", rel, check=False)
