"""autorl.judge.evidence on a real ledger: which runs stand on each side of a verdict, with answers known by
construction (the candidate's own runs counted once, a parent referenced by its fresh runs alone, each arm's own
run noise)."""

from __future__ import annotations

import numpy as np
import pytest

from autorl.judge import verdict
from autorl.judge.evidence import Evidence, study_errors
from autorl.judge.noise import gain
from autorl.ledger import Ledger, Trial
from autorl.recipe import validate_recipe
from autorl.states import Confirmation, CrashCategory, Proposer, TrialStatus, Verdict

N = 400
RECIPE = validate_recipe({"backend": "embedded", "train": {}, "verdict": {"confirm_runs": 2}}, source="t")
S = RECIPE.verdict


def shifted(rng: np.random.Generator, base: np.ndarray, shift: float, swaps: int = 40) -> list[int]:
    """``base``'s items with ``swaps`` solved/unsolved pairs exchanged (the coin flips: the mean stays) and then
    ``shift`` x items more solved (fewer if negative): a run whose mean is exactly ``base``'s plus ``shift``."""
    out = base.copy()
    ones, zeros = rng.permutation(np.flatnonzero(out == 1)), rng.permutation(np.flatnonzero(out == 0))
    out[ones[:swaps]], out[zeros[:swaps]] = 0, 1
    k = round(abs(shift) * len(out))
    pool = np.flatnonzero(out == (0 if shift > 0 else 1))
    out[rng.choice(pool, k, replace=False)] = 1 if shift > 0 else 0
    return out.astype(int).tolist()


class Study:
    """A study in a real ledger whose runs are per-item results written as the engine writes its evals."""

    def __init__(self, tmp_path, seed: int = 0):
        self.ledger = Ledger(tmp_path / "ledger.sqlite")
        self.sid = self.ledger.create_study(
            name="s", recipe_path="r.yaml", recipe="", base_sha="x", strategy="random", budget_s=1.0, optuna_study="s"
        )
        self.rng = np.random.default_rng(seed)
        self.base = (self.rng.random(N) < 0.5).astype(int)
        self.items: dict[int, list[int]] = {}

    def run(
        self, number: int, proposer: Proposer, shift: float, status: TrialStatus = TrialStatus.COMPLETE, **cols
    ) -> Trial:
        items = shifted(self.rng, self.base, shift)
        self.items[number] = items
        tid = self.ledger.add_trial(
            study_id=self.sid,
            number=number,
            attempt=f"attempt-{number:02d}",
            proposer=proposer,
            status=status,
            objective=float(np.mean(items)),
            **cols,
        )
        self.ledger.add_metrics(
            tid, [{"type": "eval", "step": 10, "eval/id/greedy_pass@1": float(np.mean(items)), "eval/id/items": items}]
        )
        return self.ledger.trial(number)

    def runs(self, *numbers: int) -> verdict.Runs:
        return verdict.Runs(
            values=[float(np.mean(self.items[n])) for n in numbers], items=[self.items[n] for n in numbers]
        )

    def evidence(self) -> Evidence:
        return Evidence(self.ledger.records(self.sid))

    def metrics(self, number: int):
        ev = self.evidence()
        return ev.metrics(self.ledger.trial(number))


def baseline(st: Study, shifts=(0.0, 0.0, 0.0, 0.0)) -> None:
    for i, s in enumerate(shifts, start=1):
        st.run(i, Proposer.BASELINE, s)


def test_a_candidates_own_runs_count_once_at_confirmation(tmp_path):
    st = Study(tmp_path)
    baseline(st)
    st.run(5, Proposer.RANDOM, 0.12, verdict=Verdict.IMPROVED, confirmation=Confirmation.CANDIDATE)
    st.run(6, Proposer.CONFIRM, 0.06, confirms=5)
    st.run(7, Proposer.CONFIRM, 0.10, confirms=5)
    st.run(
        8, Proposer.RANDOM, 0.20, verdict=Verdict.IMPROVED, confirmation=Confirmation.REJECTED
    )  # another changed recipe, and loud:
    st.run(9, Proposer.CONFIRM, -0.10, confirms=8)
    st.run(10, Proposer.CONFIRM, 0.05, confirms=8)
    c = st.evidence().confirmation(st.ledger.trial(5), RECIPE)
    want = verdict.confirm(
        st.runs(6, 7),
        st.runs(1, 2, 3, 4),
        S,
        "maximize",
        verdict.Noise(trial=[st.runs(5, 6, 7)], study=[st.runs(8, 9, 10)]),
    )
    assert c.verdict == want  # the candidate's group (its run and its two fresh runs) once, the other group once
    assert c.verdict.trial_noise == "the study's changed recipes" and c.verdict.trial_df == 2 + 2
    assert c.verdict.delta == pytest.approx(np.mean(st.runs(6, 7).values) - np.mean(st.runs(1, 2, 3, 4).values))


