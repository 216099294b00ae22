"""Warm pools (autorl/backends/openrlhf/warm.py, warm_server.py): which trials share a pool, what refuses one, the
server's reading of a trial's argv with OpenRLHF 0.10.4's own parser, and a trial's slice of a pool's log."""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

import pytest
from conftest_openrlhf import extract_site, wheel_dir  # noqa: F401
from test_gpt_oss_recipes import CLI, _openrlhf_utils_config, site_0104  # noqa: F401

from autorl.backends.base import TrialSpec
from autorl.backends.openrlhf.backend import OpenRLHFBackend, warm_problem
from autorl.backends.openrlhf.phases import phases
from autorl.backends.openrlhf.warm import PoolLog, trial_slice
from autorl.backends.openrlhf.warm_server import TRAIN_DIGEST, engine_key, parse_words, train_digest
from autorl.data import shipped
from autorl.errors import RecipeError
from autorl.ledger import Ledger
from autorl.recipe import load_recipe
from autorl.runs.warmrecord import warm_columns, warm_events
from tests.conftest import run_cli
from tests.study_ledger import git_workspace

SMALL = shipped("recipes", "openrlhf-small.yaml")
PINNED = ["openrlhf_version=0.10.4", "warm_pool=true"]


def small(*sets: str):
    return load_recipe(SMALL, [*PINNED, *sets])


def plan_of(recipe, tmp_path: Path, name: str = "attempt-01-x"):
    spec = TrialSpec(attempt=name, recipe=recipe, worktree=tmp_path, run_dir=tmp_path / name, cache_dir=tmp_path)
    return OpenRLHFBackend().plan(spec)


# ---- which trials share a pool --------------------------------------------------------------------------------
def test_trials_that_differ_in_searched_training_values_share_a_key(tmp_path):
    base = plan_of(small(), tmp_path).pool_key
    assert base is not None
    for change in ("lr=3e-5", "eps_clip=0.3", "kl_coef=0.01", "gens=16", "seed=7", "temperature=0.7"):
        assert plan_of(small(change), tmp_path).pool_key == base, change


def test_what_sizes_the_engines_changes_the_key(tmp_path):
    base = plan_of(small(), tmp_path).pool_key
    for change in (
        "max_len=48",
        "vllm_gpu_memory_utilization=0.3",
        "pretrain=/tmp/another-model",
        "extra_args=[--vllm.enable_sleep]",
    ):
        assert plan_of(small(change), tmp_path).pool_key != base, change
    packed = load_recipe(SMALL, [*PINNED, "gpus_per_trial=0.25"])
    assert plan_of(packed, tmp_path).pool_key != base  # its vLLM KV-cache share is an engine setting


def test_a_recipe_without_warm_pool_gets_no_key(tmp_path):
    assert plan_of(load_recipe(SMALL, ["openrlhf_version=0.10.4"]), tmp_path).pool_key is None


# ---- what refuses warm pools, before anything starts ----------------------------------------------------------
def test_warm_pool_refusals_are_one_line_naming_the_fix():
    assert warm_problem(small().params, on_cluster=False) is None
    assert warm_problem(load_recipe(SMALL).params, on_cluster=True) is None  # off: nothing to refuse
    on_cluster = warm_problem(small().params, on_cluster=True)
    assert on_cluster and "--ray-address" in on_cluster
    split = warm_problem(small("colocate_all=false").params, on_cluster=False)
    assert split and "colocate_all" in split
    newer = warm_problem(small("openrlhf_version=0.11.2").params, on_cluster=False)
    assert newer and "0.11.2" in newer and "warm_pool: false" in newer
    for line in (on_cluster, split, newer):
        assert "\n" not in line


def test_the_backend_check_refuses_a_split_layout(tmp_path):
    with pytest.raises(RecipeError, match="colocate_all"):
        OpenRLHFBackend().check(small("colocate_all=false"), tmp_path)


# ---- the server's side, with OpenRLHF 0.10.4's own source ------------------------------------------------------
def test_the_server_follows_the_train_function_of_0104(site_0104):  # noqa: F811
    assert train_digest((site_0104 / CLI).read_text()) == TRAIN_DIGEST


def test_another_release_has_another_train(wheel_dir):  # noqa: F811
    site = extract_site("0.11.2", wheel_dir)
    assert train_digest((site / CLI).read_text()) != TRAIN_DIGEST


