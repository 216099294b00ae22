"""A person's corrections of crash triage: ``autorl triage label`` and ``autorl triage export``.

``label`` records the category (and root-cause line) a person gives a crashed trial in the ledger and adds a local
family to the workspace (``.autorl/triage/families.yaml``), so that later triage in that workspace (``autorl
triage classify``, whatever passes ``local=`` to ``classify``) files the same failure the same way. ``export``
writes the workspace's labelled crashes in the format of the shipped corpus of real logs
(tests/data/crashes_real: ``logs/<id>.log`` and ``labels.yaml``), so a team's failures can grow it.

Every check runs before anything is written: a bad number, category or line is one line (``UserError``, exit 2)
and leaves the ledger and the workspace as they were.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from autorl import gitops
from autorl.errors import UserError, short
from autorl.judge import triage
from autorl.ledger import Ledger, Trial
from autorl.ledger.store import CrashLabel
from autorl.states import CrashCategory, TrialStatus, Verdict
from autorl.workspace import Workspace, write_atomically

LOCAL_PRIORITY = 95  # a person's label outranks every shipped family
CONTEXT_BEFORE, CONTEXT_AFTER = 25, 6  # lines of the log kept around the root line in an export (the corpus's cut)


class Labelled(BaseModel):
    """What ``autorl triage label`` did, for its one-line answer and ``--json``."""

    model_config = ConfigDict(extra="forbid")

    number: int = Field(description="The trial labelled.")
    category: CrashCategory = Field(description="The category given.")
    root_cause_line: str = Field(description="The line given (or triage's, when none was).")
    was: str | None = Field(description="What triage had filed it as.")
    family: str = Field(description="The local family made from the label.")
    families_file: str = Field(description="The workspace's local families file it was written to.")


def local_families_path(ws: Workspace) -> Path:
    """The workspace's own families: ``.autorl/triage/families.yaml``."""
    return ws.run_dir / triage.LOCAL_FAMILIES


def label(ws: Workspace, ledger: Ledger, number: int, word: str, line: str | None) -> Labelled:
    """Record that crashed trial ``number`` is ``word`` (its root cause ``line``, else the one triage chose), and
    add the local family that files its line so from now on. Checked first, then written: the ledger row in one
    transaction, the families file replaced whole."""
    category = _category(word)
    trial = ledger.trial(number)
    if trial.verdict != Verdict.CRASH and trial.status != TrialStatus.CRASH and trial.crash_category is None:
        raise UserError(f"trial {number:02d} did not crash ({trial.status}): only a crash can be labelled")
    root = _root_line(trial, line, _log_text(ws, trial))
    family = local_family(number, category, root)
    path = local_families_path(ws)
    text = _families_text(path, family)
    ledger.crash_labels().add(number, category, root, family.id)
    write_atomically(path, text)
    return Labelled(
        number=number,
        category=category,
        root_cause_line=root,
        was=None if trial.crash_category is None else str(trial.crash_category),
        family=family.id,
        families_file=ws.shown(path),
    )


def _category(word: str) -> CrashCategory:
    names = [c.value for c in CrashCategory if c not in triage.SILENT_CATEGORIES]
    if word not in names:
        raise UserError(f"no crash category {short(word, 40)!r}: use one of {', '.join(names)}")
    return CrashCategory(word)


def _root_line(trial: Trial, line: str | None, log: str | None) -> str:
    """The root-cause line a label names: the one given (a line of the trial's log, when the log is there), else
    the one triage chose."""
    if line is None:
        if not trial.root_cause or not triage.clean(trial.root_cause):
            raise UserError(f"trial {trial.number:02d} has no root-cause line: give one with --line TEXT")
        return trial.root_cause.rstrip()
    if not line.strip() or "\n" in line or "\r" in line:
        raise UserError("--line must be one non-empty line of the trial's log")
    if not triage.clean(line):  # a pattern made of nothing matches every line: every later crash filed as this
        raise UserError(
            f"--line {short(line, 60)!r} is empty once colour codes and log prefixes are removed: give the text of "
            f"the error line, copied from `autorl triage {trial.number}`"
        )
    if len(line) > triage.MAX_LINE_CHARS:
        raise UserError(f"--line is {len(line)} characters: give at most {triage.MAX_LINE_CHARS}")
    if log is not None and not _in_log(line, log):
        raise UserError(
            f"--line {short(line, 60)!r} is not a line of trial {trial.number:02d}'s log: copy it from `autorl triage "
            f"{trial.number}`"
        )
    return line.rstrip()


def _in_log(line: str, log: str) -> bool:
    """Whether ``line`` is a whole line of ``log`` (trailing whitespace and colour codes aside) or, for a line the
    person trimmed, part of one."""
    want = triage.shown(line).strip()
    return any(want == triage.shown(raw).strip() or want in triage.shown(raw) for raw in log.splitlines())


def _log_text(ws: Workspace, trial: Trial) -> str | None:
    """The trial's log (its tail, as triage reads it), or None when the ledger names none or it is gone."""
    if not trial.log_path:
        return None
    path = Path(trial.log_path)
    path = path if path.is_absolute() else ws.root / path
    if not path.is_file() and trial.attempt:  # a workspace moved or copied: its own run folder of that name
        path = ws.runs / trial.attempt / path.name
    return triage.read_tail(path) if path.is_file() else None


