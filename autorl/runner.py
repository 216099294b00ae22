"""Watch one launched trial until it ends, is aborted, times out or is cut.

The controller passes callbacks; this module owns only the polling loop and the
stop conditions, in order of precedence: an external stop (Ctrl-C, budget end),
the per-trial timeout, the hang watchdog, then the rules the callback applies to
new metric records (early abort, pruning).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from autorl.backends.base import RunHandle
from autorl.metrics import RunMetrics


@dataclass
class Outcome:
    """How a run ended."""

    status: str  # complete | crash | pruned | timeout | hang | budget-cut | interrupted
    exit_code: int | None
    reason: str = ""
    metrics: RunMetrics = field(default_factory=RunMetrics)
    abort: dict | None = None
    wall_s: float = 0.0


@dataclass
class Stop:
    """A request to stop the run, with the status to record."""

    status: str
    reason: str
    details: dict | None = None


def watch(handle: RunHandle, *, timeout_s: float, deadline: float | None, silence_s: float,
          on_records: Callable[[list[dict], RunMetrics], Stop | None],
          external: Callable[[], Stop | None], poll_s: float = 0.2) -> Outcome:
    """Poll ``handle`` until it exits or a stop condition fires; cancel it then."""
    start = time.time()
    metrics = RunMetrics()
    while True:
        code = handle.poll()
        records = handle.metrics()
        metrics.extend(records)
        stop = on_records(records, metrics) if records else None
        if code is not None:
            metrics.extend(handle.metrics())
            status = "complete" if code == 0 else "crash"
            return Outcome(status, code, "" if code == 0 else f"exit code {code}", metrics, wall_s=time.time() - start)
        stop = stop or external() or _limits(handle, start, timeout_s, deadline, silence_s)
        if stop is not None:
            handle.cancel()
            metrics.extend(handle.metrics())
            return Outcome(stop.status, handle.poll(), stop.reason, metrics, stop.details, time.time() - start)
        time.sleep(poll_s)


def _limits(handle: RunHandle, start: float, timeout_s: float, deadline: float | None, silence_s: float) -> Stop | None:
    now = time.time()
    if deadline is not None and now >= deadline:
        return Stop("budget-cut", "the study's budget ran out during this trial")
    if now - start >= timeout_s:
        return Stop("timeout", f"ran past its {timeout_s:.0f} s timeout")
    if now - handle.last_activity() >= silence_s:
        return Stop("hang", f"no output or metrics for {silence_s:.0f} s (watchdog)")
    return None
