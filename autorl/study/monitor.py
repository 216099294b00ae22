"""One running trial's callback: each batch of new metric records goes to the ledger and the live view, then the
hard early-abort rules (``autorl.judge.abort``) and the noise-aware pruner (``autorl.judge.prune``, against the
references ``autorl.judge.evidence`` assembles) may stop it. The baseline and confirmation runs are never pruned:
they are the measurements everything else is judged by.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from autorl.judge.abort import check_abort
from autorl.metrics import RunMetrics
from autorl.recipe import Recipe
from autorl.runs.watch import Stop
from autorl.states import Proposer, TrialStatus
from autorl.study.state import StudyState, TrialContext


class TrialMonitor:
    """``on_records`` for one launched trial's ``Watch`` (its recipe is valid); ``clock()`` gives (seconds used,
    seconds left) of the budget."""

    def __init__(self, s: StudyState, ctx: TrialContext, recipe: Recipe, clock: Callable[[], tuple[float, float]]):
        self.s, self.ctx, self.clock = s, ctx, clock
        self.recipe = recipe
        self.last_step = s.backend.planned_steps(recipe)
        self.first_step_seen = False

    def on_records(self, records: list[dict[str, Any]], metrics: RunMetrics) -> Stop | None:
        self.s.ledger.add_metrics(self.ctx.attempt.row_id, records)
        if not self.first_step_seen and any(r.get("type") == "step" for r in records):
            self.first_step_seen = True  # when start-up ended: the trial planner keeps what came before fixed
            self.s.ledger.update_trial(self.ctx.attempt.row_id, first_step=time.time())
        self._show(metrics)
        rules = self.recipe.abort
        if rules.enabled and not self.s.proposer.is_baseline(self.ctx.proposal):
            d = check_abort(metrics.steps, rules, self.s.backend.max_grad_norm(self.recipe))
            if d is not None:
                seen = ", ".join(f"{v:.4g}" for v in d.values)
                return Stop(
                    TrialStatus.PRUNED,
                    f"early abort ({d.rule}): {d.reason} (step {d.step}; values {seen})",
                    d.model_dump(),
                )
        return self._prune(records)

    def _prune(self, records: list[dict[str, Any]]) -> Stop | None:
        """Stop when an intermediate eval is clearly worse than the parent's (or the incumbent's) at the same step."""
        p, key = self.ctx.proposal, self.recipe.objective.metric
        for rec in records:  # the final eval is the result, not an intermediate value: never pruned on it
            if rec.get("type") != "eval" or not isinstance(rec.get(key), (int, float)):
                continue
            if not 0 < rec.get("step", 0) < (self.last_step or 1e18):
                continue
            self.s.proposer.report(p, rec[key], int(rec["step"]))  # Optuna's NopPruner: for the dashboard only
            if self.recipe.abort.pruner and p.proposer != Proposer.CONFIRM and not self.s.proposer.is_baseline(p):
                d = self.s.evidence.clearly_worse(rec, p.parent, self.recipe)
                if d is not None:
                    return Stop(
                        TrialStatus.PRUNED,
                        f"noise-aware pruner: {d.reason}",
                        {"rule": "clearly_worse", **d.model_dump()},
                    )
        return None

    def _show(self, m: RunMetrics) -> None:
        last = m.steps[-1] if m.steps else {}
        evals = m.series(self.recipe.objective.metric)
        used, left = self.clock()
        self.s.view.progress(
            self.ctx.attempt.name,
            int(last.get("step", 0)),
            self.last_step,
            last.get("reward_mean"),
            evals[-1] if evals else None,
            used,
            left,
        )
