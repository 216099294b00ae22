"""Test script: prints log dicts the way transformers' PrinterCallback and progress bar do."""

import argparse
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--lr", type=float, required=True)
args = parser.parse_args()

print("loading model...")
for step in range(1, args.steps + 1):
    sys.stderr.write(f"\r {step * 25}%|##   | {step}/{args.steps} [00:01<00:03]")
    sys.stderr.flush()
    loss = float("nan") if step == args.steps else 0.5 / step
    logs = {"loss": loss, "grad_norm": 1.0 / step, "learning_rate": args.lr, "reward": 0.2 * step,
            "completions/clipped_ratio": 0.0, "epoch": step / args.steps}
    print({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in logs.items()}, flush=True)
print({"eval_reward": 0.7, "eval_loss": 0.3, "epoch": 1.0}, flush=True)
print({"train_runtime": 2.5, "train_samples_per_second": 10.0, "train_loss": 0.2, "epoch": 1.0}, flush=True)
