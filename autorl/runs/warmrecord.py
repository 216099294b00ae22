"""What a run that went to a warm pool leaves for the ledger (docs/warm-trials.md 3.5): the pool and the trial's
place in it, as columns, and the pool's start, reuse and retirements, as events. A backend notes them in the run
folder (``WARM_FILE``, ``WARM_RETIRED_FILE``); ``lifecycle.close_attempt`` reads them with the trial's end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autorl.backends.base import WARM_FILE, WARM_RETIRED_FILE

MAX_RETIRED_EVENTS = 16  # a run retires at most the pools on its head; more lines than that are not its own


def warm_columns(run_dir: Path) -> dict[str, Any]:
    """``warm_pool`` and ``warm_index`` from the ``WARM_FILE`` a backend leaves in a run folder when the run went
    to a warm pool; nothing for a run that did not (or a file that does not read)."""
    try:
        found = json.loads((run_dir / WARM_FILE).read_text())
        return {"warm_pool": str(found["pool"]), "warm_index": int(found["index"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def warm_events(run_dir: Path) -> list[tuple[str, str]]:
    """The ledger events of a run that went to a warm pool (docs/warm-trials.md 3.5): ``warm-pool-start`` for the
    trial that built its pool, ``warm-trial`` for a later one (with the seconds the pool measured: the engine reset,
    the new actor, the fit), and a ``warm-pool-retired`` for each pool retired on the run's account, with why."""
    out: list[tuple[str, str]] = []
    try:
        found = json.loads((run_dir / WARM_FILE).read_text())
        pool, index = str(found["pool"]), int(found["index"])
        seconds = found.get("seconds") or {}
    except (OSError, ValueError, KeyError, TypeError):
        pool = None
    if pool is not None:
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
