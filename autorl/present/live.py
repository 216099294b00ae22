"""What the user sees while a study runs: a rich live panel, or plain lines.

Plain lines when stdout is not a TTY or with ``--quiet`` (then only verdicts).
"""

from __future__ import annotations

import sys
import time
from collections import deque

from rich.console import Console
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from autorl.budget import format_duration
from autorl.ledger import Trial
from autorl.states import Confirmation, Verdict


class PlainView:
    """One line per event; progress lines at most every few seconds."""

    def __init__(self, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.stream = stream or sys.stdout
        self._last = 0.0

    def line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def study(self, text: str) -> None:
        self.line(text)

    def trial_start(self, attempt: str, why: str) -> None:
        if not self.quiet:
            self.line(f"> {attempt}: {why}")

    def progress(
        self, attempt: str, step: int, total: int, reward: float | None, evalv: float | None, used: float, left: float
    ) -> None:
        if self.quiet or time.time() - self._last < 5:
            return
        self._last = time.time()
        self.line(
            f"  {attempt} step {step}/{total} reward {_f(reward)} eval {_f(evalv)} "
            f"(budget used {format_duration(used)}, left {format_duration(left)})"
        )

    def verdict(self, row: Trial) -> None:
        self.line(verdict_line(row))

    def close(self) -> None:
        pass


class LiveView(PlainView):
    """A rich Live panel: budget, the running trial, the last verdicts."""

    def __init__(self) -> None:
        super().__init__()
        self.console = Console()
        self.recent: deque[str] = deque(maxlen=6)
        self.current = ""
        self.header = ""
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def _render(self) -> Panel:
        body = Text(self.header + "\n" + self.current + "\n\n" + "\n".join(self.recent))
        return Panel(body, title="autorl run", border_style="cyan")

    def line(self, text: str) -> None:
        self.recent.append(text)
        self.live.update(self._render())

    def study(self, text: str) -> None:
        self.header = text
        self.live.update(self._render())

    def trial_start(self, attempt: str, why: str) -> None:
        self.current = f"{attempt}: {why}"
        self.live.update(self._render())

    def progress(self, attempt, step, total, reward, evalv, used, left) -> None:
        self.current = (
            f"{attempt}  step {step}/{total}  reward {_f(reward)}  eval {_f(evalv)}\n"
            f"budget used {format_duration(used)}, left {format_duration(left)}"
        )
        self.live.update(self._render())

    def close(self) -> None:
        self.live.stop()


def make_view(quiet: bool) -> PlainView:
    if not quiet and sys.stdout.isatty():
        return LiveView()
    return PlainView(quiet=quiet)


JUDGED = (Verdict.IMPROVED, Verdict.FLAT, Verdict.REGRESSED)


def verdict_line(row: Trial) -> str:
    """One line per finished trial: attempt, verdict, objective, the gain over its parent with the interval; the
    reason only where there is no verdict to read it from (a crash, a prune, a stop): the verdict's statistics are
    in `autorl show NN`."""
    verdict = f"{row.verdict or row.status}"
    if row.verdict == Verdict.IMPROVED and row.confirmation == Confirmation.CANDIDATE:
        verdict = "improved (candidate: fresh-seed runs decide)"
    parts = [f"{row.attempt}", verdict]
    if row.objective is not None:
        parts.append(f"objective {row.objective:.4f}")
    if row.delta is not None:
        ci = f" [{row.ci_low:+.3f}, {row.ci_high:+.3f}]" if row.ci_low is not None and row.ci_high is not None else ""
        whom = f"{row.parent:02d}" if row.parent is not None else "the baseline"
        parts.append(f"Δ {row.delta:+.4f}{ci} vs {whom}")
    if row.reason and (row.verdict not in JUDGED or row.delta is None):
        parts.append(f"- {row.reason}")
    return "  ".join(parts)


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"
