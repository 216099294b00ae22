"""Opening a study: every input checked first (recipe, flags, hypothesis files, patches), only then the ledger and git.

A new study reads its recipe once: the committed text is the file with each ``--set`` value written in place
(``autorl.recipe.recipe_and_text``), and the base recipe is validated once, from exactly that text. On
``--resume`` the study's own recipe and strategy are taken over, and a flag that would change them is an error.

One controller per study: the study's lock (``Workspace.lock_study``) is taken before its row is written or a
resumed study's running trials are touched, and held until the controller ends. A new study without ``--study``
gets a name no other study of the ledger has, chosen under the ledger's lock, so studies started at once never
collide. Once the row is written, a set-up step that fails marks the study stopped with its reason
(``setup_failed``) before the error goes on.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from autorl import gitops
from autorl.backends.base import Backend, get_backend
from autorl.backends.ray_jobs import resolve_address
from autorl.errors import UserError, short
from autorl.judge.evidence import Evidence
from autorl.ledger import Ledger, Study, ledger_guard, open_read
from autorl.locks import Lock
from autorl.present.live import PlainView
from autorl.recipe import Recipe, check_base, editable_text, read_recipe_text, recipe_and_text, recipe_from_text
from autorl.search.hypotheses_strategy import library_for
from autorl.search.proposer import Proposer
from autorl.states import StudyStatus
from autorl.study.state import RunOptions, StudyState
from autorl.workspace import Workspace, default_recipe_source


def open_study(ws: Workspace, opts: RunOptions, view: PlainView) -> StudyState:
    """The study ``opts`` asks for, new or resumed, with its ledger row, base recipe, backend and proposer. A
    resumed study's lock is taken first, before anything else is read or touched."""
    check_study_name(opts.study_name, new=not opts.resume)
    resumed = resumed_study(ws, opts)
    lock = ws.lock_study(resumed.name) if resumed is not None else None
    try:
        ledger_guard(ws.ledger_path)
        return _open(ws, opts, view, resumed, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _open(ws: Workspace, opts: RunOptions, view: PlainView, resumed: Study | None, lock: Lock | None) -> StudyState:
    if resumed is None:
        recipe, text, rel = base_recipe(ws, opts)
    else:
        recipe, text, rel = recipe_from_text(*recipe_of(resumed)), "", ""
    backend = get_backend(recipe.backend, ray_address=resolve_address(opts.ray_address))
    if resumed is None:
        backend.check(recipe, ws.root)
        warn(recipe, backend, view, ws.root)
    if opts.strategy == "hypotheses":
        library_for(ws, recipe.backend)  # the library (and its patches) now: a bad file stops the study unwritten
    ws.ensure_ignored()
    ledger = Ledger(ws.ledger_path)
    row, lock = _study_row(ws, ledger, opts, recipe, text, rel, lock)
    try:
        ledger.file.create_optuna_tables()
        proposer = Proposer(ws, ledger, row, recipe, opts, backend)
    except BaseException as exc:
        setup_failed(ledger, row, lock, exc)
        raise
    return StudyState(
        ws,
        opts,
        view,
        ledger,
        row,
        recipe,
        *recipe_of(row),
        backend,
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


def resumed_study(ws: Workspace, opts: RunOptions) -> Study | None:
    """On --resume: the study row, with the study's own settings taken over (a conflicting flag is an error)."""
    if not opts.resume:
        opts.strategy = opts.strategy or "hypotheses"
        return None
    if not ws.ledger_path.exists():
        raise UserError(f"no ledger at {ws.ledger_path} to resume: start a study with `autorl run`")
    ledger = open_read(ws.ledger_path)
    try:
        study = ledger.study(opts.study_name)
    finally:
        ledger.close()
    check_resume_flags(opts, study)
    opts.strategy, opts.study_name = study.strategy, study.name  # the study found, whatever starts meanwhile
    return study


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
    ws: Workspace, ledger: Ledger, opts: RunOptions, recipe: Recipe, text: str, rel: str, lock: Lock | None
) -> tuple[Study, Lock]:
    """The resumed study's row (its ``lock`` held already), marked running again, or a new study's row with its
    lock taken."""
    if opts.resume:
        study = ledger.study(opts.study_name)  # its budget is every session's, summed (the report's "Budget used")
        ledger.update_study(study.id, status=StudyStatus.RUNNING, budget_s=(study.budget_s or 0.0) + opts.budget_s)
        assert lock is not None  # taken before the resumed study was touched (open_study)
        return ledger.study(study_id=study.id), lock
    base_sha = gitops.head_sha(ws.root)
    with ledger.file.exclusive("name a new study"):
        name = opts.study_name or _free_name(ledger, f"{gitops.slugify(recipe.name)}-{time.strftime('%Y%m%d-%H%M%S')}")
        if ledger.has_study(name):
            raise UserError(f"study {name} exists already: continue it with `autorl run --resume --study {name}`")
        lock = ws.lock_study(name)
        sid = ledger.create_study(
            name=name,
            recipe_path=rel,
            recipe=text,
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
    say(f"preparing backend {state.base.backend} (log: {state.ws.rel(log)}/)")
    code = state.backend.prepare(state.base, state.ws.cache, log)
    if code is not None:
        took = time.time() - t0
        state.records.event(None, "prepare", f"exit {code} in {took:.1f} s")
        if took >= 5 or code:
            say(f"backend {state.base.backend} ready in {took:.0f} s" + (f" (exit {code})" if code else ""))
    return time.time() - t0
