"""What a silent Ray job is waiting for, read from the cluster: the resources of its driver while the job is
PENDING, or of its pending placement groups and actors once it runs, against what the cluster's live nodes have.

On a busy cluster a trial's actors wait for GPUs other jobs hold, and print nothing while they wait: the silence
watchdog must not take that for a hang (``Watch`` asks ``RayJobHandle.waiting`` before it stops a silent run).
A demand no live node could ever hold (a bundle larger than every node, or more than the whole cluster) is not
worth waiting for: the run ends at once with that line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WAITING = "waiting for the cluster: "  # how the line of a job that waits begins (``autorl status`` reads it)
KEYS = ("GPU", "CPU")  # the resources a trial's demand is shown and weighed in (others: only when asked for)
STATE_TIMEOUT_S = 5  # each state API call: the controller follows its other trials meanwhile


@dataclass(frozen=True)
class Waiting:
    """What a job waits for: its demand, whether the cluster could ever hold it, and one line saying so."""

    demand: dict[str, float]
    feasible: bool
    line: str


def waiting(address: str, job_client: Any, submission_id: str) -> Waiting | None:
    """What the job waits for, or None when it waits for nothing the cluster lacks (or the cluster cannot say:
    then the watchdog decides as it always did)."""
    try:
        info = job_client.get_job_info(submission_id)
        status = str(getattr(info.status, "value", info.status))
        if status == "PENDING":
            bundles, what = [_driver_demand(info)], "its driver"
        elif status == "RUNNING" and info.job_id:
            bundles, what = _actor_demand(address, info.job_id)
        else:
            return None
        nodes = _node_totals(address)
    except Exception:  # the state API of a busy or restarting head: no answer is not a reason to wait
        return None
    bundles = [b for b in bundles if b]
    return assess(bundles, nodes, what) if bundles and nodes else None


def assess(bundles: list[dict[str, float]], nodes: list[dict[str, float]], what: str) -> Waiting:
    """Whether ``bundles`` (each to be held by one node) could ever be placed on ``nodes`` (their totals)."""
    demand = _total(bundles)
    cluster = _total(nodes)
    largest = max(nodes, key=lambda n: (n.get("GPU", 0), n.get("CPU", 0)))
    fits_a_node = all(any(_fits(b, n) for n in nodes) for b in bundles)
    if fits_a_node and _fits(demand, cluster):
        return Waiting(
            demand,
            True,
            f"{WAITING}{what} needs {_show(demand)}, which other jobs hold "
            f"(the live nodes have {_show(cluster, demand)} in all)",
        )
    return Waiting(
        demand,
        False,
        f"the cluster can never place this trial: {what} needs {_show(demand)}, but its "
        f"live nodes have {_show(cluster, demand)} in all, the largest "
        f"{_show(largest, demand)}: ask for less (the recipe's GPUs) or add nodes",
    )


def _driver_demand(info: Any) -> dict[str, float]:
    demand = {
        "GPU": info.entrypoint_num_gpus or 0,
        "CPU": info.entrypoint_num_cpus or 0,
        **(info.entrypoint_resources or {}),
    }
    return {k: float(v) for k, v in demand.items() if v}


def _actor_demand(address: str, job_hex: str) -> tuple[list[dict[str, float]], str]:
    """The bundles of the job's pending placement groups and the demand of its pending actors outside them."""
    # lazy: Ray is heavy, and only a Ray job's wait needs it
    from ray.util.state import list_actors, list_placement_groups

    groups = list_placement_groups(
        address=address,
        detail=True,
        raise_on_missing_output=False,
        timeout=STATE_TIMEOUT_S,
        filters=[("creator_job_id", "=", job_hex), ("state", "=", "PENDING")],
    )
    bundles = [_plain(b.get("unit_resources") or {}) for g in groups for b in (g.bundles or [])]
    actors = list_actors(
        address=address,
        detail=True,
        raise_on_missing_output=False,
        timeout=STATE_TIMEOUT_S,
        filters=[("job_id", "=", job_hex), ("state", "=", "PENDING_CREATION")],
    )
    loose = [
        _plain(a.required_resources or {})
        for a in actors
        if not any("_group_" in k for k in (a.required_resources or {}))
    ]
    what = "a placement group of its actors" if groups else "its actors"
    return bundles + loose, what


def _node_totals(address: str) -> list[dict[str, float]]:
    # lazy: Ray is heavy, and only a Ray job's wait needs it
    from ray.util.state import list_nodes

    nodes = list_nodes(address=address, detail=True, timeout=STATE_TIMEOUT_S)
    return [_plain(n.resources_total or {}) for n in nodes if str(n.state) in ("ALIVE", "NodeStatus.ALIVE")]


def _plain(resources: dict) -> dict[str, float]:
    """Resource amounts by name, without Ray's per-node and per-group bookkeeping keys."""
    return {
        k: float(v)
        for k, v in resources.items()
        if not k.startswith("node:") and "_group_" not in k and k not in ("memory", "object_store_memory")
    }


def _total(parts: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _fits(need: dict[str, float], have: dict[str, float]) -> bool:
    return all(have.get(k, 0.0) + 1e-9 >= v for k, v in need.items() if v > 0)


def _show(resources: dict[str, float], asked: dict[str, float] | None = None) -> str:
    keys = [k for k in KEYS if k in resources or k in (asked or {})] + sorted(
        k for k in (asked or resources) if k not in KEYS
    )
    return ", ".join(f"{k} {resources.get(k, 0.0):g}" for k in keys) or "nothing"
