"""A Ray job that waits for its cluster's GPUs is not a hang: the silence watchdog asks the cluster what a silent
trial's job waits for. Resources other jobs hold: it waits (the line goes into the trial's log, the wait does not
count against its timeout); resources no node could ever hold: the run ends at once with that line. Real local
Ray heads, each GPU only booked (no device)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from autorl.backends import ray_jobs
from autorl.backends.ray_demand import assess
from autorl.runs.watch import Watch
from tests.conftest import gang_job


def _job(tmp_path: Path, name: str, address: str, gpus: int, hold: float) -> ray_jobs.RayJobHandle:
    folder = gang_job(tmp_path / name, gpus=gpus, hold=hold)
    return ray_jobs.submit(
        address, [sys.executable, "driver.py"], working_dir=folder, log_path=tmp_path / f"{name}.log"
    )


def _said(log: Path, text: str) -> bool:
    return log.exists() and text in log.read_text()


def _watch(handle, silence_s: float, timeout_s: float = 150) -> Watch:
    return Watch(
        handle,
        timeout_s=timeout_s,
        deadline=None,
        silence_s=silence_s,
        on_records=lambda recs, m: None,
        external=lambda: None,
    )


def _follow(watch: Watch):
    while (outcome := watch.step()) is None:
        time.sleep(0.5)
    return outcome


def test_the_demand_is_weighed_against_the_live_nodes():
    nodes = [{"GPU": 1.0, "CPU": 8.0}, {"GPU": 1.0, "CPU": 8.0}]
    busy = assess([{"GPU": 1.0, "CPU": 1.0}], nodes, "a placement group of its actors")
    assert busy.feasible and "GPU 1" in busy.line and "GPU 2" in busy.line
    two_on_one = assess([{"GPU": 2.0}], nodes, "a placement group of its actors")
    assert not two_on_one.feasible  # two GPUs in all, but no node has two for one bundle
    assert "the largest GPU 1" in two_on_one.line and "never place" in two_on_one.line
    spread = assess([{"GPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}], nodes, "a placement group of its actors")
    assert not spread.feasible and "GPU 3" in spread.line  # more than the whole cluster
    custom = assess([{"TPU": 1.0}], nodes, "its driver")
    assert not custom.feasible and "TPU 0" in custom.line


@pytest.mark.slow
def test_a_trial_waiting_for_gpus_other_jobs_hold_waits_and_then_runs(tmp_path):
    with ray_jobs.LocalRayHead(num_cpus=2, visible_gpus=["0"]) as head:
        hog = _job(tmp_path, "other-team", head.address, gpus=1, hold=25)  # another team's job holds the GPU
        while not _said(tmp_path / "other-team.log", "placed"):
            hog.poll()  # copies the job's log so far
            time.sleep(0.5)
        trial = _job(tmp_path, "trial", head.address, gpus=1, hold=0)
        watch = _watch(trial, silence_s=6, timeout_s=20)  # the other job holds the GPU for longer than that
        outcome = _follow(watch)
        hog.cancel()
    log = (tmp_path / "trial.log").read_text()
    assert outcome.status == "complete", (outcome.reason, log)
    assert outcome.wall_s > 20  # silent for more than three watchdog periods: not a hang, and not its timeout
    assert watch.waited_s >= 12 and outcome.wall_s - watch.waited_s < 20
    assert "autorl: waiting for the cluster: a placement group of its actors needs GPU 1" in log
    assert log.index("waiting for the cluster") < log.index("placed")


@pytest.mark.slow
def test_a_trial_no_node_can_ever_hold_ends_at_once_with_what_it_asked_for(tmp_path):
    with ray_jobs.LocalRayHead(num_cpus=2, visible_gpus=["0"]) as head:
        outcome = _follow(_watch(_job(tmp_path, "trial", head.address, gpus=2, hold=0), silence_s=6))
    assert outcome.status == "config-error"
    assert outcome.reason.startswith(
        "the cluster can never place this trial: a placement group of its actors needs GPU 2"
    )
    assert outcome.wall_s < 60
    assert "autorl: the cluster can never place this trial" in (tmp_path / "trial.log").read_text()
