"""A workspace: a git repository with recipes/, hypotheses/, patches/ and ledger.sqlite.

autorl writes only two things into the user's working tree: ``ledger.sqlite`` (with SQLite's ``-wal``/``-shm``
files and its ``-lock`` file beside it) and its run folder ``.autorl/`` (worktrees, run logs, caches, locks). Both
are ignored via ``.git/info/exclude``, which is not part of the working tree.

One controller runs a study at a time: ``lock_study`` takes the study's lock in ``.autorl/locks/`` for the
controller's life (``autorl.locks``: released by the kernel when the controller ends, however it ends), and
``study_holder`` says who holds it. Several studies may run in one workspace at once, each with its own lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from autorl import gitops, locks
from autorl.data import shipped
from autorl.errors import StudyBusyError, WorkspaceError, short
from autorl.locks import Lock

FULLRUN_MONITOR = "autorl.promote.fullrun"  # the module a full run's monitor runs as (promote spawns it)

RUN_DIR = ".autorl"
LEDGER = "ledger.sqlite"
IGNORES = [f"/{RUN_DIR}/", f"/{LEDGER}", f"/{LEDGER}-*"]


@dataclass(frozen=True)
class Workspace:
    root: Path
    ledger_path: Path

    @classmethod
    def open(cls, path: str | Path = ".", ledger: str | Path | None = None) -> Workspace:
        root = gitops.repo_root(path)
        lp = _ledger_path(Path(ledger)) if ledger else root / LEDGER
        ws = cls(root=root, ledger_path=lp)
        ws.check_run_dir()
        return ws

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

    @property
    def locks(self) -> Path:
        return self.run_dir / "locks"

    def check_run_dir(self) -> None:
        """``.autorl`` and its folders are folders (or links to folders) where they exist: a file or a link to
        nothing in their place is one line, whoever asks."""
        for d in (self.run_dir, self.worktrees, self.runs, self.cache, self.locks):
            if d.is_symlink() and not d.exists():
                raise WorkspaceError(
                    f"{short(d, 200)} is a link to nothing: autorl keeps its run folder there; point "
                    "the link at a folder, or move it away"
                )
            if d.exists() and not d.is_dir():
                raise WorkspaceError(
                    f"{short(d, 200)} is not a folder: autorl keeps its run folder there; move it "
                    "away (or rename it) and run again"
                )
            if d == self.run_dir and not d.exists():
                return

    def ensure_ignored(self) -> None:
        """Keep autorl's files out of ``git status`` without editing the user's tree, and make the run folder."""
        self.check_run_dir()
        try:
            for d in (self.worktrees, self.runs, self.cache, self.locks):
                d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WorkspaceError(
                f"cannot make autorl's run folder {short(self.run_dir, 200)} ({exc.strerror}): check "
                "that the workspace is writable"
            ) from None
        exclude = gitops.common_dir(self.root) / "info" / "exclude"
        text = exclude.read_text(errors="replace") if exclude.is_file() else ""
        missing = [line for line in IGNORES if line not in text.splitlines()]
        if missing:
            try:
                write_atomically(
                    exclude, text + ("" if text.endswith("\n") or not text else "\n") + "\n".join(missing) + "\n"
                )
            except OSError as exc:
                raise WorkspaceError(
                    f"cannot write {short(exclude, 200)} ({exc.strerror}): free some space or fix "
                    "its permissions, then run again"
                ) from None

    def study_lock_path(self, name: str) -> Path:
        """The lock file of study ``name`` in this workspace's ledger."""
        key = hashlib.sha1(f"{self.ledger_path.resolve()}\0{name}".encode()).hexdigest()[:12]
        return self.locks / f"study-{gitops.slugify(name, 40)}-{key}.lock"

    def _lock_dir(self) -> None:
        self.check_run_dir()
        try:
            self.locks.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WorkspaceError(
                f"cannot make {short(self.locks, 200)} ({exc.strerror}): check that the workspace is writable"
            ) from None

    def lock_study(self, name: str) -> Lock:
        """Hold study ``name``'s lock for the controller's life; another live controller of it is one line."""
        self._lock_dir()
        try:
            return locks.hold(self.study_lock_path(name), f"study {name}")
        except locks.Busy as exc:
            raise _busy(name, exc.holder) from None

    def check_study_free(self, name: str) -> None:
        """The line ``lock_study`` would refuse with, now, when a controller holds study ``name`` (nothing written)."""
        holder = self.study_holder(name)
        if holder is not None:
            raise _busy(name, holder)

    def study_holder(self, name: str) -> dict | None:
        """Who runs study ``name`` now ({pid, host, since}), or None when no controller does."""
        return locks.holder(self.study_lock_path(name))

    @property
    def promote_lock_path(self) -> Path:
        return self.locks / "promote.lock"

    def lock_promote(self, what: str) -> Lock:
        """Hold the workspace's promote lock while re-validating: two at once would share run names and worktrees."""
        self._lock_dir()
        try:
            return locks.hold(self.promote_lock_path, what)
        except locks.Busy as exc:
            raise StudyBusyError(
                f"another `autorl promote` runs in this workspace ({locks.describe(exc.holder)}: "
                f"{short(str((exc.holder or {}).get('what', '')), 120)}); wait for it to end "
                "(`autorl status` shows it)"
            ) from None

    def promote_holder(self) -> dict | None:
        """The promote re-validating now ({pid, host, since, what}), or None."""
        return locks.holder(self.promote_lock_path)

    def record_monitor(self, number: int, pid: int) -> None:
        """Write where full run ``number``'s monitor runs (pid, host): `status` and `promote --resume` read it, so a
        monitor on another machine of a shared workspace is not taken for a lost one."""
        record = {"pid": pid, "host": socket.gethostname()}
        write_atomically(self.runs / f"fullrun-{number:02d}.monitor.json", json.dumps(record) + "\n")

    def _monitor_record(self, number: int) -> dict:
        try:
            record = json.loads((self.runs / f"fullrun-{number:02d}.monitor.json").read_text()[:4096])
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def monitor_elsewhere(self, number: int) -> str | None:
        """The host of full run ``number``'s monitor when it is not this machine (None: this one, or no record)."""
        return _elsewhere(self._monitor_record(number))

    def monitor_alive(self, number: int, row_pid: int | None) -> bool:
        """Whether full run ``number`` still has a monitor to record its end. On another machine of a shared
        workspace it cannot be probed and is taken as running. Here, the pid promote recorded must be alive and be
        a full-run monitor still: a pid is soon another process's once its own has gone. A run with no record
        (launched by an older autorl) is probed by the pid on its row (its monitor's, or its trainer's once
        launched), which errs towards running: a live run is never taken for lost."""
        record = self._monitor_record(number)
        if _elsewhere(record) is not None:
            return True
        pid = record.get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool):
            return locks.pid_alive(pid, FULLRUN_MONITOR)
        return locks.pid_alive(row_pid)

    def rel(self, path: Path) -> str:
        return str(path.resolve().relative_to(self.root))

    def shown(self, path: Path) -> str:
        """``path`` as a message names it: relative to the workspace where it lies under it (also through a linked
        run folder, e.g. `.autorl` on a scratch disk), else in full."""
        for candidate in (path, path.resolve()):
            try:
                return str(candidate.relative_to(self.root))
            except ValueError:
                continue
        return str(path)


