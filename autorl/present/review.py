"""The review commands' data and rendering: ledger table, one trial, crash groups.

Each ``*_rows``/``show_*`` function returns plain JSON-able data (what ``--json``
prints); each ``print_*`` renders it with rich. Shapes are documented in
docs/cli.md.
"""

from __future__ import annotations

import math
import os
import re
import textwrap
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from autorl import gitops, loading
from autorl.backends.ray_demand import WAITING
from autorl.budget import format_duration
from autorl.errors import GitError, NotFoundError
from autorl.judge import diagnose, gains, triage
from autorl.ledger import Ledger, Study, Trial
from autorl.locks import describe, pid_alive
from autorl.present import errors, findings
from autorl.recipe import Recipe, dump_values
from autorl.search import hypotheses
from autorl.states import Confirmation, CrashCategory, Gate, Kind, Proposer, StudyStatus, TrialStatus, Verdict
from autorl.workspace import Workspace

LEDGER_FIELDS = [
    "number",
    "attempt",
    "proposer",
    "hypothesis",
    "why",
    "changed",
    "status",
    "verdict",
    "confirmation",
    "objective",
    "delta",
    "ci_low",
    "ci_high",
    "method",
    "n_items",
    "parent",
    "gain_vs_baseline",
    "gap_to_best",
    "confirms",
    "duration_s",
    "crash_category",
    "reason",
    "fp_rate",
    "confirm_fp_rate",
    "kind",
    "promoted_from",
    "gate",
]


class LedgerRows(list[dict]):
    """``ledger_rows``' trials (a plain list to ``--json``), with the study they belong to (None: the ledger has no
    study yet) and, when the ledger holds others, which one this is and how to see another."""

    def __init__(self, rows: Iterable[dict], study: str | None = None, others: str = "") -> None:
        super().__init__(rows)
        self.study, self.others = study, others


def ledger_rows(
    ledger: Ledger, verdict: Verdict | None = None, last: int | None = None, study: str | None = None
) -> LedgerRows:
    """The trials of ``study`` (default: the latest study, as every review command) as dicts with LEDGER_FIELDS,
    oldest first; a confirmed recipe also has ``baseline_gain``, its gain over the study's baseline measured on its
    fresh-seed runs (``autorl.judge.gains``)."""
    shown = _study_or_none(ledger, study)
    if shown is None:
        return LedgerRows([])
    rows = ledger.trials(shown.id, **({"verdict": verdict} if verdict else {}))
    rows = rows[-last:] if last else rows
    measured = _baseline_gains(ledger, {r.study_id for r in rows if r.confirmation == Confirmation.CONFIRMED})
    out = LedgerRows([], shown.name, _others(ledger, shown))
    for r in rows:
        g = measured.get(r.number)
        out.append(
            {
                **_columns(r, LEDGER_FIELDS),
                "baseline_gain": {"delta": g.delta, "ci_low": g.ci_low, "ci_high": g.ci_high, "level": g.level}
                if g
                else None,
            }
        )
    return out


def _study_or_none(ledger: Ledger, name: str | None) -> Study | None:
    """Study ``name`` (``NotFoundError`` when there is none), or the latest; None when no study was run yet."""
    if name:
        return ledger.study(name)
    latest = ledger.studies(limit=1)
    return latest[0] if latest else None


STUDIES_COUNTED = 1000  # more studies than this in one ledger are counted as "1000+"


def _others(ledger: Ledger, shown: Study) -> str:
    """'' when ``shown`` is the ledger's only study; else which of them it is and how to see another."""
    studies = ledger.studies(limit=STUDIES_COUNTED + 1)
    if len(studies) < 2:
        return ""
    n = f"{STUDIES_COUNTED}+" if len(studies) > STUDIES_COUNTED else str(len(studies))
    which = "the latest" if studies[0].id == shown.id else "one"
    return f"{which} of {n} studies in this ledger; --study NAME shows another"


def ledger_title(rows: list[dict]) -> str:
    """'17 trials of study NAME', and when the ledger has others, which of them it is and how to see another."""
    title = findings.counted(len(rows), "trial")
    if not isinstance(rows, LedgerRows) or rows.study is None:
        return title
    return f"{title} of study {rows.study}" + (f" ({rows.others})" if rows.others else "")


