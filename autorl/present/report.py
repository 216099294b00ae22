"""``autorl report``: the page a reviewer opens in the morning.

``report(ws, ledger, out_dir)`` writes one folder (the page needs the files beside it, so move the folder whole):

- ``index.html`` (inline CSS, no network) and ``report.md`` with the same content, opening with what the study
  found (``autorl.present.findings``: the headline ``autorl run`` ends with);
- ``plots/*.png`` (matplotlib, Agg): objective over trials coloured by verdict,
  objective against each searched parameter, Optuna's parameter importances,
  reward and eval curves of the best trials against the baseline;
- ``logs/attempt-NN.log``: the tail of each trial's log, linked from its row.

The best trials are the confirmed recipes first, by their gain over the
baseline (``autorl.judge.gains``), then by verdict (improved, then flat, then
regressed) and by objective inside a verdict, so a high raw value that the
paired test could not tell from noise never outranks a real improvement.
Parameter importances are drawn only over searched values that enough trials
changed (``IMPORTANCE_MIN_VARIED``), and the page says how many did. Eval
curves are labelled with their metric key, which names split and mode
(``eval/ood/greedy_pass@1``), because seed 004 forbids comparing across modes.
"""

from __future__ import annotations

import errno
import html
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Literal, NamedTuple

from autorl import gitops, loading
from autorl.budget import format_duration
from autorl.errors import GitError, UserError, short
from autorl.judge import calibrate
from autorl.judge.stats import clopper_pearson
from autorl.ledger import Ledger, Study, Trial
from autorl.present import errors, findings
from autorl.present.review import crash_groups, hypothesis_rows, show_trial
from autorl.recipe import Objective, SearchParam, VerdictSettings, dump_values
from autorl.search.optuna_study import distributions, study_names
from autorl.states import Confirmation, Kind, Proposer, TrialStatus, Verdict
from autorl.workspace import Workspace

REPORT_DIR = "report"
TOP_N = 5
CURVE_TRIALS = 3
PARAM_COLUMNS = 4
LOG_TAIL_LINES = 200
VERDICT_ORDER = [Verdict.IMPROVED, Verdict.FLAT, Verdict.REGRESSED]
# What a trial's point is coloured by (``_verdict_key``): its verdict, or what it was when it has none to show
BASELINE, CONFIRMATION_RUN, OTHER = Proposer.BASELINE, "confirmation run", "other"
VERDICT_COLOURS: dict[str, str] = {
    BASELINE: "#1f5fbf",
    Verdict.IMPROVED: "#1b8a3a",
    Verdict.FLAT: "#8a8a8a",
    Verdict.REGRESSED: "#c0392b",
    CONFIRMATION_RUN: "#7fd18f",
    Verdict.CRASH: "#111111",
    Verdict.PRUNED: "#e0a100",
    OTHER: "#7b3fa0",
}
IMPORTANCE_ERRORS = (ValueError, RuntimeError, ZeroDivisionError, KeyError, IndexError)
Direction = Literal["maximize", "minimize"]


class Link(NamedTuple):
    """A table cell or paragraph that points somewhere (relative path or file: URL)."""

    text: str
    href: str


class Block(NamedTuple):
    """One piece of the page: kind is h1, h2, p, note, ul (items with sub-items), table, img or details (open says
    if unfolded)."""

    kind: str
    body: Any
    extra: Any = None
    open: bool = False


# ---- entry point ----------------------------------------------------------------------
def report(ws: Workspace, ledger: Ledger, out_dir: str | Path | None = None, study: str | None = None) -> Path:
    """Write the report of ``study`` (default: the latest) into ``out_dir``; returns index.html."""
    out = Path(out_dir) if out_dir else ws.run_dir / REPORT_DIR
    problem = gitops.path_problem(out)
    if problem:
        raise UserError(f"report folder {short(out, 200)} {problem}: pass another --out DIR")
    if out.exists() and not out.is_dir():
        raise UserError(f"report folder {out} is a file: pass another --out DIR")
    _check_folder(ws, out)
    data = collect(ws, ledger, study)  # everything that can fail on the user's input fails before a folder exists
    _pyplot()
    made = [p for p in (*reversed(out.parents), out) if not p.exists()]
    stage = out / f"{STAGING}{os.getpid()}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(stage, ignore_errors=True)
        _write(stage, data)  # the whole report first, beside the old one: a full disk fails here, old report whole
        (stage / MARKER).write_text(MARKER_TEXT)
        _swap(stage, out)
        return out / "index.html"
    except BaseException as exc:
        shutil.rmtree(stage, ignore_errors=True)
        for p in reversed(made):  # a failed report leaves no half-made folders behind
            shutil.rmtree(p, ignore_errors=True)
        if isinstance(exc, OSError):
            raise UserError(
                f"cannot write the report to {short(out, 200)}: {exc.strerror or exc}"
                f"{_where(out, exc)}; {'free some space or ' if exc.errno in FULL else ''}pass another --out"
            ) from None
        raise


FULL = (errno.ENOSPC, errno.EDQUOT)  # a full disk or quota: freeing space is the other way out
REPORT_ENTRIES = ("plots", "logs", "report.md", "index.html", ".autorl-report")  # what a report owns in its folder
MARKER = REPORT_ENTRIES[-1]  # the file that says autorl wrote the folder's report, and may write it again
MARKER_TEXT = "This folder holds a report written by `autorl report`; autorl rewrites it on the next report.\n"
STAGING = ".report-writing-"  # a report being written (or one a killed process left): no user file


