"""`autorl report`: a real study's page, opened in headless Chromium.

The module builds one small real study (embedded engine, a few tiny trials),
writes its report once, then checks the page as a browser sees it: every image
loaded (the page's own script marks each ``<img>``), every link target exists,
and the screenshot is not blank. Chromium is Debian's ``chromium`` package; the
tests fail, not skip, without it.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from autorl.ledger import Ledger, Study, Trial
from autorl.present.report import (
    IMG_CHECK,
    MARKER,
    MARKER_TEXT,
    VERDICT_ORDER,
    importances,
    pooled_importances,
    rank_best,
    report,
)
from autorl.recipe import SearchParam
from autorl.states import Confirmation, Kind, Proposer, TrialStatus, Verdict
from autorl.workspace import Workspace
from tests.conftest import run_cli

TINY = [
    "--set",
    "steps=6",
    "--set",
    "eval_every=3",
    "--set",
    "batch_prompts=16",
    "--set",
    "verdict.baseline_repeats=1",
    "--set",
    "timeout_s=600",
    "--set",
    "abort.silence_s=600",
    "--allow-overrun",
]


# ---- fixtures ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def study_ws(tmp_path_factory, engine_cache) -> Path:
    """A workspace with one finished study of four tiny real trials."""
    ws = tmp_path_factory.mktemp("report") / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    (ws / ".autorl").mkdir(exist_ok=True)
    os.symlink(engine_cache, ws / ".autorl" / "cache")
    r = run_cli(
        "-C",
        str(ws),
        "run",
        "--budget",
        "25m",
        "--max-trials",
        "4",
        "--strategy",
        "optuna",
        "--quiet",
        *TINY,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return ws


@pytest.fixture(scope="module")
def built(study_ws, tmp_path_factory) -> Path:
    """The report of that study, written once: its index.html."""
    ws = Workspace.open(study_ws)
    return report(ws, Ledger(ws.ledger_path), tmp_path_factory.mktemp("out") / "report")


# ---- the page in a browser ----------------------------------------------------------------
@pytest.mark.slow
def test_every_image_loads_in_chromium(built):
    dom = _chromium("--dump-dom", built.as_uri())
    n_img = len(re.findall(r"<img\b", built.read_text()))
    assert n_img >= 2
    assert f'data-images="{n_img}/{n_img}"' in dom, re.search(r"<body[^>]*>", dom)


@pytest.mark.slow
def test_screenshot_is_readable_not_blank(built, tmp_path):
    from PIL import Image

    shot = tmp_path / "report.png"
    _chromium(f"--screenshot={shot}", "--window-size=1280,2400", "--hide-scrollbars", built.as_uri())
    img = Image.open(shot).convert("L")
    assert img.size == (1280, 2400)
    assert img.getextrema()[0] < 100, "no dark pixels: the page rendered blank"
    assert len(img.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 50


def test_image_check_catches_a_missing_image(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text(f"<html><body><img src='plots/missing.png'>{IMG_CHECK}</body></html>")
    assert 'data-images="0/1"' in _chromium("--dump-dom", page.as_uri())


# ---- links and files ------------------------------------------------------------------------
@pytest.mark.slow
def test_every_link_and_image_target_exists(built):
    out = built.parent
    html_targets = _Targets.of(built.read_text())
    md_targets = re.findall(r"\]\(([^)]+)\)", (out / "report.md").read_text())
    assert any(t.startswith("logs/") for t in html_targets) and md_targets
    for target in html_targets + md_targets:
        assert _resolve(out, target).is_file(), target
    for png in (out / "plots").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_log_copies_are_the_real_tails(built, study_ws):
    ledger = Ledger(study_ws / "ledger.sqlite")
    for t in ledger.trials():
        copy = built.parent / "logs" / f"{t.attempt}.log"
        original = Path(t.log_path).read_text(errors="replace").splitlines()
        if original:
            assert copy.read_text().splitlines()[-1] == original[-1]


@pytest.mark.slow
def test_page_matches_the_ledger(built, study_ws):
    ws = Workspace.open(study_ws)
    ledger = Ledger(ws.ledger_path)
    trials = ledger.trials(ledger.study().id)
    text = (built.parent / "report.md").read_text()
    page = built.read_text()
    assert f"{len(trials)} trials: " in text
    assert text.index("## What was found") < text.index("## Summary") < text.index("## Best trials")
    assert "- Found: " in text and "- Next: " in text
    for t in trials:
        assert t.attempt in text
        if t.start_sha:  # one ref per row; its tags and commits on hover
            assert f"{t.start_tag} @ {t.start_sha[:10]}" not in text
            assert f"{t.start_tag} @ {t.start_sha[:10]}" in page
    assert ("![Parameter importances]" in text) != ("Parameter importances: not plotted" in text)
    if importances(ledger, ledger.study().optuna_study)[0]:
        assert "![Parameter importances]" in text


@pytest.mark.slow
def test_cli_writes_the_default_folder(study_ws):
    r = run_cli("-C", str(study_ws), "report")
    assert r.returncode == 0, r.stderr
    assert (study_ws / ".autorl" / "report" / "index.html").is_file()
    assert (study_ws / ".autorl" / "report" / "report.md").is_file()


def test_a_report_into_a_folder_it_wrote_before_replaces_only_its_own_entries(study_ws, tmp_path):
    """``--out`` may name a folder an earlier report was written into (its marker says so) and where the user has
    since put files of their own: a report replaces its entries (plots/, logs/, report.md, index.html, the marker)
    and touches nothing else, and leaves no staging folder behind. A folder of the user's own, with no marker, is
    refused (tests/test_hostile_outputs.py)."""
    out = tmp_path / "mine"
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "stale.png").write_bytes(b"old plot")
    (out / "notes.txt").write_text("the user's own")
    (out / "index.html").write_text("an old page")
    (out / MARKER).write_text(MARKER_TEXT)
    ws = Workspace.open(study_ws)
    index = report(ws, Ledger(ws.ledger_path), out)
    assert index == out / "index.html" and "autorl report" in index.read_text()
    assert (out / "notes.txt").read_text() == "the user's own"
    assert not (out / "plots" / "stale.png").exists()  # the report's own folder is the new one, whole
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "index.html", "logs", "notes.txt", "plots", "report.md"]


def test_cli_outside_a_workspace_is_one_line(tmp_path):
    r = run_cli("-C", str(tmp_path), "report")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# ---- ranking and importances (no engine needed) -----------------------------------------------
def _row(number: int, verdict: Verdict | None, objective: float | None, proposer: Proposer = Proposer.OPTUNA) -> Trial:
    return Trial(number=number, verdict=verdict, objective=objective, proposer=proposer)


def test_best_is_verdict_first_then_objective():
    trials = [
        _row(1, None, 0.9, Proposer.BASELINE),
        _row(2, Verdict.FLAT, 0.8),
        _row(3, Verdict.IMPROVED, 0.6),
        _row(4, Verdict.IMPROVED, 0.7),
        _row(5, Verdict.REGRESSED, 0.95),
        _row(6, Verdict.CRASH, None),
        _row(7, Verdict.PRUNED, 0.99),
    ]
    best = rank_best(trials, "maximize")
    assert [t.number for t in best] == [4, 3, 2, 5]
    assert [t.number for t in rank_best(trials, "minimize")] == [3, 4, 2, 5]


def test_confirmed_recipes_come_first_in_their_rank_over_the_baseline():
    trials = [
        _row(2, Verdict.FLAT, 0.9),
        _row(5, Verdict.IMPROVED, 0.6),
        _row(8, Verdict.IMPROVED, 0.62),
        _row(9, Verdict.IMPROVED, 0.7),
    ]
    assert [t.number for t in rank_best(trials, "maximize", confirmed=[8, 5])] == [8, 5, 9, 2]


def test_summary_says_what_became_of_the_trials_in_words():
    from autorl.present.report import summary_sentence

    improved = {"verdict": Verdict.IMPROVED, "status": TrialStatus.COMPLETE}
    trials = [
        Trial(kind=Kind.TRIAL, proposer=Proposer.BASELINE, verdict=None, status=TrialStatus.COMPLETE),
        Trial(kind=Kind.TRIAL, proposer=Proposer.MOVE, confirmation=Confirmation.CONFIRMED, **improved),
        Trial(kind=Kind.TRIAL, proposer=Proposer.CONFIRM, confirms=2, status=TrialStatus.COMPLETE),
        Trial(kind=Kind.TRIAL, proposer=Proposer.MOVE, confirmation=Confirmation.REJECTED, **improved),
        Trial(kind=Kind.TRIAL, proposer=Proposer.MOVE, verdict=Verdict.PRUNED, status=TrialStatus.PRUNED),
        Trial(kind=Kind.TRIAL, proposer=Proposer.MOVE, verdict=None, status=TrialStatus.BUDGET_CUT),
    ]
    assert summary_sentence(trials) == (
        "6 trials: 1 baseline runs, 1 confirmation runs, and 4 of the search: 1 confirmed improvement(s), "
        "1 candidate(s) that fresh seeds did not confirm, 1 stopped early (pruned), 1 unfinished."
    )


def test_importances_weigh_only_values_that_enough_trials_changed():
    from autorl.present.report import IMPORTANCE_MIN_VARIED, varied_counts, weighed

    space = {"lr": SearchParam(low=1e-7, high=1e-2, log=True), "eps_clip": SearchParam(low=0.05, high=0.4)}
    base = {"lr": 5e-7, "eps_clip": 0.2}
    trials = [
        Trial(
            params={"lr": 10 ** (-6 + i / 4), "eps_clip": 0.3 if i < 2 else 0.2}, objective=0.5, proposer=Proposer.MOVE
        )
        for i in range(8)
    ]
    trials += [
        Trial(params=base, objective=0.5, proposer=Proposer.BASELINE),
        Trial(params={"lr": 1e-4, "eps_clip": 0.3}, objective=0.5, proposer=Proposer.CONFIRM, confirms=3),
    ]
    varied = varied_counts(trials, space, base)
    assert varied == {"lr": 8, "eps_clip": 2}  # baselines and confirmation re-runs change nothing
    keys, note = weighed(varied)
    assert (
        keys == ["lr"]
        and note == f"left out, changed in fewer than {IMPORTANCE_MIN_VARIED} scored trials: eps_clip (2)"
    )


def test_best_never_lets_a_raw_value_jump_its_verdict():
    trials = [_row(n, VERDICT_ORDER[n % 3], (n * 7919 % 97) / 97) for n in range(1, 40)]
    trials += [_row(40, Verdict.FLAT, math.nan)]
    best = rank_best(trials)
    ranks = [VERDICT_ORDER.index(t.verdict) for t in best]
    assert ranks == sorted(ranks) and 40 not in [t.number for t in best]
    for verdict in VERDICT_ORDER:
        values = [t.objective for t in best if t.verdict == verdict]
        assert values == sorted(values, reverse=True)


def test_importances_note_with_too_few_trials_then_values(tmp_path):
    import optuna

    storage = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    study = optuna.create_study(
        study_name="s", storage=storage, direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0)
    )
    study.optimize(lambda t: t.suggest_float("x", 0, 1) + 0 * t.suggest_float("y", 0, 1), n_trials=1)
    values, note = importances(Ledger(tmp_path / "ledger.sqlite"), "s")
    assert values == {} and "1 complete trial" in note
    study.optimize(lambda t: 5 * t.suggest_float("x", 0, 1) + 0.01 * t.suggest_float("y", 0, 1), n_trials=30)
    values, note = importances(Ledger(tmp_path / "ledger.sqlite"), "s")
    assert set(values) == {"x", "y"} and values["x"] > values["y"]
    assert importances(Ledger(tmp_path / "ledger.sqlite"), "other")[1].startswith("no Optuna study")


def test_pooled_importances_use_only_keys_that_varied():
    space = {
        "lr": SearchParam(low=1e-6, high=1e-2, log=True),
        "gens": SearchParam(choices=[4, 8, 16]),
        "eps_clip": SearchParam(low=0.05, high=0.4),
    }
    trials = [
        Trial(params={"lr": 10 ** (-6 + i / 3), "gens": [4, 8, 16][i % 3], "eps_clip": 0.2}, objective=i / 12)
        for i in range(12)
    ]
    trials += [
        Trial(params={"lr": 1e-4, "gens": 8, "eps_clip": 0.2}, objective=None),
        Trial(params={"lr": 5.0, "gens": 8, "eps_clip": 0.2}, objective=0.5),
    ]
    values, note = pooled_importances(trials, space, "maximize")
    assert set(values) == {"lr", "gens"} and values["lr"] > values["gens"]
    assert "12 finished trials" in note
    assert pooled_importances(trials[:1], space, "maximize")[0] == {}


# ---- helpers --------------------------------------------------------------------------------
def _chromium(*args: str) -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is not installed: apt-get install chromium (the report tests open the page in it)")
    argv = [exe, "--headless", "--disable-gpu", "--no-sandbox", "--virtual-time-budget=5000", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


class _Targets(HTMLParser):
    """Every href and src in a page."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.found += [v for k, v in attrs if k in ("href", "src") and v]

    @classmethod
    def of(cls, text: str) -> list[str]:
        parser = cls()
        parser.feed(text)
        return parser.found


