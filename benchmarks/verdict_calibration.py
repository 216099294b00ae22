"""Calibration of the verdicts through the code the controller runs: simulated studies in a real ledger.

Each simulated study is a real ``Ledger`` (SQLite, on /dev/shm when there is one) holding what a study run by the
controller holds: the baseline's repeats, then trials, a candidate's fresh-seed confirmation runs right after it
(the controller queues them first), each run's eval records as the engine writes them (per-item results under
``eval/id/items``). Every verdict is made by ``autorl.judge.evidence.Evidence`` exactly as ``autorl.study.judging``
asks for it: ``credit`` against the parent for a trial, ``confirmation`` for a candidate whose confirmation runs have
ended, and the ledger's rows are written as the controller writes them (a candidate's ``confirmation`` column, its
confirmation runs' ``confirms``), so the groups the evidence assembles (the baseline's, each candidate's own run with
its fresh runs, the study's other changed recipes) are the ones a real study has. Only the training is simulated:
a run solves item j with probability clip(p_j + effect + u_run (+ its item cluster's shift)), p_j ~ U(0.1, 0.9),
u_run ~ N(0, sd) (or Student's t with 3 df scaled to sd), the baseline's sd and the trials' sd set apart.

Scenario families: equal noise; unequal noise (trial sd x2, x3 of the parent's, 0 -> 0.05); heavy-tailed seed
effects; item clusters; 64 items; 2 baseline repeats; best-of-K objectives with more evals in the trial than in the
baseline; run values only (a metric without per-item results). Per scenario:

- null studies of 30 trials (every trial and its confirmation runs as good as the baseline): false improved and
  false regressed per trial (all trials, and the first trial of a study, which has no changed recipe measured yet),
  false confirmed per trial, and the share of studies with at least one false confirmed improvement;
- power studies: a trial with a true +0.10 at position 11 of a null study; the share that becomes a candidate and
  the share confirmed.

Then the pruner under the same scenarios (a subset of each family with per-item results and one eval schedule):
trials whose
effects cycle through -0.10, 0, 0, +0.05, +0.10 run 4 evals; ``Evidence.clearly_worse`` (as the trial's monitor asks)
may stop one at any of the first 3; one that runs on is judged and confirmed as above. Printed: the share stopped
per true effect, and of the stopped trials the share that would have been "improved" had they run on.

With ``--stated N``: the rates the verdicts state against the rates measured (issue 49), per scenario and level,
over N more null studies of 30 trials (and ``--first M`` more studies that stop after their first trial): the
screening's stated chance of an improved call (``calibrate.verdict_rates`` of each verdict's design) against the
share called improved, on a study's first trial, trials 1-10 and 11-30; a confirmation's ``confirmation_rate``
against the share of null candidates confirmed; the study's ``study_errors.false_confirm`` against false confirmed
per trial. Stating a rate is a simulation of its own, so the stated rates are those of a sample (``--cap`` per level
and scenario, the first studies'); target: measured at most 1.5x stated, or within 0.5 points.

Rates are printed with 95% Clopper-Pearson intervals.

    python benchmarks/verdict_calibration.py [--studies 400] [--power 300] [--pruner 100] [--only TEXT ...]
                                             [--stated 0] [--first 0] [--cap 20] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from autorl.errors import validation_line
from autorl.judge import calibrate
from autorl.judge.evidence import Evidence, objective_value, study_errors
from autorl.judge.stats import clopper_pearson
from autorl.ledger import Ledger, Trial
from autorl.metrics import RunMetrics
from autorl.recipe import VerdictSettings, validate_recipe
from autorl.states import Confirmation, Proposer, TrialStatus, Verdict

TRIALS = 30
POWER_AT = 10  # the +0.10 trial's position (0-based) in a power study
POWER_EFFECT = 0.10
PRUNE_EFFECTS = (-0.10, 0.0, 0.0, 0.05, 0.10)  # the pruner's trials, in turn
PRUNE_EVALS = 4  # evals per run when the pruner watches (the last one is the result)


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str
    parent_sd: float
    trial_sd: float
    items: int = 500
    repeats: int = 0  # baseline runs (0: the verdict settings' baseline_repeats)
    heavy: bool = False  # seed effects Student's t (3 df), scaled to sd
    clusters: int = 0  # item clusters, each shifted per run by N(0, cluster_sd)
    cluster_sd: float = 0.0
    trial_evals: int = 1  # evals per run; more than one: the objective is the best eval
    parent_evals: int = 1
    values: bool = False  # a metric without per-item results: run values only
    pruner: bool = False  # also in the pruner's table


def scenarios() -> list[Scenario]:
    eq = [
        Scenario(f"equal sd {sd:g}", "equal noise", sd, sd, pruner=sd in (0.01, 0.03))
        for sd in (0.0, 0.01, 0.02, 0.03, 0.05)
    ]
    uneq = [
        Scenario(f"{a:g} -> {b:g}", "unequal noise", a, b, pruner=(a, b) in ((0.02, 0.04), (0.0, 0.05)))
        for a, b in ((0.02, 0.04), (0.05, 0.10), (0.01, 0.03), (0.02, 0.06), (0.0, 0.05))
    ]
    return (
        eq
        + uneq
        + [
            Scenario("t3, sd 0.03", "heavy tails", 0.03, 0.03, heavy=True, pruner=True),
            Scenario("t3, 0.02 -> 0.04", "heavy tails", 0.02, 0.04, heavy=True),
            Scenario(
                "50 clusters sd 0.05, run sd 0.01",
                "item clusters",
                0.01,
                0.01,
                clusters=50,
                cluster_sd=0.05,
                pruner=True,
            ),
            Scenario("64 items, sd 0.01", "64 items", 0.01, 0.01, items=64, pruner=True),
            Scenario("64 items, 0.01 -> 0.03", "64 items", 0.01, 0.03, items=64),
            Scenario("R = 2, sd 0.01", "2 baseline repeats", 0.01, 0.01, repeats=2),
            Scenario("R = 2, sd 0.03", "2 baseline repeats", 0.03, 0.03, repeats=2, pruner=True),
            Scenario("R = 2, sd 0.05", "2 baseline repeats", 0.05, 0.05, repeats=2),
            Scenario("best of 8 vs 2 evals, sd 0.01", "best-of-K", 0.01, 0.01, trial_evals=8, parent_evals=2),
            Scenario("best of 8 vs 2 evals, 0.01 -> 0.03", "best-of-K", 0.01, 0.03, trial_evals=8, parent_evals=2),
            Scenario("values only, sd 0.01", "run values", 0.01, 0.01, values=True),
            Scenario("values only, 0.01 -> 0.03", "run values", 0.01, 0.03, values=True),
        ]
    )


def pick(texts: list[str]) -> list[Scenario]:
    """The scenarios named (exactly, or by family), else those whose name or family holds one of ``texts``."""
    exact = [s for s in scenarios() if s.name in texts or s.family in texts]
    return exact or [s for s in scenarios() if any(t in s.name or t in s.family for t in texts)]


class SimStudy:
    """One simulated study in its own real ledger, judged by ``Evidence`` as the controller judges."""

    def __init__(self, sc: Scenario, rng: np.random.Generator, path: Path, verdict: dict, evals: int = 0):
        self.sc, self.rng, self.evals = sc, rng, evals  # evals: every run's number of evals (0: the scenario's)
        self.ledger = Ledger(path)
        self.sid = self.ledger.create_study(
            name="sim",
            recipe_path="r.yaml",
            recipe="",
            base_sha="x",
            strategy="random",
            budget_s=1.0,
            optuna_study="sim",
        )
        self.p = rng.uniform(0.1, 0.9, sc.items)
        self.cluster = np.arange(sc.items) % sc.clusters if sc.clusters else None
        metric = "eval/id/sampling_pass@4" if sc.values else "eval/id/greedy_pass@1"
        reduction = "best" if max(sc.trial_evals, sc.parent_evals) > 1 and not evals else "last"
        self.recipe = validate_recipe(
            {
                "backend": "embedded",
                "train": {},
                "verdict": verdict,
                "objective": {"metric": metric, "reduction": reduction},
            },
            source="sim",
        )
        self.evidence = Evidence(self.ledger.records(self.sid))
        self.number = 0

    def _shift(self, sd: float) -> float:
        if sd <= 0:
            return 0.0
        return float(self.rng.standard_t(3) / np.sqrt(3.0) * sd if self.sc.heavy else self.rng.normal(0.0, sd))

    def _evals(self, effect: float, sd: float, evals: int) -> list[dict]:
        q = self.p + effect + self._shift(sd)
        if self.cluster is not None:
            q = q + self.rng.normal(0.0, self.sc.cluster_sd, self.sc.clusters)[self.cluster]
        q = np.clip(q, 0.0, 1.0)
        out = []
        for step in range(1, evals + 1):
            items = (self.rng.random(self.sc.items) < q).astype(int)
            rec = {"type": "eval", "step": 10 * step, self.recipe.objective.metric: float(items.mean())}
            if not self.sc.values:
                rec["eval/id/items"] = items.tolist()
            out.append(rec)
        return out

    def draw(self, effect: float, trial_recipe: bool) -> list[dict]:
        """One run's eval records: the trial's recipe or the baseline's (its own sd and number of evals)."""
        sd, k = (self.sc.trial_sd, self.sc.trial_evals) if trial_recipe else (self.sc.parent_sd, self.sc.parent_evals)
        return self._evals(effect, sd, self.evals or k)

    def run(self, proposer: Proposer, records: list[dict], status: TrialStatus = TrialStatus.COMPLETE, **cols) -> Trial:
        """One finished run written as the controller writes it (row, then its metrics)."""
        self.number += 1
        tid = self.ledger.add_trial(
            study_id=self.sid,
            number=self.number,
            attempt=f"attempt-{self.number:02d}",
            proposer=proposer,
            status=status,
            objective=objective_value(RunMetrics(records), self.recipe),
            **cols,
        )
        self.ledger.add_metrics(tid, records)
        return self.ledger.trial(self.number)

    def baseline(self) -> None:
        for _ in range(self.sc.repeats or self.recipe.verdict.baseline_repeats):
            self.run(Proposer.BASELINE, self.draw(0.0, False))

    def trial(
        self, effect: float, records: list[dict] | None = None, stated: dict | None = None
    ) -> tuple[Verdict, Confirmation | None]:
        """A trial judged against the baseline (``Evidence.credit``), confirmed if a candidate; (verdict, state).
        ``stated`` (a dict) receives the rates the verdicts state: ``screen`` (the chance of an improved call the
        screening states; an entry ``screen: False`` skips it) and, for a candidate, ``confirm`` (its
        confirmation's ``confirmation_rate``)."""
        row = self.run(Proposer.RANDOM, records or self.draw(effect, True))
        v = self.evidence.credit(self.evidence.metrics(row), None, self.recipe).vs_parent
        s = self.recipe.verdict
        if stated is not None and stated.pop("screen", True):
            d = calibrate.design_of(v)
            stated["screen"] = None if d is None else calibrate.verdict_rates(d, s, v.level).improved
        state = Confirmation.CANDIDATE if v.verdict == Verdict.IMPROVED else None
        self.ledger.update_trial(
            row.id, verdict=v.verdict, delta=v.delta, ci_low=v.ci_low, ci_high=v.ci_high, confirmation=state
        )
        if state is None:
            return v.verdict, None
        for _ in range(self.recipe.verdict.confirm_runs):
            self.run(Proposer.CONFIRM, self.draw(effect, True), confirms=row.number)
        c = self.evidence.confirmation(self.ledger.trial(row.number), self.recipe)
        if stated is not None and c.verdict is not None:
            stated["confirm"] = calibrate.confirmation_rate(c.verdict, s)
        self.ledger.set_confirmation(row.number, c.state, c.reason)
        return v.verdict, c.state

    def watched(self, effect: float) -> tuple[bool, Verdict, Confirmation | None]:
        """A trial the pruner watches at its intermediate evals (``Evidence.clearly_worse``, as the trial's monitor
        asks): (stopped, the verdict it has or would have had by running on, its confirmation)."""
        records = self.draw(effect, True)
        if not any(self.evidence.clearly_worse(rec, None, self.recipe) is not None for rec in records[:-1]):
            return (False, *self.trial(effect, records))
        row = self.run(Proposer.RANDOM, records, status=TrialStatus.PRUNED, verdict=Verdict.PRUNED)
        return True, self.evidence.credit(self.evidence.metrics(row), None, self.recipe).vs_parent.verdict, None

    def close(self) -> None:
        self.ledger.close()


