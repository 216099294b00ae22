"""The morning after says nothing that is not so (issue 46, "The morning after misleads in small ways").

A real workspace (git refs, ledger) holding the study of tests/study_ledger.py, real Optuna studies in the same file,
real verdicts; the real command in a child process at 80 columns.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from autorl.judge import verdict
from autorl.ledger import Ledger
from autorl.present import findings
from autorl.present.report import importances
from autorl.present.review import noise_words
from autorl.recipe import VerdictSettings
from autorl.states import Confirmation, Kind, Proposer, StudyStatus, TrialStatus, Verdict
from tests.conftest import run_cli
from tests.study_ledger import add_second_study, items

COLUMNS_80 = {**os.environ, "COLUMNS": "80"}


@pytest.fixture
def ws(tmp_path):
    from tests.study_ledger import git_workspace

    return git_workspace(tmp_path / "ws")


def _cli(ws, *args):
    r = run_cli("-C", str(ws), *args, env=COLUMNS_80)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _joined(text: str) -> str:
    return " ".join(x.strip() for x in text.splitlines())


# ---- "Ruled out" lists only what confirmed nothing ------------------------------------------------------------
def test_ruled_out_never_names_the_hypothesis_that_produced_the_gains(ws):
    """h13-flat-learning produced both confirmed gains (05, 08); its two later trials that found nothing more are
    told apart, never under "Ruled out"."""
    out = _cli(ws, "status")
    lines = out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("Ruled out"))
    end = next(i for i, x in enumerate(lines) if i > start and not x.startswith(" "))
    ruled = "\n".join(lines[start:end])
    assert "h13-flat-learning" not in ruled and "h02-clip-range: eps_clip 0.3 flat; eps_clip 0.1 regressed" in ruled
    assert lines[start].startswith("Ruled out (2 trials with no gain")
    assert lines[end].startswith("No further gain (2 more trials of what confirmed a gain above, so not ruled")
    assert "h13-flat-learning: lr 0.0005 pruned; lr 0.000158 flat" in _joined("\n".join(lines[end:]))
    d = json.loads(_cli(ws, "status", "--json"))["findings"]
    assert [g["group"] for g in d["ruled_out"]] == ["h02-clip-range"]
    assert [g["group"] for g in d["no_further_gain"]] == ["h13-flat-learning"]


# ---- one gain, and which interval each place shows ----------------------------------------------------------------
def _noisy_candidate(path, number: int = 16) -> None:
    """A candidate of another hypothesis with two fresh-seed runs far apart: a replicate group that shows the study
    more run noise than it had measured."""
    led = Ledger(path)
    sid = led.study().id
    params = {"lr": 5e-05, "eps_clip": 0.25, "gens": 8}
    for n, rate, confirms in ((number, 0.66, None), (number + 1, 0.56, number), (number + 2, 0.70, number)):
        tid = led.add_trial(
            study_id=sid,
            number=n,
            attempt=f"attempt-{n:02d}-h02",
            proposer=Proposer.HYPOTHESIS if confirms is None else Proposer.CONFIRM,
            hypothesis="h02-clip-range",
            changed={"eps_clip": 0.25},
            params=params,
            status=TrialStatus.COMPLETE,
            verdict=Verdict.IMPROVED if confirms is None else None,
            confirmation=Confirmation.REJECTED if confirms is None else None,
            confirms=confirms,
            parent=8,
            kind=Kind.TRIAL,
            objective=float(np.mean(items(rate, n))),
        )
        led.add_metrics(
            tid,
            [
                {
                    "type": "eval",
                    "step": 40,
                    "eval/id/greedy_pass@1": float(np.mean(items(rate, n))),
                    "eval/id/items": items(rate, n),
                }
            ],
        )
    led.close()


def test_a_gains_interval_says_which_it_is_and_why_it_moves(ws):
    """The same gain read mid-run and at the end had two intervals, and the run's log a third at 97.5%: each
    place now says which interval it shows (level, what was measured, the run noise behind it), so the numbers
    explain each other."""
    path = ws / "ledger.sqlite"
    led = Ledger(path)
    before = findings.findings(type("W", (), {"root": ws}), led)
    led.close()
    _noisy_candidate(path)
    led = Ledger(path)
    after = findings.findings(type("W", (), {"root": ws}), led)
    first, then = before["best"], after["best"]
    assert first["delta"] == pytest.approx(then["delta"])  # the same runs, the same gain
    assert (
        then["noise_df"] > first["noise_df"] and then["ci_high"] - then["ci_low"] != first["ci_high"] - first["ci_low"]
    )
    for d in (before, after):
        text = " ".join(x.strip() for x in findings.headline(d, 80))
        best = d["best"]
        assert f"at the run noise measured so far (sd {best['trial_sd']:.2g} over {best['noise_df']} df)" in text
        assert (
            "These are 95% intervals over the baseline at the run noise measured so far, so they move as more is "
            "measured; the run's log shows each confirmation's own test, 97.5% against its parent" in text
        )
    led.close()
    gain = next(r["baseline_gain"] for r in json.loads(_cli(ws, "ledger", "--json")) if r["number"] == 8)
    assert gain["level"] == 0.95
    table = _cli(ws, "ledger")
    assert (
        f"Δ vs baseline {gain['delta']:+.4f} [{gain['ci_low']:+.3f}, {gain['ci_high']:+.3f}] (95%, its fresh-seed runs)"
        in _joined(table)
    )


# ---- a standard deviation is never negative --------------------------------------------------------------------
def _negative_raw_estimate() -> str:
    """A real verdict whose parent's replicates vary less than item sampling explains: four runs with the same
    mean, each flipping different items. Its note gives the parent's raw replicate estimate, a variance, below 0."""
    base = np.array([float(i % 2) for i in range(400)])

    def run(k: int) -> list[float]:
        x = base.copy()
        x[2 * k : 2 * k + 6] = 1 - x[2 * k : 2 * k + 6]
        return [float(v) for v in x]

    parent = [run(5 * k) for k in range(4)]
    trial = [[*([1.0] * 40), *base[40:]]]
    v = verdict.judge(
        verdict.Runs(values=[float(np.mean(x)) for x in trial], items=trial),
        verdict.Runs(values=[float(np.mean(x)) for x in parent], items=parent),
        VerdictSettings(),
        "maximize",
    )
    assert re.search(r"raw replicate estimate -\d", v.explanation), v.explanation  # the case as the verdict writes it
    return v.explanation


