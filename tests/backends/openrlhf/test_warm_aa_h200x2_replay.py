"""Replay of the warm A/A benchmark with both arms in one hour: recipes/openrlhf-small.yaml on one H200 of a 2-GPU host,
OpenRLHF 0.10.4, eight baseline runs in warm pools (each after a trial at lr 1e-4 in the same pool) against the same
eight seeds as cold jobs (tests/data/openrlhf-0.10.4/small/h200x2-warm-aa, README there).

The verdicts are computed again here from the runs' own per-item eval records and logged steps, by the study's
judge, rather than read from the benchmark's summary; the timings and the GPU share from the phase rows and the
one-second GPU samples the run kept."""

from __future__ import annotations

import csv
import gzip
import json
import statistics
from datetime import datetime, timezone
from pathlib import Path

import pytest

from autorl.backends.openrlhf.metrics import parse_step_line
from autorl.backends.openrlhf.phases import read_times
from autorl.data import shipped
from autorl.judge.verdict import Runs, judge
from autorl.metrics import RunMetrics, iter_records
from autorl.recipe import load_recipe
from autorl.states import Verdict

DATA = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "small" / "h200x2-warm-aa"
RECIPE = shipped("recipes/openrlhf-small.yaml")
SEEDS = range(1, 9)


@pytest.fixture(scope="module")
def summary() -> dict:
    return json.loads((DATA / "summary.json").read_text())


def runs(arm: str) -> list[RunMetrics]:
    return [RunMetrics(iter_records(DATA / "runs" / f"{arm}-{s}" / "eval.jsonl")) for s in SEEDS]


def steps(name: str) -> list[dict[str, float]]:
    """The run's logged steps, parsed from its driver log as a trial's are."""
    text = gzip.open(DATA / "runs" / name / "train.log.gz", "rt", errors="replace").read()
    return [r[1] for r in map(parse_step_line, text.splitlines()) if r]


def test_both_arms_ran_the_same_eight_seeds_to_the_end(summary):
    warm = {r["name"]: r for r in summary["warm_all"]}
    cold = {r["name"]: r for r in summary["cold"]}
    assert sorted(cold) == [f"cold-{s}" for s in SEEDS]
    assert all(r["status"] == "complete" for r in [*warm.values(), *cold.values()])
    held = {(r["warm"]["warm_pool"], r["warm"]["warm_index"]): name for name, r in warm.items()}
    assert len(held) == 16 and len({pool for pool, _ in held}) == 4
    for s in SEEDS:  # every measured warm run came right after an lr 1e-4 trial in its pool; no cold run had a pool
        pool, index = warm[f"warm-{s}"]["warm"]["warm_pool"], warm[f"warm-{s}"]["warm"]["warm_index"]
        assert held[(pool, index - 1)].startswith("poison-")
        assert cold[f"cold-{s}"]["warm"] == {}
        assert json.loads((DATA / "runs" / f"warm-{s}" / "warm.json").read_text())["index"] >= 1
        assert not (DATA / "runs" / f"cold-{s}" / "warm.json").exists()


@pytest.mark.parametrize("split", ["id", "ood"])
def test_the_studys_own_paired_test_reads_warm_against_cold_as_flat(split):
    recipe = load_recipe(RECIPE)
    arms = []
    for arm in ("warm", "cold"):
        items = [m.items(split) for m in runs(arm)]
        assert all(len(i) == 500 for i in items)
        arms.append(Runs(values=[statistics.fmean(i) for i in items], items=items))
    got = judge(arms[0], arms[1], recipe.verdict, recipe.objective.direction)
    assert got.verdict == Verdict.FLAT, got.explanation
    assert got.ci_low < 0 < got.ci_high and abs(got.delta) < 0.005
    # not the same runs twice: the seeds' evals differ item by item between the arms
    w, c = runs("warm"), runs("cold")
    assert any(a.items(split) != b.items(split) for a, b in zip(w, c, strict=True))


@pytest.mark.parametrize("key", ["reward", "policy_loss", "actor_grad_norm"])
def test_the_first_logged_steps_do_not_tell_warm_from_cold(key):
    recipe = load_recipe(RECIPE)
    warm = [steps(f"warm-{s}") for s in SEEDS]
    cold = [steps(f"cold-{s}") for s in SEEDS]
    assert all(len(r) == 16 for r in [*warm, *cold])
    for i in range(4):
        w, c = [r[i][key] for r in warm], [r[i][key] for r in cold]
        got = judge(Runs(values=w), Runs(values=c), recipe.verdict, "maximize")
        assert got.verdict == Verdict.FLAT, (i, key, got.explanation)
    # each engine drew its own trial's samples: no seed pair logged the same first-step reward
    assert sum(a[0]["reward"] == b[0]["reward"] for a, b in zip(warm, cold, strict=True)) == 0


def test_a_warm_trial_starts_in_under_30_s_and_trains_most_of_its_time(summary):
    later = [r for r in summary["warm_all"] if r["warm"]["warm_index"] >= 1]
    cold = summary["cold"]
    assert len(later) == 12
    ups = [r["start_up_s"] for r in later]
    assert statistics.median(ups) <= 30 and max(ups) < 35
    share = [(r["phases"]["training"] + r["phases"]["eval"]) / sum(r["phases"].values()) for r in later]
    assert min(share) >= 0.60
    assert statistics.median(r["start_up_s"] for r in cold) > 90  # the same trials as jobs of their own
    cold_share = [(r["phases"]["training"] + r["phases"]["eval"]) / sum(r["phases"].values()) for r in cold]
    assert max(cold_share) < 0.45


def test_warm_trials_per_gpu_hour_fall_short_of_twice_cold(summary):
    """The 2x target, measured in one hour on one card: 1.89x a trial, steady state; 1.37x over the whole arms,
    the four pools' first trials (219-229 s) included. What stands in the way is written in docs/warm-trials.md."""
    warm = statistics.median(r["wall_s"] for r in summary["warm_all"] if r["warm"]["warm_index"] >= 1)
    cold = statistics.median(r["wall_s"] for r in summary["cold"])
    assert 1.8 < cold / warm < 2.0
    arms = (16 / summary["warm_arm_s"]) / (8 / summary["cold_arm_s"])
    assert 1.3 < arms < 1.45


def samples() -> list[tuple[float, str, float]]:
    out = []
    with gzip.open(DATA / "gpu.csv.gz", "rt") as fh:
        for when, card, util, _mem in csv.reader(fh, skipinitialspace=True):
            t = datetime.strptime(when, "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
            out.append((t, card, float(util.rstrip(" %"))))
    return out


def busy(rows: list[tuple[float, str, float]], card: str, lo: float, hi: float) -> float:
    u = [x for t, c, x in rows if c == card and lo <= t <= hi]
    assert len(u) > 100
    return sum(x > 0 for x in u) / len(u)


def test_the_warm_arms_card_is_busy_over_half_the_time_and_the_cold_arms_is_not(summary):
    first = min(read_times(str(DATA / "runs" / f"poison-{s}" / "train.log") + ".times")[0][1] for s in SEEDS)
    cold_first = min(read_times(str(DATA / "runs" / f"cold-{s}" / "train.log") + ".times")[0][1] for s in SEEDS)
    rows = samples()
    warm = busy(rows, "1", first, first + summary["warm_arm_s"])
    cold = busy(rows, "1", cold_first, cold_first + summary["cold_arm_s"])
    assert warm > 0.50 > cold
    assert busy(rows, "1", first + 230, first + summary["warm_arm_s"]) > 0.65  # after the pools were built
