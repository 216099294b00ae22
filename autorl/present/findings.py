"""What a study found, said plainly: the headline at the end of ``autorl run``, at the top of ``autorl status`` and
of the report.

``findings(ws, ledger, study)`` is the data (``--json`` prints it, full precision); ``headline(d)`` the lines a
person reads (numbers rounded). In order:

- the best confirmed recipe: what it changes against the baseline recipe, its gain over the baseline with the
  interval and how that was measured (``autorl.judge.gains``), the chain of confirmed steps that reached it, and
  its re-validation once ``autorl promote`` ran one; the other confirmed recipes in one line each;
- what was ruled out: the trials that gained nothing over the recipe they modified, by hypothesis, each flat test
  with the smallest gain it could have detected (``gains.detectable``), so "nothing found" is never read as
  "nothing there" when the test could not see it; only hypotheses that confirmed no gain are ruled out, the others'
  fruitless trials are told apart ("no further gain");
- which intervals those are: over the baseline at the study's level with the run noise measured so far, where the
  run's log showed each confirmation's own test against its parent at the confirmation's level;
- crashes in one line;
- the exact next command;
- each full run: the eval it kept, where its weights are, the branch to adopt, and what it can be compared with.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

from autorl import gitops
from autorl.errors import GitError
from autorl.judge import gains, verdict
from autorl.ledger import Ledger, Trial
from autorl.recipe import Recipe, dump_values
from autorl.states import Confirmation, CrashCategory, Kind, Proposer, TrialStatus, Verdict
from autorl.workspace import Workspace

RULED_OUT = (Verdict.FLAT, Verdict.REGRESSED, Verdict.PRUNED)
NOT_CONFIRMED = "not confirmed"  # the outcome of an improved trial its fresh seeds rejected (or the gate held back)
GROUPS_SHOWN = 5  # hypotheses listed under "ruled out"; the rest are counted
VALUES_SHOWN = 4  # trials named per hypothesis
WIDTH = 88


def findings(ws: Workspace, ledger: Ledger, study: str | None = None) -> dict[str, Any]:
    """The study's findings as plain data (the latest study by default)."""
    st = ledger.study(study)
    recipe = gains.study_recipe(st)
    trials = ledger.trials(st.id)
    base_train = recipe.train if recipe is not None else {}
    ranked = gains.ranked(gains.baseline_gains(ledger.records(st.id), recipe)) if recipe is not None else []
    by_number = {t.number: t for t in trials}
    full = [_full_run(ws, t, by_number) for t in trials if t.kind == Kind.FULL]
    confirmed = [_confirmed(g, by_number, base_train, full) for g in ranked]
    d = {
        "study": st.name,
        "state": st.status,
        "recipe_path": st.recipe_path,
        "objective": _objective(recipe),
        "counts": _counts(trials),
        "baseline": _baseline_value(trials),
        "confirmed": confirmed,
        "best": confirmed[0] if confirmed else None,
        "open_candidates": [t.number for t in trials if t.confirmation == Confirmation.CANDIDATE],
        "candidates": _candidates(trials, by_number, base_train, recipe),
        "suspect": [_suspect(t) for t in trials if t.confirmation == Confirmation.SUSPECT],
        **split_by_gain(ruled_out(trials, by_number, base_train, recipe), trials),
        "crashes": _crashes(trials),
        "full_runs": full,
    }
    d["next"] = next_step(d)
    return d


def _candidates(
    trials: list[Trial], by_number: dict[int, Trial], base_train: dict, recipe: Recipe | None
) -> list[dict[str, Any]]:
    """The improved trials whose fresh-seed runs have not all run (a budget that ended first): what each changed
    against its parent, its one run's gain with the interval, and how many of its confirmation runs completed."""
    need = recipe.verdict.confirm_runs if recipe is not None else None
    out = []
    for t in trials:
        if t.confirmation != Confirmation.CANDIDATE or t.confirms is not None:
            continue
        done = [r for r in trials if r.confirms == t.number and r.status == TrialStatus.COMPLETE]
        out.append(
            {
                "number": t.number,
                "attempt": t.attempt,
                "changes": changes_vs_parent(t, by_number, base_train),
                "objective": t.objective,
                "delta": t.delta,
                "ci_low": t.ci_low,
                "ci_high": t.ci_high,
                "confirm_runs_done": len(done),
                "confirm_runs": need,
            }
        )
    return out


