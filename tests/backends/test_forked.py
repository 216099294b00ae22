"""Embedded trials forked from the fork server behave as fresh ``python -m autorl.engine`` processes.

Each test gets its own real fork server (``python -m autorl.engine.forkserver``) and runs the real engine.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from autorl.backends import forked
from autorl.backends.base import LaunchPlan

ENGINE_KEY = (sys.executable, forked.ENGINE, None)


@pytest.fixture(autouse=True)
def own_servers(monkeypatch):
    """A fork server of this test's own, ended after it (a test may kill its server)."""
    servers: dict = {}
    monkeypatch.setattr(forked, "_SERVERS", servers)
    monkeypatch.delenv("AUTORL_FORKSERVER", raising=False)
    yield servers
    for server in servers.values():
        server.close()


def plan(
    tmp: Path,
    name: str,
    config: dict,
    cache: Path,
    env: dict | None = None,
    cwd: Path | None = None,
    cpus: list[int] | None = None,
) -> LaunchPlan:
    run = tmp / name
    run.mkdir(parents=True)
    (run / "cfg.json").write_text(json.dumps(config))
    argv = [
        sys.executable,
        "-m",
        "autorl.engine",
        "--config",
        str(run / "cfg.json"),
        "--metrics-out",
        str(run / "metrics.jsonl"),
        "--cache-dir",
        str(cache),
    ]
    return LaunchPlan(
        argv=argv,
        env=env or {},
        cwd=str(cwd or tmp),
        log_path=str(run / "train.log"),
        metrics_path=str(run / "metrics.jsonl"),
        cpus=cpus,
    )


def finish(handle, timeout: float = 300) -> int:
    deadline = time.time() + timeout
    while handle.poll() is None:
        assert time.time() < deadline, "the run did not end"
        time.sleep(0.05)
    return handle.poll()


def records(p: LaunchPlan) -> list[dict]:
    """The run's metric records without the timing fields (which differ between any two runs)."""
    timing = ("tokens_per_s", "wall_s")
    out = []
    for line in Path(p.metrics_path).read_text().splitlines():
        rec = json.loads(line)
        out.append({k: v for k, v in rec.items() if k not in timing and not k.startswith("time_")})
    return out


def test_forked_run_equals_a_fresh_process(tmp_path, engine_cache, monkeypatch):
    config = {"steps": 4, "eval_every": 2, "seed": 3}
    forked_plan = plan(tmp_path, "forked", config, engine_cache)
    handle = forked.ForkedProcess(forked_plan)
    assert isinstance(handle.proc, forked.ForkedChild)
    assert finish(handle) == 0
    monkeypatch.setenv("AUTORL_FORKSERVER", "0")
    fresh_plan = plan(tmp_path, "fresh", config, engine_cache)
    fresh = forked.ForkedProcess(fresh_plan)
    assert not isinstance(fresh.proc, forked.ForkedChild)
    assert finish(fresh) == 0
    got, want = records(forked_plan), records(fresh_plan)
    assert [r["type"] for r in got].count("step") == 4
    assert got == want
    assert "eval step 4" in Path(forked_plan.log_path).read_text()


def test_bad_config_exits_2_with_one_line_in_the_log(tmp_path, engine_cache):
    p = plan(tmp_path, "bad", {"stepz": 3}, engine_cache)
    handle = forked.ForkedProcess(p)
    assert isinstance(handle.proc, forked.ForkedChild)
    assert finish(handle) == 2
    log = Path(p.log_path).read_text()
    assert log.strip().splitlines() == ["error: config: unknown key 'stepz': check the spelling against EngineConfig"]


def test_cancel_stops_the_process_group(tmp_path, engine_cache):
    p = plan(tmp_path, "long", {"steps": 2000}, engine_cache)
    handle = forked.ForkedProcess(p)
    assert os.getpgid(handle.pid) == handle.pid and os.getsid(handle.pid) == handle.pid
    while not Path(p.metrics_path).is_file():
        time.sleep(0.05)
    handle.cancel(grace_s=2)
    assert handle.poll() == -signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.killpg(handle.pid, 0)


REWARD = """
import json, os, sys
from pathlib import Path

def reward(completion, label):
    out = Path("seen.json")
    if not out.exists():
        out.write_text(json.dumps({"cwd": os.getcwd(), "path0": sys.path[0], "cuda":
        os.environ.get("CUDA_VISIBLE_DEVICES"),
                                   "cpus": sorted(os.sched_getaffinity(0)), "stdin": sys.stdin.read()}))
    return float(completion.strip() == label.strip())
"""


def test_the_child_runs_in_its_worktree_with_its_environment_and_cpus(tmp_path, engine_cache):
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    (worktree / "probe_reward.py").write_text(REWARD)
    cpu = sorted(os.sched_getaffinity(0))[-1]
    p = plan(
        tmp_path,
        "probe",
        {"steps": 1, "eval_every": 0, "threads": 1, "reward": "probe_reward:reward"},
        engine_cache,
        env={"CUDA_VISIBLE_DEVICES": ""},
        cwd=worktree,
        cpus=[cpu],
    )
    handle = forked.ForkedProcess(p)
    assert isinstance(handle.proc, forked.ForkedChild)
    assert finish(handle) == 0, Path(p.log_path).read_text()[-500:]
    seen = json.loads((worktree / "seen.json").read_text())
    assert seen == {"cwd": str(worktree), "path0": str(worktree), "cuda": "", "cpus": [cpu], "stdin": ""}