def test_show_never_prints_a_negative_number_under_an_sds_name(ws):
    reason = _negative_raw_estimate()
    led = Ledger(ws / "ledger.sqlite")
    led.update_trial(led.trial(12).id, reason=reason)
    led.close()
    out = _joined(_cli(ws, "show", "12"))
    assert "raw replicate estimate" not in out
    noise = out[out.index("run-level sd:") : out.index("; prior")]
    negatives = re.findall(r"(\S+) -\d", noise)
    assert negatives == ["variance"], noise  # the one negative number there is named what it is
    assert re.search(r"raw replicate variance -\d\.\de-05 over 3 df, below zero: the runs varied no more than", out)
    assert noise_words("parent 0.0107 (raw replicate estimate +1.9e-05 over 3 df)") == (
        "parent 0.0107 (raw replicate sd 0.00436 over 3 df)"
    )


# ---- the Optuna study's count is true ---------------------------------------------------------------------------
def test_the_optuna_count_names_where_the_trials_went(tmp_path):
    """Under the hypotheses strategy each trial is told to its hypothesis's Optuna study (``<study>/<id>/<digest>``);
    the study's own holds the first baseline. "The Optuna study has 1 complete trial(s)" after a hundred trials
    was true of that one study only."""
    import optuna

    storage = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    for name, n in (("s", 1), ("s/h13-flat-learning/0a1b2c3d", 12), ("s/h02-clip-range/4e5f6a7b", 3), ("s2", 9)):
        st = optuna.create_study(study_name=name, storage=storage, direction="maximize")
        st.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=n)
    values, note = importances(Ledger(tmp_path / "ledger.sqlite"), "s")
    assert values == {}
    assert note.startswith(
        "the Optuna study s has 1 complete trial; the other 15 complete trials of this study went to 2 Optuna "
        "studies of one hypothesis and incumbent each (s/<hypothesis>/<digest>)"
    ), note
    assert "trial(s)" not in note


# ---- `autorl ledger` shows the latest study, as the README says ---------------------------------------------------
def _second_study(ws) -> str:
    return add_second_study(ws)


def test_the_ledger_lists_the_latest_study_and_says_so(ws):
    first = _second_study(ws)
    out = _cli(ws, "ledger")
    assert _joined(out).startswith(
        "1 trial of study second (the latest of 2 studies in this ledger; --study NAME shows another) 20  complete"
    )
    assert "20  complete" in out and "\n01 " not in out
    assert [r["number"] for r in json.loads(_cli(ws, "ledger", "--json"))] == [20]
    other = _cli(ws, "ledger", "--study", first)
    assert _joined(other).startswith(f"15 trials of study {first} (one of 2 studies in this ledger; --study NAME")
    assert [r["number"] for r in json.loads(_cli(ws, "ledger", "--study", first, "--json"))] == list(range(1, 16))
    alone = run_cli("-C", str(ws), "ledger", "--study", "nope")
    assert alone.returncode == 2 and len(alone.stderr.strip().splitlines()) == 1 and "no study nope" in alone.stderr


def test_a_ledger_with_one_study_names_it_and_nothing_more(ws):
    assert _cli(ws, "ledger").splitlines()[0].rstrip() == "15 trials of study addition-default-1"


# ---- status mid-run fits 80 columns -----------------------------------------------------------------------------
def test_status_mid_run_shows_the_objective_not_every_metric_on_one_line(ws):
    led = Ledger(ws / "ledger.sqlite")
    led.update_study(led.study().id, status=StudyStatus.RUNNING)
    tid = led.add_trial(
        study_id=led.study().id,
        number=16,
        attempt="attempt-16-h05-reward-signal-gens-16-temperature-1-05",
        proposer=Proposer.HYPOTHESIS,
        status=TrialStatus.RUNNING,
        pid=os.getpid(),
        kind=Kind.TRIAL,
    )
    evals = {
        f"eval/{split}/{m}": 0.1 * i
        for i, (split, m) in enumerate(
            (s, m)
            for s in ("id", "ood")
            for m in ("sample_pass@4", "greedy_pass@1", "mean_len", "truncated", "format", "reward")
        )
    }
    led.add_metrics(tid, [{"type": "step", "step": 30, "reward_mean": 0.4}, {"type": "eval", "step": 30, **evals}])
    led.close()
    out = _cli(ws, "status")
    assert max(len(x) for x in out.splitlines()) <= 80, out
    running = _joined(out[out.index("running attempt-16") :])
    assert "step 30 eval/id/greedy_pass@1=0.100 (+11 more: autorl show 16)" in running, running
    assert "eval/ood/" not in running
    assert json.loads(_cli(ws, "status", "--json"))["running"][0]["last_eval"] == {"type": "eval", "step": 30, **evals}
