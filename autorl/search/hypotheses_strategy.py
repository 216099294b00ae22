"""The hypotheses strategy: diagnose the latest run, pick a hypothesis, search inside it.

Each proposal tests exactly one hypothesis. ``hypotheses.rank`` orders the library
by symptom match with the latest diagnosis, priority and history (demotion after
repeated non-improvement, exploitation of validated ideas); a hypothesis whose
last trials gained nothing over the confirmed incumbent is rested until a new one
is confirmed, and no proposal lands in a region the pruner or triage closed
(``autorl.search.revisit``) without saying why; the top one's
overrides are applied to the incumbent (the best *confirmed* improvement, else
the baseline) and Optuna proposes values inside its resolved space — one Optuna
study per hypothesis and incumbent, its primary lever probed first (see
``autorl.search.hypotheses`` for why). The trial's commit message and research-log
entry carry the diagnosis that led there.
"""

from __future__ import annotations

from typing import Any

from autorl.judge import diagnose
from autorl.judge.evidence import incumbent_row
from autorl.ledger import Trial
from autorl.metrics import RunMetrics
from autorl.recipe import dump_values
from autorl.search import hypotheses, moves, revisit
from autorl.search.hypotheses import Hypothesis
from autorl.search.proposal import Proposal, changed
from autorl.search.strategies import OptunaStrategy
from autorl.search.view import StudyView
from autorl.states import Proposer, TrialStatus, Verdict
from autorl.workspace import Workspace


def library_for(ws: Workspace, backend: str) -> list[Hypothesis]:
    """The shipped library plus the workspace's ``hypotheses/`` (validated, patches checked), for ``backend``."""
    dirs = [hypotheses.SHIPPED_DIR] + [d for d in [ws.root / "hypotheses"] if d.is_dir()]
    return [h for h in hypotheses.load_library(dirs) if h.backends is None or backend in h.backends]


