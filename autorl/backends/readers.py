"""Metric readers: turn a training script's own logs into autorl's metric records.

A script run by the command backend keeps logging the way it always did; a
reader, polled by the controller, returns the records that appeared since the
last call, already in autorl's schema (``autorl.metrics``)::

    read = make_reader("trainer_state", "out/", {"rewards/em/mean": "correctness"})
    read()  # -> [{"type": "step", "step": 1, "reward_mean": 0.4, ...}, ...]

Four formats are understood:

- ``jsonl``: one JSON object per line; ``step`` or ``global_step`` gives the step;
- ``tensorboard``: event files under a directory (``train/`` prefixes dropped);
- ``trainer_state``: Hugging Face ``trainer_state.json`` ``log_history``,
  re-read whenever the file changes (a directory means its newest checkpoint);
- ``stdout_dicts``: the ``{'loss': 0.1, 'reward': '0.4', ...}`` lines that
  transformers and TRL print, read from the run's log file (dicts with any
  non-numeric value, such as a printed config, are skipped).

Key names are translated by ``DEFAULT_METRIC_MAP`` (TRL's names) and then by the
recipe's own ``metric_map``; keys that neither names pass through unchanged.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from autorl.errors import RecipeError
from autorl.metrics import JsonlTail

FORMATS = ("jsonl", "tensorboard", "trainer_state", "stdout_dicts")

# TRL / transformers log key -> autorl key (see notes on GRPOTrainer's logged metrics).
DEFAULT_METRIC_MAP: dict[str, str] = {
    "global_step": "step",
    "reward": "reward_mean",
    "reward_std": "reward_std",
    "kl": "kl",
    "clip_ratio/region_mean": "clip_ratio",
    "frac_reward_zero_std": "frac_zero_std_groups",
    "completions/clipped_ratio": "truncated_rate",
    "completions/mean_length": "response_length_mean",
    "entropy": "entropy_mean",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "loss": "loss",
    "train_runtime": "wall_s",
}

# Which record type a raw log dict becomes: the first rule whose key prefix
# matches any key wins; otherwise it is a step record.
KIND_RULES: list[tuple[str, str]] = [
    ("train_runtime", "summary"),
    ("eval_", "eval"),
    ("eval/", "eval"),
]

# Prefixes dropped from TensorBoard tags (transformers' rewrite_logs adds "train/").
TB_STRIP_PREFIXES = ("train/",)

_NONFINITE = re.compile(r"(?<=[:,\[\s])(-?inf|nan)(?=\s*[,}\]])")


class Reader(Protocol):
    """The new records at each call; ``final=True`` (the run has exited) releases a step held back as possibly
    incomplete."""

    def __call__(self, final: bool = False) -> list[dict[str, Any]]: ...


def make_reader(fmt: str, path: str | Path, metric_map: dict[str, str] | None = None) -> Reader:
    """A callable returning the new records of ``path`` (in ``fmt``) at each call.

    The callable also accepts ``final=True`` (the run has exited): readers that
    hold back a possibly incomplete step then release it.
    """
    readers: dict[str, Callable[[str | Path, dict[str, str] | None], Reader]] = {
        "jsonl": JsonlReader,
        "tensorboard": TensorBoardReader,
        "trainer_state": TrainerStateReader,
        "stdout_dicts": StdoutDictReader,
    }
    if fmt not in readers:
        raise RecipeError(f"metrics_format '{fmt}' is unknown: use one of {', '.join(FORMATS)}")
    return readers[fmt](path, metric_map)


def to_record(raw: dict[str, Any], metric_map: dict[str, str], step: int) -> dict[str, Any]:
    """One raw log dict as an autorl record; ``step`` is used when the dict has none."""
    kind = raw.get("type") or record_kind(raw)
    rec: dict[str, Any] = {"type": kind}
    for key, value in raw.items():
        if key != "type":
            rec[metric_map.get(key, key)] = _number(value)
    rec["step"] = _int_step(rec.get("step"), step)
    if kind == "summary":
        rec.setdefault("steps_done", rec["step"])
    return rec


def record_kind(raw: dict[str, Any]) -> str:
    """'step', 'eval' or 'summary' for a raw log dict, by ``KIND_RULES``."""
    for prefix, kind in KIND_RULES:
        if any(str(k).startswith(prefix) for k in raw):
            return kind
    return "step"


def parse_dict_line(text: str) -> dict[str, Any] | None:
    """A printed Python dict (``{'loss': 0.1, 'x': nan}``) or None if the text holds none.

    Progress-bar text before the dict (stderr interleaved into the same log) is skipped.
    """
    starts = [i for i in (text.find("{'"), text.find('{"')) if i >= 0]
    text = text[min(starts) :].strip() if starts else text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        value = ast.literal_eval(_NONFINITE.sub(r"'\1'", text))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def is_log_dict(raw: dict[str, Any]) -> bool:
    """True if every value is a number (or a printed one): a metrics dict, not a printed config."""
    values = [_number(v) for v in raw.values()]
    return bool(values) and all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values)


def _number(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _int_step(value: Any, fallback: int) -> int:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return int(value)
    return fallback


class _Reader:
    """Shared state: the merged key map and the last step seen."""

    def __init__(self, path: str | Path, metric_map: dict[str, str] | None):
        self.path = Path(path)
        self.metric_map = {**DEFAULT_METRIC_MAP, **(metric_map or {})}
        self.last_step = 0

    def _records(self, raws: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for raw in raws:
            kind = raw.get("type") or record_kind(raw)
            fallback = self.last_step + 1 if kind == "step" else self.last_step
            rec = to_record(raw, self.metric_map, fallback)
            self.last_step = max(self.last_step, rec["step"])
            out.append(rec)
        return out


class JsonlReader(_Reader):
    """New lines of a growing JSONL file; any dicts, with ``step`` or ``global_step``."""

    def __init__(self, path: str | Path, metric_map: dict[str, str] | None = None):
        super().__init__(path, metric_map)
        self._tail = JsonlTail(self.path)

    def __call__(self, final: bool = False) -> list[dict[str, Any]]:
        return self._records(self._tail.poll())


class StdoutDictReader(_Reader):
    """Printed dict lines in a log file (a step is counted per training dict)."""

    def __init__(self, path: str | Path, metric_map: dict[str, str] | None = None):
        super().__init__(path, metric_map)
        self._offset = 0
        self._partial = ""

    def __call__(self, final: bool = False) -> list[dict[str, Any]]:
        lines = self._new_lines(final)
        raws = [d for line in lines for piece in line.split("\r") if (d := parse_dict_line(piece)) and is_log_dict(d)]
        return self._records(raws)

    def _new_lines(self, final: bool) -> list[str]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
            self._offset = fh.tell()
        lines = (self._partial + chunk.decode("utf-8", errors="replace")).split("\n")
        self._partial = "" if final else lines.pop()
        return lines


class TrainerStateReader(_Reader):
    """``log_history`` of a ``trainer_state.json``, re-read when it changes."""

    def __init__(self, path: str | Path, metric_map: dict[str, str] | None = None):
        super().__init__(path, metric_map)
        self._stamp: tuple | None = None
        self._seen: set[tuple[str, int]] = set()

    def __call__(self, final: bool = False) -> list[dict[str, Any]]:
        state_file = self._newest()
        if state_file is None:
            return []
        stat = state_file.stat()
        stamp = (str(state_file), stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return []
        try:
            history = json.loads(state_file.read_text()).get("log_history", [])
        except (json.JSONDecodeError, OSError, AttributeError):
            return []  # caught mid-write: read it again next time
        self._stamp = stamp
        return self._unseen(self._records([h for h in history if isinstance(h, dict)]))

    def _newest(self) -> Path | None:
        if self.path.is_file():
            return self.path
        if not self.path.is_dir():
            return None
        found = list(self.path.rglob("trainer_state.json"))
        return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None

    def _unseen(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for rec in records:
            key = (rec["type"], rec["step"])
            if key not in self._seen:
                self._seen.add(key)
                out.append(rec)
        return out


class TensorBoardReader(_Reader):
    """Scalars of every event file under a directory, grouped into one record per step.

    A step is released once a later step has appeared, when a poll finds nothing
    new (the writer is quiet), or on ``final``; so a step's tags come together.
    """

    def __init__(self, path: str | Path, metric_map: dict[str, str] | None = None):
        super().__init__(path, metric_map)
        self._accumulators: dict[Path, Any] = {}
        self._consumed: dict[tuple[Path, str], int] = {}
        self._pending: dict[tuple[str, int], dict[str, Any]] = {}

    def __call__(self, final: bool = False) -> list[dict[str, Any]]:
        fresh = 0
        for event_file in self._event_files():
            fresh += self._read_file(event_file)
        return self._release(final or fresh == 0)

    def _event_files(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        if not self.path.is_dir():
            return []
        return sorted(self.path.rglob("events.out.tfevents.*"))

    def _read_file(self, event_file: Path) -> int:
        acc = self._accumulators.get(event_file)
        if acc is None:
            # lazy: TensorBoard's reader is heavy, and only a run that logs TensorBoard events needs it
            from tensorboard.backend.event_processing import event_accumulator as ea

            acc = ea.EventAccumulator(str(event_file), size_guidance={ea.SCALARS: 0})
            self._accumulators[event_file] = acc
        acc.Reload()
        fresh = 0
        for tag in acc.Tags().get("scalars", []):
            events = acc.Scalars(tag)
            start = self._consumed.get((event_file, tag), 0)
            self._consumed[(event_file, tag)] = len(events)
            for event in events[start:]:
                self._add(tag, event.step, event.value)
                fresh += 1
        return fresh

    def _add(self, tag: str, step: int, value: float) -> None:
        for prefix in TB_STRIP_PREFIXES:
            tag = tag.removeprefix(prefix)
        kind = record_kind({tag: value})
        self._pending.setdefault((kind, int(step)), {"type": kind, "step": int(step)})[tag] = value

    def _release(self, flush_all: bool) -> list[dict[str, Any]]:
        if not self._pending:
            return []
        newest = max(step for _, step in self._pending)
        order = {"step": 0, "eval": 1, "summary": 2}
        ready = sorted(
            (k for k in self._pending if flush_all or k[1] < newest), key=lambda k: (k[1], order.get(k[0], 3))
        )
        return self._records([self._pending.pop(k) for k in ready])
