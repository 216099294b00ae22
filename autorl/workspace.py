"""A workspace: a git repository with recipes/, hypotheses/, patches/ and ledger.sqlite.

autorl writes only two things into the user's working tree: ``ledger.sqlite`` and
its run folder ``.autorl/`` (worktrees, run logs, caches). Both are ignored via
``.git/info/exclude``, which is not part of the working tree.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from autorl import gitops
from autorl.data import shipped
from autorl.errors import WorkspaceError

RUN_DIR = ".autorl"
LEDGER = "ledger.sqlite"
IGNORES = [f"/{RUN_DIR}/", f"/{LEDGER}", f"/{LEDGER}-*"]
@dataclass(frozen=True)
class Workspace:
    root: Path
    ledger_path: Path

    @classmethod
    def open(cls, path: str | Path = ".", ledger: str | Path | None = None) -> "Workspace":
        root = gitops.repo_root(path)
        lp = Path(ledger).resolve() if ledger else root / LEDGER
        return cls(root=root, ledger_path=lp)

    @property
    def run_dir(self) -> Path:
        return self.root / RUN_DIR

    @property
    def worktrees(self) -> Path:
        return self.run_dir / "worktrees"

    @property
    def runs(self) -> Path:
        return self.run_dir / "runs"

    @property
    def cache(self) -> Path:
        return self.run_dir / "cache"

    def ensure_ignored(self) -> None:
        """Keep autorl's files out of ``git status`` without editing the user's tree."""
        exclude = gitops.common_dir(self.root) / "info" / "exclude"
        exclude.parent.mkdir(parents=True, exist_ok=True)
        text = exclude.read_text() if exclude.exists() else ""
        missing = [line for line in IGNORES if line not in text.splitlines()]
        if missing:
            exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n") + "\n".join(missing) + "\n")
        for d in (self.worktrees, self.runs, self.cache):
            d.mkdir(parents=True, exist_ok=True)

    def rel(self, path: Path) -> str:
        return str(path.resolve().relative_to(self.root))


def default_recipe_source() -> Path:
    """The shipped default recipe (recipes/default.yaml of the installed package or checkout)."""
    path = shipped("recipes", "default.yaml")
    if not path.is_file():
        raise WorkspaceError("the default recipe is missing from this installation: reinstall autorl")
    return path


def init_workspace(path: str | Path) -> Path:
    """Make ``path`` a workspace: git init if needed, default recipe, ignores, first commit."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    if not (root / ".git").exists():
        gitops.init_repo(root)
    for sub in ("recipes", "hypotheses", "patches"):
        (root / sub).mkdir(exist_ok=True)
    recipe = root / "recipes" / "default.yaml"
    if not recipe.exists():
        shutil.copyfile(default_recipe_source(), recipe)
    _append_gitignore(root / ".gitignore")
    if not gitops.has_commits(root):
        gitops.commit(root, "autorl init: default recipe and ignores", ["recipes/default.yaml", ".gitignore"],
                      as_autorl=True)
    return root.resolve()


def _append_gitignore(path: Path) -> None:
    text = path.read_text() if path.exists() else ""
    missing = [line for line in IGNORES if line not in text.splitlines()]
    if missing:
        prefix = "" if not text or text.endswith("\n") else "\n"
        path.write_text(text + prefix + "# autorl: run folder and ledger\n" + "\n".join(missing) + "\n")
