"""A line on stderr, at most every ``INTERVAL_S``, from inside computations that can outlast a recipe's silence
watchdog: generation, an update's micro-batches, an evaluation.

The watchdog (``abort.silence_s``, 120 s by default) takes a run that writes nothing for that long for a hung one
and stops it. A trial of a real model on a CPU is slow but alive: 120 chat-templated prompts of SmolLM2-135M take
longer than that to answer on two cores, and the run was stopped before its first step. Beats come from the loops
that make progress (a decoding step, a micro-batch), never from a timer thread, so a process stuck in a kernel, a
collective or a deadlock still falls silent and is still stopped. Torch-free: the controller may import it.
"""

from __future__ import annotations

import sys
import time

INTERVAL_S = 30.0  # well under any silence_s a recipe may sensibly set (the default is 120 s)

_last = [time.monotonic()]


def beat(what: str) -> None:
    """Say what is being worked on, if nothing was said for ``INTERVAL_S``."""
    now = time.monotonic()
    if now - _last[0] < INTERVAL_S:
        return
    _last[0] = now
    print(f"working: {what}", file=sys.stderr, flush=True)
