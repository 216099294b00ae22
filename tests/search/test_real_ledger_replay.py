"""The planner's next decision on a real GPU study's ledger: the small recipe's two baseline runs on OpenRLHF 0.10.4
(one H200 of a 4-GPU host; the rows after them removed). That study went on with seed-only repeats of the
baseline filed under h06 (LoRA sync), whose one override the recipe already held, and found nothing; from the same
ledger the planner now steps the learning rate."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from autorl.data import shipped
from autorl.ledger import Ledger
from autorl.recipe import validate_recipe
from autorl.search.proposer import Proposer
from autorl.study.controller import RunOptions
from autorl.workspace import Workspace
from tests.conftest import run_cli

LEDGER = (
    Path(__file__).resolve().parents[1]
    / "data"
    / "openrlhf-0.10.4"
    / "small"
    / "parallel2"
    / "seed0-after-baselines.sqlite"
)


def test_after_the_gpu_baselines_the_planner_steps_the_learning_rate(tmp_path):
    assert run_cli("init", str(tmp_path / "ws")).returncode == 0
    db = tmp_path / "ledger.sqlite"
    shutil.copy(LEDGER, db)
    raw = yaml.safe_load(shipped("recipes/openrlhf-small.yaml").read_text())
    raw["verdict"]["baseline_repeats"] = 2  # as the study ran
    ledger = Ledger(db)
    proposer = Proposer(
        Workspace.open(tmp_path / "ws"),
        ledger,
        ledger.study(study_id=1),
        validate_recipe(raw),
        RunOptions(strategy="hypotheses", seed=0),
    )
    p = proposer.next()
    assert p.hypothesis != "h06-lora-sync" and set(p.values) == {"lr"} and 3e-6 <= p.values["lr"] <= 1e-4, p
    passed = [e.message for e in ledger.events(1) if e.kind == "not-applicable"]
    assert len(passed) == 1 and passed[0] is not None and passed[0].startswith("h06-lora-sync passed over")