def _resolve(out: Path, target: str) -> Path:
    url = urlparse(target)
    return Path(unquote(url.path)) if url.scheme == "file" else out / unquote(target)


def test_importances_wait_for_enough_trials(tmp_path):
    """Below IMPORTANCE_MIN_TRIALS complete trials, no chart: a note that says why."""
    import optuna

    from autorl.present.report import IMPORTANCE_MIN_TRIALS

    storage = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study.optimize(
        lambda t: t.suggest_float("x", 0, 1) + t.suggest_float("y", 0, 1), n_trials=IMPORTANCE_MIN_TRIALS - 1
    )
    values, note = importances(Ledger(tmp_path / "ledger.sqlite"), "s")
    assert values == {} and f"shown from {IMPORTANCE_MIN_TRIALS}" in note
    space = {"x": SearchParam(low=0, high=1), "y": SearchParam(low=0, high=1)}
    trials = [Trial(params=t.params, objective=t.value) for t in study.trials]
    assert pooled_importances(trials, space, "maximize") == (
        {},
        f"{len(trials)} finished trials in the ledger; importances are shown from {IMPORTANCE_MIN_TRIALS}",
    )


def test_a_failed_report_leaves_no_folders(tmp_path):
    ws = tmp_path / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    Ledger(ws / "ledger.sqlite").close()  # a ledger, but no study in it yet
    r = run_cli("-C", str(ws), "report")
    assert r.returncode == 2 and "no study" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (ws / ".autorl" / "report").exists()


