"""Crash triage on the dev half of the corpus of real failure logs (tests/data/crashes_real), and the rules issue 47
added: an OOM read by its own accounting, a stated confidence, candidates for an unknown.

Only the dev half is scored here: the blind half is scored by benchmarks/triage_corpus.py once per rules change.
The floors are the counts the rules reached (benchmarks/README.md, "Crash triage on 254 real failure logs").
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from triage_corpus import load_labels, run_one, score  # noqa: E402

from autorl.judge.triage import classify, load_rules, others_share  # noqa: E402
from autorl.states import CrashCategory  # noqa: E402

FLOORS = {"category": 123, "line": 129, "called_right": 112}  # of 132 dev logs; 115 calls not unknown
MAX_WRONG_CALLS = 3


@pytest.fixture(scope="module")
def dev() -> list[dict]:
    return [run_one(label) for label in load_labels() if label["split"] == "dev"]


def test_dev_half_does_not_fall(dev):
    s = score(dev)
    assert (s["category"], s["line"], s["called_right"]) >= tuple(FLOORS.values()), s
    assert s["called"] - s["called_right"] <= MAX_WRONG_CALLS, s


OLD_FORMAT = (
    "RuntimeError: CUDA out of memory. Tried to allocate 216.00 MiB (GPU 0; 7.92 GiB total capacity; 69.17 MiB "
    "already allocated; 24.56 MiB free; 86.00 MiB reserved in total by PyTorch)"
)
OWN = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.64 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 2.91 GiB is free. Including non-PyTorch memory, this process has 76.26 GiB memory in use."
)
OTHERS = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 1.10 GiB is free. Process 811 has 60.02 GiB memory in use. Including non-PyTorch memory, this process "
    "has 18.04 GiB memory in use."
)


@pytest.mark.parametrize(
    "line, share, category",
    [
        (OLD_FORMAT, 0.98, CrashCategory.SHARED_GPU),  # the process held 86 MiB of a full 8 GiB card
        (OWN, 0.0, CrashCategory.CUDA_OOM),
        (OTHERS, 0.76, CrashCategory.SHARED_GPU),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", None, CrashCategory.CUDA_OOM),
    ],
)
def test_an_oom_is_read_by_its_own_accounting(line, share, category):
    got = others_share(line)
    assert (got is None) == (share is None) and (share is None or abs(got - share) < 0.01), got
    d = classify(f"step 3\n{line}\n", exit_code=1)
    assert (d.category, d.root_cause_line) == (category, line)


def test_a_call_below_the_stated_confidence_is_unknown_with_candidates():
    rules = load_rules()
    assert 0 < rules.min_confidence < 1 and rules.candidates == 3
    log = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/usr/lib/python3.11/site-packages/datasets/arrow_dataset.py", line 9, in __getitem__',
            "KeyError: 'reward_model'",
            "Fatal Python error: Segmentation fault",
        ]
    )
    d = classify(log, exit_code=-11)
    assert d.category == CrashCategory.UNKNOWN and d.score < rules.min_confidence
    assert [c.family for c in d.candidates][:2] == ["segfault", "missing_key_in_library"]
    assert all(c.printed_by for c in d.candidates)


def test_an_elastic_summary_never_outranks_the_ranks_own_error():
    own = "[rank1]: ValueError: num_generations (8) must be divisible by the batch"
    summary = (
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 1 (pid: 77) of binary"
    )
    d = classify(f"{summary}\n{own}\n", exit_code=1)
    assert (d.category, d.root_cause_line) == (CrashCategory.CONFIG_ERROR, own)
    alone = classify(f"step 1\n{summary}\n", exit_code=1)
    assert (alone.category, alone.root_cause_line) == (CrashCategory.UNKNOWN, summary)


CORPUS = ROOT / "tests" / "data" / "crashes_real"


def _dev(log_id: str) -> tuple[dict, object]:
    """A dev log of the corpus of real logs, its label and triage's verdict (a blind log is refused)."""
    label = next(lb for lb in load_labels() if lb["id"] == log_id)
    assert label["split"] == "dev", log_id
    text = (CORPUS / "logs" / f"{log_id}.log").read_text(errors="replace")
    return label, classify(text, exit_code=label.get("exit_code"))


