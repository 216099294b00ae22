"""A study started on a card another process had filled, on real OpenRLHF 0.10.4 on one H200, replayed on the CPU
(tests/data/openrlhf-0.10.4/small/filled-card; its README says what ran).

What a user must get from it: the crash filed as the neighbour's (`shared_gpu`, not the trial's out-of-memory),
one retry with the same values, a study that stops with `autorl triage` as its next step, the search's region left
open, and nothing left on the card or on the host afterwards."""

from __future__ import annotations

import shutil
from pathlib import Path

from autorl.judge.triage import classify
from tests.conftest import run_cli

RUN = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "small" / "filled-card"
VLLM_LINE = "ValueError: Free memory on device cuda:0 (3.67/139.8 GiB) on startup is less than desired GPU memory"


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    shutil.copy(RUN / "study-ledger.sqlite", ws / "ledger.sqlite")
    return ws


def test_each_trials_log_is_triaged_as_the_neighbours_memory_not_its_own():
    for name in ("attempt-01-baseline", "attempt-02-retry-baseline"):
        d = classify((RUN / f"{name}-train.log").read_text(errors="replace"), exit_code=1)
        assert d.category == "shared_gpu" and VLLM_LINE in d.root_cause_line, (name, d.category)


def test_the_study_filed_it_so_retried_once_unchanged_and_stopped_with_triage_next(tmp_path):
    ws = _workspace(tmp_path)
    listing = run_cli("-C", str(ws), "ledger").stdout
    assert "01  crash (shared_gpu)" in listing and "02  crash (shared_gpu)" in listing
    assert "retry: nothing changed" in listing  # the same values, not a smaller batch
    tail = (RUN / "study-tail.txt").read_text()
    assert "shared_gpu again after 1 retry" in tail and "Next: autorl triage" in tail


def test_triage_says_the_region_stays_open_for_a_crash_the_values_did_not_cause(tmp_path):
    """The day's triage said "region avoided after repeats" for every group of two; the rules table never avoids
    the region of a shared_gpu crash (`avoid: false`), and the controller did not: the review now says so."""
    assert "region avoided after repeats" in " ".join((RUN / "triage-as-filed.txt").read_text().split())
    out = " ".join(run_cli("-C", str(_workspace(tmp_path)), "triage").stdout.split())
    assert "shared_gpu ×2" in out and "region not avoided (the trial's values did not cause it)" in out
    assert "region avoided after repeats" not in out


def test_nothing_was_left_on_the_card_or_the_host():
    before = (RUN / "oom-card.txt").read_text().splitlines()
    assert before[1].startswith("138879 MiB") and len(before) == 4  # the hog, alone
    after = (RUN / "oom-after.txt").read_text().splitlines()
    assert after == ["pid, used_gpu_memory [MiB]"]  # no GPU process, no Ray process listed


def test_the_region_line_follows_the_rules_table_for_each_category():
    from autorl.present.review import _region

    assert _region("cuda_oom", 2) == "; region avoided after repeats"  # a batch that does not fit: avoided
    assert _region("cuda_oom", 1) == ""  # once is not a repeat
    assert _region("shared_gpu", 5).startswith("; region not avoided")
    assert _region(None, 2) == "; region avoided after repeats"  # no category: as the controller does


def test_label_and_export_end_to_end_on_this_real_crash(tmp_path):
    """`autorl triage label` then `export` on the study's own crash, in a copy of its workspace (the ledger names
    the logs where the study ran; the copy holds them in its own run folder): the export is the corpus's format,
    its log holds the labelled line, and the action is the remedy of the family that files this log."""
    import yaml

    ws = _workspace(tmp_path)
    run = ws / ".autorl" / "runs" / "attempt-01-baseline"
    run.mkdir(parents=True)
    shutil.copy(RUN / "attempt-01-baseline-train.log", run / "train.log")
    line = next(x for x in (run / "train.log").read_text().splitlines() if "Free memory on device" in x)
    labelled = run_cli("-C", str(ws), "triage", "label", "1", "shared_gpu", "--line", line)
    assert labelled.returncode == 0 and "trial 01 labelled shared_gpu" in labelled.stdout, labelled.stderr
    out = tmp_path / "export"
    assert run_cli("-C", str(ws), "triage", "export", "--out", str(out)).returncode == 0
    (entry,) = yaml.safe_load((out / "labels.yaml").read_text())
    assert entry["category"] == "shared_gpu" and entry["library"] == "openrlhf" and entry["exit_code"] == 1
    assert entry["action"].startswith("The card was already holding other processes' memory")
    log = (out / "logs" / f"{entry['id']}.log").read_text()
    assert entry["root_cause_line"] in log.splitlines() and len(log.splitlines()) > 10
    d = classify(log, exit_code=1)
    assert d.category == "shared_gpu" and d.root_cause_line.rstrip() == entry["root_cause_line"].rstrip()
