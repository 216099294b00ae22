"""File locks: one controller per study, and the few steps every process writing a ledger takes one at a time.

A lock is ``flock`` on a small file. The kernel releases it when its holder exits, however it exits, so a lock
left by a controller that was killed is simply free again: the next one takes it over. The descriptor is never
inherited (Python opens files close-on-exec and trials are started with ``close_fds``), so a trial that outlives
its controller holds nothing. The holder writes who it is (pid, host, since when, what) into the file; a process
that finds the lock held reads that to say who holds it. On a file system without ``flock`` (some network
mounts) taking a lock is one line that says so.

- ``hold(path, what)``: take the lock now or raise ``Busy`` naming the holder; keep the returned ``Lock`` until
  done, then ``release()`` it;
- ``waiting(path, timeout_s)``: a context manager that waits for the lock (the short steps: creating a ledger
  and Optuna's tables, numbering an attempt);
- ``holder(path)``: who holds the lock now (None when nobody does), without taking it; ``Lock.say(what)`` updates
  what the holder says it is doing (promote's progress, read by ``autorl status``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from autorl.errors import WorkspaceError


class Busy(Exception):
    """The lock is held by another process (``holder`` says who, when it could be read)."""

    def __init__(self, path: Path, holder: dict | None):
        super().__init__(f"{path} is held by {describe(holder)}")
        self.path, self.holder = path, holder


class Lock:
    """A held lock; ``release()`` it (or let the process end)."""

    def __init__(self, path: Path, fd: int, since: float | None = None):
        self.path, self.fd, self.since = path, fd, since

    def say(self, what: str) -> None:
        """Rewrite what the holder is doing (``holder`` reads it), keeping since when it holds the lock."""
        if self.fd >= 0:
            _write_holder(self.fd, what, self.since)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = -1


def hold(path: Path, what: str, tries: int = 5) -> Lock:
    """The lock at ``path``, taken now (a probe by ``holder`` may hold it for an instant: ``tries`` times, 0.1 s
    apart), with who holds it written in; raises ``Busy`` when another process holds it."""
    fd = _open(path)
    for attempt in range(tries):
        if _try(fd, path):
            since = time.time()
            _write_holder(fd, what, since)
            return Lock(path, fd, since)
        time.sleep(0.1 if attempt < tries - 1 else 0)
    who = _read_holder(path)
    os.close(fd)
    raise Busy(path, who)


@contextmanager
def waiting(path: Path, what: str, timeout_s: float = 120.0) -> Iterator[Lock]:
    """Hold the lock at ``path`` for the ``with`` block, waiting up to ``timeout_s`` for it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            lock = hold(path, what, tries=1)
            break
        except Busy as exc:
            if time.monotonic() > deadline:
                raise WorkspaceError(
                    f"{path} stayed locked for {timeout_s:.0f} s by {describe(exc.holder)}: "
                    "wait for that process, or stop it"
                ) from None
            time.sleep(0.02)
    try:
        yield lock
    finally:
        lock.release()


def holder(path: Path) -> dict | None:
    """Who holds the lock at ``path`` now ({pid, host, since, what}; {} when it cannot be read), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return _read_holder(path) or {}
        return None
    finally:
        os.close(fd)
    return None


def describe(who: dict | None) -> str:
    """'pid 123 on host (since 12:00:01)', or 'another process' when that is not known."""
    if not who or not who.get("pid"):
        return "another process"
    host = f" on {who['host']}" if who.get("host") and who["host"] != socket.gethostname() else ""
    since = time.strftime(" (since %Y-%m-%d %H:%M:%S)", time.localtime(who["since"])) if who.get("since") else ""
    return f"pid {who['pid']}{host}{since}"


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise WorkspaceError(
            f"lock file {path} cannot be opened ({exc.strerror}): check that its folder is a writable directory"
        ) from None


def _try(fd: int, path: Path) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        os.close(fd)
        raise WorkspaceError(
            f"lock file {path} cannot be locked ({exc.strerror}): put the workspace on a file system with file locks"
        ) from None
    return True


def _write_holder(fd: int, what: str, since: float | None = None) -> None:
    text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since or time.time(), "what": what})
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)
    except OSError:
        pass  # who holds it is a courtesy; the lock itself is held


def _read_holder(path: Path) -> dict | None:
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(4096) or b"null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def pid_alive(pid: int | None, command: str | None = None) -> bool:
    """Whether process ``pid`` runs on this machine: a signal-0 probe, and not a zombie (a process killed whose
    parent is gone waits as one until something reaps it, and the probe alone would call it alive). With
    ``command``, the process's command line must also contain it: a pid recorded on another machine, or before a
    reboot, is soon another process's, and only a process of the kind recorded is the one meant."""
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, PermissionError, OverflowError):
        return False
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
        cmdline = Path(f"/proc/{int(pid)}/cmdline").read_bytes()[:65536] if command else b""
    except OSError:  # no /proc (not Linux), or it ended just now: the probe's answer stands
        return True
    if stat[stat.rfind(")") + 2 :][:1] == "Z":
        return False
    return not command or command in cmdline.replace(b"\0", b" ").decode(errors="replace")
