"""Test script: records the argv, environment and cwd it was started with, as JSON."""

import json
import os
import sys

out = os.path.join(os.environ["AUTORL_RUN_DIR"], "echo.json")
with open(out, "w") as fh:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(),
               "env": {k: v for k, v in os.environ.items() if k.startswith(("AUTORL_", "TEST_"))}}, fh)
