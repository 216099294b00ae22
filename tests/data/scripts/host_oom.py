"""Test script: allocates past an address-space limit it sets on itself (a real MemoryError)."""

import resource

limit = 512 * 2**20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
print("building the replay buffer", flush=True)
buffers = [bytearray(64 * 2**20) for _ in range(64)]