def _columns(row: Trial, names: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The row's columns ``names``, in that order, as the JSON output holds them (states as their words)."""
    every = row.as_dict()
    return {k: every[k] for k in names}


def _baseline_gains(ledger: Ledger, study_ids: set[int]) -> dict[int, gains.Gain]:
    out: dict[int, gains.Gain] = {}
    for sid in study_ids:
        out.update(gains.study_gains(ledger, ledger.study(study_id=sid)))
    return out


def print_ledger(rows: list[dict]) -> None:
    c = _console()
    if c.width < WIDE:
        return _print_records(c, ledger_title(rows), [_ledger_record(r) for r in rows])
    table = Table(title=ledger_title(rows), show_lines=False)
    for col in (
        "NN",
        "proposer / hypothesis",
        "changed",
        "verdict",
        "objective",
        "Δ vs parent [95% CI]",
        "Δ vs baseline",
        "time",
    ):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            f"{r['number']:02d}",
            _who(r["proposer"], r["hypothesis"], r["confirms"]),
            dump_values(r.get("changed") or {}) or "-",
            _verdict_cell(r),
            _num(r.get("objective")),
            _record_delta(r),
            _vs_baseline(r),
            format_duration(r.get("duration_s") or 0),
        )
    c.print(table)


WIDE = 100  # below this many columns (a narrow terminal, or output piped: 80) tables become records


def _console() -> Console:
    return Console()


def _ledger_record(r: dict) -> tuple[str, str]:
    """One trial in two lines: the numbers, then who proposed it and what it changed."""
    head = (
        f"{r['number']:02d}  {_verdict_cell(r)}  objective {_num(r.get('objective'))}  Δ {_record_delta(r)}  "
        f"{format_duration(r.get('duration_s') or 0)}"
    )
    base = f"; Δ vs baseline {_vs_baseline(r)}" if _vs_baseline(r) != "-" and r.get("kind") != Kind.FULL else ""
    who = _who(r["proposer"], r["hypothesis"], r["confirms"])
    return head, f"{who}: {dump_values(r.get('changed') or {}) or 'nothing changed'}{base}"


def _print_records(c: Console, title: str, records: list[tuple[str, str]]) -> None:
    """A title, then per record a head line (may hold colour markup) and an indented, wrapped detail line."""
    c.print(f"[bold]{title}[/]")
    for head, detail in records:
        c.print(head, highlight=False)
        c.print(
            textwrap.fill(detail, width=c.width, initial_indent="    ", subsequent_indent="    "),
            markup=False,
            highlight=False,
        )


def _who(proposer: str | None, hypothesis: str | None, confirms: int | None) -> str:
    """'move / h13-flat-learning', 'confirm (re-runs 05)'."""
    who = f"{proposer}" + (f" / {hypothesis}" if hypothesis else "")
    return who + (f" (re-runs {confirms:02d})" if confirms is not None else "")


VERDICT_COLOURS: dict[str, str] = {
    Verdict.IMPROVED: "green",
    Verdict.REGRESSED: "red",
    Verdict.CRASH: "bold red",
    Verdict.PRUNED: "yellow",
    Verdict.FLAT: "white",
}
CONFIRMATION_COLOURS: dict[str, str] = {
    Confirmation.CONFIRMED: "green",
    Confirmation.SUSPECT: "yellow",
    Confirmation.REJECTED: "cyan",
}


def _verdict_cell(r: dict) -> str:
    v = r.get("verdict") or r.get("status") or "-"
    colour = VERDICT_COLOURS.get(v)
    extra = f" ({r['crash_category']})" if r.get("crash_category") else ""
    if v == Verdict.IMPROVED and r.get("confirmation"):
        extra = f" ({r['confirmation']})"  # candidate until fresh-seed re-runs confirm or reject it
        colour = CONFIRMATION_COLOURS.get(r["confirmation"], "cyan")
    return f"[{colour}]{v}{extra}[/]" if colour else v + extra


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def _delta(delta: float | None, ci_low: float | None, ci_high: float | None, kind: str | None) -> str:
    """The gain over the parent with its interval; a full run's is its re-validation at trial length against the
    baseline, and says so (its own objective is at full length, with no full-length baseline beside it)."""
    if delta is None:
        return "-"
    ci = f" [{ci_low:+.3f}, {ci_high:+.3f}]" if ci_low is not None and ci_high is not None else ""
    full = " (re-validation at trial length, vs the baseline)" if kind == Kind.FULL else ""
    return f"{delta:+.4f}{ci}{full}"


def _record_delta(r: dict) -> str:
    """``_delta`` of a trial record of ``ledger_rows``."""
    return _delta(r["delta"], r["ci_low"], r["ci_high"], r["kind"])


def _vs_baseline(r: dict) -> str:
    """The gain over the baseline: measured with its interval for a confirmed recipe, else the trial's own run's."""
    g = r.get("baseline_gain")
    if g:
        return f"{g['delta']:+.4f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}] ({findings.measured_on(g['level'])})"
    return "-" if r.get("gain_vs_baseline") is None else f"{r['gain_vs_baseline']:+.4f}"


