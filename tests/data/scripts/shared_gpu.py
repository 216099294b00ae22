"""Test script: a GPU-less stand-in for a trainer whose vLLM engine dies at start on a shared GPU, for some seeds.

With ``--seed`` in ``--lose-seeds`` it prints vLLM 0.22's memory-profiling error (a neighbour on the card released
memory while the engine measured) and exits 1; otherwise it logs a few steps and one eval line with per-item results
that depend on ``--lr`` and the seed.
"""

import argparse
import json
import random
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, required=True)
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--lose-seeds", default="")
parser.add_argument("--out", required=True)
args = parser.parse_args()

if str(args.seed) in args.lose_seeds.split(","):
    print("(EngineCore pid=4403) ERROR [core.py:1165] EngineCore failed to start.", file=sys.stderr)
    print("AssertionError: Error in memory profiling. Initial free memory 136.56 GiB, current free memory 137.35 GiB. "
          "This happens when other processes sharing the same container release GPU memory while vLLM is profiling "
          "during initialization. To fix this, ensure consistent GPU memory allocation or isolate vLLM in its own "
          "container.", file=sys.stderr)
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
