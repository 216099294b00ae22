"""Warm pools, the controller's side: OpenRLHF trials handed to long-lived Ray jobs (``warm_server.py``) instead of
each starting its own driver, vLLM engines and imports (docs/warm-trials.md; a recipe turns it on with
``train.warm_pool: true``).

A **pool** is one Ray job of ``python -m autorl.backends.openrlhf.warm_server POOL_DIR`` on the local head. Its key
(``LaunchPlan.pool_key``, made by the backend from what sizes the engines and placement) says which trials it can
take. A trial goes to an idle pool with its key; with none, a new pool is submitted with the trial's own runtime
environment, after the least recently used idle pool is retired when the head has no room for another
(``capacity``). A pool that refuses a trial (another key, another OpenRLHF) leaves it to a cold job, as before.

``WarmTrialHandle`` follows one trial through the ``RunHandle`` protocol: its exit code from the pool's done file,
its own slice of the pool's job log (from its ``AUTORL-WARM <attempt> begin`` line, or the log's start for the
pool's first trial, to its ``end`` line) copied to the trial's ``train.log`` with the arrival-times sidecar that
``phases.py`` reads, its metrics from its own run folder. When the trial ends it writes ``WARM_FILE`` in the run
folder (the pool and the trial's index in it), which the study copies to the ledger.

A trial whose pool job ends before its done file exits 1 with one line saying so in its log (triage reads it as
any crash); a failed trial retires its pool (the server ends itself); a cancel asks the server to stop the trial,
and stops the pool's job when that is not done in time.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autorl.backends.base import WARM_FILE, WARM_RETIRED_FILE, LaunchPlan, RunHandle
from autorl.backends.openrlhf.metrics import OpenRLHFMetricsReader
from autorl.backends.openrlhf.warm_server import REFUSED, STOPPED

SERVER = "autorl.backends.openrlhf.warm_server"
MARK = "AUTORL-WARM"
STOP_GRACE_S = 60.0  # a stopped trial's actors are killed and its done file written in a few seconds
LOG_WAIT_S = 15.0  # how long a finished trial waits for the end of its log to arrive from Ray
LOST = 1  # the exit code of a trial whose pool's job ended without a verdict on it


class PoolLog:
    """A pool job's log as copied by its ``RayJobHandle`` (``pool.log`` and ``pool.log.times``), read
    incrementally: the whole text so far and the (character offset, arrival time) of each copied chunk."""

    def __init__(self, path: Path):
        self.path = path
        self.text = ""
        self.times: list[tuple[int, float]] = []
        self._bytes = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._times_read = 0

    def refresh(self) -> None:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._bytes)
                data = fh.read()
        except OSError:
            return
        self._bytes += len(data)
        self.text += self._decoder.decode(data)
        times = self.path.with_name(self.path.name + ".times")
        try:
            with times.open() as fh:
                fh.seek(self._times_read)
                rest = fh.read()
        except OSError:
            return
        complete = rest[: rest.rfind("\n") + 1]
        self._times_read += len(complete)
        for line in complete.splitlines():
            offset, _, at = line.partition("\t")
            try:
                self.times.append((int(offset), float(at)))
            except ValueError:
                continue

    def arrival(self, offset: int) -> float:
        """When the chunk holding ``offset`` arrived (now, before any chunk did)."""
        return arrival(self.times, offset)


def arrival(times: list[tuple[int, float]], offset: int) -> float:
    """When the chunk of ``times`` (offset, arrival) holding ``offset`` arrived (now, before any chunk did)."""
    found = [at for start, at in times if start <= offset]
    return found[-1] if found else time.time()


def trial_slice(text: str, attempt: str, first: bool, after: int = 0) -> tuple[int | None, int | None]:
    """Where ``attempt``'s part of a pool log starts and ends (None: not yet). The pool's first trial owns the log
    from its start (the job's runtime env and the driver's imports are its start-up); a later trial starts at its
    ``begin`` line, searched from ``after``. Its ``end`` line is the last it owns."""
    begin = re.compile(rf"^{MARK} {re.escape(attempt)} begin\b.*$", re.MULTILINE).search(text, after)
    if begin is None:
        return None, None
    start = 0 if first else begin.start()
    end = re.compile(rf"^{MARK} {re.escape(attempt)} end\b.*$\n?", re.MULTILINE).search(text, begin.end())
    return start, (end.end() if end else None)


def slice_times(times: list[tuple[int, float]], begin: int, stop: int, start: int) -> list[tuple[int, float]]:
    """Arrival times for the part ``[begin, stop)`` of a pool log copied into a trial's log whose first character is
    the pool log's ``start``: the chunk holding ``begin`` marks it, each chunk starting inside marks itself; offsets
    are the trial log's."""
    return [(begin - start, arrival(times, begin))] + [(o - start, at) for o, at in times if begin < o < stop]


