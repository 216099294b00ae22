"""The command backend's per-item evaluation: the shared evaluator on the checkpoint the script saves.

tests/data/scripts/save_checkpoint.py saves a real tiny Llama whose greedy answer to every probe item is the
number given by ``--answer``, so which items it gets right is known before the evaluator runs.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from autorl import gitops
from autorl.backends.base import TrialSpec, get_backend
from autorl.errors import RecipeError
from autorl.judge import triage
from autorl.recipe import validate_recipe
from autorl.runs.lifecycle import launch

SCRIPT = Path(__file__).resolve().parents[1] / "data" / "scripts" / "save_checkpoint.py"
# 30 items whose answer is 7, 5 whose answer is 5, 5 others: answering 7 rather than 5 wins 30 items, loses 5.
PROBE = (
    [(a, 7 - a) for a in range(1, 7)] * 5
    + [(a, 5 - a) for a in range(1, 5)]
    + [(1, 4)]
    + [(5, 6), (4, 5), (9, 9), (8, 8), (2, 4)]
)


def write_probe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"input": f"{a}+{b}=", "label": str(a + b)}) + "\n" for a, b in PROBE))
    return path


def train_block(**extra) -> dict:
    argv = [
        sys.executable,
        str(SCRIPT),
        "--answer",
        "{answer}",
        "--out",
        "{run_dir}/final",
        "--metrics",
        "{run_dir}/metrics.jsonl",
        "--steps",
        "{steps}",
    ]
    return {
        "argv": argv + extra.pop("flags", []),
        "answer": 5,
        "steps": 3,
        "checkpoint": "{run_dir}/final",
        "probe_id": "probe_id.jsonl",
        "probe_max_new_tokens": 4,
        "probe_engine": "hf",
        **extra,
    }


def make_spec(tmp_path: Path, train: dict, seed: int | None = None) -> TrialSpec:
    recipe = validate_recipe({"name": "t", "backend": "command", "train": train})
    return TrialSpec(
        attempt="attempt-01-test",
        recipe=recipe,
        worktree=tmp_path,
        run_dir=tmp_path / "runs" / "a1",
        cache_dir=tmp_path / "cache",
        seed=seed,
    )


def test_eval_plan_runs_the_shared_evaluator_on_the_checkpoint(tmp_path):
    spec = make_spec(tmp_path, train_block(cwd="sub", probe_ood="ood.jsonl", probe_k=2), seed=4)
    run_dir = (tmp_path / "runs" / "a1").resolve()
    plan = get_backend("command").eval_plan(spec)
    argv = plan.argv
    assert argv[1:3] == ["-m", "autorl.evaluate"]
    assert argv[argv.index("--model") + 1] == str(run_dir / "final")  # absolute: "{run_dir}" needs no cwd
    assert argv[argv.index("--id") + 1] == str(tmp_path.resolve() / "probe_id.jsonl")  # worktree, not cwd
    assert argv[argv.index("--ood") + 1] == str(tmp_path.resolve() / "ood.jsonl")
    assert [argv[argv.index(f) + 1] for f in ("--max-new-tokens", "--k", "--seed", "--step")] == ["4", "2", "4", "3"]
    assert plan.cwd == str(tmp_path.resolve() / "sub")
    assert plan.log_path == str(run_dir / "train.log") and plan.metrics_path == str(run_dir / "eval.jsonl")


def test_a_relative_checkpoint_is_read_from_cwd_and_a_lora_base_is_passed(tmp_path):
    train = train_block(cwd="sub", checkpoint="out/{attempt}", checkpoint_base="models/base", max_new_tokens=9)
    argv = get_backend("command").eval_plan(make_spec(tmp_path, train)).argv
    assert argv[argv.index("--model") + 1] == str(tmp_path.resolve() / "sub" / "out" / "attempt-01-test")
    assert argv[argv.index("--base") + 1] == "models/base"
    assert argv[argv.index("--max-new-tokens") + 1] == "4"  # the probe's limit, not the command's own


@pytest.mark.parametrize("drop", ["checkpoint", "probe_id"])
def test_no_eval_without_both_a_checkpoint_and_a_probe_set(tmp_path, drop):
    train = {k: v for k, v in train_block().items() if k != drop}
    if drop == "checkpoint":
        train.pop("probe_id"), train.pop("probe_max_new_tokens")
    assert get_backend("command").eval_plan(make_spec(tmp_path, train)) is None


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"checkpoint": None}, "probe_id needs checkpoint"),
        ({"probe_max_new_tokens": None}, "probe_max_new_tokens"),
        ({"probe_k": 4, "probe_temperature": 0.0}, "probe_temperature > 0"),
        ({"checkpoint": "{out_dir}/final"}, "'{out_dir}'"),
        ({"probe_id": None, "checkpoints": "{run_dir}/out/checkpoint-*"}, "checkpoints needs a probe set"),
        ({"checkpoints": "{out_dir}/checkpoint-*"}, "'{out_dir}'"),
    ],
)
def test_bad_eval_settings_are_one_line_recipe_errors(change, needle):
    train = {k: v for k, v in {**train_block(), **change}.items() if v is not None}
    with pytest.raises(RecipeError) as info:
        validate_recipe({"backend": "command", "train": train})
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_check_names_a_missing_or_uncommitted_probe_file(tmp_path):
    recipe = validate_recipe({"backend": "command", "train": train_block()})
    gitops.init_repo(tmp_path)
    with pytest.raises(RecipeError, match="probe_id: probe_id.jsonl not found"):
        get_backend("command").check(recipe, tmp_path)
    write_probe(tmp_path / "probe_id.jsonl")
    with pytest.raises(RecipeError, match="probe_id.jsonl is not committed: trials run in git worktrees"):
        get_backend("command").check(recipe, tmp_path)
    gitops.commit(tmp_path, "probe set", ["probe_id.jsonl"])
    get_backend("command").check(recipe, tmp_path)


def _follow(handle, timeout: float = 120.0) -> tuple[int, list[dict]]:
    records, deadline = [], time.time() + timeout
    while (code := handle.poll()) is None:
        assert time.time() < deadline, "run did not finish"
        records += handle.metrics()
        time.sleep(0.1)
    return code, records + handle.metrics()


def test_training_then_eval_gives_per_item_records(tmp_path):
    write_probe(tmp_path / "probe_id.jsonl")
    code, records = _follow(launch(get_backend("command"), make_spec(tmp_path, train_block(answer=7))))
    assert code == 0
    assert [r["step"] for r in records if r["type"] == "step"] == [1, 2, 3]
    (ev,) = [r for r in records if r["type"] == "eval"]
    assert ev["step"] == 3 and ev["eval/id/items"] == [1] * 30 + [0] * 10  # exactly the items whose sum is 7
    assert ev["eval/id/greedy_pass@1"] == 0.75


def test_a_script_that_saves_no_checkpoint_crashes_with_the_path_as_root_cause(tmp_path):
    write_probe(tmp_path / "probe_id.jsonl")
    code, records = _follow(launch(get_backend("command"), make_spec(tmp_path, train_block(flags=["--no-save"]))))
    log = (tmp_path / "runs" / "a1" / "train.log").read_text()
    assert code == 2 and not [r for r in records if r["type"] == "eval"]
    assert "Traceback" not in log
    d = triage.classify(log, exit_code=code)
    assert d.category == "config_error" and d.root_cause_line.startswith("error: no checkpoint at ")
    assert str((tmp_path / "runs" / "a1" / "final").resolve()) in d.root_cause_line


def _study(ws: Path, train: dict, trials: int) -> tuple:
    recipe = {
        "name": "ckpt",
        "backend": "command",
        "train": train,
        "search": {"answer": {"choices": [5, 7]}},
        "verdict": {"baseline_repeats": 1, "confirm_runs": 0},
        "timeout_s": 120,
    }
    write_probe(ws / "probe_id.jsonl")
    (ws / "recipes" / "ckpt.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    gitops.commit(ws, "probe set", ["probe_id.jsonl"])  # trials run in worktrees of commits
    r = run_cli(
        "-C",
        str(ws),
        "run",
        "recipes/ckpt.yaml",
        "--budget",
        "10m",
        "--strategy",
        "random",
        "--seed",
        "0",
        "--max-trials",
        str(trials),
        timeout=600,
    )
    conn = sqlite3.connect(ws / "ledger.sqlite")
    conn.row_factory = sqlite3.Row
    rows = [dict(x) for x in conn.execute("SELECT * FROM autorl_trials ORDER BY number")]
    evals = {
        row["id"]: [
            json.loads(d)
            for (d,) in conn.execute(
                "SELECT data FROM autorl_metrics WHERE trial_id = ? AND type = 'eval'", [row["id"]]
            )
        ]
        for row in rows
    }
    return r, rows, evals


@pytest.mark.slow
def test_a_command_study_is_judged_on_the_evaluators_items(tmp_path):
    ws = tmp_path / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    r, rows, evals = _study(ws, train_block(), trials=2)
    assert r.returncode == 0, r.stderr + r.stdout
    base, trial = rows
    assert [e["eval/id/greedy_pass@1"] for e in evals[base["id"]]] == [5 / 40]
    assert [e["eval/id/greedy_pass@1"] for e in evals[trial["id"]]] == [0.75]
    assert len(evals[trial["id"]][0]["eval/id/items"]) == len(PROBE)
    assert trial["objective"] == 0.75 and trial["verdict"] == "improved", trial
    assert f"(paired_items, n={len(PROBE)}" in trial["reason"]


@pytest.mark.slow
def test_a_baseline_that_saves_no_checkpoint_ends_the_study_with_the_path_as_root_cause(tmp_path):
    ws = tmp_path / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    r, rows, evals = _study(ws, train_block(flags=["--no-save"]), trials=2)
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr + r.stdout
    (base,) = rows
    assert base["status"] == "crash" and base["crash_category"] == "config_error", base
    assert base["root_cause"].startswith("error: no checkpoint at ") and base["root_cause"].endswith(
        "expected a Hugging Face model or LoRA adapter directory"
    )
    assert "train.checkpoint" in base["remedy"] and evals[base["id"]] == []
    assert "stop: config_error in the baseline" in r.stdout
