"""Paths in messages when the run folder is a link elsewhere (`.autorl` on a scratch disk, as GPU nodes often
have it): named under the workspace, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from autorl.workspace import Workspace, init_workspace

ROOT = Path(__file__).resolve().parents[1]
PROMOTED = ROOT / "tests" / "data" / "openrlhf-0.10.4" / "smollm2" / "h200x2-promote" / "study-ledger.sqlite"


def _link_run_folder(ws: Path, scratch: Path) -> None:
    scratch.mkdir(parents=True)
    if (ws / ".autorl").exists():
        shutil.move(str(ws / ".autorl"), str(scratch / "autorl"))
    else:
        (scratch / "autorl").mkdir()
    (ws / ".autorl").symlink_to(scratch / "autorl")


def test_a_path_under_a_linked_run_folder_is_named_under_the_workspace(tmp_path):
    root = init_workspace(tmp_path / "ws")
    _link_run_folder(root, tmp_path / "scratch")
    ws = Workspace.open(root)
    assert ws.shown(ws.runs / "prepare") == ".autorl/runs/prepare"
    assert ws.shown(root / "recipes" / "default.yaml") == "recipes/default.yaml"
    assert ws.shown(tmp_path / "elsewhere.txt") == str(tmp_path / "elsewhere.txt")


def test_promote_resume_refuses_in_one_line_with_a_linked_run_folder(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    shutil.copyfile(PROMOTED, ledger)
    ws = tmp_path / "ws"
    script = ROOT / "benchmarks" / "restore_workspace.py"
    subprocess.run([sys.executable, str(script), str(ledger), str(ws)], check=True, capture_output=True)
    _link_run_folder(ws, tmp_path / "scratch")
    record = ws / ".autorl" / "runs" / "fullrun-25.monitor.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"pid": 4242, "host": "gpu-node-7"}))
    got = subprocess.run(
        [sys.executable, "-m", "autorl.cli", "-C", str(ws), "promote", "--resume"], capture_output=True, text=True
    )
    assert got.returncode == 2 and len(got.stderr.strip().splitlines()) == 1, got.stderr
    assert ".autorl/runs/fullrun-25.monitor.json" in got.stderr and "gpu-node-7" in got.stderr
