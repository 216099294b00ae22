"""What a run that went to a warm pool leaves for the ledger (docs/warm-trials.md 3.5): the pool and the trial's
place in it, as columns, and the pool's start, reuse and retirements, as events. A backend notes them in the run
folder (``WARM_FILE``, ``WARM_RETIRED_FILE``); ``lifecycle.close_attempt`` reads them with the trial's end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autorl.backends.base import WARM_FILE, WARM_RETIRED_FILE

MAX_RETIRED_EVENTS = 16  # a run retires at most the pools on its head; more lines than that are not its own


def _warm_file(run_dir: Path) -> tuple[str, int, dict[str, Any]] | None:
    """(pool, index, seconds) from the ``WARM_FILE`` a backend leaves in a run folder when the run went to a warm
    pool; None for a run that did not (or a file that does not read)."""
    try:
        found = json.loads((run_dir / WARM_FILE).read_text())
        seconds = found.get("seconds") or {}
        return str(found["pool"]), int(found["index"]), seconds if isinstance(seconds, dict) else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def warm_columns(run_dir: Path) -> dict[str, Any]:
    """``warm_pool`` and ``warm_index`` of a run that went to a warm pool; nothing for one that did not."""
    found = _warm_file(run_dir)
    return {} if found is None else {"warm_pool": found[0], "warm_index": found[1]}


def warm_events(run_dir: Path) -> list[tuple[str, str]]:
    """The ledger events of a run that went to a warm pool (docs/warm-trials.md 3.5): ``warm-pool-start`` for the
    trial that built its pool, ``warm-trial`` for a later one (with the seconds the pool measured: the engine reset,
    the new actor, the fit), and a ``warm-pool-retired`` for each pool retired on the run's account, with why."""
    out: list[tuple[str, str]] = []
    found = _warm_file(run_dir)
    if found is not None:
        pool, index, seconds = found
        took = ", ".join(f"{k} {float(v):.1f} s" for k, v in sorted(seconds.items()) if isinstance(v, (int, float)))
        if index == 0:
            out.append(("warm-pool-start", f"{pool}: built by this trial{'; ' + took if took else ''}"))
        else:
            out.append(("warm-trial", f"{pool}: its trial {index + 1}, after a reset{'; ' + took if took else ''}"))
    try:
        lines = (run_dir / WARM_RETIRED_FILE).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines[:MAX_RETIRED_EVENTS]:
        try:
            r = json.loads(line)
            out.append(("warm-pool-retired", f"{r['pool']} after {int(r['trials'])} trials: {str(r['reason'])[:200]}"))
        except (ValueError, KeyError, TypeError):
            continue
    return out
