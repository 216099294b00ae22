"""The entry of a trial's child process, one for every engine autorl launches as ``python -m ...``.

    python -m <engine> --config CFG.json --metrics-out METRICS.jsonl --cache-dir DIR

``main`` reads CFG.json and validates it once, into the engine's own pydantic model, then calls the engine's
``run(config, metrics_out, cache_dir) -> summary``. Exit codes, the same for every engine: 0 done, 2 a user
mistake (bad config, missing file, a reward that does not import; one line on stderr), 3 stopped on a NaN/inf
loss or gradient norm, 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from autorl.errors import UserError, validation_line

EXIT_NAN = 3
Config = TypeVar("Config", bound=BaseModel)


def load_config(path: str, model: type[Config]) -> Config:
    """Read and validate CFG.json into ``model``, raising UserError with one line on any problem."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"config file {p} not found: pass the path of a JSON {model.__name__}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"config file {p} is not valid JSON (line {exc.lineno}): fix the syntax") from None
    if not isinstance(data, dict):
        raise UserError(f"config file {p} must hold a JSON object of {model.__name__} keys")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        unknown = lambda loc: f"check the spelling against {model.__name__}"  # noqa: E731
        raise UserError("config: " + validation_line(exc, unknown=unknown)) from None


def parse_args(prog: str, description: str, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    parser.add_argument("--config", required=True, help="JSON file of the engine's config keys.")
    parser.add_argument("--metrics-out", required=True, help="Metrics JSONL file to write.")
    parser.add_argument("--cache-dir", required=True, help="Directory for cached base models.")
    return parser.parse_args(argv)


def main(
    prog: str,
    description: str,
    model: type[Config],
    run: Callable[[Config, str, str], dict[str, Any]],
    argv: list[str] | None = None,
) -> int:
    """Parse, validate, run; the exit code of the run (see the module's docstring)."""
    args = parse_args(prog, description, argv)
    try:
        summary = run(load_config(args.config, model), args.metrics_out, args.cache_dir)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return exit_code(summary)


def exit_code(summary: dict[str, Any]) -> int:
    """0, or EXIT_NAN with one line on stderr when the run stopped on a NaN/inf."""
    if summary["status"] == "nan":
        print(
            f"error: NaN/inf loss or gradient norm after step {summary['steps_done']}: lower lr or check the reward",
            file=sys.stderr,
        )
        return EXIT_NAN
    return 0
