"""Shared fixtures: a real git workspace, the CLI entry point, a shared engine cache."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, env=env).stdout.strip()


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory) -> Path:
    """OpenRLHF jobs' compile caches (autorl/backends/openrlhf/caches.py) in the session's temp folder, not the
    user's home, unless the caller named one."""
    os.environ.setdefault("AUTORL_COMPILE_CACHE", str(tmp_path_factory.mktemp("compile-cache")))
    return Path(os.environ["AUTORL_COMPILE_CACHE"])


@pytest.fixture(scope="session")
def engine_cache(tmp_path_factory) -> Path:
    """One engine cache for the whole session, holding the warmed-up builtin:tiny base model.

    The base is content-hashed and locked, so the supervised warm-up runs once per session
    (a few seconds on two idle cores) and every engine run and study shares it.
    """
    from autorl.engine.config import EngineConfig
    from autorl.engine.grpo import run

    cache = tmp_path_factory.getbasetemp() / "engine-cache"
    run(EngineConfig(steps=0), cache / "warm.jsonl", cache, log=lambda m: None)
    return cache


@pytest.fixture
def command_ws(tmp_path) -> Path:
    """A fresh git repository made a workspace by `autorl init`, with no engine cache (command-backend studies)."""
    ws = tmp_path / "ws"
    r = run_cli("init", str(ws))
    assert r.returncode == 0, r.stderr
    return ws


@pytest.fixture
def workspace(command_ws, engine_cache) -> Path:
    """A fresh workspace sharing the engine cache."""
    ws = command_ws
    (ws / ".autorl").mkdir(exist_ok=True)
    os.symlink(engine_cache, ws / ".autorl" / "cache")
    return ws


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    """Run the real `autorl` command in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "autorl.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw
    )


def tree_digest(root: Path) -> str:
    """Hash of every file in the user's working tree (autorl's own two paths excluded) plus git state."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith((".git/", ".autorl")) or rel.startswith("ledger.sqlite") or not p.is_file():
            continue
        h.update(rel.encode() + b"\0" + p.read_bytes())
    h.update(git(root, "status", "--porcelain").encode())
    h.update(git(root, "symbolic-ref", "HEAD").encode())
    h.update(git(root, "rev-parse", "HEAD").encode())
    return h.hexdigest()


# A Ray job's driver that does what OpenRLHF's does on a cluster: its actors' GPUs booked in one placement group
# it waits for (up to `wait` s); once placed it holds them `hold` s, as a trial's actors hold their GPU for minutes.
GANG_DRIVER = """import ray, sys, time
from ray.util.placement_group import placement_group
ray.init()
group = placement_group([{"GPU": %(gpus)s, "CPU": 0.1}])
ready, _ = ray.wait([group.ready()], timeout=%(wait)s)
print("placed" if ready else "never placed", flush=True)
time.sleep(%(hold)s if ready else 0)
sys.exit(0 if ready else 1)
"""


def gang_job(folder: Path, gpus: int = 1, wait: float = 120, hold: float = 0) -> Path:
    """A job folder with that driver as driver.py; each its own content (Ray deletes an upload shared by a job
    that ends while another is still starting), as each trial's worktree is."""
    folder.mkdir(parents=True)
    (folder / "driver.py").write_text(f"# {folder.name}\n" + GANG_DRIVER % {"gpus": gpus, "wait": wait, "hold": hold})
    return folder


def refused(r: subprocess.CompletedProcess, *needles: str) -> str:
    """A refusal as autorl promises it: exit 2, no traceback, one line on stderr holding each of ``needles``."""
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("autorl: error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def stored_study(ledger_file: Path, tmp: Path) -> tuple[dict[int, Any], list[Any]]:
    """A stored real ledger's study: its trials (not full runs) by number and its events, newest first, read from a
    copy in ``tmp`` (reading writes a -shm file beside the ledger, and tests/data stays as it was)."""
    from autorl.ledger import open_read
    from autorl.states import Kind

    path = Path(shutil.copy(ledger_file, tmp / "ledger.sqlite"))
    with closing(open_read(path)) as ledger:
        study = ledger.study()
        return {t.number: t for t in ledger.trials(study.id, kind=Kind.TRIAL)}, ledger.events(study.id)
