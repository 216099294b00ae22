"""Test script: a trainer whose eval items are each solved with probability ``--quality``, drawn afresh per ``--seed``.

It logs ``--steps`` steps with an eval (100 items, per-item results) at the middle step and at the last one. After
the middle eval it waits ``--sleep`` seconds, so that a watcher can stop it there.
"""

import argparse
import json
import random
import time

parser = argparse.ArgumentParser()
parser.add_argument("--quality", type=float, required=True)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--sleep", type=float, default=2.0)
parser.add_argument("--out", required=True)
args = parser.parse_args()

rng = random.Random(args.seed)
middle = args.steps // 2
with open(args.out, "w") as fh:
    for step in range(1, args.steps + 1):
        fh.write(json.dumps({"type": "step", "step": step, "reward_mean": args.quality, "loss": 0.1,
                             "grad_norm": 0.5}) + "\n")
        if step in (middle, args.steps):
            items = [int(rng.random() < args.quality) for _ in range(100)]
            fh.write(json.dumps({"type": "eval", "step": step, "eval/id/greedy_pass@1": sum(items) / len(items),
                                 "eval/id/items": items}) + "\n")
        fh.flush()
        if step == middle:
            time.sleep(args.sleep)
print("done", flush=True)
