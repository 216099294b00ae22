"""`autorl triage label` and `autorl triage export` end to end on a real study's crash (issue 47).

A fresh workspace runs a study whose baseline dies with a real Python exception (real git, SQLite, child process);
the crash is then labelled, the label checked in the ledger and in the workspace's own families, later triage in
that workspace checked to use it, bad input checked to change nothing, and the export checked to be in the format
of the corpus of real logs (tests/data/crashes_real).
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from autorl.judge import triage
from autorl.judge.triage_labels import line_pattern, local_family
from autorl.states import CrashCategory

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "scripts"
ROOT_LINE = "IndexError: list index out of range"


def _digest(ws: Path) -> str:
    """The ledger's rows and the workspace's local families, hashed: what a refused label must leave alone."""
    conn = sqlite3.connect(ws / "ledger.sqlite")
    rows = [conn.execute(f"SELECT * FROM {t}").fetchall() for t in ("autorl_trials", "autorl_events")]
    labels = conn.execute("SELECT * FROM autorl_crash_labels").fetchall()
    families = ws / ".autorl" / "triage" / "families.yaml"
    text = families.read_text() if families.exists() else ""
    return hashlib.sha256(repr((rows, labels, text)).encode()).hexdigest()


@pytest.fixture(scope="module")
def crashed(tmp_path_factory) -> tuple[Path, dict]:
    """A workspace whose study's baseline crashed, and that trial's ledger row."""
    ws = tmp_path_factory.mktemp("labels") / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    recipe = {
        "name": "crash",
        "backend": "command",
        "train": {"argv": [sys.executable, str(SCRIPTS / "crash.py"), "{run_dir}/m.jsonl"], "lr": 0.1},
        "search": {"lr": {"low": 0.01, "high": 0.2, "log": True}},
        "verdict": {"baseline_repeats": 1},
        "timeout_s": 60,
    }
    (ws / "recipes" / "crash.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    r = run_cli("-C", str(ws), "run", "recipes/crash.yaml", "--budget", "5m", "--max-trials", "2", timeout=300)
    assert r.returncode == 1, r.stderr + r.stdout  # the baseline crashed: the study measured nothing
    conn = sqlite3.connect(ws / "ledger.sqlite")
    conn.row_factory = sqlite3.Row
    row = dict(conn.execute("SELECT * FROM autorl_trials ORDER BY number LIMIT 1").fetchone())
    assert row["status"] == "crash" and row["crash_category"] == "user_code_error", row
    return ws, row


@pytest.mark.slow
def test_label_records_the_correction_and_later_triage_in_the_workspace_uses_it(crashed):
    ws, row = crashed
    n = str(row["number"])
    r = run_cli("-C", str(ws), "triage", "label", n, "config_error", "--line", ROOT_LINE, "--json")
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert (done["category"], done["root_cause_line"], done["was"]) == ("config_error", ROOT_LINE, "user_code_error")
    conn = sqlite3.connect(ws / "ledger.sqlite")
    label = conn.execute("SELECT number, category, root_cause_line, was_category FROM autorl_crash_labels").fetchall()
    assert label == [(row["number"], "config_error", ROOT_LINE, "user_code_error")]
    assert conn.execute("SELECT count(*) FROM autorl_events WHERE kind = 'crash-label'").fetchone()[0] == 1
    families = yaml.safe_load((ws / ".autorl" / "triage" / "families.yaml").read_text())["families"]
    assert [f["category"] for f in families] == ["config_error"]
    # later triage in this workspace files the same failure (another index, another rank) as labelled
    log = ws / "other.log"
    log.write_text('Traceback (most recent call last):\n  File "/srv/train.py", line 9\n[rank3]: ' + ROOT_LINE + "\n")
    d = json.loads(run_cli("-C", str(ws), "triage", "classify", str(log), "--json").stdout)
    assert (d["category"], d["root_cause_line"]) == ("config_error", "[rank3]: " + ROOT_LINE)
    outside = json.loads(run_cli("-C", str(ws.parent), "triage", "classify", str(log), "--json").stdout)
    assert outside["category"] == "user_code_error"  # outside the workspace its families do not apply


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, says",
    [
        (["config_eror"], "no crash category 'config_eror'"),
        (["output_collapse"], "no crash category 'output_collapse'"),  # decided from metrics, never from a log
        (["config_error", "--line", "a line that is not in the log"], "is not a line of trial"),
        (["config_error", "--line", "  "], "must be one non-empty line"),
        (["config_error", "--line", "two\nlines"], "must be one non-empty line"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(crashed, args, says):
    ws, row = crashed
    before = _digest(ws)
    r = run_cli("-C", str(ws), "triage", "label", str(row["number"]), *args)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert _digest(ws) == before
    r = run_cli("-C", str(ws), "triage", "label", "99", "config_error")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert _digest(ws) == before


@pytest.mark.slow
def test_export_writes_the_labelled_crashes_in_the_corpus_format(crashed, tmp_path):
    ws, row = crashed
    run_cli("-C", str(ws), "triage", "label", str(row["number"]), "config_error", "--line", ROOT_LINE)
    out = tmp_path / "export"
    r = run_cli("-C", str(ws), "triage", "export", "--out", str(out))
    assert r.returncode == 0, r.stderr
    labels = yaml.safe_load((out / "labels.yaml").read_text())
    corpus = yaml.safe_load((Path(__file__).resolve().parents[1] / "data" / "crashes_real" / "labels.yaml").read_text())
    assert [set(lb) for lb in labels] == [set(corpus[0])]  # the corpus's fields, no more, no fewer
    (label,) = labels
    assert (label["category"], label["root_cause_line"]) == ("config_error", ROOT_LINE)
    text = (out / "logs" / f"{label['id']}.log").read_text()
    assert ROOT_LINE in text.splitlines() and "Traceback (most recent call last):" in text
    r = run_cli("-C", str(ws), "triage", "export", "--out", str(out / "labels.yaml"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_label_pattern_matches_the_same_failure_with_other_numbers_and_prefixes():
    rx = line_pattern("(ActorModelRayActor pid=81) ValueError: batch 12 at 0x7f3a2b1c not divisible by 7")
    assert re.search(rx, triage.clean("[rank2]: ValueError: batch 96 at 0x11aa not divisible by 3"))
    assert not re.search(rx, "ValueError: batch 96 at 0x11aa not divisible by three")
    family = local_family(4, CrashCategory.CONFIG_ERROR, "ValueError: batch 12 not divisible by 7")
    assert family.priority > max(f.priority for f in triage.load_rules().families)


def test_an_unknown_names_the_likeliest_lines_and_their_families():
    log = "step 3 ok\nFatal Python error: Segmentation fault\n"
    d = triage.classify(log, exit_code=-11)
    assert d.category == CrashCategory.UNKNOWN and d.candidates
    first = d.candidates[0]
    assert (first.family, first.category, first.line) == ("segfault", "illegal_memory_access", d.root_cause_line)
    assert "CPython" in first.printed_by and 0 < first.score < triage.load_rules().min_confidence
