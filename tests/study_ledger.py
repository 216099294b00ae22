"""A real ledger of a finished study, written the way the study loop writes it: the baseline's four seeds, a chain
of two confirmed improvements (lr 5e-7 -> 5e-6 -> 5e-5) with their fresh-seed runs, trials that were ruled out, a
pruned trial and a crash. Each run carries per-item eval results drawn from a fixed pool of items, so the paired
tests behind verdicts and gains run on them as they do on a real study.

The parent-relative columns are as the study loop wrote them in the study that exposed promote's wrong pick: the
first step has the higher lower bound over its parent (+0.035) than the second (+0.02), although the second is far
better over the baseline.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autorl.data import shipped
from autorl.ledger import Ledger
from autorl.states import Proposer, StudyStatus, TrialStatus

ITEMS = 400
BASELINE, FIRST, SECOND = 0.48, 0.55, 0.63  # the true pass@1 of each recipe
RECIPE = "recipes/default.yaml"


def items(rate: float, seed: int) -> list[float]:
    """One run's per-item results: item i is solved when its difficulty is below the recipe's rate plus a small
    run-level shift of this seed (the same items, in the same order, for every run)."""
    difficulty = np.random.default_rng(12345).random(ITEMS)
    rng = np.random.default_rng(seed)
    shift = rng.normal(0, 0.01)
    flips = rng.random(ITEMS) < 0.03
    solved = (difficulty < rate + shift) ^ flips
    return [float(x) for x in solved]


# number, proposer, hypothesis, changed, status, verdict, confirmation, confirms, parent, rate, delta, ci
ROWS = [
    (1, "baseline", None, {}, "complete", None, None, None, None, BASELINE, None, None),
    (2, "baseline", None, {"seed": 1}, "complete", None, None, None, None, BASELINE, None, None),
    (3, "baseline", None, {"seed": 2}, "complete", None, None, None, None, BASELINE, None, None),
    (4, "baseline", None, {"seed": 3}, "complete", None, None, None, None, BASELINE, None, None),
    (
        5,
        "move",
        "h13-flat-learning",
        {"lr": 5e-06},
        "complete",
        "improved",
        "confirmed",
        None,
        None,
        FIRST,
        0.07,
        (0.035, 0.105),
    ),
    (
        6,
        "confirm",
        "h13-flat-learning",
        {"lr": 5e-06, "seed": 1050},
        "complete",
        None,
        None,
        5,
        None,
        FIRST,
        None,
        None,
    ),
    (
        7,
        "confirm",
        "h13-flat-learning",
        {"lr": 5e-06, "seed": 1051},
        "complete",
        None,
        None,
        5,
        None,
        FIRST,
        None,
        None,
    ),
    (
        8,
        "move",
        "h13-flat-learning",
        {"lr": 5e-05},
        "complete",
        "improved",
        "confirmed",
        None,
        5,
        SECOND,
        0.071,
        (0.02, 0.122),
    ),
    (9, "confirm", "h13-flat-learning", {"lr": 5e-05, "seed": 1080}, "complete", None, None, 8, 5, SECOND, None, None),
    (10, "confirm", "h13-flat-learning", {"lr": 5e-05, "seed": 1081}, "complete", None, None, 8, 5, SECOND, None, None),
    (11, "move", "h13-flat-learning", {"lr": 0.0005}, "pruned", "pruned", None, None, 8, None, None, None),
    (
        12,
        "move",
        "h13-flat-learning",
        {"lr": 0.000158},
        "complete",
        "flat",
        None,
        None,
        8,
        SECOND - 0.005,
        -0.006,
        (-0.045, 0.033),
    ),
    (
        13,
        "hypothesis",
        "h02-clip-range",
        {"eps_clip": 0.3},
        "complete",
        "flat",
        None,
        None,
        8,
        SECOND,
        0.001,
        (-0.04, 0.042),
    ),
    (
        14,
        "hypothesis",
        "h02-clip-range",
        {"eps_clip": 0.1},
        "complete",
        "regressed",
        None,
        None,
        8,
        SECOND - 0.08,
        -0.08,
        (-0.12, -0.04),
    ),
    (15, "hypothesis", "h05-reward-signal", {"gens": 16}, "crash", "crash", None, None, 8, None, None, None),
]


def write_study(root: Path, name: str = "addition-default-1") -> Path:
    """The study's ledger at ``root/ledger.sqlite`` (the recipe text is the shipped default's)."""
    led = Ledger(root / "ledger.sqlite")
    text = shipped("recipes", "default.yaml").read_text()
    sid = led.create_study(
        name=name,
        recipe_path=RECIPE,
        recipe=text,
        base_sha="0" * 40,
        strategy="hypotheses",
        budget_s=300.0,
        optuna_study=name,
    )
    params: dict[int, dict] = {}
    for row in ROWS:
        number, changed, parent = row[0], row[3], row[8]
        params[number] = {**(params[parent] if parent else {"lr": 5e-07, "eps_clip": 0.2, "gens": 8}), **changed}
        _add(led, sid, *row, params=params[number])
    led.update_study(sid, status="stopped")
    led.close()
    return root / "ledger.sqlite"


def _add(
    led, sid, number, proposer, hypothesis, changed, status, verdict, state, confirms, parent, rate, delta, ci, params
) -> None:
    crashed = status == "crash"
    tid = led.add_trial(
        study_id=sid,
        number=number,
        attempt=f"attempt-{number:02d}-{proposer}",
        branch=f"attempt-{number:02d}-{proposer}",
        start_tag=f"attempt-{number:02d}-start",
        end_tag=f"attempt-{number:02d}-end",
        proposer=proposer,
        hypothesis=hypothesis,
        why=f"{proposer} {changed}",
        changed=changed,
        params=params,
        status=status,
        verdict=verdict,
        confirmation=state,
        confirms=confirms,
        parent=parent,
        duration_s=6.0,
        crash_category="cuda_oom" if crashed else None,
        crash_signature="cuda_oom-1" if crashed else None,
        root_cause="torch.OutOfMemoryError: CUDA out of memory" if crashed else None,
        objective=None if rate is None else float(np.mean(items(rate, number))),
        delta=delta,
        ci_low=ci[0] if ci else None,
        ci_high=ci[1] if ci else None,
        method="paired_items" if ci else None,
    )
    if rate is not None:
        result = items(rate, number)
        led.add_metrics(
            tid,
            [{"type": "eval", "step": 40, "eval/id/greedy_pass@1": float(np.mean(result)), "eval/id/items": result}],
        )


def git_workspace(root: Path) -> Path:
    """``root`` as a real workspace whose git repository holds every trial's branch and tags (one commit each, at
    ``recipes/default.yaml``), and the study's ledger."""
    from tests.conftest import git, run_cli

    assert run_cli("init", str(root)).returncode == 0
    write_study(root)
    for number, proposer, *_ in ROWS:
        name = f"attempt-{number:02d}-{proposer}"
        git(root, "branch", name)
        git(root, "tag", f"attempt-{number:02d}-start", name)
        git(root, "tag", f"attempt-{number:02d}-end", name)
    return root


