"""Who proposes the next trial: baseline repeats, crash retries, then a strategy.

Strategies (``--strategy``):

- ``optuna``: plain TPE over the recipe's search space (one Optuna study);
- ``random``: Optuna's RandomSampler over the same space (the benchmark's control);
- ``hypotheses``: the diagnosis of the latest trials ranks the hypothesis library;
  the top hypothesis' overrides are applied and Optuna searches inside its space
  (see ``autorl.search.hypotheses`` for why each hypothesis gets its own Optuna study).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from autorl.judge import triage
from autorl.metrics import RunMetrics
from autorl.recipe import Recipe, dump_values
from autorl.search.hypotheses_strategy import HypothesisStrategy
from autorl.search.proposal import Proposal
from autorl.search.strategies import OptunaStrategy, Strategy
from autorl.search.study import Search, study_names
from autorl.judge.result import TrialResult


class Proposer:
    """Decides the next proposal from the ledger's history."""

    def __init__(self, ws, ledger, study: dict, base: Recipe, opts):
        self.ws, self.ledger, self.study, self.base, self.opts = ws, ledger, study, base, opts
        self.pending: list[Proposal] = []
        self._searches: dict[str, Search] = {}
        self._baseline_cache: dict[int, RunMetrics] = {}
        self.strategy: Strategy = make_strategy(opts.strategy, self)

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

    def recover(self) -> int:
        """Fail the trials a killed controller left RUNNING in every Optuna study of this study (per hypothesis too)."""
        names = set(study_names(self.ws.ledger_path, self.study["optuna_study"])) | {self.study["optuna_study"]}
        return sum(self.search(name).fail_running() for name in sorted(names))

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
        return self._fresh()

    # ---- no repeats ---------------------------------------------------------------------
    def _fresh(self) -> Proposal | None:
        """The strategy's proposal, asked again while it repeats a configuration this study already tried."""
        p, twin = None, None
        for _ in range(REPEAT_TRIES):
            p = self.strategy.propose()
            twin = self.tried(p) if p is not None else None
            if twin is None:
                return p
            self._skip_repeat(p, twin)
        return self._deliberate_repeat(p, twin)

    def tried(self, p: Proposal) -> dict | None:
        """The earlier trial of this study that ran the same resolved train values (and the same patch), if any."""
        want = {**self.base.train, **p.values}
        for row in self.ledger.trials(self.study["id"], kind="trial"):
            if row.get("params") == want and (not p.patch or row.get("hypothesis") == p.hypothesis):
                return row
        return None

    def _skip_repeat(self, p: Proposal, twin: dict) -> None:
        """Tell Optuna the repeat's outcome from the earlier trial (nothing runs) and log it."""
        told = "nothing to tell"
        if p.optuna_study is not None and p.optuna_number is not None:
            value = twin.get("objective") if twin.get("status") == "complete" else None
            state = "complete" if value is not None else ("pruned" if twin.get("status") == "pruned" else "fail")
            self.search(p.optuna_study).tell(p.optuna_number, state, value)
            told = f"told Optuna {state}" + (f" {value:.4f}" if value is not None else "")
        self.ledger.event(self.study["id"], None, "repeat", f"skipped {p.proposer} proposal "
                          f"{dump_values(p.values) or '(baseline values)'}: already tried as {twin['attempt']}; {told}")

    def _deliberate_repeat(self, p: Proposal, twin: dict) -> Proposal:
        """After REPEAT_TRIES repeats in a row: run the values once more with a fresh seed, and say so."""
        seeds = [int(r.get("seed") or 0) for r in self.ledger.trials(self.study["id"], kind="trial")]
        seed = max(seeds + [0]) + 1
        why = (f"deliberate repeat of {twin['attempt']}'s values with a fresh seed {seed}: the search proposed only "
               f"configurations already tried in {REPEAT_TRIES} asks; {p.why}")
        # every other field (the parent above all: the recipe it is judged against) stays the proposal's own
        return replace(p, values={**p.values, "seed": seed}, why=why, slug=f"repeat-{twin['number']:02d}-seed{seed}")

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
        slug = "baseline" if k == 0 else f"baseline-seed{seed0 + k}"
        if not (first and self.base.search):
            return Proposal("baseline", values, why, slug)
        search = self.search()
        number, _ = search.ask(self.base.search, fixed={key: self.base.train[key] for key in self.base.search})
        return Proposal("baseline", values, why, slug, optuna_study=search.name, optuna_number=number)

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
        rows = self.ledger.crash_signatures(self.study["id"])
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["crash_signature"]] = counts.get(r["crash_signature"], 0) + 1
        limit = triage.repeat_limit()  # from the rules file's repeat_limit
        for r in rows:
            if counts[r["crash_signature"]] >= limit and distance(space, params, r.get("params") or {}) < AVOID_RADIUS:
                return r["attempt"]
        return None

    # ---- feedback ---------------------------------------------------------------------
    def tell(self, p: Proposal, result: TrialResult, action: str | None = None) -> None:
        """Tell Optuna how the trial ended (FAIL for a crash, never a score) and queue a crash's retry.

        ``action`` is what triage decided for a crash (``retry_reduced``, ``retry_once``, ...); without one the
        category's action from the rules table applies.
        """
        if p.optuna_study is not None and p.optuna_number is not None:
            state = {"complete": "complete", "pruned": "pruned"}.get(result.status, "fail")
            self.search(p.optuna_study).tell(p.optuna_number, state, result.objective)
        if action is None and result.crash_category:
            action = triage.crash_action(result.crash_category)
        if p.retry_of is None and p.confirms is None and result.status == "crash":
            self._queue_crash_retry(p, result.number, result.crash_category, action)

    def _queue_crash_retry(self, p: Proposal, number: int, category: str | None, action: str | None) -> None:
        """Queue the retry triage's ``action`` asks for (nothing for record or stop)."""
        if action == "retry_reduced":
            self._queue_oom_retry(p, number)
        elif action == "retry_once":
            self._queue_retry(p, number, category)

    def _queue_oom_retry(self, p: Proposal, number: int) -> None:
        params = {**self.base.train, **p.values}
        reduced = triage.oom_retry_overrides(params, self.base.backend, changed=tuple(p.values))
        if not reduced:
            return
        values = {**p.values, **reduced}
        why = f"retry of an out-of-memory crash with {dump_values(reduced)} (the most recent memory-expanding change reduced)"
        retry = Proposal("retry", values, why, "oom-retry-" + dump_values(reduced), hypothesis=p.hypothesis,
                         retry_of=number, patch=p.patch, parent=p.parent)
        self.pending.append(retry)

    def report(self, p: Proposal, value: float, step: int) -> bool:
        """Report an intermediate value of ``p``'s Optuna trial; True when the pruner says stop."""
        if p.optuna_study is None or p.optuna_number is None:
            return False
        return self.search(p.optuna_study).report(p.optuna_number, value, step)

    def _queue_retry(self, p: Proposal, number: int, category: str | None) -> None:
        """The same values once more: a hang, timeout, network error or external kill may not recur."""
        why = f"retry of a {category} crash with the same values (it may be transient)"
        self.pending.append(Proposal("retry", dict(p.values), why, "retry-" + (dump_values(p.values) or "baseline"),
                                     hypothesis=p.hypothesis, retry_of=number, patch=p.patch, parent=p.parent))

    def queue_confirmation(self, p: Proposal, number: int, runs: int) -> None:
        """Re-run candidate ``number`` with ``runs`` fresh seeds, before anything else."""
        for k in range(runs):
            self.pending.insert(k, self._confirmation(p, number, k, runs))

    def _confirmation(self, p: Proposal, number: int, k: int, runs: int) -> Proposal:
        """Confirmation run ``k`` of candidate ``number``: its values with fresh seed ``confirm_seed``."""
        seed = self._confirm_seed(p, number, k)
        why = f"confirmation {k + 1}/{runs} of candidate {number:02d}: the same recipe with fresh seed {seed}"
        return Proposal("confirm", {**p.values, "seed": seed}, why, f"confirm-{number:02d}-s{seed}",
                        hypothesis=p.hypothesis, patch=p.patch, parent=p.parent, confirms=number)

    def _confirm_seed(self, p: Proposal, number: int, k: int) -> int:
        return int({**self.base.train, **p.values}.get("seed", 0) or 0) + 1000 + 10 * number + k

    # ---- resume: the queue a stopped controller left -----------------------------------------
    def requeue(self) -> list[Proposal]:
        """Rebuild, from the ledger, the work a stopped controller had queued but not run, oldest first:
        the confirmation runs an open candidate still lacks, and the retry triage asked for a crash that has
        none (a confirmation or retry the controller stopped early counts as not run)."""
        rows = self.ledger.open_candidates(self.study["id"]) + self.ledger.unretried_crashes(self.study["id"])
        for row in sorted(rows, key=lambda r: r["number"]):
            p = self._proposal_of(row)
            if row["status"] == "crash":
                action = row.get("crash_action") or triage.crash_action(row.get("crash_category") or "unknown")
                self._queue_crash_retry(p, row["number"], row.get("crash_category"), action)
            else:
                self.pending += self._missing_confirmations(p, row["number"])
        return list(self.pending)

    def _missing_confirmations(self, p: Proposal, number: int) -> list[Proposal]:
        runs = self.base.verdict.confirm_runs
        ran = {r.get("seed") for r in self.ledger.confirm_runs(self.study["id"], number, ran=True)}
        return [self._confirmation(p, number, k, runs) for k in range(runs)
                if self._confirm_seed(p, number, k) not in ran]

    def _proposal_of(self, row: dict) -> Proposal:
        """The proposal a ledger row ran (its changed values, hypothesis, patch and links)."""
        return Proposal(row["proposer"], dict(row.get("changed") or {}), row.get("why") or "", row["attempt"],
                        hypothesis=row.get("hypothesis"), retry_of=row.get("retry_of"), patch=self._patch_of(row),
                        parent=row.get("parent"), confirms=row.get("confirms"))

    def _patch_of(self, row: dict) -> str | None:
        """The patch the row's trial applied: its hypothesis' patch when a ranked hypothesis proposed it (or the
        trial a retry repeats)."""
        while row.get("retry_of") is not None:
            row = self.ledger.trial(row["retry_of"])
        library = getattr(self.strategy, "library", [])
        h = next((h for h in library if h.id == row.get("hypothesis")), None)
        path = h.patch_path() if h is not None and row.get("proposer") == "hypothesis" else None
        return str(path.resolve()) if path else None

    # ---- the baseline -----------------------------------------------------------------------
    def _baselines(self) -> list[dict]:
        return self.ledger.baselines(self.study["id"])

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
REPEAT_TRIES = 8  # asks for something new before a tried configuration is run again, deliberately, with a new seed


def make_strategy(name: str, proposer: "Proposer") -> Strategy:
    """The strategy ``--strategy name`` names."""
    return HypothesisStrategy(proposer) if name == "hypotheses" else OptunaStrategy(proposer, label=name)


def distance(space: dict, a: dict[str, Any], b: dict[str, Any]) -> float:
    """Chebyshev distance in the search space, each axis scaled to [0, 1] (log axes in log space)."""
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
