"""Who proposes the next trial: baseline repeats, crash retries, then a strategy.

Strategies (``--strategy``):

- ``optuna``: plain TPE over the recipe's search space (one Optuna study);
- ``random``: Optuna's RandomSampler over the same space (the benchmark's control);
- ``hypotheses``: the diagnosis of the latest trials ranks the hypothesis library;
  the top hypothesis' overrides are applied and Optuna searches inside its space
  (see ``autorl.search.hypotheses`` for why each hypothesis gets its own Optuna study).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autorl.judge import triage
from autorl.metrics import RunMetrics
from autorl.recipe import Recipe, dump_values
from autorl.search.study import Search


@dataclass
class Proposal:
    """The next trial: values to change in the base recipe, and why."""

    proposer: str
    values: dict[str, Any]
    why: str
    slug: str
    hypothesis: str | None = None
    search: Search | None = field(default=None, repr=False)
    optuna_number: int | None = None
    retry_of: int | None = None
    patch: str | None = None
    parent: int | None = None     # attempt number of the recipe it modifies (None = the baseline)
    confirms: int | None = None   # attempt number of the candidate this run re-runs with a fresh seed


class Proposer:
    """Decides the next proposal from the ledger's history."""

    def __init__(self, ws, ledger, study: dict, base: Recipe, opts):
        self.ws, self.ledger, self.study, self.base, self.opts = ws, ledger, study, base, opts
        self.pending: list[Proposal] = []
        self._searches: dict[str, Search] = {}
        self._baseline_cache: dict[int, RunMetrics] = {}
        self._hyp = None
        if opts.strategy == "hypotheses":
            from autorl.search.hypotheses_strategy import HypothesisStrategy

            self._hyp = HypothesisStrategy(self)

    # ---- searches ---------------------------------------------------------------
    def search(self, name: str | None = None, sampler: str | None = None) -> Search:
        """The Optuna study ``name`` (default: the study's own), opened once."""
        name = name or self.study["optuna_study"]
        if name not in self._searches:
            kind = sampler or ("random" if self.opts.strategy == "random" else "tpe")
            self._searches[name] = Search(self.ws.ledger_path, name, self.base.objective.direction, kind,
                                          seed=self.opts.seed + len(self._searches),
                                          parallel=getattr(self.opts, "parallel", 1) > 1)
        return self._searches[name]

    def recover(self) -> None:
        self.search().fail_running()

    # ---- the next proposal ------------------------------------------------------------
    def next(self) -> Proposal | None:
        """The next proposal; None means 'nothing now' (e.g. wait for the baseline)."""
        if self.pending:
            return self.pending.pop(0)
        need, base = self._baseline_need()
        if need:
            return base
        if not self.baseline_runs():
            return None
        if self._hyp is not None:
            return self._hyp.propose()
        return self._optuna()

    def _baseline_need(self) -> tuple[bool, Proposal | None]:
        """(True, proposal) to run a baseline now, (True, None) to wait for one in flight."""
        rows = self._baselines()
        done = sum(r["status"] == "complete" for r in rows)
        active = sum(r["status"] == "running" for r in rows)
        if done >= self.base.verdict.baseline_repeats or self.baseline_failed():
            return False, None
        if done + active >= self.base.verdict.baseline_repeats:
            return True, None
        return True, self._baseline(done + active, first=not rows)

    def _baseline(self, k: int, first: bool) -> Proposal:
        seed0 = int(self.base.train.get("seed", 0) or 0)
        values = {} if k == 0 else {"seed": seed0 + k}
        why = "baseline: the recipe as written" if k == 0 else f"baseline repeat {k + 1} (seed {seed0 + k}) to measure seed noise"
        p = Proposal("baseline", values, why, "baseline" if k == 0 else f"baseline-seed{seed0 + k}")
        if first and self.base.search:
            p.search = self.search()
            p.optuna_number, _ = p.search.ask(self.base.search, fixed={key: self.base.train[key] for key in self.base.search})
        return p

    def ask(self, search: Search, space: dict, fixed: dict | None = None) -> tuple[int, dict[str, Any]]:
        """Ask Optuna, skipping points next to a crash that repeated (told FAIL without running)."""
        for _ in range(AVOID_TRIES):
            number, params = search.ask(space, fixed=fixed)
            near = self._near_repeated_crash(space, params)
            if fixed or near is None:
                return number, params
            search.tell(number, "fail")
            self.ledger.event(self.study["id"], None, "avoided",
                              f"skipped {dump_values(params)}: next to {near}, whose crash signature repeated")
        return number, params

    def _near_repeated_crash(self, space: dict, params: dict[str, Any]) -> str | None:
        rows = self.ledger.trials(self.study["id"], "verdict = 'crash' AND crash_signature IS NOT NULL")
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["crash_signature"]] = counts.get(r["crash_signature"], 0) + 1
        for r in rows:
            if counts[r["crash_signature"]] >= 2 and distance(space, params, r.get("params") or {}) < AVOID_RADIUS:
                return r["attempt"]
        return None

    def _optuna(self) -> Proposal:
        search = self.search()
        number, params = self.ask(search, self.base.search)
        values = changed(self.base.train, params)
        label = "random" if self.opts.strategy == "random" else "optuna"
        why = f"{label} proposal: {dump_values(values) or 'baseline values'}"
        return Proposal(label, values, why, dump_values(values) or label, search=search, optuna_number=number)

    # ---- feedback ---------------------------------------------------------------------
    def tell(self, p: Proposal, row: dict[str, Any], metrics: RunMetrics) -> None:
        status = row.get("status")
        if p.search is not None and p.optuna_number is not None:
            state = {"complete": "complete", "pruned": "pruned"}.get(status, "fail")
            p.search.tell(p.optuna_number, state, row.get("objective"))
        action = triage.crash_action(row["crash_category"]) if row.get("crash_category") else None
        if action == "retry_reduced" and p.retry_of is None and p.confirms is None and row.get("status") == "crash":
            self._queue_oom_retry(p, row)
        if self._hyp is not None:
            self._hyp.tell(p, row, metrics)

    def _queue_oom_retry(self, p: Proposal, row: dict[str, Any]) -> None:
        params = {**self.base.train, **p.values}
        reduced = triage.oom_retry_overrides(params, self.base.backend, changed=tuple(p.values))
        if not reduced:
            return
        number = row.get("number")
        values = {**p.values, **reduced}
        why = f"retry of an out-of-memory crash with {dump_values(reduced)} (the most recent memory-expanding change reduced)"
        retry = Proposal("retry", values, why, "oom-retry-" + dump_values(reduced), hypothesis=p.hypothesis,
                         retry_of=number, patch=p.patch, parent=p.parent)
        self.pending.append(retry)

    def queue_confirmation(self, p: Proposal, number: int, runs: int) -> None:
        """Re-run candidate ``number`` with ``runs`` fresh seeds, before anything else."""
        seed0 = int({**self.base.train, **p.values}.get("seed", 0) or 0)
        for k in range(runs):
            seed = seed0 + 1000 + 10 * number + k
            why = f"confirmation {k + 1}/{runs} of candidate {number:02d}: the same recipe with fresh seed {seed}"
            self.pending.insert(k, Proposal("confirm", {**p.values, "seed": seed}, why, f"confirm-{number:02d}-s{seed}",
                                            hypothesis=p.hypothesis, patch=p.patch, parent=p.parent, confirms=number))

    # ---- the baseline -----------------------------------------------------------------------
    def _baselines(self) -> list[dict]:
        return self.ledger.trials(self.study["id"], "proposer = 'baseline' AND kind = 'trial'")

    def baseline_failed(self) -> bool:
        return any(r["status"] in ("crash", "config-error", "hang", "timeout") for r in self._baselines())

    def baseline_runs(self) -> list[RunMetrics]:
        out = []
        for r in self._baselines():
            if r["status"] != "complete":
                continue
            if r["id"] not in self._baseline_cache:
                self._baseline_cache[r["id"]] = RunMetrics(self.ledger.metrics(r["id"]))
            out.append(self._baseline_cache[r["id"]])
        return out


