"""Where parallel trials run: disjoint CPU sets / GPUs locally, or Ray jobs.

``--parallel N`` gives N slots. Without ``--ray-address`` each slot is a local
process pinned to its own share of this machine's CPUs (and its own GPU, via
``CUDA_VISIBLE_DEVICES``, when GPUs are visible). With ``--ray-address`` every
trial is a Ray job asking for the recipe's ``cpus_per_trial`` / ``gpus_per_trial``;
``local`` starts a private head for the study, ``auto`` uses ``$RAY_ADDRESS`` or
the default dashboard address of a running cluster.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from autorl.backends.base import Backend, LaunchPlan, RunHandle, gpu_count
from autorl.backends.ray_jobs import PrivateHead, client, resolve_address, submit
from autorl.backends.readers import make_reader
from autorl.metrics import JsonlTail
from autorl.recipe import Recipe


class Slots:
    """Assigns resources to a slot's plan and starts it."""

    def __init__(self, n: int, ray_address: str | None, gpus: int | None = None):
        self.n = n
        self._requested = ray_address
        self.address: str | None = resolve_address(ray_address)
        self._head = PrivateHead()  # used only when no address was given
        self.cpu_sets = _split(sorted(os.sched_getaffinity(0)), n) if n > 1 else [None]
        self.gpus = (gpu_count() if gpus is None else gpus) if n > 1 else 0
        self.held: dict[int, float] = {}  # slot -> GPUs its running trial occupies

    def fits(self, need: float) -> bool:
        """Whether a trial occupying ``need`` GPUs of this host can start now. Always on a cluster (Ray places it),
        without GPUs, and when nothing runs (a trial larger than the host runs alone; preflight says it does not
        fit)."""
        if need <= 0 or self._requested or not self.gpus or not self.held:
            return True
        return sum(self.held.values()) + need <= self.gpus + 1e-9

    def hold(self, slot: int, need: float) -> None:
        self.held[slot] = need

    def release(self, slot: int) -> None:
        self.held.pop(slot, None)

    def assign(self, plan: LaunchPlan, slot: int, recipe: Recipe, on_ray: bool = False) -> LaunchPlan:
        """The plan with this slot's CPUs/GPU (local) or resources (Ray). A backend that submits Ray jobs itself
        (``on_ray``) is never pinned: Ray gives its actors their GPUs, and a job whose visible devices disagree
        with Ray's assignment dies in Ray's accelerator mapping (an IndexError seen on a 2-GPU host). Nor does its
        driver take the trial's GPUs on a cluster: its actors ask for their own, and a driver holding
        ``gpus_per_trial`` of a node's GPU left them none there (every trial of a two-node study hung)."""
        update: dict[str, Any] = {}
        if self._requested and not on_ray:
            update["resources"] = {
                "entrypoint_num_cpus": recipe.cpus_per_trial,
                "entrypoint_num_gpus": recipe.gpus_per_trial,
            }
        elif self.n > 1 and not on_ray:
            update["cpus"] = self.cpu_sets[slot % len(self.cpu_sets)]
            if self.gpus:
                update["env"] = {**plan.env, "CUDA_VISIBLE_DEVICES": str(slot % self.gpus)}
        return plan.model_copy(update=update) if update else plan

    def start(self, backend: Backend, plan: LaunchPlan) -> RunHandle:
        """Start on the backend itself, or as a Ray job when a Ray address was given."""
        if not self._requested or backend.runs_on_ray:
            return backend.start(plan)
        reader = _reader(plan)
        return submit(
            self._ensure_address(),
            plan.argv,
            working_dir=plan.cwd,
            log_path=plan.log_path,
            env=plan.env,
            entrypoint_num_cpus=plan.resources.get("entrypoint_num_cpus", 1),
            entrypoint_num_gpus=plan.resources.get("entrypoint_num_gpus", 0),
            reader=reader,
            on_exit=reader,
        )

    def _ensure_address(self) -> str:
        """The cluster's address; the study's private head is started on first use and again if it died."""
        address = resolve_address(self._requested)
        if address is None:
            self.address = address = self._head.address(num_cpus=max(self.n, len(os.sched_getaffinity(0))))
        return self.address or address

    def close(self) -> None:
        self._head.close()


def _split(cpus: list[int], n: int) -> list[list[int]]:
    """n disjoint, near-equal CPU sets (CPUs are shared round-robin if n > len(cpus))."""
    if n >= len(cpus):
        return [[cpus[i % len(cpus)]] for i in range(n)]
    size = len(cpus) // n
    return [cpus[i * size : (i + 1) * size] for i in range(n)]


def _reader(plan: LaunchPlan) -> Callable[[], list[dict[str, Any]]]:
    if plan.metrics_format == "jsonl" and not plan.metric_map:
        return JsonlTail(plan.metrics_path).poll
    return make_reader(plan.metrics_format, plan.metrics_path, plan.metric_map)


def stop_job(address: str, job_id: str) -> None:
    """Stop a Ray job left running by a killed controller (best effort)."""
    try:
        client(address).stop_job(job_id)
    except Exception:  # the cluster may be gone with the controller: nothing left to stop
        pass
