"""Test script: saves Hugging Face style checkpoints whose trainer_state.json grows."""

import argparse
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--output-dir", required=True)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--save-every", type=int, default=2)
parser.add_argument("--num-generations", type=int, required=True)
args = parser.parse_args()

history = []
for step in range(1, args.steps + 1):
    history.append({"loss": 0.5 / step, "reward": 0.1 * step, "reward_std": 0.2, "epoch": step / args.steps,
                    "num_generations_seen": args.num_generations, "step": step})
    if step % 3 == 0:
        history.append({"eval_reward": 0.1 * step, "eval_loss": 0.4, "epoch": step / args.steps, "step": step})
    if step == args.steps:
        history.append({"train_runtime": 1.5, "train_loss": 0.3, "epoch": 1.0, "step": step})
    if step % args.save_every == 0 or step == args.steps:
        ckpt = os.path.join(args.output_dir, f"checkpoint-{step}")
        os.makedirs(ckpt, exist_ok=True)
        with open(os.path.join(ckpt, "trainer_state.json"), "w") as fh:
            json.dump({"global_step": step, "log_history": history}, fh)
