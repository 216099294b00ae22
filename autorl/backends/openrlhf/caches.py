"""Where the jobs' compile caches live on a local Ray head: one folder per user and Python on this machine.

A trial's job fills three caches the first time it runs: DeepSpeed builds its ops (``TORCH_EXTENSIONS_DIR``),
Triton compiles vLLM's kernels (``TRITON_CACHE_DIR``) and vLLM inspects the model's architecture in a subprocess
(``VLLM_CACHE_ROOT``). On an H200 with the small recipe that first run started 78 s slower than the next
(204 s against 124-128 s to the first step): about 40 s in the actor's DeepSpeed set-up, 30 s in vLLM's model
inspection and 9 s in its warm-up's kernel compiles. Kept in the workspace, every new study paid it again in each
trial of its first wave; kept here, only the machine's first study should (not yet measured on a GPU).

``AUTORL_COMPILE_CACHE`` names the folder; else ``$XDG_CACHE_HOME/autorl/openrlhf``, else
``~/.cache/autorl/openrlhf``. Inside it, one folder per job Python (a hash of its path), so two environments
never share builds. Where it cannot be made, the study's own cache folder is used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

CACHES = {"TORCH_EXTENSIONS_DIR": "torch_extensions", "TRITON_CACHE_DIR": "triton", "VLLM_CACHE_ROOT": "vllm"}
STALE_LOCK_S = 1800  # a DeepSpeed op builds in about a minute; a lock this old was left by a killed build


def root() -> Path:
    """The folder every study of this user on this machine shares (see the module's docstring)."""
    named = os.environ.get("AUTORL_COMPILE_CACHE")
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "autorl" / "openrlhf"


def for_python(python: str, fallback: Path) -> Path:
    """The cache folder for jobs run by ``python``, made if needed, with stale build locks cleared; ``fallback``
    (the study's own folder) where the shared one cannot be made."""
    key = hashlib.sha256(os.path.abspath(shutil.which(python) or python).encode()).hexdigest()[:12]
    folder = root() / key
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        folder = fallback
    clear_stale_locks(folder / CACHES["TORCH_EXTENSIONS_DIR"])
    return folder


def clear_stale_locks(extensions: Path, older_than_s: float = STALE_LOCK_S) -> None:
    """Remove the ``lock`` files torch leaves in an op's build folder when its build is killed: every later job
    would wait on them for ever. A lock younger than ``older_than_s`` may be a build in progress and stays."""
    for lock in extensions.glob("*/lock"):
        try:
            if time.time() - lock.stat().st_mtime > older_than_s:
                lock.unlink()
        except OSError:
            continue
