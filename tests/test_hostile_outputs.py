"""Hostile output folders and hostile tables of the user's own, through the real command: a report or an export
where no folder can be made or where the user's files already are, a local crash family whose regex backtracks
without end or matches every line, a label line that is only colour codes, and the modes of the files autorl
writes. Each refusal is one line on stderr naming the problem and what to do, exit 2, no traceback, no hang, and the
user's files are left byte for byte as they were."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import refused, run_cli
from tests.study_ledger import write_study

CRASHED = "15"  # the crashed trial of tests/study_ledger.py (cuda_oom, no log kept)
TIMEOUT = 120  # seconds: a refusal is immediate; a pattern that backtracks would run for hours
FAMILIES = Path(".autorl") / "triage" / "families.yaml"


def _files(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root``, a file's bytes (None for a folder); the ledger aside (SQLite's reads touch its
    side files)."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
        if not p.name.startswith("ledger.sqlite")
    }


def _cli(ws: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return run_cli("-C", str(ws), *args, timeout=TIMEOUT, **kw)


# ---- D1: triage export where no folder can be made ----------------------------------------------------------
def test_triage_export_where_no_folder_can_be_made_is_one_line(command_ws, tmp_path):
    write_study(command_ws)
    assert _cli(command_ws, "triage", "label", CRASHED, "unknown").returncode == 0
    afile = tmp_path / "afile"
    afile.write_text("keep\n")
    refused(_cli(command_ws, "triage", "export", "--out", str(afile / "sub")), str(afile / "sub"), "--out")
    assert afile.read_text() == "keep\n"
    if Path("/proc/self").is_dir():
        refused(_cli(command_ws, "triage", "export", "--out", "/proc/autorl-nope"), "/proc/autorl-nope", "--out")


# ---- D3: report into a folder that holds the user's files ---------------------------------------------------
def test_report_refuses_a_folder_of_the_users_own_files_and_changes_none(command_ws, tmp_path):
    write_study(command_ws)
    site = tmp_path / "site"
    (site / "logs").mkdir(parents=True)
    (site / "index.html").write_text("<p>my own page</p>\n")
    (site / "report.md").write_text("# my notes\n")
    (site / "logs" / "attempt-01-baseline.log").write_bytes(b"my log\x00\xff\n")
    before = _files(site)
    refused(_cli(command_ws, "report", "--out", str(site)), str(site), "not an autorl report", "--out")
    assert _files(site) == before


def test_report_refuses_the_workspace_its_git_folder_and_the_root(command_ws):
    write_study(command_ws)
    before = _files(command_ws)
    refused(_cli(command_ws, "report", "--out", "."), "is the workspace itself", "--out")
    refused(_cli(command_ws, "report", "--out", ".git"), "inside a .git folder", "--out")
    refused(_cli(command_ws, "report", "--out", ".git/report"), "inside a .git folder", "--out")
    refused(_cli(command_ws, "report", "--out", "/"), "root of the file system", "--out")
    assert _files(command_ws) == before


def test_report_rewrites_the_folders_it_wrote_run_after_run(command_ws, tmp_path):
    """The default folder and a new --out folder are marked as autorl's and written again on the next report; the
    user's file added beside a marked report is kept."""
    write_study(command_ws)
    out = tmp_path / "new" / "report"
    for _ in range(2):
        r = _cli(command_ws, "report")
        assert r.returncode == 0, r.stderr
        r = _cli(command_ws, "report", "--out", str(out))
        assert r.returncode == 0, r.stderr
        (out / "mine.txt").write_text("the user's own\n")
    assert (command_ws / ".autorl" / "report" / ".autorl-report").is_file()
    assert (out / ".autorl-report").is_file() and (out / "mine.txt").read_text() == "the user's own\n"
    assert sorted(p.name for p in out.iterdir()) == [
        ".autorl-report",
        "index.html",
        "logs",
        "mine.txt",
        "plots",
        "report.md",
    ]


# ---- D4: modes of files written atomically -----------------------------------------------------------------
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_files_autorl_writes_get_the_mode_open_would_give(command_ws, tmp_path, umask, mode):
    write_study(command_ws)
    assert _cli(command_ws, "triage", "label", CRASHED, "unknown", umask=umask).returncode == 0
    out = tmp_path / "export"
    assert _cli(command_ws, "triage", "export", "--out", str(out), umask=umask).returncode == 0
    written = [command_ws / FAMILIES, out / "labels.yaml", *(out / "logs").iterdir()]
    assert [oct(stat.S_IMODE(p.stat().st_mode)) for p in written] == [oct(mode)] * len(written)
    (command_ws / FAMILIES).chmod(0o664)  # a file rewritten keeps the mode it had, as open(path, "w") keeps it
    assert _cli(command_ws, "triage", "label", CRASHED, "config_error", umask=umask).returncode == 0
    assert stat.S_IMODE((command_ws / FAMILIES).stat().st_mode) == 0o664


# ---- H1 and H2: local crash families that hang triage or file every line -----------------------------------
def _families(ws: Path, pattern: str) -> Path:
    path = ws / FAMILIES
    path.parent.mkdir(parents=True, exist_ok=True)
    quoted = "'" + pattern.replace("'", "''") + "'"
    path.write_text(
        f"families:\n- id: local_x\n  category: cuda_oom\n  priority: 1000\n  remedy: do x\n"
        f"  messages:\n  - re: {quoted}\n"
    )
    return path


@pytest.mark.parametrize("pattern", ["^(a|aa)+$", r"(\w*)*$", "^(a+)+$", "(x|xy|)*z", ".*.*.*z"])
def test_a_local_family_that_backtracks_without_end_is_refused_not_run(command_ws, tmp_path, pattern):
    path = _families(command_ws, pattern)
    log = tmp_path / "redos.log"
    log.write_text("Traceback (most recent call last):\n" + "a" * 60 + "b\n" + "x" * 3000 + "\n")
    r = _cli(command_ws, "triage", "classify", str(log))
    refused(r, str(path), repr(pattern), "can take unbounded time to match", "fix the file")


def test_triage_label_never_adds_to_a_families_file_that_would_hang(command_ws):
    write_study(command_ws)
    path = _families(command_ws, "^(a|aa)+$")
    before = path.read_bytes()
    refused(_cli(command_ws, "triage", "label", CRASHED, "unknown"), str(path), "'^(a|aa)+$'", "fix the file")
    assert path.read_bytes() == before


@pytest.mark.parametrize("line", ["\x1b[31m", "\x1b[0m \x1b[1;33m", "[rank0]: "])
def test_a_label_line_that_is_empty_once_cleaned_isrefused(command_ws, line):
    write_study(command_ws)
    refused(_cli(command_ws, "triage", "label", CRASHED, "cuda_oom", "--line", line), "--line", "empty")
    assert not (command_ws / FAMILIES).exists()


def test_a_local_family_that_matches_every_line_isrefused(command_ws, tmp_path):
    """What the colour-code label used to write: ``re: ''`` filed every later crash as its category."""
    path = _families(command_ws, "")
    log = tmp_path / "fine.log"
    log.write_text("hello world\nall fine\n")
    refused(_cli(command_ws, "triage", "classify", str(log), "--exit-code", "1"), str(path), "matches any line")
