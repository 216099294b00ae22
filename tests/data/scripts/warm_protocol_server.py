"""A stand-in for autorl.backends.openrlhf.warm_server on a CPU box (the real one needs vLLM, DeepSpeed and a GPU):
it speaks the same file protocol and prints the same marker lines, so the controller's side (warm.py) runs
against a real Ray job. A trial whose env has STANDIN_CODE exits with that code; STANDIN_SLEEP is its training time;
STANDIN_THEN_WAIT makes the server wait that many seconds after the trial before it reads its next request.

    python warm_protocol_server.py POOL_DIR
"""

import json
import os
import sys
import time
from pathlib import Path

pool = Path(sys.argv[1])
for sub in ("inbox", "done", "stop"):
    (pool / sub).mkdir(parents=True, exist_ok=True)
print("Connected to Ray cluster (stand-in)", flush=True)
key = None
while not (pool / "retire").exists():
    found = sorted((pool / "inbox").glob("*.json"))
    if not found:
        time.sleep(0.1)
        continue
    request = json.loads(found[0].read_text())
    found[0].unlink()
    attempt, env = request["attempt"], request["env"]
    print(f"AUTORL-WARM {attempt} begin index={request['index']}", flush=True)
    code = int(env.get("STANDIN_CODE", "0"))
    if key is not None and env.get("STANDIN_KEY", "") != key:
        code = 75
    key = env.get("STANDIN_KEY", "") if key is None else key
    if code != 75:
        print(f"AUTORL-WARM {attempt} vllm", flush=True)
        print(f"AUTORL-WARM {attempt} actor", flush=True)
        print(f"AUTORL-WARM {attempt} fit", flush=True)
        deadline = time.time() + float(env.get("STANDIN_SLEEP", "0.5"))
        while time.time() < deadline and not (pool / "stop" / attempt).exists():
            time.sleep(0.05)
        if (pool / "stop" / attempt).exists():
            code = -15
        print(f"trial {attempt} pid {os.getpid()} trained", flush=True)
    tmp = pool / "done" / f"{attempt}.json.tmp"
    tmp.write_text(json.dumps({"code": code, "reason": "stand-in", "index": request["index"], "seconds": {}}))
    os.replace(tmp, pool / "done" / f"{attempt}.json")
    print(f"AUTORL-WARM {attempt} end code={code}", flush=True)
    if code not in (0, 75):
        break
    time.sleep(float(env.get("STANDIN_THEN_WAIT", "0")))
