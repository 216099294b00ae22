"""A two-node Ray cluster on one GPU host, then a study driven through it with ``--ray-address``.

A head given one card and a second Ray node (its own raylet) given another stand in for a two-node cluster, as
issue 29 asks: Ray places each trial's job and actors on a node with a free GPU, exactly as on a real cluster.
Started by ``benchmarks/openrlhf_small.sh OUTDIR nodes``; stops the node and the head when the study ends.
While the study runs, where each running job's driver and actors are (head or worker node) is read from Ray's
state API every 15 s into OUTDIR/nodes-placement.jsonl, and summed up at the end. NODES_PACK=k starts each
node with its card named k times (k logical GPUs a card), as a cluster that packs trials of gpus_per_trial 1/k must.

    python benchmarks/openrlhf_nodes.py OUTDIR WORKSPACE HEAD_GPU NODE_GPU -- AUTORL-RUN-ARGS...
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from autorl.backends.ray_jobs import LocalRayHead, LocalRayNode, wait_for_gpus


def placement(address: str) -> dict:
    """Which node (head or worker) runs each running job's driver and each of its live actors."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors, list_nodes

    role = {n.node_id: "head" if n.is_head_node else "worker" for n in list_nodes(address=address, detail=True)}
    actors: dict[str, list[str]] = {}
    for a in list_actors(address=address, filters=[("state", "=", "ALIVE")], detail=True, limit=1000):
        actors.setdefault(a.job_id, []).append(f"{a.class_name}@{role.get(a.node_id, '?')}")
    jobs = [
        {
            "submission_id": j.submission_id,
            "driver": role.get(getattr(j, "driver_node_id", None) or "", "?"),
            "actors": sorted(actors.get(j.job_id or "", [])),
        }
        for j in JobSubmissionClient(address).list_jobs()
        if str(j.status).endswith("RUNNING")
    ]
    return {"t": round(time.time(), 1), "jobs": jobs}


def watch(address: str, path: Path, stop: threading.Event) -> None:
    while not stop.wait(15.0):
        try:
            snap = placement(address)
        except Exception as exc:  # a benchmark's probe: the cluster may be busy or going down; note it, go on
            snap = {"t": round(time.time(), 1), "error": f"{type(exc).__name__}: {exc}"[:300]}
        with path.open("a") as fh:
            fh.write(json.dumps(snap) + "\n")


def summary(path: Path) -> str:
    """Per job, the nodes its driver and actors were seen on; how often jobs ran on both nodes at once."""
    snaps = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    seen: dict[str, set[str]] = {}
    both = 0
    for snap in snaps:
        nodes = set()
        for job in snap.get("jobs", []):
            where = {a.split("@")[1] for a in job["actors"]} | {job["driver"]}
            seen.setdefault(job["submission_id"], set()).update(where)
            nodes |= {a.split("@")[1] for a in job["actors"]}
        both += {"head", "worker"} <= nodes
    lines = [f"{sid}: {', '.join(sorted(where))}" for sid, where in seen.items()]
    return "\n".join([*lines, f"actors on both nodes at once in {both} of {len(snaps)} snapshots"])


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") != 4:
        print(
            "usage: python benchmarks/openrlhf_nodes.py OUTDIR WORKSPACE HEAD_GPU NODE_GPU -- AUTORL-RUN-ARGS...",
            file=sys.stderr,
        )
        return 2
    out, ws, head_gpu, node_gpu = Path(argv[0]), argv[1], argv[2], argv[3]
    run_args = argv[argv.index("--") + 1 :]
    pack = os.environ.get("NODES_PACK", "1")  # logical GPUs a card: trials of gpus_per_trial 1/pack share it
    if not pack.isdigit() or int(pack) < 1:
        print(f"NODES_PACK={pack}: give a whole number of trials a card (1, 2 or 4)", file=sys.stderr)
        return 2
    pack = int(pack)
    with LocalRayHead(visible_gpus=[head_gpu] * pack) as head:
        node = LocalRayNode(head.gcs_address, visible_gpus=[node_gpu] * pack, log_path=out / "nodes-worker.log").start()
        stop = threading.Event()
        try:
            gpus = wait_for_gpus(head.address, 2 * pack)
            print(
                f"cluster at {head.address}: {gpus:g} GPUs on two nodes (head: card {head_gpu}, worker: card "
                f"{node_gpu})",
                flush=True,
            )
            threading.Thread(
                target=watch, args=(head.address, out / "nodes-placement.jsonl", stop), daemon=True
            ).start()
            cmd = [sys.executable, "-m", "autorl.cli", "-C", ws, "run", *run_args, "--ray-address", head.address]
            rc = subprocess.call(cmd)
            print(f"study exit {rc}", flush=True)
            stop.set()
            print(summary(out / "nodes-placement.jsonl"), flush=True)
            return rc
        finally:
            stop.set()
            node.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
