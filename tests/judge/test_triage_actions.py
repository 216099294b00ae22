"""decide_action: each category's action from the rules table, with the baseline, retry and repeat limits."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autorl.judge.triage import CrashReport, decide_action, load_rules, repeat_limit, signature


def _diag(category: str) -> CrashReport:
    return CrashReport(category=category, root_cause_line="x", remedy="fix it", signature=signature(category, "x"))


def _decide(category: str, tmp_path: Path, *, baseline: bool = False, retries: int = 0, count: int = 1):
    return decide_action(
        _diag(category), is_baseline=baseline, retries_so_far=retries, signature_count=count, run_dir=tmp_path
    )


@pytest.mark.parametrize(
    "category,kind",
    [
        ("cuda_oom", "retry_reduced"),
        ("host_oom", "retry_reduced"),
        ("hang_timeout", "retry_once"),
        ("distributed_timeout", "retry_once"),
        ("network_unavailable", "retry_once"),
        ("killed_external", "retry_once"),
        ("shared_gpu", "retry_once"),
        ("nan_divergence", "record"),
        ("unknown", "record"),
        ("user_code_error", "record"),
        ("config_error", "record"),
        ("backend_incompat", "stop"),
        ("disk_full", "stop"),
    ],
)
def test_first_crash_of_a_trial(category, kind, tmp_path):
    a = _decide(category, tmp_path)
    assert a.kind == kind and category in a.reason and not a.avoid_region


@pytest.mark.parametrize("category", ["cuda_oom", "hang_timeout", "killed_external"])
def test_a_retried_trial_that_crashes_again_is_recorded(category, tmp_path):
    a = _decide(category, tmp_path, retries=1)
    assert a.kind == "record" and "again after 1 retry" in a.reason


@pytest.mark.parametrize("category", ["user_code_error", "config_error"])
def test_config_or_code_error_in_the_baseline_stops_the_study(category, tmp_path):
    a = _decide(category, tmp_path, baseline=True)
    assert a.kind == "stop" and "baseline" in a.reason and "every trial" in a.reason


def test_oom_in_the_baseline_still_retries_reduced(tmp_path):
    assert _decide("cuda_oom", tmp_path, baseline=True).kind == "retry_reduced"


def test_disk_full_names_the_path_and_its_free_space(tmp_path):
    run_dir = tmp_path / "runs" / "attempt-03"  # not created yet: the nearest existing parent is checked
    a = decide_action(_diag("disk_full"), is_baseline=False, retries_so_far=0, signature_count=1, run_dir=run_dir)
    assert a.kind == "stop" and a.path == str(tmp_path)
    assert a.free_bytes is not None and abs(a.free_bytes - shutil.disk_usage(tmp_path).free) < 64 * 2**20
    assert str(tmp_path) in a.reason and "free" in a.reason and "\n" not in a.reason


def test_repeated_signature_avoids_the_region(tmp_path):
    limit = repeat_limit()
    assert not _decide("unknown", tmp_path, count=limit - 1).avoid_region
    a = _decide("unknown", tmp_path, count=limit)
    assert a.avoid_region and f"seen {limit} times" in a.reason


def test_repeat_limit_and_actions_come_from_the_rules_file():
    rules = load_rules()
    assert repeat_limit() == rules.repeat_limit
    assert rules.actions["disk_full"].kind == "stop" and rules.actions["user_code_error"].on_baseline == "stop"


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
    d = CrashReport(category="disk_full", root_cause_line=root, remedy="r", signature="s")
    a = decide_action(d, is_baseline=False, retries_so_far=0, signature_count=1, run_dir=tmp_path / "run", log_text=log)
    assert a.path == str(ckpt) and str(ckpt) in a.reason
    named = d.model_copy(update={"root_cause_line": f"{root}: '{ckpt}/checkpoint-4.bin'"})
    a = decide_action(named, is_baseline=False, retries_so_far=0, signature_count=1, run_dir=tmp_path, log_text="")
    assert a.path == str(ckpt)
