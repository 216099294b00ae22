"""Durations: ``90m``, ``24h``, ``1h30m``, ``2d``, ``45s``. A number needs its unit: ``--budget 10`` once meant ten
seconds without a word, where a person meant minutes or hours."""

from __future__ import annotations

import math
import re

from autorl.errors import BudgetError, short, short_repr

MAX_S = 366 * 86400.0  # a budget longer than a year is a typo

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")


def parse_duration(text: str) -> float:
    """Seconds in a duration string; BudgetError naming the bad input otherwise."""
    s = str(text).strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", s):
        if float(s) > MAX_S:  # in any unit: 5,000 digits are not echoed back three times
            raise BudgetError(f"budget {short_repr(text)} is longer than a year: write e.g. 24h or 7d")
        n = short(s, 24)
        raise BudgetError(
            f"budget {short_repr(text)} has no unit: write {n}m for minutes, {n}h for hours or {n}s for seconds"
        )
    if s and _PART.sub("", s) == "" and len({u for _, u in _PART.findall(s)}) == len(_PART.findall(s)):
        value = sum(float(n) * _UNITS[u] for n, u in _PART.findall(s))
    else:
        raise BudgetError(f"budget {short_repr(text)} is not a duration: write e.g. 90m, 24h, 1h30m, 2d or 45s")
    if value <= 0:
        raise BudgetError(f"budget {short_repr(text)} must be positive")
    if not math.isfinite(value) or value > MAX_S:
        raise BudgetError(f"budget {short_repr(text)} is longer than a year: write e.g. 24h or 7d")
    return value


def format_duration(seconds: float) -> str:
    """Compact human form: 1h02m, 3m05s, 12s."""
    s = int(round(max(seconds, 0)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{sec}s"