def test_the_server_reads_a_trials_argv_with_0104s_parser(site_0104, tmp_path, monkeypatch):  # noqa: F811
    recipe = small("gpus_per_trial=0.25")
    plan = plan_of(recipe, tmp_path)
    source = (site_0104 / CLI).read_text()
    monkeypatch.chdir(tmp_path)  # the block may write next to it
    with _openrlhf_utils_config(site_0104):
        namespace = {"argparse": argparse, "datetime": datetime.datetime, "os": os}
        args = parse_words(source, str(site_0104 / CLI), plan.argv[3:], namespace)
        other = parse_words(
            source, str(site_0104 / CLI), plan_of(small("gpus_per_trial=0.25", "lr=1e-4"), tmp_path).argv[3:], namespace
        )
    key = engine_key(args, plan.env)
    assert key["actor.model_name_or_path"] == recipe.params.pretrain
    assert key["data.max_len"] == recipe.params.max_len and key["train.colocate_all"] is True
    assert key["vllm.enable_sleep"] is True and key["vllm.enforce_eager"] is True
    assert key["AUTORL_VLLM_KV_FRACTION"] == plan.env["AUTORL_VLLM_KV_FRACTION"]
    assert engine_key(other, plan.env) == key  # another learning rate: the same engines


def test_parse_words_refuses_a_main_block_that_does_not_end_in_train():
    source = 'def train(args):\n    pass\n\nif __name__ == "__main__":\n    args = 1\n    print(args)\n'
    with pytest.raises(RuntimeError, match="train\\(args\\)"):
        parse_words(source, "x.py", [], {})


# ---- a trial's slice of the pool log, and its phases ------------------------------------------------------------
POOL_LOG = """Runtime env is setting up.
Running entrypoint for job raysubmit_1
2026-11-29 05:00:01 INFO worker.py -- Connected to Ray cluster.
AUTORL-WARM attempt-01-a begin index=0
AUTORL-WARM attempt-01-a vllm
(WarmRollout pid=11) INFO It took 0.5 seconds to fall asleep.
AUTORL-WARM attempt-01-a actor
AUTORL-WARM attempt-01-a fit
(PPOTrainer pid=12) Prompt dataloader is exhausted.
AUTORL-WARM attempt-01-a end code=0
AUTORL-WARM attempt-02-b begin index=1
AUTORL-WARM attempt-02-b vllm
(WarmRollout pid=11) INFO It took 0.2 seconds to wake up tags ['weights'].
(WarmRollout pid=11) INFO It took 0.5 seconds to fall asleep.
AUTORL-WARM attempt-02-b actor
AUTORL-WARM attempt-02-b fit
(WarmRollout pid=11) INFO It took 0.2 seconds to wake up tags ['weights'].
(PPOTrainer pid=13) Prompt dataloader is exhausted.
AUTORL-WARM attempt-02-b end code=0
"""


def line_at(text: str, needle: str) -> int:
    return text.index(needle)


def test_the_first_trial_owns_the_job_start_and_a_later_one_starts_at_its_begin_line():
    start, end = trial_slice(POOL_LOG, "attempt-01-a", first=True)
    assert start == 0 and POOL_LOG[:end].endswith("attempt-01-a end code=0\n")
    start, end = trial_slice(POOL_LOG, "attempt-02-b", first=False)
    assert POOL_LOG[start:].startswith("AUTORL-WARM attempt-02-b begin")
    assert end == len(POOL_LOG)
    assert trial_slice(POOL_LOG[: line_at(POOL_LOG, "AUTORL-WARM attempt-02-b end")], "attempt-02-b", False)[1] is None
    assert trial_slice(POOL_LOG, "attempt-03-c", first=False) == (None, None)
    # a begin line before the trial was handed over is another trial's (an attempt name is never reused, but the
    # search starts where the pool's log stood at the hand-over)
    assert trial_slice(POOL_LOG, "attempt-01-a", first=False, after=len(POOL_LOG)) == (None, None)


def test_a_warm_trials_phases_are_cut_at_the_servers_lines_not_at_its_reset():
    start, end = trial_slice(POOL_LOG, "attempt-02-b", first=False)
    text = POOL_LOG[start:end]
    at = {
        "begin": 100.0,
        "AUTORL-WARM attempt-02-b vllm": 101.0,
        "AUTORL-WARM attempt-02-b actor": 110.0,
        "AUTORL-WARM attempt-02-b fit": 140.0,
        "Prompt dataloader": 200.0,
    }
    times = [(0, 100.0)] + [(line_at(text, k), v) for k, v in at.items() if k != "begin"]
    got = phases(text, sorted(times), started=99.0, ended=230.0)
    assert got["submit"] == 1.0 and got["driver"] == 1.0
    assert got["vllm"] == 9.0  # the reset's wake and sleep lines stay in the vLLM phase
    assert got["actor"] == 30.0 and got["training"] == 60.0 and got["save"] == 0.0 and got["eval"] == 30.0


def test_a_pool_log_is_read_incrementally_with_its_arrival_times(tmp_path):
    log = tmp_path / "pool.log"
    times = tmp_path / "pool.log.times"
    reader = PoolLog(log)
    reader.refresh()
    assert reader.text == "" and reader.times == []
    log.write_text(POOL_LOG[:50])
    times.write_text("0\t10.00\n")
    reader.refresh()
    with log.open("a") as fh:
        fh.write(POOL_LOG[50:])
    with times.open("a") as fh:
        fh.write("50\t12.50\n25")  # a line still being written is read next time
    reader.refresh()
    assert reader.text == POOL_LOG
    assert reader.times == [(0, 10.0), (50, 12.5)]
    assert reader.arrival(49) == 10.0 and reader.arrival(60) == 12.5


