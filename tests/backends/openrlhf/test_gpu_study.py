"""A real OpenRLHF trial on a GPU: autorl launches it as a Ray job, reads its step lines, evaluates the saved model
per item and judges it. Runs only where openrlhf, vllm, ray and a CUDA GPU are all present (``pytest -m gpu``)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autorl.data import shipped
from autorl.ledger import Ledger


def _ready() -> bool:
    if not all(importlib.util.find_spec(m) for m in ("openrlhf", "vllm", "ray", "deepspeed")):
        return False
    return shutil.which("nvidia-smi") is not None


pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not _ready(), reason="needs openrlhf, vllm, ray, deepspeed and a CUDA GPU")]


def _autorl(*args: str, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autorl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def test_one_real_openrlhf_trial_is_judged_on_per_item_evals(tmp_path):
    tiny = tmp_path / "tiny"
    subprocess.run([sys.executable, "-m", "autorl.backends.openrlhf.tiny", str(tiny)], check=True, capture_output=True)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(Path(shipped("recipes/openrlhf-tiny.yaml")).read_text().replace("/tmp/autorl-openrlhf-tiny",
                                                                                      str(tiny)))
    ws = tmp_path / "ws"
    assert _autorl("init", str(ws)).returncode == 0
    for key, value in (("user.email", "gpu@example.invalid"), ("user.name", "gpu")):
        subprocess.run(["git", "-C", str(ws), "config", key, value], check=True)
    run = _autorl("-C", str(ws), "run", str(recipe), "--max-trials", "1", "--budget", "10m", "--study", "gpu")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    trial = Ledger(ws / "ledger.sqlite").trials()[0]
    assert trial["status"] == "complete", trial
    assert trial["objective"] is not None and 0.0 <= trial["objective"] <= 1.0
    run_dir = Path(trial["log_path"]).parent
    items = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines() if line.strip()]
    assert items, "the per-item evaluator wrote nothing"
    log = (run_dir / "train.log").read_text(errors="replace")
    assert "Global step 4" in log and "policy_loss" in log
    assert (run_dir / "model" / "config.json").is_file()
