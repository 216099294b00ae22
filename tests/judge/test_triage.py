"""Crash triage: real-looking engine logs -> category, root line, remedy, signature (OOM retries: each backend's
oom_retry, tests/backends/test_contract.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autorl.judge import triage as tr
from autorl.judge.triage import (
    SILENT_CATEGORIES,
    CrashReport,
    RulesError,
    classify,
    crash_action,
    excerpt,
    group_crashes,
    load_rules,
    normalise,
    signature,
)
from autorl.ledger import Trial
from autorl.states import CrashAction, CrashCategory, TrialStatus

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
CATEGORIES = set(CrashReport.model_fields["category"].annotation)  # CrashCategory's members

# file, exit code, watchdog, nonfinite metric -> category, a piece of the root-cause line
CASES = [
    (
        "cuda_oom_trl.log",
        1,
        None,
        None,
        CrashCategory.CUDA_OOM,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.64 GiB",
    ),
    ("cuda_oom_nccl_wrapped.log", 1, None, None, CrashCategory.CUDA_OOM, "Cuda failure 'out of memory'"),
    ("ray_nested_cuda_oom.log", 1, None, None, CrashCategory.CUDA_OOM, "Tried to allocate 9.27 GiB"),
    # OpenRLHF starts vLLM before the actor: no KV room then is the model and its share, or neighbours, never the
    # trial's batch sizes (halving them cannot help): retried unchanged, the remedy naming both
    ("vllm_kv_cache.log", 1, None, None, CrashCategory.SHARED_GPU, "No available memory for the cache blocks"),
    # a real log
    (
        "kv_cache_no_room_packed.log",
        1,
        None,
        None,
        CrashCategory.SHARED_GPU,
        "No available memory for the cache blocks",
    ),
    ("ray_host_oom.log", 1, None, None, CrashCategory.HOST_OOM, "ray.exceptions.OutOfMemoryError: Task was killed"),
    # the shell's Killed and exit 137 with no memory evidence in the log: an external kill (the convention of the corpus
    # of real logs, issue 47), whatever the log printed of host memory before it
    ("host_oom_killed.log", 137, None, None, CrashCategory.KILLED_EXTERNAL, "Killed"),
    ("nan_deepspeed_fp16.log", 1, None, None, CrashCategory.NAN_DIVERGENCE, "Current loss scale already at minimum"),
    ("nan_multinomial.log", 1, None, None, CrashCategory.NAN_DIVERGENCE, "probability tensor contains"),
    ("nan_exit0.log", 0, None, "loss@4", CrashCategory.NAN_DIVERGENCE, "step 4 reward_mean 0.00 loss nan"),
    (
        "distributed_timeout.log",
        1,
        None,
        None,
        CrashCategory.DISTRIBUTED_TIMEOUT,
        "Watchdog caught collective operation timeout",
    ),
    (
        "backend_incompat_trl.log",
        1,
        None,
        None,
        CrashCategory.BACKEND_INCOMPAT,
        "unexpected keyword argument 'tokenizer'",
    ),
    ("backend_incompat_flags.log", 2, None, None, CrashCategory.BACKEND_INCOMPAT, "unrecognized arguments: --pretrain"),
    ("ray_actor_died_import.log", 1, None, None, CrashCategory.BACKEND_INCOMPAT, "No module named 'vllm.worker'"),
    (
        "config_error_divisible.log",
        1,
        None,
        None,
        CrashCategory.CONFIG_ERROR,
        "must be evenly divisible by the number of generations",
    ),
    ("config_error_misleading.log", 1, None, None, CrashCategory.CONFIG_ERROR, "FileNotFoundError: [Errno 2]"),
    ("user_code_misleading_warnings.log", 1, None, None, CrashCategory.USER_CODE_ERROR, "KeyError: 'answer'"),
    (
        "ray_nested_reward_error.log",
        1,
        None,
        None,
        CrashCategory.USER_CODE_ERROR,
        "Failed to fetch reward from remote RM",
    ),
    ("disk_full.log", 1, None, None, CrashCategory.DISK_FULL, "inline_container.cc"),
    ("hang_silence.log", -9, "silence", None, CrashCategory.HANG_TIMEOUT, "update_weight: model.layers.11"),
    (
        "illegal_memory_access.log",
        1,
        None,
        None,
        CrashCategory.ILLEGAL_MEMORY_ACCESS,
        "RuntimeError: CUDA error: an illegal memory access",
    ),
    # a bare segfault names no cause (a kernel bug, a driver, a mismatched build): unknown, the segfault its candidate
    ("segfault.log", -11, None, None, CrashCategory.UNKNOWN, "Fatal Python error: Segmentation fault"),
    ("network_unavailable.log", 1, None, None, CrashCategory.NETWORK_UNAVAILABLE, "huggingface.co"),
    ("killed_external.log", -15, None, None, CrashCategory.KILLED_EXTERNAL, "CANCELLED AT"),
    # a real OpenRLHF log
    ("shared_gpu_vllm_profiling.log", 1, None, None, CrashCategory.SHARED_GPU, "Error in memory profiling"),
    # a real log
    (
        "gpu_occupied_vllm_start.log",
        1,
        None,
        None,
        CrashCategory.SHARED_GPU,
        "on startup is less than desired GPU memory",
    ),
    ("unknown_wrapped.log", 1, None, None, CrashCategory.UNKNOWN, "RuntimeError: replay buffer got experiences"),
    ("ray_worker_died.log", 1, None, None, CrashCategory.UNKNOWN, "A worker died or was killed"),
]


def _read(name: str) -> str:
    return (LOGS / name).read_text()


@pytest.mark.parametrize("name,code,watchdog,nonfinite,category,root", CASES, ids=[c[0] for c in CASES])
def test_classify_log(name, code, watchdog, nonfinite, category, root):
    text = _read(name)
    d = classify(text, exit_code=code, watchdog=watchdog, metrics_nonfinite=nonfinite)
    assert d.category == category, d
    assert root in d.root_cause_line
    assert d.root_cause_line in text.splitlines() or d.root_cause_line.rstrip() in [
        ln.rstrip() for ln in text.splitlines()
    ]
    assert d.remedy and "\n" not in d.remedy
    assert d.signature.startswith(category + "-")


def test_every_category_has_a_log():
    """Every category a log can show (the silent ones come from metrics, tests/judge/test_silent.py)."""
    covered = {c[4] for c in CASES}
    assert covered == CATEGORIES - set(SILENT_CATEGORIES)
    assert {c[0] for c in CASES} == {p.name for p in LOGS.glob("*.log")}


def test_diagnosis_has_exactly_the_cli_fields():
    d = classify(_read("cuda_oom_trl.log"), exit_code=1)
    assert set(d.model_dump()) == {
        "category",
        "root_cause_line",
        "remedy",
        "signature",
        "engine",
        "confidence",
        "score",
        "candidates",
    }


# ---- misleading text ------------------------------------------------------------------


def test_warnings_about_memory_nan_and_timeouts_do_not_decide():
    # every harmless line alone: nothing matches, the run is unknown (exit code 1, no exception)
    warnings = [
        ln for ln in _read("user_code_misleading_warnings.log").splitlines() if "Warning" in ln or "WARNING" in ln
    ]
    assert len(warnings) >= 4
    d = classify("\n".join(warnings), exit_code=1)
    assert d.category == CrashCategory.UNKNOWN


def test_ray_text_listing_oom_as_a_possible_cause_is_not_host_oom():
    d = classify(_read("ray_worker_died.log"), exit_code=1)
    assert d.category not in (CrashCategory.HOST_OOM, CrashCategory.ILLEGAL_MEMORY_ACCESS)


def test_ray_host_oom_is_not_cuda_oom():
    # ray.exceptions.OutOfMemoryError shares its class name with torch.OutOfMemoryError
    assert classify(_read("ray_host_oom.log")).category == CrashCategory.HOST_OOM


def test_cause_outranks_the_surface_error_it_triggers():
    text = _read("illegal_memory_access.log")
    assert "DistBackendError" in text.splitlines()[-1]
    assert classify(text).category == CrashCategory.ILLEGAL_MEMORY_ACCESS
    nccl_only = "\n".join(ln for ln in text.splitlines() if "illegal memory" not in ln)
    # NCCL's "unhandled system error" alone names no cause (shared memory, the fabric, a driver, another rank): the
    # corpus of real logs files it unknown, and NCCL's family is its first candidate (issue 47)
    d = classify(nccl_only)
    assert d.category == CrashCategory.UNKNOWN and d.candidates[0].family == "nccl_setup_error"
    assert d.candidates[0].category == CrashCategory.DISTRIBUTED_TIMEOUT


def test_nested_ray_chain_reports_innermost_cause_not_wrapper():
    d = classify(_read("ray_nested_cuda_oom.log"))
    assert "RayTaskError" not in d.root_cause_line
    d = classify(_read("unknown_wrapped.log"))
    assert d.root_cause_line.startswith("RuntimeError: replay buffer")


# ---- exit codes, watchdog, metrics --------------------------------------------------


@pytest.mark.parametrize(
    "code,category",
    [
        (137, CrashCategory.KILLED_EXTERNAL),  # no memory evidence: a cancel, a limit or an unseen OOM killer
        (-9, CrashCategory.KILLED_EXTERNAL),
        (143, CrashCategory.KILLED_EXTERNAL),
        (139, CrashCategory.UNKNOWN),  # a segfault alone names no cause: its candidate says illegal_memory_access
        (1, CrashCategory.UNKNOWN),
    ],
)
def test_exit_code_without_python_error(code, category):
    assert classify("epoch 1\nstep 3/100\n", exit_code=code).category == category


def test_exit_137_with_a_python_error_follows_the_error():
    log = "Traceback (most recent call last):\n  File \"r.py\", line 3\nKeyError: 'label'\n"
    assert classify(log, exit_code=137).category == CrashCategory.USER_CODE_ERROR


def test_watchdog_silence_is_a_hang_unless_a_real_cause_is_logged():
    assert (
        classify("step 3\nbroadcast weights 12/291\n", exit_code=-9, watchdog="silence").category
        == CrashCategory.HANG_TIMEOUT
    )
    assert classify(_read("cuda_oom_trl.log"), exit_code=-9, watchdog="silence").category == CrashCategory.CUDA_OOM
    assert classify("step 3\n", exit_code=-9, watchdog="timeout").category == CrashCategory.HANG_TIMEOUT


def test_embedded_engine_nan_stop_line():
    log = "step 3 reward_mean 0.41\nstopped: non-finite values at step 4 (loss nan / grad_norm nan); lower lr or check the reward\n"
    d = classify(log, exit_code=3)
    assert d.category == CrashCategory.NAN_DIVERGENCE and d.root_cause_line.startswith("stopped: non-finite")


def test_nonfinite_metrics_mean_nan_even_with_exit_zero():
    d = classify("step 1 ok\nstep 2 ok\ndone\n", exit_code=0, metrics_nonfinite="grad_norm@2")
    assert d.category == CrashCategory.NAN_DIVERGENCE
    assert d.root_cause_line == "non-finite metric: grad_norm@2"


# ---- signature and excerpt -------------------------------------------------------------


def test_signature_is_stable_across_numbers_paths_pids_and_times():
    a = "(PolicyModelActor pid=3411) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.27 GiB. GPU 0 has 79.11 GiB"
    b = "(PolicyModelActor pid=9120) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 3 has 79.11 GiB"
    assert signature(CrashCategory.CUDA_OOM, a) == signature(CrashCategory.CUDA_OOM, b)
    assert signature(CrashCategory.CUDA_OOM, a) != signature(CrashCategory.HOST_OOM, a)
    p = normalise("2025-03-01 11:34:02,918 /opt/x/y.py at 0x7f1c2d84be50 id 58d0b1fa6b3bd0ea7d1be4c4 took 12 s")
    assert all(ch not in p for ch in "0123456789") and "/opt" not in p
    other = signature(CrashCategory.USER_CODE_ERROR, "KeyError: 'label'")
    assert other != signature(CrashCategory.USER_CODE_ERROR, "KeyError: 'answer'")


def test_same_failure_in_two_runs_has_one_signature():
    one = classify(_read("ray_nested_cuda_oom.log"))
    two = classify(_read("ray_nested_cuda_oom.log").replace("9.27 GiB", "3.02 GiB").replace("pid=3411", "pid=77"))
    assert one.signature == two.signature


def test_excerpt_marks_the_root_line_with_context():
    text = _read("ray_nested_cuda_oom.log")
    d = classify(text)
    ex = excerpt(text, d.root_cause_line, context=2).splitlines()
    assert len(ex) == 3 and ex[-1].startswith(">> ") and d.root_cause_line in ex[-1]
    tail = excerpt(text, "not in the log", context=1).splitlines()
    assert len(tail) == 3


# ---- policy -------------------------------------------------------------------------------


def test_every_category_has_an_action():
    actions = load_rules().actions
    assert set(actions) == CATEGORIES == set(CrashCategory)
    assert all(isinstance(k, CrashCategory) and isinstance(a.kind, CrashAction) for k, a in actions.items())
    assert crash_action(CrashCategory.CUDA_OOM) is CrashAction.RETRY_REDUCED
    assert crash_action(CrashCategory.DISK_FULL) is CrashAction.STOP
    # stops the study only in the baseline (decide_action)
    assert crash_action(CrashCategory.USER_CODE_ERROR) is CrashAction.RECORD


def test_group_crashes_counts_by_signature():
    rows = [
        Trial(
            attempt="attempt-03",
            crash_signature="cuda_oom-aaaa",
            crash_category=CrashCategory.CUDA_OOM,
            root_cause="OOM",
        ),
        Trial(attempt="attempt-05", crash_signature="cuda_oom-aaaa", crash_category=CrashCategory.CUDA_OOM),
        {"number": 7, "signature": "user_code_error-bbbb", "category": "user_code_error"},  # a CrashReport dump
        Trial(attempt="attempt-08", status=TrialStatus.COMPLETE),
    ]
    groups = group_crashes(rows)
    assert [g["count"] for g in groups] == [2, 1]
    assert groups[0]["trials"] == ["attempt-03", "attempt-05"] and groups[0]["repeated"] is True
    assert groups[0]["root_cause_line"] == "OOM" and groups[0]["category"] is CrashCategory.CUDA_OOM
    assert groups[1]["trials"] == [7]
    assert groups[1]["category"] is CrashCategory.USER_CODE_ERROR and groups[1]["repeated"] is False


def test_bad_rules_file_is_a_user_error(tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text(
        "families:\n  - id: x\n    category: cuda_oom\n    priority: 1\n    messages: [{re: '(unclosed'}]\n"
        "    remedy: r\nnonfinite_remedy: n\nunknown_remedy: u\n"
    )
    with pytest.raises(RulesError, match="not a valid regex"):
        load_rules(bad)
    bad.write_text("families:\n  - id: x\n    category: gpu_sad\n")
    with pytest.raises(RulesError):
        load_rules(bad)
    bad.write_text(
        "families:\n  - id: x\n    category: cuda_oom\n    priority: 1\n    remedy: r\n"
        "nonfinite_remedy: n\nunknown_remedy: u\n"
    )
    with pytest.raises(RulesError, match="has no messages"):
        load_rules(bad)
    bad.write_text("families_from: [missing.yaml]\nnonfinite_remedy: n\nunknown_remedy: u\n")
    with pytest.raises(RulesError, match="missing.yaml"):
        load_rules(bad)
    bad.write_text(
        "families:\n  - id: x\n    category: cuda_oom\n    priority: 1\n    remedy: r\n    engines: [openrlfh]\n"
        "    messages: [{re: 'OOM'}]\nengines: {openrlhf: [openrlhf]}\nnonfinite_remedy: n\nunknown_remedy: u\n"
    )
    with pytest.raises(RulesError, match="family 'x' names engine\\(s\\) openrlfh that the engines table lacks"):
        load_rules(bad)


VLLM_FULL_CARD = (
    "(EngineCore pid=20972) ERROR 11-27 21:32:28 [core.py:1165] ValueError: Free memory on device cuda:0 "
    "(3.67/139.8 GiB) on startup is less than desired GPU memory utilization (0.15, 20.97 GiB). Decrease "
    "GPU memory utilization or reduce GPU memory used by other processes."
)


def test_a_full_card_at_vllm_start_is_the_neighbours_in_openrlhf_and_the_settings_elsewhere():
    """OpenRLHF starts its vLLM engines before it loads the actor, so memory in use then is another process's: a
    shared GPU, retried unchanged, never a region off limits. In a log where a trainer loaded first on the same card
    the same line is the run's own settings: an OOM."""
    openrlhf = classify(
        "Running entrypoint for job autorl-1: python -m openrlhf.cli.train_ppo_ray\n" + VLLM_FULL_CARD, exit_code=1
    )
    alone = classify(
        "INFO grpo.py:88: colocate mode: policy trainer and vLLM share cuda:0\n" + VLLM_FULL_CARD, exit_code=1
    )
    assert (openrlhf.engine, openrlhf.category) == (
        "openrlhf",
        CrashCategory.SHARED_GPU,
    ) and "nvidia-smi" in openrlhf.remedy
    tail_only = classify("(RolloutRayActor pid=19248) " + VLLM_FULL_CARD, exit_code=1)  # a log cut to its last lines
    assert (tail_only.engine, tail_only.category) == ("openrlhf", CrashCategory.SHARED_GPU)
    assert alone.category == CrashCategory.CUDA_OOM
    assert (
        crash_action(CrashCategory.SHARED_GPU) == CrashAction.RETRY_ONCE
        and crash_action(CrashCategory.CUDA_OOM) == CrashAction.RETRY_REDUCED
    )


