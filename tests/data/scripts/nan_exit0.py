"""Test script: a trainer whose loss turns NaN above an lr, yet which exits 0 with an eval line."""

import argparse
import json
import math

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--out", required=True)
args = parser.parse_args()

with open(args.out, "w") as fh:
    for step in range(1, args.steps + 1):
        diverged = args.lr > 1e-2 and step >= 3
        loss = math.nan if diverged else 0.1 / step
        print(f"step {step} loss={loss}", flush=True)
        fh.write(json.dumps({"type": "step", "step": step, "reward_mean": 0.3, "loss": loss, "grad_norm": 0.4}) + "\n")
    items = [int(i % 3 == 0) for i in range(30)]
    fh.write(json.dumps({"type": "eval", "step": args.steps, "eval/id/greedy_pass@1": sum(items) / len(items),
                         "eval/id/items": items}) + "\n")
print("finished without error", flush=True)
