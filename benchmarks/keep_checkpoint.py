"""Which checkpoint a full run keeps: the best of its K evals (the rule before) against the last unless an earlier
one beats it beyond noise (``autorl.judge.earlystop.keep_checkpoint``), on simulated checkpoint evals.

Item difficulty is uniform and a checkpoint's skill shifts every item's chance. Two models of how evals of one
run relate: *independent*, each eval a fresh draw on the items (about a third of the items differ between two
checkpoints of equal skill, the case where evals differ most); and *like the real runs*, where each item's draw is
shared across the run's checkpoints except for a fraction ``--fresh`` (0.07) drawn anew: 4-5 % of the items differ
between two checkpoints of equal skill, as between the real SmolLM2 OpenRLHF full runs' checkpoints (greedy
decoding of checkpoints eight steps apart: 19-24 of 500 items in the flat control, 12-28 in the run that had stopped
improving). For each scenario, over ``--runs`` runs:

- *earlier kept*: how often a checkpoint before the last is kept;
- *kept skill*: the mean true skill of the kept checkpoint, against the best true skill in the run;
- *reported - true*: how far the kept eval's value lies above the kept checkpoint's true skill (the winner's curse).

    python benchmarks/keep_checkpoint.py [--runs 2000] [--items 500] [--fresh 0.07] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np

from autorl.judge.earlystop import keep_checkpoint

KEY = "eval/id/greedy_pass@1"
ITEMS = "eval/id/items"

# name: the true skill of each checkpoint, oldest first (0.5 = the items' mean chance)
SCENARIOS: dict[str, list[float]] = {
    "flat, 4 evals": [0.5] * 4,
    "flat, 8 evals": [0.5] * 8,
    "flat, 16 evals": [0.5] * 16,
    "rising, then flat (4)": [0.3, 0.5, 0.55, 0.55],
    "rising to the end (4)": [0.3, 0.4, 0.5, 0.6],
    "last falls 0.02 (4)": [0.5, 0.6, 0.6, 0.58],
    "last falls 0.05 (4)": [0.5, 0.6, 0.6, 0.55],
    "last falls 0.10 (4)": [0.5, 0.6, 0.6, 0.50],
    "collapse at the end (8)": [0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.3],
}


def draw(rng: np.random.Generator, skills: list[float], n: int, fresh: float) -> tuple[list[dict], list[float]]:
    """One run's evals and each checkpoint's true pass rate on these items; each item's draw is shared by the run's
    checkpoints except for a ``fresh`` fraction drawn anew at each (1.0: independent evals)."""
    p, shared = rng.uniform(0.0, 1.0, n), rng.random(n)
    evals, truth = [], []
    for k, s in enumerate(skills):
        chance = np.clip(p + s - 0.5, 0.0, 1.0)
        u = np.where(rng.random(n) < fresh, rng.random(n), shared)
        items = (u < chance).astype(int).tolist()
        evals.append({"type": "eval", "step": 8 * (k + 1), KEY: sum(items) / n, ITEMS: items})
        truth.append(float(chance.mean()))
    return evals, truth


def scenario(
    rng: np.random.Generator, skills: list[float], runs: int, n: int, fresh: float
) -> dict[str, dict[str, float]]:
    out = {rule: {"earlier": 0.0, "skill": 0.0, "bias": 0.0} for rule in ("best of K", "last unless beaten")}
    best_skill = 0.0
    for _ in range(runs):
        evals, truth = draw(rng, skills, n, fresh)
        best_skill += max(truth) / runs
        values = [e[KEY] for e in evals]
        kept = keep_checkpoint(evals, KEY)
        assert kept is not None
        picks = {"best of K": int(np.argmax(values)), "last unless beaten": [e["step"] for e in evals].index(kept.step)}
        for rule, i in picks.items():
            out[rule]["earlier"] += (i != len(evals) - 1) / runs
            out[rule]["skill"] += truth[i] / runs
            out[rule]["bias"] += (values[i] - truth[i]) / runs
    for r in out.values():
        r["best"] = best_skill
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--items", type=int, default=500)
    ap.add_argument("--fresh", type=float, default=0.07)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.runs < 1 or args.items < 2 or not 0.0 <= args.fresh <= 1.0:
        ap.error("--runs must be at least 1, --items at least 2, and --fresh between 0 and 1")
    rng = np.random.default_rng(args.seed)
    print(f"{args.runs} runs a scenario, {args.items} items an eval, seed {args.seed}")
    for label, fresh in (("independent evals", 1.0), (f"like the real runs (fresh {args.fresh:g})", args.fresh)):
        evals, _ = draw(rng, [0.5, 0.5], args.items, fresh)
        differ = sum(a != b for a, b in zip(evals[0][ITEMS], evals[1][ITEMS]))
        print(f"\n{label}: {differ} of {args.items} items differ between two checkpoints of equal skill\n")
        print("| scenario | rule | earlier kept | kept skill (best in run) | reported - true |")
        print("|---|---|---|---|---|")
        for name, skills in SCENARIOS.items():
            for rule, r in scenario(rng, skills, args.runs, args.items, fresh).items():
                print(
                    f"| {name} | {rule} | {100 * r['earlier']:.1f} % | {r['skill']:.3f} ({r['best']:.3f}) "
                    f"| {r['bias']:+.4f} |"
                )


if __name__ == "__main__":
    main()