def show_trial(ws: Workspace, ledger: Ledger, number: int) -> dict[str, Any]:
    """Everything about one trial: its row (a ``Trial``: ``--json`` writes its columns), diff vs the baseline,
    metric summary, evals, log tail."""
    row = ledger.trial(number)
    metrics = ledger.metrics(row.id)
    steps = [m for m in metrics if m.get("type", "step") == "step"]
    evals = [{k: v for k, v in m.items() if not k.endswith("items")} for m in metrics if m.get("type") == "eval"]
    base = _baseline_tag(ledger, row)
    try:
        diff = gitops.diff(ws.root, base, row.start_tag) if base and row.start_tag and base != row.start_tag else ""
    except GitError:
        diff = (
            f"(no diff: {row.start_tag} or {base} is gone, e.g. removed by `autorl clean`; the ledger keeps "
            "the trial's values: see `changed` above)"
        )
    return {
        "trial": row,
        "diff_vs_baseline": diff,
        "baseline_tag": base,
        "steps": len(steps),
        "refs_gone": _refs_gone(ws, row),
        "curve": {k: [s.get(k) for s in steps] for k in ("reward_mean", "kl", "grad_norm", "clip_ratio")},
        "evals": evals,
        "log_tail": _tail(row.log_path, 15),
    }


def _baseline_tag(ledger: Ledger, row: Trial) -> str | None:
    base = ledger.baselines(row.study_id)
    return base[0].start_tag if base else None


SHOWN_TAIL_BYTES = 256 << 10  # of a trial's log, what `show` reads for its last lines


def _tail(path: str | None, n: int) -> list[str]:
    """The log's last ``n`` lines ([] when the ledger names none or it is gone; one line saying so when it cannot
    be read: a folder, a FIFO or a device is never opened for reading, and only the tail is read)."""
    text, problem = _log_text(path, SHOWN_TAIL_BYTES)
    return [problem] if problem else text.splitlines()[-n:]


def _log_text(path: str | None, limit: int) -> tuple[str, str | None]:
    """The last ``limit`` bytes of a trial's log as text, and what stopped it being read ('' with no problem when
    there is no log)."""
    if not path or not os.path.lexists(path):
        return "", None
    try:
        return loading.tail_bytes(path, limit).decode("utf-8", errors="replace"), None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        return "", f"(the log {path} {reason if reason.startswith('is ') else f'cannot be read ({reason})'}: not shown)"


def _ref_names(t: Trial) -> list[str]:
    return [n for n in (t.branch, t.start_tag, t.end_tag) if n]


def _refs_gone(ws: Workspace, row: Trial) -> list[str]:
    """The trial's branch and tags no longer in the repository (one listing of its refs; none when it cannot be
    read)."""
    try:
        existing = gitops.refs(ws.root)
    except GitError:
        return []
    return [n for n in _ref_names(row) if n not in existing]


def _refs_line(t: Trial, gone: list[str], sha: str) -> str:
    """The trial's branch and tags, and which of them are no longer in the repository."""
    if not gone:
        return f"refs: branch {t.branch}, tags {t.start_tag} {t.end_tag or ''} ({sha})"
    kept = [n for n in _ref_names(t) if n not in gone]
    return (
        f"refs: {', '.join(kept) or 'none left'} ({sha}); gone from the repository: {', '.join(gone)} "
        "(removed by `autorl clean` or by hand; the ledger keeps the values)"
    )


def print_show(d: dict) -> None:
    c, t = Console(), d["trial"]
    say = lambda text: c.print(text, markup=False, highlight=False)  # noqa: E731  (values may hold [brackets])
    delta = _delta(t.delta, t.ci_low, t.ci_high, t.kind)
    c.print(
        Text.assemble(
            (t.attempt, "bold"),
            f"  {t.status}  verdict {t.verdict or '-'}  objective {_num(t.objective)}  Δ {delta}",
        ),
        highlight=False,
    )
    say(f"proposer {_who(t.proposer, t.hypothesis, t.confirms)}; why: {t.why}")
    sha = (t.start_sha or "")[:10]
    say(_refs_line(t, d.get("refs_gone") or [], sha))
    say(f"changed: {dump_values(t.changed or {}) or 'nothing (baseline)'}")
    if t.warm_pool:
        say(
            f"ran in warm pool {t.warm_pool}: "
            + ("built it (a cold start)" if not t.warm_index else f"its trial {t.warm_index + 1}, after a reset")
        )
    if t.reason:
        say(f"verdict: {noise_words(t.reason)}")  # what the gain is against (the parent) and what confirmed it
    for line in errors.lines(t):  # the test, each arm's assumed run noise, the calibrated false-positive rate
        say(line)
    for line in gate_lines(t):
        say(line)
    if d["diff_vs_baseline"]:
        c.print(f"[bold]diff vs {d['baseline_tag']}[/]")
        say(d["diff_vs_baseline"])
    for key, values in d["curve"].items():
        vals = [v for v in values if isinstance(v, (int, float))]
        if vals:
            say(f"{key:>12} {sparkline(vals)}  {vals[0]:.3g} → {vals[-1]:.3g}")
    for e in d["evals"][-3:]:
        say(f"eval @{e.get('step')}: {dump_values({k: v for k, v in e.items() if k.startswith('eval/')})}")
    if t.crash_category:
        c.print(Text.assemble((f"crash {t.crash_category}", "red"), f": {triage.shown(t.root_cause)}"), highlight=False)
        say(f"remedy: {t.remedy}")
    if d["log_tail"]:
        c.print("[bold]log tail[/]")
        say("\n".join(d["log_tail"]))