def simulate(sc: Scenario, studies: int, power: int, seed: int, tmp: Path, verdict: dict) -> dict:
    """Null studies and power studies of one scenario: counts of each outcome."""
    rng = np.random.default_rng(seed)
    out = {k: 0 for k in ("trials", "fi", "fr", "fc", "first_fi", "studies_fc", "power_cand", "power_conf")}
    for i in range(studies + power):
        st = SimStudy(sc, rng, tmp / f"s{i}.sqlite", verdict)
        st.baseline()
        null = i < studies
        got = [
            st.trial(POWER_EFFECT if not null and k == POWER_AT else 0.0)
            for k in range(TRIALS if null else POWER_AT + 1)
        ]
        st.close()
        (tmp / f"s{i}.sqlite").unlink()
        if null:
            out["trials"] += len(got)
            out["fi"] += sum(v == Verdict.IMPROVED for v, _ in got)
            out["fr"] += sum(v == Verdict.REGRESSED for v, _ in got)
            out["fc"] += sum(c == Confirmation.CONFIRMED for _, c in got)
            out["first_fi"] += got[0][0] == Verdict.IMPROVED
            out["studies_fc"] += any(c == Confirmation.CONFIRMED for _, c in got)
        else:
            out["power_cand"] += got[-1][0] == Verdict.IMPROVED
            out["power_conf"] += got[-1][1] == Confirmation.CONFIRMED
    return out


