"""Replays of real warm pools: four pools on one H200, OpenRLHF 0.10.4, recipes/openrlhf-small.yaml packed four to
the card, 16 trials (tests/data/openrlhf-0.10.4/warm-aa, README there). Today's slicing and phase code read the
pools' own logs: each trial's slice, its phases, the engines' reset lines."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

import pytest

from autorl.backends.openrlhf.phases import START_UP, phases
from autorl.backends.openrlhf.warm import slice_times, trial_slice

DATA = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "warm-aa"
POOLS = sorted((DATA / "pools").iterdir())
RESET = re.compile(r"^autorl warm: engine 0 (\{.*\})$", re.MULTILINE)


def pool_log(pool: Path) -> tuple[str, list[tuple[int, float]]]:
    text = gzip.open(pool / "pool.log.gz", "rt").read()
    times = [
        (int(o), float(t))
        for o, t in (line.split("\t") for line in (pool / "pool.log.times").read_text().split("\n") if line)
    ]
    return text, times


def trials(pool: Path) -> list[tuple[str, dict]]:
    done = [(p.stem, json.loads(p.read_text())) for p in (pool / "done").glob("*.json")]
    return sorted(done, key=lambda d: d[1]["index"])


@pytest.fixture(scope="module")
def sliced() -> dict[str, dict]:
    """Every trial: its pool, index, slice text and phases (the pool log's own arrival times)."""
    out = {}
    for pool in POOLS:
        text, times = pool_log(pool)
        after = 0
        for name, verdict in trials(pool):
            start, end = trial_slice(text, name, verdict["index"] == 0, after)
            assert start is not None and end is not None, name
            stamps = slice_times(times, start, end, start)
            part = text[start:end]
            out[name] = {
                "pool": pool.name,
                "index": verdict["index"],
                "text": part,
                "phases": phases(part, stamps, stamps[0][1], stamps[-1][1]),
                "seconds": verdict["seconds"],
                "code": verdict["code"],
            }
            after = end
    return out


def test_every_trial_ran_in_its_pool_in_order_and_owns_one_slice(sliced):
    assert len(POOLS) == 4 and len(sliced) == 16
    for name, t in sliced.items():
        assert t["code"] == 0
        assert t["text"].rstrip().endswith(f"AUTORL-WARM {name} end code=0")
        others = set(re.findall(r"^AUTORL-WARM (\S+) begin", t["text"], re.MULTILINE)) - {name}
        assert not others, (name, others)
        run = json.loads((DATA / "runs" / name / "warm.json").read_text())
        assert (run["pool"], run["index"]) == (t["pool"], t["index"])
    # every measured baseline run followed a trial at lr 1e-4 in the same pool
    assert {t["index"] for n, t in sliced.items() if n.startswith("warm-")} == {1, 3}


def test_a_pools_first_trial_pays_the_start_up_and_the_later_ones_do_not(sliced):
    first = [t["phases"] for t in sliced.values() if t["index"] == 0]
    later = [t["phases"] for t in sliced.values() if t["index"] > 0]
    assert len(first) == 4 and len(later) == 12
    for p in first:  # the job's runtime env and imports, the engine's start: a cold trial's start-up
        assert p["driver"] > 10 and p["vllm"] > 30
    for p in later:
        assert p["driver"] + p["vllm"] < 2  # the engine's reset: wake, reload, reseed, sleep
        assert 15 < p["actor"] < 35 and p["training"] > 40
    assert statistics.median(sum(p[k] for k in START_UP if k != "submit") for p in later) < 30
    assert statistics.median(sum(p[k] for k in START_UP) for p in first) > 80


def test_the_servers_own_clock_agrees_with_the_log_cut(sliced):
    for t in sliced.values():
        assert abs(t["seconds"]["actor"] - t["phases"]["actor"]) < 2.5
        assert abs(t["seconds"]["fit"] - t["phases"]["training"]) < 2.5


def test_every_reset_reloaded_the_base_weights_and_reseeded_the_engine(sliced):
    digests = set()
    for name, t in sliced.items():
        found = [json.loads(m) for m in RESET.findall(t["text"])]
        assert len(found) == 1, name
        state = found[0]
        assert state["unfinished"] == 0 and state["cache_reset"] is True
        seed = int(name.split("-")[1]) + (1000 if name.startswith("poison") else 0)
        assert state["seed"] == seed  # engine 0 gets the trial's seed, as a fresh engine does
        digests.update(state["digest"])
    assert len(digests) == 1  # after trials at lr 1e-4, every reload gave back the first load's weights


def test_the_measured_runs_read_as_the_base_recipe_whatever_ran_before_them():
    """The lr 1e-4 trials moved the model (ID 0.20-0.48); the lr 1e-6 runs after them in the same pools agree
    within a few items of 500, as runs of one recipe from the base weights do."""

    def id_pass(name: str) -> float:
        rows = [json.loads(line) for line in (DATA / "runs" / name / "eval.jsonl").read_text().splitlines()]
        return rows[-1]["eval/id/greedy_pass@1"]

    poison = [id_pass(f"poison-{i}") for i in range(1, 9)]
    measured = [id_pass(f"warm-{i}") for i in range(1, 9)]
    assert max(poison) - min(poison) > 0.2
    assert max(measured) - min(measured) <= 0.01
