"""The error rates a person reads beside the decisions: one line per verdict (``autorl show``, the end commit) and
the report's section on the study (its decisions, the false confirmations to expect at the noise it measured, the
A/A evidence of its own baseline repeats, and each verdict's test, assumed noise and calibrated rate)."""

from __future__ import annotations

from typing import Any

from autorl.judge.calibrate import describe, percent
from autorl.judge.evidence import Evidence, StudyErrors, study_errors
from autorl.loading import parse
from autorl.recipe import Objective, VerdictSettings


class _Judged:
    """What the study's verdicts were judged with: its objective and verdict settings (from the study's recipe)."""

    def __init__(self, recipe: dict):
        self.objective = Objective.model_validate(recipe.get("objective") or {})
        self.verdict = VerdictSettings.model_validate(recipe.get("verdict") or {})


def collect(ledger, study: dict) -> StudyErrors:
    """The study's error summary (``autorl.judge.evidence.study_errors``)."""
    recipe = parse(study.get("recipe") or "", "the study's recipe") or {}
    return study_errors(Evidence(ledger.records(study["id"])), _Judged(recipe))


def lines(row: dict) -> list[str]:
    """A trial's error-rate lines: its verdict's, and its confirmation's once decided."""
    out = [f"error rate: {x}" for x in (describe(row),) if x]
    return out + [f"confirmation error rate: {x}" for x in (describe(row, "confirm_"),) if x]


def blocks(e: StudyErrors, trials: list[dict]) -> list[tuple[str, Any, Any]]:
    """(kind, body, extra) blocks for the report: the study's decisions and error rates, the A/A, each verdict's."""
    d = e.decisions
    made = (
        f"{sum(d[k] for k in ('improved', 'regressed', 'flat'))} verdicts ({d['improved']} improved, "
        f"{d['regressed']} regressed, {d['flat']} flat), {d['confirmed'] + d['rejected']} confirmations "
        f"({d['confirmed']} confirmed, {d['rejected']} rejected), {d['pruned']} stopped early."
    )
    out = [("h2", "Error rates", None), ("p", made, None)]
    if e.false_confirm is not None:
        changed = (
            f"; the changed recipes' run sd {e.changed_sd:.3g} over {e.changed_df} df"
            if e.changed_sd is not None
            else "; no changed recipe measured yet"
        )
        out.append(
            (
                "p",
                f"At the noise measured in this study (the baseline's run sd {e.baseline_sd:.3g} over "
                f"{e.baseline_df} df{changed}), a trial with no effect ends a confirmed improvement with "
                f"probability {e.false_confirm:.2%}: {e.expected_false:.2f} false confirmations expected "
                f"among the trials judged.",
                None,
            )
        )
    if e.aa:
        rows = [
            [f"baseline run {i + 1}", v.verdict, f"{v.delta:+.4f} [{v.ci_low:+.3f}, {v.ci_high:+.3f}]"] for i, v in e.aa
        ]
        out += [
            (
                "note",
                "A/A: each baseline run judged against the others, as a trial is judged (none should be "
                "improved or regressed).",
                None,
            ),
            ("table", ["run", "verdict", "gain [CI]"], rows),
        ]
    rows = [[f"{t['number']:02d}", t.get("verdict") or "-", *_rate_cells(t)] for t in trials if t.get("test")]
    if rows:
        out.append(
            (
                "table",
                ["NN", "verdict", "test", "run sd: trial / parent", "false-positive rate", "confirmation's rate"],
                rows,
            )
        )
    return out


def _rate_cells(t: dict) -> list[str]:
    sd = lambda k: "-" if t.get(k) is None else f"{t[k]:.3g}"  # noqa: E731
    pct = lambda k: "-" if t.get(k) is None else percent(t[k])  # noqa: E731
    return [t["test"], f"{sd('trial_sd')} / {sd('parent_sd')}", pct("fp_rate"), pct("confirm_fp_rate")]