def _suspect(t: Trial) -> dict[str, Any]:
    """A trial the hack gate held back: its attempt and the check that failed."""
    failed: dict[str, Any] = next((c for c in t.gate_checks or [] if c.get("ok") is False), {})
    return {"number": t.number, "attempt": t.attempt, "check": failed.get("name"), "detail": failed.get("detail")}


def _objective(recipe: Recipe | None) -> dict[str, Any]:
    if recipe is None:
        return {
            "metric": "objective",
            "direction": "maximize",
            "level": 0.95,
            "confirm_level": 0.975,
            "min_effect": 0.0,
        }
    o, v = recipe.objective, recipe.verdict
    return {
        "metric": o.metric,
        "direction": o.direction,
        "level": v.level,
        "confirm_level": v.confirm_level,
        "min_effect": v.min_effect,
    }


def _counts(trials: list[Trial]) -> dict[str, int]:
    """Trials by role. A run the controller's stop interrupted (a kill, then ``--resume``) is counted once, under
    ``interrupted``, not as a baseline or confirmation run: its seed runs again and that run is the one counted."""
    own = [t for t in trials if t.kind == Kind.TRIAL]
    ran = [t for t in own if t.status != TrialStatus.INTERRUPTED]
    return {
        "trials": len(own),
        "baseline_runs": sum(t.proposer == Proposer.BASELINE for t in ran),
        "confirmation_runs": sum(t.confirms is not None for t in ran),
        "interrupted": len(own) - len(ran),
        "full_runs": sum(t.kind == Kind.FULL for t in trials),
    }


def _baseline_value(trials: list[Trial]) -> float | None:
    values = [
        t.objective
        for t in trials
        if t.proposer == Proposer.BASELINE and t.status == TrialStatus.COMPLETE and t.objective is not None
    ]
    return sum(values) / len(values) if values else None


def changes_vs_parent(t: Trial, by_number: dict[int, Trial], base_train: dict) -> list[list[Any]]:
    """What trial ``t`` changed against the recipe it modified (its parent's values, else the base recipe)."""
    parent = by_number.get(t.parent) if t.parent is not None else None
    before = (parent.params if parent else None) or base_train
    return changes(t.params, before) or changes(t.changed, before)


def changes(params: dict | None, before: dict) -> list[list[Any]]:
    """[key, value before, value after] for each train value that differs (the seed apart)."""
    params = params or {}
    return [[k, before.get(k), v] for k, v in params.items() if k != "seed" and before.get(k) != v]


def _confirmed(g: gains.Gain, by_number: dict[int, Trial], base_train: dict, full: list[dict]) -> dict[str, Any]:
    row = by_number[g.number]
    revalidated = next((f["revalidation"] for f in full if f["promoted_from"] == g.number), None)
    return {
        **g.model_dump(),
        "changes": changes(row.params, base_train),
        "objective": row.objective,
        "revalidation": revalidated,
    }


def ruled_out(
    trials: list[Trial], by_number: dict[int, Trial], base_train: dict, recipe: Recipe | None
) -> list[dict[str, Any]]:
    """Trials that gained nothing over the recipe they modified, grouped by hypothesis (or proposer), largest
    group first; each with what it changed against its parent and, for a flat test, the smallest gain it could
    have detected."""
    level = recipe.verdict.level if recipe is not None else 0.95
    floor = recipe.verdict.min_effect if recipe is not None else 0.0
    objective = recipe.objective if recipe is not None else None
    groups: dict[str | None, list[dict]] = {}
    for t in trials:
        outcome = _outcome(t)
        if outcome is None:
            continue
        groups.setdefault(_group_of(t), []).append(
            {
                "number": t.number,
                "changes": changes_vs_parent(t, by_number, base_train),
                "outcome": outcome,
                "delta": t.delta,
                "ci_low": t.ci_low,
                "ci_high": t.ci_high,
                **_sensitivity(t, outcome, objective, level, floor),
            }
        )
    return [{"group": k, "trials": v} for k, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))]


