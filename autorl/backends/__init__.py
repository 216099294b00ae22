"""Backends run one trial each, behind the small protocol in ``base``.

Only modules in this package import ray, trl or openrlhf, and only lazily.
"""

from autorl.backends.base import Backend, LaunchPlan, RunHandle, TrialSpec, get_backend

__all__ = ["Backend", "LaunchPlan", "RunHandle", "TrialSpec", "get_backend"]
