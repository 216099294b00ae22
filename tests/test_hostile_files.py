"""Hostile files where the real command reads or writes them: a reward, a task or a patch that is not UTF-8, a
run log that is a folder, a FIFO or an endless device, a reward package whose ``__init__`` raises or exits, a run
folder that cannot be made, a ``--metrics-out`` that is a device or a FIFO. Each ends with one line on stderr naming
what is wrong and what to do, exit 2, no traceback, no hang, and nothing written (a review command shows the trial
without its log, saying so)."""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import pytest

from autorl.ledger import Ledger
from tests.conftest import git, refused, run_cli
from tests.study_ledger import write_study

TIMEOUT = 120  # seconds: a hang is a failure, not a stuck suite
LATIN1_REWARD = b"def reward(completion, label):\n    return 1.0  # caf\xe9\n"
LATIN1_TASK = b'{"input": "1+1=", "label": "2 caf\xe9"}\n'


def _cli(ws: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return run_cli("-C", str(ws), *args, timeout=TIMEOUT, **kw)


def _train(ws: Path, *args: str, dry: bool = True) -> subprocess.CompletedProcess:
    return _cli(ws, "train", "recipes/default.yaml", *(["--dry-run"] if dry else ["--set", "steps=1"]), *args)


def _nothing_trained(ws: Path) -> None:
    train = ws / ".autorl" / "train"
    assert not train.exists() or not any(train.iterdir()), sorted(train.rglob("*"))


# ---- A1: a reward file that is not UTF-8 ------------------------------------------------------------------------


@pytest.mark.parametrize("dry", [True, False])
def test_a_reward_file_that_is_not_utf8_is_one_line(command_ws, dry):
    (command_ws / "latin1_reward.py").write_bytes(LATIN1_REWARD)
    r = _train(command_ws, "--set", "reward=latin1_reward.py", dry=dry)
    refused(r, "train.reward", "latin1_reward.py", "not UTF-8", "byte 52", "save it as UTF-8")
    _nothing_trained(command_ws)


def test_a_reward_file_that_declares_its_encoding_is_accepted(command_ws):
    (command_ws / "declared.py").write_bytes(b"# -*- coding: latin-1 -*-\n" + LATIN1_REWARD)
    r = _train(command_ws, "--set", "reward=declared.py")
    assert r.returncode == 0, r.stderr


def test_a_reward_file_with_a_nul_byte_names_no_line_none(command_ws):
    (command_ws / "nul.py").write_bytes(b"def reward(c, l):\n    return 1.0\x00\n")
    line = refused(_train(command_ws, "--set", "reward=nul.py"), "train.reward", "nul.py", "fix the reward")
    assert "line None" not in line


def test_a_study_with_a_reward_file_that_is_not_utf8_is_one_line(command_ws):
    (command_ws / "badenc.py").write_bytes(LATIN1_REWARD)
    git(command_ws, "add", "badenc.py")
    git(command_ws, "commit", "-qm", "reward")
    r = _cli(command_ws, "run", "--set", "reward=badenc.py", "--max-trials", "1", "--budget", "1m")
    refused(r, "badenc.py", "not UTF-8")


# ---- A2: a run log that is not a readable file --------------------------------------------------------------------


def _limited_memory() -> None:  # an endless read is a MemoryError here, not a machine out of memory
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("kind", ["folder", "fifo", "dev-zero"])
@pytest.mark.parametrize("args", [["show", "15"], ["show", "15", "--json"], ["triage", "15"]])
def test_a_log_that_is_not_a_regular_file_is_shown_without_it(command_ws, tmp_path, kind, args):
    write_study(command_ws)
    log = tmp_path / "train.log"
    if kind == "folder":
        log.mkdir()
    elif kind == "fifo":
        os.mkfifo(log)
    else:
        os.symlink("/dev/zero", log)
    led = Ledger(command_ws / "ledger.sqlite")
    led.update_trial(led.trial(15).id, log_path=str(log))
    led.close()
    r = _cli(command_ws, *args, preexec_fn=_limited_memory)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    assert "Traceback" not in r.stderr and not r.stderr, r.stderr
    assert "not a regular file" in r.stdout and str(log) in r.stdout, r.stdout


# ---- A3: a patch that is not UTF-8, or a folder named *.patch ----------------------------------------------------


@pytest.mark.parametrize("action", ["check", "apply"])
def test_a_patch_that_is_not_utf8_is_one_line(tmp_path, action):
    pdir = tmp_path / "pdir"
    pdir.mkdir()
    (pdir / "x.patch").write_bytes(b"--- a/x.py\n+++ b/x.py\n# caf\xe9\n")
    r = run_cli("patches", action, "--patches-dir", str(pdir), "--site-packages", str(tmp_path), timeout=TIMEOUT)
    refused(r, "x.patch", "not UTF-8", "line 3, byte 27")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pdir"]


@pytest.mark.parametrize("action", ["check", "apply"])
def test_a_folder_named_like_a_patch_is_one_line(tmp_path, action):
    pdir = tmp_path / "pdir"
    (pdir / "odd.patch").mkdir(parents=True)
    r = run_cli("patches", action, "--patches-dir", str(pdir), "--site-packages", str(tmp_path), timeout=TIMEOUT)
    refused(r, "odd.patch", "is a folder")


# ---- A4: a task JSONL that is not UTF-8 -------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["task", "eval_id", "eval_ood"])
def test_a_task_file_that_is_not_utf8_is_refused_before_the_run(command_ws, field):
    good = b'{"input": "1+1=", "label": "2"}\n'
    (command_ws / "good.jsonl").write_bytes(good)
    (command_ws / "bad.jsonl").write_bytes(good + LATIN1_TASK)
    task = [] if field == "task" else ["--set", "task=good.jsonl"]
    r = _train(command_ws, *task, "--set", f"{field}=bad.jsonl")
    refused(r, f"train.{field}", "bad.jsonl", "line 2", "not UTF-8", "save it as UTF-8")


def test_a_real_run_on_a_task_file_that_is_not_utf8_starts_nothing(command_ws):
    (command_ws / "task.jsonl").write_bytes(LATIN1_TASK)
    r = _train(command_ws, "--set", "task=task.jsonl", dry=False)
    refused(r, "train.task", "task.jsonl", "byte 33", "not UTF-8")
    _nothing_trained(command_ws)


# ---- B1: a reward package whose __init__ raises, does not compile or exits ---------------------------------------


@pytest.mark.parametrize(
    ("pkg", "init"),
    [("rpkg", "raise RuntimeError('boom at import')\n"), ("rsyn", "def (\n"), ("rexit", "import sys; sys.exit(3)\n")],
)
def test_a_reward_package_that_fails_is_one_line(command_ws, pkg, init):
    (command_ws / pkg).mkdir()
    (command_ws / pkg / "__init__.py").write_text(init)
    refused(_train(command_ws, "--set", f"reward={pkg}.mod:reward"), "train.reward", f"{pkg}.mod")


def test_a_reward_package_whose_init_does_not_compile_is_one_line(command_ws):
    (command_ws / "rsyn").mkdir()
    (command_ws / "rsyn" / "__init__.py").write_text("def (\n")
    (command_ws / "rsyn" / "mod.py").write_text("def reward(c, l):\n    return 1.0\n")
    refused(_train(command_ws, "--set", "reward=rsyn.mod:reward"), "train.reward", "__init__.py line 1")


def test_checking_a_reward_module_runs_none_of_its_package(command_ws, tmp_path):
    marker = tmp_path / "ran"
    (command_ws / "rpkg").mkdir()
    (command_ws / "rpkg" / "__init__.py").write_text(f"import sys\nopen({str(marker)!r}, 'w').close()\nsys.exit(3)\n")
    (command_ws / "rpkg" / "mod.py").write_text("def reward(c, l):\n    return 1.0\n")
    r = _train(command_ws, "--set", "reward=rpkg.mod:reward")
    assert r.returncode == 0 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert not marker.exists()


# ---- D2: a run folder that cannot be made ------------------------------------------------------------------------


def test_a_run_folder_that_cannot_be_made_is_one_line(command_ws):
    blocker = command_ws / ".autorl" / "train"
    blocker.parent.mkdir(exist_ok=True)
    blocker.write_text("in the way\n")
    r = _train(command_ws, dry=False)
    refused(r, "cannot write the run folder", str(blocker))
    assert blocker.read_text() == "in the way\n"


# ---- E1: --metrics-out that is a device or a FIFO -----------------------------------------------------------------


@pytest.mark.parametrize("dry", [True, False])
def test_metrics_out_that_is_a_device_is_one_line(command_ws, dry):
    r = _train(command_ws, "--metrics-out", "/dev/null", dry=dry)
    refused(r, "--metrics-out /dev/null", "not a regular file")
    _nothing_trained(command_ws)


@pytest.mark.parametrize("dry", [True, False])
def test_metrics_out_that_is_a_fifo_is_one_line(command_ws, tmp_path, dry):
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    r = _train(command_ws, "--metrics-out", str(fifo), dry=dry)
    refused(r, f"--metrics-out {fifo}", "not a regular file")
    _nothing_trained(command_ws)