def split_by_gain(groups: list[dict[str, Any]], trials: list[Trial]) -> dict[str, list[dict[str, Any]]]:
    """``ruled_out``'s groups in two: ``ruled_out``, those with no confirmed gain (what the study ruled out), and
    ``no_further_gain``, those of a hypothesis (or proposer) that did confirm one: its other trials found nothing
    more, which rules the hypothesis out no more than its gain rules it in."""
    paid = {_group_of(t) for t in trials if t.confirmation == Confirmation.CONFIRMED and t.confirms is None}
    return {
        "ruled_out": [g for g in groups if g["group"] not in paid],
        "no_further_gain": [g for g in groups if g["group"] in paid],
    }


def _group_of(t: Trial) -> str | None:
    """What a trial is grouped by under "ruled out": its hypothesis, else its proposer."""
    return t.hypothesis or t.proposer


def _outcome(t: Trial) -> str | None:
    """flat, regressed, pruned or 'not confirmed' for a trial of the search that found nothing; else None."""
    if t.kind != Kind.TRIAL or t.proposer == Proposer.BASELINE or t.confirms is not None:
        return None
    if t.verdict == Verdict.IMPROVED and t.confirmation in (Confirmation.REJECTED, Confirmation.SUSPECT):
        return NOT_CONFIRMED
    return t.verdict if t.verdict in RULED_OUT else None


def _sensitivity(t: Trial, outcome: str, objective: Any, level: float, floor: float) -> dict[str, Any]:
    """A flat (or not confirmed) test's ``detectable`` gain, never more than the objective's range allows over the
    parent (``possible_gain``); a test that would need more is ``blind``: it could detect no gain."""
    if outcome not in (Verdict.FLAT, NOT_CONFIRMED):
        return {"detectable": None, "possible_gain": None, "blind": False}
    sens = gains.sensitivity(t, objective, level, floor)
    return {"detectable": sens.seen, "possible_gain": sens.possible, "blind": sens.blind}


def _crashes(trials: list[Trial]) -> dict[str, Any]:
    crashed = [t for t in trials if t.verdict == Verdict.CRASH or t.status == TrialStatus.CRASH]
    categories: dict[str, int] = {}
    for t in crashed:
        category = t.crash_category or CrashCategory.UNKNOWN
        categories[category] = categories.get(category, 0) + 1
    return {"count": len(crashed), "categories": categories}


def _full_run(ws: Workspace, t: Trial, by_number: dict[int, Trial]) -> dict[str, Any]:
    """A promoted full run: its state, kept eval, weights (from its results file) and re-validation, what it changed
    for its length, and the branch of the trial it was promoted from (that recipe at the study's trial length)."""
    source = by_number.get(t.promoted_from) if t.promoted_from is not None else None
    result = _results(ws, t.end_tag, t.attempt) if t.end_tag else {}
    best = result.get("best_checkpoint") or {}
    revalidation = (
        {"delta": t.delta, "ci_low": t.ci_low, "ci_high": t.ci_high, "method": t.method}
        if t.delta is not None
        else None
    )
    running = t.status == TrialStatus.RUNNING
    elsewhere = ws.monitor_elsewhere(t.number) if running else None
    return {
        "number": t.number,
        "attempt": t.attempt,
        "branch": t.branch,
        "status": t.status,
        # a running row's monitor: False when it is gone from this machine (the run ended unrecorded); on another
        # machine of a shared workspace it cannot be probed from here and is taken as running
        "monitor_alive": ws.monitor_alive(t.number, t.pid) if running else None,
        "monitor_host": elsewhere,
        "pid": t.pid,
        "promoted_from": t.promoted_from,
        "trial_branch": source.branch if source is not None else None,
        "full_values": t.changed or {},
        "objective": t.objective,
        "best_step": best.get("step"),
        "kept_why": best.get("why"),
        "weights": best.get("weights"),
        "revalidation": revalidation,
        "full_length_baseline": None,
    }


def _results(ws: Workspace, end_tag: str, attempt: str) -> dict[str, Any]:
    try:
        text = gitops.show_file(ws.root, end_tag, f"results/{attempt}.json")
    except GitError:
        return {}
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}


