"""Ref naming and worktrees on a real git repository."""

import pytest

from autorl import gitops
from autorl.errors import GitError, WorkspaceError

from conftest import git


@pytest.mark.parametrize("text, slug", [
    ("lr=3e-4 eps_clip=0.1", "lr-3em4-eps-clip-0-1"),
    ("H01 Advantage scaling!!", "h01-advantage-scaling"),
    ("../../etc/passwd", "etc-passwd"),
    ("refs/heads/x..y@{1}", "refs-heads-x-y-1"),
    ("scale-rewards off", "scale-rewards-off"),
    ("", "trial"),
    ("---", "trial"),
])
def test_slugify(text, slug):
    assert gitops.slugify(text) == slug


def test_slug_is_bounded_and_a_valid_ref(tmp_path):
    slug = gitops.slugify("x" * 200 + " lr=1e-3")
    assert len(slug) <= 40
    git(tmp_path, "init", "-q")
    assert gitops.attempt_name(7, "weird name; rm -rf /") == "attempt-07-weird-name-rm-rf"
    git(tmp_path, "check-ref-format", "--branch", gitops.attempt_name(7, "weird name; rm -rf /"))


def _repo(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "f.txt").write_text("a\n")
    git(tmp_path, "add", "f.txt")
    git(tmp_path, "commit", "-qm", "init")
    return tmp_path


def test_worktree_branch_commit_tag_leave_user_tree_alone(tmp_path):
    root = _repo(tmp_path)
    (root / "f.txt").write_text("user edit, uncommitted\n")
    before = (git(root, "status", "--porcelain"), git(root, "symbolic-ref", "HEAD"))
    wt = root / ".autorl" / "worktrees" / "attempt-01-x"
    gitops.add_worktree(root, wt, "attempt-01-x", gitops.head_sha(root))
    (wt / "f.txt").write_text("b\n")
    sha = gitops.commit(wt, "why", ["f.txt"])
    gitops.tag(root, gitops.start_tag(1), sha)
    gitops.remove_worktree(root, wt)
    assert (git(root, "status", "--porcelain", "--", "f.txt"), git(root, "symbolic-ref", "HEAD")) == before
    assert (root / "f.txt").read_text() == "user edit, uncommitted\n"
    assert gitops.show_file(root, "attempt-01-start", "f.txt") == "b\n"
    assert gitops.next_attempt_number(root) == 2
    assert not wt.exists()


def test_existing_refs_are_never_overwritten(tmp_path):
    root = _repo(tmp_path)
    git(root, "branch", "attempt-03-a")
    with pytest.raises(GitError):
        gitops.add_worktree(root, root / "wt", "attempt-03-a", gitops.head_sha(root))
    gitops.tag(root, "attempt-03-start", gitops.head_sha(root))
    with pytest.raises(GitError):
        gitops.tag(root, "attempt-03-start", gitops.head_sha(root))
    assert gitops.next_attempt_number(root) == 4


def test_not_a_repository(tmp_path):
    with pytest.raises(WorkspaceError, match="not a git repository"):
        gitops.repo_root(tmp_path)
