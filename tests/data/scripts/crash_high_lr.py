"""A training script stand-in: crashes with the same CUDA error whenever lr > 1e-2, else logs an eval."""
import json
import random
import sys

lr, seed, out = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if lr > 1e-2:
    print("Traceback (most recent call last):\n  File \"train.py\", line 88, in step\n    loss.backward()")
    print("RuntimeError: CUDA error: an illegal memory access was encountered")
    sys.exit(1)
rng = random.Random(seed)
items = [int(rng.random() < 0.5) for _ in range(100)]
with open(out, "w") as fh:
    fh.write(json.dumps({"type": "step", "step": 1, "reward_mean": 0.5}) + "\n")
    fh.write(json.dumps({"type": "eval", "step": 1, "eval/id/greedy_pass@1": sum(items) / 100, "eval/id/items": items}) + "\n")
