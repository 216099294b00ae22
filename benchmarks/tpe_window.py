"""What one proposal costs as a study grows: Optuna's TPE against autorl's ``WindowedTPE`` (the last 1,000 finished
trials), with the settings autorl uses (multivariate, 4 start-up trials, seed 0) on a GRPO-like space (lr, eps_clip,
kl_coef, gens) and a smooth made-up objective. In memory, so what is timed is the sampler's ask and tell alone.

    python benchmarks/tpe_window.py [--trials 6000] [--every 500] [--window 1000]

Prints, at each checkpoint, the mean milliseconds of ask + tell over the last 50 trials, for each sampler.
"""

from __future__ import annotations

import argparse
import math
import time

import optuna

from autorl.search.window import WindowedTPE

SPACE = {
    "lr": optuna.distributions.FloatDistribution(1e-7, 1e-3, log=True),
    "eps_clip": optuna.distributions.CategoricalDistribution([0.1, 0.2, 0.3]),
    "kl_coef": optuna.distributions.CategoricalDistribution([0.0, 0.01, 0.04]),
    "gens": optuna.distributions.CategoricalDistribution([4, 8, 16]),
}


def objective(p: dict) -> float:
    return -abs(math.log10(p["lr"]) + 5) - abs(p["eps_clip"] - 0.2) - p["kl_coef"] + 0.01 * p["gens"]


def timings(sampler, trials: int, every: int) -> dict[int, float]:
    study = optuna.create_study(direction="maximize", sampler=sampler)
    out, recent = {}, []
    for n in range(1, trials + 1):
        start = time.perf_counter()
        trial = study.ask(SPACE)
        study.tell(trial, objective(trial.params))
        recent = (recent + [time.perf_counter() - start])[-50:]
        if n % every == 0 or n == 100:
            out[n] = 1000 * sum(recent) / len(recent)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=6000)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--window", type=int, default=1000)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    kwargs = {"seed": 0, "n_startup_trials": 4, "multivariate": True}
    plain = timings(optuna.samplers.TPESampler(**kwargs), args.trials, args.every)
    windowed = timings(WindowedTPE(window=args.window, **kwargs), args.trials, args.every)
    print("| trials | TPE ms / proposal | windowed ms / proposal |")
    print("|---|---|---|")
    for n in plain:
        print(f"| {n:,} | {plain[n]:.1f} | {windowed[n]:.1f} |")


if __name__ == "__main__":
    main()
