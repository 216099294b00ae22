"""A real local Ray head on CPU: submit, read logs and exit codes, cancel; a head that takes no job is replaced."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest

from autorl.backends.ray_jobs import PROBE_PREFIX, LocalRayHead, cluster_gpus, free_port, submit, wait_for_gpus

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
    handle = submit(
        head.address, [sys.executable, "-c", "print('ok')"], working_dir=tmp_path, log_path=tmp_path / "l.log"
    )
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


class DroppingProxy:
    """A real TCP proxy in front of the head's dashboard that drops the first job submission's connection.

    ``after=False`` closes it before the request reaches the dashboard (no job is made); ``after=True`` lets the
    dashboard take the request and closes the connection before the answer comes back (the job exists);
    ``hold=True`` keeps the connection open and never forwards the request: no answer ever comes (the head that
    took two studies' submissions and never replied).
    """

    def __init__(self, target: str, after: bool, limit: int = 1, hold: bool = False):
        import socket
        import threading

        host, port = target.removeprefix("http://").split(":")
        self.target, self.after, self.limit, self.dropped, self.hold = (host, int(port)), after, limit, 0, hold
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            state = {"drop": False}
            threading.Thread(target=self._pipe, args=(client, upstream, state, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, state, False), daemon=True).start()

    def _pipe(self, src, dst, state, from_client):
        try:
            while data := src.recv(65536):
                if from_client and state.get("held"):
                    continue  # the rest of a held request: swallowed, never answered
                if self.hold and from_client and b"POST /api/jobs/" in data and self.dropped < self.limit:
                    self.dropped += 1
                    state["held"] = True
                    continue
                if from_client and b"POST /api/jobs/" in data and self.dropped < self.limit:
                    self.dropped += 1
                    state["drop"] = True
                    if not self.after:
                        break
                elif not from_client and state["drop"]:
                    break  # the dashboard answered a dropped submission: the answer never reaches the client
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):  # shutdown wakes the other direction's thread, blocked in recv on the same sockets
            try:
                sock.shutdown(2)
            except OSError:
                pass
            sock.close()

    def close(self):
        self.listener.close()


@pytest.mark.parametrize("after", [False, True], ids=["dropped-before-the-dashboard", "dropped-after-it"])
def test_a_dropped_submission_is_retried_and_runs_once(head, tmp_path, after):
    from ray.job_submission import JobSubmissionClient

    proxy = DroppingProxy(head.address, after)
    try:
        marker = tmp_path / "runs.txt"
        script = f"with open({str(marker)!r}, 'a') as fh:\n    fh.write('ran\\n')\n"
        handle = submit(
            proxy.address,
            [sys.executable, "-c", script],
            working_dir=tmp_path,
            log_path=tmp_path / "d.log",
            submission_id=f"autorl-drop-{int(after)}-{time.time_ns()}",
        )
        assert proxy.dropped == 1
        assert _wait(handle) == 0
        time.sleep(1.0)
        assert marker.read_text() == "ran\n"  # once, never twice
        jobs = [j for j in JobSubmissionClient(head.address).list_jobs() if j.submission_id == handle.job_id]
        assert len(jobs) == 1
    finally:
        proxy.close()


def test_a_submission_never_answered_is_retried_and_runs_once(head, tmp_path, monkeypatch):
    from autorl.backends import ray_jobs

    monkeypatch.setattr(ray_jobs, "CALL_TIMEOUT_S", 2.0)
    proxy = DroppingProxy(head.address, after=False, hold=True)
    try:
        marker = tmp_path / "runs.txt"
        script = f"with open({str(marker)!r}, 'a') as fh:\n    fh.write('ran\\n')\n"
        started = time.time()
        handle = submit(
            proxy.address, [sys.executable, "-c", script], working_dir=tmp_path, log_path=tmp_path / "h.log"
        )
        assert proxy.dropped == 1 and time.time() - started < 30  # waited for the deadline, not for ever
        assert _wait(handle) == 0
        time.sleep(1.0)
        assert marker.read_text() == "ran\n"
    finally:
        proxy.close()


def test_within_returns_raises_or_gives_up():
    from autorl.backends.ray_jobs import within

    assert within(5.0, lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(KeyError):
        within(5.0, {}.__getitem__, "missing")
    started = time.time()
    with pytest.raises(TimeoutError):
        within(0.5, time.sleep, 30)
    assert time.time() - started < 5


def test_a_dashboard_that_never_takes_the_job_is_one_line(head, tmp_path, monkeypatch):
    from autorl.backends import ray_jobs
    from autorl.errors import BackendError

    monkeypatch.setattr(ray_jobs, "SUBMIT_RETRY_S", (0.1, 0.1))
    proxy = DroppingProxy(head.address, after=False, limit=100)
    try:
        with pytest.raises(BackendError) as err:
            submit(proxy.address, [sys.executable, "-c", "pass"], working_dir=tmp_path, log_path=tmp_path / "x.log")
    finally:
        proxy.close()
    assert proxy.dropped == 3 and "after 3 tries" in str(err.value) and "\n" not in str(err.value)


def _forget_head_node_id(gcs_address: str) -> None:
    """Delete the head node id from the head's GCS once its dashboard has written it. The dashboard writes it only
    when it first sees the head node ALIVE, so it stays gone and the head takes no job, for good."""
    from ray._raylet import GcsClient

    gcs = GcsClient(address=gcs_address)
    deadline = time.time() + 30
    while gcs.internal_kv_get(b"head_node_id", namespace=b"job") is None and time.time() < deadline:
        time.sleep(0.1)
    assert gcs.internal_kv_del(b"head_node_id", False, namespace=b"job") == 1


class ForgetfulHead(LocalRayHead):
    """A real head whose first ``faulty`` starts (every start for -1) lose their head node id right after their job
    list answers, as on a 4-GPU host with four heads starting at once: each submission then fails with a 500 after
    Ray's 10 s wait for the job agent. ``halted`` holds the processes of each head stopped."""

    def __init__(self, faulty: int, **kwargs):
        super().__init__(num_cpus=2, num_gpus=0, object_store_bytes=80 * 1024 * 1024, **kwargs)
        self.faulty, self.starts, self.halted, self.addresses = faulty, 0, [], []

    def _wait_ready(self):
        super()._wait_ready()
        self.starts += 1
        self.addresses.append(self.address)
        if self.faulty < 0 or self.starts <= self.faulty:
            _forget_head_node_id(self.gcs_address)

    def _halt(self):
        import psutil

        top = psutil.Process(self.proc.pid)
        group = [p for p in psutil.process_iter() if _pgid(p) == self.proc.pid]
        self.halted.append({top, *top.children(recursive=True), *group})
        super()._halt()


def _pgid(p) -> int | None:
    import os

    try:
        return os.getpgid(p.pid)
    except (ProcessLookupError, PermissionError):
        return None


def _job_head_logs(head: LocalRayHead) -> str:
    return "".join(p.read_text(errors="replace") for p in head.temp_dir.glob("session_2*/logs/dashboard_JobHead.log"))


def _left_running(halted: list[set]) -> list[str]:
    """The processes of the stopped heads still alive 15 s after the last was stopped."""
    import psutil

    _, alive = psutil.wait_procs([p for procs in halted for p in procs], timeout=15)
    return [str(p.pid) for p in alive]


def _naming(folder: Path) -> list[str]:
    """Processes whose command line names ``folder`` (Ray's GCS, raylet, dashboard, log monitor name its temp dir)."""
    import psutil

    return [
        " ".join(p.info["cmdline"])[:120]
        for p in psutil.process_iter(["cmdline"])
        if str(folder) in " ".join(p.info["cmdline"] or [])
    ]


def test_a_head_that_takes_no_job_is_stopped_and_started_again(tmp_path):
    """The first head answers its job list but takes no job: it is stopped, a second one starts on new ports, and
    a real job runs there; its job list holds the probe it took and that job."""
    from autorl.backends.ray_jobs import client

    head = ForgetfulHead(faulty=1, probe_timeout_s=8.0)
    try:
        started = time.time()
        address = head.start()
        assert head.starts == 2 and len(head.halted) == 1 and time.time() - started < 60
        assert head.addresses == [head.addresses[0], address] and address != head.addresses[0]  # new ports
        assert "Head node id has not yet been persisted in GCS" in _job_head_logs(head)  # the fault was the real one
        assert len(head.halted[0]) > 3 and not _left_running(head.halted)  # ray start, GCS, raylet, dashboard, ...
        handle = submit(
            address, [sys.executable, "-c", "print('ran')"], working_dir=tmp_path, log_path=tmp_path / "r.log"
        )
        assert _wait(handle) == 0 and handle.status() == "SUCCEEDED"
        assert "ran" in (tmp_path / "r.log").read_text()
        listed = [j.submission_id for j in client(address).list_jobs()]
        probes = [j for j in listed if j.startswith(PROBE_PREFIX)]
        assert len(probes) == 1 and sorted(listed) == sorted([handle.job_id, *probes])  # it took its probe, then ours
    finally:
        head.stop()


def test_a_head_that_never_takes_a_job_is_one_line_and_leaves_no_ray_process():
    """Every start takes no job: after ``tries`` starts, one BackendError line naming the kept logs, in bounded
    time, and no process of any of the heads left."""
    from autorl.errors import BackendError

    head = ForgetfulHead(faulty=-1, probe_timeout_s=5.0, tries=2)
    try:
        started = time.time()
        with pytest.raises(BackendError) as err:
            head.start()
        took = time.time() - started
        message = str(err.value)
        assert head.starts == 2 and len(head.halted) == 2 and head.proc is None
        assert took < 60, took
        assert "\n" not in message and "took no job in 2 starts" in message and str(head.temp_dir) in message
        assert "--ray-address" in message
        assert not _left_running(head.halted) and not _naming(head.temp_dir)
        assert "Head node id has not yet been persisted in GCS" in _job_head_logs(head)  # the logs named are kept
    finally:
        head.stop()
        shutil.rmtree(head.temp_dir, ignore_errors=True)


def test_a_cluster_that_does_not_answer_offers_no_gpus():
    """`wait_for_gpus` gives up after its timeout with what it saw, never an exception."""
    dead = f"http://127.0.0.1:{free_port()}"
    assert cluster_gpus(dead, timeout_s=1) == 0.0
    assert wait_for_gpus(dead, 1, timeout_s=1.5) == 0.0
