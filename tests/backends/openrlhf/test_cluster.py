"""An OpenRLHF trial on a Ray cluster: what its job gets (`autorl train --dry-run --ray-address`), and the short
job that checks, before anything trains, that the cluster's Python, packages and files are there.

The cluster is a real local Ray head; its jobs are told to run a Python that has neither autorl nor Ray
installed, so the check proves autorl travels with the job."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from autorl.backends.openrlhf import cluster
from autorl.data import shipped
from tests.conftest import run_cli

SMALL = "/tmp/autorl-openrlhf-small"
BARE_PYTHON = shutil.which("python3", path="/usr/bin") or ""


def _bare_python_lacks_autorl() -> bool:
    import subprocess

    if not BARE_PYTHON:
        return False
    r = subprocess.run([BARE_PYTHON, "-c", "import autorl"], cwd="/", capture_output=True)
    return r.returncode != 0


@pytest.fixture
def ws(tmp_path) -> Path:
    """A workspace with the small recipe pointing at real files (a model folder, prompts, probes)."""
    root = tmp_path / "ws"
    assert run_cli("init", str(root)).returncode == 0
    data = tmp_path / "small"
    (data / "model").mkdir(parents=True)
    (data / "model" / "config.json").write_text("{}")
    for name in ("prompts", "probe_id", "probe_ood"):
        (data / f"{name}.jsonl").write_text(json.dumps({"input": "100+200=", "label": "300"}) + "\n")
    text = Path(shipped("recipes/openrlhf-small.yaml")).read_text().replace(SMALL, str(data))
    (root / "recipes" / "small.yaml").write_text(text)
    return root


def _dry(ws: Path, *extra: str):
    return run_cli(
        "-C", str(ws), "train", "recipes/small.yaml", "--set", "openrlhf_version=0.10.4", "--dry-run", *extra
    )


def test_dry_run_on_a_cluster_shows_what_the_job_gets(ws):
    r = _dry(ws, "--ray-address", "head.example:8265", "--json")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)["job"]
    assert job["ray_address"] == "http://head.example:8265"
    assert job["python"].startswith("python ")  # the nodes' own, not this machine's interpreter
    assert job["runtime_env"]["py_modules"] == [cluster.autorl_package()]
    assert job["runtime_env"]["working_dir"] == str(ws)
    assert job["reads"]["pretrain"] == str(ws.parent / "small" / "model")
    run_dir = job["writes"]
    assert f"--reward.remote_url {run_dir}/reward_func.py" in job["entrypoint"]  # the wrapper, copied there
    assert job["eval"].startswith("on this machine after the job:") and f"{run_dir}/model" in job["eval"]
    assert any("shared filesystem" in need for need in job["needs"])
    assert not (ws / ".autorl" / "train").exists()  # a dry run writes nothing


def test_dry_run_on_the_local_head_says_everything_runs_here(ws):
    r = _dry(ws)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "job:\n  ray_address: a private Ray head on this machine" in text
    assert f"  python: {sys.executable}" in text
    assert "py_modules" not in text  # the local head imports the installed autorl
    assert "reward_func.py" in text and "autorl/backends/openrlhf/reward_func.py" in text


def test_dry_run_of_a_packed_trial_shows_its_workers_hook_and_kv_share(ws):
    """gpus_per_trial 0.25: the job ships autorl and names the hook that fixes its vLLM engine's KV-cache share
    (half its 0.15 share of the card); a whole-GPU trial gets neither."""
    from autorl.backends.openrlhf import vllm_share

    r = _dry(ws, "--set", "gpus_per_trial=0.25", "--json")
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)["job"]["runtime_env"]
    assert env["worker_process_setup_hook"] == vllm_share.HOOK == "autorl.backends.openrlhf.vllm_share.setup"
    assert env["env_vars"][vllm_share.ENV] == "0.0750" and env["py_modules"] == [cluster.autorl_package()]
    whole = json.loads(_dry(ws, "--json").stdout)["job"]["runtime_env"]
    assert "worker_process_setup_hook" not in whole and vllm_share.ENV not in whole["env_vars"]


def test_relative_model_paths_reach_the_job_absolute(ws):
    """A job's working directory is an upload without weight files: a relative model folder is given by its path here."""
    text = (ws / "recipes" / "small.yaml").read_text()
    shutil.copytree(ws.parent / "small", ws / "data")
    (ws / "recipes" / "small.yaml").write_text(text.replace(str(ws.parent / "small"), "data"))
    r = _dry(ws, "--json")
    assert r.returncode == 0, r.stderr
    argv = json.loads(r.stdout)["argv"]
    assert argv[argv.index("--actor.model_name_or_path") + 1] == str(ws / "data" / "model")
    assert argv[argv.index("--data.prompt_dataset") + 1] == str(ws / "data" / "prompts.jsonl")


