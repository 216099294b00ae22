"""Triage inside the live loop: early abort, OOM auto-retry, crash triage and exit-0 NaN.

Each test runs the real `autorl run` (real git, SQLite, Optuna and child processes) in
a fresh workspace on a small recipe it writes itself, then reads the ledger, Optuna's
storage and the `autorl triage` commands.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import run_cli

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "scripts"
LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"

TWO_CHARS_REWARD = '''"""Exact match, but only answers of two or more characters pay (slowly, like a remote judge)."""
import time


def reward(completion, label):
    time.sleep(0.002)
    answer = completion.strip()
    return float(len(answer) >= 2 and answer == label.strip())
'''

SHORT_REWARD = '''"""A length penalty with nothing else: the shortest completion (EOS alone) scores best."""


def reward(completion, label):
    return 1.0 / (1.0 + len(completion.strip()))
'''


def _trials(ws: Path) -> list[dict]:
    conn = sqlite3.connect(ws / "ledger.sqlite")
    conn.row_factory = sqlite3.Row
    return [dict(r) for r in conn.execute("SELECT * FROM autorl_trials ORDER BY number")]


def _step_rows(ws: Path, trial_id: int) -> list[dict]:
    conn = sqlite3.connect(ws / "ledger.sqlite")
    rows = conn.execute("SELECT data FROM autorl_metrics WHERE trial_id = ? AND type = 'step'", [trial_id])
    return [json.loads(r[0]) for r in rows]


def _optuna_states(ws: Path) -> dict[int, str]:
    conn = sqlite3.connect(ws / "ledger.sqlite")
    name = conn.execute("SELECT optuna_study FROM autorl_studies ORDER BY id DESC").fetchone()[0]
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{ws / 'ledger.sqlite'}")
    return {t.number: t.state.name for t in study.get_trials(deepcopy=False)}


def _write_recipe(ws: Path, name: str, recipe: dict) -> str:
    path = ws / "recipes" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return f"recipes/{name}.yaml"


def _run(ws: Path, recipe: str, *args: str, timeout: float = 300, code: int = 0):
    """The study, run to its end; ``code`` 1 for one whose baseline failed (exit 1: it measured nothing)."""
    r = run_cli("-C", str(ws), "run", recipe, "--budget", "10m", "--strategy", "optuna", *args, timeout=timeout)
    assert r.returncode == code, r.stderr + r.stdout
    return r


def _command_recipe(name: str, script: str, key: str, value, space: dict, extra: list[str] = ()) -> dict:
    argv = [
        sys.executable,
        str(SCRIPTS / script),
        f"--{key.replace('_', '-')}",
        f"{{{key}}}",
        "--out",
        "{run_dir}/metrics.jsonl",
        *extra,
    ]
    return {
        "name": name,
        "backend": "command",
        "train": {"argv": argv, key: value},
        "search": {key: space},
        "verdict": {"baseline_repeats": 1},
        "timeout_s": 60,
    }


def test_early_abort_prunes_a_trial_whose_reward_is_stuck_at_zero(workspace):
    """A reward that pays nothing for one-character answers, searched at max_new_tokens 1: the trial's reward
    is stuck at 0 and it is stopped at the window, PRUNED everywhere. The baseline (5 tokens) is paid."""
    reward = workspace / "two_chars_reward.py"
    reward.write_text(TWO_CHARS_REWARD)
    window, steps = 4, 12
    recipe = {
        "name": "reward-zero",
        "backend": "embedded",
        "train": {
            "model": "builtin:tiny",
            "task": "builtin:addition",
            "reward": str(reward),
            "lr": 1.0e-4,
            "gens": 8,
            "batch_prompts": 16,
            "steps": steps,
            "eval_every": 0,
            "seed": 0,
            "threads": 1,
        },
        "search": {"max_new_tokens": {"choices": [5, 1]}},  # seeded TPE proposes 1 first
        "verdict": {"baseline_repeats": 1},
        "abort": {"window": window},
        "timeout_s": 120,
    }
    _run(workspace, _write_recipe(workspace, "reward-zero", recipe), "--max-trials", "2")
    base, trial = _trials(workspace)
    assert base["proposer"] == "baseline" and base["status"] == "complete"  # the baseline is never aborted
    assert (trial["status"], trial["verdict"]) == ("pruned", "pruned"), trial
    assert "reward_stuck_zero" in trial["reason"] and "0, 0, 0, 0" in trial["reason"], trial["reason"]
    assert f"step {window}" in trial["reason"]
    assert trial["objective"] is None and trial["crash_category"] is None
    seen = _step_rows(workspace, trial["id"])
    assert window <= len(seen) < steps and all(s["reward_mean"] == 0 for s in seen)
    assert trial["duration_s"] < base["duration_s"]
    assert _optuna_states(workspace)[trial["optuna_number"]] == "PRUNED"


def test_a_baseline_that_completes_with_collapsed_completions_is_a_crash_not_a_result(workspace):
    """A length-only reward with a high lr: the baseline exits 0 with every completion EOS alone, and its eval
    (scored by the same reward) reads 1.000. It is judged output_collapse, never scored, and the study ends."""
    reward = workspace / "short_reward.py"
    reward.write_text(SHORT_REWARD)
    recipe = {
        "name": "collapse",
        "backend": "embedded",
        "train": {
            "model": "builtin:tiny",
            "task": "builtin:addition",
            "reward": str(reward),
            "lr": 1.0e-2,
            "gens": 8,
            "batch_prompts": 16,
            "steps": 20,
            "eval_every": 0,
            "seed": 1,
            "threads": 1,
        },
        "search": {"lr": {"low": 1.0e-4, "high": 2.0e-4, "log": True}},
        "verdict": {"baseline_repeats": 1},
        "timeout_s": 120,
    }
    r = run_cli(
        "-C",
        str(workspace),
        "run",
        _write_recipe(workspace, "collapse", recipe),
        "--budget",
        "10m",
        "--max-trials",
        "3",
        timeout=300,
    )
    (base,) = _trials(workspace)
    assert (base["status"], base["verdict"], base["crash_category"]) == ("crash", "crash", "output_collapse"), base
    assert base["objective"] is None and "degenerate_rate" in base["root_cause"], base
    assert base["crash_action"] == "record" and "the baseline failed, so the study ends here" in r.stdout + r.stderr


def test_cuda_oom_is_retried_once_with_half_the_micro_batch(command_ws):
    """micro_batch 6-8 'OOMs' (the real PyTorch message): cuda_oom, one retry with half, linked and grouped."""
    recipe = _command_recipe("fake-oom", "fake_oom.py", "micro_batch", 2, {"low": 6, "high": 8, "int": True})
    _run(command_ws, _write_recipe(command_ws, "oom", recipe), "--max-trials", "3")
    base, crashed, retry = _trials(command_ws)
    assert base["status"] == "complete"
    assert crashed["status"] == "crash" and crashed["crash_category"] == "cuda_oom", crashed
    assert "torch.OutOfMemoryError: CUDA out of memory" in crashed["root_cause"]
    tried = json.loads(crashed["changed"])["micro_batch"]
    assert tried > 4
    assert retry["proposer"] == "retry" and retry["retry_of"] == crashed["number"]
    assert json.loads(retry["changed"])["micro_batch"] == tried // 2
    assert retry["status"] == "complete" and retry["objective"] is not None
    assert _optuna_states(command_ws)[crashed["optuna_number"]] == "FAIL"
    r = run_cli("-C", str(command_ws), "triage", "--json")
    assert r.returncode == 0, r.stderr
    (group,) = json.loads(r.stdout)
    assert group["category"] == "cuda_oom" and group["attempts"] == [crashed["number"]]
    assert group["signature"] == crashed["crash_signature"]
    assert any(a.startswith(f"retried as {retry['attempt']}") for a in group["actions"]), group["actions"]


def test_crash_triage_of_a_trial_and_of_a_log_file(command_ws):
    """`autorl triage NN --json` explains a crashed trial; `triage classify LOG --json` gives eight keys."""
    recipe = _command_recipe("fake-oom", "fake_oom.py", "micro_batch", 16, {"low": 8, "high": 16, "int": True})
    _run(command_ws, _write_recipe(command_ws, "oom-baseline", recipe), code=1)
    row, retry = _trials(command_ws)  # the baseline crashed, and again at half the micro-batch: the study stops
    assert retry["retry_of"] == row["number"] and retry["status"] == "crash"
    assert row["status"] == "crash"
    r = run_cli("-C", str(command_ws), "triage", str(row["number"]), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["category"] == "cuda_oom" and d["signature"] == row["crash_signature"]
    assert d["root_cause_line"].startswith("torch.OutOfMemoryError") and "micro-batch" in d["remedy"]
    assert ">> torch.OutOfMemoryError" in d["excerpt"] and "Traceback" in d["excerpt"]
    r = run_cli("-C", str(command_ws), "triage", "classify", str(LOGS / "disk_full.log"), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) == {
        "category",
        "root_cause_line",
        "remedy",
        "signature",
        "engine",
        "confidence",
        "score",
        "candidates",
    }
    assert d["category"] == "disk_full"


def test_a_baseline_oom_is_retried_with_half_the_micro_batch_before_the_study_goes_on(command_ws):
    """micro_batch 8 'OOMs' above 4: the baseline is retried at 4, which works and stands in for it."""
    recipe = _command_recipe("fake-oom", "fake_oom.py", "micro_batch", 8, {"low": 1, "high": 4, "int": True})
    _run(command_ws, _write_recipe(command_ws, "oom-base", recipe), "--max-trials", "3")
    base, retry, trial = _trials(command_ws)
    assert base["proposer"] == "baseline" and base["crash_category"] == "cuda_oom"
    assert retry["retry_of"] == base["number"] and json.loads(retry["changed"]) == {"micro_batch": 4}
    assert retry["status"] == "complete" and retry["verdict"] is None
    assert trial["status"] == "complete" and trial["verdict"] in ("improved", "regressed", "flat"), trial
    assert "no completed baseline" not in trial["reason"]


@pytest.mark.parametrize(
    "base_lr, expected_status",
    [
        (1.0e-4, ("crash", "pruned")),  # a searched trial: caught live by the nonfinite abort, or after its exit
        (3.0e-2, ("crash",)),  # the baseline (never aborted): exits 0, then judged a crash
    ],
)
def test_exit_zero_with_a_nan_loss_is_nan_divergence(command_ws, base_lr, expected_status):
    """A run that exits 0 but logged a NaN loss is never scored: it is triaged nan_divergence."""
    recipe = _command_recipe("nan", "nan_exit0.py", "lr", base_lr, {"low": 0.02, "high": 0.05, "log": True})
    _run(command_ws, _write_recipe(command_ws, "nan", recipe), "--max-trials", "2", code=int(base_lr > 1e-2))
    rows = _trials(command_ws)
    trial = rows[-1]
    if base_lr < 1e-2:
        assert rows[0]["status"] == "complete" and rows[0]["objective"] is not None
    else:
        assert len(rows) == 1  # a failed baseline ends the study
    assert trial["status"] in expected_status and trial["crash_category"] == "nan_divergence", trial
    assert "loss" in trial["root_cause"] and "nan" in trial["root_cause"].lower()
    assert trial["objective"] is None
    state = {"crash": "FAIL", "pruned": "PRUNED"}[trial["status"]]
    assert _optuna_states(command_ws)[trial["optuna_number"]] == state


def test_a_baseline_run_lost_to_a_shared_gpu_is_replaced_by_a_fresh_seed(command_ws):
    """Seed 2's vLLM engine dies at start, twice (a neighbour on the card): not the recipe's doing, so the study
    runs seed 3 in its place and goes on with three complete baseline runs instead of ending."""
    argv = [
        sys.executable,
        str(SCRIPTS / "shared_gpu.py"),
        "--seed",
        "{seed}",
        "--lr",
        "{lr}",
        "--lose-seeds",
        "2",
        "--out",
        "{run_dir}/metrics.jsonl",
    ]
    recipe = {
        "name": "lost-seed",
        "backend": "command",
        "train": {"argv": argv, "seed": 0, "lr": 1e-4},
        "search": {"lr": {"low": 1e-4, "high": 1e-3, "log": True}},
        "verdict": {"baseline_repeats": 3},
        "timeout_s": 60,
    }
    r = _run(command_ws, _write_recipe(command_ws, "lost-seed", recipe), "--max-trials", "6")
    rows = _trials(command_ws)
    seeds = [(json.loads(t["params"]).get("seed"), t["proposer"], t["status"], t["crash_category"]) for t in rows]
    assert seeds[:5] == [
        (0, "baseline", "complete", None),
        (1, "baseline", "complete", None),
        (2, "baseline", "crash", "shared_gpu"),
        (2, "retry", "crash", "shared_gpu"),
        (3, "baseline", "complete", None),
    ], seeds
    assert "a baseline run with a fresh seed takes its place" in r.stdout
    assert "the baseline failed" not in r.stdout + r.stderr
    trial = rows[5]
    assert trial["proposer"] != "baseline" and trial["verdict"] in ("improved", "regressed", "flat"), trial


def test_a_baseline_lost_more_often_than_it_runs_still_ends_the_study(command_ws):
    """Every seed but 0 dies on the shared card: lost runs outnumber complete ones, so the study gives up."""
    argv = [
        sys.executable,
        str(SCRIPTS / "shared_gpu.py"),
        "--seed",
        "{seed}",
        "--lr",
        "{lr}",
        "--lose-seeds",
        "1,2,3,4,5,6,7,8",
        "--out",
        "{run_dir}/metrics.jsonl",
    ]
    recipe = {
        "name": "lost-all",
        "backend": "command",
        "train": {"argv": argv, "seed": 0, "lr": 1e-4},
        "search": {"lr": {"low": 1e-4, "high": 1e-3, "log": True}},
        "verdict": {"baseline_repeats": 3},
        "timeout_s": 60,
    }
    r = _run(command_ws, _write_recipe(command_ws, "lost-all", recipe), "--max-trials", "12", code=1)
    seeds = [(json.loads(t["params"]).get("seed"), t["proposer"], t["status"]) for t in _trials(command_ws)]
    assert seeds == [
        (0, "baseline", "complete"),
        (1, "baseline", "crash"),
        (1, "retry", "crash"),
        (2, "baseline", "crash"),
        (2, "retry", "crash"),
    ], seeds  # seed 1 replaced once, then no more
    assert "ended: the baseline failed" in r.stdout


def _worker_died_recipe(state: Path, die_first: int) -> dict:
    argv = [sys.executable, str(SCRIPTS / "worker_died.py"), "--seed", "{seed}", "--lr", "{lr}"]
    argv += ["--die-first", str(die_first), "--state", str(state), "--out", "{run_dir}/metrics.jsonl"]
    return {
        "name": "worker-died",
        "backend": "command",
        "train": {"argv": argv, "seed": 0, "lr": 1e-4},
        "search": {"lr": {"low": 1e-4, "high": 1e-3, "log": True}},
        "verdict": {"baseline_repeats": 2},
        "timeout_s": 60,
    }


def test_a_baseline_whose_worker_died_without_a_cause_is_retried_before_the_study_gives_up(command_ws, tmp_path):
    """On a real H200 a trial's vLLM engine was SIGKILLed mid-rollout: Ray said only that a worker died (OOM killer,
    `ray stop` or a segfault), triage said unknown, and the study ended at its first trial ("the baseline failed").
    A baseline crash whose cause the log cannot name now gets one unchanged retry; here the retry runs and the
    study goes on to judge a trial."""
    recipe = _worker_died_recipe(tmp_path / "runs", die_first=1)
    r = _run(command_ws, _write_recipe(command_ws, "died-once", recipe), "--max-trials", "4")
    rows = _trials(command_ws)
    ends = [(t["proposer"], t["status"], t["crash_category"], t["retry_of"]) for t in rows]
    assert ends[:3] == [
        ("baseline", "crash", "unknown", None),
        ("retry", "complete", None, rows[0]["number"]),
        ("baseline", "complete", None, None),
    ], ends
    assert "unknown: retrying once unchanged" in r.stdout and "the baseline is retried" in r.stdout
    assert "the baseline failed" not in r.stdout + r.stderr
    assert rows[3]["proposer"] != "baseline" and rows[3]["verdict"] in ("improved", "regressed", "flat"), rows[3]


def test_a_baseline_whose_worker_dies_again_on_its_retry_ends_the_study(command_ws, tmp_path):
    """The same death twice is no fluke: after its one retry the baseline failed and the study ends (exit 1)."""
    recipe = _worker_died_recipe(tmp_path / "runs", die_first=99)
    r = _run(command_ws, _write_recipe(command_ws, "died-twice", recipe), "--max-trials", "4", code=1)
    ends = [(t["proposer"], t["status"], t["crash_category"]) for t in _trials(command_ws)]
    assert ends == [("baseline", "crash", "unknown"), ("retry", "crash", "unknown")], ends
    assert "unknown again after 1 retry" in r.stdout and "ended: the baseline failed" in r.stdout


def test_an_objective_metric_the_run_never_logs_stops_the_study_at_the_baseline_with_the_keys_it_logs(command_ws):
    """A typo in objective.metric: the baseline exits 0 with other keys; every trial would end so: one stop,
    naming the key it logs."""
    argv = [
        sys.executable,
        str(SCRIPTS / "shared_gpu.py"),
        "--seed",
        "{seed}",
        "--lr",
        "{lr}",
        "--out",
        "{run_dir}/metrics.jsonl",
    ]
    recipe = {
        "name": "typo",
        "backend": "command",
        "train": {"argv": argv, "seed": 0, "lr": 1e-4},
        "objective": {"metric": "eval/id/greedy_pas@1"},
        "search": {"lr": {"low": 1e-4, "high": 1e-3}},
        "verdict": {"baseline_repeats": 2},
        "timeout_s": 60,
    }
    r = run_cli(
        "-C", str(command_ws), "run", _write_recipe(command_ws, "typo", recipe), "--budget", "2m", "--max-trials", "4"
    )
    (base,) = _trials(command_ws)
    assert (base["status"], base["crash_category"]) == ("crash", "config_error"), base
    assert "did you mean eval/id/greedy_pass@1?" in base["root_cause"]
    assert r.returncode == 1 and "every trial would fail the same way" in r.stdout
