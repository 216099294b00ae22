"""Test script: logs scalars with torch's SummaryWriter under transformers' tag names."""

import argparse

from torch.utils.tensorboard import SummaryWriter

parser = argparse.ArgumentParser()
parser.add_argument("--logdir", required=True)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--kl-beta", type=float, required=True)
args = parser.parse_args()

writer = SummaryWriter(log_dir=args.logdir)
for step in range(1, args.steps + 1):
    writer.add_scalar("train/reward", 0.1 * step, step)
    writer.add_scalar("train/kl", args.kl_beta * step, step)
    writer.add_scalar("train/grad_norm", 1.0 / step, step)
    if step % 3 == 0:
        writer.add_scalar("eval/accuracy", 0.05 * step, step)
writer.close()
