"""A command that is refused writes nothing: `run`, `init`, `promote`, `clean` and `train`, each refused the way a
user meets it (a repository with no commits, a study name taken, a bad hypothesis file, a spent budget, a study not
stopped or held by a controller, a file where a workspace has a folder ...), leave the directory tree byte for byte as
it was: the working tree, `.git` (refs, `info/exclude`), `.autorl` (its folders and lock files, whose contents name
their last holder) and the ledger with its lock file.

SQLite's own reader files are the one exception: a read-only opening of a ledger in WAL mode makes `ledger.sqlite-shm`
and an empty `ledger.sqlite-wal` beside it (every review command does), and nothing of the ledger is in them.

`autorl run` in a repository with no commits exited 2 ("has no commits yet") and left `.autorl/`, `ledger.sqlite` and
a changed `.git/info/exclude` behind. Real git repositories, real SQLite, the real CLI in a child process.
"""

from __future__ import annotations

import base64
import hashlib
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from autorl.ledger import Ledger
from autorl.states import StudyStatus
from autorl.workspace import Workspace
from tests.conftest import git, run_cli
from tests.study_ledger import git_workspace

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "scripts"
SQLITE_READER = ("ledger.sqlite-shm",)  # a WAL reader's shared-memory index (and an empty -wal, below)


def tree(root: Path) -> dict[str, str]:
    """Every file, folder and link under ``root`` (``.git`` and ``.autorl`` included) with its bytes' hash."""
    out: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            rel = p.relative_to(root).as_posix()
            if p.name in SQLITE_READER or (p.name == "ledger.sqlite-wal" and p.stat().st_size == 0):
                continue
            if p.is_symlink():
                out[rel] = "link " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "folder"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def refused_unwritten(root: Path, argv: list[str], needle: str, cwd: Path | None = None) -> None:
    """``autorl ARGV`` is refused with one line holding ``needle``, exit 2, and ``root`` is as it was."""
    before = tree(root)
    r = run_cli(*argv, cwd=cwd, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert len(lines) == 1 and "Traceback" not in r.stderr and needle in lines[0], r.stderr
    after = tree(root)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"refused, yet wrote: {changed[:12]}"


def _finished_study(ws: Path) -> Path:
    """``ws`` (from git_workspace) with the lock files a controller and a promote leave behind once they ended."""
    w = Workspace.open(ws)
    w.lock_study(Ledger(ws / "ledger.sqlite").study().name).release()
    w.lock_promote("an earlier promote").release()
    return ws


# ---- run ----------------------------------------------------------------------------------------------------------
def test_run_in_a_repository_with_no_commits_leaves_nothing(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    refused_unwritten(repo, ["-C", str(repo), "run", "--budget", "1m"], "has no commits yet")
    assert not (repo / ".autorl").exists() and not (repo / "ledger.sqlite").exists()


def test_run_with_a_study_name_taken_leaves_nothing(tmp_path):
    ws = git_workspace(tmp_path / "ws")
    refused_unwritten(ws, ["-C", str(ws), "run", "--study", "addition-default-1", "--budget", "1m"], "exists already")


def test_run_with_a_bad_hypothesis_file_leaves_nothing_new_or_resumed(tmp_path):
    """On --resume the study's lock was taken (its holder written into the lock file) before the library was read."""
    ws = _finished_study(git_workspace(tmp_path / "ws"))
    (ws / "hypotheses" / "bad.md").write_text("---\nid: [\n---\n")
    refused_unwritten(ws, ["-C", str(ws), "run", "--budget", "1m"], "bad.md")
    refused_unwritten(ws, ["-C", str(ws), "run", "--resume", "--budget", "1m"], "bad.md")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--resume"], "has used its 10m00s budget"),
        (["--resume", "--set", "lr=1e-4"], "--set does not apply on --resume"),
        (["--resume", "--strategy", "random"], "drop --strategy random"),
        (["--resume", "--study", "nope"], "no study nope"),
    ],
)
def test_run_resume_refused_leaves_nothing(tmp_path, args, needle):
    ws = _finished_study(git_workspace(tmp_path / "ws"))
    led = Ledger(ws / "ledger.sqlite")
    study = led.study()
    assert study.created is not None
    led.update_study(study.id, budget_s=600.0)
    led.update_trial(led.trial(1).id, started=study.created + 1)
    led.update_trial(led.trial(15).id, finished=study.created + 700)  # its session ran past its 10 minutes
    led.close()
    refused_unwritten(ws, ["-C", str(ws), "run", *args], needle)


