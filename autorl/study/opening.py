"""Opening a study: every input checked first (recipe, flags, hypothesis files, patches), only then the ledger and git.

A new study reads its recipe once: the committed text is the file with each ``--set`` value written in place
(``autorl.recipe.recipe_and_text``), and the base recipe is validated once, from exactly that text. On
``--resume`` the study's own recipe and strategy are taken over, and a flag that would change them is an error; the
session runs what the study has left of its budget (``budget_left``), or ``--budget`` more, and says which first.

Nothing is written before every check has passed: a refused start (a repository with no commits, a study name taken,
a bad hypothesis file, a spent budget) leaves the workspace as it was, byte for byte.

One controller per study: the study's lock (``Workspace.lock_study``) is taken before its row is written or a
resumed study's running trials are touched, and held until the controller ends. A new study without ``--study``
gets a name no other study of the ledger has, chosen under the ledger's lock, so studies started at once never
collide. Once the row is written, a set-up step that fails marks the study stopped with its reason
(``setup_failed``) before the error goes on.
"""

from __future__ import annotations

import math
import re
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from autorl import gitops
from autorl.backends.base import Backend, get_backend
from autorl.backends.ray_jobs import resolve_address
from autorl.budget import format_duration
from autorl.errors import UserError, short
from autorl.judge.evidence import Evidence
from autorl.ledger import Ledger, Study, ledger_guard, open_read
from autorl.locks import Lock
from autorl.present.live import PlainView
from autorl.recipe import Recipe, check_base, editable_text, read_recipe_text, recipe_and_text, recipe_from_text
from autorl.search.hypotheses_strategy import library_for
from autorl.search.proposer import Proposer
from autorl.states import Kind, StudyStatus
from autorl.study.state import RunOptions, StudyState
from autorl.workspace import Workspace, default_recipe_source

BUDGET_LEFT = 0.0  # RunOptions.budget_s of `run --resume` without --budget: the session runs what the study has left
RESUMED, SESSION_END = "resumed", "session-end"  # the events a session's budget is counted between


@dataclass(frozen=True)
class Resumed:
    """The study ``--resume`` continues, what this session adds to its budget, and the line that says so."""

    study: Study
    added_s: float
    line: str


@dataclass(frozen=True)
class Checked:
    """A study's inputs once every check has passed: its base recipe, the text it commits and where, its backend."""

    recipe: Recipe
    text: str
    rel: str
    backend: Backend


