"""A trial's vLLM engine SIGKILLed mid-rollout on a real H200 (OpenRLHF 0.10.4, Ray 2.55), replayed on the CPU
(tests/data/openrlhf-0.10.4/smollm2/h200-vllmkill; its README says what ran).

The study of that day ended at its first trial: Ray's log names no cause for a dead worker, triage filed it unknown,
and an unknown crash of the baseline ended the study. Today the baseline gets one unchanged retry first.
"""

from __future__ import annotations

import gzip
import shutil
from contextlib import closing
from pathlib import Path

from autorl.judge import triage
from autorl.ledger import open_read
from autorl.states import CrashAction, CrashCategory, Kind, TrialStatus

RUN = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "smollm2" / "h200-vllmkill"
LOG = gzip.open(RUN / "train.log.gz", "rt", errors="replace").read()


def test_the_killed_engine_is_an_honest_unknown_naming_rays_line():
    """Nothing in the log says whether the OOM killer, `ray stop` or a segfault took the worker: no category is
    claimed, and the line a person would read is Ray's own."""
    d = triage.classify(LOG, exit_code=1)
    assert d.category == CrashCategory.UNKNOWN
    assert "A worker died or was killed while executing a task" in d.root_cause_line
    assert "ray logs" in d.remedy


def test_todays_controller_retries_the_baseline_once_and_records_a_searched_trial():
    d = triage.classify(LOG, exit_code=1)
    common = {"signature_count": 1, "run_dir": RUN, "log_text": LOG}
    assert triage.decide_action(d, is_baseline=True, retries_so_far=0, **common).kind == CrashAction.RETRY_ONCE
    again = triage.decide_action(d, is_baseline=True, retries_so_far=1, **common)
    assert again.kind == CrashAction.RECORD and "again after 1 retry" in again.reason
    assert triage.decide_action(d, is_baseline=False, retries_so_far=0, **common).kind == CrashAction.RECORD


def test_the_ledger_as_filed_that_day(tmp_path):
    path = Path(shutil.copy(RUN / "study-ledger.sqlite", tmp_path / "ledger.sqlite"))
    with closing(open_read(path)) as ledger:
        (t,) = ledger.trials(ledger.study().id, kind=Kind.TRIAL)
    assert t.status == TrialStatus.CRASH and t.crash_category == CrashCategory.UNKNOWN
    assert t.crash_action == CrashAction.RECORD and (t.crash_signature or "").startswith("unknown-")
    assert (
        "record: unknown: recorded as a crash; the baseline failed, so the study ends here"
        in (RUN / "study.log").read_text()
    )


def test_the_kill_left_no_gpu_process_and_no_ray_head():
    after = (RUN / "after.txt").read_text()
    assert "GPU processes: 0" in after and "Ray heads on the host, by their cards: none" in after
    assert "study exit 1" in after
    assert "1 trial in 222 s; ended: the baseline failed" in (RUN / "study.log").read_text()