def test_budget_used_leaves_out_the_pause_between_sessions_and_the_full_runs():
    """A 6-minute study resumed later for 8 minutes, then promoted: the report said 'Budget used 20m06s of 6m00s
    (335 %)', counting the pause and the full run against the first session's budget alone."""
    from autorl.present.report import budget_used

    t0 = 1_000_000.0
    trials = [
        Trial(kind=Kind.TRIAL, started=t0 + 50 + 60 * k, finished=t0 + 100 + 60 * k, duration_s=50.0) for k in range(5)
    ]  # the first session: 5 trials, the last ending at t0 + 340
    trials += [
        Trial(kind=Kind.TRIAL, started=t0 + 3600 + 60 * k, finished=t0 + 3650 + 60 * k, duration_s=50.0)
        for k in range(3)
    ]  # resumed an hour later: 3 trials, from t0 + 3600 to t0 + 3770
    trials += [Trial(kind=Kind.FULL, started=t0 + 4000, finished=t0 + 4500, duration_s=500.0)]
    b = budget_used(Study(created=t0, budget_s=840.0), trials)
    assert b["wall_s"] == pytest.approx(340 + 170) and b["budget_s"] == 840.0 and b["trial_s"] == 400.0
    overlapping = [
        Trial(kind=Kind.TRIAL, started=t0 + 10, finished=t0 + 110),
        Trial(kind=Kind.TRIAL, started=t0 + 20, finished=t0 + 100),
    ]
    assert budget_used(Study(created=t0, budget_s=600.0), overlapping)["wall_s"] == pytest.approx(110)
