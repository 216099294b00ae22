"""Hypothesis profiles: ``fast`` in the suite (a few seconds), ``large`` for benchmarks/property_inputs.py (its
example count from AUTORL_PROPERTY_EXAMPLES, per property)."""

from __future__ import annotations

import os
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

set_hypothesis_home_dir(tempfile.mkdtemp(prefix="autorl-hypothesis-"))  # its caches outside the checkout

_COMMON = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much],
}
settings.register_profile("fast", max_examples=20, derandomize=True, **_COMMON)
settings.register_profile(
    "large", max_examples=int(os.environ.get("AUTORL_PROPERTY_EXAMPLES", "2500")), print_blob=True, **_COMMON
)
settings.load_profile(os.environ.get("AUTORL_PROPERTY_PROFILE", "fast"))