def _check_folder(ws: Workspace, out: Path) -> None:
    """Refuse, before anything is written, a folder whose files a report would overwrite or mix with: one that
    holds anything but an earlier autorl report (it has the ``MARKER``), the workspace itself, anything inside a
    ``.git`` folder, or ``/``. The default folder under ``.autorl/`` is autorl's own, marked or not (a report of an
    older autorl)."""
    where = Path(os.path.realpath(out))
    if where == Path(os.path.realpath(ws.run_dir / REPORT_DIR)):
        return
    if where == where.parent:
        raise UserError(f"report folder {short(out, 200)} is the root of the file system: pass a new folder --out DIR")
    if where == Path(os.path.realpath(ws.root)):
        raise UserError(f"report folder {short(out, 200)} is the workspace itself: pass a new folder --out DIR")
    if ".git" in where.parts:
        raise UserError(f"report folder {short(out, 200)} is inside a .git folder: pass a new folder --out DIR")
    if not out.is_dir() or (out / MARKER).is_file():
        return
    try:
        theirs = sorted(p.name for p in out.iterdir() if not p.name.startswith(STAGING))
    except OSError as exc:
        raise UserError(
            f"cannot read the report folder {short(out, 200)}: {exc.strerror or exc}: pass another --out"
        ) from None
    if theirs:
        shown = ", ".join(short(n, 40) for n in theirs[:3]) + (", ..." if len(theirs) > 3 else "")
        raise UserError(
            f"report folder {short(out, 200)} already holds files that are not an autorl report ({shown}): "
            "pass a new or empty folder with --out DIR, so none of them is overwritten"
        )


def _swap(stage: Path, out: Path) -> None:
    """Put the staged report's entries in place of the old ones by renames (no new space needed), the old ones
    kept aside until every new one is in; a failed rename puts the old ones back. Nothing else in ``out`` is
    touched: ``--out`` may be a folder that holds the user's own files."""
    aside = stage.with_name(stage.name + "-old")
    aside.mkdir()
    moved: list[str] = []
    try:
        for name in REPORT_ENTRIES:
            if (out / name).exists():
                os.rename(out / name, aside / name)
            moved.append(name)
            os.rename(stage / name, out / name)
    except OSError:
        for name in moved:
            if (aside / name).exists():
                if (out / name).is_dir():
                    shutil.rmtree(out / name, ignore_errors=True)
                elif (out / name).exists():
                    (out / name).unlink()
                os.rename(aside / name, out / name)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)
        shutil.rmtree(stage, ignore_errors=True)


def _where(out: Path, exc: OSError) -> str:
    """The file a write failed on, when it is not the report folder itself."""
    return f" ({short(exc.filename, 200)})" if exc.filename and Path(exc.filename) != out else ""


