"""Test script: saves "checkpoints" into DIR until the volume is full, then dies of the real ENOSPC.

Only ever point it at a small scratch volume (a tmpfs of a few hundred KiB): it writes until
the volume refuses.
"""

import os
import sys

target = sys.argv[1]
print(f"saving checkpoints to {target}", flush=True)
chunk = b"\0" * 65536
for step in range(1, 100_000):
    print(f"step {step}: saving checkpoint-{step}", flush=True)
    with open(os.path.join(target, f"checkpoint-{step}.bin"), "wb") as fh:
        fh.write(chunk)
        fh.flush()
        os.fsync(fh.fileno())
