"""Scripts that really fail each way: their logs, classified, lead to the right action.

Each test runs a script in tests/data/scripts as a child process (the way the command backend
runs a trainer), reads its combined output, classifies it with the exit code and asks
decide_action what the controller should do.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autorl.judge.triage import classify, decide_action
from autorl.states import CrashAction, CrashCategory

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "scripts"


def _run(*args: str, cwd: Path | None = None) -> tuple[str, int]:
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, cwd=cwd)
    return r.stdout + r.stderr, r.returncode


def _act(log: str, code: int | None, tmp_path: Path, **kw):
    d = classify(log, exit_code=code)
    opts = {"is_baseline": False, "retries_so_far": 0, "signature_count": 1, **kw}
    return d, decide_action(d, run_dir=tmp_path, **opts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_user_code_error_is_recorded_then_stops_in_the_baseline(tmp_path):
    log, code = _run(str(SCRIPTS / "crash.py"), str(tmp_path / "m.jsonl"))
    d, a = _act(log, code, tmp_path)
    assert (d.category, a.kind) == (
        CrashCategory.USER_CODE_ERROR,
        CrashAction.RECORD,
    ) and "IndexError" in d.root_cause_line
    assert _act(log, code, tmp_path, is_baseline=True)[1].kind == CrashAction.STOP


def test_config_error_from_a_real_argparse_rejection(tmp_path):
    log, code = _run(str(SCRIPTS / "bad_flag.py"), "--lr", "fast")
    d, a = _act(log, code, tmp_path, is_baseline=True)
    assert code == 2 and d.category == CrashCategory.CONFIG_ERROR and a.kind == CrashAction.STOP


def test_connection_refused_is_network_and_retried_once(tmp_path):
    log, code = _run(str(SCRIPTS / "connect_refused.py"), str(_free_port()))
    d, a = _act(log, code, tmp_path)
    assert d.category == CrashCategory.NETWORK_UNAVAILABLE and a.kind == CrashAction.RETRY_ONCE
    assert _act(log, code, tmp_path, retries_so_far=1)[1].kind == CrashAction.RECORD


def test_host_memory_error_is_host_oom_and_retried_reduced(tmp_path):
    log, code = _run(str(SCRIPTS / "host_oom.py"))
    d, a = _act(log, code, tmp_path)
    assert d.category == CrashCategory.HOST_OOM and a.kind == CrashAction.RETRY_REDUCED


def test_sigterm_during_healthy_progress_is_an_external_kill(tmp_path):
    p = subprocess.Popen([sys.executable, str(SCRIPTS / "progress_forever.py")], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    d, a = _act(out, p.returncode, tmp_path)
    assert (
        p.returncode == -signal.SIGTERM
        and d.category == CrashCategory.KILLED_EXTERNAL
        and a.kind == CrashAction.RETRY_ONCE
    )


def test_silent_run_killed_by_the_watchdog_is_a_hang(tmp_path):
    p = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "hang.py"), str(tmp_path / "pids")], stdout=subprocess.PIPE, text=True
    )
    time.sleep(1.0)
    child = int((tmp_path / "pids").read_text().split()[0])
    os.kill(child, signal.SIGKILL)  # first: it holds the output pipe open
    p.kill()
    out, _ = p.communicate(timeout=30)
    d = classify(out, exit_code=p.returncode, watchdog="silence")
    a = decide_action(d, is_baseline=False, retries_so_far=0, signature_count=1, run_dir=tmp_path)
    assert d.category == CrashCategory.HANG_TIMEOUT and a.kind == CrashAction.RETRY_ONCE


_UNSHARE = shutil.which("unshare")
_CHECK = """
import sys
from autorl.judge.triage import classify, decide_action
log = open(sys.argv[1]).read()
d = classify(log, exit_code=int(sys.argv[2]))
a = decide_action(d, is_baseline=False, retries_so_far=0, signature_count=1, run_dir=sys.argv[3])
print(d.category, a.kind, a.free_bytes, a.path)
print(a.reason)
"""


def _can_mount_tmpfs(tmp_path: Path) -> bool:
    if not _UNSHARE:
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    r = subprocess.run(
        [_UNSHARE, "-rm", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True
    )
    return r.returncode == 0


def test_disk_full_on_a_small_tmpfs_stops_with_path_and_free_space(tmp_path):
    """The script fills a 256 KiB tmpfs mounted in a private mount namespace (never the real disk)."""
    if not _can_mount_tmpfs(tmp_path):
        pytest.skip("no private tmpfs mount here (unshare -rm mount tmpfs refused)")
    vol, log = tmp_path / "vol", tmp_path / "train.log"
    vol.mkdir()
    script = 'mount -t tmpfs -o size=256k tmpfs "$1" && "$2" "$3" "$1" > "$4" 2>&1; "$2" -c "$5" "$4" $? "$1"'
    r = subprocess.run(
        [
            _UNSHARE,
            "-rm",
            "sh",
            "-c",
            script,
            "sh",
            str(vol),
            sys.executable,
            str(SCRIPTS / "fill_disk.py"),
            str(log),
            _CHECK,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"},
    )
    head, reason = r.stdout.strip().splitlines()[-2:]
    category, kind, free, path = head.split()
    assert (category, kind, path) == ("disk_full", "stop", str(vol)), r.stdout + r.stderr
    assert int(free) < 64 * 1024 and str(vol) in reason and "free" in reason
    assert "No space left on device" in log.read_text()