def test_an_environment_read_at_start_up_gets_a_fresh_process(tmp_path, engine_cache):
    p = plan(tmp_path, "omp", {"steps": 1, "eval_every": 0}, engine_cache, env={"OMP_NUM_THREADS": "1"})
    handle = forked.ForkedProcess(p)
    assert not isinstance(handle.proc, forked.ForkedChild)
    assert finish(handle) == 0


def test_a_server_that_ended_loses_no_trial(tmp_path, engine_cache, own_servers):
    running = forked.ForkedProcess(plan(tmp_path, "running", {"steps": 2000}, engine_cache))
    try:
        assert isinstance(running.proc, forked.ForkedChild)
        server = own_servers[ENGINE_KEY]
        server.proc.kill()
        server.proc.wait()
        deadline = time.time() + 10
        while server.alive and time.time() < deadline:
            time.sleep(0.05)
        assert not server.alive
        assert running.poll() is None  # still running, in its own session
    finally:
        running.cancel(grace_s=2)  # a failed assertion must not leave a 2000-step trial running
    assert running.poll() == forked.LOST
    after = plan(tmp_path, "after", {"steps": 1, "eval_every": 0}, engine_cache)
    handle = forked.ForkedProcess(after)
    assert not isinstance(handle.proc, forked.ForkedChild)
    assert finish(handle) == 0


def test_the_embedded_backend_forks_its_trials_and_warms_the_server_in_prepare(tmp_path, engine_cache, own_servers):
    from autorl.backends.base import TrialSpec, get_backend
    from autorl.recipe import validate_recipe

    backend = get_backend("embedded")
    recipe = validate_recipe({"backend": "embedded", "train": {"steps": 2, "eval_every": 0}})
    assert backend.prepare(recipe, engine_cache, tmp_path / "prepare") == 0
    assert ENGINE_KEY in own_servers  # started while the base model was checked
    spec = TrialSpec(
        attempt="attempt-01-x",
        recipe=recipe,
        worktree=tmp_path,
        run_dir=tmp_path / "run",
        cache_dir=engine_cache,
        seed=7,
    )
    handle = backend.start(backend.plan(spec))
    assert isinstance(handle.proc, forked.ForkedChild)
    assert finish(handle) == 0
    summary = json.loads(Path(tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert summary["type"] == "summary" and summary["steps_done"] == 2


def test_a_per_item_evaluation_is_forked_from_an_evaluator_server_and_matches_a_fresh_one(tmp_path, own_servers):
    """The evaluator that follows an OpenRLHF, TRL or command trial skips torch's and transformers' imports; what it
    writes is what a fresh ``python -m autorl.evaluate`` writes, value for value."""
    from autorl.backends.base import LaunchPlan, LocalProcess
    from autorl.evaluate import ProbeSettings, eval_argv
    from autorl.toolkit.hf_tiny import save_llama

    model = save_llama(tmp_path / "model", "tiny", seed=3)
    probe = tmp_path / "probe.jsonl"
    probe.write_text("".join(json.dumps({"input": f"{a}+{a}=", "label": str(2 * a)}) + "\n" for a in range(10, 30)))
    settings = ProbeSettings(probe_id=str(probe), probe_k=2, probe_temperature=1.0, probe_engine="hf")
    env = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    records = {}
    for name, kind in (("fresh", LocalProcess), ("forked", forked.ForkedProcess), ("again", forked.ForkedProcess)):
        out = tmp_path / name / "eval.jsonl"
        argv = eval_argv(sys.executable, model, out, settings, 5, step=4, seed=11)
        p = LaunchPlan(
            argv=argv,
            env=env,
            cwd=str(tmp_path),
            log_path=str(tmp_path / name / "train.log"),
            metrics_path=str(out),
            backend="command",
        )
        handle = kind(p)
        assert isinstance(handle.proc, forked.ForkedChild) == (kind is forked.ForkedProcess)
        assert finish(handle) == 0, Path(p.log_path).read_text()[-800:]
        records[name] = json.loads(out.read_text().splitlines()[-1])
    assert records["forked"] == records["fresh"] == records["again"]
    assert len([k for k in own_servers if k[1] == forked.EVALUATE]) == 1  # one server for the study's evaluations


def test_an_evaluation_with_another_environment_gets_its_own_evaluator_server(own_servers):
    first = forked.server_for(sys.executable, forked.EVALUATE, {"PATH": "/usr/bin", "HF_HUB_OFFLINE": "1"})
    same = forked.server_for(
        sys.executable, forked.EVALUATE, {"PATH": "/usr/bin", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "0"}
    )
    other = forked.server_for(sys.executable, forked.EVALUATE, {"PATH": "/usr/bin", "HF_HUB_OFFLINE": "0"})
    assert first is same and other is not first
    assert first.serves(sys.executable, {"PATH": "/usr/bin", "HF_HUB_OFFLINE": "1"})
    # importing ray in the controller sets RAY_CLIENT_MODE: nothing a server imports reads it
    assert first.serves(sys.executable, {"PATH": "/usr/bin", "HF_HUB_OFFLINE": "1", "RAY_CLIENT_MODE": "0"})
    assert not first.serves(sys.executable, {"PATH": "/usr/bin", "HF_HUB_OFFLINE": "0"})