def next_step(d: dict[str, Any]) -> dict[str, str]:
    """The command to run next, and why."""
    best, full = d["best"], d["full_runs"]
    running = [f for f in full if f["status"] == TrialStatus.RUNNING]
    if any(f["monitor_alive"] for f in running):
        return {"command": "autorl status", "why": f"full run {running[0]['attempt']} is running"}
    if running:  # the ledger says running, but no monitor is left on this machine: its host was lost or rebooted
        f = running[-1]
        return {
            "command": "autorl promote --resume",
            "why": f"full run {f['attempt']} stopped without an end (its monitor is gone); this starts it over "
            "as a new attempt, on the re-validation it recorded",
        }
    ended = (TrialStatus.CRASH, TrialStatus.INTERRUPTED, TrialStatus.CONFIG_ERROR)
    done = [f for f in full if best and f["promoted_from"] == best["number"] and f["status"] not in ended]
    if done:
        return _adopt(done[-1], d["recipe_path"])
    ahead = _ahead_of_best(d)
    if ahead is not None:
        return {
            "command": "autorl run --resume --budget 30m",
            "why": f"candidate {ahead['number']:02d} read {_v(ahead['objective'])} on its own run, above "
            f"{best['number']:02d}'s {_v(best['objective'])}: its fresh-seed runs decide it before a promote",
        }
    if best:
        return {
            "command": "autorl promote",
            "why": f"re-runs {best['number']:02d} and the baseline with fresh seeds, "
            "then starts its full run if the gain holds",
        }
    if d["baseline"] is None and d["crashes"]["count"]:
        return {
            "command": "autorl triage",
            "why": "the baseline never completed: read its root cause and remedy, "
            "fix the recipe or the machine, then `autorl run --resume`",
        }
    if d["open_candidates"]:
        return {
            "command": "autorl run --resume --budget 30m",
            "why": f"{len(d['open_candidates'])} candidate(s) still await their fresh-seed runs",
        }
    return {
        "command": "autorl run --resume --budget 1h",
        "why": "nothing confirmed yet: search longer (or read `autorl diagnose` and `autorl ledger`)",
    }


def _ahead_of_best(d: dict[str, Any]) -> dict[str, Any] | None:
    """The open candidate whose own run reads better than the best confirmed recipe's run, if any (the best such)."""
    best = d["best"]
    if not best or best.get("objective") is None:
        return None
    sign = 1 if d["objective"]["direction"] == "maximize" else -1
    ahead = [
        c
        for c in d.get("candidates") or []
        if c["objective"] is not None and sign * (c["objective"] - best["objective"]) > 0
    ]
    return max(ahead, key=lambda c: sign * c["objective"], default=None)


def _adopt(f: dict[str, Any], recipe_path: str) -> dict[str, str]:
    """The recipe a next study goes on from after full run ``f``: the promoted trial's, its confirmed values at the
    study's trial length; the full run's own recipe runs at full length (``steps: 300``), and a study started from
    it would make every trial a full-length run."""
    if not f.get("trial_branch"):  # the trial it came from is not in the study: only the full run's recipe is known
        return {
            "command": f"git show {f['branch']}:{recipe_path}",
            "why": "the full run's recipe; set its length back to the study's trial length before a next study",
        }
    length = f" ({dump_values(f['full_values'])})" if f.get("full_values") else ""
    return {
        "command": f"git checkout {f['trial_branch']} -- {recipe_path}",
        "why": f"the recipe to go on from: {f['promoted_from']:02d}'s confirmed values at the study's trial "
        f"length; the full run's branch {f['branch']} has its full length{length}, which would make every trial "
        "of a next study a full-length run",
    }


# ---- the lines a person reads ----------------------------------------------------------------------------------
def headline(d: dict[str, Any], width: int = WIDTH) -> list[str]:
    """The findings as lines of at most ``width`` characters (a longer line wraps under its own indent)."""
    lines = _found(d) + _candidate_lines(d) + _ruled_out_lines(d) + [_crash_line(d["crashes"])]
    for f in d["full_runs"]:
        lines += full_run_lines(f, d)
    nxt = d["next"]
    lines += [f"Next: {nxt['command']}", f"  {nxt['why']}"]
    return [part for line in lines for part in wrap(line, width)]


