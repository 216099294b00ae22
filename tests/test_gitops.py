"""Ref naming and worktrees on a real git repository."""

import os
import subprocess
import sys

import pytest
from conftest import git

from autorl import gitops
from autorl.errors import GitError, WorkspaceError


@pytest.mark.parametrize(
    "text, slug",
    [
        ("lr=3e-4 eps_clip=0.1", "lr-3em4-eps-clip-0-1"),
        ("H01 Advantage scaling!!", "h01-advantage-scaling"),
        ("../../etc/passwd", "etc-passwd"),
        ("refs/heads/x..y@{1}", "refs-heads-x-y-1"),
        ("scale-rewards off", "scale-rewards-off"),
        ("", "trial"),
        ("---", "trial"),
    ],
)
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


def test_show_file_missing_rev_or_path_is_none(tmp_path):
    root = _repo(tmp_path)
    assert gitops.show_file(root, "HEAD", "f.txt") == "a\n"
    assert gitops.show_file(root, "HEAD", "nope.txt") is None
    assert gitops.show_file(root, "no-such-ref", "f.txt") is None


def test_init_repo_has_commits_and_common_dir(tmp_path):
    root = tmp_path / "new"
    root.mkdir()
    gitops.init_repo(root)
    assert not gitops.has_commits(root)
    with pytest.raises(WorkspaceError, match="no commits yet"):
        gitops.head_sha(root)
    (root / "f.txt").write_text("a\n")
    sha = gitops.commit(root, "first", ["f.txt"])
    assert gitops.has_commits(root) and gitops.head_sha(root) == sha
    wt = root / ".autorl" / "worktrees" / "attempt-01-x"
    gitops.add_worktree(root, wt, "attempt-01-x", sha)
    assert gitops.common_dir(wt) == gitops.common_dir(root) == (root / ".git").resolve()
    assert gitops.repo_root(wt / ".") == wt.resolve()


def test_commit_stages_ignored_and_deleted_paths_in_the_worktree_index_only(tmp_path):
    root = _repo(tmp_path)
    (root / ".gitignore").write_text("results/\n")
    git(root, "add", ".gitignore")
    git(root, "commit", "-qm", "ignore results")
    user_index = (root / ".git" / "index").read_bytes()
    wt = tmp_path / "wts" / "attempt-01-x"
    gitops.add_worktree(root, wt, "attempt-01-x", gitops.head_sha(root))
    (wt / "results").mkdir()
    (wt / "results" / "r.json").write_text("{}\n")
    (wt / "f.txt").unlink()
    sha = gitops.commit(wt, "results", ["results/r.json", "f.txt"])
    assert git(root, "ls-tree", "-r", "--name-only", sha).split() == [".gitignore", "results/r.json"]
    assert git(root, "rev-parse", "attempt-01-x") == sha and git(wt, "status", "--porcelain") == ""
    assert (root / ".git" / "index").read_bytes() == user_index
    assert git(root, "symbolic-ref", "--short", "HEAD") != "attempt-01-x"
    with pytest.raises(GitError, match="did not match"):
        gitops.commit(wt, "nothing there", ["never-existed.txt"])


def test_commit_and_annotated_tag_identity(tmp_path, monkeypatch):
    (tmp_path / "r").mkdir()
    root = _repo(tmp_path / "r")
    home = tmp_path / "home"
    home.mkdir()
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    sha = gitops.commit(root, "no identity configured", ["f.txt"])
    who = git(root, "log", "-1", "--format=%an <%ae> %cn <%ce>", sha)
    assert who == "autorl <autorl@localhost> autorl <autorl@localhost>"
    gitops.tag(root, "attempt-01-end", sha, message="why")
    assert (
        git(root, "for-each-ref", "--format=%(taggername) %(taggeremail) %(*objectname)", "refs/tags/attempt-01-end")
        == f"autorl <autorl@localhost> {sha}"
    )
    git(root, "config", "user.name", "Ada")
    git(root, "config", "user.email", "ada@example.com")
    mine = gitops.commit(root, "user identity", ["f.txt"])
    forced = gitops.commit(root, "forced", ["f.txt"], as_autorl=True)
    assert git(root, "log", "-1", "--format=%an <%ae>", mine) == "Ada <ada@example.com>"
    assert git(root, "log", "-1", "--format=%an <%ae>", forced) == "autorl <autorl@localhost>"


def test_refs_peel_tags_and_list_branches(tmp_path):
    root = _repo(tmp_path)
    head = gitops.head_sha(root)
    git(root, "branch", "attempt-02-b")
    gitops.tag(root, "attempt-02-start", head)
    git(root, "tag", "-a", "attempt-02-end", "-m", "annotated", head)
    got = gitops.refs(root)
    assert {k: got[k] for k in ("attempt-02-b", "attempt-02-start", "attempt-02-end")} == dict.fromkeys(
        ("attempt-02-b", "attempt-02-start", "attempt-02-end"), head
    )


