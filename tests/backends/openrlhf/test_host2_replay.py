"""Half an hour on a 2 x H200 host (OpenRLHF 0.10.4, vLLM 0.22.1, Ray 2.55), as real OpenRLHF and autorl wrote it:
four trials packed on card 0 (`gpus_per_trial: 0.25`), then `autorl promote --parallel 4` of its best trial (four
re-validation runs at once on that card, then a 32-step full run); on card 1 a controller killed with -9 under two
packed jobs and its resume, the packed placement test, and a one-trial-a-card study of another workspace started
after the first (the machine's shared compile caches warm). autorl reads them as they are."""

from __future__ import annotations

import json
from pathlib import Path

from autorl.data import shipped
from autorl.judge import verdict
from autorl.judge.evidence import runs_of
from autorl.judge.triage import classify, decide_action
from autorl.metrics import RunMetrics, iter_records
from autorl.recipe import load_recipe
from tests.backends.openrlhf.test_host4_replay import ledger_rows

RUN = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "small" / "host2"
LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"


def _rows(name: str) -> list[dict]:
    return ledger_rows(RUN / name)


def revalidation(run: Path, number: int) -> tuple[list[float], list[float], str]:
    """Promote's fresh-seed runs of trial ``number`` and of the baseline (seeds 10000 and 10007, paired over the
    500 ID items) judged again: their values, and whether the verdict and interval are the ones promote printed
    (``promote.log``)."""
    recipe = load_recipe(shipped("recipes/openrlhf-small.yaml"))
    side = lambda name: runs_of(
        [
            RunMetrics(iter_records(run / f"revalidate-{number:02d}-{name}-s{s}-eval.jsonl"))  # noqa: E731
            for s in (10000, 10007)
        ],
        recipe,
    )
    fresh, parent = side("trial"), side("base")
    v = verdict.judge(fresh, parent, recipe.verdict, recipe.objective.direction)
    printed = f"{v.verdict}, {v.delta:+.3f} (95% interval [{v.ci_low:+.3f}, {v.ci_high:+.3f}])"
    return fresh.values, parent.values, printed if printed in (run / "promote.log").read_text() else f"not {printed}"


def test_the_four_revalidation_runs_judge_as_promote_printed():
    """The two fresh-seed runs of trial 06 against two of the baseline: improved, as `autorl promote` said on the
    GPU."""
    fresh, parent, printed = revalidation(RUN, 6)
    assert (fresh, parent) == ([0.542, 0.552], [0.474, 0.476]) and printed.startswith("improved, +0.072")


def test_the_full_run_is_in_the_ledger_with_its_branch_and_its_weights_were_on_disk():
    full = next(r for r in _rows("q1-ledger.sqlite") if r["kind"] == "full")
    assert (full["promoted_from"], full["status"], full["objective"]) == (6, "complete", 0.59)
    assert full["branch"] == full["attempt"] == "attempt-15-full-h13-lr-1-22em05"
    assert "model.safetensors" in (RUN / "full-weights.txt").read_text()
    # the ledger row lost the monitor's pid to the Ray job's None, so `status` said NOT RUNNING while it ran
    assert full["pid"] is None and "step 11  NOT RUNNING" in (RUN / "promote-status.txt").read_text()


def test_the_packed_kv_cache_crash_filed_as_oom_is_now_retried_unchanged(tmp_path):
    """Trial 02 (a baseline repeat, four trials starting together on one card) was filed cuda_oom and retried with
    micro_train_batch_size halved, which cannot give vLLM room that it measures before the actor loads; its retry
    died of the neighbours (shared_gpu). Read again now: shared_gpu, retried unchanged, no region avoided."""
    rows = {r["number"]: r for r in _rows("q1-ledger.sqlite")}
    assert rows[2]["crash_category"] == "cuda_oom" and rows[5]["retry_of"] == rows[2]["id"]
    assert json.loads(rows[5]["changed"]) == {"micro_train_batch_size": 32, "seed": 1}  # seed: the repeat's own
    d = classify((LOGS / "kv_cache_no_room_packed.log").read_text(), exit_code=1)
    assert (d.engine, d.category) == ("openrlhf", "shared_gpu")
    first = decide_action(d, is_baseline=True, retries_so_far=0, signature_count=1, run_dir=tmp_path)
    assert (first.kind, first.avoid_region) == ("retry_once", False)


def _after_first_wave(rows: list[dict]) -> tuple[int, int, float]:
    """Trials that ended after the study's first wave, how many of them ran to the end, and the seconds from the
    first wave's end to the last trial's."""
    trials = [r for r in rows if r["kind"] == "trial"]
    first = [r for r in trials if r["started"] - trials[0]["started"] < 5]
    wave_end = max(r["finished"] for r in first)
    later = [r for r in trials if r["finished"] > wave_end]
    return len(later), sum(r["status"] == "complete" for r in later), max(r["finished"] for r in later) - wave_end


def test_the_throughput_figures_in_the_docs_come_from_these_ledgers():
    packed, packed_done, packed_s = _after_first_wave(_rows("q1-ledger.sqlite"))
    alone, alone_done, alone_s = _after_first_wave(_rows("p1-ledger.sqlite"))
    assert (packed, packed_done, round(packed_s)) == (9, 7, 378)
    assert (alone, alone_done, round(alone_s)) == (1, 1, 166)
    per_hour = lambda n, s: 3600 * n / s  # noqa: E731
    assert round(per_hour(packed_done, packed_s) / per_hour(alone_done, alone_s), 1) == 3.1


def test_the_second_studys_first_trial_started_as_fast_as_warm_trials():
    """The compile caches are the machine's: p1 (another workspace, started after q1's first wave) reached its first
    step as soon as q1's later trials did, a minute sooner than q1's own first wave."""
    q1 = [r for r in _rows("q1-ledger.sqlite") if r["kind"] == "trial" and r["first_step"]]
    cold = [r["first_step"] - r["started"] for r in q1 if r["started"] - q1[0]["started"] < 5]
    warm = [r["first_step"] - r["started"] for r in q1 if r["started"] - q1[0]["started"] >= 5]
    p1 = _rows("p1-ledger.sqlite")[0]
    second = p1["first_step"] - p1["started"]
    assert min(cold) - second > 60 and second <= max(warm)
