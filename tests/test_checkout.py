"""What the tests and the package read is in the repository, not only on the machine that wrote it.

A recorded ledger once sat under tests/data with the name `ledger.sqlite`, which .gitignore keeps out of every commit
(a workspace's own ledger must never be committed): the tests passed where it was written and failed on a clean
checkout. Checked on a git checkout; a tree without `.git` (an unpacked sdist) has nothing to compare.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ["autorl", "tests", "benchmarks", "scripts", "recipes", "hypotheses", "patches", "docs"]
MADE_HERE = ("__pycache__/", ".pyc", "benchmarks/out/")  # what running the code writes, never read as input


def _ignored_files() -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--others", "--ignored", "--exclude-standard", "-z", "--", *SHIPPED],
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted(p for p in out.split("\0") if p and not any(m in p or p.endswith(m) for m in MADE_HERE))


@pytest.mark.skipif(not (ROOT / ".git").exists() or shutil.which("git") is None, reason="not a git checkout")
def test_no_file_the_project_reads_is_kept_out_of_git_by_gitignore():
    ignored = _ignored_files()
    assert not ignored, f"these files exist here but .gitignore keeps them out of every commit: {ignored}"