STATED_LEVELS = (
    ("first", "screening, first trial"),
    ("early", "screening, trials 1-10"),
    ("late", "screening, trials 11-30"),
    ("confirm", "confirmation (of null candidates)"),
    ("study", "study: false confirmed / trial"),
)


def simulate_stated(sc: Scenario, studies: int, first: int, seed: int, tmp: Path, verdict: dict, cap: int) -> dict:
    """Null studies of one scenario, each decision's stated rate beside what happened: per level (``STATED_LEVELS``)
    the measured count and its denominator, and the stated rates of a sample (the first trial of every study, one
    of trials 2-10 and one of 11-30 per study, the first ``cap`` candidates' confirmations, the study-level rate of
    the first ``cap`` studies; stating a rate is a simulation of its own, so not every decision's is computed).
    ``first`` more studies stop after their first trial (the first trial's measured rate needs many studies)."""
    rng = np.random.default_rng(seed)
    out: dict = {f"{k}_{x}": 0 for k, _ in STATED_LEVELS for x in ("hits", "n")}
    out.update({f"{k}_stated": [] for k, _ in STATED_LEVELS})
    for i in range(studies + first):
        st = SimStudy(sc, rng, tmp / f"c{i}.sqlite", verdict)
        st.baseline()
        sampled = {0, 1 + i % 9, 10 + i % 20} if i < cap else set()
        for k in range(TRIALS if i < studies else 1):
            stated: dict = {"screen": k in sampled}  # whether to state the screening's rate
            v, c = st.trial(0.0, stated=stated)
            level = "first" if k == 0 else "early" if k < 10 else "late"
            for key in {level, "early" if k < 10 else "late"}:
                out[f"{key}_hits"] += v == Verdict.IMPROVED
                out[f"{key}_n"] += 1
            for key in {level, "early" if k < 10 else "late"}:
                if stated.get("screen") is not None and len(out[f"{key}_stated"]) < cap:
                    out[f"{key}_stated"].append(stated["screen"])
            if c in (Confirmation.CONFIRMED, Confirmation.REJECTED):
                out["confirm_hits"] += c == Confirmation.CONFIRMED
                out["confirm_n"] += 1
                if stated.get("confirm") is not None and len(out["confirm_stated"]) < cap:
                    out["confirm_stated"].append(stated["confirm"])
            if i < studies:
                out["study_hits"] += c == Confirmation.CONFIRMED
                out["study_n"] += 1
        if i < min(studies, cap):
            e = study_errors(st.evidence, st.recipe)
            if e.false_confirm is not None:
                out["study_stated"].append(e.false_confirm)
        st.close()
        (tmp / f"c{i}.sqlite").unlink()
    return out