def test_run_resume_of_a_study_a_controller_holds_leaves_nothing(tmp_path):
    ws = _finished_study(git_workspace(tmp_path / "ws"))
    held = Workspace.open(ws).lock_study("addition-default-1")
    try:
        refused_unwritten(
            ws, ["-C", str(ws), "run", "--resume", "--budget", "1m"], f"is being run by pid {os.getpid()}"
        )
    finally:
        held.release()


# ---- clean, promote -----------------------------------------------------------------------------------------------
def test_clean_refused_leaves_nothing(tmp_path):
    ws = _finished_study(git_workspace(tmp_path / "ws"))
    refused_unwritten(ws, ["-C", str(ws), "clean", "--study", "nope"], "no study nope")
    held = Workspace.open(ws).lock_study("addition-default-1")
    try:
        refused_unwritten(ws, ["-C", str(ws), "clean"], f"is being run by pid {os.getpid()}")
    finally:
        held.release()
    led = Ledger(ws / "ledger.sqlite")  # its controller was killed: the row still says running
    led.update_study(led.study().id, status=StudyStatus.RUNNING)
    led.close()
    refused_unwritten(ws, ["-C", str(ws), "clean"], "cannot be cleaned yet: it has not stopped")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["99"], "no trial 99"),
        (["11"], "did not complete as a trial (pruned)"),
        (["--study", "nope"], "no study nope"),
        (["--dry-run", "--study", "nope"], "no study nope"),
    ],
)
def test_promote_refused_leaves_nothing(tmp_path, args, needle):
    ws = _finished_study(git_workspace(tmp_path / "ws"))
    refused_unwritten(ws, ["-C", str(ws), "promote", *args], needle)


def test_promote_while_another_promote_runs_leaves_nothing(tmp_path):
    """Trial 08 passes every check of promote; the promote lock held by another is the refusal."""
    ws = _finished_study(git_workspace(tmp_path / "ws"))
    held = Workspace.open(ws).lock_promote("promote of attempt-05-move: re-validating")
    try:
        refused_unwritten(ws, ["-C", str(ws), "promote", "8"], "another `autorl promote` runs in this workspace")
    finally:
        held.release()


# ---- train --------------------------------------------------------------------------------------------------------
def test_train_with_a_metrics_out_that_is_a_folder_leaves_nothing(tmp_path):
    """The embedded backend's plan wrote the run's folder (.autorl/train/NAME/engine_config.json) before
    --metrics-out was checked."""
    ws = _finished_study(git_workspace(tmp_path / "ws"))
    argv = ["-C", str(ws), "train", "recipes/default.yaml", "--metrics-out", str(tmp_path)]
    refused_unwritten(ws, argv, "is a folder: name a file")


# ---- init ---------------------------------------------------------------------------------------------------------
def _file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("mine\n")


INIT_CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("recipes is a file", lambda d: _file(d / "recipes"), "recipes is a file, where a workspace has a folder"),
    ("patches is a file", lambda d: _file(d / "patches"), "patches is a file, where a workspace has a folder"),
    (".gitignore is a folder", lambda d: (d / ".gitignore").mkdir(), ".gitignore is a folder, where"),
    (
        "default.yaml is a folder",
        lambda d: (d / "recipes" / "default.yaml").mkdir(parents=True),
        "default.yaml is a folder, where a workspace has a file",
    ),
    (
        "default.yaml links to nothing",
        lambda d: (d / "recipes").mkdir() or os.symlink(d / "gone" / "r.yaml", d / "recipes" / "default.yaml"),
        "default.yaml is a link to nothing, where a workspace has a file",
    ),
]


@pytest.mark.parametrize("setup, needle", [c[1:] for c in INIT_CASES], ids=[c[0] for c in INIT_CASES])
def test_init_refused_leaves_the_folder_as_it_was(tmp_path, setup, needle):
    target = tmp_path / "ws"
    target.mkdir()
    (target / "notes.txt").write_text("keep\n")
    setup(target)
    refused_unwritten(tmp_path, ["init", str(target)], needle)
    assert not (target / ".git").exists()


