"""Test script: a trainer whose argument parser rejects a value (a real argparse error, exit 2)."""

import argparse

parser = argparse.ArgumentParser(prog="train.py")
parser.add_argument("--lr", type=float, required=True)
args = parser.parse_args()
print(f"lr={args.lr}")