@pytest.mark.parametrize(
    "log_id, what",
    [
        ("k8s-container-terminated-exit-137_01", "exit 137 with no memory evidence: an external kill"),
        ("user-maskrcnn-training-killed-no-message_01", "the shell's Killed, emphasised as the thread shows it"),
        ("vllm-oom-other-processes-15g_01", "an old-format OOM: others held 36 % of the card"),
        ("trl-ci-sft-test-oom-four-processes-share-gpu_01", "a new-format OOM naming the other processes"),
        ("vllm-free-memory-7gib-of-140-startup_01", "vLLM alone finding its card full at start-up"),
        ("pytorch-device-side-assert-vocab-train_01", "a kernel's index assertion: a token id past the vocabulary"),
        ("ray-train-keyerror-label-column_01", "a KeyError raised in a compiled library frame: a missing column"),
        ("vllm-nccl-unhandled-system-error-init_01", "NCCL's unhandled system error alone names no cause"),
    ],
)
def test_the_real_corpus_conventions_hold_on_its_dev_logs(log_id, what):
    label, d = _dev(log_id)
    assert (d.category, d.root_cause_line.rstrip()) == (label["category"], label["root_cause_line"].rstrip()), what


STAMP = "2024-01-01 06:00:00,001 INFO step 3 reward 0.4"


@pytest.mark.parametrize(
    "tail, exit_code, category",
    [
        ("Killed", None, CrashCategory.KILLED_EXTERNAL),
        ("> **Killed**", None, CrashCategory.KILLED_EXTERNAL),
        ("srun: error: n1: task 0: Killed", None, CrashCategory.KILLED_EXTERNAL),
        ("command terminated with exit code 137", None, CrashCategory.KILLED_EXTERNAL),
        ("step 4", 137, CrashCategory.KILLED_EXTERNAL),  # the exit code alone
        # the same kill with the kernel's own report of memory: host_oom, whichever line comes first
        ("[ 9.1] Out of memory: Killed process 811 (python) total-vm:9kB\nKilled", 137, CrashCategory.HOST_OOM),
        ("Killed\nslurmstepd: error: Detected 1 oom-kill event(s) in StepId=7.batch.", None, CrashCategory.HOST_OOM),
        ("terminate called after throwing an instance of 'std::bad_alloc'", -6, CrashCategory.HOST_OOM),
    ],
)
def test_a_sigkill_is_host_oom_only_with_memory_evidence(tail, exit_code, category):
    d = classify(f"{STAMP}\n{tail}\n", exit_code=exit_code)
    assert d.category == category, d


NO_OWN_FIGURE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 1.10 GiB is free. Of the allocated memory 40.00 GiB is allocated by PyTorch, and 10.00 GiB is reserved "
    "by PyTorch but unallocated."
)


@pytest.mark.parametrize(
    "line, category",
    [
        # PyTorch's figures alone put 35 % outside its allocator: in the failing process too (a CUDA context, NCCL, an
        # inference engine's own pool), so not enough to blame other processes
        (NO_OWN_FIGURE, CrashCategory.CUDA_OOM),
        # the same card with another process named in the message: it holds a quarter or more
        (
            NO_OWN_FIGURE.replace("is free. ", "is free. Process 811 has 27.00 GiB memory in use. "),
            CrashCategory.SHARED_GPU,
        ),
        # 'this process has' settles it: others hold 24 % -> the run's own OOM; 30 % -> shared
        (
            OWN.replace("2.91 GiB is free", "2.91 GiB is free. Process 9 has 19.00 GiB memory in use").replace(
                "76.26", "57.26"
            ),
            CrashCategory.CUDA_OOM,
        ),
        (
            OWN.replace("2.91 GiB is free", "2.91 GiB is free. Process 9 has 24.00 GiB memory in use").replace(
                "76.26", "52.26"
            ),
            CrashCategory.SHARED_GPU,
        ),
    ],
)
def test_an_oom_blames_other_processes_only_on_figures_that_show_them(line, category):
    d = classify(f"step 3\n{line}\n", exit_code=1)
    assert (d.category, d.root_cause_line) == (category, line)


