"""A full run's checkpoints, evaluated as they appear (seed 004 §7/§9: eval every N steps, keep the best).

A backend whose run is evaluated by the per-item evaluator after training (OpenRLHF, a command with probe sets)
says where the run saves checkpoints as it trains (``Backend.checkpoint_glob``). While the run trains, each
checkpoint but the newest (it may still be being written) is evaluated by that same evaluator, one at a time,
its record carrying the checkpoint's step; once the run has ended, the rest. The full run's OOD early stop reads
these records as they come, and the best one names its checkpoint's folder as the weights to keep. A checkpoint
at or past the final step is left to the run's own final evaluation.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Any

from autorl.backends.base import LaunchPlan
from autorl.backends.forked import ForkedProcess
from autorl.evaluate import retarget_argv
from autorl.metrics import iter_records

LAST_NUMBER = re.compile(r"(\d+)\D*$")


def retarget(plan: LaunchPlan, model: Path, step: int, out: Path, log: Path) -> LaunchPlan:
    """The evaluator's plan for another checkpoint (``autorl.evaluate.retarget_argv``), its own output and log."""
    argv = retarget_argv(plan.argv, model, step, out)
    return plan.model_copy(update={"argv": argv, "metrics_path": str(out), "log_path": str(log)})


def saved(pattern: str) -> list[tuple[int, Path]]:
    """The checkpoint folders matching ``pattern``, by step."""
    found = []
    for path in map(Path, glob.glob(pattern)):
        m = LAST_NUMBER.search(path.name)
        if m and path.is_dir():
            found.append((int(m.group(1)), path))
    return sorted(found)


class CheckpointEvals:
    """Evaluates a run's checkpoints one at a time; ``poll()`` returns the records of evals that ended."""

    def __init__(self, pattern: str, plan: LaunchPlan, final_step: int, out_dir: Path):
        self.pattern, self.plan, self.final_step, self.out_dir = pattern, plan, final_step, Path(out_dir)
        self.started: set[Path] = set()
        self.current: tuple[ForkedProcess, Path] | None = None

    def poll(self, run_ended: bool = False) -> list[dict[str, Any]]:
        """Records of the eval that ended since the last call (none for a failed one: its log says why), after
        starting the next checkpoint's eval when none runs."""
        records = self._collect()
        if self.current is None:
            self._start_next(run_ended)
        return records

    def busy(self, run_ended: bool) -> bool:
        """Whether an eval runs or a checkpoint is still to be evaluated."""
        return self.current is not None or self._next(run_ended) is not None

    def cancel(self) -> None:
        if self.current is not None:
            self.current[0].cancel()
            self.current = None

    def _collect(self) -> list[dict[str, Any]]:
        if self.current is None or (code := self.current[0].poll()) is None:
            return []
        out, self.current = self.current[1], None
        return list(iter_records(out)) if code == 0 and out.is_file() else []

    def _next(self, run_ended: bool) -> tuple[int, Path] | None:
        found = saved(self.pattern)
        ready = found if run_ended else found[:-1]
        todo = [(s, p) for s, p in ready if p not in self.started and not (self.final_step and s >= self.final_step)]
        return todo[0] if todo else None

    def _start_next(self, run_ended: bool) -> None:
        nxt = self._next(run_ended)
        if nxt is None:
            return
        step, path = nxt
        self.started.add(path)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        out = self.out_dir / f"step{step}.jsonl"
        plan = retarget(self.plan, path, step, out, self.out_dir / f"step{step}.log")
        self.current = (ForkedProcess(plan), out)
