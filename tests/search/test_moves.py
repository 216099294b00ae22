"""Direction-aware moves: one step inside the recipe's limits, the chain read from ledger rows, which rows apply,
the bisecting half step, and the re-centred space a validated hypothesis is exploited in."""

from __future__ import annotations

import pytest

from autorl.ledger import Trial
from autorl.recipe import SearchParam
from autorl.search import moves
from autorl.search.hypotheses import SHIPPED_DIR, HypothesisParam, _clip, load_library
from autorl.search.moves import Move, MoveTable
from autorl.states import Proposer, TrialStatus, Verdict

LR = SearchParam(low=1e-7, high=1e-2, log=True)
GENS = SearchParam(choices=[2, 4, 8, 16])
KL = SearchParam(choices=[0.0, 0.04, 0.2, 1.0, 4.0])


def test_shipped_table_loads_and_names_library_hypotheses():
    table = moves.load_table()
    ids = {h.id for h in load_library([SHIPPED_DIR])}
    assert table.moves and all(m.hypothesis in ids for m in table.moves)
    assert table.exploit.ratio > 1


@pytest.mark.parametrize(
    "value, factor, limit, want",
    [
        (1e-7, 10.0, LR, 1e-6),  # flat: one decade up
        (3e-3, 0.1, LR, 3e-4),  # collapse: one decade down
        (5e-3, 10.0, LR, 1e-2),  # clipped to the recipe's upper bound
        (1e-2, 10.0, LR, None),  # already at the bound: no move
        (2, 4.0, GENS, 8),  # choices: the nearest on the move's side
        (16, 4.0, GENS, None),  # no larger choice
        (4.0, 0.1, KL, 0.2),  # 0.4 snaps to the nearest smaller choice (log space)
        (0.04, 0.1, KL, 0.0),  # only 0 is smaller
        (0.0, 0.1, KL, None),  # 0 cannot be scaled
        (2, 4.0, None, 8),  # no recipe limit: plain integer step
        (3, 1.2, None, 4),  # an integer step always moves by at least 1
    ],
)
def test_step(value, factor, limit, want):
    got = moves.step(value, factor, limit)
    assert got == pytest.approx(want) if want is not None else got is None


def _row(number: int, verdict: Verdict | None, **params: float) -> Trial:
    return Trial(
        number=number,
        attempt=f"attempt-{number:02d}",
        proposer=Proposer.MOVE,
        status=TrialStatus.COMPLETE,
        verdict=verdict,
        params={"lr": 1e-7, "gens": 2, **params},
        parent=None,
    )


def test_chain_is_the_move_trials_since_the_incumbent():
    trials = [
        Trial(number=1, proposer=Proposer.BASELINE, status=TrialStatus.COMPLETE),
        _row(2, Verdict.FLAT, lr=1e-6),
        Trial(number=3, proposer=Proposer.HYPOTHESIS, status=TrialStatus.COMPLETE, verdict=Verdict.FLAT),
        _row(4, Verdict.FLAT, lr=1e-6),
        _row(5, Verdict.IMPROVED, lr=1e-5),
        Trial(number=6, proposer=Proposer.CONFIRM, status=TrialStatus.COMPLETE, confirms=5),
        _row(7, None, lr=1e-4).replace(status=TrialStatus.RUNNING),
    ]
    assert [t.number for t in moves.chain(trials)] == [2, 4, 5]
    assert [t.number for t in moves.chain(trials, since=5)] == [5]  # 5 became the incumbent


def test_momentum_keeps_the_direction_of_a_step_that_helped():
    table = moves.load_table()
    start = {"lr": 1e-7, "gens": 2}
    helped = [_row(2, Verdict.FLAT, lr=1e-6, gens=8).replace(delta=0.03)]
    assert {m.key for m in moves.momentum(table, helped, start, {m.hypothesis for m in table.moves}, {})} == {
        "lr",
        "gens",
    }
    hurt = [_row(2, Verdict.FLAT, lr=1e-6).replace(delta=-0.01)]
    assert moves.momentum(table, hurt, start, {m.hypothesis for m in table.moves}, {}) == []
    overshot = [
        _row(2, Verdict.FLAT, lr=1e-6).replace(delta=0.03),
        _row(3, Verdict.REGRESSED, lr=1e-5).replace(delta=-0.2),
    ]
    assert [m.key for m in moves.momentum(table, overshot, start, {m.hypothesis for m in table.moves}, {})] == ["lr"]


def test_chain_start_is_the_last_step_that_did_not_overshoot():
    links = [_row(2, Verdict.FLAT, lr=1e-6), _row(3, Verdict.IMPROVED, lr=1e-5), _row(4, Verdict.REGRESSED, lr=1e-4)]
    start = moves.chain_start(links)
    assert start is not None and start.number == 3
    assert moves.chain_start([_row(2, Verdict.CRASH, lr=1e-6)]) is None


def test_steps_taken_counts_each_key_against_the_point_before():
    start = {"lr": 1e-7, "gens": 2}
    links = [
        _row(2, Verdict.FLAT, lr=1e-6, gens=8),
        _row(3, Verdict.FLAT, lr=1e-5, gens=8),
        _row(4, Verdict.REGRESSED, lr=1e-4, gens=8),
        _row(5, Verdict.FLAT, lr=3e-5, gens=8),
    ]
    assert moves.steps_taken(links, start) == {"lr": 4, "gens": 1}


TABLE = MoveTable.model_validate(
    {
        "moves": [
            {"symptom": "zero_std_groups", "key": "gens", "factor": 4, "max_steps": 2, "hypothesis": "h05"},
            {"symptom": "flat_learning", "key": "lr", "factor": 10, "max_steps": 2, "hypothesis": "h13"},
            {"symptom": "instability", "key": "lr", "factor": 0.1, "max_steps": 3, "hypothesis": "h14"},
        ],
        "exploit": {"ratio": 4},
        "gallop": {"share": 0.25, "power": 2},
    }
)
CORE = {"flat_learning", "zero_std_groups"}


