"""Test script: logs TRL-named metrics as JSONL lines, like a user's own training script."""

import argparse
import json
import math
import time

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--out", required=True)
parser.add_argument("--sleep-per-step", type=float, default=0.0)
args = parser.parse_args()

with open(args.out, "w") as fh:
    for step in range(1, args.steps + 1):
        reward = 1.0 - math.exp(-args.lr * 1e4 * step)
        row = {
            "global_step": step,
            "reward": reward,
            "kl": 0.01 * step,
            "clip_ratio/region_mean": 0.0,
            "frac_reward_zero_std": 0.25,
            "completions/clipped_ratio": 0.1,
            "learning_rate": args.lr,
        }
        fh.write(json.dumps(row) + "\n")
        fh.flush()
        time.sleep(args.sleep_per_step)
    fh.write(json.dumps({"global_step": args.steps, "eval_accuracy": reward}) + "\n")
print("done", args.steps)