def test_detached_worktree_makes_no_branch(tmp_path):
    root = _repo(tmp_path)
    before = git(root, "for-each-ref", "--format=%(refname)")
    wt = tmp_path / ".autorl" / "worktrees" / "full-seed-1"
    gitops.add_detached_worktree(root, wt, gitops.head_sha(root))
    assert (wt / "f.txt").read_text() == "a\n"
    assert git(wt, "rev-parse", "--abbrev-ref", "HEAD") == "HEAD"
    gitops.remove_worktree(root, wt)
    assert not wt.exists() and git(root, "for-each-ref", "--format=%(refname)") == before
    gitops.remove_worktree(root, wt)


def test_apply_patch_returns_touched_paths_and_fails_in_one_line(tmp_path):
    root = _repo(tmp_path)
    (root / "f.txt").write_text("a\nb\n")
    (root / "g.txt").write_text("new\n")
    git(root, "add", "-N", "g.txt")
    patch = tmp_path / "p.diff"
    patch.write_text(git(root, "diff") + "\n")
    git(root, "reset", "-q")
    git(root, "checkout", "-q", "--", "f.txt")
    (root / "g.txt").unlink()
    assert gitops.apply_patch(root, patch) == ["f.txt", "g.txt"]
    assert (root / "f.txt").read_text() == "a\nb\n" and (root / "g.txt").read_text() == "new\n"
    with pytest.raises(GitError) as err:
        gitops.apply_patch(root, patch)
    assert str(err.value).startswith("git apply ") and "\n" not in str(err.value)
    assert str(err.value).endswith("g.txt: already exists in working directory")


def test_whatever_refs_the_repository_holds_the_next_attempt_number_is_sound(tmp_path):
    """Tags and branches a person made that look like autorl's (a 5,000-digit number, 23 digits, an exponent, non-
    ASCII) neither break the numbering nor push it to an absurd number; real ones below a billion count."""
    repo = tmp_path / "r"
    gitops.init_repo(repo)
    git(repo, "commit", "-q", "--allow-empty", "-m", "first")
    for tag in ("attempt-99999999999999999999999-x", "attempt-1e99", "attempt-ü-ü", "attempt-1000000000-x"):
        git(repo, "tag", tag)
    git(repo, "branch", "attempt-02-mine")
    head = git(repo, "rev-parse", "HEAD")  # a name too long for a file lives in packed-refs, as a fetch leaves it
    with open(repo / ".git" / "packed-refs", "a") as fh:
        fh.write(f"{head} refs/tags/attempt-{'9' * 5000}\n")
    assert len(git(repo, "tag", "--list", "attempt-9999*").split()) == 2
    assert gitops.next_attempt_number(repo) == 3
    git(repo, "tag", "attempt-999999999-end")
    assert gitops.next_attempt_number(repo) == 10**9


def test_the_next_attempt_number_sees_packed_and_nested_refs(tmp_path):
    """The refs are listed as git keeps them (loose files, folders for names with '/', packed-refs after a gc or a
    fetch), without building an object for each of a long study's thousands."""
    repo = tmp_path / "r"
    gitops.init_repo(repo)
    git(repo, "commit", "-q", "--allow-empty", "-m", "first")
    git(repo, "tag", "attempt-05-end")
    git(repo, "branch", "attempt-04-x")
    git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "tags" / "attempt-05-end").exists()
    assert gitops.next_attempt_number(repo) == 6
    git(repo, "branch", "attempt-07/nested")
    assert gitops.next_attempt_number(repo) == 8
    git(repo, "branch", "-D", "attempt-07/nested")  # a ref removed (autorl clean): the numbers are read again
    (repo / ".git" / "refs" / "heads" / "attempt-07").mkdir(exist_ok=True)  # an emptied folder names no ref
    assert gitops.next_attempt_number(repo) == 6
    git(repo, "branch", "team/attempt-70-theirs")  # not at the start of the name: not autorl's
    assert gitops.next_attempt_number(repo, floor=8) == 9


GIT_ON_A_FULL_DISK = """
import os, sys
from pathlib import Path
from autorl import gitops
from autorl.errors import DiskFullError, GitError
root = Path(sys.argv[1]) / "repo"
root.mkdir()
gitops.init_repo(root)
(root / "f.txt").write_text("a\\n")
sha = gitops.commit(root, "first", ["f.txt"])
fd = os.open(Path(sys.argv[1]) / "fill", os.O_WRONLY | os.O_CREAT)  # the disk, filled to its last byte
for size in (65536, 1):
    try:
        while True:
            os.write(fd, bytes(size))
    except OSError:
        pass
os.close(fd)
try:
    gitops.add_worktree(root, root / ".autorl" / "worktrees" / "attempt-01-x", "attempt-01-x", sha)
    print("no error")
except DiskFullError as exc:
    print("DiskFullError", exc)
except GitError as exc:
    print("GitError", exc)
"""


def test_a_git_write_on_a_full_disk_is_a_disk_full_error_not_gits_lock_message(tmp_path):
    """Seen in the fault soak: the disk filled while an attempt opened its branch, and git said only "couldn't
    write '.../attempt-NN.lock'" (exit 1). It is the disk-full error now: one line naming the space, exit 2."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no private mount namespace here (unshare -rm refused)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = 'mount -t tmpfs -o size=4m tmpfs "$1" && shift && exec "$@"'
    argv = [sys.executable, "-c", GIT_ON_A_FULL_DISK, str(mnt)]
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", str(mnt), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("DiskFullError no space left on the disk of"), r.stdout
    assert "free some space" in r.stdout
