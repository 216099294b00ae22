"""Crash triage on the labelled crash corpus (tests/data/crashes): held-out floors and the traps.

The floors are the counts reached when the rules were last changed (see benchmarks/README.md,
"Crash triage on held-out logs"); a rule change that loses a held-out log fails here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from triage_heldout import load_labels, run_one, score  # noqa: E402

from autorl.judge.triage import classify, explain  # noqa: E402
from autorl.states import CrashCategory  # noqa: E402

LOGS = ROOT / "tests" / "data" / "crashes" / "logs"
# (category, exact root-cause line) counts reached. Issue 47 moved four conventions to those of the corpus of real
# logs (tests/data/crashes_real), and the labels here that contradicted them were changed, each with a comment in
# labels.yaml: a SIGKILL (-9, Killed, 137) with no memory evidence is killed_external (3 dev, 2 heldout logs); a bare
# segfault is unknown (3 heldout); a kernel's index-out-of-range assertion is config_error (2 dev, 2 heldout); a
# device OOM whose accounting shows others holding a quarter of the card is shared_gpu (2 heldout). The six heldout
# line misses are the lines of logs whose category is right (the elastic summary of a -9 before its failure table).
FLOORS = {"dev": (68, 68), "heldout": (55, 49)}


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return [run_one(label) for label in load_labels()]


@pytest.mark.parametrize("split", ["dev", "heldout"])
def test_corpus_accuracy_does_not_fall(results, split):
    s = score(results, split)
    cat_floor, line_floor = FLOORS[split]
    assert s["category"] >= cat_floor, s
    assert s["root_cause"] >= line_floor, s


def test_every_label_line_is_in_its_log():
    for label in load_labels():
        text = (LOGS / f"{label['id']}.log").read_text()
        assert label["root_cause_line"] in text.splitlines(), label["id"]


def _label(log_id: str) -> dict:
    return next(lb for lb in load_labels() if lb["id"] == log_id)


def _classify(log_id: str):
    lb = _label(log_id)
    text = (LOGS / f"{log_id}.log").read_text()
    return classify(
        text, exit_code=lb["exit_code"], watchdog=lb["watchdog"], metrics_nonfinite=lb["metrics_nonfinite"]
    ), lb


# One dev log per trap: (log, what the trap is)
TRAPS = [
    ("openrlhf_reward_func_typeerror_ray3_01", "reward bug wrapped in three RayTaskErrors: the actor's own line"),
    ("verl_dataset_keyerror_01", "Ray re-raises the KeyError: the first (actor) occurrence"),
    ("trl_reward_func_typeerror_01", "two ranks print the same error: rank 0, the first"),
    ("openrlhf_ref_watchdog_timeout_01", "Ray's '[repeated 14x across cluster]' copy is not the root"),
    ("trl_nccl_oom_03", "NCCL WARN Cuda failure 'out of memory' is cuda_oom, not an NCCL error"),
    ("openrlhf_vllm_kv_cache_small_01", "vLLM KV cache smaller than max seq len is cuda_oom"),
    ("openrlhf_watchdog_illegal_access_01", "an NCCL watchdog reporting an illegal access is not a timeout"),
    ("accelerate_device_assert_03", "the kernel's index assertion (config_error), not 'device-side assert triggered'"),
    ("slurm_time_limit_after_silence_01", "time limit after hours of silence is a hang"),
    ("slurm_preempted_01", "preemption during healthy progress is an external kill"),
    ("openrlhf_sigterm_while_healthy_03", "SIGTERM while healthy, trainer ConnectionError after it"),
    ("accelerate_sigint_user_01", "Ctrl-C: the launcher's 'Received 2 death signal'"),
    ("trl_grad_norm_nan_exit0_01", "grad_norm NaN with exit code 0"),
    ("trl_vllm_torch_mismatch_02", "a warning with 'undefined symbol' is the ABI mismatch"),
    ("transformers_hub_connection_error_04", "LocalEntryNotFoundError is the cause of the OSError after it"),
    ("deepspeed_batch_assertion_02", "DeepSpeed's batch assertion is a config error"),
    ("verl_actor_died_no_reason_03", "ActorDiedError with no reason stays unknown, on Ray's explanation line"),
]


@pytest.mark.parametrize("log_id,trap", TRAPS, ids=[t[0] for t in TRAPS])
def test_trap(log_id, trap):
    d, lb = _classify(log_id)
    assert (d.category, d.root_cause_line) == (lb["category"], lb["root_cause_line"]), trap


def test_explain_names_the_family_its_source_the_line_and_skipped_wrappers():
    text = (LOGS / "openrlhf_reward_func_typeerror_ray3_01.log").read_text()
    trace = explain(text, exit_code=1)
    fired = next(t for t in trace if t.startswith("family "))
    assert "reward_signature" in fired and "line 18" in fired and "CPython 3.11" in fired
    assert any(t.startswith("skipped wrapper line") and "RayTaskError(TypeError)" in t for t in trace)


def test_silence_needs_timestamps_on_both_sides():
    cancel = "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2024-01-01T10:00:00 DUE TO TIME LIMIT ***"
    log = f"step 1 ok\nstep 2 ok\n{cancel}\n"
    assert classify(log).category == CrashCategory.KILLED_EXTERNAL
    stamped = f"step 1 ok\nstep 2 ok\n2024-01-01 06:00:00,001 INFO waiting for the batch\n{cancel}\n"
    assert classify(stamped).category == CrashCategory.HANG_TIMEOUT
    recent = stamped.replace("06:00:00", "09:59:00")
    assert classify(recent).category == CrashCategory.KILLED_EXTERNAL


CANCEL = "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2024-01-01T10:00:00 DUE TO {why} ***"
STAMP = "2024-01-01 06:00:00,001 INFO waiting for the batch"


@pytest.mark.parametrize(
    "between, why, expected",
    [
        ("", "TIME LIMIT", CrashCategory.HANG_TIMEOUT),  # four silent hours before a time-limit kill
        (
            "  3%|▎         | 7/250 [04:01<2:19:10, 34.4s/it]\n",
            "TIME LIMIT",
            CrashCategory.KILLED_EXTERNAL,
        ),  # tqdm moved after it
        (
            "{'loss': 0.012, 'reward': 0.41, 'epoch': 0.3}\n",
            "TIME LIMIT",
            CrashCategory.KILLED_EXTERNAL,
        ),  # a metric line too
        ("Global step 12: {'reward': 0.4}\n", "TIME LIMIT", CrashCategory.KILLED_EXTERNAL),
        ("NCCL WARN NET/IB : retrying\n", "TIME LIMIT", CrashCategory.HANG_TIMEOUT),  # noise is not progress
        ("", "PREEMPTION", CrashCategory.KILLED_EXTERNAL),  # preemption says why: never a hang
        ("", "NODE FAILURE", CrashCategory.KILLED_EXTERNAL),
    ],
)
def test_a_kill_is_a_hang_only_when_the_log_shows_the_silence(between, why, expected):
    log = f"{STAMP}\n{between}{CANCEL.format(why=why)}\n"
    assert classify(log).category == expected


def test_a_gap_of_weeks_is_not_a_silence():
    """Timestamps a month apart come from another clock or an older run in the same file."""
    log = f"2023-12-01 06:00:00,001 INFO waiting for the batch\n{CANCEL.format(why='TIME LIMIT')}\n"
    assert classify(log).category == CrashCategory.KILLED_EXTERNAL


@pytest.mark.parametrize(
    "line, exit_code",
    [
        (
            "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=7.batch. Some of your processes may have been "
            "killed by the cgroup out-of-memory handler.",
            None,
        ),
        ("[ 514.68] Memory cgroup out of memory: Killed process 15617 (python3) total-vm:11892kB", 137),
        ("[ 514.68] python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0", 137),
        ("srun: error: n1: task 0: Out Of Memory", None),
        (
            "(raylet) node_manager.cc:2963: 3 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers "
            "crashed due to other reasons at node (ID: ab, IP: 10.0.0.1) over the last time period.",
            1,
        ),
        (
            "RuntimeError: [enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate memory: you "
            "tried to allocate 1024 bytes. Error code 12 (Cannot allocate memory)",
            1,
        ),
        (
            "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
            1,
        ),
    ],
)
def test_host_memory_exhaustion_in_any_of_its_forms_is_host_oom(line, exit_code):
    log = f"2024-01-01 06:00:00,001 INFO step 3 reward 0.4\n{line}\n"
    d = classify(log, exit_code=exit_code)
    assert (d.category, d.root_cause_line) == (CrashCategory.HOST_OOM, line)


@pytest.mark.parametrize(
    "line",
    [
        "subprocess.CalledProcessError: Command '['python', 'train.py']' died with <Signals.SIGKILL: 9>.",
        "[ERROR] [launch.py:434:sigkill_handler] ['python', '-u', 'main.py'] exits with return code = -9",
        "  traceback : Signal 9 (SIGKILL) received by PID 161617",
    ],
)
def test_a_direct_sigkill_with_no_memory_evidence_is_an_external_kill(line):
    """-9 is how a cancel, a scheduler or an unseen OOM killer looks; the log says nothing of memory (issue 47)."""
    d = classify(f"2024-01-01 06:00:00,001 INFO step 3 reward 0.4\n{line}\n", exit_code=1)
    assert (d.category, d.root_cause_line) == (CrashCategory.KILLED_EXTERNAL, line)


def test_a_time_limit_in_a_log_where_nothing_moved_is_a_stall():
    cancel = "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2024-01-01T10:00:00 DUE TO TIME LIMIT ***"
    assert classify(f"srun: Job step aborted\n{cancel}\n").category == CrashCategory.HANG_TIMEOUT
    assert classify(f"step 7 ok\n{cancel}\n").category == CrashCategory.KILLED_EXTERNAL


def test_ray_listing_the_oom_killer_as_one_possible_cause_is_not_host_oom():
    line = (
        "The actor is dead because its worker process has died. Worker exit type: UNEXPECTED_SYSTEM_EXIT "
        "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. There are "
        "some potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage."
    )
    assert classify(line + "\n", exit_code=1).category != CrashCategory.HOST_OOM
    zero = "(raylet) node_manager.cc:2963: 0 Workers (tasks / actors) killed due to memory pressure (OOM), 2 Workers"
    assert classify(zero + "\n", exit_code=1).category != CrashCategory.HOST_OOM