def _write(out: Path, data: dict) -> Path:
    for sub in ("plots", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    plots = make_plots(data, out / "plots")
    blocks = build_blocks(data, plots, _copy_logs(data["trials"], out / "logs"))
    (out / "report.md").write_text(render_markdown(blocks))
    index = out / "index.html"
    index.write_text(render_html(blocks, title=f"autorl report: {data['study'].name}"))
    return index


# ---- data -------------------------------------------------------------------------------
def collect(ws: Workspace, ledger: Ledger, study: str | None = None) -> dict[str, Any]:
    """Everything the page shows: the study's rows and what is known about them."""
    st = ledger.study(study)
    recipe = loading.parse(st.recipe or "", "the study's recipe") or {}
    objective = Objective.model_validate(recipe.get("objective") or {})
    trials = ledger.trials(st.id)
    numbers = {t.number for t in trials}
    found = findings.findings(ws, ledger, st.name)
    best = rank_best(trials, objective.direction, [g["number"] for g in found["confirmed"]])[:TOP_N]
    space = {k: SearchParam.model_validate(v) for k, v in (recipe.get("search") or {}).items()}
    varied = varied_counts(trials, space, recipe.get("train") or {})
    return {
        "study": st,
        "objective": objective,
        "verdict": VerdictSettings.model_validate(recipe.get("verdict") or {}),
        "trials": trials,
        "best": best,
        "findings": found,
        "baseline_gains": {g["number"]: g for g in found["confirmed"]},
        "space": space,
        "varied": varied,
        "baselines": [t for t in trials if t.proposer == Proposer.BASELINE],
        "budget": budget_used(st, trials),
        "baseline_value": baseline_value(st, trials),
        "crashes": [g for g in crash_groups(ledger) if numbers & set(g["attempts"])],
        "hypotheses": hypothesis_rows(ws, ledger),
        "importances": _importances(ledger, st, trials, space, objective.direction, varied),
        "shown": {t.number: _show(ws, ledger, t.number) for t in best},
        "curves": {t.number: ledger.metrics(t.id) for t in _curve_trials(trials, best)},
        "refs": _refs(ws.root),
        "errors": errors.collect(ledger, st),
    }


def rank_best(trials: list[Trial], direction: str = "maximize", confirmed: list[int] | None = None) -> list[Trial]:
    """Non-baseline trials with a verdict in VERDICT_ORDER: the ``confirmed`` recipes first in their order (by
    gain over the baseline), then by verdict, then by objective."""
    sign = -1.0 if direction == "maximize" else 1.0
    first = {n: i for i, n in enumerate(confirmed or [])}
    ranked = [(t, key) for t in trials if t.proposer != Proposer.BASELINE and (key := _ranked_by(t)) is not None]
    ranked.sort(key=lambda tk: (first.get(tk[0].number, len(first)), tk[1][0], sign * tk[1][1], tk[0].number))
    return [t for t, _ in ranked]


def _ranked_by(t: Trial) -> tuple[int, float] | None:
    """The place of the trial's verdict in VERDICT_ORDER and its objective; None for a trial with no verdict there
    or no finite objective."""
    if t.verdict is None or t.verdict not in VERDICT_ORDER or t.objective is None or not _finite(t.objective):
        return None
    return VERDICT_ORDER.index(t.verdict), t.objective


def baseline_value(study: Study, trials: list[Trial]) -> float | None:
    """The study's baseline value, else the mean objective of its finished baseline runs."""
    if study.baseline_value is not None and _finite(study.baseline_value):
        return study.baseline_value
    values = [
        t.objective
        for t in trials
        if t.proposer == Proposer.BASELINE and t.objective is not None and _finite(t.objective)
    ]
    return sum(values) / len(values) if values else None


SESSION_GAP_S = 600.0  # this long with no trial running: the study was stopped and later resumed


def budget_used(study: Study, trials: list[Trial]) -> dict[str, float]:
    """The study's wall time against its budget (every session's, summed on resume): from its start to its last
    trial's end, less the pauses between sessions (``SESSION_GAP_S`` or more with no trial running) and without
    the full runs promote started (they have no budget)."""
    own = [t for t in trials if t.kind == Kind.TRIAL]
    spans = sorted((t.started, t.finished) for t in own if t.started and t.finished)
    wall, end = 0.0, study.created or 0.0
    for start, finish in spans:
        wall += max(finish - max(start if start - end >= SESSION_GAP_S else end, end), 0.0)
        end = max(end, finish)
    return {"wall_s": wall, "budget_s": study.budget_s or 0.0, "trial_s": sum(t.duration_s or 0.0 for t in own)}


# Below this many complete trials fANOVA hands seed noise a large importance (eps_clip 0.95 from a dozen
# trials where only lr mattered), so the report says it is too early instead of drawing the chart.
IMPORTANCE_MIN_TRIALS = 10
# A searched value that only a couple of trials changed gets its weight from their noise (eps_clip was given
# weight after two trials changed it): a value is weighed only once this many scored trials changed it.
IMPORTANCE_MIN_VARIED = 5


def varied_counts(trials: list[Trial], space: dict[str, SearchParam], base: dict) -> dict[str, int]:
    """Per searched key, how many scored trials of the search ran it at another value than the base recipe's."""
    scored = [t for t in trials if _finite(t.objective) and t.proposer != Proposer.BASELINE and t.confirms is None]
    return {k: sum((t.params or {}).get(k, base.get(k)) != base.get(k) for t in scored) for k in space}


def weighed(varied: dict[str, int]) -> tuple[list[str], str]:
    """The keys importances may weigh, and a note on those left out (with how many trials changed each)."""
    keys = [k for k, n in varied.items() if n >= IMPORTANCE_MIN_VARIED]
    left = [f"{k} ({n})" for k, n in varied.items() if n < IMPORTANCE_MIN_VARIED]
    note = f"left out, changed in fewer than {IMPORTANCE_MIN_VARIED} scored trials: {', '.join(left)}" if left else ""
    return keys, note


def importances(ledger: Ledger, study_name: str, params: list[str] | None = None) -> tuple[dict[str, float], str]:
    """Optuna's parameter importances of ``study_name`` in the ledger's file, or ({}, why not)."""
    complete = ledger.optuna_complete_count(study_name)
    if complete is None:
        return {}, f"no Optuna study {study_name} in the ledger"
    if complete < IMPORTANCE_MIN_TRIALS:
        return {}, (
            f"{optuna_counts(ledger, study_name, complete)}; importances are shown from "
            f"{IMPORTANCE_MIN_TRIALS} with varied values (fewer make noise look like importance)"
        )
    import optuna  # lazy: optuna takes seconds to import, and only the importances need it

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        st = optuna.load_study(study_name=study_name, storage=ledger.file.optuna_url())
        values = optuna.importance.get_param_importances(st, params=params)
    except IMPORTANCE_ERRORS as exc:
        return {}, f"Optuna could not compute importances from {complete} complete trials ({exc})"
    if not values:
        return {}, f"no parameter varied across the {complete} complete trials of the Optuna study"
    return dict(values), f"fANOVA over {complete} complete trials of Optuna study {study_name}"


def optuna_counts(ledger: Ledger, study_name: str, complete: int) -> str:
    """How many complete trials the study's Optuna studies hold: its own study, and the ones under it. The
    ``hypotheses`` strategy tells each trial to the study of its hypothesis and incumbent
    (``<study>/<hypothesis>/<digest>``), so after a hundred trials its own may hold only the first baseline."""
    own = f"the Optuna study {study_name} has {findings.counted(complete, 'complete trial')}"
    under = [n for n in study_names(ledger.file.optuna_url(), study_name) if n != study_name]
    if not under:
        return own
    rest = sum(ledger.optuna_complete_count(n) or 0 for n in under)
    return (
        f"{own}; the other {findings.counted(rest, 'complete trial')} of this study went to "
        f"{len(under)} Optuna {'study' if len(under) == 1 else 'studies'} of one hypothesis and incumbent each "
        f"({study_name}/<hypothesis>/<digest>), whose search spaces differ"
    )


def pooled_importances(
    trials: list[Trial], space: dict[str, SearchParam], direction: Direction
) -> tuple[dict[str, float], str]:
    """Importances over the ledger's finished trials (searched keys only), or ({}, why not)."""
    import optuna  # lazy: optuna takes seconds to import, and only the importances need it

    dists, study = distributions(space), optuna.create_study(direction=direction)
    for t in trials:
        params = {k: (t.params or {}).get(k) for k in dists}
        if _finite(t.objective) and None not in params.values():
            try:
                study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=t.objective))
            except ValueError:
                continue
    n = len(study.trials)
    varied = [k for k in dists if len({repr(t.params[k]) for t in study.trials}) > 1]
    try:
        enough = n >= IMPORTANCE_MIN_TRIALS and varied
        values = optuna.importance.get_param_importances(study, params=varied) if enough else {}
    except IMPORTANCE_ERRORS:
        values = {}
    if not values:
        return {}, f"{n} finished trials in the ledger; importances are shown from {IMPORTANCE_MIN_TRIALS}"
    return dict(values), f"fANOVA over {n} finished trials of this study in the ledger (searched keys that varied)"


