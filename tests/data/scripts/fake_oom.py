"""Test script: a GPU-less stand-in for a trainer that runs out of CUDA memory above a micro-batch size.

With ``--micro-batch`` above ``--limit`` it prints PyTorch's CUDA OOM traceback text
and exits 1; otherwise it logs a few steps and one eval line (with per-item results),
after ``--sleep`` seconds of "training".
"""

import argparse
import json
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--micro-batch", type=int, required=True)
parser.add_argument("--limit", type=int, default=4)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--out", required=True)
parser.add_argument("--sleep", type=float, default=0.0)
args = parser.parse_args()

print(f"micro_batch={args.micro_batch}: building the model", flush=True)
if args.micro_batch > args.limit:
    gib = 0.5 * args.micro_batch
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "train.py", line 88, in training_step', file=sys.stderr)
    print("    logits = model(input_ids).logits", file=sys.stderr)
    print(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {gib:.2f} GiB. GPU 0 has a total "
          "capacity of 79.11 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has "
          "78.08 GiB memory in use.", file=sys.stderr)
    sys.exit(1)

time.sleep(args.sleep)
with open(args.out, "w") as fh:
    for step in range(1, args.steps + 1):
        fh.write(json.dumps({"type": "step", "step": step, "reward_mean": 0.2 + 0.05 * step, "loss": 0.1,
                             "grad_norm": 0.5, "frac_zero_std_groups": 0.3}) + "\n")
    items = [int(i % (args.micro_batch + 1) == 0) for i in range(20)]
    fh.write(json.dumps({"type": "eval", "step": args.steps, "eval/id/greedy_pass@1": sum(items) / len(items),
                         "eval/id/items": items}) + "\n")
print("done", flush=True)
