"""Test script: asks a reward server on a local port where nothing listens (real ECONNREFUSED)."""

import socket
import sys

port = int(sys.argv[1])
print(f"reward server at 127.0.0.1:{port}", flush=True)
socket.create_connection(("127.0.0.1", port), timeout=5)
