"""What a study found, told plainly: the headline `autorl status` shows once a study has stopped (the same lines end
`autorl run` and open the report), `--json` with full precision, and a full run's weights and branch.

A real workspace (git refs, ledger) holding the study of tests/study_ledger.py; the real command in a child process.
"""

from __future__ import annotations

import json
import os

import pytest

from autorl.ledger import Ledger, Trial
from autorl.present import findings
from autorl.states import Confirmation, Kind, Proposer, StudyStatus, TrialStatus, Verdict
from tests.conftest import run_cli
from tests.study_ledger import add_full_run, add_second_study, git_workspace


@pytest.fixture
def ws(tmp_path):
    return git_workspace(tmp_path / "ws")


def _status(ws, *extra):
    r = run_cli("-C", str(ws), "status", *extra, env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_status_after_a_study_opens_with_what_was_found(ws):
    out = _status(ws)
    lines = out.splitlines()
    assert max(len(x) for x in lines) <= 80
    assert lines[1] == "Found: lr 5e-07 → 5e-05  (attempt-08-move)"
    text = " ".join(x.strip() for x in lines)
    assert "over the baseline's 0.538 (95% interval [+0.062, +0.147])" in text
    assert "2 fresh-seed runs against the 4 baseline runs, paired over 400 eval items" in text
    assert "reached in confirmed steps 05 → 08" in text
    assert "Also confirmed: 05 lr 5e-07 → 5e-06, +0.073 [+0.033, +0.113]" in text
    assert "h13-flat-learning: lr 0.0005 pruned; lr 0.000158 flat (its flat test could detect a gain of +0.056)" in text
    assert "eps_clip 0.1 regressed" in text
    assert "Crashes: 1 (cuda_oom ×1)" in text
    assert "Next: autorl promote re-runs 08 and the baseline with fresh seeds" in text
    assert "{" not in out and "None" not in out and "e-05, " not in out.replace("5e-05  (", "")


def test_status_json_keeps_full_precision(ws):
    d = json.loads(_status(ws, "--json"))
    best = d["findings"]["best"]
    assert best["number"] == 8 and best["chain"] == [5, 8]
    assert best["changes"] == [["lr", 5e-07, 5e-05]]
    assert abs(best["delta"] - 0.104375) < 1e-12  # not rounded
    # h13-flat-learning produced both confirmed gains: its trials that found nothing more are not "ruled out"
    assert [g["group"] for g in d["findings"]["ruled_out"]] == ["h02-clip-range"]
    assert [g["group"] for g in d["findings"]["no_further_gain"]] == ["h13-flat-learning"]
    assert d["findings"]["next"]["command"] == "autorl promote"


def test_a_running_study_has_no_headline_yet(ws):
    led = Ledger(ws / "ledger.sqlite")
    led.update_study(led.study().id, status=StudyStatus.RUNNING)
    led.close()
    assert "Found:" not in _status(ws)


def test_a_study_with_nothing_confirmed_says_so_and_what_to_do(ws):
    led = Ledger(ws / "ledger.sqlite")
    for n in (5, 8):
        led.set_confirmation(n, Confirmation.REJECTED, "fresh seeds disagreed")
    d = findings.findings(type("W", (), {"root": ws}), led)
    lines = findings.headline(d)
    assert lines[0].startswith("Found: no confirmed improvement over the baseline's 0.538 in 15 trials")
    assert "05 → 08" not in " ".join(lines)
    assert d["next"]["command"] == "autorl run --resume --budget 1h"
    assert [t["outcome"] for g in d["ruled_out"] for t in g["trials"]].count("not confirmed") == 2


def test_after_a_full_run_it_says_where_the_weights_are_and_what_to_adopt(ws):
    full = add_full_run(ws)
    text = " ".join(x.strip() for x in _status(ws).splitlines())
    assert "Re-validated by promote: +0.144 [+0.087, +0.201] over the baseline" in text
    assert f"Full run {full['name']} (from 08): complete, kept eval/id/greedy_pass@1 0.668 at step 250" in text
    assert "why that checkpoint: the last eval, 0.668 at step 250, is the best" in text
    assert f"weights: {full['weights']}" in text
    assert f"branch to adopt: {full['name']}" in text
    assert "no full-length baseline was run" in text
    # the recipe to go on from is the trial's, at trial length: the full run's branch would make every trial full length
    assert "Next: git checkout attempt-08-move -- recipes/default.yaml" in text
    assert f"Next: git checkout {full['name']}" not in text


def test_diagnose_defaults_to_the_best_confirmed_recipe_then_the_baseline(ws):
    r = run_cli("-C", str(ws), "diagnose")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("attempt-08-move (the study's best confirmed recipe; `autorl diagnose NN` for another")
    assert "{" not in r.stdout and "[" not in r.stdout
    led = Ledger(ws / "ledger.sqlite")
    for n in (5, 8):
        led.set_confirmation(n, Confirmation.REJECTED, "fresh seeds disagreed")
    led.close()
    r = run_cli("-C", str(ws), "diagnose", "--json")
    assert json.loads(r.stdout)["attempt"] == "attempt-01-baseline"
    assert json.loads(r.stdout)["which"] == "the study's baseline: nothing is confirmed yet"


def test_the_ledger_says_a_full_runs_delta_is_its_re_validation(ws):
    add_full_run(ws)
    r = run_cli("-C", str(ws), "ledger", "--last", "1", env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert "+0.1440 [+0.087, +0.201] (re-validation at trial length, vs the baseline)" in " ".join(r.stdout.split())


def test_promote_with_no_number_takes_the_headlines_recipe(ws):
    r = run_cli("-C", str(ws), "promote", "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("promoting attempt-08-move: attempt-08-move has the largest gain over the baseline")
    assert lines[1] == "full run values: steps=300, eval_every=25, save_best=eval/id/greedy_pass@1"
    assert lines[2].startswith("dry run: nothing was run; without --dry-run, attempt-08-move and the baseline")
    assert "{" not in r.stdout and "None" not in r.stdout
    d = json.loads(run_cli("-C", str(ws), "promote", "--dry-run", "--json").stdout)
    assert d["attempt"] == "attempt-08-move" and d["full_values"]["steps"] == 300


def test_a_flat_test_never_names_a_gain_beyond_what_the_metric_allows():
    """The soak's flat pass@1 trials read "could detect a gain of +2.550": a pass@1 over a parent at 0.508 gains
    at most +0.492. Such a test is told as one that could detect no gain; one that can see a possible gain keeps
    its number."""
    from autorl.recipe import validate_recipe

    recipe = validate_recipe({"backend": "command", "train": {"argv": ["true"], "lr": 1e-3}, "timeout_s": 60})
    wide = {"ci_low": -1.666, "ci_high": 1.901, "objective": 0.625, "delta": 0.117}
    rows = [
        Trial(
            number=n,
            kind=Kind.TRIAL,
            proposer=Proposer.OPTUNA,
            status=TrialStatus.COMPLETE,
            verdict=Verdict.FLAT,
            params={"lr": n * 1e-3},
            **wide,
        )
        for n in (3, 4)
    ]
    narrow = rows[0].replace(number=5, ci_low=-0.04, ci_high=0.06, params={"lr": 5e-3})
    d = {
        "best": None,
        "baseline": 0.508,
        "counts": {"trials": 5},
        "objective": {"metric": "eval/id/greedy_pass@1"},
        "crashes": {"count": 0},
        "full_runs": [],
        "next": {"command": "c", "why": "w"},
    }
    for trials, want in (
        (
            rows[:1],
            "(its flat test could detect no gain: eval/id/greedy_pass@1 allows at most +0.492 over the "
            "parent and its interval is wider than that)",
        ),
        (
            rows,
            "(its 2 flat tests could detect no gain eval/id/greedy_pass@1 allows over the parent (intervals "
            "wider than its range))",
        ),
        (
            rows + [narrow],
            "(its flat test could detect a gain of +0.071; 2 more could detect no gain "
            "eval/id/greedy_pass@1 allows over the parent (intervals wider than its range))",
        ),
    ):
        d["ruled_out"] = findings.ruled_out(trials, {}, {"lr": 1e-3}, recipe)
        text = " ".join(x.strip() for x in findings.headline(d, width=400))
        assert want in text and "+2.5" not in text, text
    json_row = d["ruled_out"][0]["trials"][0]
    assert (json_row["detectable"], json_row["blind"]) == (None, True)
    assert json_row["possible_gain"] == pytest.approx(0.492)


def test_a_newer_study_does_not_hide_what_an_earlier_one_found(ws):
    """Two studies in one workspace: status and promote take the latest, and --study reaches the other; a promote
    of a latest study with nothing confirmed names the study that has something."""
    first = add_second_study(ws)
    assert "Found: lr 5e-07 → 5e-05" not in _status(ws)
    assert _status(ws, "--study", first).splitlines()[1] == "Found: lr 5e-07 → 5e-05  (attempt-08-move)"
    refused = run_cli("-C", str(ws), "promote", "--dry-run")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "no confirmed improvement in study second" in refused.stderr
    assert f"study {first} has one: `autorl promote --study {first}`" in refused.stderr
    picked = run_cli("-C", str(ws), "promote", "--dry-run", "--study", first, "--json")
    assert picked.returncode == 0, picked.stderr
    assert json.loads(picked.stdout)["attempt"] == "attempt-08-move"
    unknown = run_cli("-C", str(ws), "status", "--study", "nope")
    assert unknown.returncode == 2 and "no study nope" in unknown.stderr


def test_promote_says_the_launch_once_and_leaves_the_revalidation_to_its_live_lines():
    """The re-validation's verdict and hack gate are printed as they come; the summary does not repeat them."""
    from autorl.present.findings import promoted_lines

    launched = {
        "attempt": "attempt-13-full",
        "promoted_from": 5,
        "monitor_pid": 42,
        "number": 13,
        "forced": False,
        "gate": "hack gate passed: task_id",
        "revalidation": {"verdict": "improved", "delta": 0.062, "level": 0.95, "ci_low": 0.006, "ci_high": 0.118},
    }
    lines = promoted_lines(launched)
    assert lines == [
        "full run attempt-13-full launched from 05 (monitor pid 42)",
        "follow it: autorl status, or autorl show 13",
    ]
    forced = promoted_lines(
        {**launched, "forced": True, "revalidation": {**launched["revalidation"], "verdict": "flat"}}
    )
    assert forced[0].endswith("; promoted anyway (--force, recorded in the ledger): re-validation flat")


def test_one_trial_is_not_one_trials():
    from autorl.present.findings import _found, counted

    assert [counted(n, "trial") for n in (0, 1, 2)] == ["0 trials", "1 trial", "2 trials"]
    d = {"best": None, "baseline": 0.5, "objective": {"metric": "m"}, "counts": {"trials": 1}}
    assert _found(d)[0] == "Found: no confirmed improvement over the baseline's 0.500 in 1 trial."


def test_next_after_a_baseline_that_never_completed_is_triage_not_a_longer_search():
    from autorl.present.findings import next_step

    d = {
        "best": None,
        "full_runs": [],
        "open_candidates": [],
        "baseline": None,
        "crashes": {"count": 2, "categories": {"config_error": 2}},
    }
    assert next_step(d)["command"] == "autorl triage" and "baseline never completed" in next_step(d)["why"]
    measured = {**d, "baseline": 0.47}
    assert next_step(measured)["command"] == "autorl run --resume --budget 1h"
    nothing_crashed = {**d, "crashes": {"count": 0, "categories": {}}}
    assert next_step(nothing_crashed)["command"] == "autorl run --resume --budget 1h"


def _with_candidate(objective: float, direction: str = "maximize") -> dict:
    best = {"number": 7, "objective": 0.342}
    candidate = {
        "number": 5,
        "attempt": "attempt-05-move",
        "changes": [["gens", 8, 32], ["lr", 1e-6, 1e-5]],
        "objective": objective,
        "delta": objective - 0.2465,
        "ci_low": objective - 0.3,
        "ci_high": objective - 0.2,
        "confirm_runs_done": 0,
        "confirm_runs": 3,
    }
    return {
        "best": best,
        "full_runs": [],
        "open_candidates": [5],
        "candidates": [candidate],
        "baseline": 0.2465,
        "objective": {"direction": direction},
        "crashes": {"count": 0, "categories": {}},
    }


def test_a_candidate_that_reads_above_the_confirmed_best_is_confirmed_before_a_promote():
    """Seen on the GPU: a study's budget ended with 07 confirmed (0.342) and 05 a candidate at 0.772 on its one
    run; promoting 07 then would leave the larger finding unchecked."""
    from autorl.present.findings import _candidate_lines, next_step

    ahead = next_step(_with_candidate(0.772))
    assert ahead["command"].startswith("autorl run --resume") and "candidate 05 read 0.772" in ahead["why"]
    assert next_step(_with_candidate(0.30))["command"] == "autorl promote"  # below the best: promote it
    assert next_step(_with_candidate(0.772, "minimize"))["command"] == "autorl promote"  # worse when lower wins
    (line,) = _candidate_lines(_with_candidate(0.772))
    assert line.startswith("Not yet confirmed: 05 gens 8 → 32, lr 1e-06 → 1e-05: +0.526 [+0.472, +0.572]")
    assert "0 of its 3 fresh-seed runs completed" in line