RAW_ESTIMATE = re.compile(r"\(raw replicate estimate ([-+]?\d[\d.]*(?:e[-+]?\d+)?) over (\d+) df\)")


def noise_words(reason: str) -> str:
    """A verdict's reason with its run noise in words that fit their names. The verdict's note gives the parent's
    raw replicate estimate beside its sd, but that estimate is a variance (method of moments, unclipped): it is
    negative when the replicate runs varied less than item sampling alone explains, which is no sd. A positive
    one is shown as the sd it stands for; a negative one as the variance it is, with what it means."""

    def words(m: re.Match[str]) -> str:
        value, df = float(m.group(1)), m.group(2)
        if value >= 0:
            return f"(raw replicate sd {math.sqrt(value):.3g} over {df} df)"
        return (
            f"(raw replicate variance {value:.2g} over {df} df, below zero: the runs varied no more than item "
            "sampling explains; the sd pools it with the prior)"
        )

    return RAW_ESTIMATE.sub(words, reason)


GATE_HEADS = {
    Gate.OK: "hack gate: passed",
    Gate.SUSPECT: "hack gate: SUSPECT (not promoted without --force)",
    Gate.BLIND: "hack gate: blind (no held-out task metric)",
}


def gate_lines(t: Trial) -> list[str]:
    """The hack gate's answer for a trial and each check's evidence (none when the gate never ran)."""
    if not t.gate:
        return []
    mark = {True: "ok", False: "FAILED", None: "not measured"}
    head = GATE_HEADS.get(t.gate, f"hack gate: {t.gate}")
    return [head] + [f"  {c['name']}: {mark[c.get('ok')]}: {c.get('detail', '')}" for c in t.gate_checks or []]


def sparkline(values: list[float], width: int = 40) -> str:
    """A one-line curve of ``values`` (resampled to ``width``)."""
    blocks = "▁▂▃▄▅▆▇█"
    if len(values) > width:
        values = [values[int(i * len(values) / width)] for i in range(width)]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return "".join(blocks[min(7, int((v - lo) / span * 7.999))] for v in values)


def crash_groups(ledger: Ledger) -> list[dict]:
    """Crashed trials grouped by signature, most frequent first."""
    rows = ledger.crashed()
    decided = crash_actions(ledger)
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(
            r.crash_signature or "unknown",
            {
                "signature": r.crash_signature,
                "category": r.crash_category,
                "count": 0,
                "root_cause_line": triage.shown(r.root_cause),
                "remedy": r.remedy,
                "attempts": [],
                "actions": [],
            },
        )
        g["count"] += 1
        g["attempts"].append(r.number)
        retries = ledger.trials(retry_of=r.number)
        g["actions"] += decided.get(r.id, [])
        g["actions"] += [f"retried as {x.attempt} ({x.verdict or x.status})" for x in retries]
    for g in groups.values():
        g["actions"].append("told Optuna FAIL" + _region(g["category"], g["count"]))
    return sorted(groups.values(), key=lambda g: -g["count"])


def _region(category: CrashCategory | None, count: int) -> str:
    """What repeats of a crash did to the search's region, as the rules table says: avoided once the signature
    reached the repeat limit, never for a category the trial's values cannot cause (a card others filled)."""
    if not triage.avoids(category):
        return "; region not avoided (the trial's values did not cause it)"
    return "; region avoided after repeats" if count >= triage.repeat_limit() else ""


def crash_actions(ledger: Ledger) -> dict[int, list[str]]:
    """Trial row id -> what the controller decided about its crash and why ('crash-action' events)."""
    out: dict[int, list[str]] = {}
    for e in reversed(ledger.events(None, limit=100_000)):
        if e.kind == "crash-action" and e.trial_id is not None:
            out.setdefault(e.trial_id, []).append(e.message.split(": ", 1)[-1])
    return out


def print_crash_groups(groups: list[dict]) -> None:
    c = Console()
    if not groups:
        c.print("no crashes")
    for g in groups:
        attempts = ", ".join(f"{n:02d}" for n in g["attempts"])
        c.print(
            Text.assemble(
                (str(g["category"]), "bold red"), f" ×{g['count']}  signature {g['signature']}  attempts {attempts}"
            ),
            highlight=False,
        )
        c.print(f"  root cause: {g['root_cause_line']}", markup=False, highlight=False)
        c.print(f"  remedy: {g['remedy']}\n  done: {'; '.join(g['actions'])}", markup=False, highlight=False)