def test_applicable_rows_fire_together_one_per_key_on_the_bottleneck_only():
    rows = moves.applicable(TABLE, {"flat_learning", "zero_std_groups", "instability"}, CORE, {"h05", "h13", "h14"}, {})
    assert [m.hypothesis for m in rows] == ["h05", "h13"]  # instability is not on this bottleneck
    unstable = moves.applicable(TABLE, {"instability", "zero_std_groups"}, {"instability"}, {"h05", "h13", "h14"}, {})
    assert [m.hypothesis for m in unstable] == ["h14"]  # zero-std groups of a collapsed run are a consequence


def test_applicable_respects_max_steps_and_the_library():
    assert [m.key for m in moves.applicable(TABLE, CORE, CORE, {"h05", "h13"}, {"lr": 2})] == ["gens"]
    assert moves.applicable(TABLE, CORE, CORE, {"h99"}, {}) == []


def test_next_move_steps_every_row_at_once():
    rows = moves.applicable(TABLE, CORE, CORE, {"h05", "h13"}, {})
    values, applied = moves.next_move(rows, {"lr": 1e-7, "gens": 2}, {"lr": LR, "gens": GENS}, lambda p: False)
    assert values == {"gens": 8, "lr": pytest.approx(1e-6)} and len(applied) == 2


def test_next_move_bisects_once_when_the_full_step_was_tried():
    rows = [TABLE.moves[1]]
    full = {"lr": pytest.approx(1e-4)}
    tried = [{"lr": 1e-4}]
    values, _ = moves.next_move(
        rows, {"lr": 1e-5}, {"lr": LR}, lambda p: any(p["lr"] == pytest.approx(t["lr"]) for t in tried)
    )
    assert values != full and values["lr"] == 3.16e-5  # 1e-5 x sqrt(10), as a person writes it
    tried.append({"lr": 3.16e-5})
    assert (
        moves.next_move(rows, {"lr": 1e-5}, {"lr": LR}, lambda p: any(p["lr"] == pytest.approx(t["lr"]) for t in tried))
        is None
    )


def test_recentre_makes_relative_ranges_two_sided_around_the_incumbent():
    search = {
        "lr": HypothesisParam(scale=(1.5, 100.0), log=True),
        "kl_coef": HypothesisParam(scale=(0.0, 1.0)),
        "eps_clip": HypothesisParam(low=0.1, high=0.3),
    }
    out = moves.recentre(search, {"lr": 1e-5, "kl_coef": 0.0, "eps_clip": 0.2}, 4.0)
    assert out["lr"].scale == (0.25, 4.0)
    assert out["kl_coef"].scale == (0.0, 1.0)  # incumbent 0: nothing to centre on
    assert out["eps_clip"] == search["eps_clip"]


def test_a_relative_integer_range_stays_inside_the_recipes_choices():
    space = _clip("gens", SearchParam(low=8, high=32, int=True), GENS)
    assert space.choices == [8, 16]
    assert _clip("gens", SearchParam(low=20, high=32, int=True), GENS).choices == [16]


def test_move_rows_are_validated():
    with pytest.raises(ValueError):
        Move(symptom="flat_learning", key="lr", factor=0, max_steps=1, hypothesis="h13")
    with pytest.raises(ValueError):
        MoveTable.model_validate({"moves": [], "exploit": {"ratio": 4}, "extra": 1})


def test_a_step_that_did_nothing_is_followed_by_a_galloping_one():
    """lr 1e-7 -> 1e-6 moved nothing measurable (+0.004 inside +-0.045): the next step is x100, not x10; a step
    that helped within the noise (+0.035), a step that was not flat, or a missing interval keeps x10."""
    g = TABLE.gallop
    assert moves.no_effect(Trial(verdict=Verdict.FLAT, delta=0.004, ci_low=-0.041, ci_high=0.049), g)
    assert not moves.no_effect(Trial(verdict=Verdict.FLAT, delta=0.035, ci_low=-0.01, ci_high=0.08), g)
    assert not moves.no_effect(Trial(verdict=Verdict.IMPROVED, delta=0.001, ci_low=0.0005, ci_high=0.002), g)
    assert not moves.no_effect(Trial(verdict=Verdict.FLAT, delta=0.0, ci_low=None, ci_high=None), g)
    assert not moves.no_effect(None, g)
    rows = [r for r in TABLE.moves if r.symptom == "flat_learning"]
    far, _ = moves.next_move(rows, {"lr": 1e-6}, {"lr": LR}, lambda p: False, first=g.power)
    assert far == {"lr": pytest.approx(1e-4)}
    tried = moves.next_move(rows, {"lr": 1e-6}, {"lr": LR}, lambda p: p["lr"] == pytest.approx(1e-4), first=g.power)
    assert tried[0] == {"lr": pytest.approx(1e-5)}  # the x100 point was tried: the plain step


def test_a_stepped_value_is_written_as_a_person_writes_it():
    assert 5e-07 * 10 * 10 != 5e-05  # the float edge that was committed as lr: 4.9999999999999996e-05
    assert moves.step(5e-07, 10.0, LR) == 5e-06 and moves.step(moves.step(5e-07, 10.0, LR), 10.0, LR) == 5e-05
    assert moves.step(5e-05, 10**0.5, LR) == 0.000158
    assert moves.step(1e-6, 10**1.5, LR) == 3.16e-05
    assert moves.step(8, 4.0, None) == 32  # integers stay integers