def wrap(line: str, width: int) -> list[str]:
    indent = " " * (len(line) - len(line.lstrip(" ")))
    return (
        textwrap.wrap(
            line,
            width=width,
            initial_indent="",
            subsequent_indent=indent + "  ",
            break_on_hyphens=False,
            break_long_words=False,
        )
        if line.strip()
        else [line]
    )


def counted(n: int, noun: str) -> str:
    """'1 trial', '2 trials', '2 branches'."""
    return f"{n} {noun}" + ("" if n == 1 else "es" if noun.endswith(("s", "sh", "ch", "x")) else "s")


def _found(d: dict[str, Any]) -> list[str]:
    best, metric = d["best"], d["objective"]["metric"]
    base = f"'s {_v(d['baseline'])}" if d["baseline"] is not None else ""
    if best is None:
        return [
            f"Found: no confirmed improvement over the baseline{base} in {counted(d['counts']['trials'], 'trial')}.",
            *_suspect_lines(d),
        ]
    level = f"{round(best['level'] * 100, 1):g}%"
    lines = [
        f"Found: {change_text(best['changes']) or 'the recipe as written'}  ({best['attempt']})",
        f"  {best['delta']:+.3f} {metric} over the baseline{base} ({level} interval [{best['ci_low']:+.3f}, "
        f"{best['ci_high']:+.3f}]), {best_how(best)}.",
    ]
    if best.get("revalidation"):
        lines.append(f"  Re-validated by promote: {_gain(best['revalidation'])} over the baseline.")
    for g in d["confirmed"][1:3]:
        lines.append(f"  Also confirmed: {g['number']:02d} {change_text(g['changes'])}, {_gain(g)}.")
    return lines + [_intervals_line(d)] + _suspect_lines(d)


def measured_on(level: float) -> str:
    """What a confirmed recipe's interval over the baseline is, where it stands beside other intervals (the
    ledger's, the report's table): '95%, its fresh-seed runs'."""
    return f"{verdict.pct(level)}, its fresh-seed runs"


def _intervals_line(d: dict[str, Any]) -> str:
    """Which intervals the gains above are, and why the run's log shows another for the same gain: each
    confirmation there is its own test (its fresh-seed runs against its parent, at the confirmation's level, with
    the noise measured then)."""
    o = d["objective"]
    confirm = verdict.pct(o.get("confirm_level", 0.975))
    return (
        f"  These are {verdict.pct(o['level'])} intervals over the baseline at the run noise measured so far, so "
        f"they move as more is measured; the run's log shows each confirmation's own test, {confirm} against its "
        "parent (`autorl show NN`)."
    )


def _candidate_lines(d: dict[str, Any]) -> list[str]:
    """The candidates still waiting for their fresh-seed runs: a gain seen once is not a finding, and not nothing."""
    lines = []
    for c in d.get("candidates") or []:
        interval = f" [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]" if c["ci_low"] is not None else ""
        gain = f"{c['delta']:+.3f}{interval} over its parent" if c["delta"] is not None else "a gain"
        runs = f"{c['confirm_runs_done']} of its {c['confirm_runs']}" if c["confirm_runs"] else "none of its"
        lines.append(
            f"Not yet confirmed: {c['number']:02d} {change_text(c['changes']) or 'the recipe as written'}: {gain} on "
            f"its own run; {runs} fresh-seed runs completed (`autorl run --resume` runs the rest)."
        )
    return lines


def _suspect_lines(d: dict[str, Any]) -> list[str]:
    """The confirmed gains the hack gate did not believe, each with its failed check."""
    return [
        f"  Suspect (hack gate, not promoted without --force): {s['attempt']}: {s['check']} failed: {s['detail']}."
        for s in d.get("suspect", [])
    ]


def best_how(g: dict[str, Any]) -> str:
    """How a confirmed recipe's gain was measured (``Gain.describe``)."""
    return gains.Gain.model_validate({k: g[k] for k in gains.Gain.model_fields}).describe()


