"""Calibration of the verdict under seed noise and many trials (simulation, numpy, a few minutes on 2 cores).

Each item j has a solve rate p_j ~ U(0.1, 0.9) (fixed per eval set); a run with seed shift
u ~ N(0, sd) solves it with probability clip(p_j + effect + u). The verdict code itself
(``autorl.judge.noise.gain``, vectorised over simulated cases) judges one trial run against
R baseline runs. Printed per (sd, R, items): false-improved and false-regressed rates at no
effect, and power (called improved) at +0.02, +0.05, +0.10, and at +0.10 the power of the same test told
the true run sd: no verdict can do better, so it shows where a power target is out of reach. Then the study level: 30-trial
null studies at the default R, where an 'improved' trial is a candidate that is re-run with
``confirm_runs`` fresh seeds and confirmed only if those fresh runs alone beat the baseline
at ``confirm_level`` (the rule in autorl.judge.verdict.confirm); printed is the share of
studies with one or more false confirmed improvements.

    python benchmarks/verdict_calibration.py [--cases 2000] [--studies 2000] [--set baseline_repeats=3 ...]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from pydantic import ValidationError

from autorl.judge.noise import gain
from autorl.recipe import VerdictSettings

SDS = (0.0, 0.01, 0.03, 0.05)
REPEATS = (1, 2, 3, 4)
ITEMS = (200, 500)
EFFECTS = (0.0, 0.02, 0.05, 0.10)
TRIALS_PER_STUDY = 30


def draw(rng: np.random.Generator, p: np.ndarray, shape: tuple[int, ...], effect: float, sd: float) -> np.ndarray:
    """0/1 results of shape (*shape, items): one seed shift per run."""
    shift = rng.normal(0.0, sd, shape)[..., None] if sd > 0 else 0.0
    q = np.clip(p + effect + shift, 0.0, 1.0).astype(np.float32)
    return (rng.random((*shape, p.shape[0]), dtype=np.float32) < q).astype(np.float32)


def judge(t: np.ndarray, b: np.ndarray, s: VerdictSettings, level: float, extra=()) -> dict[str, np.ndarray]:
    return gain(t, b, [b, *extra], s.run_sd_prior, s.run_sd_prior_df, level)


def per_trial(rng, p, sd: float, s: VerdictSettings, cases: int) -> dict:
    """(R, effect) -> (rate improved, rate regressed); (R, "oracle") -> power at the largest effect, sd known."""
    base = draw(rng, p, (cases, max(REPEATS)), 0.0, sd)
    out = {}
    for effect in EFFECTS:
        trial = draw(rng, p, (cases, 1), effect, sd)
        for r in REPEATS:
            g = judge(trial, base[:, :r], s, s.level)
            out[r, effect] = (float((g["low"] > s.min_effect).mean()), float((g["high"] < 0).mean()))
            if effect == max(EFFECTS):
                out[r, "oracle"] = float((oracle(trial, base[:, :r], sd, s)["low"] > s.min_effect).mean())
    return out


def oracle(t: np.ndarray, b: np.ndarray, sd: float, s: VerdictSettings) -> dict[str, np.ndarray]:
    """The same test told the true run sd (a prior of ~infinite weight): the best power any verdict could have."""
    return gain(t, b, [b], sd, 1e9, s.level)


def study_level(rng, p, sd: float, s: VerdictSettings, studies: int, chunk: int = 250) -> tuple[float, float]:
    """(share of null studies with >= 1 candidate, share with >= 1 confirmed improvement)."""
    any_cand = any_conf = 0
    for start in range(0, studies, chunk):
        k = min(chunk, studies - start)
        base = draw(rng, p, (k, s.baseline_repeats), 0.0, sd)[:, None]
        trials = draw(rng, p, (k, TRIALS_PER_STUDY, 1), 0.0, sd)
        cand = judge(trials, base, s, s.level)["low"] > s.min_effect
        fresh = draw(rng, p, (k, TRIALS_PER_STUDY, s.confirm_runs), 0.0, sd)
        conf = cand & (judge(fresh, base, s, s.confirm_level, extra=[fresh])["low"] > s.min_effect)
        any_cand += int(cand.any(axis=1).sum())
        any_conf += int(conf.any(axis=1).sum())
    return any_cand / studies, any_conf / studies


def _settings(ap: argparse.ArgumentParser, pairs: list[str]) -> VerdictSettings:
    """The verdict settings with ``--set KEY=VALUE`` applied; a bad pair is one line (exit 2), not a traceback."""
    if any("=" not in kv for kv in pairs):
        ap.error("--set takes KEY=VALUE, e.g. --set baseline_repeats=3")
    try:
        return VerdictSettings(**dict(kv.split("=", 1) for kv in pairs))
    except ValidationError as exc:
        ap.error(f"--set: {str(exc).splitlines()[1]}: {str(exc).splitlines()[2].strip()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000, help="simulated trials per cell")
    ap.add_argument("--studies", type=int, default=2000, help="simulated 30-trial null studies per (sd, items)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a verdict setting other than its default, e.g. baseline_repeats=3 (repeatable)")
    args = ap.parse_args(argv)
    s = _settings(ap, args.set)
    rng, t0 = np.random.default_rng(args.seed), time.time()
    print(f"settings: {s.model_dump()}\n")
    print("| items | run sd | R | false improved | false regressed | power +0.02 | power +0.05 | power +0.10 | "
          "+0.10, sd known |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    study_rows = []
    for n in ITEMS:
        p = rng.uniform(0.1, 0.9, n).astype(np.float32)
        for sd in SDS:
            res = per_trial(rng, p, sd, s, args.cases)
            for r in REPEATS:
                fi, fr = res[r, 0.0]
                pw = " | ".join(f"{res[r, e][0]:.1%}" for e in EFFECTS[1:])
                print(f"| {n} | {sd:g} | {r} | {fi:.1%} | {fr:.1%} | {pw} | {res[r, 'oracle']:.1%} |", flush=True)
            study_rows.append((n, sd, *study_level(rng, p, sd, s, args.studies)))
    print(f"\nstudy level: {TRIALS_PER_STUDY} no-effect trials, R = {s.baseline_repeats}, "
          f"confirm_runs = {s.confirm_runs} at level {s.confirm_level}\n")
    print("| items | run sd | studies with >= 1 candidate | studies with >= 1 false CONFIRMED |")
    print("|---:|---:|---:|---:|")
    for n, sd, cand, conf in study_rows:
        print(f"| {n} | {sd:g} | {cand:.1%} | {conf:.1%} |")
    print(f"\n{args.cases} cases per cell, {args.studies} studies per row; {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
