"""A fixed KV-cache size for the vLLM engine of a trial packed on a shared GPU, set inside its Ray workers.

vLLM sizes its KV cache by profiling: it reads the card's free memory, runs a dummy forward pass, and takes the
change as its own use. Trials packed on one GPU (``gpus_per_trial`` below 1) allocate and free memory all the
time (sleep mode, DeepSpeed, their evaluators), and an engine starting beside them dies in that window ("Error in
memory profiling ... other processes sharing the same container release GPU memory", or "No available memory
for the cache blocks" when one allocates). Four trials packed on one H200 lost two of four baseline runs and both
retries that way. Given ``kv_cache_memory_bytes``, vLLM skips the measurement. OpenRLHF 0.10 has no flag for it,
so a packed trial's Ray job gets ``setup`` as its ``worker_process_setup_hook`` and ``ENV`` (a fraction of the
card's memory) in its environment: in every worker of the job, once ``vllm.engine.arg_utils`` is imported, an
engine given no size gets that fraction of its card.

The fraction is half the trial's vLLM memory share (``FRACTION_OF_SHARE``): the other half is left for the
engine's weights and activations, which profiling would have measured. Standard library only at import: every
worker of the job runs ``setup`` before its first task.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

ENV = "AUTORL_VLLM_KV_FRACTION"
HOOK = f"{__name__}.setup"
TARGET = "vllm.engine.arg_utils"
FRACTION_OF_SHARE = 0.5


def fraction_for(share: float) -> str:
    """The value of ``ENV`` for an engine whose memory share of its card is ``share``."""
    return f"{share * FRACTION_OF_SHARE:.4f}"


def setup() -> None:
    """Ray's worker setup hook: patch vLLM's engine arguments now, or when they are first imported."""
    fraction = setup_fraction(os.environ.get(ENV))
    if fraction is None:
        return
    module = sys.modules.get(TARGET)
    if module is not None:
        patch(module, fraction)
    else:
        sys.meta_path.insert(0, _Finder(fraction))


def setup_fraction(raw: str | None) -> float | None:
    """The fraction ``ENV`` asks for; None for none, 0 (off) or a value that is not a fraction."""
    try:
        value = float(raw) if raw else None
    except ValueError:
        return None
    return value if value is not None and 0 < value < 1 else None


def patch(module, fraction: float) -> None:
    """``module.EngineArgs`` given no KV-cache size gets ``fraction`` of its card's memory after its own checks."""
    cls = module.EngineArgs
    if getattr(cls, "_autorl_kv_fraction", None) is not None:
        return
    original = cls.__post_init__

    def __post_init__(self):
        original(self)
        if getattr(self, "kv_cache_memory_bytes", None) is None:
            self.kv_cache_memory_bytes = int(fraction * card_memory())

    cls.__post_init__ = __post_init__
    cls._autorl_kv_fraction = fraction


def card_memory() -> int:
    """Total memory of the engine's first visible card, from vLLM's platform (NVML: no CUDA context here)."""
    from vllm.platforms import current_platform  # lazy: standard library only at import (runs in every Ray worker)

    return int(current_platform.get_device_total_memory(0))


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``TARGET`` as Python would, and patches the module once it has run."""

    def __init__(self, fraction: float):
        self.fraction = fraction

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module, self.fraction)

        spec.loader.exec_module = exec_module
        return spec