def test_train_sends_only_ray_backends_to_a_cluster(ws):
    r = run_cli("-C", str(ws), "train", "recipes/default.yaml", "--ray-address", "local", "--dry-run")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "autorl run --ray-address" in r.stderr


def test_a_missing_file_or_a_workspace_the_nodes_cannot_see_is_one_line():
    report = {
        "python": "/opt/py/bin/python",
        "host": "node-3",
        "token": "token-abc",
        "packages": {"openrlhf": "0.10.4", "vllm": "0.22.1", "deepspeed": "0.19.1"},
        "paths": {"pretrain": {"path": "/models/m", "resolved": "/models/m", "exists": False}},
    }
    line = cluster.problem(report, "SUCCEEDED", "", "http://h:8265", "python", "token-abc", "0.10.4")
    assert line.startswith("train.pretrain: /models/m is not there for the job (/opt/py/bin/python on node-3)")
    report["token"] = None
    assert "do not see this workspace" in cluster.problem(
        report, "SUCCEEDED", "", "http://h", "python", "token-abc", "0.10.4"
    )
    report["token"], report["packages"]["openrlhf"] = "token-abc", "0.9.3"
    assert "set train.openrlhf_version: 0.9.3" in cluster.problem(
        report, "SUCCEEDED", "", "h", "python", "token-abc", "0.10.4"
    )


@pytest.mark.slow
@pytest.mark.skipif(not _bare_python_lacks_autorl(), reason="needs a Python without autorl installed")
def test_the_check_job_runs_on_a_real_head_with_autorl_shipped(tmp_path):
    from autorl.backends.ray_jobs import LocalRayHead

    present = tmp_path / "prompts.jsonl"
    present.write_text("{}\n")
    with LocalRayHead(num_cpus=2, num_gpus=0, object_store_bytes=80 * 1024 * 1024) as head:
        from autorl.backends import ray_jobs

        token = tmp_path / "token"
        token.write_text("token")
        argv = [
            BARE_PYTHON,
            "-m",
            "autorl.backends.openrlhf.jobprobe",
            "--token",
            str(token),
            "--path",
            f"prompt_data={present}",
            "--path",
            f"pretrain={tmp_path / 'nope'}",
        ]
        status, logs = ray_jobs.run_job(head.address, argv, tmp_path, 120, None, [cluster.autorl_package()])
        report = cluster.parse(logs)
        assert status == "SUCCEEDED" and report is not None, logs[-500:]
        assert report["python"] == BARE_PYTHON and "py_modules_files" in report["autorl"]  # shipped, not installed
        assert report["token"] == "token"  # one host: the nodes see this workspace
        assert report["paths"]["prompt_data"]["exists"] and not report["paths"]["pretrain"]["exists"]
        line = cluster.check(head.address, BARE_PYTHON, {"prompt_data": str(present)}, tmp_path / "s", "0.10.4")
        assert line.startswith(f"openrlhf is not installed for the trials' Python ({BARE_PYTHON} on ")
        assert not list((tmp_path / "s").iterdir())  # the token is removed


@pytest.mark.slow
def test_train_on_a_cluster_without_openrlhf_stops_before_any_training_job(ws):
    """One line, exit 2; the head saw the check job and no train_ppo_ray job."""
    from autorl.backends.ray_jobs import PROBE_PREFIX, LocalRayHead, client

    with LocalRayHead(num_cpus=2, num_gpus=0, object_store_bytes=80 * 1024 * 1024) as head:
        r = run_cli(
            "-C",
            str(ws),
            "train",
            "recipes/small.yaml",
            "--set",
            "openrlhf_version=0.10.4",
            "--ray-address",
            head.address,
        )
        jobs = [j for j in client(head.address).list_jobs() if not j.submission_id.startswith(PROBE_PREFIX)]
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "openrlhf is not installed for the trials' Python" in r.stderr
    assert [("autorl.backends.openrlhf.jobprobe" in j.entrypoint) for j in jobs] == [True]
    assert not (ws / ".autorl" / "train").exists()