def _elsewhere(record: dict) -> str | None:
    host = record.get("host")
    return host if isinstance(host, str) and host and host != socket.gethostname() else None


def _busy(name: str, holder: dict | None) -> StudyBusyError:
    return StudyBusyError(
        f"study {short(name, 80)} is being run by {locks.describe(holder)}: one "
        "controller per study; wait for it to end, or stop it (Ctrl-C, or kill -INT "
        f"{(holder or {}).get('pid', 'PID')}) before `autorl run --resume`"
    )


def _ledger_path(ledger: Path) -> Path:
    """``--ledger`` made absolute; a symbolic link loop or a path the system refuses is one line."""
    problem = gitops.path_problem(ledger)
    if problem:
        raise WorkspaceError(f"ledger path {short(ledger, 200)} {problem}: point --ledger at your ledger file")
    return ledger.resolve()


def default_recipe_source() -> Path:
    """The shipped default recipe (recipes/default.yaml of the installed package or checkout)."""
    path = shipped("recipes", "default.yaml")
    if not path.is_file():
        raise WorkspaceError("the default recipe is missing from this installation: reinstall autorl")
    return path


def init_workspace(path: str | Path) -> Path:
    """Make ``path`` a workspace: git init if needed, default recipe, ignores, first commit. A folder that cannot be
    one (a file, a link loop, a bare repository, a name the system refuses, a file where a folder of the workspace
    goes) is one line, before anything is written; a failure on the way undoes what it made."""
    root = Path(path)
    _check_init_target(root)
    made: list[tuple[Path, str | None]] = []  # what this init made (None) or changed (the old text), in order
    try:
        return _init(root, made)
    except BaseException as exc:
        _undo(made)
        if isinstance(exc, OSError):
            raise WorkspaceError(
                f"cannot make a workspace at {short(root, 200)}: {exc.strerror or exc}; pass a folder you can write to"
            ) from None
        raise


