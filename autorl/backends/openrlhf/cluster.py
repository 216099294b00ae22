"""An OpenRLHF trial on a Ray cluster: what its job gets, and a check, before the study, that it has it.

With ``--ray-address`` a trial's job runs on the cluster's nodes, not on this machine:

- its Python is the nodes' ``python`` (the Ray workers' PATH): OpenRLHF, vLLM and DeepSpeed must be installed
  there; autorl is not needed there, it is shipped with every job (runtime_env ``py_modules``);
- its working directory is an upload of the trial's worktree (without ``.git`` and weight files); the recipe's
  local paths (model, prompts, reward file) are given to the job as absolute paths of this machine;
- what the job writes (metrics, TensorBoard, the saved model, autorl's reward wrapper copied in) is in the
  trial's run folder in this workspace, and the per-item eval runs on this machine after the job, reading the
  saved model from there.

So the nodes must see this workspace and the recipe's files at the same paths: a shared filesystem, as on most
GPU clusters. ``check`` finds out before the study: it runs ``autorl.backends.openrlhf.jobprobe`` as a job with the
trials' Python and runtime env, and turns its report into one line naming what is missing.
"""

from __future__ import annotations

import json
import shlex
import uuid
from pathlib import Path
from typing import Any

import autorl
from autorl.backends import ray_jobs
from autorl.backends.openrlhf.checks import local_files
from autorl.backends.openrlhf.jobprobe import MARK
from autorl.backends.openrlhf.vllm_share import ENV, HOOK, setup_fraction
from autorl.install import install_advice

PROBE_TIMEOUT_S = 180.0
NEEDED = ("openrlhf", "vllm", "deepspeed")


def autorl_package() -> str:
    """The folder of the autorl package this controller runs, shipped to the cluster with every job."""
    return str(Path(autorl.__file__).resolve().parent)


def shipped_with(backend, env: dict[str, str]) -> tuple[list[str] | None, str | None]:
    """The packages a trial's job ships and its workers' setup hook: autorl goes with every job on a cluster,
    and with a packed trial's job, whose workers run ``vllm_share.setup`` (its fixed vLLM KV-cache share)."""
    hook = HOOK if setup_fraction(env.get(ENV)) is not None else None
    return ([autorl_package()] if backend.ray_address or hook else None), hook


def job_paths(params, worktree: Path) -> dict[str, str]:
    """The recipe's local files as the job is given them (absolute paths of this machine); hub names and URLs
    are the job's own business and left out."""
    return local_files(params, worktree, ("pretrain", "prompt_data", "reward_func"))


def check(
    address: str, python: str, paths: dict[str, str], scratch: Path, target: str, env: dict[str, str] | None = None
) -> str | None:
    """Run the probe on the cluster; the first problem as one line naming the fix, or None."""
    scratch.mkdir(parents=True, exist_ok=True)
    token = scratch / f"token-{uuid.uuid4().hex[:12]}"
    token.write_text(token.name)
    argv = [python, "-m", "autorl.backends.openrlhf.jobprobe", "--token", str(token)]
    for name, path in paths.items():
        argv += ["--path", f"{name}={path}"]
    try:
        status, logs = ray_jobs.run_job(address, argv, scratch, PROBE_TIMEOUT_S, env, [autorl_package()])
    finally:
        token.unlink(missing_ok=True)
    return problem(parse(logs), status, logs, address, python, token.name, target)


def parse(logs: str) -> dict[str, Any] | None:
    """The probe's report from a job log, or None when it printed none."""
    line = next((x for x in reversed(logs.splitlines()) if x.startswith(MARK)), None)
    try:
        return json.loads(line[len(MARK) :]) if line else None
    except ValueError:
        return None


def problem(
    report: dict | None, status: str, logs: str, address: str, python: str, token: str, target: str
) -> str | None:
    """What stops trials from running on this cluster, first things first."""
    if report is None:
        last = next((x.strip() for x in reversed(logs.splitlines()) if x.strip()), "no output")[:200]
        return (
            f"the Ray cluster at {address} could not run a check job with `{python}` ({status}: {last}): "
            "the trials' jobs would fail the same way; fix the nodes' Python, then retry"
        )
    where = f"{report['python']} on {report['host']}"
    if report.get("token") != token:
        return (
            f"the cluster's nodes do not see this workspace ({where} could not read a file autorl wrote in it): "
            "autorl reads each trial's metrics and saved model from its run folder; put the workspace on a "
            "filesystem every node mounts at the same path"
        )
    return _packages(report, where, target) or _missing(report, where)


def _packages(report: dict, where: str, target: str) -> str | None:
    have = report["packages"]
    for name in NEEDED:
        if have.get(name) is None:
            return (
                f"{name} is not installed for the trials' Python ({where}): install it on every node "
                f"({install_advice('openrlhf')} pins the versions this project ran), then retry"
            )
    if have["openrlhf"] != target:
        return (
            f"the cluster's openrlhf is {have['openrlhf']} ({where}) but the recipe's flags are written for "
            f"{target}: set train.openrlhf_version: {have['openrlhf']}, or install openrlhf=={target} there"
        )
    return None


def _missing(report: dict, where: str) -> str | None:
    for name, seen in report["paths"].items():
        if not seen["exists"]:
            return (
                f"train.{name}: {seen['path']} is not there for the job ({where}): put it at that path on "
                "every node (or on the shared filesystem), then retry"
            )
    return None


def view(backend, spec, plan, params) -> dict[str, Any]:
    """What the trial's job (of ``params``, the trial's values) gets, in words and values: ``autorl train --dry-run
    --ray-address``."""
    shipped, hook = shipped_with(backend, plan.env)
    eval_plan = backend.eval_plan(spec)
    return {
        "ray_address": backend.ray_address or "a private Ray head on this machine, started by the study",
        "python": f"{backend.python} (the PATH of the Ray workers)" if backend.ray_address else backend.python,
        "entrypoint": shlex.join(plan.argv),
        "runtime_env": ray_jobs.runtime_env_for(plan.cwd, plan.env, shipped, hook),
        "resources": plan.resources,
        "reads": job_paths(params, Path(spec.worktree)),
        "writes": str(Path(spec.run_dir).resolve()),
        "eval": (
            f"on this machine after the job: {shlex.join(eval_plan.argv)}"
            if eval_plan
            else "none (the recipe names no probe sets)"
        ),
        "needs": _needs(backend),
    }


def _needs(backend) -> list[str]:
    if not backend.ray_address:
        return ["nothing beyond this machine: the head, the job and the eval all run here"]
    return [
        "openrlhf, vllm and deepspeed installed for the nodes' python (autorl is shipped with the job)",
        "the files under 'reads' and the workspace (run folder under 'writes') at the same paths on every node "
        "(a shared filesystem); `autorl run` and `autorl train` check this with a short job before anything else",
    ]
