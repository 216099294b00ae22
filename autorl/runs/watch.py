"""Watch launched trials until each ends, is aborted, times out or is cut.

``Watch`` follows one run, one ``step()`` at a time, so the controller can follow
several at once (``--parallel``) in a single thread. Stop conditions, in order of
precedence: an external stop (Ctrl-C, budget end), the per-trial timeout, the
hang watchdog (which spares a Ray job waiting for its cluster's GPUs), then the
rules the callback applies to new metric records (early abort, pruning).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autorl.backends.base import RunHandle
from autorl.metrics import RunMetrics
from autorl.states import TrialStatus


@dataclass
class Outcome:
    """How a run ended."""

    status: TrialStatus  # complete, crash, pruned, timeout, hang, budget-cut, interrupted, config-error, early-stopped
    exit_code: int | None
    reason: str = ""
    metrics: RunMetrics = field(default_factory=RunMetrics)
    abort: dict[str, Any] | None = None
    wall_s: float = 0.0


@dataclass
class Stop:
    """A request to stop the run, with the status to record."""

    status: TrialStatus
    reason: str
    details: dict[str, Any] | None = None


class Watch:
    """One run under watch: call ``step()`` until it returns an Outcome."""

    def __init__(
        self,
        handle: RunHandle,
        *,
        timeout_s: float,
        deadline: float | None,
        silence_s: float,
        on_records: Callable[[list[dict[str, Any]], RunMetrics], Stop | None],
        external: Callable[[], Stop | None],
    ):
        self.handle, self.timeout_s, self.deadline, self.silence_s = handle, timeout_s, deadline, silence_s
        self.on_records, self.external = on_records, external
        self.start = time.time()
        self.metrics = RunMetrics()
        self._excused = 0.0  # the last time a silent run was found waiting for its cluster's resources
        self.waited_s = 0.0  # silent time the run spent waiting for them: not counted against its timeout

    def step(self) -> Outcome | None:
        code = self.handle.poll()
        records = self.handle.metrics()
        self.metrics.extend(records)
        stop = self.on_records(records, self.metrics) if records else None
        if code is not None:
            return self._exited(code)
        stop = stop or self.external() or self._limits()
        if stop is None:
            return None
        self.handle.cancel()
        self.metrics.extend(self.handle.metrics())
        return Outcome(
            stop.status, self.handle.poll(), stop.reason, self.metrics, stop.details, time.time() - self.start
        )

    def _exited(self, code: int) -> Outcome:
        late = self.handle.metrics()
        self.metrics.extend(late)
        if late:
            self.on_records(late, self.metrics)
        status = TrialStatus.COMPLETE if code == 0 else TrialStatus.CRASH
        return Outcome(
            status, code, "" if code == 0 else f"exit code {code}", self.metrics, wall_s=time.time() - self.start
        )

    def _limits(self) -> Stop | None:
        now = time.time()
        if self.deadline is not None and now >= self.deadline:
            return Stop(TrialStatus.BUDGET_CUT, "the study's budget ran out during this trial")
        if now - self.start - self.waited_s >= self.timeout_s:
            waited = f" (not counting {self.waited_s:.0f} s waiting for the cluster)" if self.waited_s else ""
            return Stop(TrialStatus.TIMEOUT, f"ran past its {self.timeout_s:.0f} s timeout{waited}")
        if now - max(self.handle.last_activity(), self._excused) >= self.silence_s:
            return self._silent(now)
        return None

    def _silent(self, now: float) -> Stop | None:
        """A hang, unless the run is a Ray job waiting for resources its cluster has but others hold (then the
        watchdog waits another ``silence_s``, and the silent time is not counted against the trial's timeout: a
        busy cluster's queue is not the trial's slowness), or that no node could ever hold."""
        waiting = self.handle.waiting()
        if waiting is None:
            return Stop(TrialStatus.HANG, f"no output or metrics for {self.silence_s:.0f} s (watchdog)")
        if not waiting.feasible:
            return Stop(TrialStatus.CONFIG_ERROR, waiting.line)
        self.waited_s += now - max(self.handle.last_activity(), self._excused, self.start)
        self._excused = now
        return None


def last_seen(log_path: str | None, started: float | None) -> float | None:
    """When an interrupted trial last showed life: the newest write in its run folder (its log, the log's arrival
    times, its metrics), not the resume that found it, which may come days later. None without a start."""
    if started is None:
        return None
    newest = started
    if log_path:
        try:
            with os.scandir(Path(log_path).parent) as entries:
                for entry in itertools.islice(entries, 200):  # a run folder holds a handful of files
                    if entry.is_file(follow_symlinks=False):
                        newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
        except OSError:
            pass
    return min(newest, time.time())
