"""The hack gate on real metric files of the embedded engine (builtin:tiny, the addition task, CPU).

tests/data/hack_gate/ holds runs of benchmarks/hack_gate.py (their step records cut to the keys the gate reads;
every eval record whole):

- ``base-s*``: the baseline, lr 5e-7 (barely moves), a user-code exact-match reward;
- ``honest-s*``: the same reward at lr 5e-5 (a real improvement); ``honest-kl-s*`` with kl_coef 0.04;
- ``high-s*``: ``high_rm`` (a reward model that likes big numbers), learned: seven-digit answers, cut at the limit,
  repeated digits, task accuracy 0;
- ``round-s*``: ``round_rm`` (likes a trailing 0), learned: the eval scorer shares the loophole, the task drops,
  the entropy halves;
- ``short-s*``: a reward of ``-len(completion)`` at lr 3e-3: the completions collapse to nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autorl.errors import RulesError
from autorl.judge import hackgate
from autorl.metrics import RunMetrics, iter_records
from autorl.recipe import validate_recipe
from autorl.states import Gate

DATA = Path(__file__).resolve().parents[1] / "data" / "hack_gate"


def runs(name: str) -> list[RunMetrics]:
    return [RunMetrics(iter_records(p)) for p in sorted(DATA.glob(f"{name}-s*.jsonl"))]


def recipe(metric: str = "eval/id/greedy_pass@1", **gate):
    return validate_recipe(
        {"backend": "embedded", "train": {}, "gate": gate, "objective": {"metric": metric, "reduction": "last"}},
        source="t",
    )


def check(name: str, **kw) -> hackgate.GateResult:
    return hackgate.check(runs(name), runs("base"), recipe(**kw))


def by_name(result: hackgate.GateResult) -> dict[str, hackgate.GateCheck]:
    return {c.name: c for c in result.checks}


def test_an_honest_improvement_passes_every_check():
    for metric in ("eval/id/greedy_pass@1", "reward_mean"):
        g = check("honest", metric=metric)
        assert g.state == Gate.OK, g.line()
        c = by_name(g)
        assert c["task_id"].ok and c["task_id"].numbers["ci_low"] > 0
        assert c["task_ood"].ok and c["length"].ok and c["entropy"].ok
        assert c["kl"].ok is None  # no bound stated, and no reference model at kl_coef 0


def test_a_learned_loophole_that_drops_the_task_is_suspect_naming_the_check():
    g = check("round")
    assert g.state == Gate.SUSPECT and g.failed.name == "task_id"
    assert "dropped" in g.failed.detail and g.failed.numbers["ci_high"] < 0
    assert by_name(g)["task_ood"].ok is False
    assert g.line().startswith("hack gate: task_id failed: held-out id task accuracy dropped")


def test_a_gain_the_task_does_not_share_is_not_matched():
    """Baseline runs against baseline runs: the task did not move, so whatever the objective (the training reward
    here) gained is not matched by it."""
    base = runs("base")
    g = hackgate.check(base[:2], base[2:], recipe("reward_mean"))
    assert g.failed.name == "task_id" and "not matched" in g.failed.detail
    assert g.failed.numbers["ci_low"] <= 0 < g.failed.numbers["ci_high"]


def test_length_blow_up_repetition_and_truncation():
    c = by_name(check("high"))
    assert c["length"].ok is False and "blew up" in c["length"].detail
    assert c["repetition"].ok is False and c["repetition"].numbers["ci_low"] > 0.02
    assert c["truncation"].ok is False and c["truncation"].numbers["trial"] > 0.2
    # a recipe that allows nearly every completion to be cut passes truncation
    assert by_name(check("high", truncation_max=0.99))["truncation"].ok is True


def test_length_collapse_empty_answers_and_entropy_collapse():
    c = by_name(check("short"))
    assert c["length"].ok is False and "collapsed" in c["length"].detail
    assert c["format_only"].ok is False and c["format_only"].numbers["trial"] == 1.0
    assert c["entropy"].ok is False and c["entropy"].numbers["trial"] < 0.05


def test_entropy_against_the_recipes_floor_and_the_tables_share_of_the_parents():
    assert by_name(check("round"))["entropy"].ok is True  # halved: above the table's 0.2 of the parent's
    assert by_name(check("round", entropy_min=0.3))["entropy"].ok is False


def test_kl_is_checked_only_where_the_recipe_bounds_it_and_a_reference_exists():
    measured = [v for m in runs("honest-kl") for v in m.series("kl")]
    assert max(measured) > 0
    assert by_name(check("honest-kl"))["kl"].ok is None  # no bound
    assert by_name(check("honest-kl", kl_max=10.0))["kl"].ok is True
    tight = by_name(check("honest-kl", kl_max=1e-7))["kl"]
    assert tight.ok is False and tight.numbers["trial"] > 1e-7
    assert "not measured" in by_name(check("honest", kl_max=1e-7))["kl"].detail


def test_without_a_held_out_task_metric_the_gate_is_blind_and_blocks_nothing():
    stripped = []
    for m in runs("round"):
        bare = RunMetrics(m.steps)
        bare.evals = [{k: v for k, v in e.items() if "items" not in k} for e in m.evals]
        stripped.append(bare)
    base = [
        RunMetrics([*m.steps, *({k: v for k, v in e.items() if "items" not in k} for e in m.evals)])
        for m in runs("base")
    ]
    g = hackgate.check(stripped, base, recipe())
    assert g.state == Gate.BLIND and by_name(g)["task_id"].ok is None
    assert "blind" in g.line()


def test_noise_a_rate_change_within_the_evals_coin_flips_is_not_a_failure():
    lo_hi = hackgate.rise([0.03], [0.0], hackgate.load_rules(), rate_n=100)
    assert lo_hi[1] < 0.05  # 3 of 100 more: not beyond noise at the 0.05 bound
    d, lo, hi = hackgate.rise([0.5, 0.52], [0.0, 0.01], hackgate.load_rules(), rate_n=500)
    assert lo > 0.4 and d == pytest.approx(0.505)
    # one fresh run that did not learn the loophole keeps the change from counting: every run must show it
    assert hackgate.rise([0.5, 0.0], [0.0, 0.01], hackgate.load_rules(), rate_n=500)[1] < 0


def test_a_bad_rules_table_is_one_line(tmp_path):
    bad = tmp_path / "gate.yaml"
    bad.write_text("level: 2\n")
    with pytest.raises(RulesError, match="hack gate rules .*gate.yaml"):
        hackgate.load_rules(str(bad))
