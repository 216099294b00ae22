"""A process that imports torch and the engine (or the evaluator) once, then forks one child per run.

``import torch`` is about a second of every trial's start-up on a small CPU, the same second for a run stopped
at its first eval as for a run of 50 steps, so no early stop can save it. The controller (which never imports
torch) starts this server once and asks it for each embedded trial over a pipe (``autorl.backends.forked``).
Each trial is a fork of this process that runs exactly what ``python -m autorl.engine ARGS`` runs:

- in a session of its own (the controller stops it by its process group);
- in the trial's working directory, first on ``sys.path`` as ``-m`` puts it, with the environment the request
  carries (``autorl.backends.forked`` only sends one that differs from the server's in variables read lazily);
- pinned to the request's CPUs, stdin from /dev/null, stdout and stderr appended to the trial's log;
- its exit code reported back as ``subprocess`` reports one (negative for a signal).

The server never touches CUDA: a child initialises it on its own after the fork.

The same server runs the per-item evaluator (``python -m autorl.evaluate``) that follows an OpenRLHF, TRL or
command trial: started as ``python -m autorl.engine.forkserver autorl.evaluate`` it imports torch, transformers
and the evaluator once, and each evaluation skips those imports (about 8 s of every trial on a GPU host).

Protocol, one JSON object per line. Requests on stdin: ``{"args": [...], "cwd": DIR, "env": {...}, "log": FILE,
"cpus": [...] | null}``. Replies on stdout: ``{"ready": true}`` once the imports are done; ``{"pid": N}`` for
each request, in order, once the child has its own session (``{"pid": null, "error": ...}`` for a request that
could not be read); ``{"exited": N, "code": C}`` when a child ends. End of stdin ends the server; children still
running are left to run.

    python -m autorl.engine.forkserver [autorl.engine | autorl.evaluate]
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import sys
import traceback
import warnings

# The modules a server can run, each with what it imports once and the module whose main(args) a child calls.
SERVED = {
    "autorl.engine": (("torch", "autorl.engine.grpo", "autorl.engine.__main__"), "autorl.engine.__main__"),
    "autorl.evaluate": (("torch", "transformers", "autorl.evaluate"), "autorl.evaluate"),
}
MAIN = "autorl.engine.__main__"  # the module whose main this server's children call (set in main())


def main(argv: list[str] | None = None) -> int:
    global MAIN
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the controller ends it: a kill, or its stdin closing
    served = (argv if argv is not None else sys.argv[1:]) or ["autorl.engine"]
    if len(served) != 1 or served[0] not in SERVED:
        print(f"serves one of {', '.join(SERVED)}", file=sys.stderr)
        return 2
    preload, MAIN = SERVED[served[0]]
    for name in preload:
        __import__(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes to the wake-up pipe
    send({"ready": True})
    serve((wake_r, wake_w))
    return 0


def serve(wake: tuple[int, int]) -> None:
    """Fork a child for each request line, report each child's exit, until stdin closes."""
    pending = b""
    while True:
        readable, _, _ = select.select([0, wake[0]], [], [])
        if wake[0] in readable:
            _drain(wake[0])
        reap()
        if 0 not in readable:
            continue
        data = os.read(0, 1 << 16)
        if not data:
            return
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                handle(line, wake)


def handle(line: bytes, wake: tuple[int, int]) -> None:
    """Fork the child of one request and reply with its pid once it leads its own session."""
    try:
        request = json.loads(line)
        args, cwd, env, log = request["args"], request["cwd"], request["env"], request["log"]
    except (ValueError, KeyError, TypeError) as exc:
        send({"pid": None, "error": f"bad request: {exc}"})
        return
    sync_r, sync_w = os.pipe()
    with warnings.catch_warnings():  # Python >= 3.12 warns on fork when a thread runs: import torch starts an idle one
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os.close(sync_r)
        child(args, cwd, env, log, request.get("cpus"), sync_w, wake)
    os.close(sync_w)
    os.read(sync_r, 1)  # the child has called setsid (or died first: its exit is reported as usual)
    os.close(sync_r)
    send({"pid": pid})


def child(
    args: list[str], cwd: str, env: dict[str, str], log: str, cpus: list[int] | None, sync_w: int, wake: tuple[int, int]
) -> None:
    """Become the trial: its own session, log, CPUs, directory and environment; then the engine's main. Never
    returns."""
    code = 1
    try:
        os.setsid()
        os.write(sync_w, b"1")
        os.close(sync_w)
        signal.set_wakeup_fd(-1)
        for fd in wake:
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        redirect(log)
        if cpus:
            os.sched_setaffinity(0, cpus)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.path[0] = cwd
        cli = sys.modules[MAIN]  # preloaded
        sys.argv = [cli.__file__ or MAIN, *args]
        code = cli.main(args)
    except SystemExit as exc:
        code = exit_status(exc.code)
    except BaseException:  # as the interpreter would: the traceback to stderr, exit 1
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code if isinstance(code, int) else 1)


def redirect(log: str) -> None:
    """stdin from /dev/null; stdout and stderr appended, unbuffered, to ``log``."""
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for src, dst in ((null, 0), (out, 1), (out, 2)):
        os.dup2(src, dst)
    os.close(null)
    os.close(out)
    sys.stdin = open(0, closefd=False)
    sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False), write_through=True, line_buffering=True)
    sys.stderr = io.TextIOWrapper(
        open(2, "wb", buffering=0, closefd=False), write_through=True, line_buffering=True, errors="backslashreplace"
    )


def exit_status(code: object) -> int:
    """The process exit status of ``SystemExit(code)``, as the interpreter maps it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def reap() -> None:
    """Report every child that has ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def send(message: dict) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


if __name__ == "__main__":
    sys.exit(main())