class Pool:
    """One warm pool: its folder, job, key and the trial it runs."""

    def __init__(self, root: Path, key: str):
        self.id = f"warm-{uuid.uuid4().hex[:8]}"
        self.dir = root / self.id
        for sub in ("inbox", "done", "stop"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.key = key
        self.job: Any = None  # the RayJobHandle of the pool's job (set by WarmPools.start)
        self.log = PoolLog(self.dir / "pool.log")
        self.busy: str | None = None
        self.trials = 0  # trials handed to it so far: the next one's warm_index
        self.last_used = time.time()
        self.retired = False

    def alive(self) -> bool:
        if self.retired or self.job is None:
            return False
        try:
            return self.job.poll() is None
        except Exception:  # the head is away: the trial's own poll decides
            return True

    def refresh(self, force: bool = False) -> None:
        if self.job is not None:
            try:
                self.job.sync_logs(force=force)
            except Exception:  # the head is away; poll ends the trial after its grace
                pass
        self.log.refresh()

    def retire(self, reason: str, run_dir: Path | None = None) -> None:
        """End the pool: its server stops after the trial in hand; its job is stopped. The reason goes to the run
        folder of the trial on whose account it was retired (``note_retired``), and from there to the ledger."""
        if self.retired:
            return
        self.retired = True
        try:
            (self.dir / "retire").write_text("retire\n")
        except OSError:
            pass
        note_retired(self, reason, run_dir)
        if self.job is not None:
            self.job.cancel(grace_s=5.0)


def note_retired(pool: Pool, reason: str, run_dir: Path | None) -> None:
    """One line in ``run_dir``'s ``WARM_RETIRED_FILE``: the pool, why it was retired and how many trials it ran
    (none where no trial's run caused it, as when the study ends)."""
    if run_dir is None:
        return
    line = json.dumps({"pool": pool.id, "reason": reason, "trials": pool.trials}, sort_keys=True)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with (run_dir / WARM_RETIRED_FILE).open("a") as fh:
            fh.write(line + "\n")
    except OSError:
        pass


class WarmPools:
    """The study's pools on one Ray head."""

    def __init__(
        self,
        root: Path,
        capacity: int,
        submit_pool: Callable[[LaunchPlan, Pool], Any],
        start_cold: Callable[[LaunchPlan], RunHandle],
    ):
        self.root, self.capacity = root, max(capacity, 1)
        self.submit_pool, self.start_cold = submit_pool, start_cold
        self.pools: list[Pool] = []
        self.cold: list[RunHandle] = []  # jobs of their own started beside the pools: they need GPUs too
        self._lock = threading.Lock()  # a benchmark hands trials over from several threads

    def live(self) -> list[Pool]:
        self.pools = [p for p in self.pools if not p.retired]
        return self.pools

    def start(self, plan: LaunchPlan) -> WarmTrialHandle:
        """Hand the trial to an idle pool with its key, or to a new pool."""
        assert plan.pool_key is not None
        with self._lock:
            return self._start(plan, plan.pool_key)

    def _start(self, plan: LaunchPlan, key: str) -> WarmTrialHandle:
        self._bury(Path(plan.log_path).parent)
        pool = next((p for p in self.live() if p.busy is None and p.key == key and p.alive()), None)
        if pool is None:
            self.make_room(1, Path(plan.log_path).parent, "a new pool")
            pool = Pool(self.root, key)
            pool.job = self.submit_pool(plan, pool)
            self.pools.append(pool)
        return WarmTrialHandle(self, pool, plan)

    def _bury(self, run_dir: Path) -> None:
        """Idle pools whose job has ended (the server killed, its node lost) are retired, each noted in the run
        folder of the trial about to start, so the ledger says the pool died and why that trial starts cold."""
        for pool in [p for p in self.live() if p.busy is None and p.job is not None and not p.alive()]:
            pool.retired = True
            note_retired(pool, f"its server ended while idle, before trial {run_dir.name} was handed out", run_dir)

    def make_room(self, extra: int, run_dir: Path | None = None, wanted: str = "a job of its own") -> None:
        """Retire idle pools, least recently used first, until ``extra`` more jobs fit beside the live pools and
        the jobs of their own still running; each retirement is noted in ``run_dir`` (the run that needs the room,
        or that just left its pool idle), for ``wanted``."""
        self.cold = [h for h in self.cold if h.poll() is None]
        for pool in sorted((p for p in self.live() if p.busy is None), key=lambda p: p.last_used):
            if len(self.live()) + len(self.cold) + extra <= self.capacity:
                return
            pool.retire(f"idle, its GPUs taken for {wanted}", run_dir)

    def track_cold(self, handle: RunHandle) -> RunHandle:
        """A job of its own started beside the pools: an idle pool is retired for it as soon as one is idle."""
        self.cold.append(handle)
        return handle

    def close(self) -> None:
        for pool in self.live():
            pool.retire("the study ended")


class WarmTrialHandle:
    """One trial in a warm pool, as a ``RunHandle``."""

    def __init__(self, pools: WarmPools, pool: Pool, plan: LaunchPlan):
        self.pools, self.pool, self.plan = pools, pool, plan
        self.attempt = Path(plan.log_path).parent.name
        self.log_path = Path(plan.log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.index = pool.trials
        pool.trials += 1
        pool.busy = self.attempt
        pool.refresh()
        self._after = len(pool.log.text)  # this trial's begin line comes after what the pool has logged so far
        self._start: int | None = None
        self._copied = 0
        self._code: int | None = None
        self._cold: RunHandle | None = None
        self._reader = OpenRLHFMetricsReader.from_plan(plan)
        self._flushed = False
        self._activity = time.time()
        self._handed = time.time()
        self._done_seen: float | None = None
        request = {
            "attempt": self.attempt,
            "argv": plan.argv,
            "env": plan.env,
            "run_dir": str(self.log_path.parent),
            "index": self.index,
        }
        inbox = pool.dir / "inbox" / f"{time.time_ns():020d}-{self.attempt}.json"
        tmp = inbox.with_suffix(".tmp")
        tmp.write_text(json.dumps(request))
        os.replace(tmp, inbox)

    # ---- what the study reads ------------------------------------------------------------------------------------
    @property
    def job_id(self) -> str | None:
        return getattr(self._cold, "job_id", None) if self._cold is not None else getattr(self.pool.job, "job_id", None)

    @property
    def warm(self) -> tuple[str, int] | None:
        if isinstance(self._cold, WarmTrialHandle):  # moved to another pool (``_rehome``)
            return self._cold.warm
        return None if self._cold is not None else (self.pool.id, self.index)

    def poll(self) -> int | None:
        if self._cold is not None:
            return self._cold.poll()
        if self._code is not None:
            return self._code
        self.pool.refresh()
        self._copy()
        done = self.pool.dir / "done" / f"{self.attempt}.json"
        if done.is_file():
            try:
                verdict = json.loads(done.read_text())
            except ValueError:
                return None  # written atomically: a partial read is another process's temp file
            if not self._ended():  # the job's log reaches autorl after the file: wait for its end line a while
                self._done_seen = self._done_seen or time.time()
                if time.time() - self._done_seen < LOG_WAIT_S:
                    return None
            return self._finish(int(verdict.get("code", LOST)), verdict)
        if not self.pool.alive():
            self.pool.refresh()
            self._copy()
            if self._start is None:  # it died before the trial began: nothing of the trial is lost, so move it
                self._rehome()
                return None
            self._line(f"autorl: the warm pool {self.pool.id} ended before trial {self.attempt} finished")
            return self._finish(LOST, None)
        if self._start is None and time.time() - self._handed > 5.0:  # a new pool waiting for GPUs idle pools hold
            self.pools.make_room(0, self.log_path.parent, "a new pool")
        return None

    def _rehome(self) -> None:
        """Hand this trial, which its pool never began, to a live pool of its key or a new one: a pool whose server
        died between two trials (killed, its node lost) costs the next trial a cold start, not its run. The trial's
        log is started afresh (it holds only the dead pool's own start-up, if anything), and the handle delegates
        to the new pool's."""
        dead = self.pool
        dead.busy = None
        if not dead.retired:
            dead.retired = True
            note_retired(dead, f"its server ended before trial {self.attempt} began", self.log_path.parent)
        for path in (self.log_path, self.log_path.with_name(self.log_path.name + ".times")):
            path.unlink(missing_ok=True)
        with self.pools._lock:
            self._cold = self.pools._start(self.plan, dead.key)

    def _ended(self) -> bool:
        """Whether the trial's end line has reached its log (its slice copied up to it)."""
        self.pool.refresh(force=True)
        self._copy()
        return trial_slice(self.pool.log.text, self.attempt, self.index == 0, self._after)[1] is not None

    def _finish(self, code: int, verdict: dict[str, Any] | None) -> int | None:
        pool = self.pool
        pool.busy, pool.last_used = None, time.time()
        if code == REFUSED:
            reason = (verdict or {}).get("reason", "refused")
            self._line(f"autorl: the warm pool {pool.id} did not take this trial ({reason}): it runs as its own job")
            self.pools.make_room(1, self.log_path.parent)
            self._cold = self.pools.track_cold(self.pools.start_cold(self.plan))
            return None
        if code != 0:
            if not pool.retired:  # the server ends itself after a failed or stopped trial
                pool.retired = True
                note_retired(pool, f"its trial {self.attempt} ended with exit {code}", self.log_path.parent)
        else:  # idle now: its GPUs go to a job of its own that waits for them
            self.pools.make_room(0, self.log_path.parent)
        payload = {"pool": pool.id, "index": self.index, "seconds": (verdict or {}).get("seconds", {})}
        (self.log_path.parent / WARM_FILE).write_text(json.dumps(payload, sort_keys=True))
        self._code = code
        return code

    def _copy(self) -> None:
        """Append the new part of this trial's slice of the pool log to its own log, with arrival times."""
        text = self.pool.log.text
        start, end = trial_slice(text, self.attempt, self.index == 0, self._after)
        if start is None:
            return
        self._start = start
        stop = end if end is not None else len(text)
        begin = start + self._copied
        if stop <= begin:
            return
        chunk = text[begin:stop]
        with self.log_path.open("a") as fh:
            fh.write(chunk)
        with self.log_path.with_name(self.log_path.name + ".times").open("a") as fh:
            for offset, at in slice_times(self.pool.log.times, begin, stop, start):
                fh.write(f"{offset}\t{at:.2f}\n")
        self._copied += len(chunk)
        self._activity = time.time()

    def _line(self, text: str) -> None:
        with self.log_path.open("a") as fh:
            fh.write(f"\n{text}\n")

    def cancel(self, grace_s: float = 5.0) -> None:
        if self._cold is not None:
            self._cold.cancel(grace_s)
            return
        if self._code is not None:
            return
        (self.pool.dir / "stop" / self.attempt).write_text("stop\n")
        deadline = time.time() + grace_s + STOP_GRACE_S
        while time.time() < deadline:
            if self.poll() is not None:
                return
            time.sleep(0.2)
        self.pool.retire(
            f"its trial {self.attempt} did not stop in {grace_s + STOP_GRACE_S:.0f} s", self.log_path.parent
        )
        self._finish(STOPPED, None)

    def metrics(self) -> list[dict[str, Any]]:
        if self._cold is not None:
            return self._cold.metrics()
        records = self._reader.poll()
        if self._code is not None and not self._flushed:
            records += self._reader.flush()
            self._flushed = True
        if records:
            self._activity = time.time()
        return records

    def last_activity(self) -> float:
        if self._cold is not None:
            return self._cold.last_activity()
        return self._activity

    def waiting(self) -> Any:
        if self._cold is not None:
            return self._cold.waiting()
        if self._start is None and self.pool.job is not None:
            return self.pool.job.waiting()
        return None
