"""File locks: held for a process's life, refused to a second holder with who holds it, free again the moment the
holder dies however it dies, never inherited by a child. Real processes, real flock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autorl import locks
from autorl.errors import StudyBusyError
from autorl.workspace import Workspace

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from autorl import locks
    lock = locks.hold(Path(sys.argv[1]), "test")
    if len(sys.argv) > 2:  # a child that outlives us: it must not hold our lock
        import subprocess
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    print("held", flush=True)
    time.sleep(60)
""")


def _holder(path: Path, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), *extra], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_lock_is_refused_with_its_holder_and_free_once_the_holder_is_killed(tmp_path):
    path = tmp_path / "a.lock"
    proc = _holder(path)
    try:
        with pytest.raises(locks.Busy) as err:
            locks.hold(path, "second")
        assert err.value.holder["pid"] == proc.pid
        assert locks.holder(path)["pid"] == proc.pid
        assert f"pid {proc.pid}" in locks.describe(err.value.holder)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    lock = locks.hold(path, "after")  # the kernel let go of the dead holder's lock: taken over, no clean-up needed
    assert locks.holder(path)["pid"] == os.getpid()
    lock.release()
    assert locks.holder(path) is None


def test_a_child_of_the_holder_does_not_hold_its_lock(tmp_path):
    path = tmp_path / "a.lock"
    proc = _holder(path, "spawn")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lock = locks.hold(path, "after")  # the sleeping grandchild lives on, holding nothing
    lock.release()


def test_in_one_process_a_second_hold_is_refused_and_release_frees_it(tmp_path):
    path = tmp_path / "a.lock"
    first = locks.hold(path, "one")
    with pytest.raises(locks.Busy):
        locks.hold(path, "two", tries=1)
    first.release()
    first.release()  # twice is harmless
    locks.hold(path, "three").release()


def test_waiting_waits_for_the_holder(tmp_path):
    path = tmp_path / "a.lock"
    proc = _holder(path)
    t0 = time.monotonic()
    subprocess.Popen([sys.executable, "-c", f"import os, time, signal; time.sleep(0.5); os.kill({proc.pid}, 9)"])
    with locks.waiting(path, "waiter", timeout_s=30):
        assert time.monotonic() - t0 >= 0.4
    proc.wait()


def test_a_study_lock_names_the_controller_that_holds_it(tmp_path):
    ws = Workspace(root=tmp_path, ledger_path=tmp_path / "ledger.sqlite")
    held = ws.lock_study("s1")
    try:
        with pytest.raises(
            StudyBusyError, match=rf"study s1 is being run by pid {os.getpid()}.*kill -INT {os.getpid()}"
        ):
            ws.lock_study("s1")
        assert ws.study_holder("s1")["pid"] == os.getpid()
        other = ws.lock_study("s2")  # another study of the same workspace runs at the same time
        other.release()
    finally:
        held.release()
    assert ws.study_holder("s1") is None


def test_a_process_that_ended_but_was_not_reaped_is_not_alive():
    """A killed monitor whose parent is gone stays a zombie until reaped: status must not call it running."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while time.time() < deadline and Path(f"/proc/{child.pid}/stat").read_text().split(")")[-1].split()[0] != "Z":
        time.sleep(0.05)  # ended, not yet waited for: a zombie
    assert not locks.pid_alive(child.pid)
    assert locks.pid_alive(os.getpid())
    child.wait()
    assert not locks.pid_alive(child.pid) and not locks.pid_alive(None) and not locks.pid_alive(2**40)


def test_a_pid_taken_by_another_kind_of_process_is_not_the_one_recorded():
    """A pid recorded on another machine, or before a reboot, soon names another process: with the command
    recorded, only a process running it counts."""
    marker = "autorl.promote.fullrun"
    monitor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert locks.pid_alive(monitor.pid, marker) and locks.pid_alive(monitor.pid)
        assert locks.pid_alive(other.pid) and not locks.pid_alive(other.pid, marker)
    finally:
        for p in (monitor, other):
            p.kill()
            p.wait()
    assert not locks.pid_alive(monitor.pid, marker)
