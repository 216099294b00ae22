"""Command line of the embedded engine (what the embedded backend launches).

    python -m autorl.engine --config CFG.json --metrics-out METRICS.jsonl --cache-dir DIR

The entry every engine shares (``autorl.toolkit.child``): exit 0 done, 2 a user mistake (one line on stderr),
3 stopped on a NaN/inf loss or gradient norm, 1 anything else.
"""

from __future__ import annotations

import sys
from typing import Any

from autorl.engine.config import EngineConfig
from autorl.toolkit import child


def run(config: EngineConfig, metrics_out: str, cache_dir: str) -> dict[str, Any]:
    # lazy: torch loads only here, once the config is valid: a bad config is refused without it
    from autorl.engine.grpo import run as run_grpo

    return run_grpo(config, metrics_out, cache_dir)


def main(argv: list[str] | None = None) -> int:
    return child.main("autorl.engine", "Run one GRPO trial of the embedded engine.", EngineConfig, run, argv)


if __name__ == "__main__":
    sys.exit(main())