def _importances(
    ledger: Ledger, st: Study, trials: list[Trial], space: dict, direction: Direction, varied: dict[str, int]
) -> tuple[dict[str, float], str]:
    """The main Optuna study's importances, else pooled over the ledger's trials, over the searched keys that
    enough trials changed (two at least: one key alone has all the importance by definition)."""
    keys, left = weighed(varied)
    counts = ", ".join(f"{k} {n}" for k, n in varied.items())
    if len(keys) < 2:
        return {}, (
            f"not enough trials changed the searched values to weigh them against each other: each needs "
            f"{IMPORTANCE_MIN_VARIED} scored trials that changed it (so far {counts or 'none'})"
        )
    values, note = importances(ledger, st.optuna_study or st.name, keys)
    if not values:
        pooled, how = pooled_importances(trials, {k: space[k] for k in keys}, direction)
        values, note = (pooled, f"main study: {note}; pooled instead: {how}") if pooled else ({}, f"{note}; {how}")
    return values, note + (f"; {left}" if values and left else "")


def _refs(root: Path) -> dict[str, str]:
    """Every branch and tag with the commit it points at (tags peeled); none when git can't tell."""
    try:
        return gitops.refs(root)
    except GitError:
        return {}


def _show(ws: Workspace, ledger: Ledger, number: int) -> dict[str, Any]:
    """``autorl show``'s data; a missing ref leaves a note instead of the diff."""
    try:
        return show_trial(ws, ledger, number)
    except GitError as exc:
        return {"diff_vs_baseline": f"(diff unavailable: {exc})", "baseline_tag": None}


def _curve_trials(trials: list[Trial], best: list[Trial]) -> list[Trial]:
    return [t for t in trials if t.proposer == Proposer.BASELINE] + best[:CURVE_TRIALS]


def _verdict_key(t: Trial) -> str:
    """What the trial's point is coloured by: its verdict, else what it was (``VERDICT_COLOURS``)."""
    if t.verdict in (Verdict.CRASH, Verdict.PRUNED) or t.status == TrialStatus.CRASH:
        return t.verdict or Verdict.CRASH
    if t.proposer == Proposer.BASELINE:
        return BASELINE
    if t.confirms is not None:
        return CONFIRMATION_RUN
    return t.verdict if t.verdict is not None and t.verdict in VERDICT_COLOURS else OTHER


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _copy_logs(trials: list[Trial], dest: Path) -> dict[int, str]:
    """Copy each log's tail into ``dest``; returns {number: path relative to the report}."""
    links = {}
    for t in trials:
        src = Path(t.log_path) if t.log_path else None
        if src is None or not src.is_file():
            continue
        lines = src.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        name = f"{t.attempt}.log"
        (dest / name).write_text(f"# last {len(lines)} lines of {src}\n" + "\n".join(lines) + "\n")
        links[t.number] = f"logs/{name}"
    return links


