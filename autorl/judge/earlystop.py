"""Full-run early stop: stop when the held-out eval has dropped beyond its noise, with patience.

"OOD dropped at two consecutive evals" with no margin stops most flat runs (each eval is a
binomial draw, so a flat series falls twice in a row often) and most improving ones. Here each
eval is compared with the best eval so far: on the same items when per-item results exist (a
paired test: the discordant items set the noise, so two checkpoints that solve the same items
are not called different), else with the binomial noise of two proportions on n items. The run
stops when ``patience`` consecutive evals are each below the best by more than ``z`` standard
errors.

The checkpoint to keep (``keep_checkpoint``) is the last eval's, unless an earlier eval beats it
by the same margin. Taking the best of K noisy evals would pick a coin flip (a flat run's step-8
0.258 over its step-32 0.254) and report the maximum of K draws, biased upward, as the full run's
result.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from pydantic import BaseModel, ConfigDict, Field

OOD_KEY = "eval/ood/greedy_pass@1"
PATIENCE = 2
Z_DROP = 2.33  # one-sided 1% per comparison


class DropStop(BaseModel):
    """Why a full run is stopped early."""

    model_config = ConfigDict(extra="forbid")

    best_step: int | None = Field(description="Step of the best eval.")
    best: float = Field(description="Best value so far.")
    recent: list[float] = Field(description="The evals that dropped beyond noise, oldest first.")
    reason: str = Field(description="One line a person can read.")


def drop_se(best: dict, cur: dict, key: str, items_key: str | None) -> float:
    """Standard error of (current - best): paired over items if both have them, else binomial."""
    a, b = best.get(items_key) if items_key else None, cur.get(items_key) if items_key else None
    if a and b and len(a) == len(b) and len(a) > 1:
        d = [float(y) - float(x) for x, y in zip(a, b)]
        mean = sum(d) / len(d)
        return math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
    n = len(a) if a else len(b) if b else 0
    if n == 0:
        return 0.0
    p = (best[key] + cur[key]) / 2.0
    return math.sqrt(max(2.0 * p * (1.0 - p) / n, 1.0 / (n * n)))


def best_of(z: float, k: int) -> float:
    """The threshold for a comparison with the best of ``k`` earlier evals: the best was picked for being high,
    so each of the ``k`` it was picked from gets the one-sided rate that ``z`` gives one comparison (Bonferroni).
    With z = 2.33 against the best of 10 evals a flat eval fell below it 3-7% of the time, not 1%."""
    rate = 1.0 - NormalDist().cdf(z)
    return max(z, NormalDist().inv_cdf(1.0 - rate / max(k, 1)))


def drop_stop(
    evals: list[dict], key: str = OOD_KEY, patience: int = PATIENCE, z: float = Z_DROP, maximize: bool = True
) -> DropStop | None:
    """Stop when each of the last ``patience`` evals is worse than the best earlier eval beyond noise."""
    rows = [e for e in evals if isinstance(e.get(key), (int, float))]
    items_key = key.rsplit("/", 1)[0] + "/items" if key.startswith("eval/") else None
    sign = 1.0 if maximize else -1.0
    if len(rows) <= patience:
        return None
    head, tail = rows[:-patience], rows[-patience:]
    best = max(head, key=lambda e: sign * e[key])
    z = best_of(z, len(head))
    for cur in tail:
        se = drop_se(best, cur, key, items_key)
        if se <= 0 or sign * (best[key] - cur[key]) <= z * se:
            return None
    vals = [cur[key] for cur in tail]
    text = (
        f"{key} below its best {best[key]:.3f} (step {best.get('step')}) beyond {z:g} standard errors "
        f"on {patience} consecutive evals: " + " -> ".join(f"{v:.3f}" for v in vals)
    )
    return DropStop(best_step=best.get("step"), best=float(best[key]), recent=vals, reason=text)


class Kept(BaseModel):
    """The checkpoint a full run keeps, and why that one."""

    model_config = ConfigDict(extra="forbid")

    step: int | None = Field(description="Step of the kept eval.")
    value: float = Field(description="Its value of the objective.")
    why: str = Field(description="One line a person can read: why this eval and not another.")


def keep_checkpoint(evals: list[dict], key: str, maximize: bool = True, z: float = Z_DROP) -> Kept | None:
    """The eval whose checkpoint to keep: the last, unless the best earlier one beats it beyond ``z`` standard
    errors (paired over items when both have them, ``drop_se``; corrected for having picked the best of the
    earlier evals, ``best_of``). Without per-item results or an item count there is no noise to measure by, and
    the best eval is kept, as it always was. None without an eval of ``key``."""
    rows = [e for e in evals if isinstance(e.get(key), (int, float))]
    if not rows:
        return None
    last, sign = rows[-1], 1.0 if maximize else -1.0
    here = f"{float(last[key]):.3f} at step {last.get('step')}"
    if len(rows) == 1:
        return Kept(step=last.get("step"), value=float(last[key]), why=f"the only eval: {here}")
    best = max(rows[:-1], key=lambda e: sign * e[key])
    margin = sign * (best[key] - last[key])
    if margin <= 0:
        return Kept(step=last.get("step"), value=float(last[key]), why=f"the last eval, {here}, is the best")
    items_key = key.rsplit("/", 1)[0] + "/items" if key.startswith("eval/") else None
    se, limit = drop_se(best, last, key, items_key), best_of(z, len(rows) - 1)
    there = f"step {best.get('step')}'s {float(best[key]):.3f}"
    if se > 0 and margin <= limit * se:
        noise = f"{margin / se:.1f} standard errors, under {limit:.2f}"
        why = f"the last eval, {here}: {there} is within noise of it ({noise})"
        return Kept(step=last.get("step"), value=float(last[key]), why=why)
    why = (
        f"{there} beats the last eval ({here}) by {margin / se:.1f} standard errors, over {limit:.2f}"
        if se > 0
        else f"{there}, the best eval (no per-item results to tell it from noise; the last: {here})"
    )
    return Kept(step=best.get("step"), value=float(best[key]), why=why)
