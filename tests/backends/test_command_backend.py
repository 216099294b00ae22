"""The command backend: real scripts in tests/data/scripts run through plan() / start()."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest

from autorl.backends.base import TrialSpec, get_backend
from autorl.backends.command import CommandParams, render
from autorl.errors import RecipeError
from autorl.metrics import RunMetrics
from autorl.recipe import load_recipe, validate_recipe

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "scripts"
REPO = Path(__file__).resolve().parents[2]


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


def run_to_end(spec: TrialSpec, timeout: float = 60.0) -> tuple[int, list[dict], Path]:
    backend = get_backend("command")
    plan = backend.plan(spec)
    handle = backend.start(plan)
    records: list[dict] = []
    deadline = time.time() + timeout
    while handle.poll() is None:
        assert time.time() < deadline, "script did not finish"
        records += handle.metrics()
        time.sleep(0.05)
    records += handle.metrics()
    return handle.poll(), records, Path(plan.log_path)


def script(name: str) -> str:
    return str(SCRIPTS / name)


def test_jsonl_script_metrics_are_mapped_onto_autorl_keys(tmp_path):
    train = {
        "argv": [
            sys.executable,
            script("write_jsonl.py"),
            "--lr",
            "{lr}",
            "--steps",
            "{steps}",
            "--out",
            "{run_dir}/m.jsonl",
        ],
        "metrics": "{run_dir}/m.jsonl",
        "lr": 2e-5,
        "steps": 5,
        "metric_map": {"eval_accuracy": "eval/id/greedy_pass@1"},
    }
    code, records, _ = run_to_end(make_spec(tmp_path, train))
    assert code == 0
    run = RunMetrics(records)
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4, 5]
    expected = [1.0 - math.exp(-2e-5 * 1e4 * k) for k in range(1, 6)]
    assert run.series("reward_mean") == pytest.approx(expected)
    assert run.series("lr") == [2e-5] * 5
    assert {"kl", "clip_ratio", "frac_zero_std_groups", "truncated_rate"} <= set(run.steps[0])
    assert run.series("eval/id/greedy_pass@1") == pytest.approx([expected[-1]])


def test_tensorboard_events_become_one_record_per_step(tmp_path):
    train = {
        "argv": f"{sys.executable} {script('write_tensorboard.py')} --logdir {{run_dir}}/tb --kl-beta {{kl_coef}}",
        "metrics": "{run_dir}/tb",
        "metrics_format": "tensorboard",
        "kl_coef": 0.5,
    }
    code, records, _ = run_to_end(make_spec(tmp_path, train))
    assert code == 0
    run = RunMetrics(records)
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4, 5, 6]
    assert run.series("kl") == pytest.approx([0.5 * k for k in range(1, 7)])
    assert run.series("grad_norm") == pytest.approx([1.0 / k for k in range(1, 7)])
    assert [(r["step"], round(r["eval/accuracy"], 4)) for r in run.evals] == [(3, 0.15), (6, 0.3)]


def test_trainer_state_history_is_read_once_per_entry(tmp_path):
    train = {
        "argv": [
            sys.executable,
            script("write_trainer_state.py"),
            "--output-dir",
            "{run_dir}/out",
            "--num-generations",
            "{gens}",
        ],
        "metrics": "{run_dir}/out",
        "metrics_format": "trainer_state",
        "gens": 4,
    }
    code, records, _ = run_to_end(make_spec(tmp_path, train))
    assert code == 0
    run = RunMetrics(records)
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4, 5, 6]
    assert run.series("reward_mean") == pytest.approx([0.1 * k for k in range(1, 7)])
    assert run.steps[0]["num_generations_seen"] == 4
    assert [r["step"] for r in run.evals] == [3, 6]
    assert run.summary == {
        "type": "summary",
        "step": 6,
        "steps_done": 6,
        "wall_s": 1.5,
        "train_loss": 0.3,
        "epoch": 1.0,
    }


def test_stdout_dicts_are_parsed_from_the_log(tmp_path):
    train = {
        "argv": [sys.executable, script("print_dicts.py"), "--lr", "{lr:.1e}"],
        "metrics_format": "stdout_dicts",
        "lr": 3e-6,
    }
    code, records, log = run_to_end(make_spec(tmp_path, train))
    assert code == 0
    run = RunMetrics(records)
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4]
    assert run.series("lr") == [3e-6] * 4
    assert run.series("reward_mean")[:3] == pytest.approx([0.2, 0.4, 0.6])
    assert run.has_nonfinite() == "loss@4"
    assert run.evals == [{"type": "eval", "step": 4, "eval_reward": 0.7, "eval_loss": 0.3, "epoch": 1.0}]
    assert run.summary["wall_s"] == 2.5 and run.summary["steps_done"] == 4
    assert "loading model" in log.read_text()


def test_crashing_script_exits_nonzero_and_keeps_its_traceback(tmp_path):
    train = {"argv": [sys.executable, script("crash.py"), "{run_dir}/m.jsonl"], "metrics": "{run_dir}/m.jsonl"}
    code, records, log = run_to_end(make_spec(tmp_path, train))
    assert code == 1
    assert [r["step"] for r in records] == [1]
    text = log.read_text()
    assert "IndexError: list index out of range" in text and "starting step 2" in text


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def test_cancel_kills_the_hanging_process_group(tmp_path):
    train = {"argv": [sys.executable, script("hang.py"), "{run_dir}/pids"]}
    spec = make_spec(tmp_path, train)
    backend = get_backend("command")
    handle = backend.start(backend.plan(spec))
    pid_file = Path(spec.run_dir) / "pids"
    deadline = time.time() + 20
    while not pid_file.exists() or not pid_file.read_text().endswith("\n"):
        assert time.time() < deadline and handle.poll() is None
        time.sleep(0.05)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert handle.poll() is None and all(_alive(p) for p in pids)
    handle.cancel(grace_s=1.0)
    assert handle.poll() is not None
    deadline = time.time() + 5
    while any(_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)
    assert handle.metrics() == []


def test_shell_mode_quotes_every_value(tmp_path):
    nasty = "a b; touch pwned $(touch pwned2) `touch pwned3` 'q'"
    train = {
        "argv": f"{sys.executable} {script('echo_args.py')} --name {{name}} --lr {{lr}} > {{run_dir}}/out.txt",
        "shell": True,
        "name": nasty,
        "lr": 1e-3,
        "env": {"TEST_NAME": "{name}"},
    }
    code, _, _ = run_to_end(make_spec(tmp_path, train))
    assert code == 0
    echo = json.loads((tmp_path / "runs" / "a1" / "echo.json").read_text())
    assert echo["argv"] == ["--name", nasty, "--lr", "0.001"]
    assert echo["env"]["TEST_NAME"] == nasty
    assert not list(tmp_path.glob("pwned*"))
    assert (tmp_path / "runs" / "a1" / "out.txt").exists()


def test_argv_mode_passes_each_value_as_one_argument(tmp_path):
    train = {
        "argv": f"{sys.executable} {script('echo_args.py')} --name {{name}} --seed={{seed}}",
        "name": "x y;z",
        "cwd": "sub",
    }
    (tmp_path / "sub").mkdir()
    code, _, _ = run_to_end(make_spec(tmp_path, train, seed=7))
    assert code == 0
    echo = json.loads((tmp_path / "runs" / "a1" / "echo.json").read_text())
    assert echo["argv"] == ["--name", "x y;z", "--seed=7"]
    assert echo["cwd"] == str((tmp_path / "sub").resolve())
    assert echo["env"]["AUTORL_SEED"] == "7"


def test_plan_fills_the_template_without_running_anything(tmp_path):
    train = {
        "argv": ["train.py", "--lr", "{lr}", "--beta", "{kl_coef}", "--g", "{gens}", "--out", "{run_dir}/o"],
        "metrics": "o/metrics.jsonl",
        "lr": 1e-5,
        "kl_coef": 0.04,
        "gens": 8,
    }
    plan = get_backend("command").plan(make_spec(tmp_path, train))
    run_dir = (tmp_path / "runs" / "a1").resolve()
    assert plan.argv == ["train.py", "--lr", "1e-05", "--beta", "0.04", "--g", "8", "--out", f"{run_dir}/o"]
    assert plan.metrics_path == str(tmp_path.resolve() / "o" / "metrics.jsonl")
    assert plan.backend == "command" and plan.shell is False
    assert not (run_dir / "train.log").exists()


@pytest.mark.parametrize(
    "train, needle",
    [
        ({"argv": ["x", "{lrr}"], "lr": 1e-4}, "'{lrr}'"),
        ({"argv": ["x", "--kl", "{kl_coef}"]}, "'{kl_coef}'"),
        ({"argv": ["x"], "env": {"A": "{nope}"}}, "'{nope}'"),
        ({"argv": ["x"], "metrics": "{out_dir}/m.jsonl"}, "'{out_dir}'"),
        ({"argv": ["x", "{lr"]}, "literal braces"),
        ({"argv": ["a", "b"], "shell": True}, "one string"),
        ({"argv": ["x"], "metrics_format": "csv"}, "metrics_format"),
    ],
)
def test_bad_templates_are_recipe_errors(train, needle):
    with pytest.raises(RecipeError, match=None) as info:
        validate_recipe({"backend": "command", "train": train})
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_render_quotes_only_in_shell_mode():
    assert render("--x {v}", {"v": "a b"}) == "--x a b"
    assert render("--x {v}", {"v": "a b"}, quote=True) == "--x 'a b'"
    assert render("{{lit}} {v:.2f}", {"v": 0.5}) == "{lit} 0.50"


def test_search_over_a_placeholder_key_validates():
    params = CommandParams.model_validate({"argv": ["t", "{batch}"], "batch": 4})
    assert params.values()["batch"] == 4


def test_musique_recipe_validates_and_plans(tmp_path):
    recipe = load_recipe(REPO / "recipes" / "musique-accelerate.yaml")
    assert recipe.backend == "command" and {"lr", "kl_coef", "gens"} <= set(recipe.search)
    spec = TrialSpec(
        attempt="attempt-01-x", recipe=recipe, worktree=tmp_path, run_dir=tmp_path / "r", cache_dir=tmp_path / "c"
    )
    plan = get_backend("command").plan(spec)
    assert plan.argv[:4] == ["accelerate", "launch", "--num-processes", "3"]
    assert plan.argv[plan.argv.index("--learning-rate") + 1] == str(recipe.train["lr"])
    assert plan.argv[plan.argv.index("--kl-beta") + 1] == str(recipe.train["kl_coef"])
