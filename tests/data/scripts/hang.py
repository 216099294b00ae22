"""Test script: starts a child, writes both pids, then sleeps forever printing nothing."""

import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(sys.argv[1], "w") as fh:
    fh.write(f"{child.pid} {__import__('os').getpid()}\n")
while True:
    time.sleep(1)
