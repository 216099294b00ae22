"""One hour on a 4 x H200 host (OpenRLHF 0.10.4, vLLM 0.22.1, Ray 2.55), as real OpenRLHF and autorl wrote it:
a trial in the split layout (actor on one card, vLLM engine on another), `--parallel 1`, `--parallel 3` and
`--parallel 4` studies of the small recipe with one card a trial, a study whose card another process had filled,
and nvidia-smi's samples of every card once a second. autorl reads them as they are."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from autorl.backends.openrlhf.metrics import OpenRLHFMetricsReader
from autorl.backends.openrlhf.phases import marks, read_times
from autorl.judge.triage import classify, decide_action
from tests.backends.openrlhf.test_gpu_study import _GpuSampler

RUN = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "small" / "host4"
LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"


def ledger_rows(path: Path) -> list[dict]:
    """A ledger's trials in order, read-only (the files in tests/data stay as the GPU host wrote them)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    return [dict(r) for r in conn.execute("SELECT * FROM autorl_trials ORDER BY number")]


def _rows(name: str) -> list[dict]:
    return ledger_rows(RUN / name)


def _samples(start: str, end: str) -> _GpuSampler:
    return gpu_samples(RUN / "gpu-samples.csv.gz", start, end)


def gpu_samples(path: Path, start: str, end: str) -> _GpuSampler:
    """The recorded nvidia-smi samples (a gzipped CSV) between two wall-clock times (HH:MM:SS), read into the
    placement tests' sampler (one {card: MiB in use} per second)."""
    by_time: dict[str, dict[str, float]] = defaultdict(dict)
    with gzip.open(path, "rt") as f:
        for line in f:
            stamp, card, _, used = (p.strip() for p in line.split(","))
            if start <= stamp[11:19] <= end:
                by_time[stamp[11:19]][card] = float(used.split()[0])
    sampler = _GpuSampler()
    sampler.samples = list(by_time.values())
    return sampler


# ---- the split layout ---------------------------------------------------------------------------------------------


def test_the_split_trial_asked_for_its_own_cards_and_trained():
    plan = (RUN / "split-plan.txt").read_text()
    assert "--train.colocate_all" not in plan and "--vllm.enable_sleep" not in plan
    assert "--vllm.num_engines 1" in plan and "--actor.num_gpus_per_node 1" in plan
    reader = OpenRLHFMetricsReader(None, None, stdout_path=RUN / "split-train.log")
    steps = reader.poll() + reader.flush()
    assert [s["step"] for s in steps] == list(range(1, 17))
    rec = json.loads((RUN / "split-eval.jsonl").read_text().splitlines()[-1])
    assert len(rec["eval/id/items"]) == 500 and rec["eval/id/greedy_pass@1"] == pytest.approx(0.476)


def test_the_actor_and_the_vllm_engine_held_two_cards_at_once():
    """The trial's head was given cards 1 and 2: both held memory at the same moments, vLLM's card its 0.15 share
    of the 139.8 GiB (about 21 GiB) and the actor's a few GiB."""
    samples = _samples("21:29:35", "21:33:19")
    assert samples.moments_together(["1", "2"]) >= 30
    peak = {c: max(s.get(c, 0.0) for s in samples.samples) for c in ("1", "2")}
    assert peak["1"] > 20_000 and 1024 < peak["2"] < 10_000


def test_in_the_split_layout_vllm_and_the_actor_start_side_by_side():
    """Not colocated, nothing sleeps: the `vllm` phase holds both engines' start, `actor` is the second before the
    first generation."""
    got = marks((RUN / "split-train.log").read_text(errors="replace"), read_times(RUN / "split-train.log.times"))
    assert list(got) == ["driver", "vllm", "actor", "training", "save"]
    assert got["actor"] - got["vllm"] > 60 and got["training"] - got["actor"] < 5
    assert 30 <= got["save"] - got["training"] <= 60


# ---- one trial a card, 1, 3 and 4 at once ------------------------------------------------------------------------


def test_a_wave_on_three_cards_takes_as_long_as_one_trial_alone():
    """The first (cold) wave: three trials on three cards took 270-272 s each, the single study's first trial 271 s;
    its later (warm) trials 191 and 198 s."""
    three, one = _rows("p3-ledger.sqlite"), _rows("p1-ledger.sqlite")
    assert [r["status"] for r in three] == ["complete"] * 3
    starts = [r["started"] for r in three]
    assert max(starts) - min(starts) < 2
    walls = [r["finished"] - r["started"] for r in three]
    assert all(265 <= w <= 280 for w in walls)
    alone = [r["finished"] - r["started"] for r in one]
    assert abs(alone[0] - sum(walls) / 3) < 10 and all(w < 205 for w in alone[1:])


def test_four_trials_held_the_four_cards_together():
    rows = _rows("p4-ledger.sqlite")
    assert len(rows) == 4 and max(r["started"] for r in rows) - min(r["started"] for r in rows) < 2
    assert _samples("21:47:38", "21:53:00").moments_together(["0", "1", "2", "3"]) >= 100
    log = (RUN / "p4-study.log").read_text()
    assert re.search(r"attempt-03-baseline-seed2 step 16/16 .* eval 0\.478 \(budget used 5m01s", log)
    assert all(r["status"] == "budget-cut" for r in rows)  # a 5-minute budget holds no more than the cold wave


# ---- a card another process had filled ---------------------------------------------------------------------------


def test_a_card_full_before_the_trial_is_a_shared_gpu_crash_now():
    rows = _rows("oom-ledger.sqlite")
    assert [r["crash_category"] for r in rows] == ["cuda_oom", "cuda_oom"]  # as the study filed them
    assert "retry of an out-of-memory crash with micro_train_batch_size=32" in (RUN / "oom-study.log").read_text()
    assert "region avoided after repeats" in (RUN / "oom-triage-as-filed.txt").read_text().replace("\n", " ")
    d = classify((LOGS / "gpu_occupied_vllm_start.log").read_text(errors="replace"), exit_code=1)
    assert d.category == "shared_gpu" and "(3.67/139.8 GiB)" in d.root_cause_line
    assert d.root_cause_line.rstrip() == rows[0]["root_cause"].rstrip()


def test_it_is_retried_unchanged_and_the_baselines_region_stays_open(tmp_path):
    d = classify((LOGS / "gpu_occupied_vllm_start.log").read_text(errors="replace"), exit_code=1)
    first = decide_action(d, is_baseline=True, retries_so_far=0, signature_count=1, run_dir=tmp_path)
    again = decide_action(d, is_baseline=True, retries_so_far=1, signature_count=2, run_dir=tmp_path)
    assert (first.kind, first.avoid_region) == ("retry_once", False)
    assert (again.kind, again.avoid_region) == ("record", False) and "no more proposals" not in again.reason
