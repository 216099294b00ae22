"""Four trials packed on one H200 (`autorl run recipes/openrlhf-small.yaml --parallel 4 --set gpus_per_trial=0.25`,
OpenRLHF 0.10.4, vLLM 0.22.1), the same study twice on the same machine: before (``before/``) the trials' vLLM
engines measured the shared card at start and two baseline repeats died, twice each, so the study ended after
4.7 minutes; after (``after/``) each engine was given a fixed KV-cache share
(``autorl.backends.openrlhf.vllm_share``): 12 of 12
trials ran, lr 1e-5 was confirmed within 11 minutes, and `autorl promote` re-validated it and ran its full run
with checkpoint evals and saved weights. benchmarks/README.md, "Packed trials without vLLM's memory measurement".
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import yaml

from autorl.backends.openrlhf.vllm_share import fraction_for
from autorl.data import shipped
from autorl.judge.triage import classify
from autorl.ledger import Ledger
from autorl.recipe import validate_recipe
from autorl.search.proposer import Proposer
from autorl.study.controller import RunOptions
from autorl.workspace import Workspace
from tests.conftest import run_cli

RUN = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "small" / "h200-kvshare"
H200_MIB = 143771  # nvidia-smi's memory.total of the card


def _rows(db: Path) -> list[dict]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    return [dict(r) for r in conn.execute("SELECT * FROM autorl_trials ORDER BY number")]


def _recipe():
    return validate_recipe(yaml.safe_load(shipped("recipes/openrlhf-small.yaml").read_text()))


def test_before_two_baseline_repeats_died_measuring_the_shared_card():
    for log, line in (
        ("profiling-crash-train.log", "Error in memory profiling"),
        ("no-kv-room-train.log", "No available memory for the cache blocks"),
    ):
        d = classify((RUN / "before" / log).read_text(errors="replace"), exit_code=1)
        assert d.category == "shared_gpu" and line in d.root_cause_line, log
    rows = _rows(RUN / "before" / "q0-ledger.sqlite")
    assert [r["status"] for r in rows] == ["complete"] * 2 + ["crash"] * 4
    assert {r["crash_category"] for r in rows[2:]} == {"shared_gpu"}
    assert "6 trials in 279 s; ended: the baseline failed" in (RUN / "before" / "study.log").read_text()


def test_that_baseline_now_goes_on_with_a_fresh_seed(tmp_path):
    """Replayed on today's proposer: two complete and two lost to the neighbours is a baseline still being
    measured; the next run is a baseline with a seed none of the lost ones had."""
    db = tmp_path / "q0-ledger.sqlite"
    shutil.copy(RUN / "before" / "q0-ledger.sqlite", db)
    assert run_cli("init", str(tmp_path / "ws")).returncode == 0
    ledger = Ledger(db)
    proposer = Proposer(
        Workspace.open(tmp_path / "ws"),
        ledger,
        ledger.study(study_id=1),
        _recipe(),
        RunOptions(strategy="hypotheses", seed=0, parallel=4),
    )
    assert not proposer.baseline_failed() and proposer.baseline_runs_missing() == 1
    p = proposer.next()
    assert p is not None and p.proposer == "baseline" and p.values == {"seed": 4}


def test_with_the_share_every_engine_skipped_the_measurement_and_every_trial_ran():
    log = (RUN / "after" / "baseline-train.log").read_text(errors="replace")
    share = float(fraction_for(_recipe().params.vllm_gpu_memory_utilization))
    assert f"reserved {share * H200_MIB / 1024:.2f} GiB memory for KV Cache" in log  # 10.53 GiB: 0.075 of the card
    assert "skipped memory profiling" in log and "Error in memory profiling" not in log
    rows = _rows(RUN / "after" / "q0-ledger.sqlite")
    assert len(rows) == 13 and {r["status"] for r in rows} == {"complete"}
    assert (rows[4]["verdict"], rows[4]["confirmation"]) == ("improved", "confirmed")
    assert (
        "05  improved (confirmed)  objective 0.5460  Δ +0.0720 [+0.028, +0.116]"
        in (RUN / "after" / "bench.log").read_text()
    )


def _objective(name: str) -> float:
    (record,) = [json.loads(line) for line in (RUN / "after" / name).read_text().splitlines()]
    return record["eval/id/greedy_pass@1"]


def test_promote_revalidated_the_confirmed_trial_and_its_full_run_saved_weights():
    trial = [_objective(f"revalidate-05-trial-s{s}-eval.jsonl") for s in (10000, 10007)]
    base = [_objective(f"revalidate-05-base-s{s}-eval.jsonl") for s in (10000, 10007)]
    gain = sum(trial) / 2 - sum(base) / 2
    status = (RUN / "after" / "promote-status.txt").read_text()
    shown = re.search(r"Re-validated by promote: ([+-][\d.]+) \[([+-][\d.]+), ([+-][\d.]+)\]", status)
    assert shown and abs(float(shown[1]) - gain) < 5e-4 and float(shown[2]) > 0
    assert "re-validating, 4 runs, 4 at once" in status and "running attempt-13-full" in status
    assert "weights: /tmp/ws-q0/.autorl/runs/attempt-13-full-move-lr-1em05/model" in status
    conn = sqlite3.connect(RUN / "after" / "q0-ledger.sqlite")
    full = conn.execute("SELECT id, kind, status, objective FROM autorl_trials WHERE number = 13").fetchone()
    assert full[1:] == ("full", "complete", 0.58)
    evals = conn.execute(
        "SELECT step, data FROM autorl_metrics WHERE trial_id = ? AND type = 'eval' ORDER BY step", [full[0]]
    ).fetchall()
    ids = [json.loads(d)["eval/id/greedy_pass@1"] for _, d in evals]
    assert [s for s, _ in evals] == [8, 16, 24, 32] and ids == sorted(ids) and ids[-1] == 0.58
    kinds = [k for (k,) in conn.execute("SELECT kind FROM autorl_events ORDER BY id")]
    assert kinds.count("revalidation-run") == 4
    assert kinds.index("full-run-launched") > max(i for i, k in enumerate(kinds) if k == "revalidation-run")