def stated_rows(sc: Scenario, r: dict) -> list[str]:
    """One row per level: the mean stated rate (of the sample), the measured one, their ratio and the target."""
    rows = []
    for key, name in STATED_LEVELS:
        hits, n, said = r[f"{key}_hits"], r[f"{key}_n"], r[f"{key}_stated"]
        if not n:
            continue
        stated = float(np.mean(said)) if said else float("nan")
        measured = hits / n
        ok = measured <= 1.5 * stated or measured - stated <= 0.005
        ratio = f"{measured / stated:.2f}" if stated > 0 else "-"
        rows.append(
            f"| {sc.name} | {name} | {stated:.2%} ({len(said)}) | {ci(hits, n)} ({n}) | {ratio} | "
            f"{'yes' if ok else '**no**'} |"
        )
    return rows


def stated_table(chosen: list[Scenario], args, verdict: dict, tmp: Path) -> None:
    print(
        f"\nstated vs measured: {args.stated} null studies of {TRIALS} trials and {args.first} more first trials "
        f"per scenario; stated rates of a sample (in brackets: how many)\n"
    )
    print("| scenario | level | stated (mean) | measured [95% CI] (n) | measured / stated | within 1.5x or 0.5 pp |")
    print("|---|---|---:|---:|---:|---|")
    for sc in chosen:
        seed = args.seed * 1000 + 700 + scenarios().index(sc)
        r = simulate_stated(sc, args.stated, args.first, seed, tmp, verdict, args.cap)
        print("\n".join(stated_rows(sc, r)), flush=True)


