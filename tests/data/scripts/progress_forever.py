"""Test script: a healthy run that prints timestamped steps until something kills it."""

import time

step = 0
while True:
    step += 1
    print(time.strftime("%Y-%m-%d %H:%M:%S,000") + f" INFO step {step}: loss 0.{step % 10}", flush=True)
    time.sleep(0.1)