# ---- plots ------------------------------------------------------------------------------
def make_plots(data: dict, dest: Path) -> dict[str, str]:
    """Write every plot as a PNG in ``dest``; returns {plot name: path relative to the report}."""
    plt = _pyplot()
    made = {}
    for name, draw in (
        ("objective", _plot_objective),
        ("params", _plot_params),
        ("importances", _plot_importances),
        ("curves", _plot_curves),
        ("reliability", _plot_reliability),
    ):
        fig = draw(plt, data)
        if fig is None:
            continue
        fig.savefig(dest / f"{name}.png", dpi=90, bbox_inches="tight")
        plt.close(fig)
        made[name] = f"plots/{name}.png"
    return made


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (a missing matplotlib is one line, before any folder is made)."""
    try:
        import matplotlib  # lazy: matplotlib is heavy, only the report draws, and a missing one is one line here
    except ImportError:
        raise UserError(
            "matplotlib, a dependency of autorl, is missing from this installation: `pip install 'matplotlib>=3.7'`"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after matplotlib.use("Agg"), which must come first

    return plt


def _plot_objective(plt, data: dict):
    """Scored trials at their objective; pruned and crashed ones, which have none, as marks along the bottom."""
    trials, obj = data["trials"], data["objective"]
    if not trials:
        return None
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for key, colour in VERDICT_COLOURS.items():
        pts = [t for t in trials if _verdict_key(t) == key]
        scored = [t for t in pts if _finite(t.objective)]
        unscored = [t for t in pts if not _finite(t.objective)]
        if scored:
            ax.scatter(
                [t.number for t in scored],
                [t.objective for t in scored],
                c=colour,
                marker="o",
                s=45,
                label=f"{key}",
                zorder=3,
            )
        if unscored:
            ax.scatter(
                [t.number for t in unscored],
                [BAND / 2] * len(unscored),
                c=colour,
                s=45,
                zorder=3,
                marker="x" if key == Verdict.CRASH else "v",
                transform=ax.get_xaxis_transform(),
                clip_on=False,
                label=f"{key} (no objective)",
            )
    if data["baseline_value"] is not None:
        ax.axhline(data["baseline_value"], color=VERDICT_COLOURS[BASELINE], ls="--", lw=1, label="baseline value")
    numbers = [t.number for t in trials]
    ax.set_xlim(min(numbers) - 0.7, max(numbers) + 0.7)
    _no_objective_band(ax, [t.objective for t in trials if _finite(t.objective)])
    ax.set(
        xlabel="attempt",
        ylabel=obj.metric,
        title=f"objective over trials ({obj.direction}; trials with no objective marked along the bottom)",
    )
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    return fig


BAND = 0.08  # share of the objective plot's height, at the bottom, where trials with no objective are marked


def _no_objective_band(ax, values: list[float]) -> None:
    """A grey strip along the bottom that no objective value falls in, labelled: the trials marked there have none."""
    from matplotlib.patches import Rectangle  # lazy: matplotlib is heavy; loaded by _pyplot before any plot

    if values:
        low, high = min(values), max(values)
        span = (high - low) or max(abs(high), 1.0) * 0.1
        ax.set_ylim(low - span * (BAND + 0.06) / (1 - BAND - 0.12), high + span * 0.06 / (1 - BAND - 0.12))
    ax.add_patch(Rectangle((0, 0), 1, BAND, transform=ax.transAxes, color="#ececec", zorder=1, lw=0))
    ax.text(0.005, BAND / 2, "no objective", transform=ax.transAxes, fontsize=7, va="center", color="#555555")


def _plot_params(plt, data: dict):
    space, trials = data["space"], [t for t in data["trials"] if _finite(t.objective)]
    if not space or not trials:
        return None
    cols = min(PARAM_COLUMNS, len(space))
    rows = math.ceil(len(space) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 3.2 * rows), squeeze=False)
    for ax, (key, sp) in zip(axes.flat, space.items()):
        _param_axis(ax, key, sp, trials)
    for ax in list(axes.flat)[len(space) :]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel(data["objective"].metric)
    fig.suptitle("objective vs each searched parameter")
    fig.tight_layout()
    _verdict_legend(fig, {_verdict_key(t) for t in trials})
    return fig


def _verdict_legend(fig, present: set[str]) -> None:
    """One legend for the figure: the colour of each verdict drawn in it."""
    from matplotlib.lines import Line2D  # lazy: matplotlib is heavy; loaded by _pyplot before any plot

    handles = [
        Line2D([], [], ls="", marker="o", color=c, label=f"{k}") for k, c in VERDICT_COLOURS.items() if k in present
    ]
    if handles:
        fig.legend(
            handles=handles,
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=len(handles),
            fontsize=7,
            title="colour = verdict",
            title_fontsize=7,
        )


def _param_axis(ax, key: str, sp: SearchParam, trials: list[Trial]) -> None:
    pts = [t for t in trials if (t.params or {}).get(key) is not None]
    xs = [(t.params or {})[key] for t in pts]
    if sp.choices is not None:
        labels = [str(c) for c in sp.choices]
        xs = [labels.index(str(x)) if str(x) in labels else len(labels) for x in xs]
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlim(-0.5, len(labels) - 0.5)
    else:
        ax.set_xscale("log" if sp.log else "linear")
        ax.set_xlim(sp.low, sp.high)
    ax.scatter(xs, [t.objective for t in pts], c=[VERDICT_COLOURS.get(_verdict_key(t), "#7b3fa0") for t in pts], s=40)
    ax.set_xlabel(key)
    ax.grid(alpha=0.3)


def _plot_importances(plt, data: dict):
    values, _note = data["importances"]
    if not values:
        return None
    keys = sorted(values, key=values.get)
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.45 * len(keys)))
    ax.barh(keys, [values[k] for k in keys], color="#1f5fbf")
    ax.set(xlabel="importance (fANOVA, sums to 1)", title="parameter importances")
    return fig


def _plot_curves(plt, data: dict):
    curves = data["curves"]
    if not any(_finite(r.get("reward_mean")) for records in curves.values() for r in records):
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    by_number = {t.number: t for t in data["trials"]}
    metric = data["objective"].metric
    for i, (number, records) in enumerate(curves.items()):
        t = by_number[number]
        style = dict(color=f"C{i % 10}", ls="--" if t.proposer == Proposer.BASELINE else "-")
        _curve(left, records, "step", "reward_mean", t.attempt, style)
        _curve(right, records, "eval", metric, t.attempt, style)
    left.set(xlabel="step", ylabel="reward_mean", title="reward_mean: best trials vs baseline")
    right.set(xlabel="step", ylabel=metric, title=f"eval: {metric}")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return fig


def aa_rates(data: dict) -> tuple[list[tuple[float, float]], tuple[int, int, int]]:
    """The study's A/A evidence against its stated rates: per A/A comparison (each baseline run judged against the
    others) the chance of a false improved and of a false regressed call its test states (``calibrate``), and
    (improved, regressed, comparisons) as the A/A called them."""
    aa = data["errors"].aa
    stated = []
    for _, v in aa:
        d = calibrate.design_of(v)
        r = calibrate.verdict_rates(d, data["verdict"], v.level) if d is not None else None
        stated.append((r.improved, r.regressed) if r is not None else (math.nan, math.nan))
    calls = [v.verdict for _, v in aa]
    return stated, (calls.count(Verdict.IMPROVED), calls.count(Verdict.REGRESSED), len(aa))


def _plot_reliability(plt, data: dict):
    """Left: each A/A comparison's gain and interval (none should leave 0). Right: the stated chance of a false
    improved / regressed call beside the share of A/A comparisons that made one, with its 95% Clopper-Pearson
    interval: a study of few baseline runs shows little, but a study whose A/A calls far more than it states is
    seen here."""
    aa = data["errors"].aa
    if not aa:
        return None
    stated, (improved, regressed, n) = aa_rates(data)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4))
    for k, (_, v) in enumerate(aa):
        color = VERDICT_COLOURS.get(v.verdict, "#777777")
        left.errorbar([k], [v.delta], yerr=[[v.delta - v.ci_low], [v.ci_high - v.delta]], fmt="o", color=color)
    left.axhline(0.0, color="black", lw=0.8)
    left.set_xticks(range(len(aa)), [f"run {i + 1}" for i, _ in aa])
    left.set(ylabel="gain vs the other baseline runs", title="A/A: each baseline run vs the others")
    x = [0, 1]
    said = [_mean([s[j] for s in stated if math.isfinite(s[j])]) for j in (0, 1)]
    right.bar([p - 0.2 for p in x], said, width=0.4, color="#1f5fbf", label="stated (mean over the A/A tests)")
    seen = [improved / n, regressed / n]
    bounds = [clopper_pearson(k, n) for k in (improved, regressed)]
    err = [[s - b[0] for s, b in zip(seen, bounds)], [b[1] - s for s, b in zip(seen, bounds)]]
    right.bar([p + 0.2 for p in x], seen, width=0.4, color="#bf5f1f", yerr=err, capsize=4, label=f"A/A ({n} tests)")
    right.set_xticks(x, ["false improved", "false regressed"])
    right.set(ylabel="rate", title="stated rate vs the study's A/A")
    right.legend(fontsize=7)
    return fig


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _curve(ax, records: list[dict], kind: str, key: str, label: str, style: dict) -> None:
    pts = [(r.get("step"), r.get(key)) for r in records if r.get("type", "step") == kind and _finite(r.get(key))]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if kind == "step" else "o", label=label, **style)


# ---- the page as blocks -------------------------------------------------------------------
def build_blocks(data: dict, plots: dict[str, str], logs: dict[int, str]) -> list[Block]:
    """The page, top to bottom, independent of HTML or Markdown."""
    st: Study = data["study"]
    obj: Objective = data["objective"]
    blocks = [
        Block("h1", f"Study {st.name}"),
        Block(
            "p",
            f"objective {obj.metric} ({obj.direction}, {obj.reduction}); strategy {st.strategy}; "
            f"recipe {st.recipe_path}; base commit {(st.base_sha or '')[:10]}; "
            f"generated {time.strftime('%Y-%m-%d %H:%M')}",
        ),
        Block("h2", "What was found"),
        Block("ul", outline(findings.headline(data["findings"], 10**6))),
    ]
    blocks += _summary_blocks(data)
    blocks += [Block(*b) for b in errors.blocks(data["errors"], data["trials"])]
    blocks += _best_blocks(data, logs)
    blocks += _plot_blocks(data, plots)
    blocks += _hypothesis_blocks(data["hypotheses"])
    blocks += [Block("h2", "All trials"), _trials_table(data, data["trials"], logs)]
    return blocks


def outline(lines: list[str]) -> list[tuple[str, list[str]]]:
    """Headline lines as items: an unindented line, with the indented lines under it."""
    out: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith(" ") and out:
            out[-1][1].append(line.strip())
        else:
            out.append((line.strip(), []))
    return out


def _summary_blocks(data: dict) -> list[Block]:
    b = data["budget"]
    share = f" ({100 * b['wall_s'] / b['budget_s']:.0f} %)" if b["budget_s"] else ""
    out = [
        Block("h2", "Summary"),
        Block(
            "p",
            f"{summary_sentence(data['trials'])} Budget used {format_duration(b['wall_s'])} of "
            f"{format_duration(b['budget_s'])}{share}; trial time {format_duration(b['trial_s'])}; "
            f"baseline value {_num(data['baseline_value'])}.",
        ),
    ]
    if data["crashes"]:
        rows = [
            [
                g["category"] or "-",
                str(g["count"]),
                ", ".join(f"{n:02d}" for n in g["attempts"]),
                g.get("root_cause_line") or "-",
                g.get("remedy") or "-",
            ]
            for g in data["crashes"]
        ]
        out += [
            Block("h2", "Crashes by category"),
            Block("table", ["category", "count", "attempts", "root cause", "remedy"], rows),
        ]
    return out + _gate_blocks(data["trials"])


def _gate_blocks(trials: list[Trial]) -> list[Block]:
    """The trials the hack gate checked: its answer and the check that failed, with its numbers."""
    gated = [t for t in trials if t.gate]
    if not gated:
        return []
    rows = []
    for t in gated:
        failed = next((c for c in t.gate_checks or [] if c.get("ok") is False), None)
        rows.append([t.attempt, t.gate, failed["name"] if failed else "-", failed["detail"] if failed else "-"])
    return [
        Block("h2", "Hack gate"),
        Block(
            "p",
            "A confirmed gain must be matched by the held-out task metric, with healthy completions and "
            "KL/entropy in bounds (docs/triage.md); a suspect trial is not the incumbent and is not "
            "promoted without --force.",
        ),
        Block("table", ["trial", "gate", "failed check", "evidence"], rows),
    ]


SUMMARY_WORDS: list[tuple[str, str]] = [
    (Confirmation.CONFIRMED, "confirmed improvement(s)"),
    (Confirmation.CANDIDATE, "candidate(s) awaiting fresh-seed runs"),
    (Confirmation.REJECTED, "candidate(s) that fresh seeds did not confirm"),
    (Confirmation.SUSPECT, "suspect (confirmed, but the hack gate failed)"),
    (Verdict.FLAT, "flat"),
    (Verdict.REGRESSED, "regressed"),
    (Verdict.PRUNED, "stopped early (pruned)"),
    (Verdict.CRASH, "crashed"),
    (OTHER, "unfinished"),
]


def summary_sentence(trials: list[Trial]) -> str:
    """'48 trials: 4 baseline runs, 6 confirmation runs, and 38 of the search: 2 confirmed improvement(s), ...'."""
    own = [t for t in trials if t.kind == Kind.TRIAL]
    base = sum(t.proposer == Proposer.BASELINE for t in own)
    reruns = sum(t.confirms is not None for t in own)
    search = [t for t in own if t.proposer != Proposer.BASELINE and t.confirms is None]
    counts: dict[str, int] = {}
    for t in search:
        key = t.confirmation if t.verdict == Verdict.IMPROVED and t.confirmation else _verdict_key(t)
        key = key if key in dict(SUMMARY_WORDS) else OTHER
        counts[key] = counts.get(key, 0) + 1
    parts = [f"{counts[k]} {words}" for k, words in SUMMARY_WORDS if counts.get(k)]
    return f"{len(own)} trials: {base} baseline runs, {reruns} confirmation runs, and {len(search)} of the search" + (
        f": {', '.join(parts)}." if parts else "."
    )


def _best_blocks(data: dict, logs: dict[int, str]) -> list[Block]:
    out = [
        Block("h2", "Best trials"),
        Block(
            "note",
            "Confirmed recipes first, by their gain over the baseline (measured on their fresh-seed "
            "runs); then by verdict (improved, flat, regressed) and objective; baselines excluded.",
        ),
    ]
    if not data["best"]:
        return out + [Block("note", "No judged trial yet besides the baseline.")]
    out.append(_trials_table(data, data["best"], logs))
    for i, t in enumerate(data["best"]):
        shown = data["shown"][t.number]
        diff = shown["diff_vs_baseline"] or "(no difference in the committed files)"
        out.append(Block("details", f"{t.attempt}: diff vs {shown['baseline_tag'] or 'baseline'}", diff, i == 0))
    return out


def _plot_blocks(data: dict, plots: dict[str, str]) -> list[Block]:
    out = [Block("h2", "Plots")]
    captions = {
        "objective": "Objective over trials",
        "params": "Objective vs searched parameters",
        "importances": "Parameter importances",
        "curves": "Reward and eval curves: best trials vs baseline",
        "reliability": "Reliability: the stated false-positive rate against the study's own A/A (each baseline run "
        "judged against the others as a trial is)",
    }
    for name, caption in captions.items():
        if name in plots:
            out.append(Block("img", plots[name], caption))
        if name == "importances":
            out.append(
                Block(
                    "note", ("" if name in plots else "Parameter importances: not plotted: ") + data["importances"][1]
                )
            )
        elif name not in plots:
            out.append(Block("note", f"{caption}: nothing to plot yet."))
    return out


def _hypothesis_blocks(rows: list[dict]) -> list[Block]:
    if not rows:
        return []
    order = {"validated": 0, "testing": 1, "inconclusive": 2, "invalidated": 3, "pending": 4}
    rows = sorted(rows, key=lambda r: (order.get(r["status"], 9), r["id"]))
    body = [
        [
            r["id"],
            r["priority"],
            r["status"] + (" (demoted)" if r["demoted"] else ""),
            r["confidence"],
            str(r["counts"].get("tried", 0)),
            str(r["counts"].get(Verdict.IMPROVED, 0)),
            r["title"] + (f" ({r['note']})" if r.get("note") else ""),
        ]
        for r in rows
    ]
    return [
        Block("h2", "Hypotheses"),
        Block("table", ["id", "priority", "status", "confidence", "tried", "improved", "title"], body),
    ]


def _trials_table(data: dict, trials: list[Trial], logs: dict[int, str]) -> Block:
    head = [
        "NN",
        "proposer",
        "changed",
        "verdict",
        "objective",
        "Δ vs parent [95% CI]",
        "Δ vs baseline",
        "time",
        "branch",
        "log",
    ]
    rows = []
    for t in trials:
        who = f"{t.proposer}" + (f" / {t.hypothesis}" if t.hypothesis else "")
        log = Link("log tail", logs[t.number]) if t.number in logs else "-"
        rows.append(
            [
                f"{t.number:02d}",
                who,
                dump_values(t.changed or {}) or "-",
                _verdict_text(t),
                _num(t.objective),
                _delta(t),
                _vs_baseline(t, data.get("baseline_gains", {})),
                format_duration(t.duration_s or 0),
                _ref_cell(t, data["refs"]),
                log,
            ]
        )
    return Block("table", head, rows)


def _vs_baseline(t: Trial, measured: dict[int, dict]) -> str:
    g = measured.get(t.number)
    if g:
        return f"{g['delta']:+.4f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}] ({findings.measured_on(g['level'])})"
    return f"{t.gain_vs_baseline:+.4f}" if _finite(t.gain_vs_baseline) else "-"


class Hover(NamedTuple):
    """A cell whose text is short, with more on hover (HTML title) and in `autorl show`."""

    text: str
    title: str


def _ref_cell(t: Trial, refs: dict[str, str]) -> Hover | str:
    """The trial's branch; its tags with their commits on hover (``autorl show NN`` has them all)."""
    if not t.branch:
        return "-"
    names = [(t.start_tag, t.start_sha), (t.end_tag, t.end_sha)]
    tags = "; ".join(f"{n} @ {(refs.get(n) or sha or '?')[:10]}" for n, sha in names if n)
    gone = "" if t.branch in refs else " (removed)"
    return Hover(t.branch + gone, f"tags: {tags}; `autorl show {t.number}` has them all" if tags else "")