KV_NO_ROOM = (
    "(EngineCore pid=10355) ERROR 11-28 00:28:17 [core.py:1165] ValueError: No available memory for the cache "
    "blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
)


def test_no_kv_cache_room_at_vllm_start_is_not_the_trials_batch_in_openrlhf_and_an_oom_elsewhere():
    """Four packed trials starting on one H200 left a 34 M model no KV room: in OpenRLHF (vLLM first) retried
    unchanged with a remedy naming the vLLM share; where a trainer shares vLLM's process or card, an OOM."""
    openrlhf = classify("(RolloutRayActor pid=8478) " + KV_NO_ROOM, exit_code=1)
    assert (openrlhf.engine, openrlhf.category) == ("openrlhf", CrashCategory.SHARED_GPU)
    assert "vllm_gpu_memory_utilization" in openrlhf.remedy
    trl = classify(
        "INFO grpo_trainer.py:88: colocate mode: policy trainer and vLLM share cuda:0\n" + KV_NO_ROOM, exit_code=1
    )
    assert trl.category == CrashCategory.CUDA_OOM


def test_triage_does_not_import_heavy_frameworks():
    code = (
        "import sys, autorl.judge.triage, autorl.judge.verdict, autorl.judge.abort; "
        "print([m for m in ('torch', 'transformers', 'trl', 'ray', 'openrlhf') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_log_of_one_endless_line_is_read_by_its_head_and_a_huge_log_by_its_tail(tmp_path, monkeypatch):
    """A 200 kB line of one letter took over a minute to classify (some patterns are quadratic in a line's
    length) and a 300 MB log was read whole; triage reads each line's head and the file's tail."""
    line = "a" * 1_000_000
    d = tr.classify(line + "\nRuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert d.category == CrashCategory.ILLEGAL_MEMORY_ACCESS
    assert tr.log_lines(line) == ["a" * tr.MAX_LINE_CHARS]
    monkeypatch.setattr(tr, "TAIL_BYTES", 1000)
    path = tmp_path / "train.log"
    path.write_bytes(b"x" * 5000 + b"\ntorch.OutOfMemoryError: CUDA out of memory.\n")
    text = tr.read_tail(path)
    assert len(text.encode()) == 1000 and text.endswith("CUDA out of memory.\n")
    assert tr.classify(text).category == CrashCategory.CUDA_OOM
