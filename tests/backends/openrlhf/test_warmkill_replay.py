"""A warm pool's server killed (SIGKILL) between two trials on real OpenRLHF 0.10.4, 2 x H200, replayed on the CPU
(tests/data/openrlhf-0.10.4/small/h200x2-warmkill; its README says what ran)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest

from autorl.backends.openrlhf.phases import marks
from autorl.states import TrialStatus
from tests.conftest import stored_study

RUN = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "small" / "h200x2-warmkill"


def _log(name: str) -> str:
    return gzip.open(RUN / f"{name}.log.gz", "rt", errors="replace").read()


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[dict[int, Any], list[tuple[int | None, str, str]]]:
    trials, events = stored_study(RUN / "study-ledger.sqlite", tmp_path_factory.mktemp("wk"))
    numbers = {t.id: t.number for t in trials.values()}
    return trials, [(numbers.get(e.trial_id), e.kind, e.message) for e in events]


def test_the_trial_after_the_kill_ran_in_a_new_pool_and_was_not_lost(study):
    trials, events = study
    assert [t.status for t in trials.values()] == [TrialStatus.COMPLETE, TrialStatus.COMPLETE]
    one, two = trials[1], trials[2]
    assert two.warm_pool != one.warm_pool and one.warm_index == two.warm_index == 0
    assert abs(one.objective - two.objective) < 0.01  # 0.474 and 0.472: two baseline seeds
    built = sorted((n, m.split(":")[0]) for n, k, m in events if k == "warm-pool-start")
    assert built == [(1, one.warm_pool), (2, two.warm_pool)]
    assert all(t.crash_category is None and t.exit_code == 0 for t in trials.values())


def test_the_new_pool_started_from_its_own_driver_and_engine():
    """02's log is a whole pool's start (runtime env, Ray connection, vLLM engine built), not a slice after a
    reset: its engine did not come from the dead pool."""
    for name in ("attempt-01-baseline", "attempt-02-baseline-seed1"):
        text = _log(name)
        assert text.index("Runtime env is setting up") < text.index(f"AUTORL-WARM {name} begin index=0")
        assert f"AUTORL-WARM {name} end code=0" in text
        assert list(marks(text, [(0, 0.0)]))[:4] == ["driver", "vllm", "actor", "training"]
    assert "attempt-01" not in _log("attempt-02-baseline-seed1")
