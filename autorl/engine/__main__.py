"""Command line of the embedded engine (what the embedded backend launches).

    python -m autorl.engine --config CFG.json --metrics-out METRICS.jsonl --cache-dir DIR

Exit codes: 0 done, 2 a user mistake (bad config, missing file, reward that does
not import; one line on stderr), 3 stopped on a NaN/inf loss or gradient norm,
1 anything else.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError

from autorl.engine.config import EngineConfig
from autorl.errors import UserError, validation_line

EXIT_NAN = 3


def config_error(exc: ValidationError) -> str:
    """One line naming the first invalid field of a config."""
    return "config: " + validation_line(exc, unknown=lambda loc: "check the spelling against EngineConfig")


def load_config(path: str) -> EngineConfig:
    """Read and validate CFG.json, raising UserError with one line on any problem."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"config file {p} not found: pass the path of a JSON engine config") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"config file {p} is not valid JSON (line {exc.lineno}): fix the syntax") from None
    if not isinstance(data, dict):
        raise UserError(f"config file {p} must hold a JSON object of EngineConfig keys")
    try:
        return EngineConfig.model_validate(data)
    except ValidationError as exc:
        raise UserError(config_error(exc)) from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m autorl.engine", description="Run one GRPO trial of the embedded engine.")
    parser.add_argument("--config", required=True, help="JSON file of EngineConfig keys.")
    parser.add_argument("--metrics-out", required=True, help="Metrics JSONL file to write.")
    parser.add_argument("--cache-dir", required=True, help="Directory for cached base models.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args.config)
        from autorl.engine.grpo import run  # torch loads only once the config is valid

        summary = run(config, args.metrics_out, args.cache_dir)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return exit_code(summary)


def exit_code(summary: dict) -> int:
    """0, or EXIT_NAN with one line on stderr when the run stopped on a NaN/inf (shared by the TRL runner)."""
    if summary["status"] == "nan":
        print(f"error: NaN/inf loss or gradient norm after step {summary['steps_done']}: lower lr or check the reward",
              file=sys.stderr)
        return EXIT_NAN
    return 0


if __name__ == "__main__":
    sys.exit(main())