def _fsize_limit() -> None:
    """In the child: files may grow to 500 bytes (Python ignores SIGXFSZ, so a longer write is an OSError; a git
    child process is killed by the signal)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (500, 500))


def _failed_unwritten(root: Path, argv: list[str], needle: str) -> None:
    """``autorl ARGV`` fails on the way (under the file-size limit) in one line, and ``root`` is as it was, but for
    the temporary object file a killed `git hash-object` leaves (git never reads it; `git gc` removes it)."""
    before = tree(root)
    r = run_cli(*argv, timeout=120, preexec_fn=_fsize_limit)
    lines = r.stderr.strip().splitlines()
    assert r.returncode in (1, 2) and len(lines) == 1 and needle in lines[0], (r.returncode, r.stderr)
    after = tree(root)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    killed_git = [k for k in changed if "/.git/objects/" in k and (k.count("/") == 3 or "/tmp_obj_" in k)]
    assert changed == killed_git, changed


def test_init_that_fails_on_the_way_undoes_what_it_made(tmp_path):
    """`git init` is killed mid-way: the folder init made, and the half-made .git in it, are removed."""
    _failed_unwritten(tmp_path, ["init", str(tmp_path / "fresh")], "cannot make a git repository at")
    assert not (tmp_path / "fresh").exists()


def test_init_that_fails_on_the_way_in_a_repository_puts_its_ignore_file_back(tmp_path):
    """A repository with its own recipe and .gitignore and no commits: init made its folders and appended to the
    .gitignore, then the first commit failed (the recipe's blob is past the limit); the .gitignore is the user's
    again and the folders it made are gone."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / ".gitignore").write_text("*.pyc\n")
    (repo / "recipes").mkdir()
    (repo / "recipes" / "default.yaml").write_text(base64.b64encode(os.urandom(3000)).decode())
    _failed_unwritten(tmp_path, ["init", str(repo)], "failed")
    assert (repo / ".gitignore").read_text() == "*.pyc\n" and not (repo / "patches").exists()


# ---- a resumed study with a spent budget, end to end ---------------------------------------------------------------
def test_a_study_that_spent_its_budget_is_refused_on_a_bare_resume_and_nothing_is_written(command_ws):
    """A real study whose one trial overran its 2-second budget (--allow-overrun): `run --resume` without --budget is
    one line saying the budget is spent and how to give more, and leaves the workspace as it was."""
    argv = [sys.executable, str(SCRIPTS / "fake_oom.py"), "--micro-batch", "1", "--sleep", "3"]
    recipe = {
        "name": "slow",
        "backend": "command",
        "train": {"argv": [*argv, "--out", "{run_dir}/metrics.jsonl"], "micro_batch": 1},
        "search": {"micro_batch": {"choices": [1, 2]}},
        "verdict": {"baseline_repeats": 1},
        "timeout_s": 60,
    }
    (command_ws / "recipes" / "slow.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    git(command_ws, "add", "-A")
    git(command_ws, "commit", "-qm", "slow recipe")
    r = run_cli(
        "-C", str(command_ws), "run", "recipes/slow.yaml", "--budget", "2s", "--allow-overrun", "--max-trials", "1"
    )
    assert r.returncode == 0, r.stderr + r.stdout
    time.sleep(0.1)
    name = Ledger(command_ws / "ledger.sqlite").study().name
    refused_unwritten(
        command_ws,
        ["-C", str(command_ws), "run", "--resume"],
        f"study {name} has used its 2s budget: continue it with `autorl run --resume --study {name} --budget 30m`",
    )


def test_the_tree_check_sees_what_a_refusal_used_to_leave(tmp_path):
    """The check itself: what `run` in a repository with no commits left before (its run folder, a ledger, a line in
    .git/info/exclude) and a lock file rewritten by its next holder are each a difference."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    before = tree(repo)
    Workspace.open(repo).ensure_ignored()
    Ledger(repo / "ledger.sqlite").close()
    after = tree(repo)
    assert {".autorl", ".autorl/locks", "ledger.sqlite"} <= after.keys() - before.keys()
    assert before[".git/info/exclude"] != after[".git/info/exclude"]
    lock = Workspace.open(repo).lock_study("s")
    lock.release()
    held = tree(repo)
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"from autorl.workspace import Workspace; Workspace.open({str(repo)!r}).lock_study('s')",
        ],
        check=True,
    )
    assert tree(repo) != held  # the next holder wrote its pid into the lock file