def trial_triage(ledger: Ledger, number: int) -> dict[str, Any]:
    """One trial's diagnosis with the log excerpt around its root cause."""
    row = ledger.trial(number)
    log, problem = _log_text(row.log_path, triage.TAIL_BYTES)
    if row.status != TrialStatus.CRASH and not row.crash_category:
        return {
            "attempt": row.attempt,
            "status": row.status,
            "verdict": row.verdict,
            "category": None,
            "message": "this trial did not crash",
            "reason": row.reason,
        }
    return {
        "attempt": row.attempt,
        "status": row.status,
        "category": row.crash_category,
        "root_cause_line": triage.shown(row.root_cause),
        "remedy": row.remedy,
        "signature": row.crash_signature,
        "actions": crash_actions(ledger).get(row.id, []),
        "excerpt": problem or (triage.excerpt(log, row.root_cause or "") if log else ""),
    }


def format_trial_triage(d: dict) -> str:
    if not d.get("category"):
        return f"{d['attempt']}: {d['status']} ({d.get('verdict') or '-'}): this trial did not crash"
    return (
        f"{d['attempt']}: {d['category']}\nroot cause: {d['root_cause_line']}\nremedy: {d['remedy']}\n"
        f"signature: {d['signature']}\n"
        + "".join(f"done: {a}\n" for a in d.get("actions", []))
        + f"--- log excerpt ---\n{d['excerpt']}"
    )


def hypothesis_rows(ws: Workspace, ledger: Ledger | None) -> list[dict]:
    """Seed 002's status table: id, title, priority, status, confidence, counts, and what the trials found:
    trials tried (by a move rule or a ranked proposal), candidates, confirmed, and the confirmed gain over the
    parent (the best, as the mean of the fresh-seed runs minus the parent's mean)."""
    dirs = [hypotheses.SHIPPED_DIR] + [d for d in [ws.root / "hypotheses"] if d.is_dir()]
    trials = ledger.trials() if ledger else []
    found = ledger.hypothesis_counts() if ledger else {}
    recipe = _study_recipe(ledger)
    settings, objective = (recipe.verdict, recipe.objective) if recipe is not None else (None, None)
    rows = []
    for h in hypotheses.load_library(dirs):
        st = hypotheses.status(h, trials, settings, objective)
        found_gains = [
            g
            for g in (
                confirmed_gain(t, trials)
                for t in trials
                if t.hypothesis == h.id and t.confirmation == Confirmation.CONFIRMED
            )
            if g is not None
        ]
        rows.append(
            {
                "id": h.id,
                "title": h.title,
                "priority": h.priority,
                "status": st.status,
                "confidence": st.confidence,
                "counts": st.counts,
                "demoted": st.demoted,
                "trials": found.get(h.id, dict.fromkeys(("tried", "moves", "candidates", "confirmed", "rejected"), 0)),
                "confirmed_gain": max(found_gains) if found_gains else None,
                "detectable": st.detectable,
                "note": st.note,
                "symptoms": h.symptoms,
                "backends": h.backends,
                "source": h.source,
            }
        )
    return rows


def _study_recipe(ledger: Ledger | None) -> Recipe | None:
    """The latest study's recipe (None: no study, or one that no longer validates: the defaults apply)."""
    try:
        return gains.study_recipe(ledger.study()) if ledger else None
    except NotFoundError:
        return None


def confirmed_gain(candidate: Trial, trials: list[Trial]) -> float | None:
    """The mean objective of a candidate's fresh-seed confirmation runs minus its parent's mean (the parent's
    own run and its confirmation runs; the study's baseline runs when the parent is the baseline)."""
    fresh = _objectives(t for t in trials if t.confirms == candidate.number)
    parent = candidate.parent
    if parent is None:
        base = _objectives(t for t in trials if t.proposer == Proposer.BASELINE and t.study_id == candidate.study_id)
    else:
        base = _objectives(t for t in trials if t.number == parent or t.confirms == parent)
    if not fresh or not base:
        return None
    return sum(fresh) / len(fresh) - sum(base) / len(base)


def _objectives(rows: Iterable[Trial]) -> list[float]:
    return [t.objective for t in rows if t.status == TrialStatus.COMPLETE and t.objective is not None]


def print_hypotheses(rows: list[dict]) -> None:
    c = _console()
    if c.width < WIDE:
        return _print_records(c, "hypotheses", [_hypothesis_record(r) for r in rows])
    table = Table(title="hypotheses")
    table.add_column("id", no_wrap=True)
    for col in ("priority", "status", "confidence", "tried", "confirmed", "gain", "title"):
        table.add_column(col, overflow="fold")
    for r in rows:
        n = r["trials"]
        table.add_row(
            r["id"],
            r["priority"],
            r["status"] + (" (demoted)" if r["demoted"] else ""),
            r["confidence"],
            _tried_cell(n),
            f"{n['confirmed']}/{n['candidates']}",
            _gain(r),
            r["title"] + (f" ({r['note']})" if r.get("note") else ""),
        )
    c.print(table)


