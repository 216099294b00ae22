"""Test script: a GPU-less stand-in for a trainer whose Ray worker is killed from outside, for its first runs.

The first ``--die-first`` runs (counted in the ``--state`` file) print what Ray 2.55 printed on a real H200 when a
trial's vLLM engine was SIGKILLed mid-rollout (the raylet's worker-died line and the driver's ActorDiedError, nothing
naming a cause) and exit 1; later runs log a few steps and one eval line with per-item results that depend on
``--lr`` and the seed.
"""

import argparse
import json
import random
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, required=True)
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--die-first", type=int, default=1)
parser.add_argument("--state", required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()

state = Path(args.state)
runs = int(state.read_text()) if state.exists() else 0
state.write_text(str(runs + 1))
if runs < args.die_first:
    print("(PPOTrainer pid=17824) Generate samples:   0%|          | 0/32 [00:00<?, ?it/s]", flush=True)
    print("(raylet) A worker died or was killed while executing a task by an unexpected system error. To "
          "troubleshoot the problem, check the logs for the dead worker. Worker PID: 17281 Worker exit type: "
          "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. "
          "Some common causes include: (1) the process was killed by the OOM killer due to high memory usage, (2) "
          "ray stop --force was called, or (3) the worker crashed unexpectedly due to SIGSEGV or another unexpected "
          "error.", file=sys.stderr, flush=True)
    print("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.", file=sys.stderr)
    sys.exit(1)

rng = random.Random(args.seed)
p = 0.4 + min(args.lr, 1e-3) * 100
with open(args.out, "w") as fh:
    for step in range(1, 5):
        fh.write(json.dumps({"type": "step", "step": step, "reward_mean": 0.2 + 0.05 * step, "loss": 0.1,
                             "grad_norm": 0.5, "frac_zero_std_groups": 0.3}) + "\n")
    items = [int(rng.random() < p) for _ in range(200)]
    fh.write(json.dumps({"type": "eval", "step": 4, "eval/id/greedy_pass@1": sum(items) / len(items),
                         "eval/id/items": items}) + "\n")
print("done", flush=True)
