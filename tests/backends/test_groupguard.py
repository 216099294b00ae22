"""The guard a private Ray head runs under: when its starter dies, the whole process group goes, even processes that
ignore SIGTERM (on a GPU host, Ray 2.55's `ray start --block` and GCS outlived a controller killed with -9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from autorl.backends import groupguard

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guard is Linux only")

# Ignores SIGTERM, as does the child it starts (a hung `ray start` and its GCS); prints both pids.
STUBBORN = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c",
                              "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    print(child.pid, flush=True)
    time.sleep(600)
""")

# A starter as a controller is one: starts the stubborn command the way a head is started, says the group, waits.
STARTER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from autorl.backends.ray_jobs import _start_ray
    proc = _start_ray([sys.executable, "-c", sys.argv[1]], Path(sys.argv[2]), None)
    print(proc.pid, flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _group(pgid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _alive(int(name)):
            try:
                if os.getpgid(int(name)) == pgid:
                    out.append(int(name))
            except ProcessLookupError:
                pass
    return out


def _wait_gone(pgid: int, timeout_s: float) -> list[int]:
    deadline = time.time() + timeout_s
    while time.time() < deadline and _group(pgid):
        time.sleep(0.2)
    return _group(pgid)


def test_a_starter_killed_with_9_takes_a_group_that_ignores_sigterm_with_it(tmp_path):
    log = tmp_path / "start.log"
    starter = subprocess.Popen([sys.executable, "-c", STARTER, STUBBORN, str(log)], stdout=subprocess.PIPE, text=True)
    try:
        guard = int(starter.stdout.readline())
        deadline = time.time() + 30
        while time.time() < deadline and len(_group(guard)) < 3:  # the guard, the command, its child
            time.sleep(0.1)
        members = _group(guard)
        assert len(members) == 3, members
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        left = _wait_gone(guard, groupguard.GRACE_S + 10)
    finally:
        if starter.poll() is None:
            starter.kill()
    assert not left, left  # SIGTERM was ignored by two of them: the guard's SIGKILL ended them
    assert not any(_alive(p) for p in members)


def test_the_command_ending_by_itself_ends_the_guard_with_its_exit_code():
    r = subprocess.run(
        [sys.executable, "-I", groupguard.__file__, "--", sys.executable, "-c", "raise SystemExit(7)"], timeout=30
    )
    assert r.returncode == 7


def test_sigterm_to_the_guard_takes_the_group_down(tmp_path):
    guard = subprocess.Popen(
        [sys.executable, "-I", groupguard.__file__, "--", sys.executable, "-c", STUBBORN],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    grandchild = int(guard.stdout.readline())
    assert _alive(grandchild)
    t0 = time.time()
    guard.send_signal(signal.SIGTERM)
    guard.wait(timeout=groupguard.GRACE_S + 10)
    assert not _wait_gone(guard.pid, 5)
    assert not _alive(grandchild)
    assert time.time() - t0 >= groupguard.GRACE_S - 1  # SIGTERM ignored: the SIGKILL came after the grace period


def test_on_a_gpu_host_the_heads_whole_group_was_gone_20_s_after_the_kill():
    """The real run (one H100, Ray 2.55): before the kill, the guard led a group of `ray start`, the GCS and the
    raylet; 20 s after `kill -9` of the controller nothing of it was left and no process held the GPU (without
    the guard, on a 2 x H200 host, `ray start` and the GCS were still up 20 minutes later)."""
    from pathlib import Path

    text = (
        Path(__file__).resolve().parents[1] / "data" / "openrlhf-0.10.4" / "small" / "h100" / "kill9-guard.out"
    ).read_text()
    before, after = text.split("left 20 s after the kill:")
    rows = [line.split(None, 2) for line in before.splitlines() if line[:1] == " "]
    guard = next(int(pid) for pid, _pgid, cmd in rows if "groupguard.py" in cmd)
    assert {int(pgid) for _pid, pgid, _cmd in rows} == {guard}
    assert [name for name in ("ray start --head", "gcs_server", "raylet") if any(name in r[2] for r in rows)] == [
        "ray start --head",
        "gcs_server",
        "raylet",
    ]
    assert [line for line in after.splitlines() if line.strip()] == ["GPU processes: 0"]