def _tried_cell(n: dict) -> str:
    return str(n["tried"]) + (f" ({n['moves']} moves)" if n["moves"] else "")


def _gain(r: dict) -> str:
    return "-" if r["confirmed_gain"] is None else f"{r['confirmed_gain']:+.4f}"


def _hypothesis_record(r: dict) -> tuple[str, str]:
    n = r["trials"]
    status = r["status"] + (" (demoted)" if r["demoted"] else "")
    head = (
        f"{r['id']}  {r['priority']}  {status}  confidence {r['confidence']}  tried {_tried_cell(n)}, "
        f"confirmed {n['confirmed']} of {n['candidates']} candidates, gain over parent {_gain(r)}"
    )
    return head, r["title"] + (f" ({r['note']})" if r.get("note") else "")


def diagnose_trial(ledger: Ledger, number: int | None) -> dict[str, Any]:
    """The diagnosis of one trial's metrics: trial ``number``, else the latest study's best confirmed recipe (what
    ``autorl promote`` would pick), else its baseline."""
    row, which = (ledger.trial(number), "") if number is not None else _default_diagnosed(ledger)
    metrics = ledger.metrics(row.id)
    steps = [m for m in metrics if m.get("type", "step") == "step"]
    evals = [m for m in metrics if m.get("type") == "eval"]
    d = diagnose.diagnose(steps, evals, row.params or {})
    rules = diagnose.load_rules()
    row_rule = next((b for b in rules.bottlenecks if b.name == d.bottleneck), rules.default)
    return {
        "attempt": row.attempt,
        "number": row.number,
        "which": which,
        "bottleneck_description": row_rule.description,
        **d.model_dump(),
    }


def _default_diagnosed(ledger: Ledger) -> tuple[Trial, str]:
    st = ledger.study()
    best = gains.ranked(gains.study_gains(ledger, st))
    if best:
        return ledger.trial(best[0].number), "the study's best confirmed recipe"
    base = [t for t in ledger.baselines(st.id) if t.status == TrialStatus.COMPLETE and ledger.metrics(t.id)]
    if not base:
        raise NotFoundError(
            f"study {st.name} has no finished baseline with metrics yet: name a trial "
            "(`autorl diagnose NN`) or run a study first"
        )
    return base[0], "the study's baseline: nothing is confirmed yet"


OPS_TEXT = {"lt": "<", "le": "≤", "gt": ">", "ge": "≥", "abs_lt": "|x| <", "abs_gt": "|x| >"}


def format_diagnosis(d: dict) -> str:
    """The diagnosis in words: which trial and why, the bottleneck, where to look first, each symptom's numbers."""
    which = f" ({d['which']}; `autorl diagnose NN` for another trial)" if d.get("which") else ""
    lines = [
        f"{d['attempt']}{which}",
        f"bottleneck: {d['bottleneck']}: {d.get('bottleneck_description') or ''}".rstrip(": "),
    ]
    leads = list(dict.fromkeys(x for s in d["symptoms"] for x in s.get("look_at") or []))
    if leads:
        lines.append(f"look at first: {'; '.join(leads)}")
    if d["areas"]:
        lines.append(f"then: {', '.join(d['areas'])}")
    for s in d["symptoms"]:
        lines.append(f"- {s['name']}: {s['description']}")
        lines += [f"    {_evidence(e)}" for e in s["evidence"]]
    if not d["symptoms"]:
        lines.append(f"- no symptoms in {d['steps']} steps and {d['evals']} evals")
    if d.get("unavailable"):
        lines.append(f"not judged (metrics the backend does not report): {', '.join(d['unavailable'])}")
    return "\n".join(lines)


def _evidence(e: dict) -> str:
    """'delta of reward_mean (last points against the first) = 0.0031, |x| < 0.02, over 40 points'."""
    window = (
        "last points against the first"
        if e["stat"] in ("delta", "rel_change")
        else {"head": "first points", "tail": "last points"}.get(e["window"], "")
    )
    return (
        f"{e['stat']} of {e['metric']}{f' ({window})' if window else ''} = {e['value']:.4g}, "
        f"{OPS_TEXT.get(e['op'], e['op'])} {e['threshold']:.4g}, over {e['points']} points"
    )


