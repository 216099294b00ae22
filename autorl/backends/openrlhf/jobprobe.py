"""What a job sees where it runs: started as a Ray job's entrypoint before a study, it prints one line.

``python -m autorl.backends.openrlhf.jobprobe --path NAME=PATH ... --token FILE`` reports, as ``AUTORL_PROBE {json}``:
the Python that ran it (the one a trial's job gets), the versions of the packages a trial needs, where
``autorl`` was imported from (shipped with the job or installed there), its working directory, and for each
named path whether it exists there and what it resolves to. ``--token`` names a file the controller wrote in
its workspace: the job reads it back, so the report says whether the nodes see the controller's files.

Standard library only, and no import of torch or Ray: it must run on any node, with any Python.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from importlib import metadata

PACKAGES = ("openrlhf", "vllm", "deepspeed", "ray", "torch", "transformers")
MARK = "AUTORL_PROBE "
TOKEN_BYTES = 200


def version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def autorl_origin() -> str | None:
    try:
        import autorl  # lazy: the probe reports whether autorl can be imported where the job runs
    except ImportError:
        return None
    return os.path.dirname(os.path.abspath(autorl.__file__))


def read_token(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(TOKEN_BYTES)
    except OSError:
        return None


def report(paths: dict[str, str], token: str | None) -> dict:
    return {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "host": socket.gethostname(),
        "cwd": os.getcwd(),
        "autorl": autorl_origin(),
        "packages": {p: version(p) for p in PACKAGES},
        "paths": {
            name: {"path": p, "resolved": os.path.abspath(p), "exists": os.path.exists(p)} for name, p in paths.items()
        },
        "token": read_token(token) if token else None,
    }


def main(argv: list[str]) -> int:
    paths, token = {}, None
    words = iter(argv)
    for word in words:
        if word == "--path":
            name, _, path = next(words, "").partition("=")
            paths[name] = path
        elif word == "--token":
            token = next(words, None)
    print(MARK + json.dumps(report(paths, token)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
