"""Parallel trials: local CPU slots and a real local Ray head, with kill -9 and --resume."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import gang_job, git, run_cli
from test_loop import _start_run, _trials

from autorl.backends import ray_jobs
from autorl.backends.base import LaunchPlan
from autorl.backends.ray_jobs import PROBE_PREFIX, LocalRayHead, LocalRayNode, client, wait_for_gpus
from autorl.data import shipped
from autorl.recipe import load_recipe
from autorl.runs.slots import Slots

pytestmark = pytest.mark.slow

FAST = [
    "--strategy",
    "optuna",
    "--set",
    "steps=8",
    "--set",
    "eval_every=4",
    "--set",
    "batch_prompts=16",
    "--set",
    "threads=1",
    "--set",
    "verdict.baseline_repeats=2",
]


def _overlap(a: dict, b: dict) -> bool:
    return a["started"] < b["finished"] and b["started"] < a["finished"]


def _check_landed(ws: Path, trials: list[dict]) -> None:
    for t in trials:
        assert git(ws, "rev-parse", t["start_tag"]) == t["start_sha"]
        assert git(ws, "rev-parse", t["end_tag"]) == t["end_sha"]
        assert not (ws / ".autorl" / "worktrees" / t["attempt"]).exists()
    assert len({t["attempt"] for t in trials}) == len(trials)


def test_two_local_slots_run_concurrently(workspace):
    r = run_cli(
        "-C", str(workspace), "run", "--budget", "5m", "--max-trials", "4", "--parallel", "2", *FAST, timeout=400
    )
    assert r.returncode == 0, r.stderr
    trials = _trials(workspace)
    assert len(trials) == 4 and all(t["status"] == "complete" for t in trials)
    assert _overlap(trials[0], trials[1]) and _overlap(trials[2], trials[3])
    assert [t["number"] for t in trials] == [1, 2, 3, 4]
    _check_landed(workspace, trials)


@pytest.fixture(scope="module")
def ray_head():
    with LocalRayHead(num_cpus=2) as head:
        yield head.address


def _jobs(address: str) -> list:
    return [j for j in client(address).list_jobs() if not j.submission_id.startswith(PROBE_PREFIX)]


def test_ray_jobs_run_concurrently_and_resume_leaves_none_running(workspace, ray_head):
    r = run_cli(
        "-C",
        str(workspace),
        "run",
        "--budget",
        "5m",
        "--max-trials",
        "2",
        "--parallel",
        "2",
        "--ray-address",
        ray_head,
        *FAST,
        timeout=400,
    )
    assert r.returncode == 0, r.stderr
    assert "ignored by default" not in r.stdout + r.stderr  # Ray's notice about .git, which autorl always left out
    trials = _trials(workspace)
    assert len(trials) == 2 and all(t["job_id"] for t in trials) and _overlap(trials[0], trials[1])
    _check_landed(workspace, trials)

    proc = _start_run(
        workspace, "--budget", "5m", "--parallel", "2", "--ray-address", ray_head, *FAST, "--set", "steps=400"
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        running = [t for t in _safe_trials(workspace) if t["status"] == "running" and t["job_id"]]
        if running:
            break
        time.sleep(0.3)
    assert running, "no Ray trial started"
    time.sleep(2)
    watched = _status_running(workspace)  # a Ray job has no process here: its controller says it is alive
    assert watched and all(r["alive"] and r["job_id"] and r["watched_by"] == proc.pid for r in watched), watched
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    orphans = _status_running(workspace)
    assert orphans and not any(r["alive"] or r["watched_by"] for r in orphans), orphans
    text = run_cli("-C", str(workspace), "status").stdout
    assert "NOT WATCHED (Ray job" in text and "--resume" in text, text
    live = [
        j for j in _jobs(ray_head) if str(j.status) in ("RUNNING", "PENDING", "JobStatus.RUNNING", "JobStatus.PENDING")
    ]
    assert live, "the killed controller's Ray job should still be running before --resume"
    r = run_cli(
        "-C",
        str(workspace),
        "run",
        "--resume",
        "--budget",
        "3m",
        "--max-trials",
        "1",
        "--parallel",
        "1",
        "--ray-address",
        ray_head,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    time.sleep(1)
    states = {str(j.status).split(".")[-1] for j in _jobs(ray_head)}
    assert not states & {"RUNNING", "PENDING"}, states
    trials = _trials(workspace)
    assert not any(t["status"] == "running" for t in trials)
    assert any(t["status"] == "interrupted" for t in trials)


def _status_running(ws: Path) -> list[dict]:
    r = run_cli("-C", str(ws), "status", "--json")
    assert r.returncode == 0, r.stderr
    return [x for x in json.loads(r.stdout)["running"] if x["kind"] == "trial"]


def _safe_trials(ws: Path) -> list[dict]:
    try:
        return _trials(ws)
    except sqlite3.OperationalError:
        return []


DEVICE_SCRIPT = """import json, os, sys, time
run_dir = sys.argv[1]
os.makedirs(run_dir, exist_ok=True)
with open(os.path.join(run_dir, "device.txt"), "w") as fh:
    fh.write(os.environ.get("CUDA_VISIBLE_DEVICES", "none"))
