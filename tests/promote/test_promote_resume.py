"""`autorl promote --resume`: a full run whose monitor went with its machine is started over as a new attempt on
the re-validation it recorded, and the lost one is marked interrupted.

First on the real case: SmolLM2's seed-1 promote on OpenRLHF, whose machine was given back at the full run's step 11
(tests/data/openrlhf-0.10.4/smollm2/h200x2-promote), its workspace restored from the ledger; this machine has no GPU,
so the restarted run is refused by preflight, and the monitor must record that rather than leave the row running.
Then end to end on the embedded engine: a full run's monitor and trainer SIGKILLed mid-run, resumed, and ending
with its weights."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
from conftest import git, run_cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "openrlhf-0.10.4" / "smollm2" / "h200x2-promote"


def _rows(ws: Path) -> dict[int, dict]:
    with closing(sqlite3.connect(ws / "ledger.sqlite")) as conn:
        conn.row_factory = sqlite3.Row
        return {r["number"]: dict(r) for r in conn.execute("SELECT * FROM autorl_trials")}


def _wait_end(ws: Path, number: int, timeout_s: float) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        row = _rows(ws)[number]
        if row["status"] != "running":
            return row
        time.sleep(1)
    raise AssertionError(f"full run {number} still running after {timeout_s} s")


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def _restored(tmp_path: Path, pid: int) -> Path:
    ledger = tmp_path / "ledger.sqlite"
    ledger.write_bytes((DATA / "study-ledger.sqlite").read_bytes())
    with closing(sqlite3.connect(ledger)) as db:
        db.execute("UPDATE autorl_trials SET pid = ? WHERE number = 25", (pid,))
        db.commit()
    ws = tmp_path / "ws"
    script = ROOT / "benchmarks" / "restore_workspace.py"
    subprocess.run([sys.executable, str(script), str(ledger), str(ws)], check=True, capture_output=True)
    return ws


def test_the_lost_smollm2_full_run_is_started_over_on_its_recorded_re_validation(tmp_path):
    ws = _restored(tmp_path, _dead_pid())
    out = run_cli("-C", str(ws), "promote", "--resume", "--json", timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert (got["resumed"], got["number"], got["promoted_from"]) == ("attempt-25-full-move-gens-32-lr-1em05", 26, 8)
    rows = _rows(ws)
    lost, new = rows[25], rows[26]
    assert lost["status"] == "interrupted" and "was gone" in lost["reason"]
    assert (new["kind"], new["retry_of"], new["promoted_from"]) == ("full", 25, 8)
    assert (new["delta"], new["ci_low"], new["gate"]) == (lost["delta"], lost["ci_low"], lost["gate"])
    # the same full-length recipe, committed from the lost run's start: nothing re-validated, nothing changed
    assert git(ws, "rev-parse", f"{new['start_tag']}^") == git(ws, "rev-parse", "attempt-25-start^{commit}")
    assert git(ws, "diff", "attempt-25-start", new["start_tag"]) == ""
    with closing(sqlite3.connect(ws / "ledger.sqlite")) as conn:
        kinds = [k for (k,) in conn.execute("SELECT kind FROM autorl_events WHERE trial_id IS NOT NULL")]
    assert "revalidation-run" in kinds and kinds.count("revalidation-run") == 4  # the old four; none new
    # no GPU here: preflight refuses the run, and the monitor records and closes it instead of dying with the row open
    ended = _wait_end(ws, 26, 240)
    assert ended["status"] == "config-error" and "preflight failed" in ended["reason"]
    assert ended["end_tag"] == "attempt-26-end"
    again = run_cli("-C", str(ws), "promote", "--resume", timeout=60)
    assert again.returncode == 2 and "nothing to resume" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1


def test_a_monitor_on_another_machine_of_a_shared_workspace_is_not_taken_for_lost(tmp_path):
    """Its pid means nothing here: status keeps following it, --resume refuses in one line naming the host, and
    goes on once the user has removed the record of a machine that is gone."""
    ws = _restored(tmp_path, _dead_pid())
    record = ws / ".autorl" / "runs" / "fullrun-25.monitor.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"pid": 4242, "host": "gpu-node-7"}))
    status = run_cli("-C", str(ws), "status", "--json")
    f = json.loads(status.stdout)["findings"]
    assert f["full_runs"][0]["monitor_host"] == "gpu-node-7" and f["next"]["command"] == "autorl status"
    assert "on gpu-node-7" in run_cli("-C", str(ws), "status").stdout
    before = (ws / "ledger.sqlite").read_bytes()
    refused = run_cli("-C", str(ws), "promote", "--resume", timeout=60)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "gpu-node-7" in refused.stderr and "fullrun-25.monitor.json" in refused.stderr
    assert (ws / "ledger.sqlite").read_bytes() == before
    record.unlink()
    resumed = run_cli("-C", str(ws), "promote", "--resume", "--json", timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    _wait_end(ws, json.loads(resumed.stdout)["number"], 240)  # refused by preflight here (no GPU), and recorded


def test_a_full_run_whose_monitor_lives_is_not_resumed(tmp_path):
    ws = _restored(tmp_path, os.getpid())
    out = run_cli("-C", str(ws), "promote", "--resume", timeout=60)
    assert out.returncode == 2 and "is running" in out.stderr, out.stderr
    assert _rows(ws)[25]["status"] == "running" and 26 not in _rows(ws)


def test_a_monitor_pid_now_another_process_s_is_taken_for_lost(tmp_path):
    """Promote recorded the monitor's pid on this host; the monitor has gone and the pid is now another process's
    (here: this test's own). Status reports the run lost and --resume starts it over; a pid that is still a
    full-run monitor is refused as running."""
    ws = _restored(tmp_path, _dead_pid())
    record = ws / ".autorl" / "runs" / "fullrun-25.monitor.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    monitor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "autorl.promote.fullrun"])
    try:
        record.write_text(json.dumps({"pid": monitor.pid, "host": socket.gethostname()}))
        refused = run_cli("-C", str(ws), "promote", "--resume", timeout=60)
        assert refused.returncode == 2 and "is running" in refused.stderr, refused.stderr
    finally:
        monitor.kill()
        monitor.wait()
    record.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    f = json.loads(run_cli("-C", str(ws), "status", "--json").stdout)["findings"]
    assert f["full_runs"][0]["monitor_alive"] is False and f["next"]["command"] == "autorl promote --resume"
    resumed = run_cli("-C", str(ws), "promote", "--resume", "--json", timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert _rows(ws)[25]["status"] == "interrupted"
    _wait_end(ws, json.loads(resumed.stdout)["number"], 240)  # refused by preflight here (no GPU), and recorded


def test_a_start_tag_without_the_re_validated_recipe_is_refused(tmp_path):
    """A lost run's start tag moved (here: onto the study's first recipe, as a faulty restore once left it, which
    cost a full run at the baseline's learning rate) is refused before anything is spent or written."""
    ws = _restored(tmp_path, _dead_pid())
    git(ws, "tag", "-f", "-a", "attempt-25-start", "attempt-01-start^{commit}", "-m", "moved")
    before = (ws / "ledger.sqlite").read_bytes()
    out = run_cli("-C", str(ws), "promote", "--resume", timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "does not hold attempt-08-move-gens-32-lr-1em05's recipe" in out.stderr
    assert "32" in out.stderr or "1e-05" in out.stderr
    assert (ws / "ledger.sqlite").read_bytes() == before and 26 not in _rows(ws)


FAST = ["--set", "steps=6", "--set", "eval_every=3", "--set", "batch_prompts=8", "--set", "verdict.baseline_repeats=2"]


def test_a_killed_full_run_resumed_ends_with_its_weights(workspace):
    r = run_cli(
        "-C", str(workspace), "run", "--max-trials", "3", "--budget", "5m", "--strategy", "random", "--set",
        "abort.pruner=false", *FAST, timeout=400,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    trial = next(t for t in _rows(workspace).values() if t["proposer"] != "baseline" and t["status"] == "complete")
    out = run_cli(
        "-C", str(workspace), "promote", str(trial["number"]), "--force", "--repeats", "1", "--steps", "30",
        "--json", timeout=400,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr + out.stdout
    launched = json.loads(out.stdout)
    number, monitor = launched["number"], launched["monitor_pid"]
    record = json.loads((workspace / ".autorl" / "runs" / f"fullrun-{number:02d}.monitor.json").read_text())
    assert record == {"pid": monitor, "host": socket.gethostname()}
    deadline = time.time() + 120
    while time.time() < deadline and _rows(workspace)[number]["pid"] == monitor:
        time.sleep(0.5)  # the monitor puts its trainer's pid on the row once launched
    trainer = _rows(workspace)[number]["pid"]
    assert trainer != monitor
    for pid in (monitor, trainer):  # the machine goes: the monitor and its trainer with it
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    assert _rows(workspace)[number]["status"] == "running"  # nobody left to say otherwise
    status = json.loads(run_cli("-C", str(workspace), "status", "--json").stdout)
    assert status["findings"]["next"]["command"] == "autorl promote --resume"
    again = run_cli("-C", str(workspace), "promote", "--resume", "--json", timeout=120)
    assert again.returncode == 0, again.stderr
    resumed = json.loads(again.stdout)
    assert _rows(workspace)[number]["status"] == "interrupted"
    row = _wait_end(workspace, resumed["number"], 400)
    assert row["status"] in ("complete", "early-stopped"), row
    assert row["retry_of"] == number and row["objective"] is not None
    result = json.loads(git(workspace, "show", f"{row['end_tag']}:results/{row['attempt']}.json"))
    assert result["best_checkpoint"]["weights"] and Path(result["best_checkpoint"]["weights"]).exists()