def _verdict_text(t: Trial) -> str:
    v = _verdict_key(t)
    v = f"{t.verdict or t.status or '-'}" if v == OTHER else v
    state = f" ({t.confirmation})" if v == Verdict.IMPROVED and t.confirmation else ""
    return f"{v}{state}" + (f" ({t.crash_category})" if t.crash_category else "")


def _num(v: Any) -> str:
    return f"{v:.4f}" if _finite(v) else "-"


def _delta(t: Trial) -> str:
    if not _finite(t.delta):
        return "-"
    ci = f" [{t.ci_low:+.3f}, {t.ci_high:+.3f}]" if _finite(t.ci_low) and _finite(t.ci_high) else ""
    return f"{t.delta:+.4f}{ci}"


# ---- rendering ----------------------------------------------------------------------------
CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px
auto;max-width:1200px;color:#1d1d1d;padding:0 16px}
h1{font-size:22px;margin:0 0 6px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
table{border-collapse:collapse;margin:6px 0;font-size:12.5px}th,td{border:1px solid #ddd;padding:3px
7px;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}.note{color:#555;font-style:italic}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;font-size:12px}figure{margin:10px
0}figcaption{color:#555;font-size:12px}
img{max-width:100%;border:1px solid #eee}details{margin:4px 0}summary{cursor:pointer;font-family:monospace}
"""

IMG_CHECK = """<script>
window.addEventListener('load', function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) {
    var loaded = imgs[i].complete && imgs[i].naturalWidth > 0;
    imgs[i].setAttribute('data-loaded', loaded ? '1' : '0');
    if (loaded) { ok += 1; }
  }
  document.body.setAttribute('data-images', ok + '/' + imgs.length);
});
</script>"""


def render_html(blocks: list[Block], title: str) -> str:
    """The HTML page (its plots and log tails are files beside it); the script marks images that failed to load."""
    body = "\n".join(_html_block(b) for b in blocks)
    return (
        f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head>\n<body>\n{body}\n{IMG_CHECK}\n</body></html>\n"
    )


def _html_block(b: Block) -> str:
    e = html.escape
    if b.kind in ("h1", "h2"):
        return f"<{b.kind}>{e(b.body)}</{b.kind}>"
    if b.kind in ("p", "note"):
        return f"<p class='{b.kind}'>{e(b.body)}</p>"
    if b.kind == "img":
        return f"<figure><img src='{e(b.body)}' alt='{e(b.extra)}'><figcaption>{e(b.extra)}</figcaption></figure>"
    if b.kind == "details":
        return f"<details{' open' if b.open else ''}><summary>{e(b.body)}</summary><pre>{e(b.extra)}</pre></details>"
    if b.kind == "ul":
        return (
            "<ul class='found'>"
            + "".join(
                f"<li>{e(item)}"
                + ("<ul>" + "".join(f"<li>{e(x)}</li>" for x in subs) + "</ul>" if subs else "")
                + "</li>"
                for item, subs in b.body
            )
            + "</ul>"
        )
    head = "".join(f"<th>{e(h)}</th>" for h in b.body)
    rows = "".join("<tr>" + "".join(f"<td>{_html_cell(c)}</td>" for c in row) + "</tr>" for row in b.extra)
    return f"<table><tr>{head}</tr>{rows}</table>"


def _html_cell(cell: Any) -> str:
    if isinstance(cell, Link):
        return f"<a href='{html.escape(cell.href)}'>{html.escape(cell.text)}</a>"
    if isinstance(cell, Hover):
        return f"<span title='{html.escape(cell.title)}'>{html.escape(cell.text)}</span>"
    return html.escape(str(cell))


def render_markdown(blocks: list[Block]) -> str:
    """The same page as Markdown (images and links relative to the report folder)."""
    return "\n\n".join(_md_block(b) for b in blocks) + "\n"


def _md_block(b: Block) -> str:
    if b.kind in ("h1", "h2"):
        return f"{'#' * int(b.kind[1])} {b.body}"
    if b.kind == "note":
        return f"_{b.body}_"
    if b.kind == "img":
        return f"![{b.extra}]({b.body})"
    if b.kind == "details":
        return f"**{b.body}**\n\n```diff\n{b.extra.rstrip()}\n```"
    if b.kind == "ul":
        return "\n".join(f"- {item}" + "".join(f"\n  - {x}" for x in subs) for item, subs in b.body)
    if b.kind == "table":
        lines = ["| " + " | ".join(b.body) + " |", "|" + "---|" * len(b.body)]
        return "\n".join(lines + ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.extra])
    return str(b.body)


def _md_cell(cell: Any) -> str:
    text = (
        f"[{cell.text}]({cell.href})" if isinstance(cell, Link) else cell.text if isinstance(cell, Hover) else str(cell)
    )
    return text.replace("|", "\\|").replace("\n", " ")