def test_a_child_is_judged_against_its_parents_fresh_runs_not_the_run_that_made_it_a_candidate(tmp_path):
    st = Study(tmp_path, seed=1)
    baseline(st)
    st.run(
        5, Proposer.RANDOM, 0.15, verdict=Verdict.IMPROVED, confirmation=Confirmation.CONFIRMED
    )  # picked for looking good
    st.run(6, Proposer.CONFIRM, 0.05, confirms=5)
    st.run(7, Proposer.CONFIRM, 0.05, confirms=5)
    st.run(8, Proposer.HYPOTHESIS, 0.05, parent=5)  # as good as its parent really is
    ev = st.evidence()
    c = ev.credit(st.metrics(8), 5, RECIPE)
    fresh_mean = np.mean(st.runs(6, 7).values)
    assert c.vs_parent.delta == pytest.approx(np.mean(st.items[8]) - fresh_mean)
    assert c.vs_parent.verdict != Verdict.REGRESSED
    assert c.vs_baseline.delta == pytest.approx(np.mean(st.items[8]) - np.mean(st.runs(1, 2, 3, 4).values))
    parent_ref = ev.prune_references(5, "maximize")[0]
    assert [m.evals[-1]["eval/id/items"] for m in parent_ref.runs] == [st.items[6], st.items[7]]


@pytest.mark.parametrize(
    "ended, category, want",
    [
        (TrialStatus.PRUNED, None, Confirmation.REJECTED),  # stopped by the hard abort rules on a fresh seed
        (TrialStatus.CRASH, CrashCategory.NAN_DIVERGENCE, Confirmation.REJECTED),
        (TrialStatus.CRASH, CrashCategory.CUDA_OOM, Confirmation.REJECTED),
        # transient: left out like a run the controller stopped
        (TrialStatus.CRASH, CrashCategory.HANG_TIMEOUT, Confirmation.CONFIRMED),
        # another process on the GPU: the values cannot cause it
        (TrialStatus.CRASH, CrashCategory.SHARED_GPU, Confirmation.CONFIRMED),
    ],
)
def test_a_candidate_is_judged_on_every_fresh_seed_not_on_those_that_survived(tmp_path, ended, category, want):
    """Three fresh seeds, two far ahead of the baseline: a third that failed in a way the recipe can cause
    rejects the candidate (judging only the survivors confirmed recipes that collapse on a third of their
    seeds); a transient crash does not. The same answer whether the failed run's row is written or ending now."""
    st = Study(tmp_path, seed=4)
    baseline(st)
    st.run(5, Proposer.RANDOM, 0.15, verdict=Verdict.IMPROVED, confirmation=Confirmation.CANDIDATE)
    st.run(6, Proposer.CONFIRM, 0.15, confirms=5)
    st.run(7, Proposer.CONFIRM, 0.15, confirms=5)
    st.run(8, Proposer.CONFIRM, 0.0, confirms=5, status=ended, crash_category=category)
    c = st.evidence().confirmation(st.ledger.trial(5), RECIPE)
    assert c.state == want, c.reason
    if want == Confirmation.REJECTED:
        assert c.verdict is None and "1 of its 3 fresh-seed runs failed (attempt-08 " in c.reason
    else:
        assert c.verdict.verdict == Verdict.IMPROVED and c.runs == 2
    st.ledger.update_trial(st.ledger.trial(8).id, status=TrialStatus.RUNNING, crash_category=None)
    ending = st.evidence().confirmation(st.ledger.trial(5), RECIPE, ending=(8, ended, category))
    assert (ending.state, ending.reason) == (c.state, c.reason)


def test_confirmation_measures_the_candidates_own_run_noise(tmp_path):
    # the baseline does not move from seed to seed; the candidate's recipe swings by 8 points: its two fresh runs
    # are 10 points above the baseline on average, but with that spread two runs cannot show it at 97.5% (one run
    # variance for both recipes, pooled over the baseline's quiet repeats, said yes)
    st = Study(tmp_path, seed=2)
    baseline(st)
    st.run(5, Proposer.RANDOM, 0.16, verdict=Verdict.IMPROVED, confirmation=Confirmation.CANDIDATE)
    st.run(6, Proposer.CONFIRM, 0.14, confirms=5)
    st.run(7, Proposer.CONFIRM, 0.06, confirms=5)
    c = st.evidence().confirmation(st.ledger.trial(5), RECIPE)
    v = c.verdict
    assert v.delta == pytest.approx(0.10) and c.state == Confirmation.REJECTED
    assert v.trial_noise == "its own runs" and v.trial_df == 2 and v.trial_sd > 0.03 > v.parent_sd
    fresh, base = np.asarray(st.runs(6, 7).items, float), np.asarray(st.runs(1, 2, 3, 4).items, float)
    pooled = gain(fresh, base, [base, fresh], [], S.run_sd_prior, S.run_sd_prior_df, S.confirm_level)
    assert float(pooled["low"]) > 0  # what one run variance pooled over both recipes would have concluded


