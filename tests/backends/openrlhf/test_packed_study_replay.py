"""Four trials packed on each H200 (`gpus_per_trial: 0.25`, `--parallel 4`), one study per card and search seed, on
a 4-GPU host (OpenRLHF 0.10.4, vLLM 0.22.1): the studies' output, ledger rows and the driver log of one of the four
trials whose vLLM engine died at start-up because a neighbour on the same card released memory while it measured.
The study that ran before the fix filed those four as the trial's own code and put their region off limits."""

from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

import yaml

from autorl.data import shipped
from autorl.judge.triage import classify, decide_action
from autorl.ledger import Ledger
from autorl.recipe import validate_recipe
from autorl.search.proposer import Proposer
from autorl.study.controller import RunOptions
from autorl.workspace import Workspace
from tests.conftest import run_cli

RUN = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "small" / "packed4"


def _crash():
    return classify((RUN / "shared-gpu-crash-train.log").read_text(errors="replace"), exit_code=1)


def test_a_neighbour_releasing_memory_is_a_shared_gpu_crash():
    d = _crash()
    assert d.category == "shared_gpu" and "Error in memory profiling" in d.root_cause_line
    assert "pack fewer trials per GPU" in d.remedy


def test_it_is_retried_and_never_puts_the_values_off_limits(tmp_path):
    d = _crash()
    first = decide_action(d, is_baseline=False, retries_so_far=0, signature_count=4, run_dir=tmp_path)
    again = decide_action(d, is_baseline=False, retries_so_far=1, signature_count=5, run_dir=tmp_path)
    assert (first.kind, first.avoid_region) == ("retry_once", False)
    assert (again.kind, again.avoid_region) == ("record", False) and "no more proposals" not in again.reason
    baseline = decide_action(d, is_baseline=True, retries_so_far=0, signature_count=1, run_dir=tmp_path)
    assert baseline.kind == "retry_once"  # a baseline that met a neighbour is run again, the study goes on


def _rows(db: Path) -> list[dict]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    return [dict(r) for r in conn.execute("SELECT * FROM autorl_trials ORDER BY number")]


def test_all_four_crashes_of_the_packed_study_were_this(tmp_path):
    crashes = [r for r in _rows(RUN / "seed0-ledger.sqlite") if r["verdict"] == "crash"]
    assert [r["number"] for r in crashes] == [5, 8, 9, 10]
    assert {r["crash_category"] for r in crashes} == {"user_code_error"}  # as the study filed them
    assert {classify(r["root_cause"], exit_code=1).category for r in crashes} == {"shared_gpu"}
    assert "signature seen 3 times: no more proposals near it" in (RUN / "q0-study.log").read_text()


def _view(tmp_path: Path, relabel: bool):
    tmp_path.mkdir()
    db = tmp_path / "ledger.sqlite"
    shutil.copy(RUN / "seed0-ledger.sqlite", db)
    if relabel:  # what the fixed triage files these crashes as
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE autorl_trials SET crash_category = 'shared_gpu' WHERE verdict = 'crash'")
    assert run_cli("init", str(tmp_path / "ws")).returncode == 0
    recipe = validate_recipe(yaml.safe_load(shipped("recipes/openrlhf-small.yaml").read_text()))
    ledger = Ledger(db)
    return Proposer(
        Workspace.open(tmp_path / "ws"),
        ledger,
        ledger.study(study_id=1),
        recipe,
        RunOptions(strategy="hypotheses", seed=0),
    ).view, recipe


def test_the_learning_rate_next_to_those_crashes_stays_open(tmp_path):
    """lr 1.3e-5 sits next to the crashed 1.22e-5 (gens 8) and 1.44e-5 (gens 16): off limits while the crashes
    read as the values' fault, open once they read as the neighbour's."""
    near = {"lr": 1.3e-5, "gens": 16, "eps_clip": 0.2, "kl_coef": 0.0}
    view, recipe = _view(tmp_path / "as-filed", relabel=False)
    assert view._near_repeated_crash(recipe.search, near) is not None
    view, recipe = _view(tmp_path / "fixed", relabel=True)
    assert view._near_repeated_crash(recipe.search, near) is None


def _confirmed(log: str) -> list[tuple[float, float, float]]:
    pattern = r"confirmed by 3 fresh-seed runs \(gain ([+-][\d.]+), 97\.5% CI \[([+-][\d.]+), ([+-][\d.]+)\]\)"
    return [tuple(map(float, m)) for m in re.findall(pattern, log)]


def test_both_search_seeds_confirmed_a_gain_on_one_card_each():
    for name, trials in (("q0", 18), ("q1", 16)):
        log = (RUN / f"{name}-study.log").read_text()
        gains = _confirmed(log)
        assert gains and all(low > 0 for _, low, _ in gains), name
        assert re.search(rf"{trials} trials in 7\d\d s", log), name
    rows = _rows(RUN / "seed0-ledger.sqlite")
    base = [r["objective"] for r in rows if r["proposer"] == "baseline"]
    runs = [r["objective"] for r in rows if r["confirms"] == 6]
    assert len(base) == 4 and len(runs) == 3
    gain = sum(runs) / 3 - sum(base) / 4  # the confirmation's gain is the mean of the fresh runs over the baseline's
    assert abs(gain - _confirmed((RUN / "q0-study.log").read_text())[0][0]) < 1e-3


def test_the_crash_groups_show_the_line_without_its_colour_codes(tmp_path):
    """Ray colours its actor prefixes; the ledger keeps the line as the log has it (to find it again there), and
    what a person reads, `autorl triage` and the report's crash table, has the codes taken out."""
    from autorl.present.review import crash_groups

    db = tmp_path / "ledger.sqlite"
    shutil.copy(RUN / "seed0-ledger.sqlite", db)
    stored = {r["root_cause"] for r in _rows(db) if r["verdict"] == "crash"}
    assert all("\x1b[36m" in line for line in stored)
    (group,) = crash_groups(Ledger(db))
    assert group["count"] == 4 and "\x1b" not in group["root_cause_line"]
    assert group["root_cause_line"].startswith("(RolloutRayActor pid=")