def _ruled_out_lines(d: dict[str, Any]) -> list[str]:
    """What was ruled out: the groups with no confirmed gain; then, apart, the trials of those that did confirm one
    and found nothing more (never "ruled out": that hypothesis paid)."""
    groups, further = d["ruled_out"], d.get("no_further_gain") or []
    lines = (
        [f"Ruled out ({counted(_count(groups), 'trial')} with no gain over the recipe they modified):"]
        + _group_lines(groups, d)
        if groups
        else ["Ruled out: nothing yet."]
    )
    if further:
        lines.append(
            f"No further gain ({counted(_count(further), 'more trial')} of what confirmed a gain above, so not "
            "ruled out):"
        )
        lines += _group_lines(further, d)
    return lines


def _count(groups: list[dict[str, Any]]) -> int:
    return sum(len(g["trials"]) for g in groups)


def _group_lines(groups: list[dict[str, Any]], d: dict[str, Any]) -> list[str]:
    lines = [f"  {g['group']}: " + _group_text(g["trials"], d["objective"]["metric"]) for g in groups[:GROUPS_SHOWN]]
    rest = groups[GROUPS_SHOWN:]
    if rest:
        lines.append(f"  and {_count(rest)} more in {len(rest)} other groups (autorl ledger)")
    return lines


def _group_text(trials: list[dict], metric: str) -> str:
    named = "; ".join(
        f"{change_text(t['changes'], arrow=False) or 'no change'} {t['outcome']}" for t in trials[:VALUES_SHOWN]
    )
    more = f"; +{len(trials) - VALUES_SHOWN} more" if len(trials) > VALUES_SHOWN else ""
    seen = sorted(t["detectable"] for t in trials if t["detectable"] is not None)
    blind = [t for t in trials if t.get("blind")]
    said = []
    if seen:
        could = (
            f"+{seen[0]:.3f}" if len(seen) == 1 or seen[-1] - seen[0] < 0.0005 else f"+{seen[0]:.3f} to +{seen[-1]:.3f}"
        )
        said.append(f"{_tests(len(seen))} could detect a gain of {could}")
    if blind:
        said.append(_blind_text(blind, metric, more=bool(seen)))
    return f"{named}{more} ({'; '.join(said)})" if said else named + more


def _tests(n: int) -> str:
    return "its flat test" if n == 1 else f"its {n} flat tests"


def _blind_text(blind: list[dict], metric: str, more: bool) -> str:
    """Flat tests whose detectable gain is beyond what the metric allows over the parent: they saw nothing."""
    who = f"{len(blind)} more" if more else _tests(len(blind))
    if len(blind) == 1 and not more:
        t = blind[0]
        return (
            f"{who} could detect no gain: {metric} allows at most +{t['possible_gain']:.3f} over the parent "
            "and its interval is wider than that"
        )
    return f"{who} could detect no gain {metric} allows over the parent (intervals wider than its range)"


def _crash_line(c: dict[str, Any]) -> str:
    if not c["count"]:
        return "Crashes: none."
    kinds = ", ".join(f"{k} ×{n}" for k, n in sorted(c["categories"].items(), key=lambda kv: -kv[1]))
    return f"Crashes: {c['count']} ({kinds}): `autorl triage` groups them with root cause and remedy."


