"""A real local Ray head on CPU: submit, read logs and exit codes, cancel."""

from __future__ import annotations

import sys
import time

import pytest

from autorl.backends.ray_jobs import LocalRayHead, submit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    ray_head = LocalRayHead(num_cpus=2, num_gpus=0, object_store_bytes=80 * 1024 * 1024)
    ray_head.start()
    yield ray_head
    ray_head.stop()


def _wait(handle, timeout_s: float = 45.0) -> int | None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        code = handle.poll()
        if code is not None:
            return code
        time.sleep(0.3)
    return None


def test_job_runs_in_working_dir_and_streams_logs(head, tmp_path):
    work = tmp_path / "worktree"
    work.mkdir()
    (work / "hello.py").write_text("import os\nprint('hello', os.environ['AUTORL_X'])\nraise SystemExit(3)\n")
    log = tmp_path / "run" / "train.log"
    handle = submit(head.address, [sys.executable, "hello.py"], working_dir=work, log_path=log, env={"AUTORL_X": "42"})
    assert _wait(handle) == 3
    assert handle.status() == "FAILED"
    assert "hello 42" in log.read_text()


def test_success_is_exit_zero(head, tmp_path):
    handle = submit(head.address, [sys.executable, "-c", "print('ok')"], working_dir=tmp_path, log_path=tmp_path / "l.log")
    assert _wait(handle) == 0
    assert "ok" in (tmp_path / "l.log").read_text()


def test_cancel_stops_a_long_job(head, tmp_path):
    script = "import time\nprint('started', flush=True)\ntime.sleep(300)\n"
    (tmp_path / "sleepy.py").write_text(script)
    handle = submit(head.address, [sys.executable, "sleepy.py"], working_dir=tmp_path, log_path=tmp_path / "s.log")
    deadline = time.time() + 30
    while "started" not in handle.logs() and time.time() < deadline:
        time.sleep(0.3)
    assert handle.poll() is None
    started = time.time()
    handle.cancel(grace_s=2.0)
    assert handle.status() == "STOPPED"
    assert handle.poll() is not None and handle.poll() != 0
    assert time.time() - started < 20
