"""Ray jobs: run any command on a Ray cluster and watch it like a local process.

``submit(address, argv, ...)`` sends a command through the Ray Jobs SDK
(``JobSubmissionClient``) with the trial directory as the runtime_env
``working_dir``, and returns a :class:`RayJobHandle` that implements the
``RunHandle`` protocol of ``autorl.backends.base``: ``poll`` maps the job status
to an exit code, ``cancel`` stops the job, and the job's logs are copied into the
trial's log file as they grow. Nothing here knows about OpenRLHF, so parallel
trials can submit any entrypoint.

``LocalRayHead`` starts a private head node (``ray start --head --block`` in
its own process group, on free ports, in its own temp dir) when no cluster
address is given, counts it ready once it takes a probe job, and stops exactly
the processes it started.

Ray is imported inside the functions that need it.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autorl.backends import ray_demand
from autorl.backends.base import kill_group
from autorl.errors import BackendError
from autorl.install import install_advice

TERMINAL = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": -int(signal.SIGTERM)}
RUNTIME_EXCLUDES = [".git", "__pycache__", "*.safetensors", "*.bin", "*.pt"]
LOG_SYNC_EVERY_S = 1.0
HEAD_GRACE_S = (
    30.0  # a head that does not answer for this long has lost the job (a restart of its dashboard is shorter)
)
# Waits before each further try of a submission the dashboard dropped or refused (about 70 s in all): a head that
# has just started answers its job list before its job agent listens, and then refuses a submission with a 500
# (aiohttp "Cannot connect to host" inside; seen 17 s after two heads started at once on one 2-GPU host).
SUBMIT_RETRY_S = (2.0, 5.0, 10.0, 20.0, 30.0)
# How long one call to the dashboard (the client's version check, a submission with its upload, a job lookup) may
# take before it counts as dropped: the SDK's requests carry no timeout, and a head that had just started once took
# two submissions (the upload begun) and never answered, leaving both studies waiting for ever.
CALL_TIMEOUT_S = 60.0
# A fresh head's dashboard can answer its job list yet never learn the head node's id (on a 4-GPU host with four
# heads starting at once): every submission then fails, for good. A head counts as ready once it takes a probe job
# (0.01-2.5 s on 2 idle cores); one that takes none within PROBE_TIMEOUT_S is started again, HEAD_TRIES times in all.
PROBE_TIMEOUT_S = 30.0
HEAD_TRIES = 3
PROBE_PREFIX = "autorl-probe-"  # the probe stays in the head's job list (it ends at once): a job, not a trial
DEFAULT_DASHBOARD = "http://127.0.0.1:8265"
WORKING_DIR_LOGGER = "ray._private.runtime_env.working_dir"
QUIET_LOGGERS = ("ray", "ray.dashboard", "ray._private", "ray.dashboard.modules.dashboard_sdk")  # the SDK sets INFO


def client(address: str):
    """A ``JobSubmissionClient`` for ``address`` (``http://host:dashboard_port``)."""
    from ray.job_submission import JobSubmissionClient  # lazy: Ray is heavy, and only a Ray backend's run needs it

    for name in QUIET_LOGGERS:  # the SDK's upload notes are not autorl's output
        logging.getLogger(name).setLevel(logging.WARNING)
    # Ray >= 2.5x warns once that it now leaves .git out of a working_dir: autorl's excludes always did
    # (RUNTIME_EXCLUDES), so in a study's console it only alarmed
    logging.getLogger(WORKING_DIR_LOGGER).setLevel(logging.ERROR)
    try:
        return within(CALL_TIMEOUT_S, JobSubmissionClient, address)
    except Exception as exc:  # the SDK raises ConnectionError, RuntimeError, ValueError
        raise BackendError(
            f"cannot reach the Ray dashboard at {address}: {exc}; start a cluster or drop --ray-address"
        ) from None


def submit(
    address: str,
    argv: list[str],
    *,
    working_dir: str | Path,
    log_path: str | Path,
    env: dict[str, str] | None = None,
    entrypoint_num_gpus: float = 0,
    entrypoint_num_cpus: float = 0,
    entrypoint_resources: dict[str, float] | None = None,
    submission_id: str | None = None,
    reader: Callable[[], list[dict]] | None = None,
    on_exit: Callable[[], list[dict]] | None = None,
    py_modules: list[str] | None = None,
    setup_hook: str | None = None,
) -> RayJobHandle:
    """Submit ``argv`` as a Ray job running in ``working_dir``; return its handle at once.

    ``reader`` returns new metric records; ``on_exit`` returns the last ones, once, after the job ends.
    ``py_modules``: local package folders uploaded with the job and importable by its driver and every actor;
    ``setup_hook``: ``module.function`` every worker of the job runs before its first task.
    """
    runtime_env = runtime_env_for(working_dir, env, py_modules, setup_hook)
    job_client = client(address)
    job_id = submit_once(
        job_client,
        submission_id or f"autorl-{uuid.uuid4().hex[:12]}",
        address,
        entrypoint=shlex.join(argv),
        runtime_env=runtime_env,
        entrypoint_num_gpus=entrypoint_num_gpus or None,
        entrypoint_num_cpus=entrypoint_num_cpus or None,
        entrypoint_resources=entrypoint_resources or None,
    )
    return RayJobHandle(job_client, job_id, log_path, reader, on_exit, address=address)


def runtime_env_for(
    working_dir: str | Path,
    env: dict[str, str] | None = None,
    py_modules: list[str] | None = None,
    setup_hook: str | None = None,
) -> dict[str, Any]:
    """The runtime_env a job gets: ``working_dir`` uploaded (without .git and weights) as every worker's working
    directory, the environment variables, the packages in ``py_modules`` and the workers' setup hook."""
    out: dict[str, Any] = {
        "working_dir": str(working_dir),
        "excludes": RUNTIME_EXCLUDES,
        "env_vars": {"PYTHONUNBUFFERED": "1", **(env or {})},
    }
    if py_modules:
        out["py_modules"] = list(py_modules)
    if setup_hook:
        out["worker_process_setup_hook"] = setup_hook
    return out


def resolve_address(address: str | None) -> str | None:
    """The dashboard URL of ``--ray-address``: None for none or ``local`` (a private head), ``auto`` is
    ``$RAY_ADDRESS`` or the default dashboard of a cluster running here, ``host:port`` gets ``http://``."""
    if address in (None, "", "local"):
        return None
    if address == "auto":
        env = os.environ.get("RAY_ADDRESS", "")
        return env if env.startswith("http") else DEFAULT_DASHBOARD
    return address if address.startswith("http") else f"http://{address}"


def run_job(
    address: str,
    argv: list[str],
    working_dir: str | Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    py_modules: list[str] | None = None,
) -> tuple[str, str]:
    """Run a short job to its end (stopped after ``timeout_s``); its final status and whole log."""
    job_client = client(address)
    job_id = submit_once(
        job_client,
        f"autorl-check-{uuid.uuid4().hex[:12]}",
        address,
        entrypoint=shlex.join(argv),
        runtime_env=runtime_env_for(working_dir, env, py_modules),
    )
    deadline = time.time() + timeout_s
    status = str(job_client.get_job_status(job_id).value)
    while status not in TERMINAL and time.time() < deadline:
        time.sleep(0.5)
        status = str(job_client.get_job_status(job_id).value)
    if status not in TERMINAL:
        job_client.stop_job(job_id)
        status = "TIMED_OUT"
    return status, job_client.get_job_logs(job_id)


def submit_once(
    job_client: Any,
    submission_id: str,
    address: str,
    *,
    waits: tuple[float, ...] | None = None,
    timeout_s: float | None = None,
    **job: Any,
) -> str:
    """Submit a job under ``submission_id``, retrying a dropped connection without ever starting it twice.

    A busy dashboard can drop the connection while it takes the upload (seen on one host with four heads
    starting at once: ``ServerDisconnectedError``), and a fresh head refuses jobs until its job agent listens (a
    500); the job may or may not have been created. Before each retry (after each of ``waits``)
    the id is looked up, so a job the dashboard did take is used, not submitted again. Each call to the dashboard
    has ``timeout_s``. Defaults: ``SUBMIT_RETRY_S`` and ``CALL_TIMEOUT_S``.
    """
    waits = SUBMIT_RETRY_S if waits is None else waits
    timeout_s = CALL_TIMEOUT_S if timeout_s is None else timeout_s
    for attempt, wait in enumerate(waits + (None,)):
        try:
            return within(timeout_s, job_client.submit_job, submission_id=submission_id, **job)
        except Exception as exc:  # the SDK raises aiohttp, requests and RuntimeError errors alike
            if _job_exists(job_client, submission_id, timeout_s):
                return submission_id
            if wait is None:
                raise BackendError(
                    f"the Ray dashboard at {address} did not take the job after {attempt + 1} tries "
                    f"({type(exc).__name__}: {str(exc)[:200]}); check the head, then resume"
                ) from None
            time.sleep(wait)
    raise AssertionError("unreachable")


def within(seconds: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or TimeoutError once ``seconds`` pass without an answer.

    The call runs in a daemon thread that is left behind if it never returns: a submission it completes late
    carries the same submission id, so Ray refuses it as a duplicate and the job is still started at most once.
    """
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=call, name="autorl-ray-call", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer in {seconds:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _job_exists(job_client: Any, submission_id: str, timeout_s: float) -> bool:
    try:
        within(timeout_s, job_client.get_job_info, submission_id)
    except Exception:  # not found, or the dashboard is still away (or does not answer)
        return False
    return True


class RayJobHandle:
    """One submitted Ray job, seen through the ``RunHandle`` protocol."""

    def __init__(
        self,
        job_client: Any,
        job_id: str,
        log_path: str | Path,
        reader: Callable[[], list[dict]] | None = None,
        on_exit: Callable[[], list[dict]] | None = None,
        address: str = "",
    ):
        self.client = job_client
        self.address = address
        self._lost_since: float | None = None
        self.job_id = job_id
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._reader = reader or (lambda: [])
        self._on_exit = on_exit
        self._written = 0
        self._last_sync = 0.0
        self._activity = time.time()
        self._code: int | None = None

    def status(self) -> str:
        """The job's Ray status name (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED)."""
        return str(self.client.get_job_status(self.job_id).value)

    def poll(self) -> int | None:
        """Exit code once the job is finished (STOPPED reads as -SIGTERM), else None."""
        if self._code is not None:
            return self._code
        try:
            self.sync_logs(force=False)
            status = self.status()
        except Exception as exc:  # the SDK raises connection errors of several libraries
            return self._unreachable(exc)
        self._lost_since = None
        if status not in TERMINAL:
            return None
        self.sync_logs(force=True)
        self._code = self._exit_code(status)
        return self._code

    def _unreachable(self, exc: Exception) -> int | None:
        """None while the head may come back; after ``HEAD_GRACE_S`` of silence the job is lost: one line in the
        trial's log says so (triage reads it as the run being killed from outside) and the run ends with exit 1."""
        now = time.time()
        self._lost_since = self._lost_since or now
        if now - self._lost_since < HEAD_GRACE_S:
            return None
        with self.log_path.open("a") as fh:
            fh.write(
                f"\nautorl: the Ray head at {self.address or 'the cluster'} stopped answering for "
                f"{now - self._lost_since:.0f} s ({type(exc).__name__}: {str(exc)[:200]}): job {self.job_id} "
                "is lost\n"
            )
        self._code = 1
        return self._code

    def _exit_code(self, status: str) -> int:
        info = self.client.get_job_info(self.job_id)
        code = getattr(info, "driver_exit_code", None)
        return int(code) if code is not None and status != "STOPPED" else TERMINAL[status]

    def cancel(self, grace_s: float = 5.0) -> None:
        """Stop the job (Ray sends SIGTERM, then SIGKILL) and wait up to ``grace_s`` + 10 s for it to end."""
        try:
            if self.status() not in TERMINAL:
                self.client.stop_job(self.job_id)
            deadline = time.time() + grace_s + 10.0
            while time.time() < deadline and self.status() not in TERMINAL:
                time.sleep(0.2)
        except Exception:  # the head is gone, and the job with it
            self._code = self._code if self._code is not None else -int(signal.SIGTERM)
            return
        self.poll()

    def metrics(self) -> list[dict[str, Any]]:
        """New metric records from the reader given at submit time."""
        recs = self._reader()
        if self._code is not None and self._on_exit is not None:
            recs += self._on_exit()
            self._on_exit = None
        if recs:
            self._activity = time.time()
        return recs

    def last_activity(self) -> float:
        """time.time() of the last new log output or metric record."""
        try:
            self.sync_logs(force=False)
        except Exception:  # the head is away: poll decides when that ends the run
            pass
        return self._activity

    def waiting(self):
        """What the silent job waits for on its cluster (``ray_demand.Waiting``), or None; a new answer is one line
        in the trial's log."""
        found = ray_demand.waiting(self.address, self.client, self.job_id) if self.address else None
        if found is not None and found.line != getattr(self, "_waiting_line", None):
            self._waiting_line = found.line
            with self.log_path.open("a") as fh:
                fh.write(f"\nautorl: {found.line}\n")
        return found

    def logs(self) -> str:
        """The job's whole log so far."""
        return self.client.get_job_logs(self.job_id)

    def sync_logs(self, force: bool = True) -> None:
        """Append the part of the job log not yet copied to ``log_path`` (at most once a second unless forced)."""
        if not force and time.time() - self._last_sync < LOG_SYNC_EVERY_S:
            return
        self._last_sync = time.time()
        text = self.logs()
        if len(text) > self._written:
            with self.log_path.open("a") as fh:
                fh.write(text[self._written :])
            with self.log_path.with_name(self.log_path.name + ".times").open("a") as fh:
                fh.write(f"{self._written}\t{time.time():.2f}\n")  # where each copied chunk starts, and when it came
            self._written = len(text)
            self._activity = time.time()


def free_port() -> int:
    """A TCP port free on this host right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalRayHead:
    """A private single-node Ray head: started with ``ray start --head --block``, stopped by its process group."""

    def __init__(
        self,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        object_store_bytes: int | None = None,
        temp_dir: str | Path | None = None,
        ready_timeout_s: float = 90.0,
        visible_gpus: list[str] | None = None,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        tries: int = HEAD_TRIES,
    ):
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self.visible_gpus = visible_gpus  # the head's CUDA_VISIBLE_DEVICES (one GPU per entry; repeats share a card)
        if visible_gpus is not None and num_gpus is None:
            self.num_gpus = len(visible_gpus)
        self.object_store_bytes = object_store_bytes
        self._own_temp = temp_dir is None
        self.temp_dir = Path(temp_dir or tempfile.mkdtemp(prefix="ray"))
        self.ready_timeout_s = ready_timeout_s
        self.probe_timeout_s, self.tries = probe_timeout_s, tries
        self.proc: subprocess.Popen | None = None
        self.address = ""
        self.gcs_address = ""  # host:port that another node joins (LocalRayNode)

    def command(self, gcs_port: int, dashboard_port: int) -> list[str]:
        """The ``ray start`` argv for this head."""
        ray = _ray_cli()
        argv = [
            ray,
            "start",
            "--head",
            "--block",
            "--disable-usage-stats",
            "--include-dashboard=true",
            f"--temp-dir={self.temp_dir}",
            f"--port={gcs_port}",
            f"--dashboard-port={dashboard_port}",
            "--dashboard-host=127.0.0.1",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
        ]
        optional = {
            "--num-cpus": self.num_cpus,
            "--num-gpus": self.num_gpus,
            "--object-store-memory": self.object_store_bytes,
        }
        return argv + [f"{k}={v}" for k, v in optional.items() if v is not None]

    def start(self) -> str:
        """Start the head and wait until it takes a job; return the dashboard address.

        A head that answers but takes no probe job within ``probe_timeout_s`` is stopped and started again on new
        ports, ``tries`` times in all; then BackendError, the failed heads' logs kept in ``temp_dir``.
        """
        if self.proc is not None:
            return self.address
        problem = ""
        for _ in range(self.tries):
            self._launch()
            self._wait_ready()
            problem = self._probe()
            if not problem:
                return self.address
            self._halt()
        raise BackendError(
            f"the local Ray head took no job in {self.tries} starts ({self.probe_timeout_s:.0f} s "
            f"each; last: {problem}); its logs: {self.temp_dir}/session_*/logs "
            "(dashboard_JobHead.log); run again, or start a cluster and pass --ray-address"
        )

    def _launch(self) -> None:
        """``ray start --head`` on fresh ports, not waited for."""
        dashboard_port, gcs_port = free_port(), free_port()
        self.proc = _start_ray(
            self.command(gcs_port, dashboard_port), self.temp_dir / "ray-start.log", self.visible_gpus
        )
        self.address = f"http://127.0.0.1:{dashboard_port}"
        self.gcs_address = f"127.0.0.1:{gcs_port}"

    def _probe(self) -> str:
        """Submit a tiny job (``true``, nothing uploaded) until the head takes it or ``probe_timeout_s`` passes;
        "" once taken (it ends by itself a second later and stays listed), else the last refusal in one line."""
        probe_id, problem = f"{PROBE_PREFIX}{uuid.uuid4().hex[:12]}", "no answer"
        deadline = time.time() + self.probe_timeout_s
        while (left := deadline - time.time()) > 0 and self.alive():
            try:  # one try at a time, each bounded by what is left: a 500 after Ray's 10 s wait, a timeout, ...
                submit_once(
                    within(left, client, self.address),
                    probe_id,
                    self.address,
                    waits=(),
                    timeout_s=left,
                    entrypoint="true",
                )
            except Exception as exc:
                problem = " ".join(str(exc).split())[:300]
                time.sleep(min(1.0, max(deadline - time.time(), 0.0)))
                continue
            return ""
        return problem if self.alive() else "the head exited"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure(self) -> str:
        """The head's address, after starting it again (new ports) if it died: a study's private head that was
        killed mid-study comes back for the next trial."""
        if self.proc is not None and not self.alive():
            self.stop()
            self.temp_dir.mkdir(parents=True, exist_ok=True)  # stop removed the one autorl made
        return self.start()

    def _wait_ready(self) -> None:
        """Wait until the head's job list answers; stop it and raise BackendError if it does not in time."""
        proc, deadline = self.proc, time.time() + self.ready_timeout_s
        while time.time() < deadline:
            if proc is None or proc.poll() is not None:
                break
            try:
                client(self.address).list_jobs()
                return
            except Exception:
                time.sleep(0.5)
        tail = (self.temp_dir / "ray-start.log").read_text(errors="replace")[-400:]
        self.stop()
        if "Cannot include dashboard with missing packages" in tail:
            raise BackendError(
                "the local Ray head needs Ray's dashboard packages for its Jobs API: "
                f"pip install 'ray[default]' (or {install_advice('ray')}) and retry"
            )
        raise BackendError(f"local Ray head did not come up within {self.ready_timeout_s:.0f} s: {tail.strip()}")

    def stop(self) -> None:
        """Stop the head's process group (SIGTERM, then SIGKILL) and remove its temp dir if autorl made it."""
        if self.proc is None:
            return
        self._halt()
        if self._own_temp:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _halt(self) -> None:
        """Stop the head's process group, keeping its temp dir (its logs)."""
        if self.proc is None:
            return
        kill_group(self.proc.pid, 10.0, self.proc.poll)
        self.proc.wait()
        self.proc = None

    def __enter__(self) -> LocalRayHead:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class PrivateHead:
    """The one owner of a private local Ray head (a study's slots and the OpenRLHF backend each hold one): the head
    is made on first use with the settings that use gives, started again on new ports if it died since, and
    stopped by ``close`` (or when the process exits)."""

    def __init__(self) -> None:
        self._head: LocalRayHead | None = None

    def address(self, **settings: Any) -> str:
        """The head's dashboard address; ``settings`` (``LocalRayHead``'s) count only when it is made."""
        if self._head is None:
            self._head = LocalRayHead(**settings)
            atexit.register(self.close)
        return self._head.ensure()

    def close(self) -> None:
        if self._head is not None:
            self._head.stop()
            self._head = None


class LocalRayNode:
    """A second Ray node on this host joining a head (its own raylet, its own GPUs as its resources): a two-node
    cluster on one machine, placed by Ray exactly as a real one is."""

    def __init__(
        self,
        gcs_address: str,
        visible_gpus: list[str] | None = None,
        num_cpus: int | None = None,
        log_path: str | Path | None = None,
    ):
        self.gcs_address, self.visible_gpus, self.num_cpus = gcs_address, visible_gpus, num_cpus
        self.log_path = Path(log_path or tempfile.mkstemp(prefix="ray-node-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None

    def start(self) -> LocalRayNode:
        argv = [_ray_cli(), "start", f"--address={self.gcs_address}", "--block", "--disable-usage-stats"]
        argv += [f"--num-gpus={len(self.visible_gpus)}"] if self.visible_gpus is not None else []
        argv += [f"--num-cpus={self.num_cpus}"] if self.num_cpus is not None else []
        self.proc = _start_ray(argv, self.log_path, self.visible_gpus)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc.pid, 10.0, self.proc.poll)
            self.proc.wait()
            self.proc = None


def cluster_gpus(address: str, timeout_s: float = 5.0) -> float:
    """The GPUs a cluster's live nodes offer, from its dashboard's node summary (0 while it cannot say)."""
    try:
        with urllib.request.urlopen(f"{address}/nodes?view=summary", timeout=timeout_s) as resp:
            nodes = json.loads(resp.read())["data"]["summary"]
    except (OSError, KeyError, TypeError, ValueError):
        return 0.0
    return float(
        sum(
            n.get("raylet", {}).get("resourcesTotal", {}).get("GPU", 0)
            for n in nodes
            if n.get("raylet", {}).get("state", "ALIVE") == "ALIVE"
        )
    )


def wait_for_gpus(address: str, want: float, timeout_s: float = 120.0) -> float:
    """Until the cluster offers ``want`` GPUs (a node has joined) or ``timeout_s`` passed; the GPUs it offers."""
    deadline = time.time() + timeout_s
    while (seen := cluster_gpus(address)) < want and time.time() < deadline:
        time.sleep(1.0)
    return seen


def _start_ray(argv: list[str], log_path: Path, visible_gpus: list[str] | None) -> subprocess.Popen:
    """``ray start ... --block`` in its own process group, its output in ``log_path``. On Linux it runs under
    ``autorl.backends.groupguard``, which is sent SIGTERM when the process that started it dies and then takes the
    whole group down, SIGKILL after a grace period (``kill -9`` of a controller left its private head, the head's
    GCS, raylet and dashboard, running for good; on SIGTERM alone, Ray 2.55's ``ray start`` and GCS stayed)."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    if visible_gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible_gpus)
    guard = _die_with_parent()
    if guard is not None:
        argv = [sys.executable, "-I", str(Path(__file__).with_name("groupguard.py")), "--", *argv]  # stdlib only
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=guard,
        )


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux for SIGTERM when the parent dies (``prctl(PR_SET_DEATHSIG)``), made ready
    in the parent so the child only calls into libc; None where that is not available.

    Linux sends it when the *thread* that started the child ends: every head is started from the controller's
    main thread, which lives as long as the controller."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)
    return lambda: prctl(pr_set_pdeathsig, sigterm, 0, 0, 0)


def _ray_cli() -> str:
    """The ``ray`` command of the Python running autorl (a venv's bin/, activated or not), else the PATH's."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.is_file() else (shutil.which("ray") or "ray")
