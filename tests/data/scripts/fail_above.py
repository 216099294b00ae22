"""Test script: a trainer that works up to --limit and fails for real above it, in the way --how says.

--how network  connects to a local port where nothing listens (ECONNREFUSED);
--how disk     writes checkpoints into --ckpt-dir until its volume is full (ENOSPC; point it at a
               small tmpfs only);
--how user     a bug in the run's own code (IndexError).
With --fail-first MARKER it fails that way on its first run only, whatever the value: the first run
creates MARKER, and a run that finds it works (a transient failure, such as a reward server that was
not up yet).
Within the limit it logs a few steps and one eval line (with per-item results), like fake_oom.py.
"""

import argparse
import json
import os
import socket


def network():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"asking the reward server at 127.0.0.1:{port}", flush=True)
    socket.create_connection(("127.0.0.1", port), timeout=5)


def disk(ckpt_dir):
    for step in range(1, 100_000):
        print(f"step {step}: saving {ckpt_dir}/checkpoint-{step}.bin", flush=True)
        with open(os.path.join(ckpt_dir, f"checkpoint-{step}.bin"), "wb") as fh:
            fh.write(b"\0" * 65536)
            fh.flush()
            os.fsync(fh.fileno())


def user():
    batches = [[1, 2], [3, 4]]
    return batches[7]


parser = argparse.ArgumentParser()
parser.add_argument("--value", type=float, required=True)
parser.add_argument("--limit", type=float, default=1.0)
parser.add_argument("--how", choices=["network", "disk", "user"], required=True)
parser.add_argument("--ckpt-dir", default=".")
parser.add_argument("--out", required=True)
parser.add_argument("--fail-first", default=None)
args = parser.parse_args()

print(f"value={args.value}: starting", flush=True)
first = args.fail_first is not None and not os.path.exists(args.fail_first)
if first:
    open(args.fail_first, "w").close()
if args.value > args.limit or first:
    {"network": network, "disk": lambda: disk(args.ckpt_dir), "user": user}[args.how]()
with open(args.out, "w") as fh:
    for step in range(1, 5):
        fh.write(json.dumps({"type": "step", "step": step, "reward_mean": 0.2 + 0.05 * step, "loss": 0.1,
                             "grad_norm": 0.5, "frac_zero_std_groups": 0.3}) + "\n")
    items = [int(i % 3 == 0) for i in range(20)]
    fh.write(json.dumps({"type": "eval", "step": 4, "eval/id/greedy_pass@1": sum(items) / len(items),
                         "eval/id/items": items}) + "\n")
print("done", flush=True)
