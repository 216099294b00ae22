"""A built wheel works with no checkout present: init, a 3-minute study and the report, in a fresh venv."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _run(argv: list, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_wheel_in_a_fresh_venv_runs_init_run_and_report(tmp_path):
    dist = tmp_path / "dist"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, ROOT], tmp_path)
    assert built.returncode == 0, built.stderr
    wheel = next(dist.glob("autorl-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in (
        "autorl/data/recipes/default.yaml",
        "autorl/data/rules/crash_rules.yaml",
        "autorl/data/rules/abort.yaml",
        "autorl/data/hypotheses/h13-flat-learning.md",
    ):
        assert shipped in names, shipped
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", venv], tmp_path).returncode == 0
    py, autorl = venv / "bin" / "python", venv / "bin" / "autorl"
    torch = _run([py, "-m", "pip", "install", "-q", "torch==2.13.0"], tmp_path)
    assert torch.returncode == 0, torch.stderr[-2000:]
    install = _run([py, "-m", "pip", "install", "-q", f"{wheel}[engine]"], tmp_path)
    assert install.returncode == 0, install.stderr[-2000:]
    ws = tmp_path / "ws"
    assert _run([autorl, "init", ws], tmp_path).returncode == 0
    study = _run([autorl, "-C", ws, "run", "--budget", "3m", "--quiet"], tmp_path)
    assert study.returncode == 0, study.stderr[-2000:] + study.stdout[-2000:]
    report = _run([autorl, "-C", ws, "report", "--out", tmp_path / "report"], tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    assert (tmp_path / "report" / "index.html").is_file()
    where = _run([py, "-c", "import autorl; print(autorl.__file__)"], tmp_path).stdout
    assert str(venv) in where and str(ROOT) not in where
