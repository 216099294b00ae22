"""decide_action: each category's action from the rules table, with the baseline, retry and repeat limits."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autorl.judge.triage import CrashReport, decide_action, load_rules, repeat_limit, signature
from autorl.states import CrashAction, CrashCategory


def _diag(category: CrashCategory) -> CrashReport:
    return CrashReport(category=category, root_cause_line="x", remedy="fix it", signature=signature(category, "x"))


def _decide(category: CrashCategory, tmp_path: Path, *, baseline: bool = False, retries: int = 0, count: int = 1):
    return decide_action(
        _diag(category), is_baseline=baseline, retries_so_far=retries, signature_count=count, run_dir=tmp_path
    )


@pytest.mark.parametrize(
    "category,kind",
    [
        (CrashCategory.CUDA_OOM, CrashAction.RETRY_REDUCED),
        (CrashCategory.HOST_OOM, CrashAction.RETRY_REDUCED),
        (CrashCategory.HANG_TIMEOUT, CrashAction.RETRY_ONCE),
        (CrashCategory.DISTRIBUTED_TIMEOUT, CrashAction.RETRY_ONCE),
        (CrashCategory.NETWORK_UNAVAILABLE, CrashAction.RETRY_ONCE),
        (CrashCategory.KILLED_EXTERNAL, CrashAction.RETRY_ONCE),
        (CrashCategory.SHARED_GPU, CrashAction.RETRY_ONCE),
        (CrashCategory.NAN_DIVERGENCE, CrashAction.RECORD),
        (CrashCategory.UNKNOWN, CrashAction.RECORD),
        (CrashCategory.USER_CODE_ERROR, CrashAction.RECORD),
        (CrashCategory.CONFIG_ERROR, CrashAction.RECORD),
        (CrashCategory.BACKEND_INCOMPAT, CrashAction.STOP),
        (CrashCategory.DISK_FULL, CrashAction.STOP),
    ],
)
def test_first_crash_of_a_trial(category, kind, tmp_path):
    a = _decide(category, tmp_path)
    assert a.kind == kind and category in a.reason and not a.avoid_region


@pytest.mark.parametrize(
    "category", [CrashCategory.CUDA_OOM, CrashCategory.HANG_TIMEOUT, CrashCategory.KILLED_EXTERNAL]
)
def test_a_retried_trial_that_crashes_again_is_recorded(category, tmp_path):
    a = _decide(category, tmp_path, retries=1)
    assert a.kind == CrashAction.RECORD and "again after 1 retry" in a.reason


@pytest.mark.parametrize("category", [CrashCategory.USER_CODE_ERROR, CrashCategory.CONFIG_ERROR])
def test_config_or_code_error_in_the_baseline_stops_the_study(category, tmp_path):
    a = _decide(category, tmp_path, baseline=True)
    assert a.kind == CrashAction.STOP and "baseline" in a.reason and "every trial" in a.reason


def test_oom_in_the_baseline_still_retries_reduced(tmp_path):
    assert _decide(CrashCategory.CUDA_OOM, tmp_path, baseline=True).kind == CrashAction.RETRY_REDUCED


def test_disk_full_names_the_path_and_its_free_space(tmp_path):
    run_dir = tmp_path / "runs" / "attempt-03"  # not created yet: the nearest existing parent is checked
    a = decide_action(
        _diag(CrashCategory.DISK_FULL), is_baseline=False, retries_so_far=0, signature_count=1, run_dir=run_dir
    )
    assert a.kind == CrashAction.STOP and a.path == str(tmp_path)
    assert a.free_bytes is not None and abs(a.free_bytes - shutil.disk_usage(tmp_path).free) < 64 * 2**20
    assert str(tmp_path) in a.reason and "free" in a.reason and "\n" not in a.reason


def test_repeated_signature_avoids_the_region(tmp_path):
    limit = repeat_limit()
    assert not _decide(CrashCategory.UNKNOWN, tmp_path, count=limit - 1).avoid_region
    a = _decide(CrashCategory.UNKNOWN, tmp_path, count=limit)
    assert a.avoid_region and f"seen {limit} times" in a.reason


def test_repeat_limit_and_actions_come_from_the_rules_file():
    rules = load_rules()
    assert repeat_limit() == rules.repeat_limit
    assert (
        rules.actions[CrashCategory.DISK_FULL].kind == CrashAction.STOP
        and rules.actions[CrashCategory.USER_CODE_ERROR].on_baseline == CrashAction.STOP
    )


def test_disk_full_checks_the_volume_the_log_was_writing_to(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "checkpoint-3.bin").write_bytes(b"x")
    root = "OSError: [Errno 28] No space left on device"
    frame = '  File "/opt/lib/python3.11/site-packages/torch/serialization.py", line 628, in save'
    lines = [
        "step 3",
        f"Saving model checkpoint to {ckpt}/checkpoint-3.bin",
        "Traceback (most recent call last):",
        frame,
        root,
    ]
    log = "\n".join(lines) + "\n"
    d = CrashReport(category=CrashCategory.DISK_FULL, root_cause_line=root, remedy="r", signature="s")
    a = decide_action(d, is_baseline=False, retries_so_far=0, signature_count=1, run_dir=tmp_path / "run", log_text=log)
    assert a.path == str(ckpt) and str(ckpt) in a.reason
    named = d.model_copy(update={"root_cause_line": f"{root}: '{ckpt}/checkpoint-4.bin'"})
    a = decide_action(named, is_baseline=False, retries_so_far=0, signature_count=1, run_dir=tmp_path, log_text="")
    assert a.path == str(ckpt)