def status_rows(ledger: Ledger, ws: Workspace | None = None) -> dict[str, Any]:
    """Studies, running trials and full runs with their latest step and eval. With the workspace, a study marked
    running that no controller holds (killed, or stopped by a lost ledger or a full disk) shows as interrupted."""
    running, watchers, metric = [], _Watchers(ledger, ws), _Objectives(ledger)
    for r in ledger.unfinished():
        metrics = ledger.metrics(r.id)
        steps = [m for m in metrics if m.get("type", "step") == "step"]
        evals = [{k: v for k, v in m.items() if not k.endswith("items")} for m in metrics if m.get("type") == "eval"]
        running.append(
            {
                "attempt": r.attempt,
                "number": r.number,
                "metric": metric.of(r.study_id),
                "kind": r.kind,
                "status": r.status,
                "pid": r.pid,
                "step": steps[-1].get("step") if steps else 0,
                "last_eval": evals[-1] if evals else None,
                "promoted_from": r.promoted_from,
                "job_id": r.job_id,
                "waiting": _waiting(r) if _ray_job_only(r.job_id, r.pid) and not steps else None,
                **watchers.liveness(r),
            }
        )
    studies = ledger.studies(limit=5)
    full = [
        {
            "attempt": r.attempt,
            "status": r.status,
            "objective": r.objective,
            "reason": r.reason,
            "promoted_from": r.promoted_from,
            "end_tag": r.end_tag,
        }
        for r in ledger.trials(kind=Kind.FULL)
    ]
    out: dict[str, Any] = {"studies": [_study_status(s, ws) for s in studies], "running": running, "full_runs": full}
    if ws is not None and (promoting := ws.promote_holder()) is not None:
        out["promote"] = promoting  # {pid, host, since, what}: a promote re-validating now
    return out


def study_status(ledger: Ledger, ws: Workspace, name: str) -> dict[str, Any]:
    """Study ``name``'s status row (``NotFoundError`` naming the studies there are when there is none)."""
    return _study_status(ledger.study(name), ws)


INTERRUPTED = "interrupted"  # how status shows a study marked running that no controller holds


def _study_status(s: Study, ws: Workspace | None) -> dict[str, Any]:
    row: dict[str, Any] = {"name": s.name, "status": s.status, "strategy": s.strategy, "budget_s": s.budget_s}
    if ws is not None and s.status == StudyStatus.RUNNING:
        holder = ws.study_holder(s.name)
        row["controller_pid"] = (holder or {}).get("pid")
        if holder is None:
            row["status"] = f"{INTERRUPTED} (no controller runs it: `autorl run --resume --study {s.name}` goes on)"
    return row


def headline_due(status_row: dict[str, Any]) -> bool:
    """Whether a study's status row (``study_status``) is past running: a study's headline waits for its end."""
    return not f"{status_row['status']}".startswith((StudyStatus.RUNNING, INTERRUPTED))


LOG_TAIL_BYTES = 4096


def _waiting(r: Trial) -> str | None:
    """What a Ray job's trial still waits for on its cluster: its log's last line, when that is the controller's
    note that the job waits for resources other jobs hold (nothing came from the job since)."""
    prefix = f"autorl: {WAITING}"  # as RayJobHandle.waiting writes it
    try:
        lines = loading.tail_bytes(r.log_path or "", LOG_TAIL_BYTES).decode(errors="replace").strip().splitlines()
    except (OSError, ValueError):  # no log, or not a regular file (a FIFO is never waited on)
        return None
    last = lines[-1] if lines else ""
    return last[len(prefix) :] if last.startswith(prefix) else None


class _Watchers:
    """Whether a running row's work is alive, and what says so: its own process (a local trial, a full run's
    monitor) or, for a trial that is a Ray job (no process on this machine), the controller that watches the job,
    which holds its study's lock."""

    def __init__(self, ledger: Ledger, ws: Workspace | None) -> None:
        self.ledger, self.ws = ledger, ws
        self.holders: dict[int, dict | None] = {}

    def liveness(self, r: Trial) -> dict[str, Any]:
        if r.kind == Kind.FULL and self.ws is not None:  # its monitor, by the record promote wrote
            if host := self.ws.monitor_elsewhere(r.number):
                return {"alive": True, "watched_by": None, "host": host}  # another machine's: not probed here
            return {"alive": self.ws.monitor_alive(r.number, r.pid), "watched_by": None}
        if not _ray_job_only(r.job_id, r.pid):
            return {"alive": pid_alive(r.pid), "watched_by": None}
        holder = self._holder(r.study_id)  # {} while held by a controller whose record cannot be read
        return {"alive": holder is not None, "watched_by": (holder or {}).get("pid")}

    def _holder(self, study_id: int | None) -> dict | None:
        if self.ws is None or study_id is None:
            return None
        if study_id not in self.holders:
            self.holders[study_id] = self.ws.study_holder(self.ledger.study(study_id=study_id).name)
        return self.holders[study_id]


