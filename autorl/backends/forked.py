"""Embedded trials and per-item evaluations forked from a process that has torch imported already
(``autorl.engine.forkserver``).

The controller never imports torch; it starts one fork server per Python executable, the first time a trial
(or the study's ``prepare``) asks for it, and keeps it until it exits. A trial started through it is the same
child process ``python -m autorl.engine`` would be, minus the second of imports. Where the fork server cannot
serve a trial exactly as a fresh process would, the trial starts as a fresh process, the way it always did:

- its environment differs from the server's in a variable other than those read lazily (``LAZY_ENV``): anything
  read at interpreter or library start-up (``PYTHON*``, ``OMP_*``, ``LD_*`` ...) must be the process's own;
- the server did not start or has ended (its failure shows in the trial log of the fresh process);
- ``AUTORL_FORKSERVER=0`` is set, or this is not Linux.

The per-item evaluator (``python -m autorl.evaluate``, run after an OpenRLHF, TRL or command trial) gets a server
of its own, which also imports transformers, started with the evaluation's own environment (variables such as
``HF_HUB_OFFLINE`` are read when transformers is imported): one per distinct environment, so a study's
evaluations share one.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from autorl.backends.base import LaunchPlan, LocalProcess

ENGINE = "autorl.engine"
EVALUATE = "autorl.evaluate"
SERVER = "autorl.engine.forkserver"
# Variables a trial may set differently from the server's environment: read only after the fork, when used
# (RAY_*: importing ray in the controller sets RAY_CLIENT_MODE; torch, transformers and the engine never read them).
LAZY_ENV = frozenset({"CUDA_VISIBLE_DEVICES"})
LAZY_PREFIXES = ("RAY_",)
REPLY_TIMEOUT_S = 300.0  # the first reply waits for the server's imports
LOST = 1  # the exit code of a trial whose server ended before reporting it


class ForkServerError(RuntimeError):
    """The fork server could not start a trial (the caller starts a fresh process instead)."""


class ForkServer:
    """One ``python -m autorl.engine.forkserver`` child and the replies it sends."""

    def __init__(self, executable: str, module: str = ENGINE, env: dict[str, str] | None = None):
        self.executable, self.module = executable, module
        self.env = env if env is not None else {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [executable, "-m", SERVER, module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self.env,
            cwd=_package_parent(),
            start_new_session=True,
        )
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None  # both are pipes
        self._stdin: IO[bytes] = stdin
        self._stdout: IO[bytes] = stdout
        self._pids: queue.Queue[int | None] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._send = threading.Lock()  # one request at a time, so that replies come in order
        self._lock = threading.Lock()  # the exit codes, shared with the reader thread
        self.alive = True
        threading.Thread(target=self._read, name="autorl-forkserver", daemon=True).start()

    def serves(self, executable: str, env: dict[str, str]) -> bool:
        """Whether a child of this server is exactly a fresh ``executable`` process with ``env``."""
        if not self.alive or executable != self.executable:
            return False
        return startup_env(env) == startup_env(self.env)

    def spawn(self, args: list[str], cwd: str, env: dict[str, str], log: str, cpus: list[int] | None) -> int:
        """Fork one engine run; its pid (the leader of its own process group)."""
        request = json.dumps({"args": args, "cwd": cwd, "env": env, "log": log, "cpus": cpus}) + "\n"
        with self._send:
            try:
                self._stdin.write(request.encode())
                self._stdin.flush()
                pid = self._pids.get(timeout=REPLY_TIMEOUT_S)
            except (OSError, ValueError, queue.Empty) as exc:
                raise ForkServerError(f"the fork server did not answer ({exc.__class__.__name__})") from None
        if pid is None:
            raise ForkServerError("the fork server refused the request or has ended")
        return pid

    def exit_code(self, pid: int) -> int | None:
        """The exit code of child ``pid`` once it has ended (and forget it), else None."""
        with self._lock:
            code = self._exits.pop(pid, None)
        if code is None and not self.alive and not _exists(pid):
            return LOST
        return code

    def close(self) -> None:
        """End the server at once: it holds nothing to save (its children go on in their own sessions)."""
        self.proc.kill()
        self.proc.wait()
        self._stdin.close()
        self.alive = False

    def _read(self) -> None:
        for line in self._stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "exited" in message:
                with self._lock:
                    self._exits[message["exited"]] = message["code"]
            elif "pid" in message:
                with self._lock:
                    self._exits.pop(message["pid"], None)  # a reused pid: its old exit was already read
                self._pids.put(message["pid"])
        self._stdout.close()
        self.alive = False
        self._pids.put(None)


class ForkedChild:
    """The ``Popen`` calls ``LocalProcess`` makes (``pid``, ``poll``, ``wait``) for a child of the fork server."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = float("inf") if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.02)
        return code


class ForkedProcess(LocalProcess):
    """A LocalProcess for an engine run or a per-item evaluation, forked from a fork server where it can be."""

    def _launch(self, plan: LaunchPlan, env: dict[str, str]) -> Any:
        module, args = _module_args(plan)
        server = None
        if module is not None:
            server = server_for(plan.argv[0], module, env if module == EVALUATE else None)
        if server is None or not server.serves(plan.argv[0], env):
            return super()._launch(plan, env)
        try:
            return ForkedChild(server, server.spawn(args, plan.cwd, env, plan.log_path, plan.cpus))
        except ForkServerError:
            return super()._launch(plan, env)


_SERVERS: dict[tuple, ForkServer] = {}


def server_for(executable: str, module: str = ENGINE, env: dict[str, str] | None = None) -> ForkServer | None:
    """The running fork server for ``executable`` and ``module``, started on first use (None when turned off or it
    ended). ``env`` gives the server that environment (one server per distinct one); None: this process's."""
    if os.environ.get("AUTORL_FORKSERVER", "1") == "0" or not sys.platform.startswith("linux"):
        return None  # elsewhere (macOS) forking a process that has loaded torch's libraries is not safe
    key = (executable, module, None if env is None else tuple(sorted(startup_env(env).items())))
    server = _SERVERS.get(key)
    if server is None or not server.alive:
        if server is not None:  # it ended: start no second one, runs start as fresh processes
            return None
        try:
            server = _SERVERS[key] = ForkServer(executable, module, env)
        except OSError:
            return None
    return server


@atexit.register
def _close_all() -> None:
    for server in _SERVERS.values():
        server.close()


def startup_env(env: dict[str, str]) -> dict[str, str]:
    """The part of ``env`` a process reads before the fork (at interpreter start or import): all but the lazy ones."""
    return {k: v for k, v in env.items() if k not in LAZY_ENV and not k.startswith(LAZY_PREFIXES)}


def _module_args(plan: LaunchPlan) -> tuple[str | None, list[str]]:
    """(module, its arguments) when ``plan`` is ``python -m autorl.engine ARGS`` or ``... autorl.evaluate ARGS``."""
    if plan.shell or len(plan.argv) < 3 or plan.argv[1] != "-m" or plan.argv[2] not in (ENGINE, EVALUATE):
        return None, []
    return plan.argv[2], plan.argv[3:]


def _package_parent() -> str:
    """The directory ``autorl`` was imported from, so that the server imports this very package."""
    return str(Path(__file__).resolve().parents[2])


def _exists(pid: int) -> bool:
    """Whether ``pid`` is still running (a zombie nobody reaps counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
