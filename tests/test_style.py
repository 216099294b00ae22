"""The habits the README's test command enforces: ruff's lint and format, and mypy, as configured in
pyproject.toml, on the package, its tests and benchmarks (mypy: the package)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ["autorl", "tests", "benchmarks"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_ruff_finds_nothing():
    r = _run("ruff", "check", "--no-cache", *TREES)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_format_changes_nothing():
    r = _run("ruff", "format", "--check", "--no-cache", *TREES)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


@pytest.mark.slow
def test_mypy_finds_nothing():
    r = _run("mypy", "--no-incremental")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