class _Objectives:
    """The objective's metric of each study (None: a study whose recipe no longer validates), read once."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.known: dict[int | None, str | None] = {}

    def of(self, study_id: int | None) -> str | None:
        if study_id not in self.known:
            recipe = gains.study_recipe(self.ledger.study(study_id=study_id)) if study_id is not None else None
            self.known[study_id] = recipe.objective.metric if recipe is not None else None
        return self.known[study_id]


def _ray_job_only(job_id: str | None, pid: int | None) -> bool:
    """A running row whose work is a Ray job with no process of its own on this machine."""
    return bool(job_id) and not pid


def _running_line(r: dict) -> str:
    """'running attempt-05-… (trial): step 3 eval/id/…=0.5 alive (Ray job …, watched by controller pid 12)'."""
    ev = _eval_text(r)
    head = f"running {r['attempt']} ({r['kind']}): step {r['step']}{f' {ev}' if ev else ''}"
    if r.get("host"):
        return f"{head} on {r['host']} (its monitor; not checked from here)"
    if not _ray_job_only(r["job_id"], r["pid"]):
        return f"{head} {'alive' if r['alive'] else 'NOT RUNNING'}"
    if r["alive"]:
        by = f"controller pid {r['watched_by']}" if r.get("watched_by") else "its study's controller"
        waits = f"; waiting for the cluster: {r['waiting']}" if r.get("waiting") else ""
        return f"{head} alive (Ray job {r['job_id']}, watched by {by}{waits})"
    return (
        f"{head} NOT WATCHED (Ray job {r['job_id']}: no controller runs its study; "
        "`autorl run --resume` stops the job and goes on)"
    )


def _eval_text(r: dict) -> str:
    """The last eval as the one metric that matters while a trial runs, its study's objective (else the first
    eval metric), and how many more there are: an eval logs a dozen, too many for one line."""
    values = {k: v for k, v in (r["last_eval"] or {}).items() if k.startswith("eval/") and isinstance(v, (int, float))}
    if not values:
        return ""
    key = r.get("metric") if r.get("metric") in values else next(iter(values))
    more = len(values) - 1
    rest = f" (+{more} more: autorl show {r['number']})" if more and r.get("number") is not None else ""
    return f"{key}={values[key]:.3f}{rest}"


def format_status(d: dict, width: int = 88) -> str:
    """The latest study's headline once it has stopped (``autorl.present.findings``), then what is running."""
    f = d.get("findings")
    lines = [f"study {s['name']}: {s['status']} ({s['strategy']})" for s in d["studies"][:1]]
    lines = [part for line in lines for part in findings.wrap(line, width)]
    if f:
        lines += findings.headline(f, width) + [""]
    rest = [_running_line(r) for r in d["running"]]
    if d.get("promote"):
        rest.append(f"{d['promote'].get('what') or 'promote'} ({describe(d['promote'])})")
    for x in [] if f else d["full_runs"]:
        rest.append(f"full run {x['attempt']} from {x['promoted_from']:02d}: {x['status']} {x.get('reason') or ''}")
    if not d["running"] and not d.get("promote"):
        rest.append("nothing running")
    return "\n".join(lines + [part for line in rest for part in findings.wrap(line, width)]).strip()


def format_clean(d: dict, dry_run: bool) -> str:
    """``autorl clean``'s plan or result in words."""
    gone = (
        f"{len(d['branches'])} branches, {len(d['tags'])} tags and {len(d['worktrees'])} worktrees of "
        f"{len(d['removed_trials'])} trials"
    )
    lines = [
        f"study {d['study']}: " + (f"would remove {gone} (dry run: nothing removed)" if dry_run else f"removed {gone}")
    ]
    kept: dict[str, list[str]] = {}
    for n, why in d["kept"].items():
        kept.setdefault(why, []).append(n)
    lines.append("kept: " + ("; ".join(f"{why} {', '.join(ns)}" for why, ns in kept.items()) or "nothing"))
    lines += [f"not removed: branch {b} is checked out in a worktree" for b in d["checked_out"]]
    lines.append(
        "The ledger keeps every trial's record; a removed trial's `autorl show` has no diff any more."
        + (" Run again without --dry-run to remove them." if dry_run and d["branches"] + d["tags"] else "")
    )
    return "\n".join(lines)


def format_dry_run(d: dict) -> str:
    """``autorl train --dry-run``: the launch plan's fields, then what a Ray job gets, one fact a line."""
    lines = [f"{k}: {v}" for k, v in d.items() if k != "job"]
    job = d.get("job")
    if job:
        lines.append("job:")
        for key, value in job.items():
            lines += _job_lines(key, value)
    return "\n".join(lines)


def _job_lines(key: str, value: Any) -> list[str]:
    if isinstance(value, dict) and value:
        return [f"  {key}:"] + [f"    {k}: {v}" for k, v in value.items()]
    if isinstance(value, list):
        return [f"  {key}:"] + [f"    - {v}" for v in value]
    return [f"  {key}: {value or '(none)'}"]