INDEX = (
    "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1231: indexSelectSmallIndex: block: [31,0,0], thread: [116,0,0] "
    "Assertion `srcIndex < srcSelectDimSize` failed."
)
BCE = (
    "/pytorch/aten/src/ATen/native/cuda/Loss.cu:94: operator(): block: [0,0,0], thread: [3,0,0] "
    "Assertion `input_val >= zero && input_val <= one` failed."
)
ASSERT = "RuntimeError: CUDA error: device-side assert triggered"


@pytest.mark.parametrize(
    "first, category",
    [(INDEX, CrashCategory.CONFIG_ERROR), (BCE, CrashCategory.ILLEGAL_MEMORY_ACCESS)],
)
def test_a_kernel_index_assertion_is_the_data_and_others_stay_kernel_faults(first, category):
    d = classify(f"{first}\n{first}\nTraceback (most recent call last):\n{ASSERT}\n", exit_code=1)
    assert (d.category, d.root_cause_line) == (category, first)


NCCL_SYSTEM = "[rank0]: RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"


def test_a_generic_nccl_error_is_unknown_alone_and_an_echo_beside_a_ranks_own_error():
    alone = classify(f"{STAMP}\n{NCCL_SYSTEM}\n", exit_code=1)
    assert alone.category == CrashCategory.UNKNOWN and alone.root_cause_line == NCCL_SYSTEM
    assert (alone.candidates[0].family, alone.candidates[0].category) == (
        "nccl_setup_error",
        CrashCategory.DISTRIBUTED_TIMEOUT,
    )
    own = "[rank1]: ZeroDivisionError: division by zero"
    frame = '[rank1]:   File "/srv/rewards.py", line 12, in accuracy'
    both = classify(f"{STAMP}\n{NCCL_SYSTEM}\n{frame}\n{own}\n", exit_code=1)
    assert (both.category, both.root_cause_line) == (CrashCategory.USER_CODE_ERROR, own)


def test_a_bare_timeout_error_is_a_stall_only_where_vllms_engine_core_printed_it():
    engine = "(EngineCore_DP0 pid=18052) ERROR 02-03 22:43:35 [core.py:968] TimeoutError"
    d = classify(f"{STAMP}\n(EngineCore_DP0 pid=18052) ERROR 02-03 22:43:35 [core.py:968] Traceback\n{engine}\n")
    assert (d.engine, d.category, d.root_cause_line) == ("vllm_core", CrashCategory.HANG_TIMEOUT, engine)
    plain = classify(f'{STAMP}\nTraceback (most recent call last):\n  File "/srv/reward.py", line 3\nTimeoutError\n')
    assert plain.category != CrashCategory.HANG_TIMEOUT


@pytest.mark.parametrize(
    "line, category",
    [
        ("{'loss': NaN, 'grad_norm': NaN, 'learning_rate': 1e-06, 'epoch': 0.2}", CrashCategory.NAN_DIVERGENCE),
        ("iteration 40 | Loss: NaN | lr 1e-6", CrashCategory.NAN_DIVERGENCE),
        (
            "safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
            'message: "No space" })',
            CrashCategory.DISK_FULL,
        ),
        ("sqlite3.OperationalError: database or disk is full", CrashCategory.DISK_FULL),
        (
            "urllib3.exceptions.NameResolutionError: <urllib3.connection.HTTPSConnection object at 0x7f>: Failed to "
            "resolve 'huggingface.co' ([Errno -3] Temporary failure in name resolution)",
            CrashCategory.NETWORK_UNAVAILABLE,
        ),
        (
            "ImportError: libcudart.so.12: version `GLIBCXX_3.4.32' not found (required by /opt/x.so)",
            CrashCategory.BACKEND_INCOMPAT,
        ),
        (
            "ValueError: The decoder prompt (length 9000) is longer than the maximum model length of 8192. Make sure "
            "that `max_model_len` is no smaller than the number of text tokens.",
            CrashCategory.CONFIG_ERROR,
        ),
    ],
)
def test_the_libraries_wordings_of_a_class_are_read_whatever_their_case(line, category):
    d = classify(f"{STAMP}\n{line}\n", exit_code=1)
    assert (d.category, d.root_cause_line) == (category, line)
