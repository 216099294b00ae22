"""The step-0 eval, measured once per base model and eval setting, and reused by every trial that starts there.

Every trial of a study starts from the same base weights and evaluates them on the same items before its first
step; on one H200 with SmolLM2-135M-Instruct that eval read the same 0.246 / 0.286 in all 49 trials of two studies,
each paying for 1,000 greedy generations again. The first run that needs it (the backend's prepare run, before
any trial) measures it and writes it under the workspace's cache folder; later runs read it back and say so in
their log and in the record (``base_eval_cache``: its key).

The key hashes every engine setting except those that act only once training starts (the learning rate, the
clip, the group size...), so a setting added later is in the key until it is listed here; plus the model folder's
files (name, size, modification time), the eval files' contents, the device, the torch version and the source of
the modules that generate and judge. Sampling pass@k at eval depends on the run's seed, which then joins the key.
Written to a temporary file and moved into place (``workspace.write_atomically``); a lock makes a concurrent
run wait and reuse it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from autorl.workspace import write_atomically

# Settings that cannot change the step-0 eval: they act from the first training step on.
TRAIN_ONLY = frozenset(
    {
        "lr",
        "eps_clip",
        "eps_clip_high",
        "kl_coef",
        "kl_estimator",
        "gens",
        "batch_prompts",
        "temperature",
        "max_grad_norm",
        "warmup_steps",
        "steps",
        "ppo_epochs",
        "loss_type",
        "scale_rewards",
        "entropy_coef",
        "micro_batch",
        "eval_every",
        "save_best",
        "nan_check",
        "seed",
    }
)
HERE = Path(__file__).resolve().parent
# what generates, reads and judges the eval (read as files: this module imports no torch)
SOURCES = tuple(HERE / f"{name}.py" for name in ("model", "peritem", "policy_eval", "reward", "task"))
MAX_FOLDER_FILES = 10_000  # a model folder with more entries is not keyed (and not cached): bounded work


def eval_key(config: Any, device_type: str) -> str | None:
    """The cache key of ``config``'s step-0 eval on ``device_type``; None when it cannot be keyed safely."""
    settings = {k: v for k, v in config.model_dump().items() if k not in TRAIN_ONLY}
    if config.eval_k:
        settings["seed"] = config.seed  # sampling pass@k draws from the run's generator
    parts: dict[str, Any] = {"settings": settings, "device": device_type, "torch": _version("torch")}
    folder = Path(config.model)
    if not config.model.startswith("builtin:"):
        files = _folder_files(folder)
        if files is None:
            return None
        parts["model"] = [str(folder.resolve()), files]
    parts["evals"] = [_digest(Path(p)) for p in (config.eval_id, config.eval_ood) if p]
    parts["source"] = [_digest(p) for p in SOURCES]
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _folder_files(folder: Path) -> list[list[Any]] | None:
    """Name, size and modification time of each file of a model folder (a single file: of that file)."""
    if folder.is_file():
        st = folder.stat()
        return [[folder.name, st.st_size, st.st_mtime_ns]]
    out = []
    for n, p in enumerate(sorted(folder.rglob("*"))):
        if n >= MAX_FOLDER_FILES:
            return None
        if p.is_file():
            st = p.stat()
            out.append([str(p.relative_to(folder)), st.st_size, st.st_mtime_ns])
    return out


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def base_eval(key: str | None, cache_dir: str | Path, measure: Callable[[], dict], log: Callable[[str], None]) -> dict:
    """The step-0 eval record: read from the cache under ``key``, or measured (and then kept there)."""
    if key is None:
        return measure()
    folder = Path(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"eval0-{key}.json"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kept = _read(path)
        if kept is not None:
            log(f"step-0 eval read from the cache (key {key}): the same base model on the same items")
            return {**kept, "base_eval_cache": key}
        rec = measure()
        try:
            write_atomically(path, json.dumps(rec))
        except OSError as exc:  # a full or read-only cache costs the next run a measurement, not this run
            log(f"step-0 eval not kept in the cache: {exc}")
    return rec


def _read(path: Path) -> dict | None:
    """The kept record, or None when there is none or it cannot be read (it is then measured again)."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("type") == "eval" and rec.get("step") == 0 else None
