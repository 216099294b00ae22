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

FLOORS = {"category": 115, "line": 127, "called_right": 105}  # of 132 dev logs; 115 calls not unknown
MAX_WRONG_CALLS = 10


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