def test_a_trial_is_judged_with_the_noise_the_studys_changed_recipes_showed(tmp_path):
    st = Study(tmp_path, seed=3)
    baseline(st)
    st.run(5, Proposer.RANDOM, 0.15, verdict=Verdict.IMPROVED, confirmation=Confirmation.REJECTED)
    st.run(6, Proposer.CONFIRM, -0.05, confirms=5)
    st.run(7, Proposer.CONFIRM, 0.02, confirms=5)
    st.run(8, Proposer.RANDOM, 0.12)
    ev = st.evidence()
    v = ev.credit(st.metrics(8), None, RECIPE).vs_parent
    assert v.trial_noise == "the study's changed recipes" and v.trial_df == 2 and v.verdict == Verdict.FLAT
    alone = verdict.judge(st.runs(8), st.runs(1, 2, 3, 4), S, "maximize")
    assert alone.verdict == Verdict.IMPROVED and alone.trial_noise == "the parent's"


def _mid(st: Study, number: int, shift: float) -> None:
    """Give run ``number`` an intermediate eval at step 5 (its final one is at step 10)."""
    items = shifted(st.rng, st.base, shift)
    st.ledger.add_metrics(
        st.ledger.trial(number).id,
        [{"type": "eval", "step": 5, "eval/id/items": items, "eval/id/greedy_pass@1": float(np.mean(items))}],
    )


def test_a_trial_ahead_of_its_parent_is_not_stopped_for_trailing_the_incumbent(tmp_path):
    st = Study(tmp_path, seed=4)
    baseline(st)
    st.run(
        5, Proposer.RANDOM, 0.30, verdict=Verdict.IMPROVED, confirmation=Confirmation.CONFIRMED
    )  # the incumbent, far ahead
    st.run(6, Proposer.CONFIRM, 0.30, confirms=5)
    st.run(7, Proposer.CONFIRM, 0.30, confirms=5)
    for n, shift in ((1, 0.0), (2, 0.0), (3, 0.0), (4, 0.0), (5, 0.30), (6, 0.30), (7, 0.30)):
        _mid(st, n, shift)
    ev = st.evidence()

    def at_step(shift: float) -> dict:
        items = shifted(st.rng, st.base, shift)
        return {"type": "eval", "step": 5, "eval/id/items": items, "eval/id/greedy_pass@1": float(np.mean(items))}

    ahead = ev.clearly_worse(at_step(+0.05), None, RECIPE)  # ahead of the baseline, 25 points behind the incumbent
    behind = ev.clearly_worse(at_step(-0.02), None, RECIPE)  # behind the baseline, not clearly worse than it
    assert ahead is None
    assert behind is not None and "clearly worse than the incumbent attempt-05" in behind.reason


def test_the_study_states_its_decisions_the_false_confirmations_to_expect_and_its_own_aa(tmp_path):
    st = Study(tmp_path, seed=5)
    baseline(st)
    st.run(5, Proposer.RANDOM, 0.0, verdict=Verdict.FLAT)
    st.run(6, Proposer.RANDOM, -0.2, verdict=Verdict.REGRESSED)
    st.run(7, Proposer.RANDOM, 0.15, verdict=Verdict.IMPROVED, confirmation=Confirmation.CONFIRMED)
    st.run(8, Proposer.CONFIRM, 0.15, confirms=7)
    st.run(9, Proposer.CONFIRM, 0.15, confirms=7)
    st.run(10, Proposer.RANDOM, 0.0, verdict=Verdict.PRUNED, status=TrialStatus.PRUNED)
    e = study_errors(st.evidence(), RECIPE)
    assert e.decisions == {
        Verdict.IMPROVED: 1,
        Verdict.REGRESSED: 1,
        Verdict.FLAT: 1,
        Confirmation.CONFIRMED: 1,
        Confirmation.REJECTED: 0,
        Verdict.PRUNED: 1,
    }
    assert e.baseline_df == 3 and e.changed_df == 2 and e.changed_sd is not None
    assert 0 <= e.false_confirm < 0.02 and e.expected_false == pytest.approx(3 * e.false_confirm)
    assert [i for i, _ in e.aa] == [0, 1, 2, 3] and all(v.verdict == Verdict.FLAT for _, v in e.aa)
