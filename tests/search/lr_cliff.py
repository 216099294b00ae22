"""Test script: a trainer whose quality depends on its learning rate, with a cliff, and on its group size.

Its 100 eval items are the same in every run, each with a fixed difficulty: an item is solved when its difficulty
is below the run's quality q, and each answer flips with probability 0.05, drawn afresh per run (seed and values),
so two runs of one quality differ as two seeds of one recipe do. q is 0.30 below lr 1e-5, 0.55 from there up to the
cliff at lr 1e-3, and 0.05 at and above it (the run collapses); a group of 4 or more completions (``--gens``) adds
0.30 below the cliff. It logs four steps with an eval at steps 2 and 4, and waits ``--sleep`` seconds after the
first eval, so that a watcher can stop it there.
"""

import argparse
import json
import random
import time

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--gens", type=int, default=2)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--sleep", type=float, default=1.0)
parser.add_argument("--out", required=True)
args = parser.parse_args()

if args.lr >= 1e-3:
    quality = 0.05
else:
    quality = (0.30 if args.lr < 1e-5 else 0.55) + (0.30 if args.gens >= 4 else 0.0)
difficulty = random.Random(0).sample(range(1000), 100)  # the same items in every run
run = random.Random(f"{args.seed} {args.lr} {args.gens}")
with open(args.out, "w") as fh:
    for step in range(1, 5):
        reward = quality * (0.9 + 0.05 * step) + run.uniform(-0.01, 0.01)
        fh.write(
            json.dumps({"type": "step", "step": step, "reward_mean": reward, "loss": 0.1, "grad_norm": 0.5}) + "\n"
        )
        if step in (2, 4):
            items = [int((d / 1000 < quality) != (run.random() < 0.05)) for d in difficulty]
            fh.write(
                json.dumps(
                    {"type": "eval", "step": step, "eval/id/greedy_pass@1": sum(items) / 100, "eval/id/items": items}
                )
                + "\n"
            )
        fh.flush()
        if step == 2:
            time.sleep(args.sleep)
print("done", flush=True)
