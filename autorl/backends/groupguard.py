"""Run a command in this process group, and take the whole group down when the process that started this one dies.

    python -I .../autorl/backends/groupguard.py -- ARGV...

A private Ray head is ``ray start --block`` in a process group of its own, with the GCS, the raylet, the dashboard
and the jobs' workers in it. Its starter asks Linux to send this guard SIGTERM when the starter dies
(``PR_SET_PDEATHSIG``), and the guard also notices when its parent changes. Then, as on any SIGTERM, SIGINT or
SIGHUP, it sends the group SIGTERM, waits ``GRACE_S`` for the command to end, and SIGKILLs whatever of the group
is left. ``ray start --block`` handling SIGTERM by itself was not enough: on a GPU host (Ray 2.55) a controller
killed with -9 left the ``ray start`` process and the head's GCS running for good after the raylet had shut down.

Standard library only, run as a file in isolated mode (it starts before every head, and needs no importable autorl);
Linux only (``/proc``, ``PR_SET_PDEATHSIG``); elsewhere the starter runs the command directly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_S = 10.0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cmd = args[args.index("--") + 1 :] if "--" in args else args
    if not cmd:
        print("usage: groupguard.py -- COMMAND...", file=sys.stderr)
        return 2
    parent, asked = os.getppid(), []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: asked.append(True))
    child = subprocess.Popen(cmd)
    while child.poll() is None:
        if asked or os.getppid() != parent:
            take_down(child)
            break
        time.sleep(0.2)
    code = child.wait()
    return code if code >= 0 else 128 - code


def take_down(child: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM to the group, ``grace_s`` for the command to end, then SIGKILL to everything of the group but this."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (child.poll() is None or group_others()):
        time.sleep(0.1)
    for pid in group_others():
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def group_others() -> list[int]:
    """The live processes of this process group other than this one (from ``/proc``; zombies count as gone)."""
    me, group, out = os.getpid(), os.getpgrp(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            out.append(int(name))
    return out


if __name__ == "__main__":
    sys.exit(main())