time.sleep(6)
with open(os.path.join(run_dir, "metrics.jsonl"), "a") as fh:
    fh.write(json.dumps({"type": "eval", "step": 1, "eval/id/greedy_pass@1": 0.5}) + "\\n")
"""


def test_a_two_node_cluster_on_one_host_places_one_trial_on_each_nodes_gpu(tmp_path):
    """A head (GPU 0) and a second Ray node on the same host (its own raylet, GPU 1) stand in for a two-node
    cluster: with --ray-address and --parallel 2, two one-GPU trials run at once, one on each node's GPU. Ray
    only books the GPUs here; the placement is what a real cluster does with the same code."""
    ws = tmp_path / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    (ws / "device.py").write_text(DEVICE_SCRIPT)
    (ws / "recipes" / "gpu.yaml").write_text(f"""name: gpu
backend: command
train:
  argv: ["{sys.executable}", "device.py", "{{run_dir}}"]
  lr: 0.001
search:
  lr: {{low: 0.0001, high: 0.01, log: true}}
verdict: {{baseline_repeats: 2}}
gpus_per_trial: 1
cpus_per_trial: 1
timeout_s: 120
""")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "gpu recipe")
    with LocalRayHead(num_cpus=2, visible_gpus=["0"]) as head:
        node = LocalRayNode(head.gcs_address, visible_gpus=["1"], num_cpus=2, log_path=tmp_path / "node.log").start()
        try:
            assert wait_for_gpus(head.address, 2, timeout_s=60) >= 2, "the second node never joined"
            r = run_cli(
                "-C",
                str(ws),
                "run",
                "recipes/gpu.yaml",
                "--max-trials",
                "2",
                "--parallel",
                "2",
                "--ray-address",
                head.address,
                "--budget",
                "5m",
                timeout=300,
            )
        finally:
            node.stop()
    assert r.returncode == 0, r.stderr + r.stdout
    trials = _trials(ws)
    assert len(trials) == 2 and _overlap(trials[0], trials[1])
    devices = sorted((ws / ".autorl" / "runs" / t["attempt"] / "device.txt").read_text() for t in trials)
    assert devices == ["0", "1"]


def test_the_studys_private_head_killed_mid_trial_is_triaged_restarted_and_the_study_goes_on(workspace):
    """`--ray-address local`: the study's own head is SIGKILLed while a trial's job runs. That trial ends as a crash
    whose root line says the head stopped answering (killed from outside, retried once), the next trial gets a new
    head, the study ends normally, and nothing of the lost job is left running."""
    proc = _start_run(
        workspace, "--budget", "8m", "--max-trials", "4", "--ray-address", "local", *FAST, "--set", "steps=24"
    )
    try:
        deadline, victim = time.time() + 300, None
        while time.time() < deadline and victim is None:
            victim = next(
                (t for t in _safe_trials(workspace) if t["status"] == "running" and t["job_id"] and t["number"] >= 2),
                None,
            )
            time.sleep(0.3)
        assert victim is not None, "no second Ray trial started"
        time.sleep(3)
        heads = [
            p
            for p in psutil.Process(proc.pid).children()
            if p.cmdline()[-3:-1] == ["start", "--head"] or "--head" in p.cmdline() and "start" in p.cmdline()
        ]
        assert len(heads) == 1, [p.cmdline() for p in heads]
        os.killpg(os.getpgid(heads[0].pid), signal.SIGKILL)
        out, err = proc.communicate(timeout=480)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    trials = _trials(workspace)
    lost = next(t for t in trials if t["number"] == victim["number"])
    assert lost["status"] == "crash" and lost["crash_category"] == "killed_external", lost
    assert "stopped answering" in lost["root_cause"]
    later = [t for t in trials if t["number"] > victim["number"]]
    assert later and all(t["status"] != "crash" for t in later) and all(t["job_id"] for t in later)
    assert len({t["number"] for t in trials}) == len(trials) and not any(t["status"] == "running" for t in trials)
    left = [p for p in psutil.process_iter(["cmdline"]) if victim["attempt"] in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]


def test_a_controller_killed_with_9_takes_its_private_head_with_it(workspace):
    """`kill -9` of a controller left its private Ray head (GCS, raylet, dashboard, the job's driver) running for
    good: nothing was left to stop it. The head now gets SIGTERM when the controller dies, and a resume on a new head
    finds the trial interrupted."""
    proc = _start_run(workspace, "--budget", "5m", "--ray-address", "local", *FAST, "--set", "steps=400")
    try:
        deadline, running = time.time() + 300, None
        while time.time() < deadline and running is None:
            running = next((t for t in _safe_trials(workspace) if t["status"] == "running" and t["job_id"]), None)
            time.sleep(0.3)
        assert running is not None, "no Ray trial started"
        time.sleep(2)
        heads = [p for p in psutil.Process(proc.pid).children() if "--head" in p.cmdline() and "start" in p.cmdline()]
        assert len(heads) == 1, [p.cmdline() for p in heads]
        group = [p for p in psutil.process_iter() if _pgid(p) == heads[0].pid]
        assert len(group) > 3  # ray start, GCS, raylet, dashboard, ...
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    _, alive = psutil.wait_procs(group, timeout=60)
    assert not alive, [_name(p) for p in alive]
    r = run_cli(
        "-C",
        str(workspace),
        "run",
        "--resume",
        "--budget",
        "3m",
        "--max-trials",
        "1",
        "--ray-address",
        "local",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    lost = next(t for t in _trials(workspace) if t["number"] == running["number"])
    assert lost["status"] == "interrupted"


def _name(p) -> str:
    try:
        return " ".join(p.cmdline())[:120]
    except Exception:  # gone meanwhile
        return str(p.pid)


def _pgid(p) -> int | None:
    try:
        return os.getpgid(p.pid)
    except (ProcessLookupError, PermissionError):
        return None


def test_ray_run_trials_on_a_two_node_cluster_leave_the_gpus_to_their_actors(tmp_path):
    """Two trials of ``gpus_per_trial`` 0.5 on two nodes of one GPU each: a Ray-run backend's driver books no GPU,
    so each trial's actors get a whole GPU (one trial a node). On a two-H200 host the drivers once took their
    trial's half GPU each, which left no node a whole GPU for the actors: every trial of the study hung until the
    watchdog (tests/data/openrlhf-0.10.4/small/host2-nodes/). A driver that is the trial itself (any command)
    still books the trial's share: its own process is the one on the GPU."""
    recipe = load_recipe(shipped("recipes/openrlhf-small.yaml")).model_copy(update={"gpus_per_trial": 0.5})
    with ray_jobs.LocalRayHead(num_cpus=2, visible_gpus=["0"]) as head:
        node = ray_jobs.LocalRayNode(
            head.gcs_address, visible_gpus=["1"], num_cpus=2, log_path=tmp_path / "node.log"
        ).start()
        try:
            assert ray_jobs.wait_for_gpus(head.address, 2, timeout_s=60) >= 2, "the second node never joined"
            slots = Slots(2, head.address)
            plans = []
            for slot in range(2):  # each holds its group longer than the other waits for its own
                job = gang_job(tmp_path / f"job{slot}", wait=20, hold=25)
                plan = LaunchPlan(
                    argv=[sys.executable, "driver.py"],
                    cwd=str(job),
                    log_path=str(tmp_path / f"job{slot}.log"),
                    metrics_path=str(tmp_path / "m.jsonl"),
                )
                plans.append(slots.assign(plan, slot, recipe, on_ray=True))
            handles = [
                ray_jobs.submit(
                    head.address,
                    p.argv,
                    working_dir=p.cwd,
                    log_path=p.log_path,
                    entrypoint_num_gpus=p.resources.get("entrypoint_num_gpus", 0),
                )
                for p in plans
            ]
            deadline = time.time() + 150
            while any(h.poll() is None for h in handles) and time.time() < deadline:
                time.sleep(1)
            codes = [h.poll() for h in handles]
        finally:
            node.stop()
    logs = [Path(p.log_path).read_text() for p in plans]
    assert codes == [0, 0], "\n---\n".join(logs)
    assert all("placed" in log and "never placed" not in log for log in logs)
    command = Slots(2, "http://127.0.0.1:8265").assign(plans[0].model_copy(update={"resources": {}}), 0, recipe)
    assert command.resources["entrypoint_num_gpus"] == 0.5