def simulate_pruner(sc: Scenario, studies: int, seed: int, tmp: Path, verdict: dict) -> dict:
    """Studies whose trials (effects cycling through PRUNE_EFFECTS) are watched by the pruner at 3 intermediate
    evals of 4: how many are stopped per effect, and what the stopped ones would have been."""
    rng, out = np.random.default_rng(seed), {}
    for i in range(studies):
        st = SimStudy(sc, rng, tmp / f"p{i}.sqlite", verdict, evals=PRUNE_EVALS)
        st.baseline()
        for k in range(TRIALS):
            effect = PRUNE_EFFECTS[k % len(PRUNE_EFFECTS)]
            stopped, would, _ = st.watched(effect)
            for key in (
                f"n{effect:+.2f}",
                f"stopped{effect:+.2f}" if stopped else None,
                f"stopped_{would}" if stopped else None,
            ):
                if key:
                    out[key] = out.get(key, 0) + 1
        st.close()
        (tmp / f"p{i}.sqlite").unlink()
    return out


def pruner_row(sc: Scenario, r: dict) -> str:
    stopped = sum(r.get(f"stopped{e:+.2f}", 0) for e in sorted(set(PRUNE_EFFECTS)))
    cells = " | ".join(ci(r.get(f"stopped{e:+.2f}", 0), r.get(f"n{e:+.2f}", 0)) for e in sorted(set(PRUNE_EFFECTS)))
    would = ci(r.get(f"stopped_{Verdict.IMPROVED}", 0), stopped)
    return f"| {sc.family} | {sc.name} | {cells} | {stopped} | {would} |"


def ci(k: int, n: int) -> str:
    low, high = clopper_pearson(k, n)
    return f"{k / n:.1%} [{low:.1%}, {high:.1%}]" if n else "-"


