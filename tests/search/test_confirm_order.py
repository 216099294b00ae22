"""The order of confirmation runs when trials run in parallel, replayed on a real GPU study's ledger: the
`--parallel 4` study of a 4 x H200 host (tests/data/openrlhf-0.10.4/small/host4-p4/), where candidates 05, 07 and
08 were judged in turn while slots freed one by one, 13 s apart. The queue put each new candidate's runs in front,
so the last wave ran one confirming run of 05, two of 07 and one of 08, and the budget ended with nothing
confirmed. Kept together, the first candidate's three runs take the wave."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autorl.data import shipped
from autorl.ledger import Ledger
from autorl.recipe import load_recipe
from autorl.search.proposal import Proposal
from autorl.search.proposer import Proposer
from autorl.states import Proposer as By
from autorl.study.controller import RunOptions
from autorl.workspace import Workspace
from tests.conftest import run_cli

LEDGER = Path(__file__).resolve().parents[1] / "data" / "openrlhf-0.10.4" / "small" / "host4-p4" / "p4-ledger.sqlite"


@pytest.fixture
def proposer(tmp_path) -> Proposer:
    assert run_cli("init", str(tmp_path / "ws")).returncode == 0
    shutil.copy(LEDGER, tmp_path / "ledger.sqlite")
    ledger = Ledger(tmp_path / "ledger.sqlite")
    return Proposer(
        Workspace.open(tmp_path / "ws"),
        ledger,
        ledger.study(study_id=1),
        load_recipe(shipped("recipes/openrlhf-small.yaml")),
        RunOptions(strategy="hypotheses", seed=0, parallel=4),
    )


def test_the_real_studys_last_wave_goes_to_its_first_candidate(proposer):
    """As the study ran: 05 judged (a slot free), 07 judged (a slot), 06 flat (a slot), 08 judged (a slot)."""
    queue, rows = proposer.queue, {r.number: r for r in proposer.records.trials()}
    wave = []
    for judged in (5, 7, None, 8):
        if judged is not None:
            queue.confirmation_runs(queue._proposal_of(rows[judged]), judged, 3)
        wave.append(proposer.pending.pop(0).confirms)
    assert wave == [5, 5, 5, 7]  # the study ran [5, 7, 7, 8]
    assert [p.confirms for p in proposer.pending] == [7, 7, 8, 8, 8]


def test_a_candidate_still_goes_before_retries_and_held_proposals(proposer):
    queue, rows = proposer.queue, {r.number: r for r in proposer.records.trials()}
    retry = Proposal(By.RETRY, {"lr": 1e-5}, "a crash's retry", "retry-lr-1em05", retry_of=6)
    proposer.pending.append(retry)
    queue.confirmation_runs(queue._proposal_of(rows[5]), 5, 2)
    queue.confirmation_runs(queue._proposal_of(rows[8]), 8, 2)
    assert [(p.proposer, p.confirms) for p in proposer.pending] == [(By.CONFIRM, 5)] * 2 + [(By.CONFIRM, 8)] * 2 + [
        (By.RETRY, None)
    ]
    seeds = [p.values["seed"] for p in proposer.pending[:4]]
    assert seeds == [1050, 1051, 1080, 1081]  # each candidate's own fresh seeds, as the study drew them
