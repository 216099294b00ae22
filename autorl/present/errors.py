"""The error rates a person reads beside the decisions: one line per verdict (``autorl show``, the end commit) and
the report's section on the study (its decisions, the false confirmations to expect at the noise it measured, the
A/A evidence of its own baseline repeats, and each verdict's test, assumed noise and calibrated rate)."""

from __future__ import annotations

from typing import Any

from autorl.judge.calibrate import describe, percent
from autorl.judge.evidence import Evidence, StudyErrors, study_errors
from autorl.ledger import Ledger, Study, Trial
from autorl.loading import parse
from autorl.recipe import Objective, VerdictSettings
from autorl.states import Confirmation, Verdict


class _Judged:
    """What the study's verdicts were judged with: its objective and verdict settings (from the study's recipe)."""

    def __init__(self, recipe: dict):
        self.objective = Objective.model_validate(recipe.get("objective") or {})
        self.verdict = VerdictSettings.model_validate(recipe.get("verdict") or {})


def collect(ledger: Ledger, study: Study) -> StudyErrors:
    """The study's error summary (``autorl.judge.evidence.study_errors``)."""
    recipe = parse(study.recipe or "", "the study's recipe") or {}
    return study_errors(Evidence(ledger.records(study.id)), _Judged(recipe))


def lines(row: Trial) -> list[str]:
    """A trial's error-rate lines: its verdict's, and its confirmation's once decided."""
    out = [f"error rate: {x}" for x in (describe(row),) if x]
    return out + [f"confirmation error rate: {x}" for x in (describe(row, "confirm_"),) if x]


def blocks(e: StudyErrors, trials: list[Trial]) -> list[tuple[str, Any, Any]]:
    """(kind, body, extra) blocks for the report: the study's decisions and error rates, the A/A, each verdict's."""
    d = e.decisions
    improved, regressed, flat = d[Verdict.IMPROVED], d[Verdict.REGRESSED], d[Verdict.FLAT]
    confirmed, rejected = d[Confirmation.CONFIRMED], d[Confirmation.REJECTED]
    made = (
        f"{improved + regressed + flat} verdicts ({improved} improved, {regressed} regressed, {flat} flat), "
        f"{confirmed + rejected} confirmations ({confirmed} confirmed, {rejected} rejected), "
        f"{d[Verdict.PRUNED]} stopped early."
    )
    out: list[tuple[str, Any, Any]] = [("h2", "Error rates", None), ("p", made, None)]
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
    rows = [[f"{t.number:02d}", t.verdict or "-", *_rate_cells(t)] for t in trials if t.test]
    if rows:
        out.append(
            (
                "table",
                ["NN", "verdict", "test", "run sd: trial / parent", "false-positive rate", "confirmation's rate"],
                rows,
            )
        )
    return out


def _rate_cells(t: Trial) -> list[str]:
    return [f"{t.test}", f"{_sd(t.trial_sd)} / {_sd(t.parent_sd)}", _rate(t.fp_rate), _rate(t.confirm_fp_rate)]


def _sd(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _rate(v: float | None) -> str:
    return "-" if v is None else percent(v)