def row(sc: Scenario, r: dict, studies: int, power: int) -> str:
    return (
        f"| {sc.family} | {sc.name} | {ci(r['fi'], r['trials'])} | {ci(r['first_fi'], studies)} | "
        f"{ci(r['fr'], r['trials'])} | {ci(r['fc'], r['trials'])} | {ci(r['studies_fc'], studies)} | "
        f"{ci(r['power_cand'], power)} | {ci(r['power_conf'], power)} |"
    )


def _settings(ap: argparse.ArgumentParser, pairs: list[str]) -> dict:
    """The ``--set KEY=VALUE`` pairs as a recipe's verdict block; a bad pair is one line (exit 2)."""
    if any("=" not in kv for kv in pairs):
        ap.error("--set takes KEY=VALUE, e.g. --set baseline_repeats=4")
    block = dict(kv.split("=", 1) for kv in pairs)
    try:
        VerdictSettings(**block)
    except ValidationError as exc:
        ap.error(f"--set: {validation_line(exc)}")
    return block


def verdict_table(chosen: list[Scenario], args, verdict: dict, tmp: Path) -> None:
    print(
        "| family | scenario | false improved / trial | first trial | false regressed / trial | "
        "false confirmed / trial | studies with a false confirmed | power +0.10: candidate | confirmed |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for sc in chosen:
        r = simulate(sc, args.studies, args.power, args.seed * 1000 + scenarios().index(sc), tmp, verdict)
        print(row(sc, r, args.studies, args.power), flush=True)


def pruner_table(chosen: list[Scenario], args, verdict: dict, tmp: Path) -> None:
    effects = sorted(set(PRUNE_EFFECTS))
    print(
        f"\npruner: {args.pruner} studies of {TRIALS} trials per scenario, trial effects {PRUNE_EFFECTS} in turn, "
        f"{PRUNE_EVALS} evals per run (stopped at the first {PRUNE_EVALS - 1} or judged at the last)\n"
    )
    print(
        "| family | scenario | "
        + " | ".join(f"stopped at {e:+.2f}" for e in effects)
        + " | stopped | of those, would have been improved |"
    )
    print("|---|---|" + "---:|" * (len(effects) + 2))
    for sc in chosen:
        r = simulate_pruner(sc, args.pruner, args.seed * 1000 + 500 + scenarios().index(sc), tmp, verdict)
        print(pruner_row(sc, r), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=400, help="null studies of 30 trials per scenario")
    ap.add_argument("--power", type=int, default=300, help="power studies per scenario")
    ap.add_argument("--pruner", type=int, default=100, help="studies per scenario watched by the pruner (0: none)")
    ap.add_argument("--stated", type=int, default=0, help="null studies per scenario for stated vs measured (0: none)")
    ap.add_argument("--first", type=int, default=0, help="more first trials per scenario for stated vs measured")
    ap.add_argument("--cap", type=int, default=20, help="stated rates computed per level and scenario, at most")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--only",
        nargs="+",
        default=[],
        metavar="TEXT",
        help="scenarios of that name or family (else those whose name or family holds TEXT)",
    )
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a verdict setting other than its default, e.g. baseline_repeats=4 (repeatable)",
    )
    args = ap.parse_args(argv)
    verdict = _settings(ap, args.set)
    chosen = pick(args.only) if args.only else scenarios()
    if args.list or not chosen:
        print("\n".join(f"{s.family}: {s.name}" for s in scenarios()))
        return 0 if args.list else 2
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK) else None
    tmp = Path(tempfile.mkdtemp(prefix="calib-", dir=base))
    print(
        f"{args.studies} null studies of {TRIALS} trials and {args.power} power studies per scenario; verdict "
        f"settings {VerdictSettings(**verdict).model_dump()}\n"
    )
    t0 = time.time()
    try:
        if args.studies or args.power:
            verdict_table(chosen, args, verdict, tmp)
        if args.stated:
            stated_table(chosen, args, verdict, tmp)
        if args.pruner:
            pruner_table([s for s in chosen if s.pruner], args, verdict, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