class HypothesisStrategy:
    """Proposes the next trial for ``--strategy hypotheses``."""

    def __init__(self, view: StudyView):
        self.s = view
        self.library = library_for(view.ws, view.base.backend)
        self._noted: set[tuple[str, int | None]] = set()
        self._passed: set[tuple[str, str]] = set()  # hypotheses logged as not applicable here, and why
        self._rests: dict[str, int | None] = {}  # rested hypotheses, logged, and the incumbent they rested under
        self._blocked: set[tuple[str, str]] = set()  # moves logged as not taken: inside a closed region
        self._left: set[int] = set()  # incumbents under which "no hypothesis left" was logged
        self.last_diagnosis: diagnose.Diagnosis | None = None
        self.fallback = OptunaStrategy(view)
        self.table = moves.load_table()
        self.rules = view.rules

    def patch(self, hypothesis: str | None) -> str | None:
        """The patch file of ``hypothesis`` in the library, resolved (None when it has none)."""
        h = next((h for h in self.library if h.id == hypothesis), None)
        return _patch_path(h) if h is not None else None

    def propose(self) -> Proposal:
        trials = self.s.trials()
        closures, rest = self.s.closures(), self._rested(trials)
        move = self._move(trials, rest, closures)
        if move is not None:
            return move
        diag = self._diagnosis(trials)
        picked = self._pick(trials, diag, rest, closures)
        if picked is None:
            return self._none_left(trials, rest)
        h, inc, reason, exploit = picked
        space = hypotheses.resolve_search(h, inc, self.s.base.search)
        fixed = hypotheses.fixed_values(h, inc)
        prefix = self.s.name + ("/exploit" if exploit else "")
        search = self.s.search(hypotheses.study_name(h, inc, prefix=prefix))
        probe = not exploit and space and not search.study.get_trials(deepcopy=False)
        # regions closed by runs without a hypothesis' patch say nothing of runs with it
        asked = self.s.ask(search, space, hypotheses.probe_params(h, space, inc) if probe else None, fixed, not h.patch)
        values = changed(self.s.base.train, {**fixed, **asked.params})
        delta = changed(inc, {**fixed, **asked.params})
        reason += f"; {asked.why}" if asked.why else ""
        why = f"tests {h.id} ({h.title}); {reason}; diagnosis: {diag.summary() if diag else 'none yet'}"
        parent = incumbent_row(trials, self.s.base.objective.direction)
        return Proposal(
            Proposer.HYPOTHESIS,
            values,
            why,
            f"{h.id.split('-')[0]}-{dump_values(delta) or 'as-is'}",
            hypothesis=h.id,
            optuna_study=search.name,
            optuna_number=asked.number,
            patch=_patch_path(h),
            parent=parent.number if parent else None,
        )

    def _pick(
        self, trials: list[Trial], diag: diagnose.Diagnosis | None, rest: set[str], closures: revisit.Closures
    ) -> tuple[Hypothesis, dict[str, Any], str, bool] | None:
        """(hypothesis, values its ranges resolve against, why, exploit?) for the next trial, or None."""
        skip = self.inert(trials) | rest
        follow = continuation(trials, self.library, skip)
        if follow is not None:
            return follow[0], {**self.s.base.train, **follow[1]}, follow[2], False
        inc = self.working_point(trials)
        ranked = [
            r
            for r in hypotheses.rank(self.library, diag, trials, self.s.base.backend)
            if r.hypothesis.id not in skip and self._applies(r.hypothesis, inc, closures)
        ]
        if not ranked:
            return None
        h, reason = ranked[0].hypothesis, ranked[0].why
        if ranked[0].status.status == "validated":  # never its one-sided first ranges again: both sides of the value
            return self._exploited(h, inc), inc, reason + "; TPE around the incumbent", True
        return h, inc, reason, False

    def _applies(self, h: Hypothesis, inc: dict[str, Any], closures: revisit.Closures) -> bool:
        """``hypotheses.can_change`` at the working point, and a space not wholly inside a closed region; a
        hypothesis that fails either is logged once (per reason) and passed over."""
        try:
            if not hypotheses.can_change(h, inc, self.s.base.search):
                return self._pass(
                    h,
                    "its overrides already hold here and its space has nothing else to try, so a trial under it would "
                    "repeat the working point",
                )
            space = hypotheses.resolve_search(h, inc, self.s.base.search)
        except hypotheses.HypothesisError as exc:  # a range it cannot resolve at this working point: passed over
            return self._pass(h, f"its search space does not resolve here ({exc})")
        region = None if h.patch else closures.covers(space, hypotheses.fixed_values(h, inc))
        return region is None or self._pass(
            h, f"its whole space ({hypotheses.describe_space(space)}) lies where {region.why()}"
        )

    def _pass(self, h: Hypothesis, why: str) -> bool:
        """Log once that ``h`` is passed over, and why; False."""
        if (h.id, why) not in self._passed:
            self._passed.add((h.id, why))
            self.s.note(None, "not-applicable", f"{h.id} passed over: {why}")
        return False

    # ---- what rests (autorl/data/rules/revisit.yaml) ----------------------------------------------------
    def _rested(self, trials: list[Trial]) -> set[str]:
        """The hypotheses rested now; each rest, and each re-opening by a new incumbent, is logged once."""
        inc = incumbent_row(trials, self.s.base.objective.direction)
        here = inc.number if inc is not None else None
        rests = revisit.rested(trials, [h.id for h in self.library], inc, self.rules.rest.after)
        for hid, r in rests.items():
            if hid not in self._rests or self._rests[hid] != here:
                self._rests[hid] = here
                self.s.note(None, "rested", r.why())
        for hid in [hid for hid in self._rests if hid not in rests]:
            if self._rests.pop(hid) != here and inc is not None:
                self.s.note(None, "re-opened", f"{hid} re-opened: {inc.attempt} was confirmed since it was rested")
        return set(rests)

    def _none_left(self, trials: list[Trial], rest: set[str]) -> Proposal:
        """Nothing to rank. With a hypothesis rested under a confirmed incumbent: TPE over the recipe's search space
        on top of the incumbent and judged against it, in an Optuna study of its own (said once per incumbent), until
        a new incumbent re-opens them; otherwise plain Optuna over the recipe's space."""
        row = incumbent_row(trials, self.s.base.objective.direction)
        if not rest or row is None:
            return self.fallback.propose()
        inc = self.incumbent(trials)
        why = (
            f"no hypothesis left to test (rested: {', '.join(sorted(rest))}; the others passed over or without effect)"
        )
        if row.number not in self._left:
            self._left.add(row.number)
            self.s.note(
                None,
                "rested",
                f"{why}: TPE over the recipe's search space on top of {row.attempt} until a "
                "new incumbent re-opens them",
            )
        search = self.s.search(f"{self.s.name}/open/{row.number}")
        asked = self.s.ask(search, self.s.base.search, at=inc)
        point = {**inc, **asked.params}
        return Proposal(
            Proposer.OPTUNA,
            changed(self.s.base.train, point),
            f"TPE over the recipe's search space on top of {row.attempt}: {why}"
            + (f"; {asked.why}" if asked.why else ""),
            "tpe-" + (dump_values(changed(inc, point)) or "as-is"),
            optuna_study=search.name,
            optuna_number=asked.number,
            parent=row.number,
        )

    def _exploited(self, h: Hypothesis, inc: dict[str, Any]) -> Hypothesis:
        """``h`` with its relative ranges re-centred on the incumbent (moves.yaml's exploit ratio)."""
        return h.model_copy(update={"search": moves.recentre(h.search, inc, self.table.exploit.ratio)})

    # ---- direction-aware moves (autorl/data/rules/moves.yaml) ----------------------------------------
    def _move(self, trials: list[Trial], rest: set[str], closures: revisit.Closures) -> Proposal | None:
        """Step the knobs the diagnosis points at (or keep the last helpful step's direction), from the chain's
        last good trial, else from the incumbent."""
        inc, links = self._chain(trials)
        start = (
            moves.chain_start(links)
            or inc
            or next((t for t in trials if t.proposer == Proposer.BASELINE and t.status == TrialStatus.COMPLETE), None)
        )
        if start is None:
            return None
        point = {**self.s.base.train, **(start.params or {})}
        diag = self._diagnose_row(start, point)
        if diag is None:
            return None
        rows = self._move_rows(links, diag, rest)
        last = links[-1] if links and links[-1] is start else None  # the step the next one continues from
        first = self.table.gallop.power if moves.no_effect(last, self.table.gallop) else 1.0
        found = moves.next_move(
            rows, point, self.s.base.search, lambda p: self._tried(p) or self._closed(p, point, closures), first
        )
        if found is None:
            return None
        values, applied = found
        why = f"move {moves.describe(applied, point, values)}, from {start.attempt} (diagnosis: {diag.summary()})"
        slug = "move-" + dump_values({m.key: values[m.key] for m in applied})
        return Proposal(
            moves.PROPOSER,
            changed(self.s.base.train, {**point, **values}),
            why,
            slug,
            hypothesis=applied[0].hypothesis,
            parent=inc.number if inc else None,
        )

    def _chain(self, trials: list[Trial]) -> tuple[Trial | None, list[Trial]]:
        """The incumbent row (None: the baseline) and the move trials taken from it."""
        inc = incumbent_row(trials, self.s.base.objective.direction)
        return inc, moves.chain(trials, since=inc.number if inc else None)

    def _move_rows(self, links: list[Trial], diag: diagnose.Diagnosis, rest: set[str]) -> list[moves.Move]:
        """The rows the diagnosis fires, else the last helpful step's rows (momentum); none of a rested hypothesis."""
        ids = {h.id for h in self.library} - rest
        origin = self._params_of(links[0].parent) if links else {}
        taken = moves.steps_taken(links, origin) if links else {}
        rows = moves.applicable(self.table, diag.names(), diagnose.bottleneck_symptoms(diag.bottleneck), ids, taken)
        return rows or moves.momentum(self.table, links, origin, ids, taken)

    def _diagnose_row(self, row: Trial, params: dict[str, Any]) -> diagnose.Diagnosis | None:
        m = RunMetrics(self.s.metrics(_id(row)))
        if not m.steps:
            return None
        self.last_diagnosis = diagnose.diagnose(m.steps, m.evals, params)
        return self.last_diagnosis

    def _params_of(self, number: int | None) -> dict[str, Any]:
        """Train values of trial ``number`` (the base recipe's for None)."""
        params = self.s.trial(number).params if number is not None else None
        return {**self.s.base.train, **(params or {})}

    def _tried(self, params: dict[str, Any]) -> bool:
        return self.s.tried(changed(self.s.base.train, params)) is not None

    def _closed(self, params: dict[str, Any], point: dict[str, Any], closures: revisit.Closures) -> bool:
        """Whether a move from ``point`` to ``params`` lands in a closed region (logged once per region and step)."""
        moved = {k: v for k, v in params.items() if point.get(k) != v}
        region = closures.at(params, moved)
        if region is not None and (region.describe(), dump_values(moved)) not in self._blocked:
            self._blocked.add((region.describe(), dump_values(moved)))
            self.s.note(None, "closed", f"move to {dump_values(moved)} not taken: {region.why()}")
        return region is not None

    def working_point(self, trials: list[Trial]) -> dict[str, Any]:
        """Where a ranked hypothesis starts: the move chain's last good trial when it gained over its parent (a
        group size that ended the zero-std groups is kept while lr is tried next), else the incumbent."""
        last = moves.chain_start(self._chain(trials)[1])
        if last is not None and (last.delta or 0) > 0:
            return {**self.s.base.train, **(last.params or {})}
        return self.incumbent(trials)

    def incumbent(self, trials: list[Trial]) -> dict[str, Any]:
        """Train values of the best confirmed improvement (by objective), else the baseline's."""
        best = incumbent_row(trials, self.s.base.objective.direction)
        return {**self.s.base.train, **((best.params if best else None) or {})}

    def inert(self, trials: list[Trial]) -> set[str]:
        """Hypotheses whose latest finished trial had no effect at all: every metric identical to its parent's.

        That is evidence against the idea on this setup (eps_clip while nothing is clipped, max_new_tokens above
        the answers' length), not a flat result to push further; each is logged once as a 'no-effect' event.
        """
        latest: dict[str, Trial] = {}
        for t in trials:
            if t.hypothesis and t.status == TrialStatus.COMPLETE:
                latest[t.hypothesis] = t
        out = set()
        for hid, t in latest.items():
            parent = parent_of(t, trials)
            if parent is not None and self._same_run(t, parent):
                out.add(hid)
                self._note_inert(hid, t, parent)
        return out

    def _same_run(self, a: Trial, b: Trial) -> bool:
        fa, fb = (fingerprint(self.s.metrics(_id(t))) for t in (a, b))
        return bool(fa) and fa == fb

    def _note_inert(self, hid: str, t: Trial, parent: Trial) -> None:
        if (hid, t.number) in self._noted:
            return
        self._noted.add((hid, t.number))
        self.s.note(
            t.id,
            "no-effect",
            f"{t.attempt} ({hid}, {dump_values(t.changed or {})}) left every metric "
            f"identical to {parent.attempt}: the idea has no effect here; not pushed further",
        )

    def _diagnosis(self, trials: list[Trial]) -> diagnose.Diagnosis | None:
        """Diagnose the latest finished trial that has metrics (the incumbent's if it is newer)."""
        for t in reversed(trials):
            if t.status in (TrialStatus.COMPLETE, TrialStatus.PRUNED) or t.verdict == Verdict.CRASH:
                m = RunMetrics(self.s.metrics(_id(t)))
                if m.steps:
                    self.last_diagnosis = diagnose.diagnose(m.steps, m.evals, t.params or self.s.base.train)
                    return self.last_diagnosis
        return None