def local_family(number: int, category: CrashCategory, line: str) -> triage.Family:
    """The family a label makes: the line's text as a pattern (numbers, addresses and ids free), of the category
    given, above every shipped family."""
    return triage.Family(
        id=f"local_{category}_{triage.signature(category, line).rsplit('-', 1)[1]}",
        category=category,
        priority=LOCAL_PRIORITY,
        confidence=1.0,
        in_warnings=True,
        remedy=f"Labelled {category} in this workspace (trial {number:02d}): {_remedy(category)}",
        messages=[
            triage.Message(
                re=line_pattern(line), lib="this workspace", ver=f"trial {number:02d}", at="autorl triage label"
            )
        ],  # fmt: skip
    )


_VARIABLE = re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-fA-F]{12,}\b|\d+")


def line_pattern(line: str) -> str:
    """A regex matching ``line`` as triage cleans it (prefixes and colours gone) with its numbers, addresses and
    ids free: the same failure in another run, on another rank, at another step."""
    text = triage.clean(line)
    out, at = [], 0
    for m in _VARIABLE.finditer(text):
        out += [re.escape(text[at : m.start()]), r"\w+" if not m.group(0).isdigit() else r"\d+"]
        at = m.end()
    return "".join([*out, re.escape(text[at:])])


def _remedy(category: CrashCategory) -> str:
    """The shipped remedy of the category's first family (a category no family has: the unknown remedy)."""
    rules = triage.load_rules()
    return next((f.remedy for f in rules.families if f.category == category), rules.unknown_remedy)


def _families_text(path: Path, family: triage.Family) -> str:
    """The families file with ``family`` added (a family of the same id replaced), checked as triage will read
    it."""
    families = [f for f in triage.load_local(path) if f.id != family.id] + [family]
    table = triage.LocalFamilies(families=families)
    for pattern in [m.re for m in family.all_messages()]:  # what triage would refuse to read is never written
        problem = triage.local_pattern_problem(pattern)
        if problem:
            raise UserError(
                f"the family for this line would not load: its pattern {short(pattern, 80)!r} {problem}; give "
                f"another --line (see docs/triage.md)"
            )
    data = table.model_dump(exclude_defaults=True, mode="json")
    head = "# Crash families from this workspace's labels (`autorl triage label`); triage reads them first.\n"
    return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=200)


# ---------------------------------------------------------------------------- export


def export(ws: Workspace, ledger: Ledger, out: Path) -> list[dict[str, Any]]:
    """Write the labelled crashes as ``out/logs/<id>.log`` and ``out/labels.yaml`` (the corpus's fields; the split
    is left to the corpus's split.py). Returns the labels written."""
    latest = ledger.crash_labels().latest()
    if not latest:
        raise UserError("no labelled crashes in this workspace: label one first with `autorl triage label N CATEGORY`")
    problem = gitops.path_problem(out)
    if problem:
        raise UserError(f"export folder {short(str(out), 200)} {problem}: pass another --out DIR")
    if out.exists() and not out.is_dir():
        raise UserError(f"{short(str(out), 80)} is a file: give --out a folder")
    entries = [_entry(ws, ledger.trial(n), lab) for n, lab in sorted(latest.items())]
    labels = [entry for entry, _ in entries]
    head = "# Labelled crashes exported by `autorl triage export` (the format of tests/data/crashes_real).\n"
    try:
        (out / "logs").mkdir(parents=True, exist_ok=True)
        for entry, text in entries:
            write_atomically(out / "logs" / f"{entry['id']}.log", text)
        write_atomically(out / "labels.yaml", head + yaml.safe_dump(labels, sort_keys=False, allow_unicode=True))
    except OSError as exc:  # no folder can be made there (/proc, under a file), read-only, full disk
        where = f" ({short(str(exc.filename), 200)})" if exc.filename and Path(exc.filename) != out else ""
        raise UserError(
            f"cannot write the export to {short(str(out), 200)}: {exc.strerror or exc}{where}; pass another --out DIR"
        ) from None
    return labels


def _entry(ws: Workspace, trial: Trial, lab: CrashLabel) -> tuple[dict[str, Any], str]:
    """One corpus label and its log excerpt: the root line is an exact line of the excerpt."""
    log = _log_text(ws, trial)
    text = _cut(log, lab.root_cause_line) if log else lab.root_cause_line
    root = next((ln for ln in text.splitlines() if lab.root_cause_line.strip() in ln), lab.root_cause_line)
    found = triage.classify(text) if log else None
    engine = found.engine if found is not None else "unknown"
    # the remedy of the family that files this very log, where it agrees with the label; else the category's
    category = CrashCategory(lab.category)
    action = found.remedy if found is not None and found.category == category else _remedy(category)
    entry = {
        "id": f"{engine}-autorl-trial-{trial.number:02d}-{str(lab.category).replace('_', '-')}_01",
        "category": str(lab.category),
        "root_cause_line": root,
        "action": action,
        "library": engine,
        "versions": None,
        "source": f"autorl workspace trial {trial.number:02d} ({trial.attempt})",
        "thread": None,
        "exit_code": trial.exit_code,
        "split": None,
    }
    return entry, text


def _cut(log: str, root: str) -> str:
    """The part of the log around the root line's first occurrence, trailing whitespace stripped (the corpus's
    convention)."""
    lines = [ln.rstrip() for ln in triage.log_lines(log)]
    want = triage.shown(root).strip()
    idx = next((i for i, ln in enumerate(lines) if want in triage.shown(ln)), len(lines) - 1)
    return "\n".join(lines[max(0, idx - CONTEXT_BEFORE) : idx + CONTEXT_AFTER + 1]) + "\n"
