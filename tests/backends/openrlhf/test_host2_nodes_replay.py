"""A two-node Ray cluster on a 2 x H200 host (OpenRLHF 0.10.4, vLLM 0.22.1, Ray 2.55), as real OpenRLHF and autorl
wrote it: `benchmarks/openrlhf_small.sh OUTDIR nodes` started a head given card 0 and a second Ray node given card
1, each card counted as two logical GPUs, and drove a `--parallel 4` study of trials packed two a card
(`gpus_per_trial: 0.5`) through `--ray-address`; where every job's driver and actors ran was read from Ray's state
API every 15 s. The first attempt hung (every trial's driver booked half a GPU, leaving the actors none); the rerun
after the fix ran, and `autorl run --resume` then confirmed its best candidate. autorl reads them as they are."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

from autorl.backends.base import LaunchPlan
from autorl.data import shipped
from autorl.ledger import Ledger
from autorl.present.review import format_status, status_rows
from autorl.recipe import load_recipe
from autorl.runs.slots import Slots
from autorl.workspace import Workspace
from tests.backends.openrlhf.test_host4_replay import ledger_rows
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "tests" / "data" / "openrlhf-0.10.4" / "small" / "host2-nodes"
GPU_ACTORS = {"PolicyModelActor", "RolloutRayActor"}  # the colocated actor and vLLM engine: the trial's GPU


def _nodes_script():
    spec = importlib.util.spec_from_file_location("openrlhf_nodes", ROOT / "benchmarks" / "openrlhf_nodes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _snapshots(name: str) -> list[dict]:
    return [json.loads(line) for line in (RUN / name).read_text().splitlines()]


def _gpu_node(job: dict) -> set[str]:
    return {a.split("@")[1] for a in job["actors"] if a.split("@")[0] in GPU_ACTORS}


def test_each_trials_gpu_actors_ran_together_on_one_node_and_both_nodes_were_in_use_at_once():
    """Every trial's actor and vLLM engine sat on one node (its placement group: one logical GPU); two trials ran on
    the head's card and two on the worker's at once, in both waves."""
    snaps = [s for s in _snapshots("nodes-placement.jsonl") if "jobs" in s]
    placed: dict[str, set[str]] = {}
    for snap in snaps:
        for job in snap["jobs"]:
            if _gpu_node(job):
                assert len(_gpu_node(job)) == 1, job  # never split across the nodes
                placed.setdefault(job["submission_id"], set()).update(_gpu_node(job))
    assert len(placed) == 8 and all(len(nodes) == 1 for nodes in placed.values())
    full = [
        s
        for s in snaps
        if sorted(n for j in s["jobs"] for n in _gpu_node(j) if len(j["actors"]) >= 2)
        == ["head", "head", "worker", "worker"]
    ]
    assert len(full) >= 2 and full[-1]["t"] - full[0]["t"] > 200  # two on each card, in the first wave and the second
    summary = _nodes_script().summary(RUN / "nodes-placement.jsonl")
    assert "actors on both nodes at once in 15 of 30 snapshots" in summary
    both = [s for s in snaps if {n for j in s["jobs"] for n in _gpu_node(j)} == {"head", "worker"}]
    assert len(both) == 14  # the 15th: one trial, its PPOTrainer (no GPU) on the worker, its GPU actors on the head


def test_the_hung_study_had_drivers_and_no_actor_and_the_driver_now_books_no_gpu():
    """Before the fix, four drivers booked 0.5 GPU each, two on each node, so no node had a whole logical GPU for a
    trial's placement group: no actor ever started, every trial was killed by the silence watchdog, retried, and
    the study ended on its failed baseline. A Ray-run backend's driver now books none of the trial's GPUs."""
    snaps = _snapshots("hung-placement.jsonl")
    assert snaps and all(job["actors"] == [] for s in snaps for job in s.get("jobs", []))
    assert max(len(s.get("jobs", [])) for s in snaps) == 4
    log = (RUN / "hung-study.log").read_text()
    assert log.count("no output or metrics for 120 s (watchdog)") == 8 and "ended: the baseline failed" in log
    train = (RUN / "hung-attempt01-train.log").read_text()
    assert "Connected to Ray cluster" in train and "Global step" not in train
    recipe = load_recipe(shipped("recipes/openrlhf-small.yaml")).model_copy(update={"gpus_per_trial": 0.5})
    plan = LaunchPlan(argv=["python"], cwd=".", log_path="x.log", metrics_path="x.jsonl")
    cluster = Slots(4, "http://127.0.0.1:8265")
    assert cluster.assign(plan, 0, recipe, on_ray=True).resources.get("entrypoint_num_gpus", 0) == 0
    assert cluster.assign(plan, 0, recipe).resources["entrypoint_num_gpus"] == 0.5  # a command trial is its driver


def test_the_two_node_study_found_candidates_and_the_resume_confirmed_the_first():
    """Four baseline runs (0.474-0.478) and four candidates, all complete, in 458 s; the resume ran the waiting
    confirmation runs first, the first candidate's three before the next one's, and confirmed lr 1e-6 -> 1.22e-5."""
    rows = ledger_rows(RUN / "nodes-ledger.sqlite")
    assert [r["status"] for r in rows] == ["complete"] * 12
    assert sorted(r["objective"] for r in rows[:4]) == [0.474, 0.474, 0.476, 0.478]
    assert [r["verdict"] for r in rows[4:8]] == ["improved"] * 4
    assert [r["confirms"] for r in rows[8:]] == [5, 5, 5, 6]
    best = rows[4]
    assert best["confirmation"] == "confirmed" and best["gate"] == "ok"
    assert json.loads(best["params"])["lr"] == 1.224744871391589e-05
    assert [r["objective"] for r in rows[8:11]] == [0.548, 0.546, 0.56]
    assert "97.5% two-sided" in best["confirm_test"]
    resume = (RUN / "resume.log").read_text()
    assert re.search(r"confirmed by 3 fresh-seed runs \(gain \+0\.0758, 97\.5% CI \[\+0\.0331, \+0\.1185\]\)", resume)
    assert "Next: autorl promote" in resume
    study = (RUN / "nodes-study.log").read_text()
    assert "4 GPUs on two nodes (head: card 0, worker: card 1)" in study and "8 trials in 458 s" in study


def test_the_second_wave_started_warm_and_ran_four_trials_at_once():
    """The second wave's trials reached their first step in 124-128 s (the first wave's, cold: 187-193 s) and ran
    174-194 s each, all four at once."""
    rows = ledger_rows(RUN / "nodes-ledger.sqlite")[:8]
    first = [round(r["first_step"] - r["started"]) for r in rows]
    assert max(first[:4]) > 180 and max(first[4:]) < 130
    wave = rows[4:8]
    assert max(r["started"] for r in wave) < min(r["finished"] for r in wave)  # all four running together
    took = [r["finished"] - r["started"] for r in wave]
    assert 170 < min(took) and max(took) < 200


def test_status_says_what_a_ray_trial_still_waits_for_on_its_cluster(tmp_path):
    """The resumed study's four confirmation runs, read back as running Ray jobs before their first step: the one
    whose log ends with the controller's note that it waits for the cluster shows that in `autorl status`; one
    whose job has printed since does not."""
    assert run_cli("init", str(tmp_path / "ws")).returncode == 0
    ws, db = Workspace.open(tmp_path / "ws"), tmp_path / "ledger.sqlite"
    shutil.copy(RUN / "nodes-ledger.sqlite", db)
    waits = "a placement group of its actors needs GPU 1, which other jobs hold (the live nodes have GPU 2 in all)"
    logs = {
        9: f"Running entrypoint for job autorl-ce5058b25f04\n\nautorl: waiting for the cluster: {waits}\n",
        10: f"\nautorl: waiting for the cluster: {waits}\n(PPOTrainer pid=1) started\n",
    }
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE autorl_trials SET status = 'running' WHERE number IN (9, 10)")
        for number, text in logs.items():
            (tmp_path / f"{number}.log").write_text(text)
            conn.execute(
                "UPDATE autorl_trials SET log_path = ? WHERE number = ?", (str(tmp_path / f"{number}.log"), number)
            )
            conn.execute(
                "DELETE FROM autorl_metrics WHERE trial_id = (SELECT id FROM autorl_trials WHERE number = ?)", (number,)
            )
    ledger = Ledger(db)
    lock = ws.lock_study(ledger.study(study_id=1).name)
    try:
        running = status_rows(ledger, ws)["running"]
    finally:
        lock.release()
    assert [(r["job_id"], r["waiting"]) for r in running] == [
        ("autorl-ce5058b25f04", waits),
        ("autorl-0b91e2945885", None),
    ]
    text = " ".join(format_status({"studies": [], "running": running, "full_runs": []}).split())  # unwrapped
    assert (
        f"alive (Ray job autorl-ce5058b25f04, watched by controller pid {os.getpid()}; waiting for the cluster: "
        f"{waits})"
    ) in text
    assert text.count("waiting for the cluster") == 1