MAX_CHAIN = 3  # flat-but-better steps in a row that one hypothesis may take from its own last trial


# Per-step and eval values that any real change to training moves; timings and throughput are left out.
FINGERPRINT_KEYS = ("reward_mean", "loss", "grad_norm", "kl", "clip_ratio", "entropy_mean", "response_length_mean")


def fingerprint(records: list[dict]) -> list[tuple]:
    """What a run did, as comparable values: each step's FINGERPRINT_KEYS and each eval's scores."""
    out = []
    for r in records:
        if r.get("type") == "eval":
            out.append(
                (
                    "eval",
                    r.get("step"),
                    *sorted((k, v) for k, v in r.items() if k.startswith("eval/") and not k.endswith("items")),
                )
            )
        else:
            out.append(("step", r.get("step"), *(r.get(k) for k in FINGERPRINT_KEYS)))
    return out


def parent_of(t: Trial, trials: list[Trial]) -> Trial | None:
    """The earlier complete trial that differs from ``t`` only in the values ``t`` changed (same seed)."""
    mine = t.params or {}
    moved = set(t.changed or {})
    for other in reversed(trials):
        if (other.number or 0) >= (t.number or 0) or other.status != TrialStatus.COMPLETE:
            continue
        theirs = other.params or {}
        diff = {k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k)}
        if diff and diff <= moved:
            return other
    return None