AVOID_RADIUS = 0.1  # normalised distance to a repeatedly crashing point that is not sampled again
AVOID_TRIES = 10


def distance(space: dict, a: dict[str, Any], b: dict[str, Any]) -> float:
    """Chebyshev distance in the search space, each axis scaled to [0, 1] (log axes in log space)."""
    import math

    worst = 0.0
    for key, p in space.items():
        x, y = a.get(key), b.get(key)
        if p.choices is not None or not isinstance(x, (int, float)) or not isinstance(y, (int, float)):
            worst = max(worst, 0.0 if x == y else 1.0)
            continue
        lo, hi = (math.log(p.low), math.log(p.high)) if p.log else (p.low, p.high)
        fx, fy = (math.log(max(x, 1e-300)), math.log(max(y, 1e-300))) if p.log else (x, y)
        worst = max(worst, abs(fx - fy) / ((hi - lo) or 1.0))
    return worst


def changed(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``params`` whose value differs from ``base`` (floats to 4 significant digits)."""
    rounded = {k: _round(v) for k, v in params.items()}
    return {k: v for k, v in rounded.items() if base.get(k) != v}


def _round(v: Any) -> Any:
    if isinstance(v, float) and not isinstance(v, bool) and v != 0:
        return float(f"{v:.4g}")
    return v
