"""Where an OpenRLHF trial's time goes: its log cut into phases at the lines each phase starts with.

The job log autorl copies from Ray (``train.log``) has a sidecar ``train.log.times``: the character offset of
each copied chunk and the time it arrived. A marker line's time is the arrival of its chunk (about a second's
resolution, whatever clock or format the line itself carries). The phases of OpenRLHF 0.10.x with vLLM and
DeepSpeed, colocated or not, in the order a run passes them:

- ``driver``, from Ray's ``Runtime env is setting up``: the job's runtime env and the driver's imports;
- ``vllm``, from ``Connected to Ray cluster``: vLLM engine actors: imports, engine start, weights, KV cache;
- ``actor``, from vLLM's first ``seconds to fall asleep`` (colocated) or the first ``Generate samples``: the
  DeepSpeed actor (and reference), the trainer, the NCCL group;
- ``training``, from vLLM's first ``wake up tags ['weights']`` or the first ``Starting experience making``: every
  GRPO step;
- ``save``, from ``Prompt dataloader is exhausted``: the final model written, the job's end.

In the split layout (not colocated) nothing sleeps and the vLLM engines and the actor start side by side on their
own cards: ``vllm`` then holds both starts and ``actor`` is the second or so before the first generation.

``phases`` also takes the trial's own start and end (the controller's clock): the time before the job's first
line is ``submit`` (Ray head, packaging the working directory) and after its last copied chunk ``eval`` (the
per-item evaluation that runs after the job, and closing the trial). A trial that never reached its first step
(it died or was stopped while starting) ran no eval: its time after the job's last chunk is ``stopped``, and it
has no start-up (``start_up`` gives None), only the phases it reached.
"""

from __future__ import annotations

import bisect
import re
from pathlib import Path

MARKS: list[tuple[str, re.Pattern[str]]] = [
    ("driver", re.compile(r"Runtime env is setting up|Running entrypoint for job")),
    ("vllm", re.compile(r"Connected to Ray cluster")),
    ("actor", re.compile(r"seconds to fall asleep|Generate samples")),
    ("training", re.compile(r"seconds to wake up tags \['weights'\]|Starting experience making")),
    ("save", re.compile(r"Prompt dataloader is exhausted")),
]
# A trial of a warm pool (``warm.py``) is cut at the pool server's own lines: its engines are reset and put to
# sleep before its actors start, so vLLM's sleep and wake lines no longer mark the actor and training phases.
# The pool's first trial keeps the job's first lines (runtime env, driver imports, Ray connection).
WARM_MARKS: list[tuple[str, re.Pattern[str]]] = [
    ("driver", re.compile(r"Runtime env is setting up|Running entrypoint for job|^AUTORL-WARM \S+ begin", re.M)),
    ("vllm", re.compile(r"Connected to Ray cluster|^AUTORL-WARM \S+ vllm", re.M)),
    ("actor", re.compile(r"^AUTORL-WARM \S+ actor", re.M)),
    ("training", re.compile(r"^AUTORL-WARM \S+ fit", re.M)),
    ("save", re.compile(r"Prompt dataloader is exhausted")),
]
WARM = re.compile(r"^AUTORL-WARM \S+ begin", re.M)
ORDER = ["submit", *(name for name, _ in MARKS), "eval"]
START_UP = ("submit", "driver", "vllm", "actor")  # the phases before the first training step
STOPPED = "stopped"  # after the last line of a job that never reached its first step: no eval ran


def read_times(path: str | Path) -> list[tuple[int, float]]:
    """(offset, arrival) of each copied chunk, from a ``.times`` sidecar ('' or missing: none)."""
    p = Path(path)
    if not p.is_file():
        return []
    rows = []
    for line in p.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 2:
            rows.append((int(parts[0]), float(parts[1])))
    return rows


def marks(text: str, times: list[tuple[int, float]]) -> dict[str, float]:
    """Phase name -> arrival time of its first marker line, for the phases the log reached in order."""
    if not times:
        return {}
    offsets = [o for o, _ in times]
    out: dict[str, float] = {}
    start = 0
    for name, pattern in WARM_MARKS if WARM.search(text) else MARKS:
        found = pattern.search(text, start)
        if found is None:
            continue
        out[name] = times[max(bisect.bisect_right(offsets, found.start()) - 1, 0)][1]
        start = found.end()
    return out


def phases(text: str, times: list[tuple[int, float]], started: float, ended: float) -> dict[str, float]:
    """Seconds per phase (``ORDER``) of a trial that ran from ``started`` to ``ended``; phases not reached are 0.

    Empty when the log has no arrival times (a log copied before the sidecar existed): nothing can be split."""
    if not times:
        return {}
    reached = marks(text, times)
    points = [("submit", started), *reached.items()]
    job_end = times[-1][1]
    tail = "eval" if "training" in reached else STOPPED
    points += [(tail, max(job_end, points[-1][1])), ("end", ended)]
    out = dict.fromkeys(ORDER, 0.0)
    for (name, at), (_, nxt) in zip(points, points[1:]):
        out[name] = round(max(nxt - at, 0.0), 2)
    return out


def start_up(row: dict[str, float]) -> float | None:
    """A trial's start-up from ``phases``: submission to its first training step; None for a trial that never
    reached one (what it spent is not a start-up: it ended, or was stopped, before training)."""
    if STOPPED in row:
        return None
    return sum(row[p] for p in START_UP)


def table(rows: dict[str, dict[str, float]]) -> str:
    """A Markdown table: one column per trial, one row per phase, and the start-up and training shares."""
    names = list(rows)
    lines = ["| phase | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    order = ORDER + [STOPPED] * any(STOPPED in row for row in rows.values())
    for phase in order:
        lines.append(f"| {phase} | " + " | ".join(f"{rows[n].get(phase, 0.0):.0f} s" for n in names) + " |")
    total = {n: sum(rows[n].values()) for n in names}
    lines.append("| **total** | " + " | ".join(f"{total[n]:.0f} s" for n in names) + " |")
    start = {n: start_up(rows[n]) for n in names}
    cells = ("no step" if start[n] is None else f"{start[n]:.0f} s" for n in names)
    lines.append("| start-up (submit to first step) | " + " | ".join(cells) + " |")
    share = {n: (rows[n]["training"] + rows[n]["eval"]) / total[n] if total[n] else 0.0 for n in names}
    cells = ("-" if start[n] is None else f"{share[n]:.0%}" for n in names)
    lines.append("| training + eval share | " + " | ".join(cells) + " |")
    return "\n".join(lines)