def continuation(
    trials: list[Trial], library: list[Hypothesis], inert: set[str] | frozenset[str] = frozenset()
) -> tuple[Hypothesis, dict[str, Any], str] | None:
    """Keep pushing a hypothesis whose latest trial moved the objective the right way but not enough.

    Seed 004's playbook for flat learning steps the lr up again when a raise was still flat
    (5e-7 -> 1e-6 -> 2e-6). So when the last finished trial tested hypothesis H, was judged
    flat and its gain was positive, H is tested again with its relative ranges resolved around
    that trial's values, for at most MAX_CHAIN such steps in a row. Returns (hypothesis, params
    to resolve against, why) or None.
    """
    done = [t for t in trials if t.verdict in hypotheses.VERDICTS]
    tail: list[Trial] = []
    for t in reversed(done):
        if t.proposer != Proposer.HYPOTHESIS or t.verdict != Verdict.FLAT or (t.delta or 0) <= 0:
            break
        if tail and t.hypothesis != tail[0].hypothesis:
            break
        tail.append(t)
    if not tail or len(tail) >= MAX_CHAIN or tail[0].hypothesis in inert:
        return None
    last = tail[0]
    h = next((x for x in library if x.id == last.hypothesis), None)
    if h is None or not h.search:
        return None
    why = f"continues {h.id}: {last.attempt} moved the objective {last.delta:+.4f} but not beyond the noise"
    return h, dict(last.params or {}), why


def _id(t: Trial) -> int:
    """A trial's row id (every row read from the ledger has one)."""
    assert t.id is not None
    return t.id


def _patch_path(h: Hypothesis) -> str | None:
    path = h.patch_path()
    return str(path.resolve()) if path else None
