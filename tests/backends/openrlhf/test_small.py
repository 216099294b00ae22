"""The small GPU recipe's inputs: disjoint item sets, a deterministic warm-up, and a model both engines can run."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autorl.backends.openrlhf.small import COUNTS, OOD_DIGIT, main, split_items
from autorl.data import shipped
from autorl.recipe import load_recipe
from tests.conftest import run_cli


def test_item_sets_are_disjoint_and_ood_is_the_held_out_digit():
    items = split_items()
    keys = {name: {r["input"] for r in rows} for name, rows in items.items()}
    assert {n: len(k) for n, k in keys.items()} == COUNTS
    names = list(keys)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not keys[a] & keys[b], (a, b)
    for name, rows in items.items():
        for r in rows:
            a, b = (int(x) for x in r["input"].rstrip("=").split("+"))
            assert 100 <= a <= 999 and 100 <= b <= 999 and r["label"] == str(a + b)
            assert (a % 10 == OOD_DIGIT) == (name == "probe_ood")


def test_the_split_does_not_move_with_the_warmup_seed():
    assert split_items() == split_items()


@pytest.mark.parametrize("argv", [["--target", "1.5"], ["--temperature", "-1"], ["--max-steps", "0"]])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys, argv):
    assert main([str(tmp_path / "x"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert not (tmp_path / "x").exists()


def _digest(model_dir: Path) -> str:
    return hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()


@pytest.mark.slow
def test_warmup_is_deterministic_and_the_model_runs_on_the_embedded_engine(tmp_path):
    made = []
    for name in ("a", "b"):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "autorl.backends.openrlhf.small",
                str(tmp_path / name),
                "--size",
                "test",
                "--max-steps",
                "25",
                "--device",
                "cpu",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        made.append(tmp_path / name)
    assert _digest(made[0] / "model") == _digest(made[1] / "model")
    record = json.loads((made[0] / "warmup.json").read_text())
    assert record["sft_steps"] == 25 and record["check_temperature"] == 1.0 and record["size"] == "test"
    assert 0.0 <= record["greedy_pass@1"] <= 1.0

    # the same model and task through the embedded engine's Hugging Face path (the shipped comparison recipe)
    ws = tmp_path / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    text = Path(shipped("recipes/small-embedded.yaml")).read_text().replace("/tmp/autorl-openrlhf-small", str(made[0]))
    (ws / "recipes" / "small.yaml").write_text(text.replace("steps: 16", "steps: 2"))
    assert load_recipe(ws / "recipes" / "small.yaml").backend == "embedded"
    out = run_cli("-C", str(ws), "train", "recipes/small.yaml", "--set", "device=cpu", "--json", timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["status"] == "complete" and result["steps"] == 2
    assert set(result["final_eval"]) >= {"eval/id/greedy_pass@1", "eval/ood/greedy_pass@1"}
