"""SmolLM2-135M-Instruct tuned by the embedded engine on one H200, replayed on the CPU: the two studies of
`recipes/smollm2-embedded.yaml` (search seeds 0 and 1, four trials packed on the card, 14 minutes each) and the
promote of seed 0's best, as they ran (tests/data/smollm2/h200-embedded; its README says what ran).

A real pretrained model through the whole product: each study confirmed a gain over four baseline runs, paired over
500 held-out items, the gate passed, and the promoted full run ended with its weights and checkpoint evals. The
replay re-reads the real ledgers with today's code, so a change that would judge them otherwise shows here.
"""

from __future__ import annotations

import json
import shutil
from contextlib import closing
from pathlib import Path

import pytest
import yaml

from autorl.data import shipped
from autorl.judge.diagnose import diagnose
from autorl.ledger import open_read
from autorl.recipe import validate_recipe
from autorl.states import Confirmation, Kind
from tests.conftest import run_cli

RUN = Path(__file__).resolve().parents[1] / "data" / "smollm2" / "h200-embedded"
CONFIRMED = {0: [7, 9], 1: [10, 11]}  # as each study's listing shows them


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory) -> dict[int, Path]:
    """Copies of the two real ledgers (reading one writes its -shm file beside it: never into tests/data)."""
    d = tmp_path_factory.mktemp("smollm2-ledgers")
    return {seed: Path(shutil.copy(RUN / f"study{seed}-ledger.sqlite", d / f"study{seed}.sqlite")) for seed in (0, 1)}


def _workspace(tmp_path: Path, seed: int) -> Path:
    """A fresh workspace holding a copy of study ``seed``'s real ledger (its write-ahead log is not written here)."""
    ws = tmp_path / f"ws{seed}"
    assert run_cli("init", str(ws)).returncode == 0
    shutil.copy(RUN / f"study{seed}-ledger.sqlite", ws / "ledger.sqlite")
    return ws


def _findings(ws: Path) -> dict:
    r = run_cli("-C", str(ws), "status", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["findings"]


@pytest.mark.parametrize("seed", [0, 1])
def test_each_search_seed_confirmed_a_gain_that_todays_judge_still_finds(tmp_path, seed):
    f = _findings(_workspace(tmp_path, seed))
    assert sorted(c["number"] for c in f["confirmed"]) == CONFIRMED[seed]
    best = f["best"]
    assert best["number"] in CONFIRMED[seed] and best["method"] == "paired_items" and best["n"] == 500
    assert best["ci_low"] > 0.02 and 0.06 < best["delta"] < 0.10  # +0.080 and +0.082 as the studies said
    assert best["runs"] == 3 and best["baseline_runs"] == 4
    assert f["crashes"]["count"] == 0 and f["counts"]["trials"] in (24, 25)


def test_the_two_seeds_found_the_same_kind_of_change(ledgers):
    """Seed 0 confirmed Dr. GRPO's unscaled advantages with lr 2.7e-6 and 3.6e-6; seed 1 the same at 2.2e-6 and
    the learning rate alone at 1.2e-5: both say the recipe's lr 1e-6 is too low for 16 steps of this model."""
    for seed, lrs in ((0, (2.0e-6, 4.0e-6)), (1, (2.0e-6, 1.3e-5))):
        with closing(open_read(ledgers[seed])) as ledger:
            trials = ledger.trials(ledger.study().id, kind=Kind.TRIAL)
        good = [t for t in trials if t.confirmation == Confirmation.CONFIRMED and t.confirms is None]
        assert sorted(t.number for t in good) == CONFIRMED[seed]
        assert all(lrs[0] <= float(t.params["lr"]) <= lrs[1] for t in good)


def _records(ledger_path: Path, number: int) -> tuple[list[dict], list[dict]]:
    with closing(open_read(ledger_path)) as ledger:
        records = ledger.metrics(ledger.trial(number).id)
    return [r for r in records if r.get("type") == "step"], [r for r in records if r.get("type") == "eval"]


def test_a_model_that_learns_to_answer_briefly_is_not_diagnosed_as_collapsing(ledgers):
    """The confirmed best of seed 1 (lr 1.2e-5): its entropy fell 87 %, its replies 37 % shorter and most groups
    ended all-correct while the reward rose from 0.16 to about 0.8 and held-out accuracy rose 0.08. The rules,
    tuned on tiny models, called that 'unstable: lower the learning rate'; the run is healthy."""
    steps, evals = _records(ledgers[1], 11)
    assert len(steps) == 16 and steps[-1]["reward_mean"] - steps[0]["reward_mean"] > 0.5
    d = diagnose(steps, evals, _recipe().train)
    assert not {"entropy_collapse", "length_collapse", "zero_std_groups"} & d.names(), d.summary()
    assert d.bottleneck != "unstable"


def test_the_recipe_that_ran_is_the_shipped_one(ledgers):
    with closing(open_read(ledgers[0])) as ledger:
        ran = yaml.safe_load(ledger.study().recipe)
    shipped_train = _recipe().train
    for key in ("lr", "gens", "batch_prompts", "steps", "max_new_tokens", "temperature", "chat_template"):
        assert ran["train"][key] == shipped_train[key], key


def _recipe():
    return validate_recipe(yaml.safe_load(shipped("recipes/smollm2-embedded.yaml").read_text()), source="t")


def test_the_promoted_full_run_ended_with_weights_and_checkpoint_evals():
    log = (RUN / "promote.log").read_text()
    assert "re-validation against the baseline: improved, +0.073 (95% interval [+0.017, +0.129])" in log
    assert "re-validation hack gate passed: task_id, task_ood, length" in log
    status = " ".join((RUN / "promote-status.txt").read_text().split())
    assert "complete, best eval/id/greedy_pass@1 0.838 at step 64" in status
    assert "best.pt" in status and "eval_every=16" in status


def test_the_card_was_busy_and_a_trial_took_about_two_minutes():
    busy = (RUN / "gpu-busy.txt").read_text()
    assert float(busy.split("busy ")[1].split(" %")[0]) > 85.0
    listing = (RUN / "study0-ledger.txt").read_text()
    minutes = [line.split()[-1] for line in listing.splitlines() if line[:2].isdigit() and "objective" in line]
    assert minutes and all(m.startswith(("1m", "2m")) for m in minutes)


def test_on_the_gpu_the_cached_step0_eval_saved_its_time_and_changed_no_figure():
    """`autorl train` of two steps twice in one workspace (tests/data/smollm2/h200-evalcache): the second read the
    first's step-0 eval from the cache and ended with the same final eval."""
    cache = RUN.parent / "h200-evalcache"
    first, second = (json.loads((cache / f"train{i}.json").read_text()) for i in (1, 2))
    assert first["final_eval"] == second["final_eval"] and first["status"] == second["status"] == "complete"
    assert first["wall_s"] - second["wall_s"] > 10.0  # 44.4 s -> 27.6 s: 1,000 greedy generations not repeated
    assert "eval step 0: greedy pass@1 id 0.246, ood 0.286" in (cache / "train1.log").read_text()
    assert [n for n in (cache / "cache-ls.txt").read_text().split() if n.endswith(".json")] == [
        "eval0-0949ffd37ac8667ddbd1.json"
    ]
