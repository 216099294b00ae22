"""A two-node Ray cluster on one GPU host, then a study driven through it with ``--ray-address``.

A head given one card and a second Ray node (its own raylet) given another stand in for a two-node cluster, as
issue 29 asks: Ray places each trial's job and actors on a node with a free GPU, exactly as on a real cluster.
Started by ``benchmarks/openrlhf_small.sh OUTDIR nodes``; stops the node and the head when the study ends.

    python benchmarks/openrlhf_nodes.py OUTDIR WORKSPACE HEAD_GPU NODE_GPU -- AUTORL-RUN-ARGS...
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from autorl.backends.ray_jobs import LocalRayHead, LocalRayNode, wait_for_gpus


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") != 4:
        print("usage: python benchmarks/openrlhf_nodes.py OUTDIR WORKSPACE HEAD_GPU NODE_GPU -- AUTORL-RUN-ARGS...",
              file=sys.stderr)
        return 2
    out, ws, head_gpu, node_gpu = Path(argv[0]), argv[1], argv[2], argv[3]
    run_args = argv[argv.index("--") + 1:]
    with LocalRayHead(visible_gpus=[head_gpu]) as head:
        node = LocalRayNode(head.gcs_address, visible_gpus=[node_gpu], log_path=out / "nodes-worker.log").start()
        try:
            print(f"cluster at {head.address}: {wait_for_gpus(head.address, 2):g} GPUs on two nodes (head: card "
                  f"{head_gpu}, worker: card {node_gpu})", flush=True)
            cmd = [sys.executable, "-m", "autorl.cli", "-C", ws, "run", *run_args, "--ray-address", head.address]
            rc = subprocess.call(cmd)
            print(f"study exit {rc}", flush=True)
            return rc
        finally:
            node.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