def add_full_run(root: Path, number: int = 16, promoted_from: int = 8, objective: float = 0.668) -> dict:
    """A finished full run promoted from ``promoted_from``: its branch and tags, its results file committed at the
    end tag (with the weights it kept), and its ledger row holding the re-validation."""
    from tests.conftest import git

    name = f"attempt-{number:02d}-full-move"
    weights = str(root / ".autorl" / "runs" / name / "best.pt")
    git(root, "checkout", "-q", "-b", name)
    (root / "results").mkdir(exist_ok=True)
    (root / "results" / f"{name}.json").write_text(
        f'{{"status": "complete", "best_checkpoint": {{"step": 250, "value": {objective}, '
        f'"metric": "eval/id/greedy_pass@1", "weights": "{weights}", '
        f'"why": "the last eval, {objective:.3f} at step 250, is the best"}}}}'
    )
    git(root, "add", "-A")
    git(root, "commit", "-qm", "full run results")
    git(root, "tag", f"attempt-{number:02d}-start", "HEAD~1")
    git(root, "tag", f"attempt-{number:02d}-end", "HEAD")
    git(root, "checkout", "-q", "-")
    led = Ledger(root / "ledger.sqlite")
    led.add_trial(
        study_id=led.study().id,
        number=number,
        attempt=name,
        branch=name,
        kind="full",
        start_tag=f"attempt-{number:02d}-start",
        end_tag=f"attempt-{number:02d}-end",
        proposer="promote",
        status="complete",
        objective=objective,
        promoted_from=promoted_from,
        delta=0.144,
        ci_low=0.087,
        ci_high=0.201,
        method="paired_items",
    )
    led.close()
    return {"name": name, "weights": weights}


def add_second_study(root: Path) -> str:
    """A second, later study in the ledger at ``root`` (one baseline run, stopped); the first study's name."""
    led = Ledger(root / "ledger.sqlite")
    first = led.study().name
    sid = led.create_study(
        name="second",
        recipe_path="recipes/default.yaml",
        recipe=shipped("recipes", "default.yaml").read_text(),
        base_sha="x",
        strategy="random",
        budget_s=60.0,
        optuna_study="second",
    )
    led.add_trial(
        study_id=sid,
        number=20,
        attempt="attempt-20-baseline",
        proposer=Proposer.BASELINE,
        status=TrialStatus.COMPLETE,
        objective=0.5,
    )
    led.update_study(sid, status=StudyStatus.STOPPED)
    led.close()
    return first