def _check_init_target(root: Path) -> None:
    """``autorl init``'s folder is a folder, or nothing yet, outside any bare repository, and where the workspace's
    folders and files go there is nothing of another kind."""
    problem = gitops.path_problem(root)
    if problem:
        raise WorkspaceError(f"{short(root, 200)} {problem}: pass another folder to `autorl init`")
    if root.exists() and not root.is_dir():
        raise WorkspaceError(
            f"{short(root, 200)} is a file, not a folder: pass a new or existing folder to `autorl init`"
        )
    gitops.refuse_bare(next(p for p in (root, *root.absolute().parents) if p.is_dir()))
    wanted = [(root / sub, True) for sub in ("recipes", "hypotheses", "patches")]
    wanted += [(root / "recipes" / "default.yaml", False), (root / ".gitignore", False)]
    for place, folder in wanted:
        if place.is_symlink() and not place.exists():
            raise WorkspaceError(
                f"{short(place, 200)} is a link to nothing, where a workspace has a {'folder' if folder else 'file'}: "
                "point it at one, or move it away, then `autorl init` again"
            )
        if place.exists() and place.is_dir() != folder:
            kind, want = ("a file", "a folder") if folder else ("a folder", "a file")
            raise WorkspaceError(
                f"{short(place, 200)} is {kind}, where a workspace has {want}: move it away, then `autorl init` again"
            )


def _init(root: Path, made: list[tuple[Path, str | None]]) -> Path:
    _make_dir(root, made)
    if not (root / ".git").exists():
        made.append((root / ".git", None))
        gitops.init_repo(root)
    for sub in ("recipes", "hypotheses", "patches"):
        _make_dir(root / sub, made)
    recipe = root / "recipes" / "default.yaml"
    if not recipe.exists():
        made.append((recipe, None))
        shutil.copyfile(default_recipe_source(), recipe)
    _append_gitignore(root / ".gitignore", made)
    if not gitops.has_commits(root):
        gitops.commit(
            root, "autorl init: default recipe and ignores", ["recipes/default.yaml", ".gitignore"], as_autorl=True
        )
    return root.resolve()


def _make_dir(path: Path, made: list[tuple[Path, str | None]]) -> None:
    """``mkdir -p path``, noting the outermost folder it made."""
    missing = [p for p in (path, *path.absolute().parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    if missing:
        made.append((missing[-1], None))


def _undo(made: list[tuple[Path, str | None]]) -> None:
    """Undo what a failed init did, last first: what it made is removed, a file it appended to gets its old text."""
    for path, old in reversed(made):
        try:
            if old is not None:
                path.write_text(old)
            elif path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass  # the error that stopped the init is the one to tell


def _append_gitignore(path: Path, made: list[tuple[Path, str | None]]) -> None:
    text = path.read_text() if path.exists() else ""
    missing = [line for line in IGNORES if line not in text.splitlines()]
    if missing:
        prefix = "" if not text or text.endswith("\n") else "\n"
        made.append((path, text if path.exists() else None))
        path.write_text(text + prefix + "# autorl: run folder and ledger\n" + "\n".join(missing) + "\n")


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path``'s text in one step (a reader sees the old text or the new, never a part).

    The file gets the mode a plain ``open(path, "w")`` would leave: an existing file keeps its own, a new one gets
    0666 less the umask (``mkstemp`` alone makes every file 0600, which hides an exported corpus from the team)."""
    target = path.resolve() if path.is_symlink() else path
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (``/proc/self/status``); elsewhere set and
    put back at once."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