def open_study(ws: Workspace, opts: RunOptions, view: PlainView) -> StudyState:
    """The study ``opts`` asks for, new or resumed, with its ledger row, base recipe, backend and proposer. Every
    check comes first and writes nothing; then a resumed study's lock is taken, before anything is touched."""
    check_study_name(opts.study_name, new=not opts.resume)
    resumed = resumed_study(ws, opts)
    ledger_guard(ws.ledger_path)
    checked = check_inputs(ws, opts, view, resumed)
    lock = ws.lock_study(resumed.study.name) if resumed is not None else None
    try:
        if resumed is not None:
            view.line(resumed.line)
        return _open(ws, opts, view, resumed, checked, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def check_inputs(ws: Workspace, opts: RunOptions, view: PlainView, resumed: Resumed | None) -> Checked:
    """Every input of the study read and checked, nothing written: the recipe and its backend, the hypothesis
    library, and for a new study a commit to branch from and a name no study of the ledger has."""
    if resumed is None:
        recipe, text, rel = base_recipe(ws, opts)
    else:
        recipe, text, rel = recipe_from_text(*recipe_of(resumed.study)), "", ""
    backend = get_backend(recipe.backend, ray_address=resolve_address(opts.ray_address))
    if resumed is None:
        backend.check(recipe, ws.root)
        warn(recipe, backend, view, ws.root)
    if opts.strategy == "hypotheses":
        library_for(ws, recipe.backend)  # the library (and its patches) now: a bad file stops the study unwritten
    if resumed is None:
        gitops.head_sha(ws.root)  # a repository with no commits has nothing to branch trials from
        if opts.study_name and ws.ledger_path.exists():
            with closing(open_read(ws.ledger_path)) as ledger:
                _name_free(ledger, opts.study_name)
    return Checked(recipe, text, rel, backend)


def _name_free(ledger: Ledger, name: str) -> None:
    if ledger.has_study(name):
        raise UserError(f"study {name} exists already: continue it with `autorl run --resume --study {name}`")


def _open(
    ws: Workspace, opts: RunOptions, view: PlainView, resumed: Resumed | None, checked: Checked, lock: Lock | None
) -> StudyState:
    ws.ensure_ignored()
    ledger = Ledger(ws.ledger_path)
    row, lock = _study_row(ws, ledger, opts, checked, resumed, lock)
    try:
        ledger.file.create_optuna_tables()
        proposer = Proposer(ws, ledger, row, checked.recipe, opts, checked.backend)
    except BaseException as exc:
        setup_failed(ledger, row, lock, exc)
        raise
    return StudyState(
        ws,
        opts,
        view,
        ledger,
        row,
        checked.recipe,
        *recipe_of(row),
        checked.backend,
        proposer,
        proposer.records,
        Evidence(proposer.records),
        lock,
    )


def recipe_of(study: Study) -> tuple[str, str]:
    """The study's base recipe text as written, and where it lives in the repository."""
    assert study.recipe is not None and study.recipe_path is not None  # every study is made with them
    return study.recipe, study.recipe_path


def setup_failed(ledger: Ledger, row: Study, lock: Lock, exc: BaseException) -> None:
    """A study whose set-up failed after its row was written: marked stopped with the reason, its lock released.
    Nothing here hides ``exc`` (a ledger that cannot take the mark is left as it is: `autorl status` shows a study
    no controller runs)."""
    reason = f"set-up failed: {exc.__class__.__name__}: {short(exc, 300)}"
    try:
        ledger.update_study(row.id, status=StudyStatus.STOPPED)
        ledger.event(row.id, None, "study-stopped", reason)
    except Exception:  # noqa: BLE001 - the error that stopped the study is the one to tell
        pass
    finally:
        lock.release()


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_study_name(name: str | None, new: bool) -> None:
    """A new study's name: letters, digits, '.', '_', '-' (first a letter or digit), at most 64 characters; the name
    a resumed study is looked up by: at most 200 characters."""
    if name is None:
        return
    if new and not _NAME.fullmatch(name):
        raise UserError(
            f"--study {short(repr(name), 80)}: a study name is 1-64 letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit): pick another"
        )
    if len(name) > 200:
        raise UserError(f"--study {short(name, 60)}: no study has a name that long: list them with `autorl status`")


def warn(recipe: Recipe, backend: Backend, view: PlainView, root: Path) -> None:
    """One line each for what the study runs despite: a hack gate with no held-out task metric to hold a gain
    against, and the backend's own warnings."""
    if recipe.gate.enabled and not backend.held_out(recipe):
        view.line(
            f"warning: the hack gate is blind: recipe {recipe.name} names no held-out probe set, so a gain "
            "on a reward with a loophole cannot be told from a real one (name probe_id/probe_ood, or "
            "eval_id/eval_ood for the embedded engine)"
        )
    for line in backend.warnings(recipe, root):
        view.line(f"warning: {line}")


def resumed_study(ws: Workspace, opts: RunOptions) -> Resumed | None:
    """On --resume: the study row, with the study's own settings taken over (a conflicting flag is an error), and
    this session's budget: ``--budget`` more, or what the study has left (a spent one is refused)."""
    if not opts.resume:
        opts.strategy = opts.strategy or "hypotheses"
        return None
    if not ws.ledger_path.exists():
        raise UserError(f"no ledger at {ws.ledger_path} to resume: start a study with `autorl run`")
    with closing(open_read(ws.ledger_path)) as ledger:
        study = ledger.study(opts.study_name)
        check_resume_flags(opts, study)
        left = budget_left(ledger, study)
    opts.strategy, opts.study_name = study.strategy, study.name  # the study found, whatever starts meanwhile
    return session_budget(opts, study, left)


def session_budget(opts: RunOptions, study: Study, left: float) -> Resumed:
    """What a resumed session runs (``opts.budget_s``), what it adds to the study's budget, and the line saying so.
    Without --budget: what the study has left, adding nothing (a spent budget is one line asking for --budget)."""
    total = study.budget_s or 0.0
    if opts.budget_s != BUDGET_LEFT:
        return Resumed(
            study,
            opts.budget_s,
            f"resuming study {study.name} for {format_duration(opts.budget_s)} (--budget, added to its "
            f"{format_duration(total)}; the {format_duration(left)} it had left stays for a `--resume` without "
            "--budget)",
        )
    if left < MIN_LEFT_S:
        raise UserError(
            f"study {study.name} has used its {format_duration(total)} budget: continue it with "
            f"`autorl run --resume --study {study.name} --budget 30m` (any duration: the time it is given more)"
        )
    opts.budget_s = left
    return Resumed(
        study, 0.0, f"resuming study {study.name}: {format_duration(left)} of its {format_duration(total)} budget left"
    )


MIN_LEFT_S = 1.0  # less left than this is a spent budget


def budget_left(ledger: Ledger, study: Study) -> float:
    """The study's budget (every session's, summed) less what its sessions used: each session from its start (the
    study's creation, then each resume) to its last trace, its own trials' starts and ends and the end it recorded;
    the pauses between sessions, and promote's runs, are not counted."""
    events = ledger.events(study.id, limit=-1)
    starts = [study.created or 0.0] + sorted(e.time for e in events if e.kind == RESUMED)
    marks = [e.time for e in events if e.kind == SESSION_END]
    for t in ledger.trials(study.id, kind=Kind.TRIAL):
        marks += [m for m in (t.started, t.finished) if m]
    used = 0.0
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else math.inf
        used += max((m for m in marks if start <= m < end), default=start) - start
    return (study.budget_s or 0.0) - used


def check_resume_flags(opts: RunOptions, study: Study) -> None:
    """--resume continues the study as it was started: a flag that would change it is an error."""
    if opts.overrides:
        raise UserError(
            f"--set does not apply on --resume: study {study.name} keeps its recipe; start a new study to change values"
        )
    if opts.recipe_path is not None:
        raise UserError("--resume continues a study with its own recipe: drop the RECIPE argument")
    if opts.strategy and opts.strategy != study.strategy:
        raise UserError(
            f"study {study.name} uses --strategy {study.strategy}: drop --strategy "
            f"{opts.strategy}, or start a new study with it"
        )


def base_recipe(ws: Workspace, opts: RunOptions) -> tuple[Recipe, str, str]:
    """A new study's base recipe, the text it commits and where that text lives in the repository."""
    path = opts.recipe_path or workspace_default(ws)
    recipe, text = recipe_and_text(editable_text(read_recipe_text(path), path), path, opts.overrides)
    check_base(recipe, path)
    try:
        rel = ws.rel(Path(path))
    except ValueError:
        rel = f"recipes/{Path(path).name}"
    return recipe, text, rel


def workspace_default(ws: Workspace) -> Path:
    local = ws.root / "recipes" / "default.yaml"
    return local if local.is_file() else default_recipe_source()


def _study_row(
    ws: Workspace, ledger: Ledger, opts: RunOptions, checked: Checked, resumed: Resumed | None, lock: Lock | None
) -> tuple[Study, Lock]:
    """The resumed study's row (its ``lock`` held already), marked running again with what this session adds to its
    budget, or a new study's row with its lock taken."""
    if resumed is not None:
        study = ledger.study(study_id=resumed.study.id)  # its budget is every session's, summed ("Budget used")
        ledger.update_study(study.id, status=StudyStatus.RUNNING, budget_s=(study.budget_s or 0.0) + resumed.added_s)
        ledger.event(study.id, None, RESUMED, resumed.line)  # where this session's use of the budget starts
        assert lock is not None  # taken before the resumed study was touched (open_study)
        return ledger.study(study_id=study.id), lock
    base_sha = gitops.head_sha(ws.root)
    with ledger.file.exclusive("name a new study"):
        name = opts.study_name or _free_name(
            ledger, f"{gitops.slugify(checked.recipe.name)}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
        _name_free(ledger, name)  # a study of that name made since the check
        lock = ws.lock_study(name)
        sid = ledger.create_study(
            name=name,
            recipe_path=checked.rel,
            recipe=checked.text,
            base_sha=base_sha,
            strategy=opts.strategy,
            budget_s=opts.budget_s,
            optuna_study=name,
        )
    return ledger.study(study_id=sid), lock


def _free_name(ledger: Ledger, name: str) -> str:
    """``name``, or ``name-2``, ``name-3`` ... when a study of the ledger has it already (studies started in the
    same second)."""
    k, out = 1, name
    while ledger.has_study(out):
        k += 1
        out = f"{name}-{k}"
    return out


def prepare_backend(state: StudyState) -> float:
    """Let the backend build what every trial shares (the embedded base model) outside any trial, saying so: a
    fresh workspace's first build took four minutes on a busy two-core machine, with nothing on the screen.
    Returns the seconds it took (of the study's budget)."""
    t0 = time.time()
    log = state.ws.runs / "prepare"
    say = (lambda _text: None) if state.view.quiet else state.view.line
    say(f"preparing backend {state.base.backend} (log: {state.ws.shown(log)}/)")
    code = state.backend.prepare(state.base, state.ws.cache, log)
    if code is not None:
        took = time.time() - t0
        state.records.event(None, "prepare", f"exit {code} in {took:.1f} s")
        if took >= 5 or code:
            say(f"backend {state.base.backend} ready in {took:.0f} s" + (f" (exit {code})" if code else ""))
    return time.time() - t0
