"""The controller's side of warm pools (warm.py) on a real local Ray head: trials handed to a pool's job one after
another, each with its own slice of the job log and its done file; a refused trial run as its own job; a failed
trial retiring its pool; a cancel; and room made on a full head. The pool's job is a stand-in server speaking the
same file protocol (tests/data/scripts/warm_protocol_server.py): the real one needs vLLM and a GPU."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from autorl.backends.base import LaunchPlan
from autorl.backends.openrlhf.warm import WarmPools
from autorl.backends.ray_jobs import LocalRayHead, submit

pytestmark = pytest.mark.slow
STANDIN = Path(__file__).resolve().parents[2] / "data" / "scripts" / "warm_protocol_server.py"


@pytest.fixture(scope="module")
def head():
    ray_head = LocalRayHead(num_cpus=2, num_gpus=0, object_store_bytes=80 * 1024 * 1024)
    ray_head.start()
    yield ray_head
    ray_head.stop()


def pools_on(head, tmp_path: Path, capacity: int = 2) -> tuple[WarmPools, list[str]]:
    work = tmp_path / "wt"
    work.mkdir(exist_ok=True)
    (work / "cold.py").write_text("import os\nprint('cold run', os.environ.get('STANDIN_KEY'))\n")
    cold: list[str] = []

    def submit_pool(plan: LaunchPlan, pool) -> object:
        return submit(
            head.address,
            [sys.executable, str(STANDIN), str(pool.dir)],
            working_dir=work,
            log_path=pool.dir / "pool.log",
            env=plan.env,
        )

    def start_cold(plan: LaunchPlan) -> object:
        cold.append(Path(plan.log_path).parent.name)
        return submit(head.address, [sys.executable, "cold.py"], working_dir=work, log_path=plan.log_path, env=plan.env)

    return WarmPools(tmp_path / "warm", capacity, submit_pool, start_cold), cold


def plan(tmp_path: Path, name: str, key: str = "k1", **env: str) -> LaunchPlan:
    run = tmp_path / "runs" / name
    return LaunchPlan(
        argv=["python", "-m", "openrlhf.cli.train_ppo_ray"],
        env={"STANDIN_KEY": key, **env},
        cwd=str(tmp_path),
        log_path=str(run / "train.log"),
        metrics_path=str(run / "metrics" / "training_metrics.jsonl"),
        metrics_format="openrlhf",
        backend="openrlhf",
        pool_key=key,
    )


def wait(handle, timeout_s: float = 60.0) -> int | None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        code = handle.poll()
        if code is not None:
            return code
        time.sleep(0.2)
    return None


def retired(tmp_path: Path, name: str) -> list[tuple[str, str]]:
    """The pools a run retired, with why, as its run folder notes them for the ledger."""
    path = tmp_path / "runs" / name / "warm-retired.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [(r["pool"], r["reason"]) for r in map(json.loads, lines)]


def test_trials_share_a_pool_and_each_log_holds_only_its_own_slice(head, tmp_path):
    pools, cold = pools_on(head, tmp_path)
    try:
        first = pools.start(plan(tmp_path, "attempt-01-a"))
        assert wait(first) == 0 and first.warm == (first.pool.id, 0)
        second = pools.start(plan(tmp_path, "attempt-02-b"))
        assert second.pool is first.pool and wait(second) == 0 and second.warm == (first.pool.id, 1)
        one = Path(first.log_path).read_text()
        two = Path(second.log_path).read_text()
        assert one.startswith(("Runtime env", "Running entrypoint", "Connected")) or "Connected to Ray" in one
        assert "attempt-01-a end code=0" in one and "attempt-02-b" not in one
        assert two.startswith("AUTORL-WARM attempt-02-b begin") and "attempt-01-a" not in two
        assert two.rstrip().endswith("attempt-02-b end code=0")
        times = Path(str(second.log_path) + ".times").read_text().split()
        assert times and times[0] == "0"  # offsets are the trial log's own
        warm = json.loads((Path(second.log_path).parent / "warm.json").read_text())
        assert warm["pool"] == first.pool.id and warm["index"] == 1
        assert cold == [] and first.job_id == second.job_id
    finally:
        pools.close()


def test_a_refused_trial_runs_as_its_own_job_and_the_pool_stays(head, tmp_path):
    pools, cold = pools_on(head, tmp_path)
    try:
        first = pools.start(plan(tmp_path, "attempt-01-a", key="k1"))
        assert wait(first) == 0
        # the stand-in refuses another key, as the real server refuses other engine settings
        refused = pools.start(plan(tmp_path, "attempt-02-b", key="k1", STANDIN_KEY="other"))
        assert wait(refused) == 0 and cold == ["attempt-02-b"] and refused.warm is None
        log = Path(refused.log_path).read_text()
        assert "did not take this trial" in log and "cold run other" in log
        assert first.pool.alive() and not (Path(refused.log_path).parent / "warm.json").exists()
    finally:
        pools.close()


def test_a_failed_trial_retires_its_pool_and_the_next_gets_a_new_one(head, tmp_path):
    pools, _ = pools_on(head, tmp_path)
    try:
        bad = pools.start(plan(tmp_path, "attempt-01-a", STANDIN_CODE="1"))
        assert wait(bad) == 1 and bad.pool.retired
        assert retired(tmp_path, "attempt-01-a") == [(bad.pool.id, "its trial attempt-01-a ended with exit 1")]
        after = pools.start(plan(tmp_path, "attempt-02-b"))
        assert after.pool is not bad.pool and wait(after) == 0 and after.warm == (after.pool.id, 0)
    finally:
        pools.close()


def test_a_pool_whose_server_died_between_trials_costs_the_next_trial_a_cold_start_not_its_run(head, tmp_path):
    """The pool's server is killed after one trial, once the next is handed to it but before it began: that trial
    moves to a new pool and completes; the dead pool is retired, and the move is noted for the ledger."""
    import os
    import signal
    import subprocess

    pools, _ = pools_on(head, tmp_path)
    try:
        a = pools.start(plan(tmp_path, "attempt-01-a", STANDIN_THEN_WAIT="60"))
        assert wait(a) == 0
        b = pools.start(plan(tmp_path, "attempt-02-b"))
        assert b.pool is a.pool  # handed to the pool, whose server now waits before it reads its inbox
        for pid in subprocess.run(["pgrep", "-f", str(a.pool.dir)], capture_output=True, text=True).stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        assert wait(b) == 0
        assert a.pool.retired and b.warm is not None and b.warm[0] != a.pool.id and b.warm[1] == 0
        assert retired(tmp_path, "attempt-02-b") == [(a.pool.id, "its server ended before trial attempt-02-b began")]
        log = Path(b.log_path).read_text()
        assert "AUTORL-WARM attempt-02-b begin index=0" in log and "end code=0" in log
        assert json.loads((tmp_path / "runs" / "attempt-02-b" / "warm.json").read_text())["pool"] == b.warm[0]
    finally:
        pools.close()


def test_a_pool_whose_server_died_while_idle_is_retired_on_the_next_trials_account(head, tmp_path):
    """As on a 2-GPU host (tests/data/openrlhf-0.10.4/small/h200x2-warmkill): the server killed before the next
    trial is handed out. That trial starts in a new pool, and its run folder says the old pool died, for the
    ledger: before, the dead pool was passed over without a word."""
    import os
    import signal
    import subprocess

    pools, _ = pools_on(head, tmp_path)
    try:
        a = pools.start(plan(tmp_path, "attempt-01-a"))
        assert wait(a) == 0
        for pid in subprocess.run(["pgrep", "-f", str(a.pool.dir)], capture_output=True, text=True).stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        deadline = time.time() + 30
        while a.pool.alive() and time.time() < deadline:
            time.sleep(0.2)
        b = pools.start(plan(tmp_path, "attempt-02-b"))
        assert b.pool is not a.pool and a.pool.retired and wait(b) == 0 and b.warm == (b.pool.id, 0)
        assert retired(tmp_path, "attempt-02-b") == [
            (a.pool.id, "its server ended while idle, before trial attempt-02-b was handed out")
        ]
        assert retired(tmp_path, "attempt-01-a") == []
    finally:
        pools.close()


def test_a_cancel_stops_the_trial_and_retires_the_pool(head, tmp_path):
    pools, _ = pools_on(head, tmp_path)
    try:
        long = pools.start(plan(tmp_path, "attempt-01-a", STANDIN_SLEEP="120"))
        deadline = time.time() + 60
        while "fit" not in Path(long.log_path).read_text() if Path(long.log_path).exists() else True:
            long.poll()
            assert time.time() < deadline
            time.sleep(0.2)
        t = time.time()
        long.cancel(grace_s=2.0)
        assert long.poll() == -15 and time.time() - t < 30
        assert long.pool.retired
        assert [pool for pool, _ in retired(tmp_path, "attempt-01-a")] == [long.pool.id]
    finally:
        pools.close()


def test_a_full_head_retires_the_least_recently_used_idle_pool(head, tmp_path):
    pools, _ = pools_on(head, tmp_path, capacity=1)
    try:
        a = pools.start(plan(tmp_path, "attempt-01-a", key="k1"))
        assert wait(a) == 0
        b = pools.start(plan(tmp_path, "attempt-02-b", key="k2"))  # another key, no room: the idle k1 pool goes
        assert a.pool.retired and b.pool is not a.pool and wait(b) == 0
        assert [p.key for p in pools.live()] == ["k2"]
        assert retired(tmp_path, "attempt-02-b") == [(a.pool.id, "idle, its GPUs taken for a new pool")]
        assert retired(tmp_path, "attempt-01-a") == []
    finally:
        pools.close()


def test_a_pool_that_falls_idle_gives_its_gpus_to_a_job_of_its_own_waiting_for_them(head, tmp_path):
    """A full head: the one pool is busy when a job of its own starts, so nothing can be retired then; once the
    pool's trial ends, the pool is retired for the waiting job instead of holding its GPUs idle."""
    pools, _ = pools_on(head, tmp_path, capacity=1)
    try:
        busy = pools.start(plan(tmp_path, "attempt-01-a", STANDIN_SLEEP="3"))
        work = tmp_path / "wt"
        (work / "slow.py").write_text("import time\ntime.sleep(20)\n")
        alone = pools.track_cold(
            submit(head.address, [sys.executable, "slow.py"], working_dir=work, log_path=tmp_path / "alone.log")
        )
        pools.make_room(1)
        assert not busy.pool.retired  # busy: it keeps its trial
        assert wait(busy) == 0
        assert busy.pool.retired and pools.live() == []
        assert retired(tmp_path, "attempt-01-a") == [(busy.pool.id, "idle, its GPUs taken for a job of its own")]
        alone.cancel(grace_s=1.0)
    finally:
        pools.close()