def full_run_lines(f: dict[str, Any], d: dict[str, Any]) -> list[str]:
    """A full run: its state and kept eval (and why), its weights, the branch to adopt, what it compares with."""
    metric = d["objective"]["metric"]
    head = f"Full run {f['attempt']} (from {f['promoted_from']:02d}): {f['status']}"
    if f["objective"] is not None:
        head += f", kept {metric} {_v(f['objective'])} at step {f['best_step']}"
    lines = [head]
    if f.get("kept_why"):
        lines.append(f"  why that checkpoint: {f['kept_why']}")
    if f.get("monitor_host"):
        lines.append(f"  its monitor runs on {f['monitor_host']}: `autorl status` there says how it is doing")
    if f["status"] == TrialStatus.RUNNING and not f.get("monitor_alive", True):
        lines.append(
            f"  but its monitor (pid {f['pid']}) is not running on this machine: the run ended without a record "
            "(its host lost or rebooted); what it wrote is under .autorl/runs"
        )
    if f["status"] in (TrialStatus.RUNNING, TrialStatus.INTERRUPTED, TrialStatus.CONFIG_ERROR):  # nothing to adopt
        return lines
    lines.append(
        f"  weights: {f['weights']}"
        if f["weights"]
        else "  weights: none saved (the backend keeps none, or they are gone from disk)"
    )
    length = f"; its recipe runs at full length: {dump_values(f['full_values'])}" if f.get("full_values") else ""
    lines.append(f"  branch to adopt: {f['branch']} (the full run's weights and results{length})")
    if f.get("trial_branch"):
        lines.append(
            f"  a next study goes on from {f['promoted_from']:02d}'s recipe at trial length: git checkout "
            f"{f['trial_branch']} -- {d['recipe_path']}"
        )
    reval = f"re-validated at trial length: {_gain(f['revalidation'])} over the baseline; " if f["revalidation"] else ""
    lines.append(
        f"  {reval}no full-length baseline was run, so {_v(f['objective'])} has no baseline of its own "
        "length to compare with."
    )
    return lines


def change_text(items: list[list[Any]], arrow: bool = True) -> str:
    """'lr 5e-07 → 5e-05, gens 8 → 16' (or 'lr 5e-05' without arrows)."""
    if arrow:
        return ", ".join(f"{k} {_fmt(a)} → {_fmt(b)}" for k, a, b in items)
    return dump_values({k: b for k, _, b in items}).replace("=", " ")


def _gain(g: dict[str, Any]) -> str:
    if g.get("ci_low") is None or g.get("ci_high") is None:
        return f"{g['delta']:+.3f}"
    return f"{g['delta']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}]"


def _v(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _fmt(v: Any) -> str:
    return dump_values({"": v})[1:]


def refs_line(ws: Workspace, ledger: Ledger, study: str | None = None) -> str:
    """How many of the study's branches and tags are still there, and how to clear those nothing needs ("" when
    none are)."""
    st = ledger.study(study)
    try:
        existing = gitops.refs(ws.root)
    except GitError:
        return ""
    rows = ledger.trials(st.id)
    branches = sum(t.branch in existing for t in rows)
    tags = sum(tag in existing for t in rows for tag in (t.start_tag, t.end_tag) if tag)
    if not branches and not tags:
        return ""
    return (
        f"Git: the study's trials left {counted(branches, 'branch')} and {counted(tags, 'tag')} (attempt-NN-*); "
        f"`autorl clean --dry-run` lists those nothing needs any more."
    )


# ---- promote's outcome ---------------------------------------------------------------------------------------
def resumed_lines(d: dict[str, Any]) -> list[str]:
    """``autorl promote --resume``'s result in words."""
    return [
        f"{d['resumed']} marked interrupted; its recipe started over as {d['attempt']} (from "
        f"{d['promoted_from']:02d}, monitor pid {d['monitor_pid']}), on the re-validation it recorded",
        f"follow it: autorl status, or autorl show {d['number']}",
    ]


def promoted_lines(d: dict[str, Any]) -> list[str]:
    """``autorl promote``'s result in words (its dry run, or the full run it launched)."""
    if "full_values" in d:
        return [
            f"full run values: {dump_values(d['full_values']) or 'none (the recipe as the trial ran it)'}",
            f"dry run: nothing was run; without --dry-run, {d['attempt']} and the baseline are re-run with "
            "fresh seeds, then its full run starts if the gain holds",
        ]
    # the re-validation's verdict and hack gate were printed as they came (``promote``'s view): not again here
    forced = (
        f"; promoted anyway (--force, recorded in the ledger): re-validation {d['revalidation']['verdict']}"
        if d["forced"]
        else ""
    )
    lines = [
        f"full run {d['attempt']} launched from {d['promoted_from']:02d} (monitor pid {d['monitor_pid']}){forced}",
        f"follow it: autorl status, or autorl show {d['number']}",
    ]
    if d.get("trial_branch"):  # the full run's own branch runs at full length: not a recipe to search on from
        lines.append(
            f"a next study goes on from {d['promoted_from']:02d}'s recipe at trial length: "
            f"git checkout {d['trial_branch']} -- {d['recipe_path']}"
        )
    return lines
