"""Reading an OpenRLHF run's metrics into autorl's schema (``autorl.metrics``).

Three sources, merged per global step:

- TensorBoard events that ``--use_tensorboard DIR`` (0.10.2+: ``--logger.tensorboard_dir``) writes to
  ``DIR/<run name>``: ``train/<key>`` scalars every logging step and ``eval/eval_<datasource>_pass<k>``
  scalars at each evaluation (OpenRLHF's ``TensorboardLogger``);
- the driver's stdout (the trial's log), where 0.10.x prints each step as
  ``✨ Global step N: {...}`` (behind Ray's ``(PPOTrainer pid=...)`` prefix): a step is complete as soon
  as its line is there, so metrics are live without TensorBoard;
- ``$METRICS_LOG_DIR/training_metrics.jsonl``, one line per step, written by
  ``patches/metrics_trainer.patch`` (grad norm, advantage, entropy and ratio-tail
  statistics that OpenRLHF 0.9.3 does not log).

``TRAIN_KEYS`` renames OpenRLHF's keys onto autorl's; unknown keys (reward
``extra_logs`` such as ``has_boxed``) keep their own name. A step is emitted
once its JSONL line exists or a later step has appeared; ``flush()`` emits
the rest when the run has ended.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from autorl.metrics import JsonlTail, declare_absent

TRAIN_KEYS: dict[str, str] = {
    "reward": "reward_mean",
    "rollout/reward_std": "reward_std",
    "kl": "kl",
    "ppo_clip_ratio": "clip_ratio",
    "response_length": "response_length_mean",
    "truncated": "truncated_rate",
    "group_reward_std": "group_reward_std",
    "policy_loss": "loss",
    "actor_lr": "lr",
    "entropy_loss": "entropy_mean",
    "actor_grad_norm": "grad_norm",
    "correctness": "correctness",
    "timing/generation": "time_generate_s",
    "timing/ppo_train": "time_update_s",
    "zero_std_group": "frac_zero_std_groups",
}

STEP_LINE = re.compile(r"Global step (\d+): (\{.*\})")

IGNORED_TAGS = {"train/generated_samples", "train/global_step", "eval/global_step"}


class OpenRLHFMetricsReader:
    """Incremental reader: ``poll()`` returns the new step and eval records since the last call."""

    def __init__(
        self,
        tensorboard_dir: str | Path | None,
        jsonl_path: str | Path | None,
        eval_map: dict[str, str] | None = None,
        stdout_path: str | Path | None = None,
    ):
        self.tensorboard_dir = Path(tensorboard_dir) if tensorboard_dir else None
        self.jsonl = JsonlTail(jsonl_path) if jsonl_path else None
        self.stdout = TextTail(stdout_path) if stdout_path else None
        self.eval_map = eval_map or {}
        self._acc = None
        self._seen: dict[str, int] = {}
        self._train: dict[int, dict[str, Any]] = {}
        self._evals: dict[int, dict[str, Any]] = {}
        self._jsonl_steps: set[int] = set()
        self._emitted: set[tuple[str, int]] = set()

    @classmethod
    def from_plan(cls, plan: Any) -> OpenRLHFMetricsReader:
        """The reader for an ``OpenRLHFBackend`` launch plan."""
        return cls(plan.env.get("AUTORL_TENSORBOARD_DIR"), plan.metrics_path, dict(plan.metric_map), plan.log_path)

    def poll(self) -> list[dict[str, Any]]:
        """New complete records (one step line per global step, one eval line per evaluation)."""
        self._read_sources()
        return self._emit(final=False)

    def flush(self) -> list[dict[str, Any]]:
        """Everything not yet emitted, complete or not (call once the run has ended)."""
        self._read_sources()
        return self._emit(final=True)

    def _read_sources(self) -> None:
        self._read_tensorboard()
        self._read_jsonl()
        self._read_stdout()

    # ---- sources -------------------------------------------------------------------

    def _read_tensorboard(self) -> None:
        acc = self._accumulator()
        if acc is None:
            return
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            if tag in IGNORED_TAGS:
                continue
            events = acc.Scalars(tag)
            for ev in events[self._seen.get(tag, 0) :]:
                self._store_scalar(tag, int(ev.step), float(ev.value))
            self._seen[tag] = len(events)

    def _accumulator(self):
        if self._acc is None and self.tensorboard_dir is not None and self.tensorboard_dir.is_dir():
            # lazy: TensorBoard's reader is heavy, and only a run that writes TensorBoard events needs it
            from tensorboard.backend.event_processing import event_accumulator

            self._acc = event_accumulator.EventAccumulator(str(self.tensorboard_dir), size_guidance={"scalars": 0})
        return self._acc

    def _store_scalar(self, tag: str, step: int, value: float) -> None:
        section, _, key = tag.partition("/")
        if section == "train":
            self._train.setdefault(step, {})[TRAIN_KEYS.get(key, key)] = value
        elif section == "eval":
            self._evals.setdefault(step, {})[self.eval_map.get(key, f"eval/openrlhf/{key}")] = value

    def _read_jsonl(self) -> None:
        for rec in self.jsonl.poll() if self.jsonl else []:
            step = rec.get("step")
            if not isinstance(step, int):
                continue
            numbers = {k: float(v) for k, v in rec.items() if k not in ("step", "type", "time") and _is_number(v)}
            if rec.get("type") == "eval":
                row = self._evals.setdefault(step, {})
                row.update({self.eval_map.get(k, f"eval/openrlhf/{k}"): v for k, v in numbers.items()})
                continue
            self._jsonl_steps.add(step)
            row = self._train.setdefault(step, {})
            row.update({TRAIN_KEYS.get(k, k): v for k, v in numbers.items()})
            _derive(row)

    def _read_stdout(self) -> None:
        for line in self.stdout.poll() if self.stdout else []:
            found = parse_step_line(line)
            if found is None:
                continue
            step, values = found
            self._jsonl_steps.add(step)
            row = self._train.setdefault(step, {})
            row.update({TRAIN_KEYS.get(k, k): v for k, v in values.items()})

    # ---- output --------------------------------------------------------------------

    def _emit(self, final: bool) -> list[dict[str, Any]]:
        latest = max([*self._train, *self._evals], default=0)
        out = []
        for step in sorted(set(self._train) | set(self._evals)):
            ready = final or step < latest or step in self._jsonl_steps
            if step in self._train and ready and ("step", step) not in self._emitted:
                out.append(declare_absent({"type": "step", "step": step, **finish_row(self._train[step])}))
                self._emitted.add(("step", step))
            if step in self._evals and (final or step < latest) and ("eval", step) not in self._emitted:
                out.append({"type": "eval", "step": step, **self._evals[step]})
                self._emitted.add(("eval", step))
        return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_step_line(line: str) -> tuple[int, dict[str, float]] | None:
    """(step, numeric values) of a 0.10.x ``✨ Global step N: {...}`` line, else None."""
    m = STEP_LINE.search(line)
    if not m:
        return None
    try:
        values = ast.literal_eval(m.group(2))
    except (ValueError, SyntaxError):
        return None
    if not isinstance(values, dict):
        return None
    return int(m.group(1)), {str(k): float(v) for k, v in values.items() if _is_number(v)}


def finish_row(row: dict[str, Any]) -> dict[str, Any]:
    """Keys derivable from 0.10.x's logged values: tokens per second of step wall time."""
    total, samples, length = (
        row.get("timing/step_total"),
        row.get("rollout/num_samples"),
        row.get("response_length_mean"),
    )
    if "tokens_per_s" not in row and total and samples and length is not None:
        return {**row, "tokens_per_s": samples * length / total}
    return row


class TextTail:
    """New complete lines of a growing text file (the trial's log)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0
        self._partial = b""

    def poll(self) -> list[str]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
            self.offset = fh.tell()
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        return [x.decode("utf-8", errors="replace") for x in lines]


def _derive(row: dict[str, Any]) -> None:
    """Fill autorl keys computable from the patch's raw fields."""
    lo, hi = row.get("log_ratio_min"), row.get("log_ratio_max")
    if lo is not None and hi is not None and "log_ratio_abs_max" not in row:
        row["log_ratio_abs_max"] = max(abs(lo), abs(hi))
    lo, hi = row.get("advantage_min"), row.get("advantage_max")
    if lo is not None and hi is not None and "advantage_abs_max" not in row:
        row["advantage_abs_max"] = max(abs(lo), abs(hi))
