"""One promote at a time in a workspace (two would share re-validation run names and worktrees), and `autorl status`
shows the one re-validating, with its progress: on a GPU, status said "nothing running" for its first three minutes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import run_cli

from autorl.errors import StudyBusyError
from autorl.ledger import Ledger
from autorl.workspace import Workspace

HOLD = textwrap.dedent("""
    import sys, time
    from autorl.workspace import Workspace
    lock = Workspace.open(sys.argv[1]).lock_promote("promote of attempt-03-h13-lr: re-validating, 4 runs, 2 at once")
    time.sleep(0.5)
    lock.say("promote of attempt-03-h13-lr: re-validating, 1 of 4 runs ended")
    print("held", lock.since, flush=True)
    time.sleep(120)
""")


@pytest.fixture
def promoting(command_ws):
    Ledger(command_ws / "ledger.sqlite").close()
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(command_ws)], stdout=subprocess.PIPE, text=True)
    try:
        word, since = proc.stdout.readline().split()
        assert word == "held"
        proc.since = float(since)
        yield command_ws, proc
    finally:
        proc.kill()
        proc.wait()


def test_status_shows_the_promote_re_validating_and_its_progress(promoting):
    ws, proc = promoting
    r = run_cli("-C", str(ws), "status", timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"promote of attempt-03-h13-lr: re-validating, 1 of 4 runs ended (pid {proc.pid}" in r.stdout
    assert "nothing running" not in r.stdout
    holder = json.loads(run_cli("-C", str(ws), "status", "--json", timeout=60).stdout)["promote"]
    assert holder["pid"] == proc.pid and holder["since"] == proc.since  # when it started, not when it last said


def test_a_second_promote_in_the_workspace_is_one_line_naming_the_first(promoting):
    ws, proc = promoting
    with pytest.raises(StudyBusyError, match=f"another `autorl promote` runs in this workspace \\(pid {proc.pid}"):
        Workspace.open(ws).lock_promote("promote of attempt-05")


def test_status_after_the_promote_ends_shows_none(promoting):
    ws, proc = promoting
    proc.kill()
    proc.wait()
    r = run_cli("-C", str(ws), "status", "--json", timeout=60)
    assert "promote" not in json.loads(r.stdout)
