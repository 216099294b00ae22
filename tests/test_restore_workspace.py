"""benchmarks/restore_workspace.py: a study's start tags rebuilt in a new workspace from the ledger alone (the GPU
host it ran on given back), each checked against the values the ledger recorded, so that `autorl promote` can run
from it; a ledger whose recorded values the study's recipe cannot give is refused."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from autorl import gitops
from autorl.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "tests" / "data" / "openrlhf-0.10.4" / "smollm2" / "h200x2-seed1-resumed" / "study-ledger.sqlite"


def restore(ledger: Path, ws: Path) -> subprocess.CompletedProcess:
    script = ROOT / "benchmarks" / "restore_workspace.py"
    return subprocess.run([sys.executable, str(script), str(ledger), str(ws)], capture_output=True, text=True)


def test_every_start_tag_is_restored_with_the_values_its_trial_ran(tmp_path):
    ws = tmp_path / "ws"
    got = restore(LEDGER, ws)
    assert got.returncode == 0, got.stderr
    assert "24 start tags restored and checked" in got.stdout
    db = sqlite3.connect(LEDGER)
    rows = db.execute("SELECT start_tag, params FROM autorl_trials ORDER BY number").fetchall()
    assert len(rows) == 24
    for tag, params in rows:
        text = gitops.show_file(ws, tag, "recipes/small.yaml")
        assert text is not None, tag
        (tmp_path / "r.yaml").write_text(text)
        train, recorded = load_recipe(tmp_path / "r.yaml").train, json.loads(params)
        assert all(recorded[k] == v for k, v in train.items() if k in recorded), tag
    assert (ws / "ledger.sqlite").read_bytes() == LEDGER.read_bytes()
    assert (
        gitops.has_commits(ws)
        and not subprocess.run(
            ["git", "-C", str(ws), "status", "--porcelain"], capture_output=True, text=True
        ).stdout.strip()
    )  # the workspace is left clean on its branch


def test_promote_plans_from_the_restored_workspace(tmp_path):
    ws = tmp_path / "ws"
    assert restore(LEDGER, ws).returncode == 0
    got = subprocess.run(
        [sys.executable, "-m", "autorl.cli", "-C", str(ws), "promote", "--dry-run", "--episodes", "2", "--json"],
        capture_output=True,
        text=True,
    )
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout)
    assert out["attempt"] == "attempt-08-move-gens-32-lr-1em05"
    assert out["train"]["gens"] == 32 and out["train"]["lr"] == 1e-05 and out["train"]["num_episodes"] == 2
    assert out["plan"] is not None


def test_a_trial_the_recipe_cannot_give_is_refused(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    shutil.copyfile(LEDGER, ledger)
    db = sqlite3.connect(ledger)
    params = json.loads(db.execute("SELECT params FROM autorl_trials WHERE number = 8").fetchone()[0])
    db.execute("UPDATE autorl_trials SET params = ? WHERE number = 8", (json.dumps({**params, "eps_clip": 0.3}),))
    db.commit()
    db.close()
    got = restore(ledger, tmp_path / "ws")
    assert got.returncode == 1
    assert "trial 8" in got.stderr and "eps_clip" in got.stderr
    assert not (tmp_path / "ws").exists()  # checked before anything was written


PROMOTED = ROOT / "tests" / "data" / "openrlhf-0.10.4" / "smollm2" / "h200x2-promote" / "study-ledger.sqlite"


def test_a_full_run_is_restored_on_the_recipe_it_was_promoted_from(tmp_path):
    """Its changed values are only its full-length ones: restored on the study's recipe it would run the baseline's
    learning rate and group size at full length (as a restore once did, spending a full run on it)."""
    ledger = tmp_path / "ledger.sqlite"
    shutil.copyfile(PROMOTED, ledger)  # a copy: opening the stored one would touch its write-ahead files
    ws = tmp_path / "ws"
    got = restore(ledger, ws)
    assert got.returncode == 0, got.stderr
    (tmp_path / "r.yaml").write_text(gitops.show_file(ws, "attempt-25-start", "recipes/small.yaml") or "")
    full = load_recipe(tmp_path / "r.yaml").train
    (tmp_path / "r.yaml").write_text(gitops.show_file(ws, "attempt-08-start", "recipes/small.yaml") or "")
    source = load_recipe(tmp_path / "r.yaml").train
    assert (full["lr"], full["gens"], full["num_episodes"], full["save_steps"]) == (1e-05, 32, 2, 8)
    assert {k: v for k, v in full.items() if source.get(k) != v} == {
        "num_episodes": 2, "save_steps": 8, "disable_ds_ckpt": True, "save_hf_ckpt": True
    }  # fmt: skip