# ---- the ledger says which trials ran warm ----------------------------------------------------------------------
def test_warm_columns_come_from_the_run_folder_and_reach_the_ledger(tmp_path):
    assert warm_columns(tmp_path) == {}
    (tmp_path / "warm.json").write_text(json.dumps({"pool": "warm-1a2b3c4d", "index": 3, "seconds": {}}))
    assert warm_columns(tmp_path) == {"warm_pool": "warm-1a2b3c4d", "warm_index": 3}
    (tmp_path / "warm.json").write_text("{not json")
    assert warm_columns(tmp_path) == {}
    ledger = Ledger(tmp_path / "ledger.sqlite")
    assert {"warm_pool", "warm_index"} <= set(ledger.db["autorl_trials"].columns_dict)


def test_autorl_show_says_which_trials_ran_warm(tmp_path):
    ws = git_workspace(tmp_path / "ws")
    ledger = Ledger(ws / "ledger.sqlite")
    first, later = ledger.trial(2), ledger.trial(3)
    ledger.update_trial(first.id, warm_pool="warm-1a2b3c4d", warm_index=0)
    ledger.update_trial(later.id, warm_pool="warm-1a2b3c4d", warm_index=2)
    shown = {n: run_cli("-C", str(ws), "show", str(n)) for n in (1, 2, 3)}
    assert all(r.returncode == 0 for r in shown.values()), [r.stderr for r in shown.values()]
    assert "warm pool" not in shown[1].stdout
    assert "ran in warm pool warm-1a2b3c4d: built it (a cold start)" in shown[2].stdout
    assert "ran in warm pool warm-1a2b3c4d: its trial 3, after a reset" in shown[3].stdout
    got = run_cli("-C", str(ws), "show", "3", "--json")
    assert '"warm_index": 2' in got.stdout and '"warm_pool": "warm-1a2b3c4d"' in got.stdout


def test_a_warm_runs_events_say_which_pool_it_built_or_reused_and_which_it_retired(tmp_path):
    """docs/warm-trials.md 3.5: the ledger's events tell a pool's start, each later trial with what its reset and
    new actor took, and every pool retired on a run's account with the reason."""
    assert warm_events(tmp_path) == []
    seconds = {"vllm": 0.47, "actor": 27.4, "fit": 273.0}
    (tmp_path / "warm.json").write_text(json.dumps({"pool": "warm-1a2b3c4d", "index": 0, "seconds": seconds}))
    assert warm_events(tmp_path) == [
        ("warm-pool-start", "warm-1a2b3c4d: built by this trial; actor 27.4 s, fit 273.0 s, vllm 0.5 s")
    ]
    (tmp_path / "warm.json").write_text(json.dumps({"pool": "warm-1a2b3c4d", "index": 2, "seconds": {}}))
    (tmp_path / "warm-retired.jsonl").write_text(
        '{"pool": "warm-99", "reason": "idle, its GPUs taken for a new pool", "trials": 3}\n'
        "{not json\n"
        '{"pool": "warm-1a2b3c4d", "reason": "its trial attempt-05-x ended with exit 1", "trials": 3}\n'
    )
    assert warm_events(tmp_path) == [
        ("warm-trial", "warm-1a2b3c4d: its trial 3, after a reset"),
        ("warm-pool-retired", "warm-99 after 3 trials: idle, its GPUs taken for a new pool"),
        ("warm-pool-retired", "warm-1a2b3c4d after 3 trials: its trial attempt-05-x ended with exit 1"),
    ]


def test_a_trials_warm_events_reach_the_ledger_with_its_end_in_one_transaction(tmp_path):
    ws = git_workspace(tmp_path / "ws")
    ledger = Ledger(ws / "ledger.sqlite")
    row = ledger.trial(2)
    more = [("warm-pool-start", "warm-1a2b3c4d: built by this trial"), ("warm-pool-retired", "warm-99 after 1 trials")]
    ledger.update_trial(row.id, event="trial-end", more_events=more, status="complete")
    kinds = [(e.kind, e.message) for e in ledger.events(row.study_id) if e.trial_id == row.id][:3]
    assert kinds[:2] == list(reversed(more)) and kinds[2] == ("trial-end", "complete")  # newest first
    with pytest.raises(ValueError):  # a value the row does not take: nothing of it is written, events included
        ledger.update_trial(row.id, event="trial-end", more_events=[("warm-trial", "x")], status="no-such-status")
    assert not [e for e in ledger.events(row.study_id) if e.kind == "warm-trial"]
