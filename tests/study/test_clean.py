"""`autorl clean`: a stopped study's refs that nothing needs go; the baseline, every confirmed recipe with the chain
it was built on, open candidates and full runs stay; a dry run removes nothing; the user's branch, working tree and
a branch checked out anywhere are never touched; a running study is refused with one line.

Real git repositories and ledgers; the real command in a child process.
"""

from __future__ import annotations

import json
import os
import sqlite3

import pytest

from autorl import gitops
from autorl.errors import GitError
from autorl.workspace import Workspace
from tests.conftest import git, run_cli, tree_digest
from tests.study_ledger import add_full_run, git_workspace


@pytest.fixture
def ws(tmp_path):
    root = git_workspace(tmp_path / "ws")
    add_full_run(root, number=16, promoted_from=8)
    return root


def _refs(root) -> set[str]:
    return set(git(root, "for-each-ref", "--format=%(refname:short)", "refs/heads", "refs/tags").split())


def _clean(root, *args):
    return run_cli("-C", str(root), "clean", *args)


def test_dry_run_lists_and_removes_nothing(ws):
    before, digest = _refs(ws), tree_digest(ws)
    r = _clean(ws, "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["removed_trials"] == [6, 7, 9, 10, 11, 12, 13, 14, 15]
    assert plan["kept"] == {
        "01": "baseline",
        "02": "baseline",
        "03": "baseline",
        "04": "baseline",
        "05": "confirmed",
        "08": "confirmed",
        "16": "full run",
    }
    assert len(plan["branches"]) == 9 and len(plan["tags"]) == 18
    assert _refs(ws) == before and tree_digest(ws) == digest
    text = _clean(ws, "--dry-run").stdout
    assert "would remove 9 branches, 18 tags and 0 worktrees of 9 trials (dry run: nothing removed)" in text
    assert "kept: baseline 01, 02, 03, 04; confirmed 05, 08; full run 16" in text


def test_clean_removes_the_rest_and_keeps_what_promote_and_show_need(ws):
    digest, head = tree_digest(ws), git(ws, "symbolic-ref", "HEAD")
    r = _clean(ws)
    assert r.returncode == 0, r.stderr
    refs = _refs(ws)
    assert not any(n.startswith(("attempt-06", "attempt-09", "attempt-12", "attempt-15")) for n in refs)
    for n in (1, 5, 8, 16):
        assert f"attempt-{n:02d}-start" in refs and f"attempt-{n:02d}-end" in refs
    assert "attempt-08-move" in refs and "attempt-16-full-move" in refs
    assert tree_digest(ws) == digest and git(ws, "symbolic-ref", "HEAD") == head
    rows = sqlite3.connect(ws / "ledger.sqlite").execute("SELECT count(*) FROM autorl_trials").fetchone()[0]
    assert rows == 16  # the ledger keeps every trial
    events = (
        sqlite3.connect(ws / "ledger.sqlite")
        .execute("SELECT message FROM autorl_events WHERE kind = 'clean'")
        .fetchall()
    )
    assert events == [("removed 9 branches, 18 tags and 0 worktrees of 9 trials",)]
    show = run_cli("-C", str(ws), "show", "12")
    assert show.returncode == 0 and "is gone, e.g. removed by `autorl clean`" in " ".join(show.stdout.split())
    refs_line = next(line for line in show.stdout.splitlines() if line.startswith("refs:"))
    assert refs_line.startswith("refs: none left") and "gone from the repository: attempt-12-" in refs_line
    kept = next(line for line in run_cli("-C", str(ws), "show", "8").stdout.splitlines() if line.startswith("refs:"))
    assert kept.startswith("refs: branch attempt-08-move") and "gone" not in kept
    again = _clean(ws)
    assert again.returncode == 0 and "removed 0 branches, 0 tags" in again.stdout


def test_a_checked_out_branch_is_never_deleted(ws, tmp_path):
    git(ws, "worktree", "add", "-q", str(tmp_path / "mine"), "attempt-12-move")
    r = _clean(ws)
    assert r.returncode == 0, r.stderr
    assert "not removed: branch attempt-12-move is checked out in a worktree" in r.stdout
    assert "attempt-12-move" in _refs(ws) and (tmp_path / "mine" / "recipes").is_dir()


def test_a_running_study_is_refused_in_one_line(ws):
    conn = sqlite3.connect(ws / "ledger.sqlite")
    conn.execute("UPDATE autorl_trials SET status = 'running' WHERE number = 15")
    conn.commit()
    before = _refs(ws)
    r = _clean(ws)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "attempt-15-hypothesis is still running" in r.stderr
    assert _refs(ws) == before


def test_a_study_a_controller_holds_is_refused_with_its_pid(ws):
    """A controller starting on the study (`run --resume`) holds its lock before it marks anything running: clean
    waits for no status, the lock says who runs it."""
    name = json.loads(_clean(ws, "--dry-run", "--json").stdout)["study"]
    held = Workspace(root=ws, ledger_path=ws / "ledger.sqlite").lock_study(name)
    before = _refs(ws)
    try:
        r = _clean(ws)
    finally:
        held.release()
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert f"is being run by pid {os.getpid()}" in r.stderr
    assert _refs(ws) == before
    assert _clean(ws).returncode == 0  # released: it cleans


def test_only_attempt_refs_can_be_deleted(ws):
    with pytest.raises(GitError, match="refusing to delete main"):
        gitops.delete_attempt_refs(ws, ["main"], [])
    with pytest.raises(GitError, match="refusing to delete"):
        gitops.delete_attempt_refs(ws, [], ["attempt-01-start;rm"])
