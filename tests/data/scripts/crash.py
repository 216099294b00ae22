"""Test script: logs one step, then dies with a real Python exception."""

import json
import sys


def load_batch(index):
    data = [[1, 2], [3, 4]]
    return data[index]


with open(sys.argv[1], "w") as fh:
    fh.write(json.dumps({"step": 1, "reward": 0.5}) + "\n")
print("starting step 2", flush=True)
load_batch(7)
